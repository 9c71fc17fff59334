//! One location as veloxy routes: its match (ingress-nginx's path semantics), its target
//! (a group, a canary split, a redirect or the default 404), its rules, and the plain-HTTP
//! redirect twin of a location that redirects on its own.

use regex_automata::meta::Regex;
use toml::Value;
use veloxy_import::Section;

use crate::groups::Backend;
use crate::routes::{Kind, Location, RedirectPlan, Target};
use crate::tls::Certs;
use crate::util::{self, table};
use crate::{Ctx, IngInfo};

/// Route keys that an Ingress's rule set may hold.
pub const RULE_KEYS: &[&str] = &[
    "request_headers",
    "max_body_bytes",
    "allow",
    "deny",
    "basic_auth",
    "forward_auth",
    "cors",
    "rate_limit",
];

/// The match keys of a location: one or two (Prefix `/p` is `/p/` plus exactly `/p`).
fn matches(
    l: &Location,
    regex: bool,
    locs_exact: bool,
) -> Result<Vec<(&'static str, String)>, String> {
    if regex {
        let re = format!("(?i)^{}", l.path);
        Regex::new(&re).map_err(|e| format!("the path is not a regex veloxy accepts: {e}"))?;
        return Ok(vec![("path_regex", re)]);
    }
    let p = l.path.clone();
    Ok(match l.kind {
        Kind::Exact => vec![("path_exact", p)],
        Kind::Impl => vec![("path", p)],
        Kind::Prefix if p.ends_with('/') => vec![("path", p)],
        Kind::Prefix if locs_exact => vec![("path", format!("{p}/"))],
        Kind::Prefix => vec![("path", format!("{p}/")), ("path_exact", p)],
    })
}

/// The capture groups of a regex (group 0 excluded).
fn captures(re: &str) -> usize {
    Regex::new(re)
        .map(|r| {
            r.group_info()
                .group_len(regex_automata::PatternID::ZERO)
                .saturating_sub(1)
        })
        .unwrap_or(0)
}

/// Emits the routes of location `l`: `(regex host, an Exact twin exists)`, and the
/// certificates and redirect plan.
pub fn emit(
    ctx: &mut Ctx,
    ings: &[IngInfo],
    l: &Location,
    (regex, exact_exists): (bool, bool),
    (certs, plan): (&Certs, &RedirectPlan),
    out: &mut Vec<(usize, Section)>,
) {
    let info = &ings[l.ing];
    let ann = &info.ann;
    let report = |ctx: &mut Ctx, outcome: Result<Option<String>, String>| {
        if let Some(d) = &l.directive {
            match outcome {
                Ok(None) => ctx.report.translated(&l.loc, d),
                Ok(Some(w)) => ctx.report.different(&l.loc, d, w),
                Err(e) => ctx.report.refused(&l.loc, d, e),
            }
        }
    };
    let keys = match matches(l, regex, exact_exists) {
        Ok(k) => k,
        Err(e) => return report(ctx, Err(e)),
    };
    let rewrite = regex && ann.rewrite.as_deref().is_some_and(|t| t != l.path);
    let mut route = Section::from(&l.loc);
    if !out.iter().any(|(i, _)| *i == l.ing) {
        let class = info
            .class
            .as_deref()
            .map(|c| format!(" (class {c})"))
            .unwrap_or_default();
        route
            .comments
            .push(format!("Ingress {}{class}", info.obj.id()));
    }
    let redirects = ann.force_ssl_redirect
        || ctx.g.force_ssl_redirect
        || (ann.ssl_redirect.unwrap_or(ctx.g.ssl_redirect) && certs.covers(&l.host));
    if redirects && !plan.listener_wide {
        route.set("listener", "https");
    }
    if !l.host.is_empty() {
        let mut hosts = vec![l.host.clone()];
        hosts.extend(ann.aliases.iter().cloned());
        route.set("host", util::one_or_list(&hosts));
    }
    let mut notes: Vec<String> = Vec::new();
    // The target.
    let proxied = match (&ann.redirect, &l.target) {
        (Some((to, code)), _) => {
            route.set(
                "redirect",
                table([
                    ("to", to.as_str().into()),
                    ("status", i64::from(*code).into()),
                ]),
            );
            false
        }
        (None, Target::NotFound) => {
            route
                .comments
                .push("ingress-nginx's default backend for this host's other paths".into());
            route.set(
                "respond",
                table([
                    ("status", 404.into()),
                    ("body", "default backend - 404\n".into()),
                ]),
            );
            false
        }
        (None, Target::Service(b)) => match target(ctx, ings, l, b, &mut notes) {
            Ok(name) => {
                route.set("upstream", name);
                true
            }
            Err(e) => return report(ctx, Err(e)),
        },
    };
    if proxied && rewrite {
        let t = ann.rewrite.clone().unwrap_or_default();
        let mut tpl = util::nginx_template(&t).unwrap_or_default();
        let (_, re) = &keys[0];
        let n = captures(re);
        if let Some(k) = (1..=9).find(|k| k > &n && tpl.contains(&format!("{{re.{k}}}"))) {
            return report(
                ctx,
                Err(format!(
                    "rewrite-target uses ${k}, which this path's regex does not capture"
                )),
            );
        }
        if tpl.contains('?') {
            tpl.push_str("&{query}");
        }
        route.set("rewrite", tpl);
    }
    let https_side = redirects || !plan.whole_hosts.is_empty() || certs.covers(&l.host);
    let mut sets: Vec<Value> = Vec::new();
    if ctx.config.rule_sets.iter().any(|(n, _)| n == "hsts") && certs.covers(&l.host) && https_side
    {
        sets.push("hsts".into());
    }
    if proxied {
        sets.push("ingress-nginx".into());
        for (k, v) in crate::routes::own_rules(ctx, ann, rewrite) {
            route.set(&k, v);
        }
    }
    if !sets.is_empty() {
        // `use` goes right after the target, before the route's own rules.
        let own: Vec<(String, Value)> = route.keys.drain(..).collect();
        for (k, v) in own {
            let rule = RULE_KEYS.contains(&k.as_str());
            if rule && route.get("use").is_none() {
                route.set("use", Value::Array(sets.clone()));
            }
            route.set(&k, v);
        }
        if route.get("use").is_none() {
            route.set("use", Value::Array(sets.clone()));
        }
    }
    // The canary routes (header conditions) go before the main one.
    let canary_routes = canary_routes(ctx, ings, l, &route, &mut notes);
    let mut all: Vec<Section> = canary_routes;
    if !all.is_empty() {
        all[0].comments = std::mem::take(&mut route.comments);
    }
    all.push(route);
    for r in all {
        for (i, (k, v)) in keys.iter().enumerate() {
            let mut one = r.clone();
            if i > 0 {
                one.comments.clear();
            }
            place_match(&mut one, k, v);
            out.push((l.ing, one));
        }
    }
    if redirects && !plan.listener_wide && !plan.whole_hosts.contains(&l.host) {
        for (k, v) in &keys {
            let mut twin = Section::from(&l.loc);
            twin.set("listener", "http");
            if !l.host.is_empty() {
                twin.set("host", l.host.as_str());
            }
            place_match(&mut twin, k, v);
            twin.set(
                "redirect",
                table([
                    ("to", "https://{host}{uri}".into()),
                    ("status", i64::from(ctx.g.redirect_code).into()),
                ]),
            );
            out.push((l.ing, twin));
        }
    }
    report(ctx, Ok((!notes.is_empty()).then(|| notes.join("; "))));
}

/// Puts the path key after `listener` and `host`.
fn place_match(r: &mut Section, k: &str, v: &str) {
    let at = r
        .keys
        .iter()
        .take_while(|(n, _)| n == "listener" || n == "host")
        .count();
    r.keys.insert(at, (k.to_string(), v.into()));
}

/// The group of a proxied location: its Service, or the main + canary split.
fn target(
    ctx: &mut Ctx,
    ings: &[IngInfo],
    l: &Location,
    b: &Backend,
    notes: &mut Vec<String>,
) -> Result<String, String> {
    let ann = &ings[l.ing].ann;
    let Some((ci, cb, _, _)) = l.canary.first() else {
        return ctx.group(vec![(b.clone(), 1)], ann, &l.loc);
    };
    let c = ings[*ci].ann.canary.clone().unwrap_or_default();
    if l.canary.len() > 1 {
        notes
            .push("only the first canary Ingress of this path is used, as in ingress-nginx".into());
    }
    match c.weight {
        0 => ctx.group(vec![(b.clone(), 1)], ann, &l.loc),
        w if w >= c.total => ctx.group(vec![(cb.clone(), 1)], ann, &l.loc),
        w => ctx.group(vec![(b.clone(), c.total - w), (cb.clone(), w)], ann, &l.loc),
    }
}

/// Routes with a header condition for canary-by-header.
fn canary_routes(
    ctx: &mut Ctx,
    ings: &[IngInfo],
    l: &Location,
    main: &Section,
    _notes: &mut [String],
) -> Vec<Section> {
    let Some((ci, cb, cloc, cdir)) = l.canary.first().cloned() else {
        return Vec::new();
    };
    let ann = &ings[l.ing].ann;
    let c = ings[ci].ann.canary.clone().unwrap_or_default();
    let mut out = Vec::new();
    if main.get("upstream").is_none() {
        ctx.report.ignored(
            &cloc,
            cdir,
            "the main location does not proxy (a redirect), so no request reaches the canary",
        );
        return out;
    }
    if let Some(h) = &c.header {
        let value = c.header_value.clone().unwrap_or_else(|| "always".into());
        match ctx.group(vec![(cb.clone(), 1)], ann, &cloc) {
            Ok(g) => {
                let mut r = main.clone();
                r.comments.clear();
                r.add_from(&cloc);
                r.set("headers", table([(h.as_str(), value.into())]));
                r.set("upstream", g);
                reorder_headers(&mut r);
                out.push(r);
            }
            Err(e) => {
                ctx.report.refused(&cloc, cdir, e);
                return Vec::new();
            }
        }
        if c.header_value.is_none() && c.weight > 0 {
            if let Ok(g) = ctx.group(
                vec![(
                    match &l.target {
                        Target::Service(b) => b.clone(),
                        Target::NotFound => cb.clone(),
                    },
                    1,
                )],
                ann,
                &l.loc,
            ) {
                let mut r = main.clone();
                r.comments.clear();
                r.set("headers", table([(h.as_str(), "never".into())]));
                r.set("upstream", g);
                reorder_headers(&mut r);
                out.push(r);
            }
        }
    }
    ctx.report.translated(&cloc, cdir);
    out
}

/// Moves `headers` (a condition) right before the target.
fn reorder_headers(r: &mut Section) {
    if let Some(v) = r.remove("headers") {
        let at = r
            .keys
            .iter()
            .position(|(k, _)| k == "upstream")
            .unwrap_or(r.keys.len());
        r.keys.insert(at, ("headers".into(), v));
    }
}

/// Merges `b` into `a` when they differ only in the value of one path key (`path` or
/// `path_exact`), making it a list.
pub fn merge(a: &mut Section, b: &Section) -> bool {
    if !b.comments.is_empty() || a.keys.len() != b.keys.len() {
        return false;
    }
    let mut differing = None;
    for ((ka, va), (kb, vb)) in a.keys.iter().zip(&b.keys) {
        if ka != kb {
            return false;
        }
        if va != vb {
            if differing.is_some() || !(ka == "path" || ka == "path_exact" || ka == "host") {
                return false;
            }
            differing = Some(ka.clone());
        }
    }
    let Some(k) = differing else { return false };
    let add = b.get(&k).cloned().unwrap_or(Value::Array(Vec::new()));
    match a.get_mut(&k) {
        Some(Value::Array(list)) => list.push(add),
        Some(v) => *v = Value::Array(vec![v.clone(), add]),
        None => return false,
    }
    for f in &b.from {
        a.add_from(f);
    }
    true
}
