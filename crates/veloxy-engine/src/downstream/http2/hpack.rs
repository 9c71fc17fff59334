//! Which response header values HPACK may add to a connection's dynamic table.
//!
//! The `h2` crate's encoder indexes every header value it has not seen, except a few it
//! knows to vary (Content-Length, ETag, Set-Cookie...). A value that changes on every
//! response (`X-Request-Id`, a trace ID, `X-Runtime`) then fills the 4 KiB table with entries
//! never used again, and each new one is compared against every entry of the same name
//! first: with one such header, HPACK was about 5% of veloxy's CPU per HTTP/2 request
//! (`perf`, h2load at 160 streams). nginx and HAProxy never index response headers at all.
//!
//! veloxy keeps the dynamic table for the names whose values repeat across responses
//! (content types, cache and security policies, CORS, `server`) and sends every other
//! value as a literal the table never stores ("never indexed", RFC 7541 section 6.2.3, the
//! `h2` crate's sensitive flag). Names are still compressed through the static table.

use http::header::{HeaderMap, HeaderName};

/// Marks the values of `headers` that HPACK should send as never-indexed literals: every
/// name not known to repeat.
pub(crate) fn mark_volatile(headers: &mut HeaderMap) {
    for (name, value) in headers.iter_mut() {
        if !repeats(name) {
            value.set_sensitive(true);
        }
    }
}

/// Names whose values tend to be the same on every response of a site: indexing them turns
/// their later copies into one byte each. (A `match` on the string: rustc compares lengths
/// first, so an unknown name costs a few integer compares.)
fn repeats(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "accept-ranges"
            | "access-control-allow-credentials"
            | "access-control-allow-headers"
            | "access-control-allow-methods"
            | "access-control-allow-origin"
            | "access-control-expose-headers"
            | "access-control-max-age"
            | "alt-svc"
            | "cache-control"
            | "content-encoding"
            | "content-language"
            | "content-security-policy"
            | "content-type"
            | "cross-origin-embedder-policy"
            | "cross-origin-opener-policy"
            | "cross-origin-resource-policy"
            | "date"
            | "expires"
            | "last-modified"
            | "permissions-policy"
            | "referrer-policy"
            | "server"
            | "strict-transport-security"
            | "vary"
            | "via"
            | "x-cache"
            | "x-content-type-options"
            | "x-frame-options"
            | "x-powered-by"
            | "x-xss-protection"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn only_names_known_to_repeat_may_be_indexed() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/json"),
            ("server", "nginx"),
            ("x-frame-options", "DENY"),
            ("x-request-id", "4b1f0c2e"),
            ("x-conn-seq", "3527"),
            ("content-length", "100"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        mark_volatile(&mut headers);
        let sensitive: Vec<&str> = headers
            .iter()
            .filter(|(_, v)| v.is_sensitive())
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(sensitive, ["x-request-id", "x-conn-seq", "content-length"]);
    }
}
