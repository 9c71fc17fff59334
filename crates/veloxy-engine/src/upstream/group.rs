//! Compiled upstream groups: the plain data the config compiler builds for each
//! `[upstreams.NAME]` (re-exported by [`crate::config`]), with the group's shared health state.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use crate::upstream::addr::BackendAddr;
use crate::upstream::balancer::Policy;
use crate::upstream::health::{GroupHealth, HealthCheck, Outlier};

/// The protocol spoken to an upstream group's backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (over TLS for `https://` servers). The default.
    Http1,
    /// HTTP/2 over TLS (ALPN h2).
    H2,
    /// HTTP/2 over plain TCP (prior knowledge).
    H2c,
    /// FastCGI (PHP-FPM): for routes with `fastcgi = { ... }`.
    Fastcgi,
}

/// What `consistent_hash` (and custom policies, through `PickContext::hash`) hash on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client's IP address (default).
    ClientIp,
    /// `header:NAME`: a request header's value.
    Header(String),
    /// `cookie:NAME`: a cookie's value.
    Cookie(String),
    /// `path`: the request path without query.
    Path,
}

/// A backend: one server of an upstream group.
#[derive(Debug, Clone)]
pub struct Backend {
    /// The address connected to (resolved at load time).
    pub addr: BackendAddr,
    /// The server as written, without its scheme (`host:port`); `addr` is what it resolved to
    /// at load time. Kept because a name means more than one address: it is resolved again
    /// on each load, and it is the default TLS name.
    pub server: String,
    /// For `https://` servers: the name for SNI and certificate verification.
    pub tls_name: Option<rustls::pki_types::ServerName<'static>>,
    /// Relative share of traffic under weighted policies. Default 1.
    pub weight: u32,
    /// `backup = true`: picked only while every other backend is down, ejected or tried
    /// (nginx's and HAProxy's `backup`).
    pub backup: bool,
}

impl Backend {
    /// The name a request to this backend carries when it has none of its own (an HTTP/1.0
    /// request without `Host`, a `forward_auth` call): its address, or `localhost` for a
    /// unix socket.
    pub fn authority(&self) -> String {
        match &self.addr {
            BackendAddr::Tcp(a) => a.to_string(),
            BackendAddr::Unix(_) => "localhost".to_owned(),
        }
    }
}

/// The index in `groups` of the group named `name`. `groups` are a snapshot's
/// ([`crate::config::Snapshot::upstreams`]), which are in name order (compiled from the file's
/// sorted table, and only ever changed in place since), so this is a binary search: the
/// runtime API, the Kubernetes provider's in-place sets, a reload's override reset and the
/// discovery thread's search views look groups up by name, and with 1,000 groups a scan per
/// name was 1,000 comparisons.
pub(crate) fn index_by_name(groups: &[Arc<UpstreamGroup>], name: &str) -> Option<usize> {
    groups.binary_search_by(|g| g.name.as_str().cmp(name)).ok()
}

/// A compiled upstream group.
#[derive(Clone)]
pub struct UpstreamGroup {
    /// `[upstreams.NAME]`.
    pub name: String,
    /// Its servers now, at most [`crate::upstream::health::MAX_BACKENDS`]: the file's addresses plus what its `dns`/`srv` entries
    /// last resolved to, or the set a runtime `PUT` gave (see [`crate::upstream::discovery`]).
    pub backends: Vec<Backend>,
    /// The file's fixed servers (`addr` entries), which `backends` starts from.
    pub file_backends: Arc<[Backend]>,
    /// The file's `dns` and `srv` entries, resolved at run time.
    pub discovery: Vec<Discovery>,
    /// The balancing policy (`policy = ...`, default round robin).
    pub policy: Arc<dyn Policy>,
    /// Idle upstream connections kept per worker and per backend. Default 128; 0 disables pooling.
    pub keepalive: usize,
    /// After a burst, pooled connections beyond `keepalive` stay idle this long before they
    /// are closed (HAProxy's `pool-purge-delay`), so a burst that comes back soon finds them
    /// instead of connecting again: nginx closes them at once, and at 10,000 busy clients a
    /// quarter of its requests opened a new upstream connection. Ignored (closed at once) when
    /// `max_connections` is set, where idle connections would hold slots other workers may
    /// need. Default 1s; `"0s"` closes them at once.
    pub pool_purge_delay: Duration,
    /// Time allowed to establish a TCP connection to a backend; then 504. Default 2s.
    pub connect_timeout: Duration,
    /// Time allowed between two reads from a backend (head or body); then 504. Default 30s.
    pub read_timeout: Duration,
    /// Time allowed for a write to a backend to make progress. Default 30s.
    pub write_timeout: Duration,
    /// Pooled connections idle longer than this are closed instead of reused. Default 60s.
    pub idle_timeout: Duration,
    /// Extra attempts on another backend after a failure. Default 2.
    pub retries: u32,
    /// Response statuses retried (idempotent, replayable requests only). Default [502, 503, 504].
    pub retry_on: Vec<u16>,
    /// Retries allowed as a share of requests, per worker (Envoy's retry budget). Default 0.2.
    pub retry_budget: f64,
    /// Request bodies up to this size are buffered so the request can be retried. Default 65536.
    pub retry_body_limit: usize,
    /// Open connections per backend across workers; at the limit a backend gets no new
    /// connections (pooled ones still serve). Default 0 = unlimited.
    pub max_connections: usize,
    /// Key for `consistent_hash`. Default client IP.
    pub hash_key: HashKey,
    /// Compute the hash per request: the policy is `consistent_hash` or `hash_key` was set.
    pub uses_hash: bool,
    /// Active health checks, if configured.
    pub health_check: Option<HealthCheck>,
    /// Passive health checks (outlier ejection); on by default.
    pub outlier: Outlier,
    /// Shared health state of the backends (kept across reloads for unchanged backends).
    pub health: Arc<GroupHealth>,
    /// The protocol spoken to the backends.
    pub protocol: UpstreamProtocol,
    /// Client TLS config for `https://` servers (every server of a group uses the same scheme).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `tls_server_name`: the TLS name of every `https://` server, when not its host.
    pub tls_server_name: Option<String>,
    /// Absolute path of the `ca_file` that `tls` trusts; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// `tls_verify = false`: `tls` accepts any certificate (default true).
    pub tls_verify: bool,
    /// `runtime_overrides = "keep"`: runtime API drains survive a reload.
    pub keep_runtime_overrides: bool,
    /// `location_rewrite = true`: the default of the group's routes.
    pub location_rewrite: bool,
    /// `sticky`: cookie-based backend affinity.
    pub sticky: Option<Sticky>,
    /// `proxy_protocol = "v1" | "v2"`: the version of the PROXY header sent first on each
    /// stream connection to a backend (0: none).
    pub proxy_protocol: u8,
    /// `search = { kind = "opensearch", ... }`: a search cluster (its servers are seeds).
    pub(crate) search: Option<crate::upstream::search_cluster::SearchGroup>,
}

impl UpstreamGroup {
    /// The backends' bytes: each one's struct and address text, in the live list and in the
    /// file's (the runtime API's reset target).
    pub(crate) fn footprint(&self) -> crate::heap::Counted {
        let one = |b: &Backend| std::mem::size_of::<Backend>() + b.server.capacity();
        crate::heap::Counted {
            count: self.backends.len(),
            bytes: self.backends.iter().map(one).sum::<usize>()
                + self.file_backends.iter().map(one).sum::<usize>(),
        }
    }
}

impl std::fmt::Debug for UpstreamGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamGroup")
            .field("name", &self.name)
            .field("backends", &self.backends)
            .field("discovery", &self.discovery)
            .field("policy", &self.policy.name())
            .field("keepalive", &self.keepalive)
            .field("pool_purge_delay", &self.pool_purge_delay)
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("retries", &self.retries)
            .field("retry_on", &self.retry_on)
            .field("retry_budget", &self.retry_budget)
            .field("retry_body_limit", &self.retry_body_limit)
            .field("max_connections", &self.max_connections)
            .field("hash_key", &self.hash_key)
            .field("health_check", &self.health_check)
            .field("outlier", &self.outlier)
            .field("ca_file", &self.ca_file)
            .field("tls_verify", &self.tls_verify)
            .finish()
    }
}

/// A `dns` or `srv` entry of a group's `servers`: a name resolved again every `every`, each
/// answer becoming a backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Discovery {
    /// What is looked up.
    pub name: DiscoveryName,
    /// `resolve = "10s"`: how often. Default 10s.
    pub every: Duration,
    /// `weight` of each address of a `dns` entry (SRV records carry their own).
    pub weight: u32,
    /// `backup = true`: the addresses found are backup servers.
    pub backup: bool,
    /// `https://` entries: the TLS name each backend is verified against.
    pub tls_name: Option<String>,
}

/// What a [`Discovery`] resolves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DiscoveryName {
    /// `dns = "host:port"`: every A and AAAA address of `host`, on `port`.
    Dns {
        /// The name looked up.
        host: String,
        /// The port of every address.
        port: u16,
    },
    /// `srv = "_service._proto.name"`: the targets of the lowest priority, with their ports
    /// and weights.
    Srv(String),
    /// A search group's cluster: its nodes with an HTTP address (and one of `roles`, when
    /// set), read from `_nodes/http` through the first seed that answers.
    Search {
        /// The group's servers.
        seeds: Vec<std::net::SocketAddr>,
        /// Node roles that qualify (empty: every node).
        roles: Vec<String>,
    },
}

impl std::fmt::Display for DiscoveryName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiscoveryName::Dns { host, port } => write!(f, "dns {host}:{port}"),
            DiscoveryName::Srv(name) => write!(f, "srv {name}"),
            DiscoveryName::Search { seeds, .. } => write!(f, "search nodes via {seeds:?}"),
        }
    }
}

/// `sticky = { cookie, ttl, secure, http_only }`: a client keeps its backend through a cookie.
#[derive(Debug, Clone)]
pub struct Sticky {
    /// The cookie's name.
    pub cookie: String,
    /// Its lifetime (`Max-Age`); zero: a session cookie, without `Max-Age`.
    pub ttl: Duration,
    /// `Secure`: sent over HTTPS only.
    pub secure: bool,
    /// `HttpOnly`: not readable by scripts.
    pub http_only: bool,
    /// Each backend's token: 16 lower-case hex digits of a hash of the group's name and the
    /// backend's address (the same on every instance, so a fleet agrees; it does not reveal
    /// the address). Inline, side by side: writing one touches one place, not a string of its
    /// own somewhere on the heap.
    tokens: Vec<[u8; TOKEN_LEN]>,
    /// The tokens' values, each with its backend: a cookie finds its backend in one probe of
    /// a table built once per change of the backends, at the same cost in a group of 10,000
    /// as in one of 4 (see [`Sticky::backend`]).
    index: rustc_hash::FxHashMap<u64, u32>,
    /// `Set-Cookie: NAME=` and what follows the token to the line's end (attributes, CRLF):
    /// the line around the token, built once.
    line: (Vec<u8>, Vec<u8>),
}

/// Hex digits of a sticky token.
const TOKEN_LEN: usize = 16;

impl Sticky {
    /// A cookie with these attributes, for no backend yet (see [`Sticky::set_backends`]).
    pub fn new(cookie: String, ttl: Duration, secure: bool, http_only: bool) -> Self {
        let head = format!("Set-Cookie: {cookie}=").into_bytes();
        let mut tail = "; Path=/".to_owned();
        // `ttl = "0s"`: a session cookie (no Max-Age: kept until the browser closes, as
        // HAProxy's `cookie ... insert`), never `Max-Age=0`, which deletes it.
        if !ttl.is_zero() {
            tail.push_str(&format!("; Max-Age={}", ttl.as_secs()));
        }
        if secure {
            tail.push_str("; Secure");
        }
        if http_only {
            tail.push_str("; HttpOnly");
        }
        tail.push_str("\r\n");
        Sticky {
            cookie,
            ttl,
            secure,
            http_only,
            tokens: Vec::new(),
            index: rustc_hash::FxHashMap::default(),
            line: (head, tail.into_bytes()),
        }
    }

    /// The token of a backend of group `name` at `addr`.
    pub fn token(name: &str, addr: &BackendAddr) -> String {
        format!("{:016x}", Sticky::token_value(name, addr))
    }

    /// The number a token spells.
    fn token_value(name: &str, addr: &BackendAddr) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one((name, addr))
    }

    /// Gives the cookie the backends of group `name`: their tokens and the index.
    pub fn set_backends(&mut self, name: &str, backends: &[Backend]) {
        let values: Vec<u64> = backends
            .iter()
            .map(|b| Sticky::token_value(name, &b.addr))
            .collect();
        self.tokens = values
            .iter()
            .map(|v| {
                let mut t = [0u8; TOKEN_LEN];
                t.copy_from_slice(format!("{v:016x}").as_bytes());
                t
            })
            .collect();
        let mut index = rustc_hash::FxHashMap::default();
        index.reserve(values.len());
        // Two backends with one token (the same address listed twice): the first keeps it.
        for (i, &v) in values.iter().enumerate().rev() {
            index.insert(v, i as u32);
        }
        self.index = index;
    }

    /// The token of `backend` (16 lower-case hex digits).
    pub fn token_of(&self, backend: usize) -> &str {
        std::str::from_utf8(&self.tokens[backend]).unwrap_or_default()
    }

    /// The backend a cookie value names, if any.
    pub fn backend(&self, value: &[u8]) -> Option<usize> {
        // A token is written lower-case: another spelling of the same number is not it.
        let lower_hex = |c: &u8| c.is_ascii_digit() || (b'a'..=b'f').contains(c);
        if value.len() != TOKEN_LEN || !value.iter().all(lower_hex) {
            return None;
        }
        let v = u64::from_str_radix(std::str::from_utf8(value).ok()?, 16).ok()?;
        self.index.get(&v).map(|&i| i as usize)
    }

    /// The `Set-Cookie` line naming `backend`.
    pub fn set_cookie(&self, backend: usize, out: &mut Vec<u8>) {
        let (head, tail) = &self.line;
        out.reserve(head.len() + TOKEN_LEN + tail.len());
        out.extend_from_slice(head);
        out.extend_from_slice(&self.tokens[backend]);
        out.extend_from_slice(tail);
    }
}

#[cfg(test)]
mod sticky_tests {
    use super::*;

    #[test]
    fn a_cookie_finds_its_backend_in_a_group_of_ten_thousand() {
        let backends: Vec<Backend> = (0..10_000)
            .map(|i| {
                let addr: std::net::SocketAddr =
                    format!("10.0.{}.{}:80", i / 250, i % 250).parse().unwrap();
                Backend {
                    addr: BackendAddr::Tcp(addr),
                    server: addr.to_string(),
                    tls_name: None,
                    weight: 1,
                    backup: false,
                }
            })
            .collect();
        let mut s = Sticky::new("srv".into(), Duration::ZERO, false, true);
        s.set_backends("app", &backends);
        for i in [0, 63, 64, 5_000, 9_999] {
            let token = s.token_of(i).to_owned();
            assert_eq!(token, Sticky::token("app", &backends[i].addr));
            assert_eq!(s.backend(token.as_bytes()), Some(i));
            if token.bytes().any(|c| c.is_ascii_alphabetic()) {
                assert_eq!(s.backend(token.to_uppercase().as_bytes()), None);
            }
            let plus = format!("+{}", &token[1..]);
            assert_eq!(s.backend(plus.as_bytes()), None, "{plus}");
        }
        assert_eq!(s.backend(b"not a token"), None);
        assert_eq!(s.backend(b"0000000000000000"), None);
        // The same address twice: its token names the first.
        let twice = [backends[7].clone(), backends[7].clone()];
        s.set_backends("app", &twice);
        assert_eq!(s.backend(s.token_of(1).as_bytes()), Some(0));
    }

    #[test]
    fn set_cookie_lines() {
        let backends = [Backend {
            addr: BackendAddr::Tcp("10.0.0.1:80".parse().unwrap()),
            server: "10.0.0.1:80".into(),
            tls_name: None,
            weight: 1,
            backup: false,
        }];
        let line = |s: &mut Sticky| {
            s.set_backends("app", &backends);
            let mut out = b"X: y\r\n".to_vec();
            s.set_cookie(0, &mut out);
            String::from_utf8(out).unwrap()
        };
        let token = Sticky::token("app", &backends[0].addr);
        let mut session = Sticky::new("srv".into(), Duration::ZERO, false, false);
        assert_eq!(
            line(&mut session),
            format!("X: y\r\nSet-Cookie: srv={token}; Path=/\r\n")
        );
        let mut all = Sticky::new("s".into(), Duration::from_secs(60), true, true);
        assert_eq!(
            line(&mut all),
            format!("X: y\r\nSet-Cookie: s={token}; Path=/; Max-Age=60; Secure; HttpOnly\r\n")
        );
    }
}
