//! One Envoy route: its `match`, its action (`route`, `redirect`, `direct_response`) and its
//! own header edits and per-filter configs.

use std::collections::BTreeMap;

use toml::{Table, Value};
use veloxy_import::tree::Node;
use veloxy_import::Loc;

use super::headers::{self, Mutations, Op};
use super::order::{Match, PathKind};
use super::Ctx;
use crate::util::{duration_ms, seq, string_match, typed, Fields};

/// A route's CORS setting of its own.
#[derive(Debug, Clone, PartialEq)]
pub enum Cors {
    /// The policy (veloxy's `cors` table), or `None` when it allows no origin veloxy can list.
    Policy(Option<Table>),
    /// The filter is disabled for this route.
    Off,
}

/// One translated route, before the virtual host's and the configuration's rules join it.
pub struct RouteOut {
    /// `path*`, `methods`, `headers`, `query`.
    pub matching: Vec<(String, Value)>,
    /// `upstream` + path rewrite, `redirect` or `respond`.
    pub target: Vec<(String, Value)>,
    /// The route's own header edits.
    pub mutations: Mutations,
    /// The route's own CORS policy.
    pub cors: Option<Cors>,
    /// `ext_authz` disabled here.
    pub authz_off: bool,
    /// A `local_ratelimit` bucket of its own.
    pub rate_limit: Option<Table>,
    /// For the order analysis.
    pub m: Match,
    /// The route's place.
    pub loc: Loc,
    /// Whether it forwards (rules such as forward_auth apply only then).
    pub proxied: bool,
}

/// Translates one route; several when a rewrite needs a regex route in front of the prefix.
pub fn route(ctx: &mut Ctx, r: &Node, websocket: bool) -> Vec<RouteOut> {
    let mut f = Fields::new(r, "route");
    let Some((mloc, mnode)) = f.take("match") else {
        ctx.r.refused(&r.loc, "route", "a route without match");
        f.finish(&mut ctx.r);
        return Vec::new();
    };
    let matched = match_fields(ctx, mloc, mnode);
    let Some((path, matching, conds, entry)) = matched else {
        for (k, _) in r.as_map().unwrap_or(&[]) {
            if k.name != "match" {
                ctx.r.refused(
                    &k.loc,
                    format!("route.{}", k.name),
                    "part of a route left out: its match cannot be translated",
                );
            }
        }
        return Vec::new();
    };
    let mut out = RouteOut {
        matching,
        target: Vec::new(),
        mutations: headers::read(ctx, &mut f),
        cors: None,
        authz_off: false,
        rate_limit: None,
        m: Match {
            path,
            conds,
            loc: r.loc.clone(),
            entry,
        },
        loc: r.loc.clone(),
        proxied: false,
    };
    let mut extra = None;
    if let Some((loc, a)) = f.take("route") {
        extra = super::action::action(ctx, loc, a, &mut out, websocket);
        out.proxied = true;
    } else if let Some((loc, a)) = f.take("redirect") {
        redirect(ctx, loc, a, &mut out);
    } else if let Some((loc, a)) = f.take("direct_response") {
        direct(ctx, loc, a, &mut out);
    } else {
        ctx.r.refused(
            &r.loc,
            "route",
            "no route, redirect or direct_response action (filter_action / non_forwarding_action)",
        );
    }
    if let Some((_, pf)) = f.take("typed_per_filter_config") {
        per_filter(
            ctx,
            pf,
            &mut out.cors,
            &mut out.authz_off,
            &mut out.rate_limit,
        );
    }
    f.finish(&mut ctx.r);
    if out.target.is_empty() {
        return Vec::new();
    }
    let mut v = vec![out];
    if let Some(e) = extra {
        v.push(e);
    }
    v
}

type Matched = (
    PathKind,
    Vec<(String, Value)>,
    BTreeMap<String, String>,
    usize,
);

/// `match`: the path kind and the conditions; `None` when something cannot be expressed.
fn match_fields(ctx: &mut Ctx, mloc: &Loc, m: &Node) -> Option<Matched> {
    let mut f = Fields::new(m, "match");
    let insensitive = match f.take("case_sensitive") {
        Some((l, v)) => {
            ctx.r.translated(l, "match.case_sensitive");
            v.as_bool() == Some(false)
        }
        None => false,
    };
    let mut ok = true;
    let mut path = None;
    let mut entry = ctx.r.entries.len();
    for k in ["prefix", "path", "safe_regex", "path_separated_prefix"] {
        let Some((l, v)) = f.take(k) else { continue };
        let text = if k == "safe_regex" {
            v.get("regex").and_then(|r| r.scalar()).unwrap_or_default()
        } else {
            v.scalar().unwrap_or_default()
        };
        entry = ctx.r.entries.len();
        ctx.r.translated(l, format!("match.{k}"));
        path = Some(match k {
            "prefix" if insensitive => PathKind::Regex(format!("(?i)^{}", regex::escape(&text))),
            "path" if insensitive => PathKind::Regex(format!("(?i)^{}$", regex::escape(&text))),
            "prefix" => PathKind::Prefix(if text.is_empty() { "/".into() } else { text }),
            "path" => PathKind::Exact(text),
            "path_separated_prefix" => PathKind::Regex(format!("^{}(/|$)", regex::escape(&text))),
            _ => PathKind::Regex(if insensitive {
                format!("(?i){text}")
            } else {
                text
            }),
        });
    }
    for k in ["regex", "path_match_policy", "connect_matcher"] {
        if let Some((l, _)) = f.take(k) {
            ok = false;
            ctx.r.refused(
                l,
                format!("match.{k}"),
                "veloxy matches paths by prefix, exact path or safe_regex; the route is left out",
            );
        }
    }
    let Some(path) = path else {
        if ok {
            ctx.r
                .refused(mloc, "match", "no path condition; the route is left out");
        }
        f.finish(&mut ctx.r);
        return None;
    };
    let mut conds = BTreeMap::new();
    let mut methods = Vec::new();
    let mut headers = Table::new();
    let mut query = Table::new();
    if let Some((_, hs)) = f.take("headers") {
        for h in seq(hs) {
            ok &= header_cond(ctx, h, &mut methods, &mut headers, &mut conds);
        }
    }
    if let Some((_, qs)) = f.take("query_parameters") {
        for q in seq(qs) {
            let name = q.get("name").and_then(|n| n.scalar()).unwrap_or_default();
            let d = format!("match.query_parameters.{name}");
            let v = q
                .get("string_match")
                .map(string_match)
                .or_else(|| q.get("value").and_then(|v| v.scalar()).map(Ok));
            match v {
                Some(Ok(v)) => {
                    conds.insert(format!("?{name}"), v.clone());
                    query.insert(name, v.into());
                    ctx.r.translated(&q.loc, d);
                }
                Some(Err(e)) => {
                    ok = false;
                    ctx.r.refused(
                        &q.loc,
                        d,
                        format!("{e}: veloxy compares query values exactly; the route is left out"),
                    );
                }
                None => {
                    ok = false;
                    ctx.r.refused(&q.loc, d, "a presence match: veloxy compares query values exactly; the route is left out");
                }
            }
        }
    }
    if let Some((l, _)) = f.take("grpc") {
        conds.insert("content-type".into(), "application/grpc".into());
        headers.insert("content-type".into(), "application/grpc".into());
        ctx.r.different(
            l,
            "match.grpc",
            "veloxy compares Content-Type exactly with application/grpc (Envoy also takes \
             application/grpc+proto and other suffixes)",
        );
    }
    for k in [
        "runtime_fraction",
        "tls_context",
        "dynamic_metadata",
        "filter_state",
        "cel_expr",
    ] {
        if let Some((l, _)) = f.take(k) {
            ok = false;
            ctx.r.refused(
                l,
                format!("match.{k}"),
                "veloxy lacks this route condition; the route is left out",
            );
        }
    }
    f.finish(&mut ctx.r);
    if !ok {
        ctx.r.entries[entry].outcome = veloxy_import::Outcome::Refused(
            "the route is left out: one of its conditions cannot be translated".into(),
        );
        return None;
    }
    let mut matching = Vec::new();
    match &path {
        PathKind::Prefix(p) if p == "/" => {}
        PathKind::Prefix(p) => matching.push(("path".into(), Value::from(p.clone()))),
        PathKind::Exact(p) => matching.push(("path_exact".into(), Value::from(p.clone()))),
        PathKind::Regex(r) => matching.push(("path_regex".into(), Value::from(r.clone()))),
    }
    if !methods.is_empty() {
        matching.push(("methods".into(), Value::Array(methods)));
    }
    if !headers.is_empty() {
        matching.push(("headers".into(), Value::Table(headers)));
    }
    if !query.is_empty() {
        matching.push(("query".into(), Value::Table(query)));
    }
    Some((path, matching, conds, entry))
}

/// One `HeaderMatcher`; `false` when veloxy cannot express it.
fn header_cond(
    ctx: &mut Ctx,
    h: &Node,
    methods: &mut Vec<Value>,
    headers: &mut Table,
    conds: &mut BTreeMap<String, String>,
) -> bool {
    let name = h.get("name").and_then(|n| n.scalar()).unwrap_or_default();
    let d = format!("match.headers.{name}");
    if h.get("invert_match").and_then(|b| b.as_bool()) == Some(true) {
        ctx.r.refused(
            &h.loc,
            d,
            "an inverted match: veloxy's conditions must hold; the route is left out",
        );
        return false;
    }
    let value = if let Some(s) = h.get("string_match") {
        string_match(s)
    } else if let Some(e) = h.get("exact_match") {
        e.scalar().ok_or_else(|| "an empty match".to_string())
    } else if h.get("present_match").is_some() {
        Err("a presence match".into())
    } else {
        let kind = h
            .as_map()
            .unwrap_or(&[])
            .iter()
            .map(|(k, _)| k.name.as_str())
            .find(|k| *k != "name")
            .unwrap_or("an empty")
            .to_string();
        Err(format!("a {kind} match"))
    };
    let value = match value {
        Ok(v) => v,
        Err(e) => {
            ctx.r.refused(
                &h.loc,
                d,
                format!("{e}: veloxy compares header values exactly; the route is left out"),
            );
            return false;
        }
    };
    match name.to_ascii_lowercase().as_str() {
        ":method" => {
            conds.insert(":method".into(), value.clone());
            methods.push(value.into());
        }
        n if n.starts_with(':') => {
            ctx.r.refused(
                &h.loc,
                d,
                "a pseudo-header condition other than :method; the route is left out",
            );
            return false;
        }
        _ => {
            conds.insert(name.to_ascii_lowercase(), value.clone());
            headers.insert(name, value.into());
        }
    }
    ctx.r.translated(&h.loc, d);
    true
}

/// `redirect`.
fn redirect(ctx: &mut Ctx, loc: &Loc, a: &Node, out: &mut RouteOut) {
    let mut f = Fields::new(a, "redirect");
    let mut diffs = Vec::new();
    let https = f
        .take("https_redirect")
        .is_some_and(|(_, v)| v.as_bool() == Some(true));
    let scheme = f.take("scheme_redirect").and_then(|(_, v)| v.scalar());
    let host = f.take("host_redirect").and_then(|(_, v)| v.scalar());
    let port = f.take("port_redirect").and_then(|(_, v)| v.scalar());
    let scheme = if https {
        "https".to_string()
    } else {
        scheme.unwrap_or_else(|| "{scheme}".into())
    };
    let authority = match (host, port) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h,
        (None, Some(p)) => format!("{{host}}:{p}"),
        (None, None) if https || scheme != "{scheme}" => {
            diffs.push("Envoy keeps a port other than 80 from the Host in the Location; veloxy leaves the port out");
            "{host}".into()
        }
        (None, None) => "{authority}".into(),
    };
    let strip = f
        .take("strip_query")
        .is_some_and(|(_, v)| v.as_bool() == Some(true));
    let query = if strip { "" } else { "?{query}" };
    let mut path = "{uri}".to_string();
    if let Some((_, p)) = f.take("path_redirect") {
        let p = p
            .scalar()
            .unwrap_or_default()
            .replace('{', "{{")
            .replace('}', "}}");
        path = if p.contains('?') || strip {
            p
        } else {
            diffs.push("a request without a query gets a Location ending in '?'");
            format!("{p}{query}")
        };
    } else if let Some((l, p)) = f.take("prefix_rewrite") {
        let p = p.scalar().unwrap_or_default();
        match rest_capture(out, &p) {
            Some(t) => path = format!("{t}{query}"),
            None => ctx.r.refused(
                l,
                "redirect.prefix_rewrite",
                "on a route that does not match a prefix",
            ),
        }
    } else if strip {
        path = "{path}".into();
    }
    f.refuse(
        &mut ctx.r,
        "regex_rewrite",
        "a regex rewrite of the redirect's path: veloxy lacks it",
    );
    let status = match f
        .take("response_code")
        .and_then(|(_, v)| crate::util::enum_name(v))
        .as_deref()
    {
        Some("FOUND") => 302,
        Some("SEE_OTHER") => 303,
        Some("TEMPORARY_REDIRECT") => 307,
        Some("PERMANENT_REDIRECT") => 308,
        _ => 301,
    };
    f.finish(&mut ctx.r);
    let mut t = Table::new();
    t.insert("to".into(), format!("{scheme}://{authority}{path}").into());
    t.insert("status".into(), Value::Integer(status));
    out.target.push(("redirect".into(), Value::Table(t)));
    if diffs.is_empty() {
        ctx.r.translated(loc, "route.redirect");
    } else {
        ctx.r.different(loc, "route.redirect", diffs.join("; "));
    }
}

/// Turns a prefix route into a regex capturing the rest of the path; the template that puts
/// `replacement` in place of the prefix. `None` when the route does not match a prefix.
pub fn rest_capture(out: &mut RouteOut, replacement: &str) -> Option<String> {
    let PathKind::Prefix(p) = &out.m.path else {
        return None;
    };
    let re = format!("^{}(?<rest>.*)$", regex::escape(p));
    out.m.path = PathKind::Regex(re.clone());
    out.matching.retain(|(k, _)| k != "path");
    out.matching.insert(0, ("path_regex".into(), re.into()));
    Some(format!(
        "{}{{re.rest}}",
        replacement.replace('{', "{{").replace('}', "}}")
    ))
}

/// `direct_response`.
fn direct(ctx: &mut Ctx, loc: &Loc, a: &Node, out: &mut RouteOut) {
    let status = a.get("status").and_then(|s| s.as_i64()).unwrap_or(200);
    let mut t = Table::new();
    t.insert("status".into(), Value::Integer(status));
    if let Some(b) = a.get("body") {
        let text = match crate::util::data_source(b) {
            crate::util::DataSource::Inline(s) => s,
            crate::util::DataSource::File(p) => match std::fs::read_to_string(ctx.base.join(&p)) {
                Ok(s) => s,
                Err(e) => {
                    ctx.r
                        .refused(loc, "route.direct_response", format!("{p}: {e}"));
                    return;
                }
            },
            crate::util::DataSource::Other(w) => {
                ctx.r
                    .refused(loc, "route.direct_response", format!("a body from {w}"));
                return;
            }
        };
        t.insert("body".into(), text.into());
        t.insert("content_type".into(), "text/plain".into());
    } else {
        t.insert("body".into(), "".into());
    }
    out.target.push(("respond".into(), Value::Table(t)));
    ctx.r.translated(loc, "route.direct_response");
}

/// `typed_per_filter_config` of a route or a virtual host.
pub fn per_filter(
    ctx: &mut Ctx,
    pf: &Node,
    cors: &mut Option<Cors>,
    authz_off: &mut bool,
    rate: &mut Option<Table>,
) {
    for (k, v) in pf.as_map().unwrap_or(&[]) {
        let d = format!("typed_per_filter_config.{}", k.name);
        let (ty, body) = typed(v);
        let disabled = v.get("disabled").and_then(|b| b.as_bool()) == Some(true)
            || body
                .and_then(|b| b.get("disabled"))
                .and_then(|b| b.as_bool())
                == Some(true);
        if disabled && (ty.ends_with("FilterConfig") || k.name.ends_with("ext_authz")) {
            if k.name.ends_with("cors") {
                *cors = Some(Cors::Off);
            } else if k.name.ends_with("ext_authz") {
                *authz_off = true;
            }
            ctx.r.translated(&k.loc, d);
        } else if k.name.ends_with("cors") || ty.ends_with("CorsPolicy") {
            *cors = Some(Cors::Policy(cors_policy(
                ctx,
                &k.loc,
                &d,
                body.unwrap_or(v),
            )));
        } else if k.name.ends_with("local_ratelimit") {
            match body.map(super::filters::bucket) {
                Some(Ok(t)) => {
                    *rate = t;
                    ctx.r.translated(&k.loc, d);
                }
                Some(Err(e)) => ctx.r.refused(&k.loc, d, e),
                None => ctx.r.refused(&k.loc, d, "no typed_config"),
            }
        } else {
            ctx.r
                .refused(&k.loc, d, "a per-route config of a filter veloxy lacks");
        }
    }
}

/// `host_rewrite_literal` / `auto_host_rewrite` as a `Host` set upstream.
pub fn host_rewrite(out: &mut RouteOut, host: String) {
    out.mutations.req.insert(0, Op::Set("Host".into(), host));
}

/// The duration of a `timeout` (0: disabled).
pub fn timeout(n: &Node) -> Option<Option<u64>> {
    let ms = duration_ms(n)?;
    Some((ms > 0).then_some(ms))
}

pub use super::policy::{cors_policy, hash_policy, retry_policy};
