//! HTTP middlewares, applied to a router's routes in the router's order. Each one changes
//! the routes (rules, path changes, redirects) and completes its report line; one that
//! veloxy cannot express is refused and the routes go on without it.

use veloxy_import::tree::Node;
use veloxy_import::Loc;

use crate::input::{strip_provider, Named};
use crate::matcher::{escape, PathKind};
use crate::node::{entries, flag, get, int, list_at, seconds, text};
use crate::route::{Action, PathOp, Route};
use crate::translate::Ctx;

/// Applies middleware `name` (referenced at `at` by `router`) to `routes`.
pub fn apply(
    ctx: &mut Ctx,
    name: &str,
    at: &Loc,
    router: &str,
    routes: Vec<Route>,
    seen: &mut Vec<String>,
) -> Vec<Route> {
    let Some(mw) = ctx.inp.middlewares.iter().find(|m| m.name == name).cloned() else {
        let why = if name.ends_with("@internal") {
            format!("middleware {name}: Traefik's internal middlewares")
        } else {
            format!("middleware {name} is not defined (Traefik disables the router)")
        };
        ctx.lines.at(router, at, router).refuse(why);
        return routes;
    };
    let key = format!("http.middlewares.{name}");
    let Some((kind, cfg)) = entries(&mw.node)
        .first()
        .map(|(k, v)| (k.name.clone(), v.clone()))
    else {
        ctx.lines
            .at(&key, &mw.loc, &key)
            .refuse("no middleware type");
        return routes;
    };
    let directive = format!("{key}.{kind}");
    if seen.contains(&name.to_string()) {
        ctx.lines
            .at(&key, &mw.loc, &directive)
            .refuse("a chain that includes itself");
        return routes;
    }
    seen.push(name.to_string());
    let mut routes = routes;
    let lower = kind.to_ascii_lowercase();
    if lower == "headers" {
        crate::headers::apply(ctx, &mw, &cfg, &mut routes);
        return routes;
    }
    if lower == "chain" {
        ctx.lines.at(&key, &mw.loc, &directive);
        for (m, l) in list_at(&cfg, "middlewares") {
            routes = apply(ctx, strip_provider(&m), &l, router, routes, seen);
        }
        seen.pop();
        return routes;
    }
    let result = one(ctx, &mw, &lower, &cfg, &mut routes);
    let line = ctx.lines.at(&key, &mw.loc, &directive);
    match result {
        Ok(notes) => {
            for n in notes {
                line.note(n);
            }
        }
        Err(why) => {
            line.refuse(why);
        }
    }
    seen.pop();
    routes
}

type Notes = Result<Vec<String>, String>;

fn one(ctx: &mut Ctx, mw: &Named, kind: &str, cfg: &Node, routes: &mut Vec<Route>) -> Notes {
    match kind {
        "redirectscheme" => redirect_scheme(ctx, cfg, routes),
        "redirectregex" => redirect_regex(ctx, cfg, routes),
        "stripprefix" => strip_prefix(cfg, routes),
        "addprefix" => {
            let p = text(cfg, "prefix").ok_or("no prefix")?;
            for r in routes.iter_mut() {
                r.path_op = Some(match r.path_op.take() {
                    None => PathOp::Rewrite(format!("{p}{{path}}")),
                    Some(PathOp::Rewrite(t)) => PathOp::Rewrite(format!("{p}{t}")),
                    Some(PathOp::Strip) => return Err("addPrefix after stripPrefix on a prefix route: veloxy has one path change per route".into()),
                });
            }
            Ok(vec![])
        }
        "replacepath" => {
            let p = text(cfg, "path").ok_or("no path")?;
            let mut notes = vec![];
            for r in routes.iter_mut() {
                if r.path_op.is_some() {
                    notes.push("X-Replaced-Path carries the client's path, not the one the earlier middlewares made".to_string());
                }
                r.path_op = Some(PathOp::Rewrite(p.replace('{', "{{").replace('}', "}}")));
                r.req("X-Replaced-Path", "{path}");
            }
            Ok(notes)
        }
        "replacepathregex" => replace_path_regex(cfg, routes),
        "stripprefixregex" => Err("veloxy strips a route's own prefix only, not a regex match".into()),
        "basicauth" => crate::auth::basic(ctx, mw, cfg, routes),
        "forwardauth" => crate::auth::forward(ctx, mw, cfg, routes),
        "digestauth" => Err("veloxy has Basic authentication only".into()),
        "ipallowlist" | "ipwhitelist" => allow_list(cfg, routes),
        "ratelimit" => rate_limit(cfg, routes),
        "compress" => {
            for r in routes.iter_mut() {
                r.set("compress", true);
            }
            let mut notes = vec!["veloxy compresses 200 answers of compressible types from 256 bytes (Traefik: from 1024 bytes, any type it does not exclude)".to_string()];
            for k in ["excludedContentTypes", "includedContentTypes", "minResponseBodyBytes", "encodings", "defaultEncoding"] {
                if get(cfg, k).is_some() {
                    notes.push(format!("{k} is not translated: veloxy picks compressible types itself"));
                }
            }
            Ok(notes)
        }
        "errors" => Err("custom error pages from a service: veloxy's error_pages are files read at load".into()),
        "buffering" => buffering(cfg, routes),
        "retry" => {
            let attempts = int(cfg, "attempts").ok_or("no attempts")?;
            for r in routes.iter() {
                if let Action::Upstream(u) = &r.action {
                    ctx.retries.entry(u.clone()).or_default().push(Some((attempts - 1).max(0)));
                }
            }
            let mut notes = vec!["retries are set on the upstream group, so every route to it retries; veloxy retries on another server (connect failures, and 502/503/504 answers to idempotent requests with a buffered body), Traefik network errors only".to_string()];
            if get(cfg, "initialInterval").is_some() {
                notes.push("initialInterval: veloxy retries at once, without backoff".into());
            }
            Ok(notes)
        }
        "inflightreq" => {
            let amount = int(cfg, "amount").ok_or("no amount")?;
            for r in routes.iter_mut() {
                r.set("max_concurrency", amount);
            }
            Ok(vec!["veloxy limits the route's in-flight requests across all clients (Traefik per client address, its sourceCriterion) and answers 503 over the limit (Traefik 429)".into()])
        }
        "circuitbreaker" => Err("veloxy has outlier detection per server ([upstreams.X.outlier]), not expression-based circuit breakers".into()),
        "contenttype" => Ok(vec!["veloxy never guesses a missing Content-Type".into()]),
        "passtlsclientcert" => Err("veloxy does not ask clients for certificates".into()),
        "grpcweb" => Err("veloxy does not translate gRPC-Web".into()),
        "plugin" => Err("Traefik plugins".into()),
        other => Err(format!("unknown middleware type {other}")),
    }
}

/// Listener schemes of a route.
fn schemes(ctx: &Ctx, r: &Route) -> (Vec<String>, Vec<String>) {
    let mut plain = Vec::new();
    let mut tls = Vec::new();
    for l in &r.listeners {
        match ctx.eps.iter().find(|e| &e.listener == l) {
            Some(e) if e.tls => tls.push(l.clone()),
            _ => plain.push(l.clone()),
        }
    }
    (plain, tls)
}

fn redirect_scheme(ctx: &Ctx, cfg: &Node, routes: &mut Vec<Route>) -> Notes {
    let scheme = text(cfg, "scheme").unwrap_or_else(|| "https".into());
    let permanent = flag(cfg, "permanent").unwrap_or(false);
    let port = text(cfg, "port")
        .filter(|p| !(scheme == "https" && p == "443" || scheme == "http" && p == "80"));
    let to = match &port {
        Some(p) => format!("{scheme}://{{host}}:{p}{{uri}}"),
        None => format!("{scheme}://{{host}}{{uri}}"),
    };
    let status = if permanent { 301 } else { 302 };
    let mut out = Vec::new();
    for r in routes.drain(..) {
        let (plain, tls) = schemes(ctx, &r);
        let (same, other) = if scheme == "https" {
            (tls, plain)
        } else {
            (plain, tls)
        };
        if !other.is_empty() {
            let mut red = r.clone();
            red.listeners = other;
            red.action = Action::Redirect(to.clone(), status);
            out.push(red);
        }
        if !same.is_empty() {
            let mut keep = r;
            keep.listeners = same;
            out.push(keep);
        }
    }
    *routes = out;
    Ok(vec![format!(
        "requests other than GET get {status} (Traefik: {} for them, keeping the method)",
        if permanent { 308 } else { 307 }
    )])
}

fn redirect_regex(ctx: &Ctx, cfg: &Node, routes: &mut Vec<Route>) -> Notes {
    let re = text(cfg, "regex").ok_or("no regex")?;
    let rep = text(cfg, "replacement").ok_or("no replacement")?;
    let permanent = flag(cfg, "permanent").unwrap_or(false);
    let status = if permanent { 301 } else { 302 };
    let mut notes = vec![format!(
        "requests other than GET get {status} (Traefik: {} for them)",
        if permanent { 308 } else { 307 }
    )];
    let mut out = Vec::new();
    for r in routes.drain(..) {
        let (plain, tls) = schemes(ctx, &r);
        let hosts: Vec<Option<String>> =
            if r.m.hosts.is_empty() || r.m.hosts.iter().any(|h| h.starts_with("*.")) {
                vec![None]
            } else {
                r.m.hosts.iter().cloned().map(Some).collect()
            };
        let mut kept = false;
        for (scheme, ls) in [("http", plain), ("https", tls)] {
            if ls.is_empty() {
                continue;
            }
            for h in &hosts {
                let red = crate::urlre::redirect(&re, &rep, scheme, h.as_deref())?;
                let mut base = r.clone();
                base.listeners = ls.clone();
                if let Some(h) = h {
                    if hosts.len() > 1 {
                        base.m.hosts = vec![h.clone()];
                    }
                }
                let Some(red) = red else {
                    out.push(base);
                    kept = true;
                    continue;
                };
                notes.extend(red.note.clone());
                let mut rr = base.clone();
                rr.action = Action::Redirect(red.to.clone(), status);
                if let Some(p) = &red.path_regex {
                    match (r.m.kind, r.m.paths.first()) {
                        (None, _) => {}
                        (Some(PathKind::Prefix), Some(pre)) if p.starts_with(&format!("^{}", escape(pre))) || p.starts_with(&format!("^{pre}")) => {}
                        _ => return Err("the router's path and the regex's path part together: veloxy matches one path condition per route".into()),
                    }
                    rr.m.kind = Some(PathKind::Regex);
                    rr.m.paths = vec![p.clone()];
                    out.push(base);
                    kept = true;
                }
                out.push(rr);
            }
        }
        let _ = kept;
    }
    *routes = merge_same(out);
    notes.dedup();
    Ok(notes)
}

/// Routes split per host that came out the same are joined again.
fn merge_same(v: Vec<Route>) -> Vec<Route> {
    let mut out: Vec<Route> = Vec::new();
    for r in v {
        if let Some(o) = out.iter_mut().find(|o| {
            o.action == r.action
                && o.listeners == r.listeners
                && o.m.kind == r.m.kind
                && o.m.paths == r.m.paths
                && o.path_op == r.path_op
                && o.m.hosts != r.m.hosts
                && !o.m.hosts.is_empty()
                && !r.m.hosts.is_empty()
        }) {
            for h in &r.m.hosts {
                if !o.m.hosts.contains(h) {
                    o.m.hosts.push(h.clone());
                }
            }
            continue;
        }
        out.push(r);
    }
    out
}

fn strip_prefix(cfg: &Node, routes: &mut Vec<Route>) -> Notes {
    let prefixes: Vec<String> = list_at(cfg, "prefixes")
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    if prefixes.is_empty() {
        return Err("no prefixes".into());
    }
    let mut notes = Vec::new();
    if flag(cfg, "forceSlash") == Some(false) {
        notes.push("forceSlash false: veloxy always keeps a leading /".to_string());
    }
    let mut out = Vec::new();
    for r in routes.drain(..) {
        if r.path_op.is_some() {
            return Err("a second path change on the route: veloxy has one per route".into());
        }
        match r.m.kind {
            None => {
                // Only requests under a prefix are stripped: one route per prefix, and the
                // route itself for the rest.
                for p in &prefixes {
                    let mut s = r.clone();
                    s.m.kind = Some(PathKind::Prefix);
                    s.m.paths = vec![p.clone()];
                    s.path_op = Some(PathOp::Strip);
                    s.req("X-Forwarded-Prefix", p);
                    out.push(s);
                }
                out.push(r);
            }
            Some(PathKind::Prefix) => {
                // Each route path must be one of the prefixes (or it with a trailing /).
                let mut s = r.clone();
                let mut which = None;
                for path in &r.m.paths {
                    let p = prefixes
                        .iter()
                        .find(|p| path.starts_with(p.as_str()))
                        .ok_or_else(|| {
                            format!("the route path {path} is not under a stripped prefix")
                        })?;
                    if path != p && *path != format!("{p}/") {
                        return Err(format!("the route path {path} is longer than the stripped prefix {p}: veloxy strips the route's whole path"));
                    }
                    if which.is_some_and(|w: &String| w != p) {
                        return Err("several route paths stripping different prefixes".into());
                    }
                    which = Some(p);
                }
                s.path_op = Some(PathOp::Strip);
                if let Some(p) = which {
                    s.req("X-Forwarded-Prefix", p);
                }
                out.push(s);
            }
            Some(PathKind::Exact) => {
                for path in &r.m.paths {
                    let mut s = r.clone();
                    s.m.paths = vec![path.clone()];
                    if let Some(p) = prefixes.iter().find(|p| path.starts_with(p.as_str())) {
                        let rest = format!("/{}", path[p.len()..].trim_start_matches('/'));
                        s.path_op =
                            Some(PathOp::Rewrite(rest.replace('{', "{{").replace('}', "}}")));
                        s.req("X-Forwarded-Prefix", p);
                    }
                    out.push(s);
                }
            }
            Some(PathKind::Regex) => {
                return Err("stripPrefix on a path regex route".into());
            }
        }
    }
    *routes = out;
    Ok(notes)
}

fn replace_path_regex(cfg: &Node, routes: &mut Vec<Route>) -> Notes {
    let re = text(cfg, "regex").ok_or("no regex")?;
    let rep = text(cfg, "replacement").ok_or("no replacement")?;
    regex_automata::meta::Regex::new(&re)
        .map_err(|e| format!("the regex does not compile: {e}"))?;
    let template = go_replacement(&rep);
    let mut out = Vec::new();
    for r in routes.drain(..) {
        if r.path_op.is_some() {
            return Err("a second path change on the route: veloxy has one per route".into());
        }
        match (r.m.kind, r.m.paths.first()) {
            (None, _) => {}
            (Some(PathKind::Prefix), Some(p)) if re.starts_with(&format!("^{}", escape(p))) || re.starts_with(&format!("^{p}")) => {}
            (Some(PathKind::Regex), Some(p)) if *p == re => {}
            _ => return Err("the router's path and this regex together: veloxy matches one path condition per route".into()),
        }
        let mut s = r.clone();
        s.m.kind = Some(PathKind::Regex);
        s.m.paths = vec![re.clone()];
        s.path_op = Some(PathOp::Rewrite(template.clone()));
        s.req("X-Replaced-Path", "{path}");
        let same = r.m.kind == Some(PathKind::Regex);
        out.push(s);
        if !same {
            out.push(r);
        }
    }
    *routes = out;
    Ok(vec![])
}

/// Go's `$1` / `${name}` as `{re.1}` / `{re.name}`; other braces doubled.
pub fn go_replacement(rep: &str) -> String {
    let mut out = String::new();
    let mut rest = rep;
    while let Some(i) = rest.find(['$', '{', '}']) {
        out.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if c != b'$' {
            out.push_str(if c == b'{' { "{{" } else { "}}" });
            rest = after;
            continue;
        }
        let (name, len) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(e) => (&inner[..e], e + 2),
                None => ("", 0),
            }
        } else {
            let e = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..e], e)
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
        } else {
            out.push_str(&format!("{{re.{name}}}"));
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    out
}

fn allow_list(cfg: &Node, routes: &mut [Route]) -> Notes {
    let ranges: Vec<String> = list_at(cfg, "sourceRange")
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    if ranges.is_empty() {
        return Err("no sourceRange".into());
    }
    for r in routes.iter_mut() {
        if !r.m.allow.is_empty() {
            return Err("a ClientIP rule and an allow list on one router: veloxy has one allow list per route".into());
        }
        r.set("allow", crate::route::strings(&ranges));
    }
    let mut notes = Vec::new();
    if let Some(s) = get(cfg, "ipStrategy") {
        if let Some(d) = int(s, "depth").filter(|d| *d > 0) {
            notes.push(format!("ipStrategy depth {d}: veloxy checks the connecting address (or the client behind [server] trusted_proxies), not the X-Forwarded-For address {d} from the right"));
        }
        if get(s, "excludedIPs").is_some() {
            notes.push(
                "ipStrategy excludedIPs: set [server] trusted_proxies to those addresses instead"
                    .into(),
            );
        }
    }
    if let Some(code) = int(cfg, "rejectStatusCode").filter(|c| *c != 403) {
        notes.push(format!("refused clients get 403 (Traefik: {code})"));
    }
    Ok(notes)
}

fn rate_limit(cfg: &Node, routes: &mut [Route]) -> Notes {
    let average = int(cfg, "average").unwrap_or(0);
    if average <= 0 {
        return Ok(vec![]);
    }
    let period = text(cfg, "period").and_then(|p| seconds(&p)).unwrap_or(1.0);
    let rate = rate(average as f64, period)
        .ok_or("the rate is not a whole number of requests per second, minute or hour")?;
    let burst = int(cfg, "burst").unwrap_or(1).max(1);
    let mut t = toml::Table::new();
    t.insert("rate".into(), rate.into());
    t.insert("burst".into(), toml::Value::Integer(burst));
    let mut notes = Vec::new();
    if let Some(sc) = get(cfg, "sourceCriterion") {
        if let Some(h) = text(sc, "requestHeaderName") {
            t.insert("key".into(), format!("header:{h}").into());
        } else if flag(sc, "requestHost") == Some(true) {
            t.insert("key".into(), "header:Host".into());
        } else if get(sc, "ipStrategy").is_some() {
            notes.push("sourceCriterion.ipStrategy: veloxy keys on the connecting address (or the client behind [server] trusted_proxies)".to_string());
        }
    }
    for r in routes.iter_mut() {
        r.set("rate_limit", toml::Value::Table(t.clone()));
    }
    Ok(notes)
}

/// `average` per `period` seconds as `N/s`, `N/m` or `N/h`.
fn rate(average: f64, period: f64) -> Option<String> {
    for (unit, secs) in [("s", 1.0), ("m", 60.0), ("h", 3600.0)] {
        let n = average * secs / period;
        if n >= 1.0 && (n - n.round()).abs() < 1e-9 {
            return Some(format!("{}/{unit}", n.round() as u64));
        }
    }
    None
}

fn buffering(cfg: &Node, routes: &mut [Route]) -> Notes {
    let mut notes = Vec::new();
    if let Some(max) = int(cfg, "maxRequestBodyBytes").filter(|m| *m > 0) {
        for r in routes.iter_mut() {
            r.set("max_body_bytes", max);
        }
    }
    if int(cfg, "maxResponseBodyBytes").is_some_and(|m| m > 0) {
        return Err("maxResponseBodyBytes: veloxy does not cap response bodies".into());
    }
    if get(cfg, "retryExpression").is_some() {
        return Err(
            "retryExpression: veloxy retries by status list (retry_on) on the upstream group"
                .into(),
        );
    }
    notes.push("veloxy streams bodies rather than buffering them whole (memRequestBodyBytes and the like do not apply); an oversized body gets 413 as in Traefik".to_string());
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_replacements() {
        assert_eq!(rate(100.0, 1.0).as_deref(), Some("100/s"));
        assert_eq!(rate(50.0, 60.0).as_deref(), Some("50/m"));
        assert_eq!(rate(6.0, 60.0).as_deref(), Some("6/m"));
        assert_eq!(go_replacement("/v2/$1/${name}"), "/v2/{re.1}/{re.name}");
    }
}
