//! Route rules as compiled data: match conditions beyond host and path, header rules, error
//! pages and the body cap. Compiled once at load ([`crate::config`]); the exchange core applies
//! them ([`crate::exchange`]), the same way for every protocol.
//!
//! Order, per request: match -> redirect or respond -> rewrite -> request header rules ->
//! upstream -> response header rules -> error page.

use bytes::Bytes;

use crate::template::{Template, Vars};

/// What a route's `methods`, `headers` and `query` require (every one given must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditions {
    /// Upper-case method names; empty: any method.
    pub methods: Vec<String>,
    /// (lowercase name, exact value) of request header fields (the first field of the name).
    pub headers: Vec<(String, String)>,
    /// (name, exact value) of query parameters, compared as sent (not percent-decoded).
    pub query: Vec<(String, String)>,
}

/// What conditions look at in a request; the exchange core's request head implements it.
pub trait Request {
    /// The method.
    fn method(&self) -> &str;
    /// The first value of a header field (`name` lowercase).
    fn header(&self, name: &str) -> Option<&[u8]>;
    /// The query, without `?` ("" when none).
    fn query(&self) -> &str;
}

impl Conditions {
    /// How many conditions the route sets: routes with more go first among equal paths.
    pub fn count(&self) -> usize {
        usize::from(!self.methods.is_empty()) + self.headers.len() + self.query.len()
    }

    /// Every condition holds for `req`.
    pub fn hold(&self, req: &dyn Request) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m == req.method()))
            && self
                .headers
                .iter()
                .all(|(n, v)| req.header(n) == Some(v.as_bytes()))
            && self
                .query
                .iter()
                .all(|(n, v)| query_arg(req.query(), n) == Some(v.as_str()))
    }
}

/// The first value of query parameter `name`, as sent ("" for `?name`).
pub(crate) fn query_arg<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then_some(v)
    })
}

/// A compiled `path_regex`. Built on `regex-automata`'s meta regex (the engine of the `regex`
/// crate) rather than `regex` itself: its `search_slots` takes caller-provided slots, so a
/// match with captures costs no allocation (the `regex` crate allocates a `Captures` per
/// search).
#[derive(Debug, Clone)]
pub struct PathRegex {
    re: regex_automata::meta::Regex,
}

/// Capture slots on the stack: room for 16 groups, the whole match included.
pub type Slots = [Option<regex_automata::util::primitives::NonMaxUsize>; MAX_SLOTS];

/// Two slots (start, end) per group.
pub const MAX_SLOTS: usize = 32;

impl PathRegex {
    /// Compiles `pattern` with the `regex` crate's syntax, matching bytes (as
    /// `regex::bytes` does: a path need not be UTF-8).
    pub fn new(pattern: &str) -> Result<PathRegex, String> {
        let re = regex_automata::meta::Builder::new()
            .configure(regex_automata::meta::Config::new().utf8_empty(false))
            .syntax(regex_automata::util::syntax::Config::new().utf8(false))
            .build(pattern)
            .map_err(|e| match e.syntax_error() {
                Some(s) => s.to_string().lines().last().unwrap_or("").trim().to_owned(),
                None => e.to_string(),
            })?;
        if re.group_info().slot_len() > MAX_SLOTS {
            return Err(format!("more than {} capture groups", MAX_SLOTS / 2 - 1));
        }
        Ok(PathRegex { re })
    }

    /// The path matches.
    pub fn is_match(&self, path: &[u8]) -> bool {
        self.re.is_match(path)
    }

    /// Matches `path`, filling `slots` with the groups' positions.
    pub fn captures(&self, path: &[u8], slots: &mut Slots) -> bool {
        let n = self.re.group_info().slot_len();
        self.re
            .search_slots(&regex_automata::Input::new(path), &mut slots[..n])
            .is_some()
    }

    /// The number of groups, the whole match (group 0) included.
    pub fn groups(&self) -> usize {
        self.re
            .group_info()
            .group_len(regex_automata::PatternID::ZERO)
    }

    /// The index of the group named `name`.
    pub fn group_index(&self, name: &str) -> Option<usize> {
        self.re
            .group_info()
            .to_index(regex_automata::PatternID::ZERO, name)
    }
}

/// The groups of a matched path.
#[derive(Clone, Copy)]
pub struct Captures<'a> {
    /// The path matched.
    pub path: &'a [u8],
    /// Its slots (see [`PathRegex::captures`]).
    pub slots: &'a Slots,
}

impl<'a> Captures<'a> {
    /// Group `i`'s text, if it took part in the match.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let (s, e) = (self.slots.get(2 * i)?, self.slots.get(2 * i + 1)?);
        Some(&self.path[s.as_ref()?.get()..e.as_ref()?.get()])
    }
}

/// `request_headers` or `response_headers`: fields set (replacing any the message has),
/// added, and removed.
#[derive(Debug, Clone, Default)]
pub struct HeaderRules {
    /// Lowercase names whose fields go: every `remove` name and every `set` name.
    drop: Vec<String>,
    /// The `set` then the `add` fields, as (name, value template).
    fields: Vec<(String, Template)>,
    /// The fields rendered once at load when no value has a variable ("Name: value\r\n").
    fixed: Option<Vec<u8>>,
    /// For `veloxy check --print`: the sets, adds and removes as written.
    pub(crate) set: Vec<(String, String)>,
    pub(crate) add: Vec<(String, String)>,
    pub(crate) remove: Vec<String>,
}

impl HeaderRules {
    /// Compiles the rules. Names are checked as HTTP field names; values as templates.
    pub fn new(
        set: Vec<(String, Template)>,
        add: Vec<(String, Template)>,
        remove: Vec<String>,
    ) -> HeaderRules {
        let mut drop: Vec<String> = remove.iter().map(|n| n.to_ascii_lowercase()).collect();
        drop.extend(set.iter().map(|(n, _)| n.to_ascii_lowercase()));
        drop.sort();
        drop.dedup();
        let shown = |v: &[(String, Template)]| -> Vec<(String, String)> {
            v.iter().map(|(n, t)| (n.clone(), t.to_string())).collect()
        };
        let (set_shown, add_shown) = (shown(&set), shown(&add));
        let fields: Vec<(String, Template)> = set.into_iter().chain(add).collect();
        let fixed = fields.iter().all(|(_, t)| t.is_literal()).then(|| {
            let mut out = Vec::new();
            for (name, t) in &fields {
                push_field(&mut out, name, t.literal().unwrap_or(""));
            }
            out
        });
        HeaderRules {
            drop,
            fields,
            fixed,
            set: set_shown,
            add: add_shown,
            remove,
        }
    }

    /// The message's own `name` fields are dropped (removed, or replaced by a set).
    pub fn drops(&self, name: &str) -> bool {
        self.drops_bytes(name.as_bytes())
    }

    /// [`drops`](Self::drops) for a name as bytes (a raw HTTP/1 head).
    pub fn drops_bytes(&self, name: &[u8]) -> bool {
        self.drop
            .iter()
            .any(|d| d.len() == name.len() && d.as_bytes().eq_ignore_ascii_case(name))
    }

    /// The lowercase names dropped.
    pub fn dropped(&self) -> &[String] {
        &self.drop
    }

    /// Appends the set and added fields as "Name: value\r\n" lines. A value that renders
    /// empty is left out (as nginx does), so `{header.X}` of an absent field sends nothing.
    pub(crate) fn render(&self, vars: &dyn Vars, out: &mut Vec<u8>) {
        if let Some(fixed) = &self.fixed {
            out.extend_from_slice(fixed);
            return;
        }
        // Rendered straight into `out` (which holds only UTF-8: names are ASCII, values come
        // from strings), not through a value buffer.
        let mut text = match String::from_utf8(std::mem::take(out)) {
            Ok(t) => t,
            Err(e) => {
                *out = e.into_bytes();
                return;
            }
        };
        for (name, t) in &self.fields {
            let start = text.len();
            text.push_str(name);
            text.push_str(": ");
            let value = text.len();
            match t.literal() {
                Some(l) => text.push_str(l),
                None => t.render_into(vars, &mut text),
            }
            // Trimmed; a value that renders empty is left out.
            let end = value + text[value..].trim_end().len();
            text.truncate(end);
            let lead = text[value..].len() - text[value..].trim_start().len();
            if lead > 0 {
                text.replace_range(value..value + lead, "");
            }
            if text.len() == value {
                text.truncate(start);
            } else {
                text.push_str("\r\n");
            }
        }
        *out = text.into_bytes();
    }

    /// The rendered lines when no value has a variable (the same for every request).
    pub(crate) fn fixed(&self) -> Option<&[u8]> {
        self.fixed.as_deref()
    }
}

fn push_field(out: &mut Vec<u8>, name: &str, value: &str) {
    let value = value.trim();
    if value.is_empty() {
        return;
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Which statuses an error page answers: one (`"502"`) or a class (`"5xx"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSpec {
    /// One status.
    Exact(u16),
    /// Every status of a class: 4 for `4xx`, 5 for `5xx`.
    Class(u16),
}

impl StatusSpec {
    /// Parses `"404"`, `"4xx"` or `"5xx"` (error statuses only).
    pub fn parse(s: &str) -> Option<StatusSpec> {
        match s.to_ascii_lowercase().as_str() {
            "4xx" => Some(StatusSpec::Class(4)),
            "5xx" => Some(StatusSpec::Class(5)),
            n => n
                .parse::<u16>()
                .ok()
                .filter(|n| (400..=599).contains(n))
                .map(StatusSpec::Exact),
        }
    }
}

impl std::fmt::Display for StatusSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusSpec::Exact(n) => write!(f, "{n}"),
            StatusSpec::Class(c) => write!(f, "{c}xx"),
        }
    }
}

/// One `error_pages` entry: the file's content, read at load.
#[derive(Debug, Clone)]
pub struct ErrorPage {
    /// The statuses it answers.
    pub status: StatusSpec,
    /// The file, made absolute (for `veloxy check --print`).
    pub file: String,
    /// Its content.
    pub body: Bytes,
    /// Its Content-Type, from the file's extension.
    pub content_type: &'static str,
}

/// Everything a route does beyond choosing what answers it.
#[derive(Debug, Clone, Default)]
pub struct RouteRules {
    /// `request_headers`: applied to the request sent upstream.
    pub request: Option<HeaderRules>,
    /// `response_headers`: applied to every answer on the route.
    pub response: Option<HeaderRules>,
    /// `error_pages`: exact statuses first, then classes.
    pub error_pages: Vec<ErrorPage>,
    /// `max_body_bytes`: the largest request body accepted.
    pub max_body: Option<u64>,
    /// `location_rewrite`: a `Location`/`Refresh` pointing at a backend points at the client's
    /// scheme and host instead.
    pub location_rewrite: bool,
    /// `allow` / `deny`: who may use the route (403 for the others).
    pub access: Option<crate::access::IpRules>,
    /// `basic_auth`: who may use the route (401 for the others).
    pub basic_auth: Option<std::sync::Arc<crate::auth::BasicAuth>>,
    /// `cors`.
    pub cors: Option<crate::cors::Cors>,
    /// `forward_auth`.
    pub forward_auth: Option<ForwardAuth>,
    /// `mirror`: copies of the request sent to shadow groups ([`Mirror`]).
    pub mirror: Option<std::sync::Arc<[Mirror]>>,
    /// `cache`: responses stored and answered from a `[caches.NAME]` store.
    pub cache: Option<std::sync::Arc<crate::cache::lookup::RouteCache>>,
    /// `search`: the search gateway's guards and bulk routing.
    pub(crate) search: Option<std::sync::Arc<crate::search::SearchRoute>>,
    /// `fastcgi`: requests go to a FastCGI group with these CGI parameters.
    pub(crate) fastcgi: Option<std::sync::Arc<crate::fastcgi::FastcgiRoute>>,
    /// `grpc_web`: gRPC-Web requests are translated to gRPC and back.
    pub grpc_web: Option<GrpcWeb>,
    /// `early_hints`: a GET gets a `103 Early Hints` with the Link fields the path's last
    /// 200 answer had ([`crate::hints`]).
    pub early_hints: bool,
    /// `tracing`: the route's own sampling (`None`: the server's).
    pub tracing: Option<RouteTracing>,
}

/// A route's `tracing` key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouteTracing {
    /// `tracing = false`: no spans, no trace context sent upstream.
    Off,
    /// `tracing = { sample_ratio = R }`.
    Ratio(f64),
}

/// A route's `grpc_web`, compiled. The translation is the exchange's (`exchange::grpc_web`);
/// the CORS answers for browsers are the route's [`RouteRules::cors`], which `grpc_web` fills
/// when the route has no `cors` of its own.
#[derive(Debug, Clone, Default)]
pub struct GrpcWeb {
    /// `cors_origins` as written, lowercase (`None`: `grpc_web = true`: any origin).
    pub cors_origins: Option<Vec<String>>,
    /// The route's `cors` is the one `grpc_web` made (printed as `grpc_web`, not `cors`).
    pub made_cors: bool,
}

/// A route's `forward_auth`, compiled.
#[derive(Debug, Clone)]
pub struct ForwardAuth {
    /// The auth service's upstream group (index).
    pub upstream: usize,
    /// The `Host` of the subrequest: the group's first backend.
    pub host: String,
    /// The path asked.
    pub path: String,
    /// Fields of a passing answer copied onto the request.
    pub copy_headers: std::sync::Arc<[String]>,
    /// The longest wait for the answer.
    pub timeout: std::time::Duration,
    /// The client's fields sent to the auth service (`None`: all but hop-by-hop ones).
    pub send_headers: Option<std::sync::Arc<[FieldPattern]>>,
    /// The client's fields removed before anything (neither asked about nor forwarded).
    pub remove_headers: std::sync::Arc<[FieldPattern]>,
    /// The client's X-Forwarded-* go to the auth service (its For chain extended).
    pub trust_forward_header: bool,
}

/// One table of a route's `mirror`, compiled.
#[derive(Debug, Clone)]
pub struct Mirror {
    /// The shadow group (index).
    pub upstream: usize,
    /// The share of requests copied, 0 to 100.
    pub percent: f64,
    /// The request body is copied too.
    pub body: bool,
    /// The copy's Host field (`None`: the client's).
    pub host: Option<String>,
}

/// A field name, or a prefix of names (`X-Auth-*`), compared without case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldPattern {
    Name(String),
    Prefix(String),
}

impl FieldPattern {
    /// `X-Auth-*` is a prefix, anything else a name.
    pub fn new(text: &str) -> FieldPattern {
        match text.strip_suffix('*') {
            Some(p) => FieldPattern::Prefix(p.to_owned()),
            None => FieldPattern::Name(text.to_owned()),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            FieldPattern::Name(n) => n.eq_ignore_ascii_case(name),
            FieldPattern::Prefix(p) => {
                name.len() >= p.len()
                    && name.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
            }
        }
    }

    /// As written in the config.
    pub fn text(&self) -> String {
        match self {
            FieldPattern::Name(n) => n.clone(),
            FieldPattern::Prefix(p) => format!("{p}*"),
        }
    }
}

impl RouteRules {
    /// The error page for `status`, if one is configured: an exact status beats a class.
    pub fn error_page(&self, status: u16) -> Option<&ErrorPage> {
        let exact = self
            .error_pages
            .iter()
            .find(|p| p.status == StatusSpec::Exact(status));
        exact.or_else(|| {
            self.error_pages
                .iter()
                .find(|p| p.status == StatusSpec::Class(status / 100))
        })
    }

    /// True when no rule is set (such a route carries no rules at all).
    pub fn is_empty(&self) -> bool {
        self.request.is_none()
            && self.response.is_none()
            && self.error_pages.is_empty()
            && self.max_body.is_none()
            && !self.location_rewrite
            && self.access.is_none()
            && self.basic_auth.is_none()
            && self.cors.is_none()
            && self.forward_auth.is_none()
            && self.mirror.is_none()
            && self.cache.is_none()
            && self.fastcgi.is_none()
            && self.grpc_web.is_none()
            && !self.early_hints
    }
}

/// The Content-Type of an error page file, from its extension.
pub(crate) fn page_type(file: &str) -> &'static str {
    match file
        .rsplit('.')
        .next()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("xml") => "application/xml",
        _ => "text/plain; charset=utf-8",
    }
}

/// Parses a size: an integer in bytes (`1048576`), or with a unit, KiB/MiB/GiB (powers of
/// 1024) or KB/MB/GB (powers of 1000), as `"10MiB"` or `"1.5 GB"`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = (&s[..split], s[split..].trim());
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => {
            return Err(format!(
                "invalid size {s:?}: use bytes, or a number with KiB, MiB, GiB, KB, MB or GB"
            ))
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected a number, like \"10MiB\""))?;
    let bytes = n * mult as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < 2f64.powi(62)) {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("2 KB"), Ok(2000));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert!(parse_size("10 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn error_page_precedence() {
        let page = |s: &str| ErrorPage {
            status: StatusSpec::parse(s).unwrap(),
            file: s.into(),
            body: Bytes::from(s.to_owned()),
            content_type: "text/plain",
        };
        let r = RouteRules {
            error_pages: vec![page("5xx"), page("502")],
            ..Default::default()
        };
        assert_eq!(r.error_page(502).unwrap().file, "502");
        assert_eq!(r.error_page(503).unwrap().file, "5xx");
        assert!(r.error_page(404).is_none());
        assert!(StatusSpec::parse("302").is_none());
        assert!(StatusSpec::parse("6xx").is_none());
    }

    #[test]
    fn set_replaces_and_fixed_values_render_once() {
        let t = |s: &str| Template::parse(s).unwrap();
        let rules = HeaderRules::new(
            vec![("Strict-Transport-Security".into(), t("max-age=1"))],
            vec![("X-A".into(), t("1"))],
            vec!["Server".into()],
        );
        assert!(rules.drops("server") && rules.drops("strict-transport-security"));
        assert!(!rules.drops("x-a"));
        struct NoVars;
        impl Vars for NoVars {
            fn value(&self, _: &crate::template::Var, _: &mut String) {}
        }
        let mut out = Vec::new();
        rules.render(&NoVars, &mut out);
        assert_eq!(out, b"Strict-Transport-Security: max-age=1\r\nX-A: 1\r\n");
    }
}
