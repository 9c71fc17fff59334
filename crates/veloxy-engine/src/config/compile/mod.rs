//! Validation and compilation of the serde structs of `config::file` into a [`Snapshot`].
//!
//! One submodule per section of the file: `server` (`[server]`), `upstreams`
//! (`[upstreams.NAME]`), `listeners` (`[listeners.NAME]` and TLS) and `routes`
//! (`[[routes]]`). Sections are compiled in that order because later ones refer to earlier
//! ones: backends' health state is sized by the worker count, routes name upstream groups
//! and listeners.

mod acme;
mod cache;
mod chunks;
mod early_hints;
mod expand;
mod fastcgi;
mod grpc_web;
mod http3;
mod listeners;
mod mirror;
mod providers;
pub(crate) mod reuse;
mod routes;
mod rules;
mod runs;
mod search;
mod server;
mod tracing;
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
    compile_str_after(file, text, policies, None)
}

/// Like [`compile_str`], for a reload: the route entries whose text is unchanged since
/// `previous` was compiled (and whose context is) are not parsed nor compiled again but
/// taken from it (see [`reuse`]). The result is the snapshot a full compile makes.
pub fn compile_str_after(
    file: &Path,
    text: &str,
    policies: &PolicyRegistry,
    previous: Option<&Snapshot>,
) -> Result<Snapshot, ConfigError> {
    let src = Source {
        file,
        text,
        base: 0,
    };
    let cut = reuse::Cut::of(file, text);
    let plan = previous
        .zip(cut.as_ref())
        .and_then(|(prev, cut)| reuse::Plan::new(prev, cut));
    let taken = plan.as_ref().map_or(0, |p| p.reused().count());
    // A large file: its routes parsed a run at a time (see `runs`), unless ACME, which reads
    // every route's host from the parsed file, is configured.
    if let Some(cut) = cut
        .as_ref()
        .filter(|_| text.len() >= crate::heap::TRIM_AFTER_CONFIG_BYTES)
    {
        let entries = match &plan {
            Some(plan) => plan.entries(),
            None => cut.entries().map(|span| (span, None)).collect(),
        };
        let rest = reuse::blank(text, entries.iter().map(|(span, _)| span.clone()));
        if !rest.contains("acme") {
            let runs = runs::Runs { entries };
            let mode = (plan.as_ref(), Some(&runs));
            if let Some(done) = compile_text(&src, rest.into(), policies, mode)? {
                return Ok(with_reuse(Some(cut), done, taken));
            }
        }
    }
    if let Some(plan) = &plan {
        let mode = (Some(plan), None);
        if let Some(done) = compile_text(&src, plan.blanked(text).into(), policies, mode)? {
            return Ok(with_reuse(cut.as_ref(), done, taken));
        }
    }
    let done = compile_text(
        &src,
        std::borrow::Cow::Borrowed(text),
        policies,
        (None, None),
    )?;
    let done = done.ok_or_else(|| src.whole("internal: no snapshot"))?;
    Ok(with_reuse(cut.as_ref(), done, 0))
}

/// How a compile takes the route entries: some from a reuse plan, and the rest from the
/// parsed file or parsed here a run at a time.
type Mode<'a> = (Option<&'a reuse::Plan<'a>>, Option<&'a runs::Runs>);

/// The snapshot with its reuse record (see [`reuse::Reuse::build`]).
fn with_reuse(
    cut: Option<&reuse::Cut>,
    (mut snapshot, routes): (Snapshot, usize),
    taken: usize,
) -> Snapshot {
    snapshot.reuse = cut
        .and_then(|cut| reuse::Reuse::build(cut, (routes, taken), &snapshot))
        .map(std::sync::Arc::new);
    snapshot
}

/// Parses `parse` (the text, or with a `plan` the text with its reused entries blanked)
/// and compiles it: the snapshot and the number of route entries in the file. `None`: the
/// plan does not fit, compile the whole text.
fn compile_text(
    src: &Source,
    parse: std::borrow::Cow<'_, str>,
    policies: &PolicyRegistry,
    (plan, runs): Mode,
) -> Result<Option<(Snapshot, usize)>, ConfigError> {
    let mut parsed: FileConfig = toml::from_str(&parse).map_err(|e| src.toml_error(&e))?;
    drop(parse);
    let mut entries = parsed.routes.len();
    if let Some(runs) = runs {
        if entries != 0 {
            return Ok(None);
        }
        entries = runs.entries.len();
    } else if let Some(plan) = plan {
        if entries != plan.fresh_count() {
            return Ok(None);
        }
        entries += plan.reused().count();
    }
    expand::expand(src, &mut parsed)?;
    if let (Some(plan), None) = (plan, runs) {
        for o in &mut parsed.route_origin {
            *o = plan.ordinal(*o);
        }
    }
    if src.text.len() < crate::heap::TRIM_AFTER_CONFIG_BYTES {
        return Ok(compile(src, &parsed, policies, (plan, runs))?.map(|s| (s, entries)));
    }
    // A large config: the TOML document and the file's sections (100,000 routes: about
    // 150 MB) are garbage once compiled, and freed in between the snapshot's own allocations
    // they would stay resident as holes. So the snapshot is built on a thread of its own,
    // which allocates from its own malloc arena; the parse's arena is then wholly free and
    // given back. 100,000 routes: 163 MB resident after loading, 60 MB this way.
    let compiled = std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("veloxy-compile".into())
            .spawn_scoped(scope, || compile(src, &parsed, policies, (plan, runs)));
        match thread {
            Ok(t) => t
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: compiled here, and only the holes stay.
            Err(_) => compile(src, &parsed, policies, (plan, runs)),
        }
    });
    drop(parsed);
    crate::heap::trim();
    Ok(compiled?.map(|s| (s, entries)))
}

/// Compiles the parsed file; `None` when a reused route does not fit (see [`reuse`]).
fn compile(
    src: &Source,
    file: &FileConfig,
    policies: &PolicyRegistry,
    (plan, runs): Mode,
) -> Result<Option<Snapshot>, ConfigError> {
    let s = &file.server;
    let mut settings = server::compile_settings(src, s)?;
    let io_warning = server::io_mode(src, s)?;
    let (upstreams, upstream_index) =
        upstreams::compile_upstreams(src, &file.upstreams, policies, settings.workers)?;
    // One slot for the runtime's certificate store, shared by every TLS listener.
    let certs = crate::late::Late::<dyn crate::tls::LiveCerts>::empty();
    let (mut listeners, seen_addrs) = listeners::compile_listeners(src, &file.listeners, &certs)?;
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
    let caches = cache::compile_caches(src, file)?;
    let redis_spec = server::compile_redis(src, s)?;
    let redis = redis_spec
        .as_ref()
        .map(|_| crate::late::Late::<crate::fleet::redis::RedisClient>::empty());
    settings.tracing = tracing::compile_tracing(src, s)?;
    let tracer = settings
        .tracing
        .as_ref()
        .map(|_| crate::late::Late::<crate::otel::Exporter>::empty());
    let groups = (&upstream_index, &upstreams[..]);
    let caches_in = (&caches, redis.as_ref());
    let compiled = match runs {
        Some(runs) => runs::compile_runs(
            src,
            (runs, plan, file),
            groups,
            caches_in,
            &mut listeners,
            settings.tracing.as_ref(),
        )?,
        None => {
            tracing::check_routes(
                src,
                (&file.routes, &file.route_origin),
                settings.tracing.as_ref(),
            )?;
            routes::compile_routes(
                src,
                (&file.routes, &file.route_origin),
                groups,
                caches_in,
                &mut listeners,
                plan,
            )?
        }
    };
    let Ok(reused_groups) = compiled else {
        return Ok(None);
    };
    compile_streams(src, file, &upstream_index, &mut listeners)?;
    settings.acme = acme::compile_acme(src, file, &mut listeners, redis_spec.as_ref())?;
    // ACME reads every route's host: it needs the whole file.
    if (plan.is_some() || runs.is_some()) && settings.acme.is_some() {
        return Ok(None);
    }
    settings.redis = redis_spec;
    http3::compile_http3(src, file, &settings, &mut listeners)?;
    let (kubernetes, provider_warnings) = providers::compile_providers(src, file, &listeners)?;
    settings.kubernetes = kubernetes;
    let mut warnings: Vec<String> = io_warning.into_iter().chain(admin_warning).collect();
    warnings.extend(provider_warnings);
    warnings.extend(acme::unserved_names(src, file, &listeners));
    let reused_groups = reused_groups.iter().map(|&g| upstreams[g].name.as_str());
    warnings.extend(unused_groups(src, file, reused_groups));
    warnings.extend(file.upstreams.iter().filter_map(|(name, g)| {
        let v = g.get_ref().tls_verify.as_ref().filter(|v| !*v.get_ref())?;
        Some(src.warning(
            v.span(),
            &format!("upstreams.{name}.tls_verify"),
            "the servers' certificates are not checked: anyone on the path to them can \
             impersonate them (give their CA with ca_file instead)",
        ))
    }));
    warnings.extend(foreign_variables(src, src.text));
    let live = crate::config::LiveSpecs {
        redis,
        tracer,
        caches: cache::store_specs(caches),
        certs,
    };
    Ok(Some(Snapshot {
        settings,
        listeners,
        upstreams: upstreams.into_iter().map(std::sync::Arc::new).collect(),
        warnings,
        live,
        reuse: None,
    }))
}

/// A warning for each upstream group that no route, stream, forward_auth or mirror names: most often
/// a typo in the name that does refer to it, or a leftover of a port.
fn unused_groups<'a>(
    src: &Source,
    file: &'a FileConfig,
    reused: impl Iterator<Item = &'a str>,
) -> Vec<String> {
    let mut used: std::collections::HashSet<&str> = reused.collect();
    for r in &file.routes {
        let r = r.get_ref();
        used.extend(r.upstream.as_ref().map(|u| u.get_ref().as_str()));
        used.extend(
            r.forward_auth
                .as_ref()
                .map(|f| f.get_ref().upstream.get_ref().as_str()),
        );
        let mirrors = r.mirror.iter().flat_map(|m| &m.get_ref().0);
        used.extend(mirrors.map(|m| m.upstream.get_ref().as_str()));
    }
    used.extend(
        file.streams
            .iter()
            .map(|s| s.get_ref().upstream.get_ref().as_str()),
    );
    file.upstreams
        .iter()
        .filter(|(name, _)| !used.contains(name.as_str()))
        .map(|(name, g)| {
            src.warning(
                g.span(),
                &format!("upstreams.{name}"),
                "no route, stream, forward_auth or mirror uses this group (a misspelt name?)",
            )
        })
        .collect()
}

/// Warnings for values that look like nginx or Apache variables (`$host`, `$remote_addr`,
/// `${VAR}`) inside quoted strings: veloxy sends them literally. Each names the veloxy
/// template variable to write instead, where there is one.
fn foreign_variables(src: &Source, text: &str) -> Vec<String> {
    const KNOWN: &[(&str, &str)] = &[
        ("host", "{host}"),
        ("http_host", "{authority}"),
        ("remote_addr", "{client_ip}"),
        ("remote_port", "{client_port}"),
        ("server_port", "{server_port}"),
        ("scheme", "{scheme}"),
        ("request_uri", "{uri}"),
        ("uri", "{path}"),
        ("document_uri", "{path}"),
        ("args", "{query}"),
        ("is_args", "{is_args}"),
        ("query_string", "{query}"),
        ("request_method", "{method}"),
        ("request_id", "{request_id}"),
        (
            "proxy_add_x_forwarded_for",
            "nothing: veloxy sets X-Forwarded-For itself",
        ),
    ];
    let mut out = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        if !line.contains('$') {
            continue;
        }
        let code = line.split('#').next().unwrap_or("");
        let Some(eq) = code.find('=') else { continue };
        let key = code[..eq].trim().trim_matches('"');
        // `try_files` has its own `$uri` (the request path), as nginx's.
        if key == "try_files" {
            continue;
        }
        let value = &code[eq + 1..];
        let mut rest = value;
        while let Some(i) = rest.find('$') {
            let after = &rest[i + 1..];
            let name: String = after
                .trim_start_matches('{')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = after;
            if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                continue;
            }
            let braced = after.starts_with('{');
            let lower = name.to_ascii_lowercase();
            let hint = if let Some((_, v)) = KNOWN.iter().find(|(n, _)| *n == lower) {
                format!("write {v}")
            } else if let Some(h) = lower.strip_prefix("http_") {
                format!("write {{header.{}}}", h.replace('_', "-"))
            } else if let Some(a) = lower.strip_prefix("arg_") {
                format!("write {{query.{a}}}")
            } else if let Some(c) = lower.strip_prefix("cookie_") {
                format!("write {{cookie.{c}}}")
            } else if braced
                || name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
            {
                "veloxy does not expand environment variables in its config: write the value"
                    .to_owned()
            } else {
                continue;
            };
            let shown = if braced {
                format!("${{{name}}}")
            } else {
                format!("${name}")
            };
            let at = start + eq + 1 + (value.len() - rest.len()) - 1;
            out.push(src.warning(
                at..at + 1,
                key,
                &format!(
                    "{shown} looks like an nginx/Apache variable and is sent literally; {hint}"
                ),
            ));
        }
    }
    out
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
/// needs exactly one without `sni` or some with (none with `[providers.kubernetes]`, whose
/// Gateway TCPRoutes and TLSRoutes bring them).
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
            if l.tls.is_none() && !l.tcp {
                return Err(src.error(
                    sni.span(),
                    format!("{key}.sni"),
                    format!(
                        "listener {name:?} needs TLS (or protocol = \"tcp\"): SNI passthrough \
                         reads the ClientHello"
                    ),
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
            return Err(src.error(
                s.span(),
                key,
                "a tcp listener has one [[streams]] entry without sni (its default)",
            ));
        }
        l.stream = Some(index);
    }
    // With the Kubernetes provider, a tcp listener may wait for its streams (a Gateway's
    // TCP or TLS listener, their routes): meanwhile its connections are closed.
    let provided = file
        .providers
        .as_ref()
        .is_some_and(|p| p.kubernetes.is_some());
    if let Some(l) = listeners
        .iter()
        .find(|l| !provided && l.tcp && l.stream.is_none() && l.sni_streams.is_empty())
    {
        let span = file.listeners.get(&l.name).map_or(0..0, |s| s.span());
        return Err(src.error(
            span,
            format!("listeners.{}", l.name),
            "a tcp listener needs a [[streams]] entry naming it",
        ));
    }
    Ok(())
}
