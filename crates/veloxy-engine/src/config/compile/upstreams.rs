//! `[upstreams.NAME]`: upstream groups with their backends, client TLS, retries, active health
//! checks and outlier ejection.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::{absolute, dur, resolve, valid_name};
use crate::config::error::{ConfigError, Source};
use crate::config::file::{HealthSection, OutlierSection, ServerEntry, UpstreamSection};
use crate::config::{Backend, HashKey, UpstreamGroup, UpstreamProtocol};
use crate::upstream::addr::BackendAddr;
use crate::upstream::balancer::{Policy, PolicyRegistry};
use crate::upstream::group::{Discovery, DiscoveryName};
use crate::upstream::health::{BackendHealth, GroupHealth, HealthCheck, Outlier, MAX_BACKENDS};

/// Compiles every group, in name order (the file's BTreeMap), with the index each name has at
/// run time: routes address their group by index.
pub(super) fn compile_upstreams(
    src: &Source,
    sections: &BTreeMap<String, Spanned<UpstreamSection>>,
    policies: &PolicyRegistry,
    workers: usize,
) -> Result<(Vec<UpstreamGroup>, HashMap<String, usize>), ConfigError> {
    let mut upstreams = Vec::with_capacity(sections.len());
    let mut upstream_index = HashMap::new();
    for (name, section) in sections {
        let group = compile_group(src, name, section, policies, workers)?;
        upstream_index.insert(name.clone(), upstreams.len());
        upstreams.push(group);
    }
    Ok((upstreams, upstream_index))
}

fn compile_group(
    src: &Source,
    name: &str,
    section: &Spanned<UpstreamSection>,
    policies: &PolicyRegistry,
    workers: usize,
) -> Result<UpstreamGroup, ConfigError> {
    let key = format!("upstreams.{name}");
    if !valid_name(name) {
        return Err(src.error(
            section.span(),
            &key,
            "names use letters, digits, '_', '-' and '.'",
        ));
    }
    let u = section.get_ref();
    let (backends, mut discovery) = compile_backends(src, &key, u)?;
    let search = match &u.search {
        None => None,
        Some(s) => {
            let (group, entry) =
                super::search::upstream_search(src, &key, s, &backends, !discovery.is_empty())?;
            discovery.extend(entry);
            Some(group)
        }
    };
    let https = backends.iter().any(|b| b.tls_name.is_some())
        || discovery.iter().any(|d| d.tls_name.is_some());
    let protocol = compile_protocol(src, &key, u, https)?;
    let fastcgi = protocol == UpstreamProtocol::Fastcgi;
    let tls = client_tls(src, &key, u, section.span(), https, protocol)?;
    // `client_tls` refused a ca_file on plain servers, so one here belongs to `tls`.
    let ca_file = u
        .ca_file
        .as_ref()
        .map(|c| absolute(&src.relative(c.get_ref())));
    let (policy_name, policy) = compile_policy(src, &key, u, policies)?;
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
    let (retry_budget, retry_on) = compile_retry(src, &key, u)?;
    let hash_key = match &u.hash_key {
        None => HashKey::ClientIp,
        Some(k) => parse_hash_key(k.get_ref())
            .map_err(|m| src.error(k.span(), format!("{key}.hash_key"), m))?,
    };
    let health_check = compile_active_health(src, &key, u, protocol)?;
    let outlier = match &u.outlier {
        None => Outlier::default(),
        Some(o) => compile_outlier(src, &format!("{key}.outlier"), o)?,
    };
    let sticky = compile_sticky(&key, name, u, &backends);
    let proxy_protocol = match u
        .proxy_protocol
        .as_ref()
        .map(|p| (p.get_ref().as_str(), p.span()))
    {
        None => 0,
        Some(("v1", _)) => 1,
        Some(("v2", _)) => 2,
        Some((other, span)) => {
            return Err(src.error(
                span,
                format!("{key}.proxy_protocol"),
                format!("{other:?}: use \"v1\" or \"v2\""),
            ))
        }
    };
    let health = Arc::new(GroupHealth::new(
        backends
            .iter()
            .map(|b| Arc::new(BackendHealth::with_workers(b.addr.clone(), workers)))
            .collect(),
    ));
    Ok(UpstreamGroup {
        name: name.to_owned(),
        file_backends: backends.clone().into(),
        backends,
        discovery,
        policy,
        // A php-fpm child serves one connection until it closes: idle pooled FastCGI
        // connections hold children, and a worker's idle ones can starve another worker's
        // requests (and every other client of the pool). So FastCGI groups keep none unless
        // told (nginx's default too), and close a surplus at once.
        keepalive: u
            .keepalive
            .as_ref()
            .map_or(if fastcgi { 0 } else { 128 }, |k| *k.get_ref()),
        pool_purge_delay: dur(
            &u.pool_purge_delay,
            if fastcgi {
                Duration::ZERO
            } else {
                Duration::from_secs(1)
            },
        ),
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
        tls_server_name: u.tls_server_name.as_ref().map(|n| n.get_ref().clone()),
        ca_file,
        tls_verify: u.tls_verify.as_ref().is_none_or(|v| *v.get_ref()),
        location_rewrite: u.location_rewrite.as_ref().is_some_and(|b| *b.get_ref()),
        keep_runtime_overrides: match u.runtime_overrides.as_ref() {
            None => false,
            Some(v) => match v.get_ref().as_str() {
                "reset" => false,
                "keep" => true,
                _ => {
                    return Err(src.error(
                        v.span(),
                        format!("upstreams.{name}.runtime_overrides"),
                        "use \"reset\" (the default) or \"keep\"",
                    ))
                }
            },
        },
        sticky,
        proxy_protocol,
        search,
    })
}

/// The group's `servers`: fixed addresses resolved now, `dns`/`srv` entries kept for the
/// run time, weights checked, one scheme for all.
fn compile_backends(
    src: &Source,
    key: &str,
    u: &UpstreamSection,
) -> Result<(Vec<Backend>, Vec<Discovery>), ConfigError> {
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
    let mut discovery = Vec::new();
    let tls_server_name = u.tls_server_name.as_ref().map(|n| n.get_ref().as_str());
    for (i, entry) in u.servers.get_ref().iter().enumerate() {
        let ekey = format!("{key}.servers[{i}]");
        let e = entry.get_ref();
        let weight = e.weight.unwrap_or(1);
        if weight == 0 {
            return Err(src.error(entry.span(), &ekey, "weight must be at least 1"));
        }
        if e.dns.is_some() || e.srv.is_some() {
            let mut d = compile_discovery(e, weight, tls_server_name)
                .map_err(|m| src.error(entry.span(), &ekey, m))?;
            d.backup = e.backup;
            discovery.push(d);
            continue;
        }
        let mut b = match e.addr.strip_prefix("unix:") {
            Some(path) => unix_backend(src, entry.span(), &ekey, path, weight)?,
            None => backend_at(&e.addr, weight, tls_server_name)
                .map_err(|m| src.error(entry.span(), &ekey, m))?,
        };
        b.backup = e.backup;
        backends.push(b);
    }
    let primaries = backends.iter().filter(|b| !b.backup).count()
        + discovery.iter().filter(|d| !d.backup).count();
    if primaries == 0 {
        return Err(src.error(
            u.servers.span(),
            format!("{key}.servers"),
            "every server is a backup: a backup stands in for others (drop backup = true)",
        ));
    }
    // One scheme per group: every server and discovered name TLS, or none.
    let tls = backends.iter().map(|b| b.tls_name.is_some());
    let tls: Vec<bool> = tls
        .chain(discovery.iter().map(|d| d.tls_name.is_some()))
        .collect();
    if tls.contains(&true) && tls.contains(&false) {
        return Err(src.error(
            u.servers.span(),
            format!("{key}.servers"),
            "mixes https:// and plain servers: use one scheme per upstream group",
        ));
    }
    Ok((backends, discovery))
}

/// A backend at `[https://]host:port`, the host resolved now (also used by the runtime API's
/// `PUT`). `tls_server_name` overrides the TLS name of `https://` servers.
pub(crate) fn backend_at(
    addr: &str,
    weight: u32,
    tls_server_name: Option<&str>,
) -> Result<Backend, String> {
    let (https, hostport) = split_scheme(addr)?;
    let resolved = resolve(hostport)?;
    let tls_name = if https {
        let name = tls_server_name.unwrap_or_else(|| host_of(hostport));
        Some(
            rustls::pki_types::ServerName::try_from(name.to_owned())
                .map_err(|_| format!("{name:?} is not a valid TLS server name"))?,
        )
    } else {
        None
    };
    Ok(Backend {
        addr: BackendAddr::Tcp(resolved),
        server: hostport.to_owned(),
        tls_name,
        weight,
        backup: false,
    })
}

/// A server set at run time (the runtime API's `PUT`, the Kubernetes provider's in-place
/// changes) for `group`: [`backend_at`] with the group's TLS name, and the group's scheme.
pub(crate) fn runtime_backend(
    group: &crate::config::UpstreamGroup,
    addr: &str,
    weight: u32,
) -> Result<Backend, String> {
    let b = backend_at(addr, weight, group.tls_server_name.as_deref())?;
    if b.tls_name.is_some() != group.tls.is_some() {
        return Err(format!(
            "the group's servers are {}",
            match group.tls.is_some() {
                true => "https://",
                false => "plain (no https://)",
            }
        ));
    }
    Ok(b)
}

/// A `dns = "[https://]host:port"` or `srv = "_service._proto.name"` entry.
fn compile_discovery(
    e: &ServerEntry,
    weight: u32,
    tls_server_name: Option<&str>,
) -> Result<Discovery, String> {
    let every = match &e.resolve {
        None => Duration::from_secs(10),
        Some(r) => crate::config::parse_duration(r).map_err(|m| format!("resolve: {m}"))?,
    };
    if every < Duration::from_millis(100) {
        return Err("resolve: at least 100ms".into());
    }
    let (name, https, host) = if let Some(dns) = &e.dns {
        let (https, hostport) = split_scheme(dns)?;
        let (host, port) = hostport
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("dns: {dns:?} is not host:port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok() {
            return Err(format!(
                "dns: {host:?} is not a name: use addr for an address"
            ));
        }
        let name = DiscoveryName::Dns {
            host: host.to_owned(),
            port,
        };
        (name, https, host.to_owned())
    } else {
        let srv = e.srv.as_deref().unwrap_or_default();
        let (https, name) = split_scheme(srv)?;
        if !name.starts_with('_') || name.contains(':') {
            return Err(format!(
                "srv: {name:?} is not a service name such as \"_http._tcp.app.internal\""
            ));
        }
        (DiscoveryName::Srv(name.to_owned()), https, name.to_owned())
    };
    let tls_name = if https {
        let n = tls_server_name.unwrap_or(&host).to_owned();
        rustls::pki_types::ServerName::try_from(n.clone())
            .map_err(|_| format!("{n:?} is not a valid TLS server name"))?;
        Some(n)
    } else {
        None
    };
    Ok(Discovery {
        name,
        every,
        weight,
        tls_name,
        backup: false,
    })
}

fn compile_protocol(
    src: &Source,
    key: &str,
    u: &UpstreamSection,
    https: bool,
) -> Result<UpstreamProtocol, ConfigError> {
    match u.protocol.as_ref().map(|p| (p, p.get_ref().as_str())) {
        None => Ok(UpstreamProtocol::Http1),
        Some((_, "http1")) => Ok(UpstreamProtocol::Http1),
        Some((p, "h2")) if !https => Err(src.error(
            p.span(),
            format!("{key}.protocol"),
            "\"h2\" needs https:// servers (use \"h2c\" for HTTP/2 without TLS)",
        )),
        Some((_, "h2")) => Ok(UpstreamProtocol::H2),
        Some((p, "h2c")) if https => Err(src.error(
            p.span(),
            format!("{key}.protocol"),
            "\"h2c\" is HTTP/2 without TLS: use \"h2\" for https:// servers",
        )),
        Some((_, "h2c")) => Ok(UpstreamProtocol::H2c),
        Some((p, "fastcgi")) if https => Err(src.error(
            p.span(),
            format!("{key}.protocol"),
            "FastCGI servers are plain (host:port or unix:PATH), not https://",
        )),
        Some((_, "fastcgi")) => Ok(UpstreamProtocol::Fastcgi),
        Some((p, other)) => Err(src.error(
            p.span(),
            format!("{key}.protocol"),
            format!("unknown protocol {other:?} (known: http1, h2, h2c, fastcgi)"),
        )),
    }
}

/// The client TLS config of a group of `https://` servers (`ca_file`, or the system roots).
fn client_tls(
    src: &Source,
    key: &str,
    u: &UpstreamSection,
    section_span: Range<usize>,
    https: bool,
    protocol: UpstreamProtocol,
) -> Result<Option<Arc<rustls::ClientConfig>>, ConfigError> {
    let verify = u.tls_verify.as_ref().filter(|v| !*v.get_ref());
    if !https {
        if let Some(c) = &u.ca_file {
            return Err(src.error(
                c.span(),
                format!("{key}.ca_file"),
                "only applies to https:// servers",
            ));
        }
        if let Some(v) = verify {
            return Err(src.error(
                v.span(),
                format!("{key}.tls_verify"),
                "only applies to https:// servers",
            ));
        }
        return Ok(None);
    }
    if let Some(v) = verify {
        if u.ca_file.is_some() {
            return Err(src.error(
                v.span(),
                format!("{key}.tls_verify"),
                "tls_verify = false checks no certificate: remove ca_file, or keep the check",
            ));
        }
        return Ok(Some(crate::tls::client_config_unverified(
            protocol == UpstreamProtocol::H2,
        )));
    }
    let ca = u.ca_file.as_ref().map(|c| (c, src.relative(c.get_ref())));
    let config = crate::tls::client_config(
        ca.as_ref().map(|(_, p)| p.as_path()),
        protocol == UpstreamProtocol::H2,
    )
    .map_err(|e| {
        let span = ca.as_ref().map(|(c, _)| c.span()).unwrap_or(section_span);
        src.error(span, format!("{key}.ca_file"), e.to_string())
    })?;
    Ok(Some(config))
}

/// The balancing policy by name, and that name (`consistent_hash` turns hashing on).
fn compile_policy<'a>(
    src: &Source,
    key: &str,
    u: &'a UpstreamSection,
    policies: &PolicyRegistry,
) -> Result<(&'a str, Arc<dyn Policy>), ConfigError> {
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
    Ok((policy_name, policy))
}

/// `retry_budget` and `retry_on`.
fn compile_retry(
    src: &Source,
    key: &str,
    u: &UpstreamSection,
) -> Result<(f64, Vec<u16>), ConfigError> {
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
    Ok((retry_budget, retry_on))
}

/// `[upstreams.NAME.health]`, refusing HTTP checks (a `path`) on HTTP/2 groups.
fn compile_active_health(
    src: &Source,
    key: &str,
    u: &UpstreamSection,
    protocol: UpstreamProtocol,
) -> Result<Option<HealthCheck>, ConfigError> {
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
                "HTTP checks speak HTTP/1.1: h2, h2c and fastcgi groups use connect checks (omit path)",
            ));
        }
    }
    Ok(health_check)
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

/// Splits an optional `http://` or `https://` scheme off a server address.
/// `unix:PATH`: a unix-socket backend, its path relative to the config file's folder.
/// The socket need not exist yet (the application may start after veloxy): a missing one is
/// a failed connection, like a TCP backend that is down.
fn unix_backend(
    src: &Source,
    span: Range<usize>,
    ekey: &str,
    path: &str,
    weight: u32,
) -> Result<Backend, ConfigError> {
    if path.is_empty() {
        return Err(src.error(
            span,
            ekey,
            "\"unix:\" needs a socket path, as in \"unix:/run/app.sock\"",
        ));
    }
    if weight == 0 {
        return Err(src.error(span, ekey, "weight must be at least 1"));
    }
    let full = absolute(&src.relative(path));
    Ok(Backend {
        addr: BackendAddr::Unix(full.into()),
        server: format!("unix:{path}"),
        tls_name: None,
        weight,
        backup: false,
    })
}

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

/// `sticky`: each backend's token is derived from the group's name and its address.
fn compile_sticky(
    _key: &str,
    name: &str,
    u: &UpstreamSection,
    backends: &[Backend],
) -> Option<crate::upstream::group::Sticky> {
    let s = u.sticky.as_ref()?.get_ref();
    let mut sticky = crate::upstream::group::Sticky::new(
        s.cookie.clone().unwrap_or_else(|| "veloxy_srv".to_owned()),
        s.ttl.map_or(Duration::from_secs(3600), |d| d.0),
        s.secure.unwrap_or(false),
        s.http_only.unwrap_or(true),
    );
    sticky.set_backends(name, backends);
    Some(sticky)
}
