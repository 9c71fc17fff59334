//! The router: picks a route from the request's host, path and conditions.
//!
//! Precedence, as in nginx: host specificity first (exact beats `*.suffix` beats any host);
//! then an exact path (`path_exact`); then the first matching `path_regex` in file order; then
//! the longest prefix (`path`, a plain byte prefix of the path, like nginx's
//! `location /prefix`). Among routes with the same path, those with more conditions (`methods`,
//! `headers`, `query`) go first, then file order. Paths are matched after normalization
//! ([`routing_path`]), the query excluded.
//!
//! Routes are sorted into that order once, when the table is built
//! ([`Router::finish_after`]), and indexed by host: exact hosts by hash, `*.suffix` hosts by
//! each suffix of the request's host (one hash lookup per label), the host-less routes
//! apart. A lookup scans only the
//! routes of the request's host (then of its suffixes, then the host-less ones) and keeps
//! the first hit in precedence order, so its cost does not grow with the number of hosts.
//! Building the table is O(n log n) in its routes; a reload's build sorts only the exact
//! hosts whose routes changed and takes the others' order from the running router
//! (`order`).

use std::collections::HashMap;

mod hosts;
mod order;

/// How a route matches the `Host` header (port stripped, compared case-insensitively).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Any,
    /// `api.example.com`, stored lowercase.
    Exact(String),
    /// `*.example.com`: any name ending in `.example.com` (stored as `.example.com`).
    Suffix(String),
}

impl HostMatch {
    pub fn parse(s: &str) -> Result<HostMatch, String> {
        let s = s.trim().to_ascii_lowercase();
        if s.is_empty() {
            return Err("host must not be empty".into());
        }
        let bad = |c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
        if let Some(rest) = s.strip_prefix("*.") {
            if rest.is_empty() || rest.contains(bad) || rest.contains('*') {
                return Err(format!("invalid host pattern {s:?}"));
            }
            return Ok(HostMatch::Suffix(format!(".{rest}")));
        }
        if s.contains(bad) {
            return Err(format!("invalid host {s:?}: use a name or *.suffix"));
        }
        Ok(HostMatch::Exact(s))
    }

    /// `host` must already be lowercase and without a port.
    pub(crate) fn matches(&self, host: &[u8]) -> bool {
        match self {
            HostMatch::Any => true,
            HostMatch::Exact(h) => h.as_bytes() == host,
            HostMatch::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_bytes()),
        }
    }
}

/// One compiled `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct Route {
    /// Position in the file, for logs and metrics.
    pub index: usize,
    pub host: HostMatch,
    /// The prefix, the exact path, or the regex's source.
    pub path: String,
    /// `path_exact`: the path must equal `path` (query excluded), not just start with it.
    pub exact: bool,
    /// `path_regex`: the path must match this (`path` holds its source).
    pub regex: Option<crate::rules::PathRegex>,
    /// The route's templates use `{re.*}`: matching yields the captures (one regex run).
    pub captures: bool,
    /// `methods`, `headers`, `query`.
    pub conditions: crate::rules::Conditions,
    /// Header rules, error pages, body cap; `None` when the route sets none.
    pub rules: Option<std::sync::Arc<crate::rules::RouteRules>>,
    /// What answers the route's requests.
    pub target: RouteTarget,
    /// Concurrency and rate limits, if the route sets any.
    pub limits: crate::limits::RouteLimits,
}

/// What answers a route's requests. (Redirects and fixed responses will be further kinds.)
#[derive(Debug, Clone)]
pub enum RouteTarget {
    /// Forwarded to an upstream group.
    Proxy {
        /// Index into [`crate::config::Snapshot::upstreams`].
        upstream: usize,
        /// `compress = true`: compress eligible responses for clients that accept it.
        compress: bool,
        /// `strip_prefix = true` / `rewrite = "..."`: the upstream request's target.
        target: Option<std::sync::Arc<crate::template::PathRule>>,
    },
    /// A file route (`root = ...`): answered from the filesystem (its own `compress` setting).
    Files(std::sync::Arc<crate::static_files::StaticRoute>),
    /// `redirect = { to, status }`: a redirect to the rendered template.
    Redirect {
        /// The `Location`, rendered per request.
        to: crate::template::Template,
        /// 301, 302, 303, 307 or 308.
        status: u16,
    },
    /// `respond = { status, body, content_type }`: a fixed answer.
    Respond {
        /// The status.
        status: u16,
        /// The body.
        body: bytes::Bytes,
        /// Its Content-Type.
        content_type: String,
    },
}

impl Route {
    /// The upstream group of a proxied route.
    pub fn proxied(&self) -> Option<usize> {
        match self.target {
            RouteTarget::Proxy { upstream, .. } => Some(upstream),
            _ => None,
        }
    }
}

/// The routes of one listener, sorted for first-match lookup and indexed by host.
#[derive(Debug, Clone, Default)]
pub struct Router {
    routes: Vec<Route>,
    /// Positions in `routes` by host, in precedence order (built by [`Router::finish_after`]).
    hosts: HostIndex,
    /// Positions in `routes` by [`match_key`]: duplicate checks and the carry-over of live
    /// state over reloads find a route's twin without a scan.
    by_key: HashMap<u64, Vec<u32>>,
    /// Each exact host's routes in precedence order, reused by the next build when the
    /// host's routes did not change (see [`order`]).
    orders: order::HostOrders,
    /// How many of `orders` the last build took from the previous router.
    reused: usize,
}

/// Route positions by host. The tables hash with FxHash: their keys are the config's hosts,
/// fixed at load, so a request's Host can only look up, never grow a bucket (SipHash's
/// defence against chosen collisions buys nothing here and costs a third of a lookup).
#[derive(Debug, Clone, Default)]
struct HostIndex {
    /// `api.example.com` routes.
    exact: hosts::HostTable,
    /// `*.example.com` routes, keyed by `.example.com`.
    suffix: hosts::HostTable,
    /// Routes for any host.
    any: Vec<Slot>,
}

/// Path bytes a [`Slot`] holds itself: prefixes and exact paths up to this long are decided
/// without touching the route.
const SLOT_PATH: usize = 22;

/// One route's place in a host's list, with what the scan needs to pass it by: a host's
/// routes are scanned as one array of 32-byte slots, not as scattered routes (at 100,000
/// routes, reading each route's struct and path text was most of the table's cost).
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The route's position in [`Router::routes`] (precedence order).
    at: u32,
    /// [`Slot::EXACT`], [`Slot::REGEX`] or [`Slot::PREFIX`].
    kind: u8,
    /// The route has conditions (`methods`, `headers`, `query`), asked of the route.
    conds: bool,
    /// The path's length (prefix or exact path; unused for a regex).
    len: u32,
    /// The path's first bytes (all of it up to [`SLOT_PATH`]).
    head: [u8; SLOT_PATH],
}

impl Slot {
    const EXACT: u8 = 0;
    const REGEX: u8 = 1;
    const PREFIX: u8 = 2;

    fn new(at: u32, r: &Route) -> Slot {
        let kind = match (r.exact, r.regex.is_some()) {
            (true, _) => Slot::EXACT,
            (false, true) => Slot::REGEX,
            (false, false) => Slot::PREFIX,
        };
        let mut head = [0u8; SLOT_PATH];
        let n = r.path.len().min(SLOT_PATH);
        head[..n].copy_from_slice(&r.path.as_bytes()[..n]);
        Slot {
            at,
            kind,
            conds: r.conditions.count() > 0,
            len: u32::try_from(r.path.len()).unwrap_or(u32::MAX),
            head,
        }
    }

    /// Whether `path` matches this exact or prefix route; `full` gives the route's whole path
    /// when it is longer than the slot holds.
    #[inline]
    fn path_matches(&self, path: &[u8], full: impl FnOnce() -> bool) -> bool {
        let len = self.len as usize;
        let fits = if self.kind == Slot::EXACT {
            path.len() == len
        } else {
            path.len() >= len
        };
        let n = len.min(SLOT_PATH);
        fits && path[..n] == self.head[..n] && (len <= SLOT_PATH || full())
    }
}

/// A hash of what [`Route::same_match`] compares but the conditions (checked on a hit).
/// FxHash: the keys are the config's own routes (no defence against chosen collisions
/// needed), and a large table hashes every route twice per build.
fn match_key(r: &Route) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    match &r.host {
        HostMatch::Any => 0u8.hash(&mut h),
        HostMatch::Exact(s) => (1u8, s).hash(&mut h),
        HostMatch::Suffix(s) => (2u8, s).hash(&mut h),
    }
    (&r.path, r.exact, r.regex.is_some()).hash(&mut h);
    h.finish()
}

impl Router {
    pub(crate) fn add(&mut self, r: Route) {
        let at = self.routes.len() as u32;
        self.by_key.entry(match_key(&r)).or_default().push(at);
        self.routes.push(r);
    }

    /// The route that matches exactly what `r` matches (same host, path kind, path and
    /// conditions), if the table has one.
    pub(crate) fn twin(&self, r: &Route) -> Option<&Route> {
        self.by_key
            .get(&match_key(r))?
            .iter()
            .map(|&i| &self.routes[i as usize])
            .find(|x| x.same_match(r))
    }

    pub(crate) fn has(&self, r: &Route) -> bool {
        self.twin(r).is_some()
    }

    /// [`Router::finish_after`] with no previous router: every host sorted.
    #[cfg(test)]
    pub(crate) fn finish(&mut self) {
        self.finish_after(None);
    }

    /// Sorts into precedence order (see the module doc) and builds the host index. Regex
    /// routes keep file order, the routes sharing one pattern grouped at its first
    /// appearance among the routes of their host (or among all `*.suffix` routes, or all
    /// host-less routes). On a reload, each exact host whose routes sort as they did in
    /// `prev` (same kinds, paths and condition counts in file order) takes its order from
    /// `prev` instead of sorting them again (see [`order`]).
    pub(crate) fn finish_after(&mut self, prev: Option<&Router>) {
        let (perm, orders, reused) = self.precedence(prev);
        let mut new_at = vec![0u32; perm.len()];
        for (now, &was) in perm.iter().enumerate() {
            new_at[was as usize] = now as u32;
        }
        for at in self.by_key.values_mut().flatten() {
            *at = new_at[*at as usize];
        }
        let mut routes: Vec<Option<Route>> = std::mem::take(&mut self.routes)
            .into_iter()
            .map(Some)
            .collect();
        // Huge pages: with 100,000 routes the array is tens of MB read at random (see
        // `heap::huge_pages`).
        self.routes = Vec::with_capacity(perm.len());
        crate::heap::huge_pages(&self.routes);
        (self.routes).extend(perm.iter().filter_map(|&i| routes[i as usize].take()));
        self.orders = orders;
        self.reused = reused;
        self.index();
    }

    /// How many exact hosts' orders the last [`Router::finish_after`] took from the previous
    /// router, of how many exact hosts.
    pub fn hosts_reused(&self) -> (usize, usize) {
        (self.reused, self.orders.len())
    }

    /// Rebuilds the host index from the sorted routes, where each exact host's routes lie
    /// together ([`Router::precedence`]).
    fn index(&mut self) {
        let slots: Vec<Slot> = (self.routes.iter().enumerate())
            .map(|(i, r)| Slot::new(i as u32, r))
            .collect();
        let exact = (self.routes.iter())
            .take_while(|r| matches!(r.host, HostMatch::Exact(_)))
            .count();
        let mut runs = Vec::new();
        let mut from = 0;
        for run in self.routes[..exact].chunk_by(|a, b| a.host == b.host) {
            if let HostMatch::Exact(h) = &run[0].host {
                runs.push((h.as_bytes(), &slots[from..from + run.len()]));
            }
            from += run.len();
        }
        let mut suffix: rustc_hash::FxHashMap<&[u8], Vec<Slot>> = Default::default();
        let mut any = Vec::new();
        for (r, slot) in self.routes.iter().zip(&slots).skip(exact) {
            match &r.host {
                HostMatch::Suffix(s) => suffix.entry(s.as_bytes()).or_default().push(*slot),
                _ => any.push(*slot),
            }
        }
        self.hosts = HostIndex {
            exact: hosts::HostTable::build(runs.into_iter()),
            suffix: hosts::HostTable::build(suffix.iter().map(|(k, v)| (*k, v.as_slice()))),
            any,
        };
    }

    /// Exact host `host`'s routing order (tests check what a reload shares).
    #[cfg(test)]
    pub(crate) fn host_order(&self, host: &str) -> Option<&order::HostOrder> {
        self.orders.get(host)
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The routes' and the hosts' bytes: each route's struct, its path and host text, its
    /// places in the host index and the match-key index; each host's index entry.
    pub(crate) fn footprint(&self) -> (crate::heap::Counted, crate::heap::Counted) {
        use crate::heap::Counted;
        use std::mem::size_of;
        let per_route = size_of::<Route>()
            + size_of::<Slot>()
            + size_of::<u32>()
            + size_of::<(u64, Vec<u32>)>();
        let route_bytes: usize = self
            .routes
            .iter()
            .map(|r| {
                let host = match &r.host {
                    HostMatch::Any => 0,
                    HostMatch::Exact(h) | HostMatch::Suffix(h) => h.capacity(),
                };
                per_route + r.path.capacity() + host
            })
            .sum();
        // The tables hold every host's slots too: those are counted per route above.
        let tables = (self.hosts.exact.bytes() + self.hosts.suffix.bytes())
            .saturating_sub(size_of::<Slot>() * (self.routes.len() - self.hosts.any.len()));
        // Each exact host's order: its map entry, name, and shared slice (with its counts).
        let orders: usize = (self.orders.iter())
            .map(|(name, order)| {
                size_of::<(Box<str>, order::HostOrder)>() + 1 + name.len() + 16 + 4 * order.len()
            })
            .sum();
        let host_bytes = tables + orders;
        (
            Counted {
                count: self.routes.len(),
                bytes: route_bytes,
            },
            Counted {
                count: self.hosts.exact.len() + self.hosts.suffix.len(),
                bytes: host_bytes,
            },
        )
    }

    pub(crate) fn routes_mut(&mut self) -> &mut [Route] {
        &mut self.routes
    }

    /// Finds the route for a request. `host` is the raw Host value (any case, maybe with a
    /// port); `path` the normalized path ([`routing_path`]) without the query; `req` what
    /// conditions look at.
    pub fn find(
        &self,
        host: &[u8],
        path: &[u8],
        req: &dyn crate::rules::Request,
        slots: &mut crate::rules::Slots,
    ) -> Option<(&Route, bool)> {
        let mut buf = [0u8; 256];
        let host = normalize_host(host, &mut buf);
        let hosts = &self.hosts;
        if let Some(list) = hosts.exact.get(host) {
            if let Some((at, captured)) = self.first_hit(list, u32::MAX, path, req, slots) {
                return Some((&self.routes[at as usize], captured));
            }
        }
        // `*.suffix` routes of every suffix of the host: the first hit in precedence order
        // among the buckets. Captures go to a scratch copy, kept for the winner only.
        let mut best: Option<(u32, bool)> = None;
        if !hosts.suffix.is_empty() {
            let mut scratch = *slots;
            for (i, _) in host
                .iter()
                .enumerate()
                .filter(|&(i, &b)| b == b'.' && i > 0)
            {
                let Some(list) = hosts.suffix.get(&host[i..]) else {
                    continue;
                };
                let before = best.map_or(u32::MAX, |(at, _)| at);
                if let Some(hit) = self.first_hit(list, before, path, req, &mut scratch) {
                    best = Some(hit);
                    if hit.1 {
                        *slots = scratch;
                    }
                }
            }
        }
        let (at, captured) = match best {
            Some(hit) => hit,
            None => self.first_hit(&hosts.any, u32::MAX, path, req, slots)?,
        };
        Some((&self.routes[at as usize], captured))
    }

    /// The first route of `list` (positions in precedence order, below `before`) that
    /// matches the path and conditions, and whether it captured into `slots`.
    #[inline]
    fn first_hit(
        &self,
        list: &[Slot],
        before: u32,
        path: &[u8],
        req: &dyn crate::rules::Request,
        slots: &mut crate::rules::Slots,
    ) -> Option<(u32, bool)> {
        list.iter().take_while(|s| s.at < before).find_map(|s| {
            let route = || &self.routes[s.at as usize];
            let captured = if s.kind == Slot::REGEX {
                let r = route();
                if s.conds && !r.conditions.hold(req) {
                    return None;
                }
                let re = r.regex.as_ref()?;
                match r.captures {
                    true => re.captures(path, slots).then_some(true)?,
                    false => re.is_match(path).then_some(false)?,
                }
            } else {
                let full = || path.starts_with(route().path.as_bytes());
                if !s.path_matches(path, full) || (s.conds && !route().conditions.hold(req)) {
                    return None;
                }
                false
            };
            Some((s.at, captured))
        })
    }
}

impl Route {
    /// Same host, path kind, path and conditions: two such routes could never both be reached.
    pub(crate) fn same_match(&self, r: &Route) -> bool {
        self.host == r.host
            && self.path == r.path
            && self.exact == r.exact
            && self.regex.is_some() == r.regex.is_some()
            && self.conditions == r.conditions
    }
}

/// The path a request is routed by: its target without the query, normalized.
pub(crate) fn request_path(target: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let path = match memchr::memchr(b'?', target) {
        Some(q) => &target[..q],
        None => target,
    };
    routing_path(path)
}

/// The path as a backend would resolve it: percent-encoded unreserved characters decoded and
/// dot-segments removed, so `/public/../api/x` and `/%61pi/x` match the `/api/` route (and its
/// limits) rather than slipping past them. The request is still forwarded unchanged.
/// Ordinary paths (no `%`, no `/.`) are matched as they are, without a copy.
pub(crate) fn routing_path(path: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if memchr::memchr(b'%', path).is_none() && memchr::memmem::find(path, b"/.").is_none() {
        return std::borrow::Cow::Borrowed(path);
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' && i + 2 < path.len() {
            if let (Some(h), Some(l)) = (hex(path[i + 1]), hex(path[i + 2])) {
                let c = h << 4 | l;
                if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                    decoded.push(c);
                    i += 3;
                    continue;
                }
            }
        }
        decoded.push(path[i]);
        i += 1;
    }
    // RFC 3986 section 5.2.4, on '/'-separated segments.
    let mut out: Vec<&[u8]> = Vec::new();
    let segments: Vec<&[u8]> = decoded.split(|&b| b == b'/').collect();
    let last = segments.len() - 1;
    for (k, seg) in segments.iter().enumerate().skip(1) {
        match *seg {
            b"." => {
                if k == last {
                    out.push(b"");
                }
            }
            b".." => {
                out.pop();
                if k == last {
                    out.push(b"");
                }
            }
            s => out.push(s),
        }
    }
    let mut norm = Vec::with_capacity(decoded.len());
    for seg in out {
        norm.push(b'/');
        norm.extend_from_slice(seg);
    }
    if norm.is_empty() {
        norm.push(b'/');
    }
    std::borrow::Cow::Owned(norm)
}

/// Lowercases and strips the port (and IPv6 brackets stay) into `buf`; over-long hosts match
/// nothing but `Any` routes.
fn normalize_host<'a>(host: &[u8], buf: &'a mut [u8; 256]) -> &'a [u8] {
    let host = crate::http1::host_without_port(host);
    if host.len() > buf.len() {
        return &buf[..0];
    }
    for (d, s) in buf.iter_mut().zip(host) {
        *d = s.to_ascii_lowercase();
    }
    let h = &buf[..host.len()];
    h.strip_suffix(b".").unwrap_or(h)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    /// A GET request without headers or query, for matching in tests.
    pub(crate) struct Get;
    impl crate::rules::Request for Get {
        fn method(&self) -> &str {
            "GET"
        }
        fn header(&self, _: &str) -> Option<&[u8]> {
            None
        }
        fn query(&self) -> &str {
            ""
        }
    }

    fn find<'r>(r: &'r Router, host: &str, target: &str) -> Option<&'r Route> {
        let path = request_path(target.as_bytes()).into_owned();
        let mut slots = [None; crate::rules::MAX_SLOTS];
        r.find(host.as_bytes(), &path, &Get, &mut slots)
            .map(|(r, _)| r)
    }

    fn router(specs: &[(&str, &str, usize)]) -> Router {
        let mut r = Router::default();
        for (i, (host, path, up)) in specs.iter().enumerate() {
            r.add(Route {
                index: i,
                host: if host.is_empty() {
                    HostMatch::Any
                } else {
                    HostMatch::parse(host).unwrap()
                },
                path: path.to_string(),
                exact: false,
                regex: None,
                captures: false,
                conditions: Default::default(),
                rules: None,
                target: RouteTarget::Proxy {
                    upstream: *up,
                    compress: false,
                    target: None,
                },
                limits: Default::default(),
            });
        }
        r.finish();
        r
    }

    #[test]
    fn longest_prefix_and_host_specificity() {
        let r = router(&[
            ("", "/", 0),
            ("", "/api/", 1),
            ("api.example.com", "/", 2),
            ("*.example.com", "/", 3),
            ("", "/api/v2/", 4),
        ]);
        let up = |h: &str, p: &str| find(&r, h, p).and_then(|r| r.proxied());
        assert_eq!(up("other", "/x"), Some(0));
        assert_eq!(up("other", "/api/x?q=/api/v2/"), Some(1));
        assert_eq!(up("other", "/api/v2/y"), Some(4));
        assert_eq!(up("API.Example.com:8080", "/api/"), Some(2));
        assert_eq!(up("www.example.com", "/"), Some(3));
        assert_eq!(up("example.com", "/"), Some(0));
    }

    #[test]
    fn normalized_paths_cannot_dodge_a_route() {
        let r = router(&[("", "/", 0), ("", "/api/", 1)]);
        let up = |p: &str| find(&r, "h", p).and_then(|r| r.proxied());
        assert_eq!(up("/public/../api/x"), Some(1));
        assert_eq!(up("/%61pi/x"), Some(1));
        assert_eq!(up("/./api/x"), Some(1));
        assert_eq!(up("/api/../public"), Some(0));
        assert_eq!(up("/%2e%2e/api/x"), Some(1));
        assert_eq!(
            up("/api%2Fx"),
            Some(0),
            "an encoded slash is not a separator"
        );
        assert_eq!(&*routing_path(b"/a/b/../c/./d"), b"/a/c/d");
        assert_eq!(&*routing_path(b"/.."), b"/");
        assert_eq!(&*routing_path(b"/a/.."), b"/");
        assert!(matches!(
            routing_path(b"/plain/path"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn no_match() {
        let r = router(&[("a.test", "/", 0), ("", "/only/", 1)]);
        assert!(find(&r, "b.test", "/").is_none());
        assert_eq!(
            find(&r, "b.test", "/only/x").and_then(|r| r.proxied()),
            Some(1)
        );
    }

    #[test]
    fn bad_hosts() {
        assert!(HostMatch::parse("*.").is_err());
        assert!(HostMatch::parse("a b").is_err());
        assert!(HostMatch::parse("").is_err());
        assert!(HostMatch::parse("foo.*.com").is_err());
    }

    /// The lookup of a route table before the host index: a scan of every route in
    /// precedence order. The index must agree with it on every request.
    fn reference<'r>(r: &'r Router, host: &str, path: &[u8]) -> Option<&'r Route> {
        let mut buf = [0u8; 256];
        let host = normalize_host(host.as_bytes(), &mut buf);
        let mut slots = [None; crate::rules::MAX_SLOTS];
        r.routes().iter().find(|r| {
            r.host.matches(host)
                && match (&r.regex, r.exact) {
                    (Some(re), _) => re.captures(path, &mut slots),
                    (None, true) => path == r.path.as_bytes(),
                    (None, false) => path.starts_with(r.path.as_bytes()),
                }
        })
    }

    /// A small deterministic generator (xorshift), so a failure reproduces.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn the_host_index_agrees_with_a_full_scan_on_random_tables() {
        let hosts = [
            "",
            "example.com",
            "a.example.com",
            "b.a.example.com",
            "*.example.com",
            "*.a.example.com",
            "*.com",
            "other.test",
            "*.test",
        ];
        // Paths past a slot's 22 bytes are decided from the route's own text: two share the
        // first 22 bytes and differ after.
        let paths = [
            "/",
            "/a",
            "/a/",
            "/a/b",
            "/ab",
            "/b/",
            "/a/b/c",
            "/a/long/prefix/past/the/slot/",
            "/a/long/prefix/past/theXslot/",
            "/a/long/prefix/past/the/slot/x",
            "/a/long/prefix/past/t",
            "/a/long/prefix/past/th",
        ];
        let regexes = ["^/a/(\\w+)$", "^/b", "^/(a|b)/b"];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for table in 0..200 {
            let mut r = Router::default();
            let n = 1 + rng.below(40);
            for index in 0..n {
                let host = hosts[rng.below(hosts.len())];
                let (path, exact, regex) = match rng.below(6) {
                    0 => {
                        let p = regexes[rng.below(regexes.len())];
                        (
                            p.to_string(),
                            false,
                            Some(crate::rules::PathRegex::new(p).unwrap()),
                        )
                    }
                    1 => (paths[rng.below(paths.len())].to_string(), true, None),
                    _ => (paths[rng.below(paths.len())].to_string(), false, None),
                };
                let route = Route {
                    index,
                    host: match host {
                        "" => HostMatch::Any,
                        h => HostMatch::parse(h).unwrap(),
                    },
                    path,
                    exact,
                    captures: regex.is_some(),
                    regex,
                    conditions: Default::default(),
                    rules: None,
                    target: RouteTarget::Proxy {
                        upstream: index,
                        compress: false,
                        target: None,
                    },
                    limits: Default::default(),
                };
                if !r.has(&route) {
                    r.add(route);
                }
            }
            r.finish();
            let asked = [
                "example.com",
                "a.example.com",
                "b.a.example.com",
                "c.b.a.example.com",
                "x.example.com",
                "EXAMPLE.com:8080",
                "other.test",
                "z.other.test",
                "com",
                "nothing.net",
            ];
            for host in asked {
                let more = ["/a/xyz", "/b/b", "/c", "/a/long/prefix/past/the/slot/x/y"];
                for path in paths.iter().chain(&more) {
                    let want = reference(&r, host, path.as_bytes()).map(|r| r.index);
                    let got = find(&r, host, path).map(|r| r.index);
                    assert_eq!(got, want, "table {table}, {host}{path}");
                }
            }
        }
    }

    /// A host's order depends on its own routes only: a rebuild that changes one host's
    /// routes (and shifts every file position after them) sorts that host again and shares
    /// the others' orders with the previous router.
    #[test]
    fn a_rebuild_reuses_the_order_of_every_unchanged_host() {
        let re = |p: &str| crate::rules::PathRegex::new(p).unwrap();
        let build = |changed: bool| {
            let mut specs = Vec::new();
            for h in ["a.test", "b.test", "c.test", "d.test"] {
                specs.push((h, "/", false));
                if h == "b.test" && changed {
                    specs.push((h, "/new/", false));
                }
                specs.push((h, "^/x/(\\d+)$", true));
                specs.push((h, "/long/", false));
                // The pattern shared with other hosts must not tie their orders together.
                specs.push((h, "^/y", true));
            }
            specs.push(("*.test", "^/x/(\\d+)$", true));
            specs.push(("", "/", false));
            let mut r = Router::default();
            for (index, (host, path, regex)) in specs.into_iter().enumerate() {
                let mut route = router(&[(host, path, index)]).routes()[0].clone();
                route.index = index;
                route.regex = regex.then(|| re(path));
                r.add(route);
            }
            r
        };
        let mut before = build(false);
        before.finish();
        assert_eq!(before.hosts_reused(), (0, 4));
        let mut after = build(true);
        after.finish_after(Some(&before));
        assert_eq!(after.hosts_reused(), (3, 4));
        for h in ["a.test", "c.test", "d.test"] {
            assert!(Arc::ptr_eq(&before.orders[h], &after.orders[h]), "{h}");
        }
        assert!(!Arc::ptr_eq(
            &before.orders["b.test"],
            &after.orders["b.test"]
        ));
        // It answers as a router sorted from scratch.
        let mut fresh = build(true);
        fresh.finish();
        for host in ["a.test", "b.test", "d.test", "x.test", "other"] {
            for path in ["/", "/new/x", "/x/12", "/long/y", "/y", "/x/y"] {
                let got = find(&after, host, path).map(|r| r.index);
                assert_eq!(
                    got,
                    find(&fresh, host, path).map(|r| r.index),
                    "{host}{path}"
                );
                let want = reference(&after, host, path.as_bytes()).map(|r| r.index);
                assert_eq!(got, want, "{host}{path}");
            }
        }
        assert_eq!(
            find(&after, "b.test", "/new/x").map(|r| r.path.as_str()),
            Some("/new/")
        );
        // An unchanged build of the same routes takes every host.
        let mut again = build(true);
        again.finish_after(Some(&after));
        assert_eq!(again.hosts_reused(), (4, 4));
    }

    /// The scale benchmark's table, not yet sorted: `paths` routes on each of `hosts` hosts
    /// `h{i}.example.test`, path `/` when there is one a host, else prefixes `/p0/`, `/p1/`,
    /// ...; host `changed` has `/changed/` for its first.
    fn generated(hosts: usize, paths: usize, changed: usize) -> Router {
        let one = router(&[("h.test", "/", 0)]).routes()[0].clone();
        let mut r = Router::default();
        for h in 0..hosts {
            for p in 0..paths {
                let mut route = one.clone();
                route.index = h * paths + p;
                route.host = HostMatch::Exact(format!("h{h}.example.test"));
                route.path = match (h == changed, p, paths) {
                    (true, 0, _) => "/changed/".into(),
                    (_, _, 1) => "/".into(),
                    _ => format!("/p{p}/"),
                };
                r.add(route);
            }
        }
        r
    }

    /// The router's build alone, 100,000 routes over 10,000 hosts: from scratch, and after a
    /// router whose hosts are the same but one. Printed (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a timing, printed: run by hand"]
    fn time_the_build_of_100000_routes() {
        let build = |changed: usize| generated(10_000, 10, changed);
        let mut first = build(usize::MAX);
        let t = std::time::Instant::now();
        first.finish();
        let scratch = t.elapsed();
        let mut next = build(4321);
        let t = std::time::Instant::now();
        next.finish_after(Some(&first));
        let after = t.elapsed();
        println!(
            "router build, 100000 routes: from scratch {:.1} ms, after a router alike but one \
             host {:.1} ms ({:?} hosts reused)",
            scratch.as_secs_f64() * 1e3,
            after.as_secs_f64() * 1e3,
            next.hosts_reused()
        );
    }

    /// Lookups in 100,000 routes over 10,000 hosts (10 prefixes each), a random route per
    /// lookup and the route read, with 64 KiB of other memory written between lookups as a
    /// request's own work would (so the table's lines and pages are cold: harsher than the
    /// scale benchmark); against 10 routes on 10 hosts. The median of each round is printed
    /// (run with `--release -- --ignored --nocapture`): means on these VMs jump with every
    /// interrupt.
    #[test]
    #[ignore = "a timing, printed: run by hand"]
    fn time_lookups_in_100000_routes() {
        let table = |hosts: usize, paths: usize| {
            let mut r = generated(hosts, paths, usize::MAX);
            r.finish();
            r
        };
        let mut other = vec![0u8; 64 << 20];
        let mut time = |r: &Router, hosts: usize, paths: usize| {
            let reqs: Vec<(String, String)> = (0..20_000usize)
                .map(|i| {
                    let k = i.wrapping_mul(2_654_435_761) % (hosts * paths);
                    let p = if paths == 1 {
                        "/".into()
                    } else {
                        format!("/p{}/x", k % paths)
                    };
                    (format!("h{}.example.test", k / paths), p)
                })
                .collect();
            let mut each = Vec::with_capacity(reqs.len());
            let mut found = 0;
            for (i, (h, p)) in reqs.iter().enumerate() {
                let at = (i * 65_536) % other.len();
                other[at..at + 65_536]
                    .iter_mut()
                    .for_each(|b| *b = b.wrapping_add(1));
                let t = std::time::Instant::now();
                let hit = r.find(
                    h.as_bytes(),
                    p.as_bytes(),
                    &Get,
                    &mut [None; crate::rules::MAX_SLOTS],
                );
                found += hit.map_or(0, |(r, _)| {
                    std::hint::black_box(r.proxied()).map_or(0, |_| 1)
                });
                each.push(t.elapsed().as_nanos() as u64);
            }
            assert_eq!(found, reqs.len());
            each.sort_unstable();
            each[each.len() / 2]
        };
        let small = table(10, 1);
        let large = table(10_000, 10);
        let (mut a, mut b) = (vec![], vec![]);
        for _ in 0..7 {
            a.push(time(&small, 10, 1));
            b.push(time(&large, 10_000, 10));
        }
        println!(
            "lookup medians (ns), 7 rounds: 10 routes {a:?}, 100000 routes {b:?}; a route is {} bytes",
            std::mem::size_of::<Route>()
        );
    }

    #[test]
    fn a_twin_is_found_by_key_before_and_after_sorting() {
        let mut r = router(&[("a.test", "/x/", 0), ("", "/", 1), ("*.test", "/x/", 2)]);
        let probe = r.routes()[0].clone();
        assert!(r.has(&probe));
        r.finish();
        assert_eq!(r.twin(&probe).map(|t| t.index), Some(probe.index));
        let mut other = probe.clone();
        other.path = "/y/".into();
        assert!(r.twin(&other).is_none());
    }
}
