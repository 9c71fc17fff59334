//! `[server]`: process-wide [`Settings`], the access log, and the admin endpoint's warning.

use std::time::Duration;

use super::{dur, positive, resolve};
use crate::access_log::{AccessLogConfig, Format};
use crate::config::error::{ConfigError, Source};
use crate::config::file::{AccessLogSection, ServerSection};
use crate::config::{RequestBuffering, Settings};
use toml::Spanned;

/// Compiles `[server]`, filling in the defaults documented on [`Settings`].
pub(super) fn compile_settings(src: &Source, s: &ServerSection) -> Result<Settings, ConfigError> {
    let default_workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let settings = Settings {
        workers: positive(src, &s.workers, "server.workers", default_workers)?,
        header_timeout: dur(&s.header_timeout, Duration::from_secs(10)),
        keepalive_timeout: dur(&s.keepalive_timeout, Duration::from_secs(60)),
        park_idle_after: dur(&s.park_idle_after, Duration::from_secs(1)),
        max_header_bytes: positive(src, &s.max_header_bytes, "server.max_header_bytes", 65536)?,
        max_uri_bytes: positive(src, &s.max_uri_bytes, "server.max_uri_bytes", 8192)?,
        underscores_in_headers: s.underscores_in_headers.unwrap_or(false),
        shutdown_timeout: dur(&s.shutdown_timeout, Duration::from_secs(10)),
        send_timeout: dur(&s.send_timeout, Duration::from_secs(60)),
        body_timeout: dur(&s.body_timeout, Duration::from_secs(60)),
        request_buffering: request_buffering(src, &s.request_buffering)?,
        request_id: request_id(src, &s.request_id)?,
        real_ip: real_ip(src, s)?,
        log_level: s
            .log_level
            .as_ref()
            .map_or_else(|| "info".to_owned(), |l| l.get_ref().clone()),
        access_log: match &s.access_log {
            None => None,
            Some(a) => Some(compile_access_log(src, a)?),
        },
        acme: None,
        redis: None,
        tracing: None,
        kubernetes: None,
        resolvers: resolvers(src, &s.resolvers)?,
        admin_token: admin_token(src, s)?,
        admin: match &s.admin {
            None => None,
            Some(a) => {
                Some(resolve(a.get_ref()).map_err(|m| src.error(a.span(), "server.admin", m))?)
            }
        },
    };
    check_limits(src, s, &settings)?;
    Ok(settings)
}

/// `resolvers = ["127.0.0.1:53", "10.0.0.2"]`: addresses, port 53 unless given.
fn resolvers(
    src: &Source,
    list: &Option<Spanned<Vec<String>>>,
) -> Result<Vec<std::net::SocketAddr>, ConfigError> {
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    list.get_ref()
        .iter()
        .map(|r| {
            r.parse::<std::net::SocketAddr>()
                .or_else(|_| r.parse::<std::net::IpAddr>().map(|ip| (ip, 53).into()))
                .map_err(|_| {
                    src.error(
                        list.span(),
                        "server.resolvers",
                        format!("{r:?} is not an IP address (with an optional :port)"),
                    )
                })
        })
        .collect()
}

/// `trusted_proxies` and `client_ip_header`.
fn real_ip(src: &Source, s: &ServerSection) -> Result<Option<crate::access::RealIp>, ConfigError> {
    let Some(list) = &s.trusted_proxies else {
        if let Some(h) = &s.client_ip_header {
            return Err(src.error(
                h.span(),
                "server.client_ip_header",
                "needs trusted_proxies: the header is only believed from them",
            ));
        }
        return Ok(None);
    };
    let trusted = crate::access::IpList::parse(list.get_ref())
        .map_err(|m| src.error(list.span(), "server.trusted_proxies", m))?;
    let header = match &s.client_ip_header {
        None => "x-forwarded-for".to_owned(),
        Some(h) => {
            if http::HeaderName::from_bytes(h.get_ref().as_bytes()).is_err() {
                return Err(src.error(
                    h.span(),
                    "server.client_ip_header",
                    format!("{:?} is not a header field name", h.get_ref()),
                ));
            }
            h.get_ref().to_ascii_lowercase()
        }
    };
    Ok(Some(crate::access::RealIp { trusted, header }))
}

/// `[server] request_id = "X-Request-Id"`: the field that carries request IDs.
fn request_id(src: &Source, v: &Option<Spanned<String>>) -> Result<Option<String>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let name = v.get_ref();
    if name.is_empty() || http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(src.error(
            v.span(),
            "server.request_id",
            format!("{name:?} is not a header field name"),
        ));
    }
    Ok(Some(name.clone()))
}

fn request_buffering(
    src: &Source,
    v: &Option<Spanned<String>>,
) -> Result<RequestBuffering, ConfigError> {
    let Some(v) = v else {
        return Ok(RequestBuffering::Auto);
    };
    match v.get_ref().as_str() {
        "auto" => Ok(RequestBuffering::Auto),
        "off" => Ok(RequestBuffering::Off),
        other => Err(src.error(
            v.span(),
            "server.request_buffering",
            format!("unknown value {other:?}: expected \"auto\" or \"off\""),
        )),
    }
}

/// `io = "epoll" | "io_uring"` (issue 18's switch). The io_uring data path was built as an
/// experiment and measured 9-13% more CPU per request than epoll while removing 95-97% of the
/// syscalls (`bench/uring-experiment`), so only epoll is built; `"io_uring"` is accepted and
/// served with epoll, the fallback the switch names for where io_uring is unavailable, with a
/// warning saying so. Any other value is an error.
pub(super) fn io_mode(src: &Source, s: &ServerSection) -> Result<Option<String>, ConfigError> {
    let Some(io) = &s.io else {
        return Ok(None);
    };
    match io.get_ref().as_str() {
        "epoll" => Ok(None),
        "io_uring" => Ok(Some(src.warning(
            io.span(),
            "server.io",
            "io_uring is not built in (it measured 9-13% more CPU per request than epoll: \
             bench/uring-experiment); serving with epoll",
        ))),
        other => Err(src.error(
            io.span(),
            "server.io",
            format!("unknown value {other:?}: expected \"epoll\" or \"io_uring\""),
        )),
    }
}

/// Range checks that need the compiled values (zero timeouts, the smallest head, most workers).
fn check_limits(src: &Source, s: &ServerSection, settings: &Settings) -> Result<(), ConfigError> {
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
    Ok(())
}

fn compile_access_log(
    src: &Source,
    a: &Spanned<AccessLogSection>,
) -> Result<AccessLogConfig, ConfigError> {
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

/// The admin endpoint has no authentication: on anything but loopback it shows backend
/// addresses and metrics to whoever can reach it, and lets them trigger reloads. Valid (a
/// firewalled private address can be deliberate), but worth saying.
/// An admin endpoint on a non-loopback address needs `admin_token_file`; with one, it is
/// served over plain HTTP, so the token crosses the network in clear text: a warning (at
/// `check` and `run`) says so, and how to keep it off the wire (loopback, or a TLS listener
/// in front of the admin endpoint).
pub(super) fn check_admin_exposure(
    src: &Source,
    s: &ServerSection,
    settings: &Settings,
) -> Result<Option<String>, ConfigError> {
    let (Some(addr), Some(spanned)) = (settings.admin, &s.admin) else {
        return Ok(None);
    };
    if addr.ip().to_canonical().is_loopback() {
        return Ok(None);
    }
    if settings.admin_token.is_some() {
        return Ok(Some(src.warning(
            spanned.span(),
            "server.admin",
            &format!(
                "{addr} is not a loopback address and the admin endpoint speaks plain HTTP: its \
                 bearer token crosses the network in clear text, readable by anyone on the path; \
                 bind it to 127.0.0.1 and reach it through an SSH tunnel, or put a TLS listener \
                 with a route to it in front"
            ),
        )));
    }
    Err(src.error(
        spanned.span(),
        "server.admin",
        format!(
            "{addr} is not a loopback address: set [server] admin_token_file (a bearer token \
             every admin request must carry), or bind the admin endpoint to 127.0.0.1 (or ::1)"
        ),
    ))
}

/// `[server.redis]`: the URL with its credentials (a `password_file` is read now).
pub(super) fn compile_redis(
    src: &Source,
    s: &ServerSection,
) -> Result<Option<crate::fleet::redis::RedisSpec>, ConfigError> {
    let Some(section) = &s.redis else {
        return Ok(None);
    };
    let r = section.get_ref();
    let key = |k: &str| format!("server.redis.{k}");
    let mut url = url_parts(r.url.get_ref()).ok_or_else(|| {
        src.error(
            r.url.span(),
            key("url"),
            "use redis://host:port/db or rediss://...",
        )
    })?;
    let password = match (&r.password, &r.password_file) {
        (Some(_), Some(f)) => {
            return Err(src.error(
                f.span(),
                key("password_file"),
                "give password or password_file, not both",
            ))
        }
        (Some(p), None) => Some(p.get_ref().clone()),
        (None, Some(f)) => {
            let path = src.relative(f.get_ref());
            let text = std::fs::read_to_string(&path).map_err(|e| {
                src.error(
                    f.span(),
                    key("password_file"),
                    format!("{}: {e}", path.display()),
                )
            })?;
            Some(text.trim_end_matches(['\r', '\n']).to_owned())
        }
        (None, None) => None,
    };
    if let Some(p) = password {
        let user = r.username.as_ref().map_or("", |u| u.get_ref().as_str());
        let enc = |v: &str| crate::static_files::path::percent_encode_keeping(v, b"");
        url.1 = format!("{}:{}@", enc(user), enc(&p));
    }
    let pool = match &r.pool {
        Some(p) if *p.get_ref() == 0 => {
            return Err(src.error(p.span(), key("pool"), "must be at least 1"))
        }
        Some(p) => *p.get_ref(),
        None => 8,
    };
    let ca_pem = match &r.ca_file {
        None => None,
        Some(_) if url.0 != "rediss://" => {
            let span = r.ca_file.as_ref().map_or(0..0, |c| c.span());
            return Err(src.error(span, key("ca_file"), "only applies to rediss:// URLs"));
        }
        Some(c) => {
            let path = src.relative(c.get_ref());
            let pem = std::fs::read(&path).map_err(|e| {
                src.error(c.span(), key("ca_file"), format!("{}: {e}", path.display()))
            })?;
            let mut reader = &pem[..];
            let certs = rustls_pemfile_certs(&mut reader);
            if certs == 0 {
                return Err(src.error(
                    c.span(),
                    key("ca_file"),
                    format!("{}: no PEM certificates", path.display()),
                ));
            }
            Some((pem, super::absolute(&path)))
        }
    };
    let (ca_pem, ca_file) = ca_pem.unzip();
    Ok(Some(crate::fleet::redis::RedisSpec {
        url: format!("{}{}{}", url.0, url.1, url.2),
        timeout: dur(&r.timeout, Duration::from_millis(50)),
        pool,
        ca_pem,
        ca_file,
    }))
}

/// How many PEM certificates `reader` holds.
fn rustls_pemfile_certs(reader: &mut &[u8]) -> usize {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_reader_iter(reader)
        .filter(Result::is_ok)
        .count()
}

/// (`redis://`, userinfo with `@`, the rest).
fn url_parts(url: &str) -> Option<(String, String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "redis" && scheme != "rediss" {
        return None;
    }
    let (user, host) = match rest.split_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    (!host.is_empty()).then(|| (format!("{scheme}://"), user, host.to_owned()))
}

/// `admin_token_file`: its first line, at least 16 characters.
fn admin_token(src: &Source, s: &ServerSection) -> Result<Option<String>, ConfigError> {
    let Some(f) = &s.admin_token_file else {
        return Ok(None);
    };
    let path = src.relative(f.get_ref());
    let text = std::fs::read_to_string(&path).map_err(|e| {
        src.error(
            f.span(),
            "server.admin_token_file",
            format!("{}: {e}", path.display()),
        )
    })?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.len() < 16 {
        return Err(src.error(
            f.span(),
            "server.admin_token_file",
            "the token must be at least 16 characters",
        ));
    }
    Ok(Some(token))
}
