//! One HTTPRoute or GRPCRoute rule to veloxy route tables (without `listener` and `host`,
//! which the caller adds per attached listener): one route per match (a rule's matches are
//! ORed), its filters as route keys (header modifiers, redirect, rewrite, CORS).
//!
//! PathPrefix matches whole segments (`/foo` matches `/foo` and `/foo/x`, not `/foobar`):
//! `path_exact = "/foo"` with `path = "/foo/"`. A `ReplacePrefixMatch` (rewrite or redirect)
//! needs the rest of the path: the prefix becomes `path_exact` plus a `path_regex` whose
//! `rest` capture goes into the template.

use toml::{Table, Value};

use super::types::{
    CorsFilter, Filter, GrpcMatch, GrpcRule, HeaderModifier, HttpMatch, HttpRule, PathModifier,
    Redirect, ValueMatch,
};

/// What a rule's routes answer with, from its backendRefs.
pub enum Target {
    /// Proxy to this upstream group, with the groups of the rule's RequestMirror filters
    /// in their order (`None`: the mirror's Service has no ready endpoint, nothing to copy to).
    Upstream(String, Vec<Option<String>>),
    /// A fixed answer (no usable backend).
    Respond(u16, &'static str),
}

/// The Gateway listener a route is attached through (for redirects).
#[derive(Clone, Copy)]
pub struct Via {
    pub port: i32,
    pub https: bool,
}

/// How the path was matched, for a prefix replacement.
#[derive(Clone, Copy, PartialEq)]
enum Rest {
    /// No prefix replacement.
    None,
    /// The prefix matched exactly.
    Exact,
    /// The prefix matched with more after it: `{re.rest}`.
    Capture,
}

/// The routes of an HTTPRoute rule, or why it is refused (the reason names the field).
pub fn http_rule(rule: &HttpRule, target: &Target, via: Via) -> Result<Vec<Table>, String> {
    let f = filters(&rule.filters, true)?;
    let prefix_mod = f
        .path_mod()
        .is_some_and(|p| p.type_ == "ReplacePrefixMatch");
    let default = [HttpMatch::default()];
    let matches = if rule.matches.is_empty() {
        &default[..]
    } else {
        &rule.matches
    };
    let mut out = Vec::new();
    for m in matches {
        let conditions = http_conditions(m)?;
        for (mut t, rest) in path_variants(m, prefix_mod)? {
            t.extend(conditions.clone());
            t.extend(f.keys.clone());
            target_keys(&mut t, &f, target, rest, via)?;
            out.push(t);
        }
    }
    Ok(out)
}

/// The routes of a GRPCRoute rule (its method matches are paths `/SERVICE/METHOD`).
pub fn grpc_rule(rule: &GrpcRule, target: &Target) -> Result<Vec<Table>, String> {
    let f = filters(&rule.filters, false)?;
    let default = [GrpcMatch::default()];
    let matches = if rule.matches.is_empty() {
        &default[..]
    } else {
        &rule.matches
    };
    let mut out = Vec::new();
    for m in matches {
        let mut t = grpc_path(m)?;
        if let Some(h) = values(&m.headers, "headers")? {
            t.insert("headers".into(), h);
        }
        t.extend(f.keys.clone());
        match target {
            Target::Upstream(g, _) => {
                t.insert("upstream".into(), g.as_str().into());
            }
            Target::Respond(status, body) => {
                t.insert("respond".into(), respond(*status, body));
            }
        }
        out.push(t);
    }
    Ok(out)
}

fn grpc_path(m: &GrpcMatch) -> Result<Table, String> {
    let mut t = Table::new();
    let Some(method) = &m.method else {
        t.insert("path".into(), "/".into());
        return Ok(t);
    };
    if method.type_.as_deref().unwrap_or("Exact") != "Exact" {
        return Err("GRPCRoute method match type RegularExpression is not supported".into());
    }
    match (method.service.as_deref(), method.method.as_deref()) {
        (Some(s), Some(m)) => t.insert("path_exact".into(), format!("/{s}/{m}").into()),
        (Some(s), None) => t.insert("path".into(), format!("/{s}/").into()),
        (None, Some(m)) => t.insert(
            "path_regex".into(),
            format!("^/[^/]+/{}$", regex_escape(m)).into(),
        ),
        (None, None) => t.insert("path".into(), "/".into()),
    };
    Ok(t)
}

/// A rule's filters as route keys.
struct Filters<'a> {
    /// `request_headers` / `response_headers`.
    keys: Table,
    redirect: Option<&'a Redirect>,
    rewrite: Option<&'a PathModifier>,
    /// The percent of each RequestMirror filter, in order.
    mirrors: Vec<f64>,
}

impl Filters<'_> {
    fn path_mod(&self) -> Option<&PathModifier> {
        self.redirect.and_then(|r| r.path.as_ref()).or(self.rewrite)
    }
}

fn filters(fs: &[Filter], http: bool) -> Result<Filters<'_>, String> {
    let mut out = Filters {
        keys: Table::new(),
        redirect: None,
        rewrite: None,
        mirrors: Vec::new(),
    };
    let mut request = HeaderModifier::default();
    for f in fs {
        match (f.type_.as_str(), http) {
            ("RequestHeaderModifier", _) => {
                let m = f.request_header_modifier.clone().unwrap_or_default();
                request.set.extend(m.set);
                request.add.extend(m.add);
                request.remove.extend(m.remove);
            }
            ("ResponseHeaderModifier", _) => {
                let m = f.response_header_modifier.clone().unwrap_or_default();
                out.keys.insert("response_headers".into(), header_edits(&m));
            }
            ("RequestRedirect", true) => out.redirect = f.request_redirect.as_ref(),
            ("URLRewrite", true) => {
                let Some(u) = f.url_rewrite.as_ref() else {
                    continue;
                };
                if let Some(h) = &u.hostname {
                    request.set.push(super::types::NameValue {
                        name: "Host".into(),
                        value: h.clone(),
                    });
                }
                out.rewrite = u.path.as_ref();
            }
            ("RequestMirror", true) => {
                let m = f.request_mirror.as_ref();
                out.mirrors
                    .push(m.map(mirror_percent).transpose()?.unwrap_or(100.0));
            }
            ("CORS", true) => {
                if let Some(c) = f.cors.as_ref().map(cors).transpose()?.flatten() {
                    out.keys.insert("cors".into(), c);
                }
            }
            (other, _) => return Err(format!("filter type {other} is not supported")),
        }
    }
    if out.redirect.is_some() && (out.rewrite.is_some() || !request.set.is_empty()) {
        return Err("RequestRedirect cannot be combined with URLRewrite".into());
    }
    if !(request.set.is_empty() && request.add.is_empty() && request.remove.is_empty()) {
        out.keys
            .insert("request_headers".into(), header_edits(&request));
    }
    Ok(out)
}

/// The share of requests a RequestMirror filter copies, in percent: `percent`, or
/// `fraction` (its denominator 100 by default), or all.
fn mirror_percent(m: &super::types::RequestMirror) -> Result<f64, String> {
    match (m.percent, &m.fraction) {
        (Some(_), Some(_)) => Err("RequestMirror: percent and fraction both set".into()),
        (Some(p), None) if (0..=100).contains(&p) => Ok(f64::from(p)),
        (None, Some(f)) => {
            let d = f.denominator.unwrap_or(100);
            if d <= 0 || f.numerator < 0 || f.numerator > d {
                return Err(format!(
                    "RequestMirror: fraction {}/{d} is not within 0..=1",
                    f.numerator
                ));
            }
            Ok(f64::from(f.numerator) * 100.0 / f64::from(d))
        }
        (None, None) => Ok(100.0),
        (Some(p), None) => Err(format!("RequestMirror: percent {p} is not within 0..=100")),
    }
}

/// The CORS filter as the route's `cors` (`None`: it allows no origin, so it adds nothing);
/// wildcard hosts (`https://*.example.com`) are veloxy's too. What veloxy's CORS cannot say
/// is refused: `*` in `allowOrigins`, `allowHeaders` or `exposeHeaders` with
/// `allowCredentials` (the spec wants the request's values echoed then). `*` methods
/// with credentials are listed (a browser takes `*` literally then).
fn cors(c: &CorsFilter) -> Result<Option<Value>, String> {
    if c.allow_origins.is_empty() {
        return Ok(None);
    }
    let credentials = c.allow_credentials.unwrap_or(false);
    let star = |l: &[String]| l.iter().any(|v| v == "*");
    for (field, list) in [
        ("allowOrigins", &c.allow_origins),
        ("allowHeaders", &c.allow_headers),
        ("exposeHeaders", &c.expose_headers),
    ] {
        if credentials && star(list) {
            return Err(format!(
                "CORS {field} \"*\" with allowCredentials is not supported"
            ));
        }
    }
    let strings = |l: &[String]| Value::Array(l.iter().map(|v| v.as_str().into()).collect());
    // The default ports are the same origin as none.
    let origins: Vec<String> = c
        .allow_origins
        .iter()
        .map(|o| {
            let o = o.trim_end_matches('/');
            let default = if o.starts_with("https://") {
                ":443"
            } else {
                ":80"
            };
            o.strip_suffix(default).unwrap_or(o).to_owned()
        })
        .collect();
    let mut t = Table::new();
    t.insert("origins".into(), strings(&origins));
    if !c.allow_methods.is_empty() {
        let methods = if credentials && star(&c.allow_methods) {
            ALL_METHODS.iter().map(|m| m.to_string()).collect()
        } else {
            c.allow_methods.clone()
        };
        t.insert("methods".into(), strings(&methods));
    }
    if !c.allow_headers.is_empty() {
        t.insert("headers".into(), strings(&c.allow_headers));
    }
    if !c.expose_headers.is_empty() {
        t.insert("expose_headers".into(), strings(&c.expose_headers));
    }
    if credentials {
        t.insert("credentials".into(), true.into());
    }
    // The spec's default is 5 s (veloxy's 1 h).
    let max_age = c.max_age.unwrap_or(5).max(0);
    t.insert("max_age".into(), format!("{max_age}s").into());
    Ok(Some(Value::Table(t)))
}

/// The methods a CORS filter's `*` stands for (the CRD's list).
const ALL_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// A header modifier as `{ set = {...}, add = {...}, remove = [...] }` (values are literal:
/// braces escaped from the template syntax).
fn header_edits(m: &HeaderModifier) -> Value {
    let mut t = Table::new();
    for (key, list) in [("set", &m.set), ("add", &m.add)] {
        if !list.is_empty() {
            let fields: Table = list
                .iter()
                .map(|nv| (nv.name.clone(), Value::from(literal(&nv.value))))
                .collect();
            t.insert(key.into(), Value::Table(fields));
        }
    }
    if !m.remove.is_empty() {
        let names = m.remove.iter().map(|n| Value::from(n.as_str())).collect();
        t.insert("remove".into(), Value::Array(names));
    }
    Value::Table(t)
}

/// Header, query and method conditions of an HTTPRoute match.
fn http_conditions(m: &HttpMatch) -> Result<Table, String> {
    let mut t = Table::new();
    if let Some(h) = values(&m.headers, "headers")? {
        t.insert("headers".into(), h);
    }
    if let Some(q) = values(&m.query_params, "queryParams")? {
        t.insert("query".into(), q);
    }
    if let Some(method) = &m.method {
        t.insert("methods".into(), Value::Array(vec![method.as_str().into()]));
    }
    Ok(t)
}

/// Exact value matches as a table (the first of a repeated name wins, as the spec says).
fn values(list: &[ValueMatch], what: &str) -> Result<Option<Value>, String> {
    if list.is_empty() {
        return Ok(None);
    }
    let mut t = Table::new();
    for v in list {
        if v.type_.as_deref().unwrap_or("Exact") != "Exact" {
            return Err(format!(
                "{what} match type {} is not supported",
                v.type_.as_deref().unwrap_or_default()
            ));
        }
        if !t.keys().any(|k| k.eq_ignore_ascii_case(&v.name)) {
            t.insert(v.name.clone(), v.value.as_str().into());
        }
    }
    Ok(Some(Value::Table(t)))
}

/// The path keys of a match: one table, or two for a prefix whose rest a filter needs.
fn path_variants(m: &HttpMatch, prefix_mod: bool) -> Result<Vec<(Table, Rest)>, String> {
    let (kind, value) = match &m.path {
        Some(p) => (
            p.type_.as_deref().unwrap_or("PathPrefix"),
            p.value.as_deref().unwrap_or("/"),
        ),
        None => ("PathPrefix", "/"),
    };
    let one = |k: &str, v: &str| {
        let mut t = Table::new();
        t.insert(k.into(), v.into());
        t
    };
    match kind {
        "Exact" if !prefix_mod => Ok(vec![(one("path_exact", value), Rest::None)]),
        "RegularExpression" if !prefix_mod => {
            if let Some(e) = veloxy_engine::config::path_regex_error(value) {
                return Err(format!("path regex {value:?}: {e}"));
            }
            Ok(vec![(one("path_regex", value), Rest::None)])
        }
        "PathPrefix" => {
            let p = value.trim_end_matches('/');
            if prefix_mod {
                let regex = format!("^{}(?<rest>/.*)$", regex_escape(p));
                let mut out = vec![(one("path_regex", &regex), Rest::Capture)];
                if !p.is_empty() {
                    out.insert(0, (one("path_exact", p), Rest::Exact));
                }
                Ok(out)
            } else if p.is_empty() {
                Ok(vec![(one("path", "/"), Rest::None)])
            } else {
                let mut t = one("path_exact", p);
                t.insert("path".into(), format!("{p}/").into());
                Ok(vec![(t, Rest::None)])
            }
        }
        "Exact" | "RegularExpression" => Err("ReplacePrefixMatch needs a PathPrefix match".into()),
        other => Err(format!("path match type {other} is not supported")),
    }
}

/// The route's target: a redirect, the upstream (with a path rewrite) or a fixed answer.
fn target_keys(
    t: &mut Table,
    f: &Filters<'_>,
    target: &Target,
    rest: Rest,
    via: Via,
) -> Result<(), String> {
    if let Some(r) = f.redirect {
        let path = match &r.path {
            None => "{uri}".to_owned(),
            Some(p) => format!("{}{{is_args}}{{query}}", new_path(p, rest)?),
        };
        let mut red = Table::new();
        red.insert("to".into(), redirect_to(r, &path, via).into());
        red.insert(
            "status".into(),
            i64::from(r.status_code.unwrap_or(302)).into(),
        );
        t.insert("redirect".into(), Value::Table(red));
        return Ok(());
    }
    match target {
        Target::Upstream(g, mirrors) => {
            t.insert("upstream".into(), g.as_str().into());
            if let Some(p) = f.rewrite {
                t.insert("rewrite".into(), new_path(p, rest)?.into());
            }
            let tables: Vec<Value> = (f.mirrors.iter().zip(mirrors))
                .filter_map(|(percent, group)| {
                    let mut m = Table::new();
                    m.insert("upstream".into(), group.as_deref()?.into());
                    m.insert("percent".into(), (*percent).into());
                    Some(Value::Table(m))
                })
                .collect();
            if !tables.is_empty() {
                t.insert("mirror".into(), Value::Array(tables));
            }
        }
        Target::Respond(status, body) => {
            t.insert("respond".into(), respond(*status, body));
        }
    }
    Ok(())
}

/// The new path (a template) of a path modifier.
fn new_path(p: &PathModifier, rest: Rest) -> Result<String, String> {
    match (p.type_.as_str(), rest) {
        ("ReplaceFullPath", _) => Ok(literal(p.replace_full_path.as_deref().unwrap_or("/"))),
        ("ReplacePrefixMatch", Rest::Exact | Rest::Capture) => {
            let r = p.replace_prefix_match.as_deref().unwrap_or("/");
            let r = literal(r.trim_end_matches('/'));
            Ok(match rest {
                Rest::Capture => format!("{r}{{re.rest}}"),
                _ if r.is_empty() => "/".into(),
                _ => r,
            })
        }
        ("ReplacePrefixMatch", Rest::None) => {
            Err("ReplacePrefixMatch needs a PathPrefix match".into())
        }
        (other, _) => Err(format!("path modifier type {other} is not supported")),
    }
}

/// The `Location` template of a RequestRedirect: the port is the one given, else none when
/// the scheme changes (its well-known port), else the Gateway listener's; 80 for http and
/// 443 for https are left out.
fn redirect_to(r: &Redirect, path: &str, via: Via) -> String {
    let scheme = r
        .scheme
        .clone()
        .unwrap_or_else(|| if via.https { "https" } else { "http" }.into());
    let host = r.hostname.as_deref().map_or("{host}".into(), literal);
    let port = match (r.port, &r.scheme) {
        (Some(p), _) => Some(p),
        (None, Some(_)) => None,
        (None, None) => Some(via.port),
    };
    let port = port
        .filter(|p| !matches!((scheme.as_str(), p), ("http", 80) | ("https", 443)))
        .map(|p| format!(":{p}"))
        .unwrap_or_default();
    format!("{scheme}://{host}{port}{path}")
}

fn respond(status: u16, body: &str) -> Value {
    let mut t = Table::new();
    t.insert("status".into(), i64::from(status).into());
    t.insert("body".into(), body.into());
    Value::Table(t)
}

/// `s` as a template that renders `s` (braces doubled).
fn literal(s: &str) -> String {
    s.replace('{', "{{").replace('}', "}}")
}

/// `s` as a regex that matches `s` (the metacharacters of Rust's regex syntax escaped).
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(v: serde_json::Value) -> HttpRule {
        serde_json::from_value(v).unwrap()
    }

    const VIA: Via = Via {
        port: 80,
        https: false,
    };

    #[test]
    fn a_prefix_matches_whole_segments_and_conditions_follow() {
        let r = rule(
            serde_json::json!({"matches": [{"path": {"type": "PathPrefix", "value": "/api/"},
            "headers": [{"name": "X-Env", "value": "canary"}], "method": "GET",
            "queryParams": [{"name": "v", "value": "2"}]}]}),
        );
        let routes = http_rule(&r, &Target::Upstream("g".into(), Vec::new()), VIA).unwrap();
        assert_eq!(routes.len(), 1);
        let t = &routes[0];
        assert_eq!(t["path_exact"].as_str(), Some("/api"));
        assert_eq!(t["path"].as_str(), Some("/api/"));
        assert_eq!(t["headers"]["X-Env"].as_str(), Some("canary"));
        assert_eq!(t["query"]["v"].as_str(), Some("2"));
        assert_eq!(t["upstream"].as_str(), Some("g"));
    }

    #[test]
    fn prefix_replacement_uses_the_rest_of_the_path() {
        let r = rule(serde_json::json!({"matches": [{"path": {"value": "/old"}}],
            "filters": [{"type": "URLRewrite", "urlRewrite": {"path":
              {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]}));
        let routes = http_rule(&r, &Target::Upstream("g".into(), Vec::new()), VIA).unwrap();
        assert_eq!(routes[0]["path_exact"].as_str(), Some("/old"));
        assert_eq!(routes[0]["rewrite"].as_str(), Some("/new"));
        assert_eq!(routes[1]["path_regex"].as_str(), Some("^/old(?<rest>/.*)$"));
        assert_eq!(routes[1]["rewrite"].as_str(), Some("/new{re.rest}"));
        let r = rule(serde_json::json!({"filters": [{"type": "RequestRedirect",
            "requestRedirect": {"scheme": "https", "statusCode": 301}}]}));
        let routes = http_rule(&r, &Target::Respond(500, ""), VIA).unwrap();
        assert_eq!(
            routes[0]["redirect"]["to"].as_str(),
            Some("https://{host}{uri}")
        );
        let r = rule(
            serde_json::json!({"matches": [{"path": {"type": "RegularExpression", "value": "/x("}}]}),
        );
        let e = http_rule(&r, &Target::Respond(500, ""), VIA).unwrap_err();
        assert!(e.contains("path regex"), "{e}");
        let r = rule(
            serde_json::json!({"filters": [{"type": "RequestMirror", "requestMirror": {
            "backendRef": {"name": "s", "port": 80}, "percent": 101}}]}),
        );
        let e = http_rule(&r, &Target::Respond(500, ""), VIA).unwrap_err();
        assert!(e.contains("RequestMirror"), "{e}");
        let r = rule(
            serde_json::json!({"filters": [{"type": "RequestMirror", "requestMirror": {
            "backendRef": {"name": "s", "port": 80}, "fraction": {"numerator": 3, "denominator": 2}}}]}),
        );
        let e = http_rule(&r, &Target::Respond(500, ""), VIA).unwrap_err();
        assert!(e.contains("fraction"), "{e}");
        let r = rule(serde_json::json!({"filters": [{"type": "CORS", "cors": {
            "allowOrigins": ["https://*.example.com"]}}]}));
        let routes = http_rule(&r, &Target::Respond(500, ""), VIA).unwrap();
        let origins = &routes[0]["cors"]["origins"];
        assert_eq!(origins[0].as_str(), Some("https://*.example.com"));
    }

    #[test]
    fn the_cors_filter_becomes_the_route_cors() {
        let r = rule(serde_json::json!({"filters": [{"type": "CORS", "cors": {
            "allowOrigins": ["https://app.example:443"], "allowCredentials": true,
            "allowMethods": ["*"], "allowHeaders": ["X-Token"]}}]}));
        let routes = http_rule(&r, &Target::Upstream("g".into(), Vec::new()), VIA).unwrap();
        let c = &routes[0]["cors"];
        assert_eq!(
            c["origins"],
            Value::Array(vec!["https://app.example".into()])
        );
        assert_eq!(c["methods"].as_array().unwrap().len(), ALL_METHODS.len());
        assert_eq!(c["credentials"].as_bool(), Some(true));
        assert_eq!(c["max_age"].as_str(), Some("5s"));
        let r = rule(serde_json::json!({"filters": [{"type": "CORS", "cors": {
            "allowOrigins": ["*"], "allowCredentials": true}}]}));
        let e = http_rule(&r, &Target::Upstream("g".into(), Vec::new()), VIA).unwrap_err();
        assert!(e.contains("allowCredentials"), "{e}");
    }
}
