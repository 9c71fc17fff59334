//! The config file as written: serde structs that mirror the TOML one to one.
//!
//! Nothing here is checked beyond its TOML type; [`super::compile`] validates these structs and
//! turns them into the runtime [`super::Snapshot`]. Every struct denies unknown keys, and values
//! that later checks may refuse are wrapped in [`Spanned`] so the error can name their line.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::duration::DurationValue;

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub listeners: BTreeMap<String, Spanned<ListenerSection>>,
    #[serde(default)]
    /// Boxed: a section is about 2.5 KB of optional keys, and a large config has 100,000
    /// of them; expanding the list then moves pointers, and each section is freed as soon
    /// as it is expanded.
    #[allow(clippy::vec_box)] // on purpose: see above
    pub routes: Vec<Box<Spanned<RouteSection>>>,
    /// `[rule_sets.NAME]`: route rules that routes take with `use = ["NAME"]`.
    #[serde(default)]
    pub rule_sets: BTreeMap<String, Spanned<RuleSetSection>>,
    /// `[upstream_defaults]`: keys every upstream group takes where it sets none itself.
    pub upstream_defaults: Option<Spanned<UpstreamDefaultsSection>>,
    /// For each entry of `routes` after [`super::compile::expand`], its position in the
    /// file (a route listing several hosts or paths becomes several entries).
    #[serde(skip)]
    pub route_origin: Vec<usize>,
    #[serde(default)]
    pub upstreams: BTreeMap<String, Spanned<UpstreamSection>>,
    #[serde(default)]
    pub streams: Vec<Spanned<StreamSection>>,
    #[serde(default)]
    pub caches: BTreeMap<String, Spanned<CacheSection>>,
    /// `[providers]`: where routes come from besides this file. Not `Spanned`: the table is
    /// usually implicit (only `[providers.kubernetes]` is written), and has no span then.
    pub providers: Option<ProvidersSection>,
}

/// `[providers]`: sources of routes and backends besides the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersSection {
    pub kubernetes: Option<Spanned<KubernetesSection>>,
}

/// `[providers.kubernetes]`: Ingress objects watched on a Kubernetes API server.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSection {
    pub kubeconfig: Option<Spanned<String>>,
    pub namespaces: Option<Spanned<Vec<String>>>,
    pub ingress_class: Option<Spanned<String>>,
    pub ingress_nginx: Option<Spanned<bool>>,
    pub gateway_class: Option<Spanned<String>>,
    pub http_listener: Option<Spanned<String>>,
    pub https_listener: Option<Spanned<String>>,
    pub status_address: Option<Spanned<String>>,
    /// IP addresses to give Gateways one each (their routes served on that address only).
    pub gateway_addresses: Option<Spanned<Vec<String>>>,
    pub publish_service: Option<Spanned<String>>,
    /// `NAMESPACE/NAME` of the Lease that picks the one replica writing status.
    pub lease: Option<Spanned<String>>,
    /// How long a lease holder that stopped renewing keeps it.
    pub lease_duration: Option<DurationValue>,
}

/// `[caches.NAME]`: a response cache routes can use.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    pub memory: Option<Spanned<SizeValue>>,
    pub disk: Option<Spanned<CacheDiskSection>>,
    pub max_object: Option<Spanned<SizeValue>>,
    /// The answer's cache status field (default `X-Cache`; `""` turns it off).
    pub cache_status_header: Option<Spanned<String>>,
    /// A targeted cache-control field (RFC 9213) veloxy obeys before `CDN-Cache-Control`.
    pub targeted_cache_control: Option<Spanned<String>>,
}

/// `disk = { path = "...", size = "10GiB" }` of a cache.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheDiskSection {
    pub path: Spanned<String>,
    pub size: Option<Spanned<SizeValue>>,
}

/// A route's `cache = { store = "NAME", ... }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteCacheSection {
    pub store: Spanned<String>,
    pub key: Option<Spanned<String>>,
    pub default_ttl: Option<DurationValue>,
    pub methods: Option<Spanned<Vec<String>>>,
    pub stale_while_revalidate: Option<DurationValue>,
    pub stale_if_error: Option<DurationValue>,
    pub ignore_cache_control: Option<Spanned<bool>>,
    pub cache_status_header: Option<Spanned<String>>,
    /// Clients that may send `PURGE` on the route's URLs.
    pub purge: Option<Spanned<Vec<String>>>,
}

/// One `[[streams]]` entry: bytes relayed between a TCP listener and an upstream group.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSection {
    pub listener: Spanned<String>,
    pub upstream: Spanned<String>,
    pub sni: Option<Spanned<Vec<String>>>,
}

/// `[server]`: process-wide settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub workers: Option<Spanned<usize>>,
    pub header_timeout: Option<DurationValue>,
    pub keepalive_timeout: Option<DurationValue>,
    /// Idle time after which a plain HTTP/1 keep-alive connection is parked ("0s": never).
    pub park_idle_after: Option<DurationValue>,
    pub max_header_bytes: Option<Spanned<usize>>,
    pub max_uri_bytes: Option<Spanned<usize>>,
    /// Forward request headers whose names contain `_` (default: dropped).
    pub underscores_in_headers: Option<bool>,
    pub shutdown_timeout: Option<DurationValue>,
    pub send_timeout: Option<DurationValue>,
    pub body_timeout: Option<DurationValue>,
    pub request_buffering: Option<Spanned<String>>,
    pub request_id: Option<Spanned<String>>,
    pub trusted_proxies: Option<Spanned<Vec<String>>>,
    pub client_ip_header: Option<Spanned<String>>,
    pub log_level: Option<Spanned<String>>,
    pub admin: Option<Spanned<String>>,
    /// A file holding the bearer token every admin request must carry.
    pub admin_token_file: Option<Spanned<String>>,
    pub access_log: Option<Spanned<AccessLogSection>>,
    pub acme: Option<Spanned<AcmeSection>>,
    /// The Redis server instances share state through (global rate limits).
    pub redis: Option<Spanned<RedisSection>>,
    /// DNS servers (`"ip[:port]"`) for `dns`/`srv` upstream servers; default: the system's.
    pub resolvers: Option<Spanned<Vec<String>>>,
    /// The I/O mode: `"epoll"` (the default and the only one built) or `"io_uring"` (served
    /// with epoll, and said so in a warning).
    pub io: Option<Spanned<String>>,
    /// OpenTelemetry tracing: spans exported over OTLP.
    pub tracing: Option<Spanned<TracingSection>>,
}

/// `[server.tracing]`: OpenTelemetry spans for exchanges, exported over OTLP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingSection {
    /// `"http://host:4318"` (OTLP/HTTP protobuf, POSTed to `/v1/traces`) or
    /// `"grpc://host:4317"` (OTLP/gRPC).
    pub otlp_endpoint: Spanned<String>,
    pub service_name: Option<Spanned<String>>,
    /// Head sampling for requests with no sampled parent, 0.0 to 1.0.
    pub sample_ratio: Option<Spanned<f64>>,
    /// Follow an incoming `traceparent`'s sampled flag.
    pub parent_based: Option<bool>,
    /// Propagation formats: `"tracecontext"` (the default), `"b3"`.
    pub propagate: Option<Spanned<Vec<String>>>,
    /// Resource attributes added to every span.
    pub resource: Option<BTreeMap<String, String>>,
    /// Continue a client's `traceparent` (default true); false starts a new trace for every
    /// request.
    pub trust_incoming: Option<bool>,
}

/// A route's `tracing`: `false`, or `{ sample_ratio = 1.0 }`.
#[derive(Debug, Clone)]
pub enum RouteTracingSection {
    /// `false`: no spans for the route (`true`: the server's settings).
    Flag(bool),
    /// The route's own ratio.
    Table(RouteTracingTable),
}

/// The table form of a route's `tracing`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTracingTable {
    pub sample_ratio: Option<f64>,
}

impl<'de> Deserialize<'de> for RouteTracingSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RouteTracingSection;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true, false or a table { sample_ratio = 1.0 }")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RouteTracingSection, E> {
                Ok(RouteTracingSection::Flag(v))
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RouteTracingSection, A::Error> {
                RouteTracingTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RouteTracingSection::Table)
            }
        }
        d.deserialize_any(V)
    }
}

/// `[server.redis]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    pub url: Spanned<String>,
    pub username: Option<Spanned<String>>,
    pub password: Option<Spanned<String>>,
    pub password_file: Option<Spanned<String>>,
    pub timeout: Option<DurationValue>,
    pub pool: Option<Spanned<usize>>,
    /// For `rediss://`: CA certificates (PEM) to verify the server with.
    pub ca_file: Option<Spanned<String>>,
}

/// `[server.acme]`: the ACME account and how certificates are obtained.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeSection {
    pub email: Option<Spanned<String>>,
    pub directory: Option<Spanned<String>>,
    pub storage: Option<Spanned<String>>,
    pub ca_file: Option<Spanned<String>>,
    pub challenge: Option<Spanned<String>>,
    pub renew_before: Option<DurationValue>,
    /// `challenge = "dns-01"`: how the TXT records are set.
    pub dns: Option<Spanned<AcmeDnsSection>>,
    /// How long to wait for the TXT record to be answered before telling the CA.
    pub propagation_timeout: Option<DurationValue>,
}

/// `dns = { command = [...] }` or `dns = { rfc2136 = { ... } }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeDnsSection {
    /// Run as `COMMAND set|clear FQDN VALUE`.
    pub command: Option<Spanned<Vec<String>>>,
    /// RFC 2136 dynamic updates with TSIG.
    pub rfc2136: Option<Spanned<Rfc2136Section>>,
}

/// `rfc2136 = { server, zone, key_name, key_file, algorithm }`: RFC 2136 updates sent to
/// `server` (`IP:PORT`) for `zone`, signed with the TSIG key `key_name` read from `key_file`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rfc2136Section {
    pub server: Spanned<String>,
    pub zone: Spanned<String>,
    pub key_name: Spanned<String>,
    pub key_file: Spanned<String>,
    pub algorithm: Option<Spanned<String>>,
}

/// `acme = true` (the hosts of the listener's routes), `acme = ["name", ...]`, or a table
/// `[listeners.NAME.tls.acme]` with the names and the listener's own way of proving them.
#[derive(Debug, Clone)]
pub enum AcmeNames {
    All(bool),
    List(Vec<String>),
    Table(Box<AcmeListenerSection>),
}

/// `[listeners.NAME.tls.acme]`: `names` (default: the hosts of the listener's routes, as
/// `acme = true`) and the keys of `[server.acme]` a listener may set for its own names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeListenerSection {
    pub names: Option<Spanned<Vec<String>>>,
    pub challenge: Option<Spanned<String>>,
    pub dns: Option<Spanned<AcmeDnsSection>>,
    pub propagation_timeout: Option<DurationValue>,
}

impl<'de> Deserialize<'de> for AcmeNames {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AcmeNames;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "true, a list of names, or a table { names = [...], challenge = \"dns-01\", dns = {...} }",
                )
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<AcmeNames, E> {
                Ok(AcmeNames::All(v))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<AcmeNames, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(AcmeNames::List(out))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<AcmeNames, A::Error> {
                AcmeListenerSection::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|t| AcmeNames::Table(Box::new(t)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[server.access_log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogSection {
    pub path: Spanned<String>,
    pub format: Option<Spanned<String>>,
    pub buffer: Option<Spanned<usize>>,
}

/// `[listeners.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSection {
    pub addr: Spanned<String>,
    pub max_connections: Option<Spanned<usize>>,
    /// HTTP/2: offered by ALPN on TLS listeners (default on), h2c prior knowledge on plain
    /// ones (default off).
    pub http2: Option<Spanned<bool>>,
    /// Not `Spanned`: toml cannot span a table defined only through `[[...tls.certs]]`.
    pub tls: Option<TlsSection>,
    /// HTTP/2 limits.
    pub h2_max_concurrent_streams: Option<Spanned<u32>>,
    /// Idle limit for upgraded (WebSocket) connections: closed after this long with no byte
    /// in either direction.
    pub upgrade_idle_timeout: Option<DurationValue>,
    /// Every request gets a 308 to `https://{host}{uri}` (plain listeners).
    pub redirect_https: Option<Spanned<bool>>,
    /// The HTTPS port put in those redirects (443, the default, is omitted).
    pub https_port: Option<Spanned<u16>>,
    /// TLS listeners: what a client speaking plain HTTP to the port gets: `"redirect"`,
    /// `"serve"` or `"reject"` (unset: the failed handshake it gets today).
    pub plain_http: Option<Spanned<String>>,
    pub proxy_protocol: Option<Spanned<bool>>,
    /// `"http"` (default) or `"tcp"` (an L4 listener for `[[streams]]`).
    pub protocol: Option<Spanned<String>>,
    /// HTTP/3 over QUIC on the same port number (UDP), TLS listeners only.
    pub http3: Option<Spanned<bool>>,
    pub h3_max_concurrent_streams: Option<Spanned<u32>>,
    pub quic_idle_timeout: Option<DurationValue>,
    pub quic_max_connections: Option<Spanned<usize>>,
    pub quic_0rtt: Option<Spanned<bool>>,
}

/// `[listeners.NAME.tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
    pub acme: Option<Spanned<AcmeNames>>,
    /// Certificates from the local CA (`veloxy trust` prints it) for `names`.
    pub local_ca: Option<Spanned<bool>>,
    /// The names of `local_ca`'s certificate (default localhost and the loopback addresses).
    pub names: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub certs: Vec<Spanned<CertSection>>,
}

/// `[[listeners.NAME.tls.certs]]`: a certificate chosen by SNI.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertSection {
    pub hosts: Spanned<Vec<String>>,
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
}

/// An optional key of a route (or rule set), boxed. A route section has some forty keys and
/// sets two or three: inline, the options took 2.8 KB a route (280 MB for 100,000 routes before
/// anything was compiled); boxed, an absent key costs one word.
pub type Opt<T> = Option<Box<Spanned<T>>>;

/// One `[[routes]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// One listener or a list (a route on several listeners).
    pub listener: Opt<Names>,
    /// One host pattern or a list.
    pub host: Opt<Names>,
    /// One prefix or a list.
    pub path: Opt<Names>,
    /// An exact path (or a list) instead of a prefix (at most one of `path` and `path_exact`).
    pub path_exact: Opt<Names>,
    /// Rule sets (`[rule_sets.NAME]`) whose keys this route takes where it sets none itself.
    #[serde(rename = "use")]
    pub use_sets: Opt<Vec<Spanned<String>>>,
    /// A regex on the path instead (at most one of the three path kinds).
    pub path_regex: Opt<String>,
    /// Conditions: every one given must hold.
    pub methods: Opt<Vec<String>>,
    pub headers: Opt<BTreeMap<String, String>>,
    pub query: Opt<BTreeMap<String, String>>,
    /// Header rules on the upstream request and on every answer.
    pub request_headers: Opt<HeaderRulesSection>,
    pub response_headers: Opt<HeaderRulesSection>,
    /// Status (or `4xx`/`5xx`) -> file sent for error answers.
    pub error_pages: Opt<BTreeMap<String, String>>,
    pub max_body_bytes: Opt<SizeValue>,
    pub location_rewrite: Opt<bool>,
    /// Client address lists: `deny` wins; with `allow`, everyone else gets 403.
    pub allow: Opt<Vec<String>>,
    pub deny: Opt<Vec<String>>,
    /// HTTP Basic authentication against an htpasswd file.
    pub basic_auth: Opt<BasicAuthSection>,
    /// Cross-origin requests: preflights answered, response fields for allowed origins.
    pub cors: Opt<CorsSection>,
    /// Ask an auth service before forwarding.
    pub forward_auth: Opt<ForwardAuthSection>,
    /// Proxied routes: copies of the requests sent to shadow groups, their answers dropped.
    pub mirror: Opt<MirrorSection>,
    /// Exactly one of `upstream` (proxy), `root` (serve files), `redirect` and `respond`.
    pub upstream: Opt<String>,
    pub redirect: Opt<RedirectSection>,
    /// Proxied routes: remove the matched `path` prefix from the upstream request.
    pub strip_prefix: Opt<bool>,
    /// Proxied routes: replace the upstream request's path with this template.
    pub rewrite: Opt<String>,
    pub respond: Opt<RespondSection>,
    pub root: Opt<String>,
    pub index: Opt<Vec<String>>,
    pub try_files: Opt<Vec<String>>,
    pub cache_control: Opt<String>,
    pub browse: Opt<bool>,
    pub follow_symlinks: Opt<bool>,
    pub allow_hidden: Opt<bool>,
    pub precompressed: Opt<bool>,
    pub cache_bytes: Opt<usize>,
    /// File routes: compress files on the fly (default on). Proxied routes: compress
    /// responses (default off).
    pub compress: Opt<bool>,
    pub max_concurrency: Opt<usize>,
    pub queue: Opt<usize>,
    pub queue_timeout: Option<DurationValue>,
    pub rate_limit: Opt<RateLimitSection>,
    /// Proxied routes: cache responses in a `[caches.NAME]` store.
    pub cache: Opt<RouteCacheSection>,
    /// Routes to a search group: bulk routing, query cache and guards.
    pub search: Opt<RouteSearchSection>,
    /// Routes to a FastCGI group (PHP-FPM): the CGI parameters.
    pub fastcgi: Opt<FastcgiSection>,
    /// Routes to an `h2`/`h2c` group: serve gRPC-Web clients (browsers) as well.
    pub grpc_web: Opt<GrpcWebSection>,
    /// Proxied routes: send `103 Early Hints` with the preload/preconnect `Link` fields of the
    /// path's last 200 answer before asking the upstream.
    pub early_hints: Opt<bool>,
    /// OpenTelemetry tracing for this route: `false`, or its own `sample_ratio`.
    pub tracing: Opt<RouteTracingSection>,
}

/// `grpc_web = true`, or `grpc_web = { cors_origins = ["https://app.example"] }`.
#[derive(Debug, Clone)]
pub enum GrpcWebSection {
    /// `true`: on, and CORS preflights allowed from any origin; `false`: off.
    Flag(bool),
    /// On, with CORS for these origins only.
    Table(GrpcWebTable),
}

/// The table form of `grpc_web`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcWebTable {
    /// Origins allowed by CORS (`"*"`: any).
    pub cors_origins: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for GrpcWebSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GrpcWebSection;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true, false or a table { cors_origins = [...] }")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<GrpcWebSection, E> {
                Ok(GrpcWebSection::Flag(v))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<GrpcWebSection, A::Error> {
                GrpcWebTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(GrpcWebSection::Table)
            }
        }
        d.deserialize_any(V)
    }
}

/// `[rule_sets.NAME]`: the rule keys of a route, shared by the routes that `use` the set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSetSection {
    pub request_headers: Opt<HeaderRulesSection>,
    pub response_headers: Opt<HeaderRulesSection>,
    pub error_pages: Opt<BTreeMap<String, String>>,
    pub max_body_bytes: Opt<SizeValue>,
    pub location_rewrite: Opt<bool>,
    pub allow: Opt<Vec<String>>,
    pub deny: Opt<Vec<String>>,
    pub basic_auth: Opt<BasicAuthSection>,
    pub cors: Opt<CorsSection>,
    pub forward_auth: Opt<ForwardAuthSection>,
    pub rate_limit: Opt<RateLimitSection>,
    pub compress: Opt<bool>,
    pub max_concurrency: Opt<usize>,
    pub queue: Opt<usize>,
    pub queue_timeout: Option<DurationValue>,
    pub cache: Opt<RouteCacheSection>,
    pub early_hints: Opt<bool>,
}

/// A name or a list of names (`listener`, `host`, `path`, `path_exact` of a route). The
/// compiler expands lists into one route per combination before anything reads a route, so
/// every reader sees [`Names::One`]; dereferencing gives that one name.
#[derive(Debug, Clone)]
pub enum Names {
    One(String),
    Many(Vec<Spanned<String>>),
}

impl std::ops::Deref for Names {
    type Target = String;
    fn deref(&self) -> &String {
        match self {
            Names::One(s) => s,
            // Not reached after expansion; the first name keeps a reader total.
            Names::Many(v) => v.first().map(|s| s.get_ref()).unwrap_or(&EMPTY),
        }
    }
}

static EMPTY: String = String::new();

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Names;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Names, E> {
                Ok(Names::One(v.to_owned()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Names, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<Spanned<String>>()? {
                    out.push(s);
                }
                Ok(Names::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `redirect = { to = "https://{host}{uri}", status = 308 }` on a route.
/// `request_headers` / `response_headers`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRulesSection {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// `cors = { origins, methods, headers, expose_headers, credentials, max_age }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsSection {
    pub origins: Vec<String>,
    pub methods: Option<Vec<String>>,
    pub headers: Option<Vec<String>>,
    pub expose_headers: Option<Vec<String>>,
    pub credentials: Option<bool>,
    pub max_age: Option<DurationValue>,
}

/// `forward_auth = { upstream, path, copy_headers, timeout, send_headers, remove_headers,
/// trust_forward_header }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardAuthSection {
    pub upstream: Spanned<String>,
    pub path: Option<String>,
    pub copy_headers: Option<Vec<String>>,
    pub timeout: Option<DurationValue>,
    /// The client's fields sent to the auth service: names (`X-*` for a prefix) or `"all"`.
    pub send_headers: Option<Spanned<FieldNames>>,
    /// The client's fields removed before anything: sent neither to the auth service nor on.
    pub remove_headers: Option<Vec<String>>,
    /// Pass the client's own X-Forwarded-* to the auth service (behind a trusted proxy).
    pub trust_forward_header: Option<bool>,
}

/// `mirror = { upstream = "shadow", percent = 100.0, body = true }`, or a list of such
/// tables (one copy of the request per table).
#[derive(Debug, Clone)]
pub struct MirrorSection(pub Vec<MirrorTable>);

/// One table of `mirror`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorTable {
    /// The shadow group.
    pub upstream: Spanned<String>,
    /// The share of requests copied, 0 to 100 (default 100).
    pub percent: Option<Spanned<f64>>,
    /// Copy the request body too (default true).
    pub body: Option<bool>,
    /// The copy's Host field (default: the client's).
    pub host: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for MirrorSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MirrorSection;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a table { upstream = \"NAME\", percent, body, host } or a list of them",
                )
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<MirrorSection, A::Error> {
                MirrorTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|t| MirrorSection(vec![t]))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<MirrorSection, A::Error> {
                let mut out = Vec::new();
                while let Some(t) = seq.next_element::<MirrorTable>()? {
                    out.push(t);
                }
                Ok(MirrorSection(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A list of field names, or one word (`"all"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum FieldNames {
    List(Vec<String>),
    Word(String),
}

/// `fastcgi = { root, index, split_path, params }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FastcgiSection {
    /// The document root, as the FastCGI server sees it.
    pub root: Spanned<String>,
    /// The script of a directory and the front controller (default `index.php`).
    pub index: Option<String>,
    /// A regex splitting the path into the script and PATH_INFO.
    pub split_path: Option<Spanned<String>>,
    /// Extra CGI parameters.
    pub params: Option<BTreeMap<String, String>>,
}

/// `basic_auth = { realm, users_file }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthSection {
    pub realm: Option<String>,
    pub users_file: Spanned<String>,
}

/// A size: an integer in bytes or a string with a unit (`"10MiB"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectSection {
    pub to: Spanned<String>,
    pub status: Option<Spanned<u16>>,
}

/// `respond = { status = 200, body = "ok\n", content_type = "text/plain" }` on a route.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondSection {
    pub status: Option<Spanned<u16>>,
    pub body: Option<Spanned<String>>,
    pub content_type: Option<Spanned<String>>,
}

/// `rate_limit = { rate = "100/s", burst = 50, key = "client_ip" }` on a route.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSection {
    pub rate: Spanned<String>,
    pub burst: Option<Spanned<u32>>,
    pub key: Option<Spanned<String>>,
    pub max_keys: Option<Spanned<usize>>,
    /// `"local"` (default: per instance) or `"global"` (shared through `[server.redis]`).
    pub scope: Option<Spanned<String>>,
    /// `"local"` (default), `"allow"` or `"deny"`: global limits while Redis fails.
    pub on_store_error: Option<Spanned<String>>,
}

/// `[upstreams.NAME.health]`: active health checks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    pub path: Option<Spanned<String>>,
    pub interval: Option<DurationValue>,
    pub timeout: Option<DurationValue>,
    pub healthy: Option<Spanned<u32>>,
    pub unhealthy: Option<Spanned<u32>>,
    pub expect_status: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
}

/// `[upstreams.NAME.outlier]`: passive health checks (outlier ejection).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierSection {
    pub consecutive_failures: Option<Spanned<u32>>,
    pub base_ejection: Option<DurationValue>,
    pub max_ejection: Option<DurationValue>,
    pub max_ejected_percent: Option<Spanned<u32>>,
    pub on_5xx: Option<bool>,
}

/// `[upstreams.NAME]`: an upstream group.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    pub servers: Spanned<Vec<Spanned<ServerEntry>>>,
    pub policy: Option<Spanned<String>>,
    pub keepalive: Option<Spanned<usize>>,
    /// How long connections beyond `keepalive` may stay idle after a burst ("0s": closed at once).
    pub pool_purge_delay: Option<DurationValue>,
    pub connect_timeout: Option<DurationValue>,
    pub read_timeout: Option<DurationValue>,
    pub write_timeout: Option<DurationValue>,
    pub idle_timeout: Option<DurationValue>,
    pub retries: Option<Spanned<u32>>,
    pub retry_on: Option<Spanned<Vec<u16>>>,
    pub retry_budget: Option<Spanned<f64>>,
    pub retry_body_limit: Option<Spanned<usize>>,
    pub max_connections: Option<Spanned<usize>>,
    pub hash_key: Option<Spanned<String>>,
    pub health: Option<Spanned<HealthSection>>,
    pub outlier: Option<Spanned<OutlierSection>>,
    /// `"http1"` (default), `"h2"` (HTTP/2 over TLS: `https://` servers) or `"h2c"`.
    pub protocol: Option<Spanned<String>>,
    /// CA certificates (PEM) that `https://` servers are verified against; default: the
    /// system's roots.
    pub ca_file: Option<Spanned<String>>,
    /// Name sent as SNI and verified in the server's certificate; default: the host of the
    /// server's address.
    pub tls_server_name: Option<Spanned<String>>,
    /// `false`: `https://` servers' certificates are not verified (default true).
    pub tls_verify: Option<Spanned<bool>>,
    pub location_rewrite: Option<Spanned<bool>>,
    pub sticky: Option<Spanned<StickySection>>,
    pub proxy_protocol: Option<Spanned<String>>,
    /// `"reset"` (default): a reload restores the file's servers over runtime API changes;
    /// `"keep"`: drained and removed servers stay so.
    pub runtime_overrides: Option<Spanned<String>>,
    /// `search = { kind = "opensearch", discover = "30s", roles = ["data"] }`: the servers
    /// are seeds of a search cluster whose nodes veloxy discovers.
    pub search: Option<Spanned<UpstreamSearchSection>>,
}

/// `[upstream_defaults]`: the keys of an upstream group that every group takes where it
/// sets none itself (timeouts, retries, pooling, balancing, health and outlier checks).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamDefaultsSection {
    pub policy: Option<Spanned<String>>,
    pub keepalive: Option<Spanned<usize>>,
    pub pool_purge_delay: Option<DurationValue>,
    pub connect_timeout: Option<DurationValue>,
    pub read_timeout: Option<DurationValue>,
    pub write_timeout: Option<DurationValue>,
    pub idle_timeout: Option<DurationValue>,
    pub retries: Option<Spanned<u32>>,
    pub retry_on: Option<Spanned<Vec<u16>>>,
    pub retry_budget: Option<Spanned<f64>>,
    pub retry_body_limit: Option<Spanned<usize>>,
    pub max_connections: Option<Spanned<usize>>,
    pub hash_key: Option<Spanned<String>>,
    pub health: Option<Spanned<HealthSection>>,
    pub outlier: Option<Spanned<OutlierSection>>,
    pub location_rewrite: Option<Spanned<bool>>,
    pub runtime_overrides: Option<Spanned<String>>,
}

/// `search` on an upstream group.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSearchSection {
    /// `"opensearch"` (also for Elasticsearch 7+: the same APIs and routing).
    pub kind: Spanned<String>,
    /// How often the nodes and the cluster state are read (default 30s; `"0s"`: never, the
    /// servers are used as they are).
    pub discover: Option<DurationValue>,
    /// Only nodes with one of these roles become backends (default: every node with an HTTP
    /// address).
    pub roles: Option<Spanned<Vec<String>>>,
}

/// `search` on a route to a search group.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSearchSection {
    /// `"forward"` (default) or `"route_to_shards"`.
    pub bulk: Option<Spanned<String>>,
    /// A `[caches.NAME]` store for `_search`, `_count` and `_msearch` answers.
    pub query_cache: Option<Spanned<String>>,
    /// How long a cached query answer is used (default 60s).
    pub ttl: Option<DurationValue>,
    /// Clamp for `size` and `from + size` of searches.
    pub max_size: Option<Spanned<u32>>,
    /// APIs refused with 403, e.g. `["_delete_by_query", "_update_by_query"]`.
    pub deny: Option<Spanned<Vec<String>>>,
    /// A search `timeout` added to searches that do not set one.
    pub timeout: Option<DurationValue>,
    /// Bulk bodies up to this size are routed to shards; larger ones stream through as they
    /// are (default 64MiB).
    pub max_bulk_body: Option<Spanned<SizeValue>>,
}

/// `sticky = { cookie, ttl, secure, http_only }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StickySection {
    pub cookie: Option<String>,
    pub ttl: Option<DurationValue>,
    pub secure: Option<bool>,
    pub http_only: Option<bool>,
}

/// A backend in `servers`: `"host:port"`, `{ addr = "host:port", weight = 2 }`, or a name
/// resolved at run time: `{ dns = "host:port", resolve = "10s" }` (every A/AAAA address) or
/// `{ srv = "_http._tcp.name", resolve = "10s" }` (SRV targets, ports and weights).
#[derive(Debug, Clone, Default)]
pub struct ServerEntry {
    /// `"host:port"` (empty for a `dns`/`srv` entry).
    pub addr: String,
    pub weight: Option<u32>,
    pub dns: Option<String>,
    pub srv: Option<String>,
    /// How often a `dns`/`srv` name is resolved again (`"10s"`).
    pub resolve: Option<String>,
    /// A backup server: picked only while no other server of the group may be.
    pub backup: bool,
}

const ENTRY_FIELDS: &[&str] = &["addr", "weight", "dns", "srv", "resolve", "backup"];

impl<'de> Deserialize<'de> for ServerEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = ServerEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"an address string "host:port" or a table { addr = "host:port", weight = N } or { dns = "host:port" } or { srv = "_service._tcp.name" }"#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ServerEntry, E> {
                Ok(ServerEntry {
                    addr: v.to_owned(),
                    ..ServerEntry::default()
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ServerEntry, A::Error> {
                let mut e = ServerEntry::default();
                let mut addr = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "addr" => addr = Some(map.next_value::<String>()?),
                        "weight" => e.weight = Some(map.next_value::<u32>()?),
                        "dns" => e.dns = Some(map.next_value::<String>()?),
                        "srv" => e.srv = Some(map.next_value::<String>()?),
                        "resolve" => e.resolve = Some(map.next_value::<String>()?),
                        "backup" => e.backup = map.next_value::<bool>()?,
                        other => return Err(de::Error::unknown_field(other, ENTRY_FIELDS)),
                    }
                }
                let named = usize::from(addr.is_some())
                    + usize::from(e.dns.is_some())
                    + usize::from(e.srv.is_some());
                if named != 1 {
                    return Err(de::Error::custom(
                        "a server table needs exactly one of addr, dns or srv",
                    ));
                }
                if e.resolve.is_some() && addr.is_some() {
                    return Err(de::Error::custom(
                        "resolve applies to dns and srv servers, not addr",
                    ));
                }
                e.addr = addr.unwrap_or_default();
                Ok(e)
            }
        }
        d.deserialize_any(EntryVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route's section is what 100,000 routes hold at once before compiling: with its keys
    /// inline it was 2.8 KB (280 MB); boxed, an absent key is one word (issue 36's memory goal).
    #[test]
    fn a_route_section_stays_small() {
        let size = std::mem::size_of::<RouteSection>();
        assert!(size <= 400, "RouteSection is {size} bytes");
        assert!(std::mem::size_of::<RuleSetSection>() <= 160);
    }
}
