//! Validation and compilation of the serde structs of `config::file` into a [`Snapshot`].
//!
//! One submodule per section of the file: `server` (`[server]`), `upstreams`
//! (`[upstreams.NAME]`), `listeners` (`[listeners.NAME]` and TLS) and `routes`
//! (`[[routes]]`). Sections are compiled in that order because later ones refer to earlier
//! ones: backends' health state is sized by the worker count, routes name upstream groups
//! and listeners.

mod acme;
mod cache;
mod http3;
mod listeners;
mod routes;
mod rules;
mod search;
mod server;
pub(crate) mod upstreams;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::error::{ConfigError, Source};
use super::file::FileConfig;
use super::{DurationValue, Snapshot};
use crate::upstream::balancer::PolicyRegistry;

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

fn compile(
    src: &Source,
    file: FileConfig,
    policies: &PolicyRegistry,
) -> Result<Snapshot, ConfigError> {
    let s = &file.server;
    let settings = server::compile_settings(src, s)?;
    let io_warning = server::io_mode(src, s)?;
    let (upstreams, upstream_index) =
        upstreams::compile_upstreams(src, &file.upstreams, policies, settings.workers)?;
    let (mut listeners, seen_addrs) = listeners::compile_listeners(src, &file.listeners)?;
    listeners::check_admin_addr(src, s, &settings, &seen_addrs)?;
    let admin_warning = server::check_admin_exposure(src, s, &settings)?;
    if settings.real_ip.is_none() {
        if let Some((name, l)) = file.listeners.iter().find(|(_, l)| {
            l.get_ref()
                .proxy_protocol
                .as_ref()
                .is_some_and(|p| *p.get_ref())
        }) {
            let span = l
                .get_ref()
                .proxy_protocol
                .as_ref()
                .map_or(0..0, |p| p.span());
            return Err(src.error(
                span,
                format!("listeners.{name}.proxy_protocol"),
                "needs [server] trusted_proxies: only those peers may send a PROXY header",
            ));
        }
    }
    let caches = cache::compile_caches(src, &file)?;
    let redis_spec = server::compile_redis(src, s)?;
    let redis = redis_spec.as_ref().map(crate::fleet::redis::client);
    routes::compile_routes(
        src,
        &file.routes,
        (&upstream_index, &upstreams),
        (&caches, redis.as_ref()),
        &mut listeners,
    )?;
    compile_streams(src, &file, &upstream_index, &mut listeners)?;
    let mut settings = settings;
    settings.acme = acme::compile_acme(src, &file, &mut listeners, redis_spec.as_ref())?;
    settings.redis = redis_spec;
    http3::compile_http3(src, &file, &settings, &mut listeners)?;
    let mut warnings: Vec<String> = io_warning.into_iter().chain(admin_warning).collect();
    warnings.extend(acme::unserved_names(src, &file, &listeners));
    Ok(Snapshot {
        settings,
        listeners,
        upstreams,
        warnings,
    })
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
/// `:PORT` means every IPv4 address (`0.0.0.0:PORT`), as in Caddy and Go.
fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Some(port) = addr.strip_prefix(':') {
        if let Ok(p) = port.parse::<u16>() {
            return Ok(SocketAddr::from(([0, 0, 0, 0], p)));
        }
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

/// `path` made absolute from the current directory (relative config paths have already been
/// joined to the config file's directory by [`Source::relative`]). Not canonicalized: a
/// symlink such as `/etc/letsencrypt/live/NAME/cert.pem` must stay one, or a renewal that
/// moves its target would be missed.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// `[[streams]]`: each names a tcp listener and the group it relays to; every tcp listener
/// needs exactly one.
fn compile_streams(
    src: &Source,
    file: &FileConfig,
    upstream_index: &std::collections::HashMap<String, usize>,
    listeners: &mut [super::ListenerSpec],
) -> Result<(), ConfigError> {
    for (i, s) in file.streams.iter().enumerate() {
        let key = format!("streams[{i}]");
        let st = s.get_ref();
        let name = st.listener.get_ref();
        let l = listeners
            .iter_mut()
            .find(|l| &l.name == name)
            .ok_or_else(|| {
                src.error(
                    st.listener.span(),
                    format!("{key}.listener"),
                    format!("listener {name:?} is not defined"),
                )
            })?;
        let up = st.upstream.get_ref();
        let &index = upstream_index.get(up).ok_or_else(|| {
            src.error(
                st.upstream.span(),
                format!("{key}.upstream"),
                format!("upstream {up:?} is not defined (add [upstreams.{up}])"),
            )
        })?;
        if let Some(sni) = &st.sni {
            if l.tls.is_none() {
                return Err(src.error(
                    sni.span(),
                    format!("{key}.sni"),
                    format!("listener {name:?} needs TLS: SNI passthrough reads the ClientHello"),
                ));
            }
            for host in sni.get_ref() {
                let m = crate::router::HostMatch::parse(host)
                    .map_err(|m| src.error(sni.span(), format!("{key}.sni"), m))?;
                l.sni_streams.push((m, index));
            }
            continue;
        }
        if !l.tcp {
            return Err(src.error(
                st.listener.span(),
                format!("{key}.listener"),
                format!(
                    "listener {name:?} needs protocol = \"tcp\" (or sni = [...] on a TLS listener)"
                ),
            ));
        }
        if l.stream.is_some() {
            return Err(src.error(s.span(), key, "a tcp listener has one [[streams]] entry"));
        }
        l.stream = Some(index);
    }
    if let Some(l) = listeners.iter().find(|l| l.tcp && l.stream.is_none()) {
        let span = file.listeners.get(&l.name).map_or(0..0, |s| s.span());
        return Err(src.error(
            span,
            format!("listeners.{}", l.name),
            "a tcp listener needs a [[streams]] entry naming it",
        ));
    }
    Ok(())
}
