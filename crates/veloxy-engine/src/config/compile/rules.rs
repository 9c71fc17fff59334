//! Compiles a route's match (path kind, conditions) and its rules (header rules, error pages,
//! body cap, `location_rewrite`), and checks every template against the route's regex.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::super::error::{ConfigError, Source};
use super::super::file::{HeaderRulesSection, RouteSection, SizeValue};
use crate::rules::{
    Conditions, ErrorPage, HeaderRules, PathRegex as Regex, RouteRules, StatusSpec,
};
use crate::template::{Capture, Template, Var};

/// How a route matches: its path kind and conditions.
pub(super) struct Matching {
    pub path: String,
    pub exact: bool,
    pub regex: Option<Regex>,
    pub conditions: Conditions,
}

/// `path`, `path_exact` or `path_regex` (at most one), and `methods`, `headers`, `query`.
pub(super) fn compile_match(
    src: &Source,
    key: &str,
    r: &RouteSection,
) -> Result<Matching, ConfigError> {
    // (key, span, text): the names were expanded to one each before this.
    let one = |k: &'static str, v: &crate::config::file::Opt<crate::config::file::Names>| {
        v.as_ref().map(|v| (k, v.span(), v.get_ref().to_string()))
    };
    let kinds = [
        one("path", &r.path),
        one("path_exact", &r.path_exact),
        r.path_regex
            .as_ref()
            .map(|v| ("path_regex", v.span(), v.get_ref().clone())),
    ];
    let mut given = kinds.into_iter().flatten();
    let first = given.next();
    if let Some((k, span, _)) = given.next() {
        return Err(src.error(
            span,
            format!("{key}.{k}"),
            "a route has one of path (prefix), path_exact and path_regex",
        ));
    }
    let (path, exact, regex) = match first {
        None => ("/".to_owned(), false, None),
        Some(("path_regex", span, v)) => {
            let re = Regex::new(&v).map_err(|msg| {
                src.error(
                    span.clone(),
                    format!("{key}.path_regex"),
                    format!("invalid regex: {msg}"),
                )
            })?;
            (v, false, Some(re))
        }
        Some((k, span, v)) => {
            if !v.starts_with('/') {
                return Err(src.error(span, format!("{key}.{k}"), "must start with '/'"));
            }
            (v, k == "path_exact", None)
        }
    };
    Ok(Matching {
        path,
        exact,
        regex,
        conditions: conditions(src, key, r)?,
    })
}

fn conditions(src: &Source, key: &str, r: &RouteSection) -> Result<Conditions, ConfigError> {
    let mut c = Conditions::default();
    if let Some(m) = &r.methods {
        for method in m.get_ref() {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err(src.error(
                    m.span(),
                    format!("{key}.methods"),
                    format!("{method:?} is not a method name"),
                ));
            }
            c.methods.push(method.to_ascii_uppercase());
        }
        if c.methods.is_empty() {
            return Err(src.error(m.span(), format!("{key}.methods"), "must not be empty"));
        }
    }
    if let Some(h) = &r.headers {
        for (name, value) in h.get_ref() {
            field_name(src, h.span(), &format!("{key}.headers"), name)?;
            c.headers.push((name.to_ascii_lowercase(), value.clone()));
        }
    }
    if let Some(q) = &r.query {
        c.query = q.get_ref().clone().into_iter().collect();
    }
    Ok(c)
}

/// Checks that `name` is a header field name.
pub(super) fn field_name(
    src: &Source,
    span: Range<usize>,
    key: &str,
    name: &str,
) -> Result<(), ConfigError> {
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(src.error(span, key, format!("{name:?} is not a header field name")));
    }
    Ok(())
}

/// Compiles a template and checks its `{re.*}` variables against the route's regex.
pub(super) fn template(
    src: &Source,
    span: Range<usize>,
    key: &str,
    text: &str,
    regex: Option<&Regex>,
) -> Result<Template, ConfigError> {
    let mut t = Template::parse(text).map_err(|m| src.error(span.clone(), key, m))?;
    for v in t.vars() {
        let Var::Re(cap) = v else { continue };
        let known = match (regex, cap) {
            (None, _) => {
                return Err(src.error(
                    span,
                    key,
                    "{re.*} needs a path_regex on the route to capture from",
                ))
            }
            (Some(re), Capture::Index(n)) => *n < re.groups(),
            (Some(re), Capture::Name(n)) => re.group_index(n).is_some(),
        };
        if !known {
            let name = match cap {
                Capture::Index(n) => n.to_string(),
                Capture::Name(n) => n.clone(),
            };
            return Err(src.error(
                span,
                key,
                format!("path_regex has no capture group {name:?} for {{re.{name}}}"),
            ));
        }
    }
    if let Some(re) = regex {
        t.resolve_captures(|n| re.group_index(n));
    }
    Ok(t)
}

/// A route's rules; `None` when it sets none (the request path then does no rule work).
pub(super) fn compile_rules(
    src: &Source,
    key: &str,
    r: &RouteSection,
    regex: Option<&Regex>,
    group_location_rewrite: bool,
) -> Result<Option<Arc<RouteRules>>, ConfigError> {
    let headers = |v: &crate::config::file::Opt<HeaderRulesSection>, k: &str, request: bool| {
        v.as_ref()
            .map(|v| header_rules(src, &format!("{key}.{k}"), v, regex, request))
            .transpose()
    };
    let rules = RouteRules {
        request: headers(&r.request_headers, "request_headers", true)?,
        response: headers(&r.response_headers, "response_headers", false)?,
        error_pages: match &r.error_pages {
            Some(p) => error_pages(src, &format!("{key}.error_pages"), p)?,
            None => Vec::new(),
        },
        max_body: r
            .max_body_bytes
            .as_ref()
            .map(|s| size(src, &format!("{key}.max_body_bytes"), s))
            .transpose()?,
        location_rewrite: r
            .location_rewrite
            .as_ref()
            .map_or(group_location_rewrite, |b| *b.get_ref()),
        access: ip_rules(src, key, r)?,
        basic_auth: basic_auth(src, key, r)?,
        cors: cors(src, key, r)?,
        // Set by the route, which knows the upstream groups (and the caches).
        forward_auth: None,
        mirror: None,
        search: None,
        cache: None,
        fastcgi: None,
        grpc_web: None,
        early_hints: false,
        tracing: None,
    };
    Ok((!rules.is_empty()).then(|| Arc::new(rules)))
}

/// Fields veloxy frames or manages itself: rules may not set or remove them.
const MANAGED: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

fn header_rules(
    src: &Source,
    key: &str,
    v: &Spanned<HeaderRulesSection>,
    regex: Option<&Regex>,
    request: bool,
) -> Result<HeaderRules, ConfigError> {
    let span = v.span();
    let s = v.get_ref();
    let check = |name: &str, k: &str| -> Result<(), ConfigError> {
        let key = format!("{key}.{k}");
        field_name(src, span.clone(), &key, name)?;
        let lower = name.to_ascii_lowercase();
        if MANAGED.contains(&lower.as_str()) || (!request && lower == "host") {
            return Err(src.error(
                span.clone(),
                key,
                format!("{name:?} is managed by veloxy (framing and connection fields)"),
            ));
        }
        Ok(())
    };
    let fields = |map: &BTreeMap<String, String>, k: &str| {
        let mut out = Vec::new();
        for (name, value) in map {
            check(name, k)?;
            let t = template(src, span.clone(), &format!("{key}.{k}"), value, regex)?;
            if t.literal().is_some_and(|l| l.contains(['\r', '\n', '\0'])) {
                return Err(src.error(
                    span.clone(),
                    format!("{key}.{k}"),
                    format!("the value of {name:?} has a CR, LF or NUL"),
                ));
            }
            out.push((name.clone(), t));
        }
        Ok::<_, ConfigError>(out)
    };
    let set = fields(&s.set, "set")?;
    let add = fields(&s.add, "add")?;
    for name in &s.remove {
        check(name, "remove")?;
    }
    Ok(HeaderRules::new(set, add, s.remove.clone()))
}

/// Error pages are read at load; a page larger than this is refused (they are held in
/// memory and sent whole).
const MAX_PAGE: u64 = 1 << 20;

fn error_pages(
    src: &Source,
    key: &str,
    v: &Spanned<BTreeMap<String, String>>,
) -> Result<Vec<ErrorPage>, ConfigError> {
    let mut pages = Vec::new();
    let base = src.file.parent().unwrap_or(Path::new(""));
    for (status, file) in v.get_ref() {
        let err = |m: String| src.error(v.span(), format!("{key}.{status}"), m);
        let spec = StatusSpec::parse(status).ok_or_else(|| {
            err(format!(
                "{status:?} is not an error status: use 400 to 599, \"4xx\" or \"5xx\""
            ))
        })?;
        let path = base.join(file);
        let body = match std::fs::metadata(&path) {
            Ok(m) if m.len() > MAX_PAGE => return Err(err(format!("{file:?} is over 1 MiB"))),
            Ok(m) if m.is_dir() => return Err(err(format!("{file:?} is a directory"))),
            Ok(_) => std::fs::read(&path),
            Err(e) => Err(e),
        }
        .map_err(|e| {
            let reason = match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_owned(),
                _ => e.to_string(),
            };
            err(format!("{file:?}: {reason}"))
        })?;
        pages.push(ErrorPage {
            status: spec,
            file: std::path::absolute(&path)
                .unwrap_or(path.clone())
                .display()
                .to_string(),
            body: body.into(),
            content_type: crate::rules::page_type(file),
        });
    }
    Ok(pages)
}

/// `basic_auth`: the users file is read now (and again on every reload).
fn basic_auth(
    src: &Source,
    key: &str,
    r: &RouteSection,
) -> Result<Option<Arc<crate::auth::BasicAuth>>, ConfigError> {
    let Some(b) = &r.basic_auth else {
        return Ok(None);
    };
    let b = b.get_ref();
    let file = b.users_file.get_ref();
    let err = |m: String| {
        src.error(
            b.users_file.span(),
            format!("{key}.basic_auth.users_file"),
            m,
        )
    };
    let path = src.file.parent().unwrap_or(Path::new("")).join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        err(match e.kind() {
            std::io::ErrorKind::NotFound => format!("{file:?}: no such file"),
            _ => format!("{file:?}: {e}"),
        })
    })?;
    let realm = b.realm.as_deref().unwrap_or("restricted");
    if realm.contains(['"', '\\', '\r', '\n']) {
        return Err(src.error(
            b.users_file.span(),
            format!("{key}.basic_auth.realm"),
            "must not contain quotes, backslashes or line breaks",
        ));
    }
    let shown = std::path::absolute(&path)
        .unwrap_or(path)
        .display()
        .to_string();
    let (auth, weak) = crate::auth::BasicAuth::parse(realm, &shown, &text)
        .map_err(|m| err(format!("{file:?}: {m}")))?;
    if !weak.is_empty() {
        tracing::warn!(
            file = %file,
            users = ?weak,
            "basic_auth: $apr1$ (MD5) hashes are weak; re-create them with `htpasswd -B`"
        );
    }
    Ok(Some(Arc::new(auth)))
}

/// `forward_auth`.
pub(super) fn forward_auth(
    src: &Source,
    key: &str,
    v: &Spanned<crate::config::file::ForwardAuthSection>,
    upstream_index: &std::collections::HashMap<String, usize>,
    groups: &[crate::config::UpstreamGroup],
) -> Result<crate::rules::ForwardAuth, ConfigError> {
    let f = v.get_ref();
    let name = f.upstream.get_ref();
    let &upstream = upstream_index.get(name).ok_or_else(|| {
        src.error(
            f.upstream.span(),
            format!("{key}.forward_auth.upstream"),
            format!("upstream {name:?} is not defined (add [upstreams.{name}])"),
        )
    })?;
    if groups[upstream].proxy_protocol > 0 {
        return Err(src.error(
            f.upstream.span(),
            format!("{key}.forward_auth.upstream"),
            format!("upstream {name:?} sends PROXY headers: an auth service gets plain requests"),
        ));
    }
    let path = f.path.clone().unwrap_or_else(|| "/".to_owned());
    if !path.starts_with('/') || path.contains(['\r', '\n', ' ']) {
        return Err(src.error(
            v.span(),
            format!("{key}.forward_auth.path"),
            "must be a path starting with '/'",
        ));
    }
    let copy: Vec<String> = f.copy_headers.clone().unwrap_or_default();
    for c in &copy {
        field_name(
            src,
            v.span(),
            &format!("{key}.forward_auth.copy_headers"),
            c,
        )?;
    }
    let (send_headers, remove_headers) = forward_auth_fields(src, v.span(), key, f)?;
    Ok(crate::rules::ForwardAuth {
        upstream,
        host: auth_host(&groups[upstream]),
        path,
        copy_headers: copy.into(),
        timeout: f.timeout.map_or(std::time::Duration::from_secs(2), |d| d.0),
        send_headers,
        remove_headers,
        trust_forward_header: f.trust_forward_header.unwrap_or(false),
    })
}

/// The patterns of `send_headers` (default Cookie and Authorization; `"all"`: `None`) and
/// `remove_headers`, each a field name or a prefix ending in `*`.
#[allow(clippy::type_complexity)]
fn forward_auth_fields(
    src: &Source,
    span: std::ops::Range<usize>,
    key: &str,
    f: &crate::config::file::ForwardAuthSection,
) -> Result<
    (
        Option<std::sync::Arc<[crate::rules::FieldPattern]>>,
        std::sync::Arc<[crate::rules::FieldPattern]>,
    ),
    ConfigError,
> {
    use crate::config::file::FieldNames;
    use crate::rules::FieldPattern;
    let patterns = |names: &[String], what: &str| {
        names
            .iter()
            .map(|n| {
                let name = n.strip_suffix('*').unwrap_or(n);
                field_name(
                    src,
                    span.clone(),
                    &format!("{key}.forward_auth.{what}"),
                    name,
                )?;
                Ok(FieldPattern::new(n))
            })
            .collect::<Result<Vec<_>, ConfigError>>()
    };
    let send = match f.send_headers.as_ref().map(|s| (s.get_ref(), s.span())) {
        None => Some(vec![
            FieldPattern::new("Cookie"),
            FieldPattern::new("Authorization"),
        ]),
        Some((FieldNames::Word(w), _)) if w == "all" => None,
        Some((FieldNames::Word(w), s)) => {
            return Err(src.error(
                s,
                format!("{key}.forward_auth.send_headers"),
                format!("{w:?}: give a list of field names (\"X-*\" for a prefix) or \"all\""),
            ))
        }
        Some((FieldNames::List(l), _)) => Some(patterns(l, "send_headers")?),
    };
    let remove = patterns(f.remove_headers.as_deref().unwrap_or(&[]), "remove_headers")?;
    Ok((send.map(Into::into), remove.into()))
}

/// The Host of the auth requests: the group's first fixed server, else its first `dns` or
/// `srv` name (a group of only DNS entries has no backend until it is resolved).
fn auth_host(g: &crate::config::UpstreamGroup) -> String {
    use crate::upstream::group::DiscoveryName;
    if let Some(b) = g.backends.first() {
        return b.authority();
    }
    match g.discovery.first().map(|d| &d.name) {
        Some(DiscoveryName::Dns { host, port }) => format!("{host}:{port}"),
        Some(DiscoveryName::Srv(name)) => name.trim_end_matches('.').to_string(),
        _ => g.name.clone(),
    }
}

/// `cors`.
fn cors(
    src: &Source,
    key: &str,
    r: &RouteSection,
) -> Result<Option<crate::cors::Cors>, ConfigError> {
    let Some(c) = &r.cors else { return Ok(None) };
    let span = c.span();
    let c = c.get_ref();
    let err = |k: &str, m: &str| src.error(span.clone(), format!("{key}.cors.{k}"), m);
    if c.origins.is_empty() {
        return Err(err("origins", "must name at least one origin (or \"*\")"));
    }
    let credentials = c.credentials.unwrap_or(false);
    if credentials && c.origins.iter().any(|o| o == "*") {
        return Err(err(
            "origins",
            "\"*\" cannot be used with credentials = true: list the origins",
        ));
    }
    for o in &c.origins {
        if let Some(e) = crate::cors::origin_error(o.trim_end_matches('/')) {
            return Err(err("origins", &e));
        }
    }
    let names = |v: &Option<Vec<String>>, k: &str, default: &[&str]| {
        let list: Vec<String> = match v {
            Some(l) => l.clone(),
            None => default.iter().map(|s| s.to_string()).collect(),
        };
        for n in &list {
            if http::HeaderName::from_bytes(n.as_bytes()).is_err() {
                return Err(err(k, &format!("{n:?} is not a field or method name")));
            }
        }
        Ok(list.join(", "))
    };
    Ok(Some(crate::cors::Cors {
        origins: c
            .origins
            .iter()
            .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
            .collect(),
        methods: names(&c.methods, "methods", &["GET", "HEAD", "POST"])?,
        headers: names(&c.headers, "headers", &[])?,
        expose_headers: names(&c.expose_headers, "expose_headers", &[])?,
        credentials,
        max_age: c.max_age.map_or(3600, |d| d.0.as_secs()),
        echo_origin: false,
    }))
}

/// `allow` / `deny`.
fn ip_rules(
    src: &Source,
    key: &str,
    r: &RouteSection,
) -> Result<Option<crate::access::IpRules>, ConfigError> {
    let list = |v: &crate::config::file::Opt<Vec<String>>, k: &str| {
        v.as_ref()
            .map(|l| {
                crate::access::IpList::parse(l.get_ref())
                    .map_err(|m| src.error(l.span(), format!("{key}.{k}"), m))
            })
            .transpose()
    };
    let allow = list(&r.allow, "allow")?;
    let deny = list(&r.deny, "deny")?;
    if allow.is_none() && deny.is_none() {
        return Ok(None);
    }
    Ok(Some(crate::access::IpRules {
        allow,
        deny: deny.unwrap_or_default(),
    }))
}

/// A size value (bytes, or a string with a unit) of `key`.
pub(super) fn size(src: &Source, key: &str, v: &Spanned<SizeValue>) -> Result<u64, ConfigError> {
    match v.get_ref() {
        SizeValue::Bytes(n) => Ok(*n),
        SizeValue::Text(t) => crate::rules::parse_size(t).map_err(|m| src.error(v.span(), key, m)),
    }
}
