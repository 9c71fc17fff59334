//! Validation and compilation of [`super::file::FileConfig`] into a [`Snapshot`].

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use crate::router::RouteTarget;

use super::error::{ConfigError, Source};
use std::sync::Arc;

use super::file::{FileConfig, HealthSection, OutlierSection, RouteSection};
use super::{
    Backend, DurationValue, HashKey, ListenerSpec, RequestBuffering, Settings, Snapshot,
    UpstreamGroup, UpstreamProtocol,
};
use crate::limits::{parse_rate, ConcurrencyLimit, RateKey, RateLimiter, RouteLimits};
use crate::router::{HostMatch, Route, Router};
use crate::static_files::StaticRoute;
use crate::upstream::balancer::PolicyRegistry;
use crate::upstream::health::{BackendHealth, GroupHealth, HealthCheck, Outlier, MAX_BACKENDS};

/// Parses and compiles TOML text; `file` is only used to name the source in errors.
pub fn compile_str(
    file: &Path,
    text: &str,
    policies: &PolicyRegistry,
) -> Result<Snapshot, ConfigError> {
    let src = Source { file, text };
    let parsed: FileConfig = toml::from_str(text).map_err(|e| src.toml_error(&e))?;
    compile(&src, parsed, policies)
}

fn dur(v: &Option<DurationValue>, default: Duration) -> Duration {
    v.map_or(default, |d| d.0)
}

fn positive(
    src: &Source,
    v: &Option<Spanned<usize>>,
    key: &str,
    default: usize,
) -> Result<usize, ConfigError> {
    match v {
        None => Ok(default),
        Some(s) if *s.get_ref() == 0 => Err(src.error(s.span(), key, "must be at least 1")),
        Some(s) => Ok(*s.get_ref()),
    }
}

/// Resolves `host:port` (an IP literal, or a name resolved once at load time).
fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    if !addr.contains(':') {
        return Err(format!("invalid address {addr:?}: expected host:port"));
    }
    match addr.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| format!("address {addr:?} resolved to nothing")),
        Err(e) => Err(format!("invalid address {addr:?}: {e}")),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

fn compile(
    src: &Source,
    file: FileConfig,
    policies: &PolicyRegistry,
) -> Result<Snapshot, ConfigError> {
    let s = &file.server;
    let default_workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let settings = Settings {
        workers: positive(src, &s.workers, "server.workers", default_workers)?,
        header_timeout: dur(&s.header_timeout, Duration::from_secs(10)),
        keepalive_timeout: dur(&s.keepalive_timeout, Duration::from_secs(60)),
        max_header_bytes: positive(src, &s.max_header_bytes, "server.max_header_bytes", 65536)?,
        max_uri_bytes: positive(src, &s.max_uri_bytes, "server.max_uri_bytes", 8192)?,
        underscores_in_headers: s.underscores_in_headers.unwrap_or(false),
        shutdown_timeout: dur(&s.shutdown_timeout, Duration::from_secs(10)),
        send_timeout: dur(&s.send_timeout, Duration::from_secs(60)),
        body_timeout: dur(&s.body_timeout, Duration::from_secs(60)),
        request_buffering: match &s.request_buffering {
            None => RequestBuffering::Auto,
            Some(v) => match v.get_ref().as_str() {
                "auto" => RequestBuffering::Auto,
                "off" => RequestBuffering::Off,
                other => {
                    return Err(src.error(
                        v.span(),
                        "server.request_buffering",
                        format!("unknown value {other:?}: expected \"auto\" or \"off\""),
                    ))
                }
            },
        },
        log_level: s
            .log_level
            .as_ref()
            .map_or_else(|| "info".to_owned(), |l| l.get_ref().clone()),
        access_log: match &s.access_log {
            None => None,
            Some(a) => Some(compile_access_log(src, a)?),
        },
        admin: match &s.admin {
            None => None,
            Some(a) => {
                Some(resolve(a.get_ref()).map_err(|m| src.error(a.span(), "server.admin", m))?)
            }
        },
    };
    for (v, k) in [
        (&s.header_timeout, "server.header_timeout"),
        (&s.keepalive_timeout, "server.keepalive_timeout"),
        (&s.send_timeout, "server.send_timeout"),
        (&s.body_timeout, "server.body_timeout"),
    ] {
        if v.is_some_and(|d| d.0.is_zero()) {
            return Err(src.whole(format!("{k} must be greater than zero")));
        }
    }
    if settings.max_header_bytes < 256 {
        let span = s
            .max_header_bytes
            .as_ref()
            .map(|v| v.span())
            .unwrap_or(0..0);
        return Err(src.error(span, "server.max_header_bytes", "must be at least 256"));
    }
    if settings.workers > 1024 {
        let span = s.workers.as_ref().map(|v| v.span()).unwrap_or(0..0);
        return Err(src.error(span, "server.workers", "must be at most 1024"));
    }

    // Upstream groups, in name order (BTreeMap), addressed by index at run time.
    let mut upstreams = Vec::with_capacity(file.upstreams.len());
    let mut upstream_index = HashMap::new();
    for (name, section) in &file.upstreams {
        let key = format!("upstreams.{name}");
        if !valid_name(name) {
            return Err(src.error(
                section.span(),
                &key,
                "names use letters, digits, '_', '-' and '.'",
            ));
        }
        let u = section.get_ref();
        if u.servers.get_ref().is_empty() {
            return Err(src.error(
                u.servers.span(),
                format!("{key}.servers"),
                "needs at least one server",
            ));
        }
        if u.servers.get_ref().len() > MAX_BACKENDS {
            return Err(src.error(
                u.servers.span(),
                format!("{key}.servers"),
                format!("at most {MAX_BACKENDS} servers per upstream group"),
            ));
        }
        let mut backends = Vec::with_capacity(u.servers.get_ref().len());
        let mut schemes = (0, 0);
        for (i, entry) in u.servers.get_ref().iter().enumerate() {
            let ekey = format!("{key}.servers[{i}]");
            let e = entry.get_ref();
            let (https, hostport) =
                split_scheme(&e.addr).map_err(|m| src.error(entry.span(), &ekey, m))?;
            let addr = resolve(hostport).map_err(|m| src.error(entry.span(), &ekey, m))?;
            let weight = e.weight.unwrap_or(1);
            if weight == 0 {
                return Err(src.error(entry.span(), &ekey, "weight must be at least 1"));
            }
            let tls_name = if https {
                schemes.0 += 1;
                let name = match &u.tls_server_name {
                    Some(n) => n.get_ref().clone(),
                    None => host_of(hostport).to_string(),
                };
                Some(
                    rustls::pki_types::ServerName::try_from(name.clone()).map_err(|_| {
                        src.error(
                            entry.span(),
                            &ekey,
                            format!("{name:?} is not a valid TLS server name"),
                        )
                    })?,
                )
            } else {
                schemes.1 += 1;
                None
            };
            backends.push(Backend {
                addr,
                tls_name,
                weight,
            });
        }
        if schemes.0 > 0 && schemes.1 > 0 {
            return Err(src.error(
                u.servers.span(),
                format!("{key}.servers"),
                "mixes https:// and plain servers: use one scheme per upstream group",
            ));
        }
        let protocol = match u.protocol.as_ref().map(|p| (p, p.get_ref().as_str())) {
            None => UpstreamProtocol::Http1,
            Some((_, "http1")) => UpstreamProtocol::Http1,
            Some((p, "h2")) if schemes.0 == 0 => {
                return Err(src.error(
                    p.span(),
                    format!("{key}.protocol"),
                    "\"h2\" needs https:// servers (use \"h2c\" for HTTP/2 without TLS)",
                ))
            }
            Some((_, "h2")) => UpstreamProtocol::H2,
            Some((p, "h2c")) if schemes.0 > 0 => {
                return Err(src.error(
                    p.span(),
                    format!("{key}.protocol"),
                    "\"h2c\" is HTTP/2 without TLS: use \"h2\" for https:// servers",
                ))
            }
            Some((_, "h2c")) => UpstreamProtocol::H2c,
            Some((p, other)) => {
                return Err(src.error(
                    p.span(),
                    format!("{key}.protocol"),
                    format!("unknown protocol {other:?} (known: http1, h2, h2c)"),
                ))
            }
        };
        let tls = if schemes.0 > 0 {
            let ca = u.ca_file.as_ref().map(|c| (c, src.relative(c.get_ref())));
            let config = crate::tls::client_config(
                ca.as_ref().map(|(_, p)| p.as_path()),
                protocol == UpstreamProtocol::H2,
            )
            .map_err(|e| {
                let span = ca.as_ref().map(|(c, _)| c.span()).unwrap_or(section.span());
                src.error(span, format!("{key}.ca_file"), e.to_string())
            })?;
            Some(config)
        } else {
            if let Some(c) = &u.ca_file {
                return Err(src.error(
                    c.span(),
                    format!("{key}.ca_file"),
                    "only applies to https:// servers",
                ));
            }
            None
        };
        let policy_name = u
            .policy
            .as_ref()
            .map_or("round_robin", |p| p.get_ref().as_str());
        let policy = policies.get(policy_name).ok_or_else(|| {
            let span = u.policy.as_ref().map(|p| p.span()).unwrap_or(0..0);
            src.error(
                span,
                format!("{key}.policy"),
                format!(
                    "unknown policy {policy_name:?} (known: {})",
                    policies.names().join(", ")
                ),
            )
        })?;
        let keepalive = u.keepalive.as_ref().map_or(128, |k| *k.get_ref());
        let connect_timeout = dur(&u.connect_timeout, Duration::from_secs(2));
        let read_timeout = dur(&u.read_timeout, Duration::from_secs(30));
        let write_timeout = dur(&u.write_timeout, Duration::from_secs(30));
        for (v, k) in [
            (connect_timeout, "connect_timeout"),
            (read_timeout, "read_timeout"),
            (write_timeout, "write_timeout"),
        ] {
            if v.is_zero() {
                return Err(src.error(
                    section.span(),
                    format!("{key}.{k}"),
                    "must be greater than zero",
                ));
            }
        }
        let retry_budget = match &u.retry_budget {
            None => 0.2,
            Some(b) if !(0.0..=10.0).contains(b.get_ref()) => {
                return Err(src.error(
                    b.span(),
                    format!("{key}.retry_budget"),
                    "must be between 0 and 10",
                ))
            }
            Some(b) => *b.get_ref(),
        };
        let retry_on = match &u.retry_on {
            None => vec![502, 503, 504],
            Some(list) => {
                if let Some(bad) = list.get_ref().iter().find(|s| !(400..=599).contains(*s)) {
                    return Err(src.error(
                        list.span(),
                        format!("{key}.retry_on"),
                        format!("{bad}: only error statuses (400-599) can be retried"),
                    ));
                }
                list.get_ref().clone()
            }
        };
        let hash_key = match &u.hash_key {
            None => HashKey::ClientIp,
            Some(k) => parse_hash_key(k.get_ref())
                .map_err(|m| src.error(k.span(), format!("{key}.hash_key"), m))?,
        };
        let health_check = u
            .health
            .as_ref()
            .map(|h| compile_health(src, &format!("{key}.health"), h))
            .transpose()?;
        if let (Some(h), true) = (&u.health, protocol != UpstreamProtocol::Http1) {
            if let Some(path) = &h.get_ref().path {
                return Err(src.error(
                    path.span(),
                    format!("{key}.health.path"),
                    "HTTP checks speak HTTP/1.1: h2/h2c groups use connect checks (omit path)",
                ));
            }
        }
        let outlier = match &u.outlier {
            None => Outlier::default(),
            Some(o) => compile_outlier(src, &format!("{key}.outlier"), o)?,
        };
        let health = Arc::new(GroupHealth::new(
            backends
                .iter()
                .map(|b| Arc::new(BackendHealth::with_workers(b.addr, settings.workers)))
                .collect(),
        ));
        upstream_index.insert(name.clone(), upstreams.len());
        upstreams.push(UpstreamGroup {
            name: name.clone(),
            backends,
            policy,
            keepalive,
            connect_timeout,
            read_timeout,
            write_timeout,
            idle_timeout: dur(&u.idle_timeout, Duration::from_secs(60)),
            retries: u.retries.as_ref().map_or(2, |r| *r.get_ref()),
            retry_on,
            retry_budget,
            retry_body_limit: u.retry_body_limit.as_ref().map_or(65536, |r| *r.get_ref()),
            max_connections: u.max_connections.as_ref().map_or(0, |r| *r.get_ref()),
            uses_hash: u.hash_key.is_some() || policy_name == "consistent_hash",
            hash_key,
            health_check,
            outlier,
            health,
            protocol,
            tls,
        });
    }

    // Listeners, then the routes that attach to them.
    if file.listeners.is_empty() {
        return Err(src.whole("no listeners: add a [listeners.NAME] table with an addr"));
    }
    let mut listeners = Vec::with_capacity(file.listeners.len());
    let mut seen_addrs: HashMap<SocketAddr, &str> = HashMap::new();
    for (name, section) in &file.listeners {
        let key = format!("listeners.{name}");
        if !valid_name(name) {
            return Err(src.error(
                section.span(),
                &key,
                "names use letters, digits, '_', '-' and '.'",
            ));
        }
        let a = &section.get_ref().addr;
        let addr =
            resolve(a.get_ref()).map_err(|m| src.error(a.span(), format!("{key}.addr"), m))?;
        if addr.port() != 0 {
            if let Some(other) = seen_addrs.insert(addr, name) {
                return Err(src.error(
                    a.span(),
                    format!("{key}.addr"),
                    format!("address {addr} is already used by listener {other:?}"),
                ));
            }
        }
        let l = section.get_ref();
        let http2_set = l.http2.as_ref().map(|h| *h.get_ref());
        let http2 = http2_set.unwrap_or(l.tls.is_some());
        let tls = match &l.tls {
            None => None,
            Some(t) => Some(compile_tls(
                src,
                &format!("{key}.tls"),
                t,
                section.span(),
                http2,
            )?),
        };
        let streams = l
            .h2_max_concurrent_streams
            .as_ref()
            .map_or(128, |v| *v.get_ref());
        if streams == 0 {
            let span = l
                .h2_max_concurrent_streams
                .as_ref()
                .map(|v| v.span())
                .unwrap_or(0..0);
            return Err(src.error(
                span,
                format!("{key}.h2_max_concurrent_streams"),
                "must be at least 1",
            ));
        }
        listeners.push(ListenerSpec {
            name: name.clone(),
            addr,
            router: Router::default(),
            max_connections: l.max_connections.as_ref().map_or(0, |m| *m.get_ref()),
            tls,
            http2,
            h2_max_concurrent_streams: streams,
            upgrade_idle_timeout: dur(&l.upgrade_idle_timeout, Duration::from_secs(600)),
        });
    }

    // The admin socket uses SO_REUSEPORT too (for upgrades), so on a listener's address it
    // would silently share that listener's port instead of failing to bind.
    if let (Some(admin), Some(spanned)) = (settings.admin, &s.admin) {
        if let Some(other) = seen_addrs.get(&admin) {
            return Err(src.error(
                spanned.span(),
                "server.admin",
                format!("address {admin} is already used by listener {other:?}"),
            ));
        }
    }
    for (i, route) in file.routes.iter().enumerate() {
        compile_route(src, i, route, &upstream_index, &mut listeners)?;
    }
    for l in &mut listeners {
        l.router.finish();
    }
    let warnings = admin_warnings(src, s, &settings);
    Ok(Snapshot {
        settings,
        listeners,
        upstreams,
        warnings,
    })
}

/// The admin endpoint has no authentication: on anything but loopback it shows backend
/// addresses and metrics to whoever can reach it, and lets them trigger reloads. Valid (a
/// firewalled private address can be deliberate), but worth saying.
fn admin_warnings(
    src: &Source,
    s: &super::file::ServerSection,
    settings: &Settings,
) -> Vec<String> {
    let (Some(addr), Some(spanned)) = (settings.admin, &s.admin) else {
        return Vec::new();
    };
    if addr.ip().to_canonical().is_loopback() {
        return Vec::new();
    }
    vec![src.warning(
        spanned.span(),
        "server.admin",
        &format!(
            "{addr} is not a loopback address: the admin endpoint has no authentication, \
             and anyone who can reach it sees backend addresses and metrics and can POST \
             /reload; bind it to 127.0.0.1 (or ::1), or make sure a firewall keeps others out"
        ),
    )]
}

fn compile_route(
    src: &Source,
    i: usize,
    route: &Spanned<RouteSection>,
    upstream_index: &HashMap<String, usize>,
    listeners: &mut [ListenerSpec],
) -> Result<(), ConfigError> {
    let key = format!("routes[{i}]");
    let r = route.get_ref();
    let upstream = match (&r.upstream, &r.root) {
        (Some(_), Some(root)) => {
            return Err(src.error(
                root.span(),
                format!("{key}.root"),
                "a route has either upstream (proxy) or root (files), not both",
            ))
        }
        (None, None) => {
            return Err(src.error(
                route.span(),
                &key,
                "needs upstream = \"NAME\" (proxy) or root = \"DIR\" (files)",
            ))
        }
        (Some(up), None) => Some(*upstream_index.get(up.get_ref()).ok_or_else(|| {
            src.error(
                up.span(),
                format!("{key}.upstream"),
                format!(
                    "upstream {:?} is not defined (add [upstreams.{}])",
                    up.get_ref(),
                    up.get_ref()
                ),
            )
        })?),
        (None, Some(_)) => None,
    };
    let host = match &r.host {
        None => HostMatch::Any,
        Some(h) => HostMatch::parse(h.get_ref())
            .map_err(|m| src.error(h.span(), format!("{key}.host"), m))?,
    };
    let path = match &r.path {
        None => "/".to_owned(),
        Some(p) if !p.get_ref().starts_with('/') => {
            return Err(src.error(p.span(), format!("{key}.path"), "must start with '/'"));
        }
        Some(p) => p.get_ref().clone(),
    };
    let files = match &r.root {
        Some(root) => Some(Arc::new(compile_files(src, &key, r, root, &path)?)),
        None => {
            file_only_keys(src, &key, r)?;
            None
        }
    };
    let compiled = Route {
        index: i,
        host,
        path,
        target: match (files, upstream) {
            (Some(files), _) => RouteTarget::Files(files),
            (None, Some(upstream)) => RouteTarget::Proxy {
                upstream,
                compress: r.compress.as_ref().is_some_and(|c| *c.get_ref()),
            },
            (None, None) => unreachable!("checked above: a route has a root or an upstream"),
        },
        limits: compile_limits(src, &key, r)?,
    };
    match &r.listener {
        None => {
            if listeners.iter().any(|l| l.router.has(&compiled)) {
                return Err(src.error(
                    route.span(),
                    &key,
                    "duplicate route: same host and path as an earlier route",
                ));
            }
            listeners
                .iter_mut()
                .for_each(|l| l.router.add(compiled.clone()));
        }
        Some(name) => {
            let l = listeners
                .iter_mut()
                .find(|l| &l.name == name.get_ref())
                .ok_or_else(|| {
                    src.error(
                        name.span(),
                        format!("{key}.listener"),
                        format!("listener {:?} is not defined", name.get_ref()),
                    )
                })?;
            if l.router.has(&compiled) {
                return Err(src.error(
                    route.span(),
                    &key,
                    "duplicate route: same listener, host and path as an earlier route",
                ));
            }
            l.router.add(compiled);
        }
    }
    Ok(())
}

/// Default memory for a file route's cache of contents and compressed variants.
const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Compiles the file-serving keys of a route with `root`. A relative root is taken from the
/// config file's directory; it must exist and be a directory now.
fn compile_files(
    src: &Source,
    key: &str,
    r: &RouteSection,
    root: &Spanned<String>,
    prefix: &str,
) -> Result<StaticRoute, ConfigError> {
    let configured = root.get_ref();
    let base = src.file.parent().unwrap_or(Path::new(""));
    let dir = base.join(configured);
    let root_err = |m: String| src.error(root.span(), format!("{key}.root"), m);
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(root_err(format!("{configured:?} is not a directory"))),
        Err(e) => return Err(root_err(format!("{configured:?}: {}", io_reason(&e)))),
    }
    let cache_bytes = r
        .cache_bytes
        .as_ref()
        .map_or(DEFAULT_CACHE_BYTES, |c| *c.get_ref());
    let mut files = StaticRoute::new(prefix, &dir, cache_bytes)
        .map_err(|e| root_err(format!("{configured:?}: {}", io_reason(&e))))?;
    let names =
        |v: &Option<Spanned<Vec<String>>>, k: &str| -> Result<Option<Vec<String>>, ConfigError> {
            let Some(list) = v else { return Ok(None) };
            for name in list.get_ref() {
                if name.is_empty() || name.split('/').any(|s| s == "..") || name.contains('\\') {
                    return Err(src.error(
                        list.span(),
                        format!("{key}.{k}"),
                        format!("{name:?}: use a relative name without \"..\""),
                    ));
                }
            }
            Ok(Some(list.get_ref().clone()))
        };
    if let Some(index) = names(&r.index, "index")? {
        if index.iter().any(|n| n.contains('/')) {
            let span = r.index.as_ref().map_or(0..0, |i| i.span());
            return Err(src.error(
                span,
                format!("{key}.index"),
                "index names are file names, without '/'",
            ));
        }
        files.index = index;
    }
    if let Some(t) = names(&r.try_files, "try_files")? {
        files.try_files = t;
    }
    if let Some(cc) = &r.cache_control {
        let v = cc.get_ref();
        if v.is_empty() || v.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err(src.error(
                cc.span(),
                format!("{key}.cache_control"),
                "must be a non-empty header value without control characters",
            ));
        }
        files.cache_control = Some(bytes::Bytes::from(v.clone()));
    }
    let flag =
        |v: &Option<Spanned<bool>>, default: bool| v.as_ref().map_or(default, |b| *b.get_ref());
    files.browse = flag(&r.browse, false);
    files.follow_symlinks = flag(&r.follow_symlinks, false);
    files.allow_hidden = flag(&r.allow_hidden, false);
    files.compress = flag(&r.compress, true);
    files.precompressed = flag(&r.precompressed, true);
    Ok(files)
}

/// Refuses file-route keys on a proxied route (they would silently do nothing).
fn file_only_keys(src: &Source, key: &str, r: &RouteSection) -> Result<(), ConfigError> {
    let spans = [
        ("index", r.index.as_ref().map(|v| v.span())),
        ("try_files", r.try_files.as_ref().map(|v| v.span())),
        ("cache_control", r.cache_control.as_ref().map(|v| v.span())),
        ("browse", r.browse.as_ref().map(|v| v.span())),
        (
            "follow_symlinks",
            r.follow_symlinks.as_ref().map(|v| v.span()),
        ),
        ("allow_hidden", r.allow_hidden.as_ref().map(|v| v.span())),
        ("precompressed", r.precompressed.as_ref().map(|v| v.span())),
        ("cache_bytes", r.cache_bytes.as_ref().map(|v| v.span())),
    ];
    match spans.into_iter().find_map(|(k, s)| s.map(|s| (k, s))) {
        Some((k, span)) => Err(src.error(
            span,
            format!("{key}.{k}"),
            "only applies to a route with root (file serving)",
        )),
        None => Ok(()),
    }
}

/// An I/O error's reason without the OS error number (stable across systems, for messages).
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such directory".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    }
}

fn parse_hash_key(s: &str) -> Result<HashKey, String> {
    match s {
        "client_ip" => Ok(HashKey::ClientIp),
        "path" => Ok(HashKey::Path),
        _ => match s.split_once(':') {
            Some(("header", h)) if !h.is_empty() => Ok(HashKey::Header(h.to_ascii_lowercase())),
            Some(("cookie", c)) if !c.is_empty() => Ok(HashKey::Cookie(c.to_owned())),
            _ => Err(format!(
                "invalid hash_key {s:?}: use \"client_ip\", \"path\", \"header:NAME\" or \"cookie:NAME\""
            )),
        },
    }
}

fn compile_health(
    src: &Source,
    key: &str,
    h: &Spanned<HealthSection>,
) -> Result<HealthCheck, ConfigError> {
    let s = h.get_ref();
    let path = match &s.path {
        Some(p) if !p.get_ref().starts_with('/') => {
            return Err(src.error(p.span(), format!("{key}.path"), "must start with '/'"));
        }
        p => p.as_ref().map(|p| p.get_ref().clone()),
    };
    let expect_status = match &s.expect_status {
        None => 200..=399,
        Some(e) => {
            let text = e.get_ref().trim();
            let (lo, hi) = text.split_once('-').unwrap_or((text, text));
            match (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
                (Ok(lo), Ok(hi)) if (100..=599).contains(&lo) && lo <= hi && hi <= 599 => lo..=hi,
                _ => {
                    return Err(src.error(
                        e.span(),
                        format!("{key}.expect_status"),
                        format!("invalid status range {text:?}: use \"200\" or \"200-399\""),
                    ))
                }
            }
        }
    };
    let count = |v: &Option<Spanned<u32>>, k: &str| -> Result<u32, ConfigError> {
        match v {
            None => Ok(2),
            Some(c) if *c.get_ref() == 0 => {
                Err(src.error(c.span(), format!("{key}.{k}"), "must be at least 1"))
            }
            Some(c) => Ok(*c.get_ref()),
        }
    };
    let interval = dur(&s.interval, Duration::from_secs(1));
    let timeout = dur(&s.timeout, Duration::from_millis(500));
    if interval.is_zero() || timeout.is_zero() {
        return Err(src.error(
            h.span(),
            key,
            "interval and timeout must be greater than zero",
        ));
    }
    Ok(HealthCheck {
        path,
        host: s.host.as_ref().map(|h| h.get_ref().clone()),
        interval,
        timeout,
        healthy: count(&s.healthy, "healthy")?,
        unhealthy: count(&s.unhealthy, "unhealthy")?,
        expect_status,
    })
}

fn compile_outlier(
    src: &Source,
    key: &str,
    o: &Spanned<OutlierSection>,
) -> Result<Outlier, ConfigError> {
    let s = o.get_ref();
    let d = Outlier::default();
    let pct = match &s.max_ejected_percent {
        Some(p) if *p.get_ref() > 100 => {
            return Err(src.error(
                p.span(),
                format!("{key}.max_ejected_percent"),
                "must be at most 100",
            ));
        }
        p => p.as_ref().map_or(d.max_ejected_percent, |p| *p.get_ref()),
    };
    Ok(Outlier {
        consecutive_failures: s
            .consecutive_failures
            .as_ref()
            .map_or(d.consecutive_failures, |c| *c.get_ref()),
        base_ejection: dur(&s.base_ejection, d.base_ejection),
        max_ejection: dur(&s.max_ejection, d.max_ejection),
        max_ejected_percent: pct,
        on_5xx: s.on_5xx.unwrap_or(d.on_5xx),
    })
}

fn compile_limits(src: &Source, key: &str, r: &RouteSection) -> Result<RouteLimits, ConfigError> {
    let mut limits = RouteLimits::default();
    if let Some(max) = &r.max_concurrency {
        if *max.get_ref() == 0 || *max.get_ref() > 1 << 30 {
            return Err(src.error(
                max.span(),
                format!("{key}.max_concurrency"),
                "must be between 1 and 2^30",
            ));
        }
        let queue = r.queue.as_ref().map_or(0, |q| *q.get_ref());
        let timeout = dur(&r.queue_timeout, Duration::from_secs(1));
        limits.concurrency = Some(Arc::new(ConcurrencyLimit::new(
            *max.get_ref(),
            queue,
            timeout,
        )));
    } else if let Some(q) = &r.queue {
        return Err(src.error(q.span(), format!("{key}.queue"), "needs max_concurrency"));
    }
    if let Some(rl) = &r.rate_limit {
        let s = rl.get_ref();
        let per_second = parse_rate(s.rate.get_ref())
            .map_err(|m| src.error(s.rate.span(), format!("{key}.rate_limit.rate"), m))?;
        let rate_key = match s.key.as_ref().map(|k| (k.get_ref().as_str(), k.span())) {
            None | Some(("client_ip", _)) => RateKey::ClientIp,
            Some(("route", _)) => RateKey::Route,
            Some((k, span)) => match k.strip_prefix("header:") {
                Some(h) if !h.is_empty() => RateKey::Header(h.to_ascii_lowercase()),
                _ => {
                    return Err(src.error(
                        span,
                        format!("{key}.rate_limit.key"),
                        format!(
                            "invalid key {k:?}: use \"client_ip\", \"route\" or \"header:NAME\""
                        ),
                    ))
                }
            },
        };
        let burst = s
            .burst
            .as_ref()
            .map_or_else(|| per_second.ceil().max(1.0) as u32, |b| *b.get_ref());
        let max_keys = s.max_keys.as_ref().map_or(100_000, |m| *m.get_ref());
        limits.rate = Some(Arc::new(RateLimiter::new(
            per_second, burst, rate_key, max_keys,
        )));
    }
    Ok(limits)
}

fn compile_access_log(
    src: &Source,
    a: &Spanned<super::file::AccessLogSection>,
) -> Result<crate::access_log::AccessLogConfig, ConfigError> {
    use crate::access_log::{AccessLogConfig, Format};
    let s = a.get_ref();
    let format = match s.format.as_ref().map(|f| (f.get_ref().as_str(), f.span())) {
        None | Some(("combined", _)) => Format::Combined,
        Some(("json", _)) => Format::Json,
        Some((f, span)) => {
            return Err(src.error(
                span,
                "server.access_log.format",
                format!("unknown format {f:?}: use \"combined\" or \"json\""),
            ))
        }
    };
    let path = s.path.get_ref();
    if path.is_empty() {
        return Err(src.error(
            s.path.span(),
            "server.access_log.path",
            "must not be empty (or use \"stdout\")",
        ));
    }
    Ok(AccessLogConfig {
        path: (path != "stdout").then(|| path.into()),
        format,
        buffer: s.buffer.as_ref().map_or(8192, |b| *b.get_ref()),
    })
}

/// Splits an optional `http://` or `https://` scheme off a server address.
fn split_scheme(addr: &str) -> Result<(bool, &str), String> {
    if let Some(rest) = addr.strip_prefix("https://") {
        return Ok((true, rest.trim_end_matches('/')));
    }
    if let Some(rest) = addr.strip_prefix("http://") {
        return Ok((false, rest.trim_end_matches('/')));
    }
    if addr.contains("://") {
        return Err(format!(
            "unsupported scheme in {addr:?} (use http:// or https://)"
        ));
    }
    Ok((false, addr))
}

/// The host part of `host:port` (brackets removed from an IPv6 literal).
fn host_of(hostport: &str) -> &str {
    let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Loads a listener's certificates and builds its rustls config.
/// Loads `cert` and `key` of the table `table`. An error points at the line of the file it
/// is about: a missing, unreadable or mismatched key at `key = `, anything else at `cert = `.
fn load_pair(
    src: &Source,
    table: &str,
    cert: &Spanned<String>,
    key: &Spanned<String>,
) -> Result<rustls::sign::CertifiedKey, ConfigError> {
    let (cert_path, key_path) = (src.relative(cert.get_ref()), src.relative(key.get_ref()));
    crate::tls::load_certified_key(&cert_path, &key_path).map_err(|e| {
        if e.is_about_key(&cert_path, &key_path) {
            src.error(key.span(), format!("{table}.key"), e.to_string())
        } else {
            src.error(cert.span(), format!("{table}.cert"), e.to_string())
        }
    })
}

fn compile_tls(
    src: &Source,
    key: &str,
    t: &crate::config::file::TlsSection,
    span: std::ops::Range<usize>,
    http2: bool,
) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    let mut entries = Vec::new();
    match (&t.cert, &t.key) {
        (Some(c), Some(k)) => {
            let ck = load_pair(src, key, c, k)?;
            entries.push(crate::tls::CertEntry {
                hosts: Vec::new(),
                key: Arc::new(ck),
            });
        }
        (Some(c), None) => {
            return Err(src.error(c.span(), format!("{key}.key"), "cert needs a key"))
        }
        (None, Some(k)) => {
            return Err(src.error(k.span(), format!("{key}.cert"), "key needs a cert"))
        }
        (None, None) => {}
    }
    for (i, c) in t.certs.iter().enumerate() {
        let ckey = format!("{key}.certs[{i}]");
        let e = c.get_ref();
        if e.hosts.get_ref().is_empty() {
            return Err(src.error(
                e.hosts.span(),
                format!("{ckey}.hosts"),
                "needs at least one host name",
            ));
        }
        for h in e.hosts.get_ref() {
            let bare = h.strip_prefix("*.").unwrap_or(h);
            if bare.is_empty()
                || bare.contains('*')
                || rustls::pki_types::ServerName::try_from(bare).is_err()
            {
                return Err(src.error(
                    e.hosts.span(),
                    format!("{ckey}.hosts"),
                    format!("{h:?} is not a host name (exact, or *.domain)"),
                ));
            }
        }
        let ck = load_pair(src, &ckey, &e.cert, &e.key)?;
        entries.push(crate::tls::CertEntry {
            hosts: e.hosts.get_ref().clone(),
            key: Arc::new(ck),
        });
    }
    if entries.is_empty() {
        return Err(src.error(
            span.clone(),
            key,
            "needs cert and key, or [[...tls.certs]] entries",
        ));
    }
    crate::tls::server_config(entries, http2)
        .map_err(|e| src.error(span.clone(), key, e.to_string()))
}
