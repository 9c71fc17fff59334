//! `cors`: Cross-Origin Resource Sharing for a route. veloxy answers preflights itself and
//! adds the response fields for allowed origins only (listed, or matched by a wildcard host:
//! `https://*.example.com`); other origins get no CORS fields (the browser then refuses the
//! response to the page).

/// A route's `cors`, compiled.
#[derive(Debug, Clone)]
pub struct Cors {
    /// Allowed origins, lowercase (`*`: any, only without credentials).
    pub origins: Vec<String>,
    /// `Access-Control-Allow-Methods`, joined.
    pub methods: String,
    /// `Access-Control-Allow-Headers`, joined ("": none configured).
    pub headers: String,
    /// `Access-Control-Expose-Headers`, joined ("": none).
    pub expose_headers: String,
    /// `Access-Control-Allow-Credentials: true`.
    pub credentials: bool,
    /// `Access-Control-Max-Age` in seconds.
    pub max_age: u64,
    /// `*` answers with the request's own Origin rather than `*` (the CORS `grpc_web` makes:
    /// gRPC-Web libraries expect their Origin back).
    pub echo_origin: bool,
}

impl Cors {
    /// Whether answers depend on the request's Origin: they do unless every origin gets the
    /// same `*`. Then every answer of the route carries `Vary: Origin` (with an Origin or
    /// without, allowed or not), so a cache in front cannot serve one origin's answer to
    /// another.
    pub fn varies(&self) -> bool {
        self.credentials || self.echo_origin || !self.origins.iter().any(|o| o == "*")
    }

    /// The value for `Access-Control-Allow-Origin` when `origin` is allowed.
    fn allow_origin<'a>(&self, origin: &'a str) -> Option<&'a str> {
        if self.origins.iter().any(|o| o == "*") {
            return Some(if self.credentials || self.echo_origin {
                origin
            } else {
                "*"
            });
        }
        self.origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin) || (o.contains('*') && wild_match(o, origin)))
            .then_some(origin)
    }

    /// The preflight answer's fields for `origin` (none when it is not allowed).
    pub fn preflight(&self, origin: &str) -> Vec<(&'static str, String)> {
        let Some(allowed) = self.allow_origin(origin) else {
            return if self.varies() {
                vec![("vary", "Origin".to_owned())]
            } else {
                Vec::new()
            };
        };
        let mut f = vec![
            ("access-control-allow-origin", allowed.to_owned()),
            ("access-control-allow-methods", self.methods.clone()),
            ("access-control-max-age", self.max_age.to_string()),
        ];
        if self.varies() {
            f.push(("vary", "Origin".to_owned()));
        }
        if !self.headers.is_empty() {
            f.push(("access-control-allow-headers", self.headers.clone()));
        }
        if self.credentials {
            f.push(("access-control-allow-credentials", "true".to_owned()));
        }
        f
    }

    /// Appends the fields of an actual response to a request from `origin` (`None`: it sent
    /// no Origin) as "Name: value\r\n" lines.
    pub fn response_lines(&self, origin: Option<&str>, out: &mut Vec<u8>) {
        let mut line = |n: &str, v: &str| {
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        };
        if self.varies() {
            line("Vary", "Origin");
        }
        let Some(allowed) = origin.and_then(|o| self.allow_origin(o)) else {
            return;
        };
        line("Access-Control-Allow-Origin", allowed);
        if self.credentials {
            line("Access-Control-Allow-Credentials", "true");
        }
        if !self.expose_headers.is_empty() {
            line("Access-Control-Expose-Headers", &self.expose_headers);
        }
    }
}

/// `scheme://host[:port]` as (scheme, host, ":port" or "").
fn parts(origin: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = origin.split_once("://")?;
    match rest.rfind(':') {
        // Not inside an IPv6 literal's brackets.
        Some(i) if !rest[i..].contains(']') => Some((scheme, &rest[..i], &rest[i..])),
        _ => Some((scheme, rest, "")),
    }
}

/// Whether `origin` is allowed by a `pattern` with a wildcard host: `scheme://*.suffix` (one
/// label or more before `.suffix`) or `scheme://*` (any host), with the same scheme and
/// port (ASCII case aside).
pub fn wild_match(pattern: &str, origin: &str) -> bool {
    let (Some((ps, ph, pp)), Some((os, oh, op))) = (parts(pattern), parts(origin)) else {
        return false;
    };
    let label = |h: &str| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    };
    if !ps.eq_ignore_ascii_case(os) || pp != op || !label(oh) {
        return false;
    }
    if ph == "*" {
        return true;
    }
    let Some(suffix) = ph.strip_prefix("*.") else {
        return false;
    };
    oh.len() > suffix.len() + 1
        && oh.as_bytes()[oh.len() - suffix.len() - 1] == b'.'
        && oh[oh.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

/// Why `origin` is not an origin pattern veloxy takes (`None`: it is): `*`, or
/// `http(s)://host[:port]` whose host may be `*` or start with a `*.` label.
pub fn origin_error(origin: &str) -> Option<String> {
    if origin == "*" {
        return None;
    }
    let bad = || {
        Some(format!(
            "{origin:?} is not an origin like \"https://app.example.com\""
        ))
    };
    let Some((scheme, host, port)) = parts(origin) else {
        return bad();
    };
    let port_ok = port.is_empty() || port[1..].parse::<u16>().is_ok_and(|p| p > 0);
    if !matches!(scheme, "http" | "https") || host.is_empty() || !port_ok {
        return bad();
    }
    let rest = host.strip_prefix("*.").unwrap_or(host);
    if host != "*" && rest.contains('*') {
        return Some(format!(
            "{origin:?}: a wildcard is a whole first label (\"https://*.example.com\") or the \
             whole host"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: &[&str], credentials: bool) -> Cors {
        Cors {
            origins: origins.iter().map(|o| o.to_string()).collect(),
            methods: "GET, POST".into(),
            headers: "Content-Type".into(),
            expose_headers: String::new(),
            credentials,
            max_age: 3600,
            echo_origin: false,
        }
    }

    #[test]
    fn wildcard_hosts() {
        let w = "https://*.example.com";
        assert!(wild_match(w, "https://a.example.com"));
        assert!(
            wild_match(w, "https://a.b.EXAMPLE.com"),
            "any number of labels"
        );
        assert!(!wild_match(w, "https://example.com"));
        assert!(!wild_match(w, "http://a.example.com"), "the scheme");
        assert!(!wild_match(w, "https://a.example.com:8443"), "the port");
        assert!(!wild_match(w, "https://aexample.com"));
        assert!(!wild_match(w, "https://x/.example.com"));
        assert!(wild_match(
            "https://*.example.com:8443",
            "https://a.example.com:8443"
        ));
        assert!(wild_match("http://*", "http://any.host"));
        assert!(!wild_match("http://*", "https://any.host"));
        let mut c = cors(&[w], true);
        c.methods = "GET".into();
        assert!(c.preflight("https://app.example.com").contains(&(
            "access-control-allow-origin",
            "https://app.example.com".into()
        )));
        assert_eq!(origin_error("https://*.example.com:8443"), None);
        assert!(origin_error("https://a.*.example.com").is_some());
        assert!(origin_error("ftp://a.example.com").is_some());
        assert!(origin_error("https://a.example.com:0").is_some());
        assert_eq!(origin_error("http://[::1]"), None);
        assert_eq!(origin_error("http://[::1]:8080"), None);
    }

    #[test]
    fn origins() {
        let c = cors(&["https://app.example.com"], true);
        // A refused origin's preflight carries no CORS field but Vary.
        assert!(c
            .preflight("https://evil.example")
            .iter()
            .all(|(n, _)| *n == "vary"));
        let f = c.preflight("https://app.example.com");
        assert!(f.contains(&(
            "access-control-allow-origin",
            "https://app.example.com".into()
        )));
        assert!(f.contains(&("access-control-allow-credentials", "true".into())));
        let any = cors(&["*"], false);
        let mut out = Vec::new();
        any.response_lines(Some("https://x.test"), &mut out);
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("Access-Control-Allow-Origin: *\r\n"));
        // A listed origin varies: every answer says so, allowed or not, with an Origin or
        // without.
        for origin in [
            None,
            Some("https://evil.example"),
            Some("https://app.example.com"),
        ] {
            let mut out = Vec::new();
            c.response_lines(origin, &mut out);
            assert!(
                String::from_utf8(out)
                    .unwrap()
                    .starts_with("Vary: Origin\r\n"),
                "{origin:?}"
            );
        }
        assert_eq!(
            c.preflight("https://evil.example"),
            [("vary", "Origin".to_owned())]
        );
        assert!(!any.varies());
    }
}
