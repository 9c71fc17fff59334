//! Configuration: file -> parse -> validate -> compile into an immutable [`Snapshot`].
//!
//! * [`file`] holds serde structs that mirror the TOML (`deny_unknown_fields` everywhere).
//! * [`compile`] validates them (names, references, addresses, durations, limits) and builds the
//!   typed snapshot the workers read. Nothing is bound, started or created here (no thread,
//!   socket or directory: `veloxy check` runs it), so a bad file is refused before anything is
//!   swapped in; live state the snapshot names is a `late::Late` slot the runtime fills.
//! * [`print`](mod@print) writes a compiled snapshot back as TOML (`veloxy check --print`).
//!
//! Every option's default is documented on the compiled field that holds it, and in the README.

pub mod compile;
mod duration;
mod error;
pub(crate) mod file;
pub(crate) mod footprint;
pub mod print;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(crate) use compile::upstreams::runtime_backend;
pub use duration::{parse_duration, DurationValue};
pub use error::ConfigError;

use crate::router::Router;
use crate::upstream::balancer::PolicyRegistry;

/// Why `pattern` is not a valid `path_regex` (the syntax and limits a route's is checked
/// with), or `None`: for providers that write routes from other objects (a Gateway API
/// RegularExpression path match) and refuse one object rather than the whole config.
pub fn path_regex_error(pattern: &str) -> Option<String> {
    crate::rules::PathRegex::new(pattern).err()
}

/// Loads, validates and compiles a config file with the built-in policies.
pub fn load_file(path: &Path) -> Result<Snapshot, ConfigError> {
    load_file_with(path, &PolicyRegistry::with_builtins())
}

/// Like [`load_file`] with a caller's policy registry (custom balancing policies).
pub fn load_file_with(path: &Path, policies: &PolicyRegistry) -> Result<Snapshot, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    compile::compile_str(path, &text, policies)
}

/// Like [`load_file_with`], for a reload: routes whose text is unchanged since `previous`
/// was compiled are taken from it instead of compiled again (see
/// [`compile::compile_str_after`]).
pub fn load_file_after(
    path: &Path,
    policies: &PolicyRegistry,
    previous: &Snapshot,
) -> Result<Snapshot, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    compile::compile_str_after(path, &text, policies, Some(previous))
}

/// Process-wide settings from `[server]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker threads, each with its own runtime, listener sockets and pools. Default: one per core.
    pub workers: usize,
    /// Time allowed from a request's first byte to the end of its head. Default 10s.
    pub header_timeout: Duration,
    /// Time an idle downstream keep-alive connection is kept open. Default 60s.
    pub keepalive_timeout: Duration,
    /// Idle time after which a plain HTTP/1 keep-alive connection leaves the runtime and
    /// waits in the worker's parking (about 100 bytes instead of 1.5 KB: see `park`). Zero:
    /// never parked. Default 1s: a busy connection's next request comes sooner, and an idle
    /// one pays the four `epoll_ctl` calls of parking once per idle period.
    pub park_idle_after: Duration,
    /// Largest request head (request line + headers) accepted; more is a 431. Default 65536.
    pub max_header_bytes: usize,
    /// Longest request target accepted; longer is a 414. Default 8192.
    pub max_uri_bytes: usize,
    /// Forward request headers whose names contain `_`. Default false: they are dropped
    /// before forwarding (HTTP/1 and HTTP/2 clients alike), as nginx does, because CGI-style
    /// backends map `-` and `_` to the same variable name, so `X_User` could pass for `X-User`
    /// a front end checked or set.
    pub underscores_in_headers: bool,
    /// How long shutdown waits for in-flight requests. Default 10s.
    pub shutdown_timeout: Duration,
    /// Longest a response may wait for the client to accept more bytes (a write to an HTTP/1
    /// client, or an HTTP/2 stream with no flow-control window); then the exchange is cut and
    /// its upstream connection released. Default 60s, as nginx's `send_timeout`.
    pub send_timeout: Duration,
    /// Longest wait between two reads of a request body; then 408 (when no response has
    /// started) and close. Default 60s, as nginx's `client_body_timeout`.
    pub body_timeout: Duration,
    /// Whether request bodies are read before an upstream connection is taken.
    pub request_buffering: RequestBuffering,
    /// `request_id = "X-Request-Id"`: keep a valid incoming ID in that field or generate one,
    /// forward it upstream, return it, log it.
    pub request_id: Option<String>,
    /// `trusted_proxies` and `client_ip_header`: where the real client address comes from.
    pub real_ip: Option<crate::access::RealIp>,
    /// Log filter used when `RUST_LOG` is unset. Default `"info"`. Either way the `veloxy`
    /// command adds `rustls::msgs::handshake=error` (and silences the Kubernetes client's own
    /// lines) unless the filter names rustls.
    pub log_level: String,
    /// Admin endpoint address (`/metrics`, `/healthz`, `/upstreams`, `POST /reload`). Default: off.
    pub admin: Option<SocketAddr>,
    /// `admin_token_file`'s token: `Authorization: Bearer TOKEN` on every admin request.
    pub admin_token: Option<String>,
    /// Access log. Default: off. Read at start; changing it needs a restart.
    pub access_log: Option<crate::access_log::AccessLogConfig>,
    /// `[server.acme]`, when some listener has `tls.acme`.
    pub acme: Option<Arc<crate::acme::AcmeSettings>>,
    /// `[server.redis]`.
    pub redis: Option<crate::fleet::redis::RedisSpec>,
    /// `[server.tracing]`: OpenTelemetry spans, exported over OTLP.
    pub tracing: Option<crate::otel::TracingSettings>,
    /// `resolvers`: the DNS servers `dns`/`srv` upstream servers are resolved through; empty:
    /// the system's (`/etc/resolv.conf`).
    pub resolvers: Vec<SocketAddr>,
    /// `[providers.kubernetes]`: Ingress objects to serve, watched by the `veloxy` command.
    /// Read at start; changing it needs a restart.
    pub kubernetes: Option<KubernetesSpec>,
}

/// `[providers.kubernetes]`, validated: the listeners it names exist (the HTTPS one with TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesSpec {
    /// A kubeconfig file (absolute); `None`: the in-cluster service account, else
    /// `$KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Namespaces watched; empty: all.
    pub namespaces: Vec<String>,
    /// The Ingress class served (`spec.ingressClassName` or the legacy annotation).
    pub ingress_class: String,
    /// Also serve class `nginx` (ingress-nginx's annotations are honoured either way).
    pub ingress_nginx: bool,
    /// The GatewayClass served (its controllerName must be `veloxy.dev/gateway-controller`);
    /// `None`: every GatewayClass with that controllerName.
    pub gateway_class: Option<String>,
    /// The listener Ingress rules are served on.
    pub http_listener: String,
    /// The TLS listener Ingress TLS hosts are served on.
    pub https_listener: Option<String>,
    /// What Ingress status publishes.
    pub status: Option<StatusAddress>,
    /// `gateway_addresses`: each Gateway gets one of them (the one its `spec.addresses`
    /// names, else the one its status has, else the first free), is served on copies of the
    /// file's listeners bound to it, and publishes it; empty: every Gateway is served on the
    /// file's listeners and publishes `status`.
    pub gateway_addresses: Vec<std::net::IpAddr>,
    /// `lease = "NAMESPACE/NAME"`: the coordination.k8s.io Lease through which one replica
    /// writes status; `None`: `veloxy-status` in the pod's namespace (`$POD_NAMESPACE`, the
    /// service account's, else `default`).
    pub lease: Option<(String, String)>,
    /// `lease_duration`: how long a holder that stopped renewing keeps the lease (default
    /// 15 s; renewed every third of it).
    pub lease_duration: Duration,
}

/// What goes into `status.loadBalancer.ingress` of the Ingresses served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusAddress {
    /// `status_address` given as an IP address.
    Ip(std::net::IpAddr),
    /// `status_address` given as a host name.
    Hostname(String),
    /// `publish_service = "NAMESPACE/NAME"`: that Service's addresses.
    Service {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
    },
}

/// `[server] request_buffering`: when a request body is read before the upstream is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBuffering {
    /// Bodies up to the group's `retry_body_limit` are read completely first, so a slow sender
    /// costs no upstream connection (and the request stays retryable); larger ones stream.
    Auto,
    /// Only bodies of retryable requests are read first (idempotent, small, `retries > 0`);
    /// every other body streams to the upstream as it arrives.
    Off,
}

/// `plain_http` on a TLS listener: what a client gets that speaks plain HTTP to the port
/// (its first byte is not a TLS handshake record's), instead of a failed handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainHttp {
    /// A 308 to the same host and URI over HTTPS on this port (Caddy's and Traefik's way).
    Redirect,
    /// Served over plain HTTP like a plain listener's request (`{scheme}` is http).
    Serve,
    /// 400 with a body that says to use https, then the connection closes (nginx's 497).
    Reject,
}

impl PlainHttp {
    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            PlainHttp::Redirect => "redirect",
            PlainHttp::Serve => "serve",
            PlainHttp::Reject => "reject",
        }
    }
}

/// A compiled listener: a name, an address, and the routes that apply to it.
#[derive(Debug, Clone)]
pub struct ListenerSpec {
    /// `[listeners.NAME]`: routes and logs refer to it.
    pub name: String,
    /// The address to bind (port 0: an ephemeral port, reported by `Running::local_addrs`).
    pub addr: SocketAddr,
    /// The routes that apply to this listener, sorted for lookup. Shared: a change that
    /// leaves the routes alone (a backend set through the runtime API or DNS) copies the
    /// snapshot without copying its routes.
    pub router: Arc<Router>,
    /// `redirect_https = true`: every request is answered with a 308 to HTTPS on this port.
    pub redirect_https: Option<u16>,
    /// TLS listeners: what a client that speaks plain HTTP to the port gets (`plain_http`).
    pub plain_http: Option<PlainHttp>,
    /// `proxy_protocol = true`: a PROXY protocol v1/v2 header from a trusted proxy comes first.
    pub proxy_protocol: bool,
    /// `protocol = "tcp"`: an L4 listener (no HTTP).
    pub tcp: bool,
    /// A tcp listener's upstream group (from its `[[streams]]` entry).
    pub stream: Option<usize>,
    /// A TLS listener's `[[streams]] sni = [...]` entries: connections asking for one of
    /// these names are relayed to the group without being terminated.
    pub sni_streams: Vec<(crate::router::HostMatch, usize)>,
    /// Open downstream connections allowed (across workers); excess connections are accepted,
    /// answered 503 with Retry-After, and closed. Default 0 = unlimited.
    pub max_connections: usize,
    /// TLS termination, when `[listeners.NAME.tls]` is set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The certificate files `tls` was loaded from, in the file's order (the default pair
    /// first, then the SNI entries). The rustls config keeps only parsed keys; these paths
    /// are kept for `veloxy check --print`.
    pub tls_files: Vec<TlsFiles>,
    /// HTTP/2: by ALPN on TLS listeners (default on), h2c prior knowledge on plain ones
    /// (default off).
    pub http2: bool,
    /// Concurrent HTTP/2 streams per connection. Default 128.
    pub h2_max_concurrent_streams: u32,
    /// Upgraded (WebSocket) connections close after this long without a byte in either
    /// direction. Default 10 minutes.
    pub upgrade_idle_timeout: Duration,
    /// `tls.acme`: the names this listener serves with ACME certificates (lowercase, sorted).
    pub acme: Vec<String>,
    /// `[listeners.NAME.tls.acme]` with its own `challenge`, `dns` or `propagation_timeout`:
    /// `[server.acme]`'s settings with those in place, for this listener's names (`None`: the
    /// server's).
    pub acme_settings: Option<Arc<crate::acme::AcmeSettings>>,
    /// `tls.local_ca = true`: the names of the local CA's certificate (empty: off). Issued
    /// when the config is bound to the runtime (`acme::local`), not by `check`.
    pub local_ca: Vec<String>,
    /// `http3 = true`: QUIC on the same port number over UDP.
    pub http3: Option<Arc<Http3Spec>>,
}

/// A listener's HTTP/3 settings.
#[derive(Clone)]
pub struct Http3Spec {
    /// The QUIC server config: the listener's certificates (the same SNI choice), ALPN `h3`,
    /// TLS 1.3, the stream and idle limits below.
    pub quic: quinn::ServerConfig,
    /// `h3_max_concurrent_streams` (default: `h2_max_concurrent_streams`).
    pub max_streams: u32,
    /// `quic_idle_timeout` (default: `[server] keepalive_timeout`).
    pub idle_timeout: Duration,
    /// `quic_max_connections` (default: `max_connections`; 0 = unlimited).
    pub max_connections: usize,
    /// `quic_0rtt`: accept TLS early data; requests in it that are not replay-safe get 425.
    pub zero_rtt: bool,
}

impl std::fmt::Debug for Http3Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http3Spec")
            .field("max_streams", &self.max_streams)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_connections", &self.max_connections)
            .field("zero_rtt", &self.zero_rtt)
            .finish()
    }
}

pub use crate::tls::TlsFiles;

pub use crate::upstream::group::{Backend, HashKey, UpstreamGroup, UpstreamProtocol};

/// The immutable, validated configuration the workers run on. Reloading builds a new one and
/// swaps the pointer; in-flight requests finish on the snapshot they started with.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `[server]`.
    pub settings: Settings,
    /// `[listeners.NAME]`, in name order.
    pub listeners: Vec<ListenerSpec>,
    /// `[upstreams.NAME]`, in name order; routes refer to them by index. Each is shared, so
    /// a change to one group's backends copies that group only.
    pub upstreams: Vec<Arc<UpstreamGroup>>,
    /// Things that are valid but probably unintended, as `file:line:column: key: warning: ...`
    /// lines: `veloxy check` prints them, `veloxy run` logs them at start and on reload.
    pub warnings: Vec<String>,
    /// The live objects the snapshot names but compiling does not make (see `late::Late`).
    pub(crate) live: LiveSpecs,
    /// What the next reload's compile may take from this one (see `compile::reuse`).
    pub(crate) reuse: Option<Arc<compile::reuse::Reuse>>,
}

impl Snapshot {
    /// The index in [`Snapshot::upstreams`] of the group named `name` (a binary search: see
    /// `upstream::group::index_by_name`).
    pub fn upstream_index(&self, name: &str) -> Option<usize> {
        crate::upstream::group::index_by_name(&self.upstreams, name)
    }

    /// The group named `name`, if there is one.
    pub fn upstream(&self, name: &str) -> Option<&Arc<UpstreamGroup>> {
        self.upstream_index(name).map(|i| &self.upstreams[i])
    }

    /// How many `[[routes]]` entries this compile took unchanged from the snapshot it was
    /// compiled after ([`load_file_after`]), of how many; `None` when its routes cannot be
    /// reused by the next one either (see `compile::reuse`).
    pub fn reused_routes(&self) -> Option<(usize, usize)> {
        self.reuse.as_ref().map(|r| (r.taken, r.entries()))
    }

    /// How many hosts' routes this compile found as they were in the snapshot it was
    /// compiled after, their routing order taken from it rather than sorted again, of how
    /// many exact hosts (summed over the listeners; see `router::order`).
    pub fn reused_hosts(&self) -> (usize, usize) {
        (self.listeners.iter())
            .map(|l| l.router.hosts_reused())
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    /// Each listener's certificates (files and ACME names), as the ACME thread and the
    /// certificate report read them.
    pub(crate) fn listener_certs(&self) -> Vec<crate::acme::ListenerCerts<'_>> {
        self.listeners
            .iter()
            .map(|l| crate::acme::ListenerCerts {
                name: &l.name,
                files: &l.tls_files,
                acme: &l.acme,
                acme_settings: l.acme_settings.as_ref(),
            })
            .collect()
    }
}

/// What the runtime makes (or keeps from the previous generation) for a snapshot, beside the
/// slots inside its groups (a search group's cluster view).
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveSpecs {
    /// `[server.redis]`'s client (its spec is `settings.redis`).
    pub redis: Option<crate::late::Late<crate::fleet::redis::RedisClient>>,
    /// `[server.tracing]`'s span exporter (its settings are `settings.tracing`).
    pub tracer: Option<crate::late::Late<crate::otel::Exporter>>,
    /// `[caches.NAME]`, in name order.
    pub caches: Vec<crate::cache::StoreSpec>,
    /// The runtime's ACME certificate store, which every TLS listener's certificate resolver
    /// reads (ACME certificates, tls-alpn-01 validation certificates, OCSP staples).
    pub certs: crate::late::Late<dyn crate::tls::LiveCerts>,
}
