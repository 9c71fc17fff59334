//! Invalidation after an unsafe request (RFC 9111 section 4.4): a non-error response (2xx,
//! 3xx) to a request whose method is not known to be safe (POST, PUT, DELETE, PATCH, ...) on
//! a caching route removes what the route's store holds for the request's URI, and for the
//! URIs of the response's `Location` and `Content-Location` when they have the request's
//! origin (scheme and authority): every variant, in memory and on disk.
//!
//! Admission prepares it ([`pending`]): the route's key rendered for a GET with the request
//! target's parts left as markers, so that the key of another path of the same origin is a
//! substitution once the response names it. The codec calls [`Pending::done`] where the
//! upstream's response head is known (one call per client protocol and upstream protocol).

use std::sync::Arc;

use super::lookup::RouteCache;
use super::Purge;
use crate::template::{Var, Vars};

const URI: &str = "\u{2}uri\u{2}";
const PATH: &str = "\u{2}path\u{2}";
const QUERY: &str = "\u{2}query\u{2}";
const IS_ARGS: &str = "\u{2}is_args\u{2}";

/// An unsafe request's invalidation, waiting for its response.
pub(crate) struct Pending {
    rc: Arc<RouteCache>,
    /// The route's key for a GET, the target's parts as markers.
    key: String,
    /// The request's target (path and query).
    target: String,
    scheme: String,
    authority: String,
}

/// Methods a cache need not invalidate for (RFC 9110 section 9.2.1, and QUERY, safe by its
/// specification: its answers never replace the GET's); PURGE has its own answer.
fn is_safe(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "QUERY" | "PURGE"
    )
}

/// The request's variables, for a GET of another target of the same origin.
struct Marked<'a>(&'a dyn Vars);

impl Vars for Marked<'_> {
    fn value(&self, var: &Var, out: &mut String) {
        match var {
            Var::Method => out.push_str("GET"),
            Var::Uri => out.push_str(URI),
            Var::Path => out.push_str(PATH),
            Var::Query => out.push_str(QUERY),
            Var::IsArgs => out.push_str(IS_ARGS),
            v => self.0.value(v, out),
        }
    }
}

/// What an unsafe request on a caching route will invalidate (`None`: a safe method).
pub(crate) fn pending(
    rc: &Arc<RouteCache>,
    method: &str,
    target: &str,
    vars: &dyn Vars,
) -> Option<Box<Pending>> {
    if is_safe(method) {
        return None;
    }
    let mut scheme = String::new();
    vars.value(&Var::Scheme, &mut scheme);
    let mut authority = String::new();
    vars.value(&Var::Authority, &mut authority);
    Some(Box::new(Pending {
        rc: rc.clone(),
        key: rc.key.render(&Marked(vars)),
        target: target.to_owned(),
        scheme,
        authority,
    }))
}

impl Pending {
    /// The upstream answered `status`, with these `Location` and `Content-Location` values.
    pub(crate) fn done(&self, status: u16, location: Option<&[u8]>, content: Option<&[u8]>) {
        if !(200..400).contains(&status) {
            return;
        }
        let store = self.rc.store();
        let mut targets = vec![self.target.clone()];
        for v in [location, content].into_iter().flatten() {
            if let Some(t) = self.same_origin(v) {
                if !targets.contains(&t) {
                    targets.push(t);
                }
            }
        }
        for t in &targets {
            store.purge(&Purge::Key(self.key_for(t)));
        }
    }

    /// The route's key of a GET for `target` (path and query).
    fn key_for(&self, target: &str) -> String {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let is_args = if query.is_empty() { "" } else { "?" };
        self.key
            .replace(URI, target)
            .replace(PATH, path)
            .replace(QUERY, query)
            .replace(IS_ARGS, is_args)
    }

    /// The target of a `Location` / `Content-Location` value when it names the request's
    /// origin: an absolute URI with the same scheme and authority, or a reference resolved
    /// against the request's target.
    fn same_origin(&self, value: &[u8]) -> Option<String> {
        let v = std::str::from_utf8(value).ok()?.trim();
        let v = v.split_once('#').map_or(v, |(v, _)| v);
        let scheme_end = v.find("://").filter(|&i| {
            i > 0
                && v[..i]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        });
        let rest = match scheme_end {
            Some(i) if v[..i].eq_ignore_ascii_case(&self.scheme) => &v[i + 3..],
            Some(_) => return None,
            None => match v.strip_prefix("//") {
                Some(rest) => rest,
                None => return Some(self.resolve(v)),
            },
        };
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        if !rest[..end].eq_ignore_ascii_case(&self.authority) {
            return None;
        }
        let target = &rest[end..];
        Some(if target.starts_with('/') {
            target.to_owned()
        } else {
            format!("/{target}")
        })
    }

    /// A relative reference against the request's target (RFC 3986 section 5.2, without
    /// dot-segment removal: a cache key is the target as sent).
    fn resolve(&self, r: &str) -> String {
        if r.starts_with('/') {
            return r.to_owned();
        }
        let path = self.target.split('?').next().unwrap_or("");
        if r.is_empty() {
            return self.target.clone();
        }
        if r.starts_with('?') {
            return format!("{path}{r}");
        }
        let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
        format!("{dir}{r}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(target: &str) -> Pending {
        Pending {
            rc: Arc::new(RouteCache::new(
                ("main".into(), crate::late::Late::default(), 1 << 20),
                super::super::lookup::RouteCacheSettings {
                    key: crate::template::Template::parse("k").unwrap(),
                    get: true,
                    head: true,
                    query: false,
                    policy: super::super::policy::Settings {
                        default_ttl: std::time::Duration::ZERO,
                        stale_while_revalidate: std::time::Duration::ZERO,
                        stale_if_error: std::time::Duration::ZERO,
                        ignore_cache_control: false,
                    },
                    status_header: None,
                    purge: None,
                    compress: false,
                    targeted: Arc::from([]),
                },
            )),
            key: format!("GEThttp://a.test{URI}|{PATH}{IS_ARGS}{QUERY}"),
            target: target.to_owned(),
            scheme: "http".into(),
            authority: "a.test".into(),
        }
    }

    #[test]
    fn cache_invalidate_locations_of_the_same_origin_only() {
        let p = p("/dir/post?x=1");
        let same = |v: &str| p.same_origin(v.as_bytes());
        assert_eq!(same("http://A.test/x?y").as_deref(), Some("/x?y"));
        assert_eq!(same("//a.test/x").as_deref(), Some("/x"));
        assert_eq!(same("http://a.test").as_deref(), Some("/"));
        assert_eq!(same("/abs#frag").as_deref(), Some("/abs"));
        assert_eq!(same("rel").as_deref(), Some("/dir/rel"));
        assert_eq!(same("?q").as_deref(), Some("/dir/post?q"));
        assert_eq!(same("https://a.test/x"), None, "another scheme");
        assert_eq!(same("http://b.test/x"), None, "another host");
        assert_eq!(same("http://a.test:81/x"), None, "another port");
        assert_eq!(
            p.key_for("/x?y=2"),
            "GEThttp://a.test/x?y=2|/x?y=2",
            "every part substituted"
        );
        assert_eq!(p.key_for("/x"), "GEThttp://a.test/x|/x");
    }
}
