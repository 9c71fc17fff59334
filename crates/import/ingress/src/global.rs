//! The controller's ConfigMap: ingress-nginx's global settings and their defaults.

use veloxy_import::tree::Node;
use veloxy_import::Report;

use crate::objects::Object;
use crate::util;

/// ingress-nginx's global settings (its `NewDefault()` values unless the ConfigMap sets
/// them).
#[derive(Debug, Clone)]
pub struct Global {
    /// `proxy-body-size` (default `1m`); `None`: no limit.
    pub body_size: Option<String>,
    /// `ssl-redirect` (default true): hosts with a certificate redirect plain HTTP.
    pub ssl_redirect: bool,
    /// `force-ssl-redirect` (default false).
    pub force_ssl_redirect: bool,
    /// `preserve-trailing-slash` (default false).
    pub preserve_trailing_slash: bool,
    /// `proxy-connect-timeout` (default 5s).
    pub connect_timeout: String,
    /// `proxy-read-timeout` (default 60s).
    pub read_timeout: String,
    /// `proxy-send-timeout` (default 60s).
    pub send_timeout: String,
    /// The Strict-Transport-Security value on HTTPS answers of hosts with a certificate
    /// (`hsts`, `hsts-max-age`, `hsts-include-subdomains`, `hsts-preload`); `None`: off.
    pub hsts: Option<String>,
    /// `use-forwarded-headers`.
    pub use_forwarded_headers: bool,
    /// `compute-full-forwarded-for`.
    pub compute_full_xff: bool,
    /// `forwarded-for-header` (default X-Forwarded-For).
    pub forwarded_for_header: String,
    /// `proxy-real-ip-cidr` (default 0.0.0.0/0).
    pub real_ip_cidr: Vec<String>,
    /// `enable-real-ip`.
    pub enable_real_ip: bool,
    /// `http-redirect-code` (default 308).
    pub redirect_code: u16,
    /// `load-balance` (default round_robin).
    pub policy: String,
    /// `use-gzip` / `enable-brotli`.
    pub compress: bool,
    /// `proxy-next-upstream-tries` (default 3).
    pub tries: u32,
    /// `use-http2` (default true).
    pub http2: bool,
    /// `enable-underscores-in-headers`.
    pub underscores: bool,
    /// `client-header-timeout`, `client-body-timeout`, `keep-alive` ([server] keys).
    pub server: Vec<(&'static str, String)>,
    /// `allow-snippet-annotations` (default false since 1.9).
    pub snippets_allowed: bool,
}

impl Default for Global {
    fn default() -> Self {
        Global {
            body_size: Some("1MiB".into()),
            ssl_redirect: true,
            force_ssl_redirect: false,
            preserve_trailing_slash: false,
            connect_timeout: "5s".into(),
            read_timeout: "60s".into(),
            send_timeout: "60s".into(),
            hsts: Some("max-age=31536000; includeSubDomains".into()),
            use_forwarded_headers: false,
            compute_full_xff: false,
            forwarded_for_header: "X-Forwarded-For".into(),
            real_ip_cidr: vec!["0.0.0.0/0".into()],
            enable_real_ip: false,
            redirect_code: 308,
            policy: "round_robin".into(),
            compress: false,
            tries: 3,
            http2: true,
            underscores: false,
            server: Vec::new(),
            snippets_allowed: false,
        }
    }
}

/// Whether a ConfigMap is the controller's: its name says ingress or nginx.
pub fn is_controller_configmap(o: &Object) -> bool {
    let n = o.name.to_ascii_lowercase();
    n.contains("ingress") || n.contains("nginx")
}

/// Settings that change nothing a client or a backend sees (logging, buffers, worker
/// tuning, pools), with why.
const NO_EFFECT: &[(&str, &str)] = &[
    ("access-log-path", "logging"),
    ("error-log-path", "logging"),
    ("error-log-level", "logging"),
    ("log-format-upstream", "logging"),
    ("log-format-escape-json", "logging"),
    ("log-format-escape-none", "logging"),
    ("disable-access-log", "logging"),
    ("skip-access-log-urls", "logging"),
    ("enable-access-log-for-default-backend", "logging"),
    (
        "worker-processes",
        "worker tuning (veloxy: [server] workers, one per core by default)",
    ),
    ("max-worker-connections", "worker tuning"),
    ("max-worker-open-files", "worker tuning"),
    ("worker-cpu-affinity", "worker tuning"),
    ("worker-shutdown-timeout", "worker tuning"),
    ("reuse-port", "veloxy always binds with SO_REUSEPORT"),
    (
        "upstream-keepalive-connections",
        "upstream connection pooling",
    ),
    ("upstream-keepalive-timeout", "upstream connection pooling"),
    ("upstream-keepalive-requests", "upstream connection pooling"),
    ("upstream-keepalive-time", "upstream connection pooling"),
    ("keep-alive-requests", "connection reuse limit"),
    (
        "proxy-buffering",
        "response buffering (veloxy streams answers through fixed buffers)",
    ),
    ("proxy-buffer-size", "response buffering"),
    ("proxy-buffers-number", "response buffering"),
    ("proxy-busy-buffers-size", "response buffering"),
    ("proxy-max-temp-file-size", "response buffering"),
    ("proxy-request-buffering", "request buffering"),
    ("client-body-buffer-size", "request buffering"),
    ("server-name-hash-bucket-size", "nginx hash table sizing"),
    ("server-name-hash-max-size", "nginx hash table sizing"),
    ("proxy-headers-hash-bucket-size", "nginx hash table sizing"),
    ("proxy-headers-hash-max-size", "nginx hash table sizing"),
    ("variables-hash-bucket-size", "nginx hash table sizing"),
    ("variables-hash-max-size", "nginx hash table sizing"),
    ("map-hash-bucket-size", "nginx hash table sizing"),
    (
        "annotations-risk-level",
        "which annotations the controller accepts; each one is reported where it is used",
    ),
    (
        "strict-validate-path-type",
        "path validation; each path is reported",
    ),
    ("enable-vts-status", "metrics"),
    (
        "ssl-session-cache",
        "TLS session cache (veloxy keeps its own)",
    ),
    (
        "ssl-session-cache-size",
        "TLS session cache (veloxy keeps its own)",
    ),
    (
        "ssl-session-tickets",
        "TLS session resumption (veloxy issues tickets)",
    ),
    ("ssl-session-timeout", "TLS session resumption"),
    ("ssl-buffer-size", "TLS record sizing"),
    (
        "use-geoip",
        "GeoIP variables, used only by snippets (refused where they appear)",
    ),
    (
        "use-geoip2",
        "GeoIP variables, used only by snippets (refused where they appear)",
    ),
    ("enable-opentelemetry", "tracing"),
    ("opentelemetry-trust-incoming-span", "tracing"),
    ("otlp-collector-host", "tracing"),
    ("otlp-collector-port", "tracing"),
    ("otel-service-name", "tracing"),
    ("otel-sampler", "tracing"),
    ("otel-sampler-ratio", "tracing"),
    (
        "generate-request-id",
        "request IDs are always generated (see the Ingress lines)",
    ),
];

/// Reads the controller ConfigMap's `data` into `g`, a report line per key.
pub fn read(o: &Object, g: &mut Global, report: &mut Report) {
    let Some(data) = o.node.get("data").and_then(Node::as_map) else {
        report.ignored(&o.loc, format!("ConfigMap {}", o.id()), "no data");
        return;
    };
    report.translated(&o.loc, format!("ConfigMap {}", o.id()));
    for (k, v) in data {
        let val = v.scalar().unwrap_or_default();
        let name = k.name.as_str();
        let bool_val = || v.as_bool();
        let outcome = apply(name, &val, bool_val(), g);
        match outcome {
            Applied::Yes => report.translated(&k.loc, name),
            Applied::Different(w) => report.different(&k.loc, name, w),
            Applied::Bad => report.refused(
                &k.loc,
                name,
                format!("{val:?} is not a value ingress-nginx accepts here"),
            ),
            Applied::No => match NO_EFFECT.iter().find(|(n, _)| *n == name) {
                Some((_, why)) => report.ignored(&k.loc, name, *why),
                None if name.ends_with("-snippet") => report.refused(
                    &k.loc,
                    name,
                    "raw nginx configuration: veloxy cannot run nginx directives",
                ),
                None => report.refused(
                    &k.loc,
                    name,
                    "this ingress-nginx setting has no veloxy translation",
                ),
            },
        }
    }
}

enum Applied {
    Yes,
    Different(String),
    Bad,
    No,
}

fn apply(name: &str, val: &str, b: Option<bool>, g: &mut Global) -> Applied {
    let flag = |dst: &mut bool| match b {
        Some(x) => {
            *dst = x;
            Applied::Yes
        }
        None => Applied::Bad,
    };
    let secs = |dst: &mut String| match util::seconds(val) {
        Some(s) => {
            *dst = s;
            Applied::Yes
        }
        None => Applied::Bad,
    };
    match name {
        "proxy-body-size" => match util::nginx_size(val) {
            Some(s) => {
                g.body_size = s;
                Applied::Yes
            }
            None => Applied::Bad,
        },
        "ssl-redirect" => flag(&mut g.ssl_redirect),
        "force-ssl-redirect" => flag(&mut g.force_ssl_redirect),
        "preserve-trailing-slash" => flag(&mut g.preserve_trailing_slash),
        "proxy-connect-timeout" => secs(&mut g.connect_timeout),
        "proxy-read-timeout" => secs(&mut g.read_timeout),
        "proxy-send-timeout" => secs(&mut g.send_timeout),
        "hsts" => match b {
            Some(false) => {
                g.hsts = None;
                Applied::Yes
            }
            Some(true) => Applied::Yes,
            None => Applied::Bad,
        },
        "hsts-max-age" | "hsts-include-subdomains" | "hsts-preload" => hsts(name, val, b, g),
        "use-forwarded-headers" => match flag(&mut g.use_forwarded_headers) {
            Applied::Yes if g.use_forwarded_headers => Applied::Different(
                "the client address comes from X-Forwarded-For of peers in \
                 proxy-real-ip-cidr ([server] trusted_proxies); X-Forwarded-Proto, -Host and \
                 -Port those peers send are replaced by veloxy's own where ingress-nginx \
                 passes them on (and redirects by them)"
                    .into(),
            ),
            other => other,
        },
        "compute-full-forwarded-for" => flag(&mut g.compute_full_xff),
        "enable-real-ip" => flag(&mut g.enable_real_ip),
        "forwarded-for-header" => {
            g.forwarded_for_header = val.trim().to_string();
            Applied::Yes
        }
        "proxy-real-ip-cidr" => {
            g.real_ip_cidr = util::list(val);
            Applied::Yes
        }
        "http-redirect-code" => match val.trim().parse() {
            Ok(c @ (301 | 302 | 307 | 308)) => {
                g.redirect_code = c;
                Applied::Yes
            }
            _ => Applied::Bad,
        },
        "load-balance" => match val.trim() {
            "round_robin" => {
                g.policy = "round_robin".into();
                Applied::Yes
            }
            "ewma" => {
                g.policy = "p2c_ewma".into();
                Applied::Different(
                    "veloxy's p2c_ewma picks the lower of two random backends by latency x \
                     in-flight requests; ingress-nginx's ewma scores every backend"
                        .into(),
                )
            }
            _ => Applied::Bad,
        },
        "use-gzip" | "enable-brotli" => {
            if b == Some(true) {
                g.compress = true;
            }
            match b {
                Some(_) => Applied::Different(
                    "veloxy's compress picks gzip, br or zstd by Accept-Encoding for its own \
                     list of compressible types; gzip-types, gzip-level and gzip-min-length \
                     are not applied"
                        .into(),
                ),
                None => Applied::Bad,
            }
        }
        "proxy-next-upstream-tries" => match val.trim().parse::<u32>() {
            Ok(n) if n >= 1 => {
                g.tries = n;
                Applied::Yes
            }
            _ => Applied::Bad,
        },
        "use-http2" => flag(&mut g.http2),
        "enable-underscores-in-headers" => flag(&mut g.underscores),
        "allow-snippet-annotations" => {
            let r = flag(&mut g.snippets_allowed);
            if let Applied::Yes = r {
                return Applied::Different(
                    "snippet annotations are refused where they appear either way".into(),
                );
            }
            r
        }
        "client-header-timeout" | "client-body-timeout" | "keep-alive" => {
            let key = match name {
                "client-header-timeout" => "header_timeout",
                "client-body-timeout" => "body_timeout",
                _ => "keepalive_timeout",
            };
            match util::seconds(val) {
                Some(s) => {
                    g.server.push((key, s));
                    Applied::Yes
                }
                None => Applied::Bad,
            }
        }
        _ => Applied::No,
    }
}

/// The hsts-* keys rebuild the Strict-Transport-Security value.
fn hsts(name: &str, val: &str, b: Option<bool>, g: &mut Global) -> Applied {
    let Some(cur) = g.hsts.clone() else {
        return Applied::Yes; // hsts: false, the value is unused
    };
    let mut max_age = "31536000".to_string();
    let mut sub = cur.contains("includeSubDomains");
    let mut preload = cur.contains("preload");
    if let Some(m) = cur.strip_prefix("max-age=") {
        max_age = m.split(';').next().unwrap_or("31536000").to_string();
    }
    match (name, b) {
        ("hsts-max-age", _) if val.trim().parse::<u64>().is_ok() => max_age = val.trim().into(),
        ("hsts-include-subdomains", Some(x)) => sub = x,
        ("hsts-preload", Some(x)) => preload = x,
        _ => return Applied::Bad,
    }
    let mut v = format!("max-age={max_age}");
    if sub {
        v.push_str("; includeSubDomains");
    }
    if preload {
        v.push_str("; preload");
    }
    g.hsts = Some(v);
    Applied::Yes
}
