//! The admin endpoint (`[server] admin = "127.0.0.1:9900"`, off unless set), on its own thread:
//!
//! * `GET /metrics`: Prometheus text format ([`crate::metrics`]).
//! * `GET /healthz`: 200 `ok`, or 503 while shutting down.
//! * `GET /upstreams`: JSON, per upstream group and backend: usable or not, active-check
//!   state, ejection, open connections, consecutive failures, and what each worker last
//!   published (in flight, idle pooled connections, latency EWMA).
//! * `POST /reload`: asks the process to reload its config file (the same path as SIGHUP);
//!   answers 200 when the new config is live, 400 with the error when it was refused.
//!
//! It never touches the workers' request path: it reads shared atomics and sums per-worker
//! counters. One request per connection; requests are small and rare.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::accept::{self, LogLimiter};
use crate::runtime::Shared;

/// A reload asked for through the admin endpoint; the owner of the config file answers.
pub struct ReloadRequest {
    pub reply: oneshot::Sender<Result<String, String>>,
}

pub(crate) fn spawn(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    reloads: mpsc::Sender<ReloadRequest>,
) -> std::io::Result<()> {
    crate::background::spawn("veloxy-admin", move || async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return tracing::error!(error = %e, "admin: cannot listen"),
        };
        accept_loop(listener, shared, reloads).await;
    })
}

/// Descriptors the admin endpoint keeps in reserve (`/dev/null` opened at start), so that
/// `/healthz` and `/metrics` answer while a flood holds every other descriptor.
const RESERVE: usize = 2;

/// Accepts admin connections for as long as the process runs. A failed accept (out of
/// descriptors, say) is waited out, never the end of the endpoint: `/healthz` and
/// `/metrics` matter most while something is wrong. Out of descriptors, a reserved one is
/// given up for the connection, and taken back when it ends: its socket's descriptor number
/// becomes the reserve again (`dup2` of `/dev/null` over it), so no other thread can take
/// the slot in between.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    reloads: mpsc::Sender<ReloadRequest>,
) {
    let mut log = LogLimiter::new(accept::LOG_INTERVAL);
    // What a reserved descriptor refers to: kept open, so taking a slot back needs no new one.
    let null = std::fs::File::open("/dev/null").ok().map(Arc::new);
    let reserve = Arc::new(std::sync::Mutex::new(
        (0..RESERVE)
            .filter_map(|_| std::fs::File::open("/dev/null").ok())
            .map(std::os::fd::OwnedFd::from)
            .collect::<Vec<_>>(),
    ));
    loop {
        let accepted = match listener.accept().await {
            Err(e) if is_fd_shortage(&e) => {
                let spare = reserve.lock().ok().and_then(|mut r| r.pop());
                match spare {
                    Some(fd) => {
                        drop(fd);
                        listener.accept().await.map(|a| (a, true))
                    }
                    None => Err(e),
                }
            }
            other => other.map(|a| (a, false)),
        };
        match accepted {
            Ok(((mut stream, _), reserved)) => {
                let (shared, reloads) = (shared.clone(), reloads.clone());
                let (reserve, null) = (reserve.clone(), null.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(30),
                        handle(&mut stream, shared, reloads),
                    )
                    .await;
                    if let (true, Some(null)) = (reserved, null) {
                        take_back(stream, &null, &reserve);
                    }
                });
            }
            Err(e) => {
                shared.metrics.admin_accept_errors.inc();
                if let Some(suppressed) = log.allow(std::time::Instant::now()) {
                    tracing::warn!(listener = "admin", error = %e, suppressed, "accept failed");
                }
                tokio::time::sleep(accept::BACKOFF).await;
            }
        }
    }
}

fn is_fd_shortage(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Closes a connection that used a reserved descriptor by putting `/dev/null` in its place:
/// the socket closes, and the descriptor number stays this process's, in the reserve.
fn take_back(
    stream: tokio::net::TcpStream,
    null: &std::fs::File,
    reserve: &std::sync::Mutex<Vec<std::os::fd::OwnedFd>>,
) {
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    let Ok(std) = stream.into_std() else { return };
    let fd = std.into_raw_fd();
    // SAFETY: `fd` is ours (taken out of the stream above). dup2 makes it refer to /dev/null
    // (closing the socket); it is owned again by the OwnedFd, which closes it if kept nowhere.
    let owned = unsafe {
        let replaced = libc::dup2(null.as_raw_fd(), fd) == fd;
        (std::os::fd::OwnedFd::from_raw_fd(fd), replaced)
    };
    if let (owned, true) = owned {
        if let Ok(mut r) = reserve.lock() {
            r.push(owned);
        }
    }
}

/// The config-side labels of `/metrics`: routes, listeners, backends with their live figures.
fn metric_labels<'a>(
    snapshot: &'a crate::config::Snapshot,
    conns: &[u64],
) -> crate::metrics::Labels<'a> {
    let routes = snapshot
        .listeners
        .iter()
        .flat_map(|l| {
            l.router.routes().iter().map(|r| {
                let up = r
                    .proxied()
                    .map_or("", |u| snapshot.upstreams[u].name.as_str());
                (l.name.as_str(), r.index, up)
            })
        })
        .collect();
    let listeners = snapshot
        .listeners
        .iter()
        .zip(conns)
        .map(|(l, n)| (l.name.as_str(), *n))
        .collect();
    let backends =
        snapshot
            .upstreams
            .iter()
            .flat_map(|g| {
                let down = g.health.down_set();
                g.health.backends.iter().enumerate().map(move |(i, b)| {
                    crate::metrics::BackendLabels {
                        upstream: &g.name,
                        addr: b.addr.clone(),
                        open_connections: b.open_connections.load(Ordering::Relaxed) as u64,
                        up: !down.contains(i),
                        checks_passed: b.checks_passed.load(Ordering::Relaxed),
                        checks_failed: b.checks_failed.load(Ordering::Relaxed),
                    }
                })
            })
            .collect();
    crate::metrics::Labels {
        routes,
        listeners,
        backends,
    }
}

async fn handle(
    s: &mut tokio::net::TcpStream,
    shared: Arc<Shared>,
    reloads: mpsc::Sender<ReloadRequest>,
) {
    let mut buf = Vec::with_capacity(1024);
    let (method, path, bearer, head_len, body_len) = loop {
        if s.read_buf(&mut buf).await.unwrap_or(0) == 0 || buf.len() > 16 * 1024 {
            return;
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let body_len = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .unwrap_or(0usize);
                let bearer = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .and_then(bearer_token)
                    .map(|t| t.trim().to_owned());
                break (
                    req.method.unwrap_or("").to_owned(),
                    req.path.unwrap_or("").to_owned(),
                    bearer,
                    head_len,
                    body_len,
                );
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return respond(s, 400, "text/plain", "bad request\n").await,
        }
    };
    if let Some(token) = &shared.snapshot.load().settings.admin_token {
        let given = bearer.as_deref().unwrap_or("");
        // Compared in constant time: the token is the endpoint's only protection.
        let same = given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return respond(s, 401, "text/plain", "a bearer token is required\n").await;
        }
    }
    let full = path.clone();
    let path = path.split('?').next().unwrap_or("");
    if let Some(rest) = path.strip_prefix("/upstreams/") {
        if body_len > MAX_BODY {
            return respond(s, 413, "text/plain", "the body is too large\n").await;
        }
        while buf.len() < head_len + body_len {
            let read = tokio::time::timeout(Duration::from_secs(10), s.read_buf(&mut buf)).await;
            if !matches!(read, Ok(Ok(n)) if n > 0) {
                return;
            }
        }
        let body = &buf[head_len..head_len + body_len];
        let (status, body) = runtime_change(&shared, &method, rest, body);
        return respond(s, status, "application/json", &body).await;
    }
    match (method.as_str(), path) {
        ("POST", "/cache/purge") => {
            let query = full.split_once('?').map_or("", |(_, q)| q);
            let (status, body) = cache_purge(&shared, query);
            respond(s, status, "application/json", &body).await
        }
        ("GET", "/metrics") => {
            let snapshot = shared.snapshot.load_full();
            let conns: Vec<u64> = {
                let states = shared.listeners.lock().unwrap_or_else(|e| e.into_inner());
                snapshot
                    .listeners
                    .iter()
                    .map(|l| {
                        states
                            .iter()
                            .find(|s| *s.name == *l.name)
                            .map_or(0, |s| s.open.load(Ordering::Relaxed) as u64)
                    })
                    .collect()
            };
            let mut body =
                crate::metrics::render(&shared.metrics, &metric_labels(&snapshot, &conns));
            crate::acme::report::metrics(
                shared.live.certs(),
                &snapshot.listener_certs(),
                &mut body,
            );
            crate::cache::metrics(&mut body, &shared.live.stores());
            crate::fleet::metrics(&mut body, shared.live.redis_errors());
            respond(s, 200, "text/plain; version=0.0.4", &body).await
        }
        ("GET", "/healthz") if shared.shutdown.load(Ordering::Relaxed) => {
            respond(s, 503, "text/plain", "shutting down\n").await
        }
        ("GET", "/healthz") => respond(s, 200, "text/plain", "ok\n").await,
        ("GET", "/certificates") => {
            let snapshot = shared.snapshot.load_full();
            let body = crate::acme::report::certificates_json(
                shared.live.certs(),
                &snapshot.listener_certs(),
            );
            respond(s, 200, "application/json", &body).await
        }
        ("GET", "/memory") => {
            let snapshot = shared.snapshot.load_full();
            let body = snapshot
                .footprint()
                .to_json(crate::config::footprint::resident_bytes());
            respond(s, 200, "application/json", &body).await
        }
        ("GET", "/upstreams") => {
            let body = upstreams_json(&shared);
            respond(s, 200, "application/json", &body).await
        }
        ("POST", "/reload") => {
            let (tx, rx) = oneshot::channel();
            if reloads.send(ReloadRequest { reply: tx }).await.is_err() {
                return respond(
                    s,
                    501,
                    "text/plain",
                    "reload is not available in this mode\n",
                )
                .await;
            }
            match rx.await {
                Ok(Ok(msg)) => respond(s, 200, "text/plain", &format!("{msg}\n")).await,
                Ok(Err(e)) => {
                    respond(s, 400, "text/plain", &format!("reload refused: {e}\n")).await
                }
                Err(_) => {
                    respond(
                        s,
                        501,
                        "text/plain",
                        "reload is not available in this mode\n",
                    )
                    .await
                }
            }
        }
        (_, "/metrics" | "/healthz" | "/upstreams" | "/certificates" | "/reload" | "/memory") => {
            respond(s, 405, "text/plain", "method not allowed\n").await
        }
        _ => respond(
            s,
            404,
            "text/plain",
            "not found: try /metrics, /healthz, /upstreams, /certificates, /memory, POST /reload\n",
        )
        .await,
    }
}

/// The runtime API on `/upstreams/NAME/servers[/ADDR[/drain|/enable]]`: drains, enables or
/// removes one backend of the running config, for every worker at once (their next pick).
fn runtime_change(shared: &Shared, method: &str, rest: &str, body: &[u8]) -> (u16, String) {
    let parts: Vec<&str> = rest.split('/').collect();
    let snapshot = shared.snapshot.load_full();
    let Some(group) = snapshot.upstream(parts[0]) else {
        return (
            404,
            format!("{{\"error\":\"no upstream group {:?}\"}}\n", parts[0]),
        );
    };
    let (addr, action) = match (method, parts.as_slice()) {
        ("PUT", [_, "servers"]) => return replace_servers(shared, group, body),
        ("POST", [_, "servers", addr, "drain"]) => (*addr, 1),
        ("POST", [_, "servers", addr, "enable"]) => (*addr, 0),
        ("DELETE", [_, "servers", addr]) => (*addr, 2),
        _ => return (404, "{\"error\":\"try POST /upstreams/NAME/servers/ADDR/drain or /enable, DELETE /upstreams/NAME/servers/ADDR\"}\n".into()),
    };
    let addr = crate::static_files::path::percent_decode(addr.as_bytes())
        .and_then(|a| String::from_utf8(a).ok())
        .unwrap_or_default();
    let Some(i) = group
        .backends
        .iter()
        .position(|b| b.addr.to_string() == addr)
    else {
        return (
            404,
            format!("{{\"error\":\"no server {addr:?} in {:?}\"}}\n", group.name),
        );
    };
    group.health.set_drained(i, action);
    let state = ["in service", "drained", "removed"][usize::from(action)];
    tracing::info!(upstream = %group.name, server = %addr, state, "runtime API");
    (
        200,
        format!(
            "{{\"upstream\":{:?},\"server\":{addr:?},\"state\":{state:?}}}\n",
            group.name
        ),
    )
}

/// Largest admin request body: a `PUT` of the largest group (65,535 servers of about 40
/// bytes of JSON each) fits.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// `PUT /upstreams/NAME/servers` with a JSON list of `"ip:port"` strings or
/// `{"addr": "ip:port", "weight": 2}` objects (or `{"servers": [...]}`): the group's set from
/// now on, replacing the file's servers and DNS discovery's until a reload (which keeps it
/// under `runtime_overrides = "keep"`). Names are resolved once, now.
fn replace_servers(
    shared: &Shared,
    group: &crate::config::UpstreamGroup,
    body: &[u8],
) -> (u16, String) {
    let bad = |m: String| (400, format!("{{\"error\":{m:?}}}\n"));
    let value: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad(format!("the body is not JSON: {e}")),
    };
    let list = match &value {
        serde_json::Value::Array(l) => l,
        serde_json::Value::Object(o) => match o.get("servers") {
            Some(serde_json::Value::Array(l)) => l,
            _ => return bad("expected a list of servers or {\"servers\": [...]}".into()),
        },
        _ => return bad("expected a list of servers or {\"servers\": [...]}".into()),
    };
    if list.is_empty() || list.len() > crate::upstream::health::MAX_BACKENDS {
        return bad(format!(
            "give 1 to {} servers (drain or DELETE takes servers out)",
            crate::upstream::health::MAX_BACKENDS
        ));
    }
    let mut backends = Vec::with_capacity(list.len());
    let mut seen = std::collections::HashSet::with_capacity(list.len());
    for entry in list {
        let (addr, weight) = match entry {
            serde_json::Value::String(a) => (a.as_str(), 1),
            serde_json::Value::Object(o) => (
                o.get("addr").and_then(|a| a.as_str()).unwrap_or(""),
                o.get("weight").and_then(|w| w.as_u64()).unwrap_or(1),
            ),
            _ => return bad(format!("{entry} is not a server")),
        };
        let weight = match u32::try_from(weight) {
            Ok(w) if w > 0 => w,
            _ => return bad(format!("{addr}: weight must be 1 or more")),
        };
        let b = match crate::config::runtime_backend(group, addr, weight) {
            Ok(b) => b,
            Err(m) => return bad(format!("{addr}: {m}")),
        };
        // A set of addresses: a PUT of 10,000 servers stays linear.
        if seen.insert(b.addr.clone()) {
            backends.push(b);
        }
    }
    let listed: Vec<String> = backends
        .iter()
        .map(|b| format!("{:?}", b.addr.to_string()))
        .collect();
    shared.found.set_override(&group.name, backends);
    shared.republish(&group.name);
    tracing::info!(upstream = %group.name, servers = %listed.join(","), "runtime API: new set of servers");
    (
        200,
        format!(
            "{{\"upstream\":{:?},\"servers\":[{}]}}\n",
            group.name,
            listed.join(",")
        ),
    )
}

/// `POST /cache/purge?key=K` (or `prefix=P`, or `tag=T`; `&cache=NAME` for one cache):
/// removes matching objects from every cache and says how many.
fn cache_purge(shared: &Shared, query: &str) -> (u16, String) {
    let mut selector = None;
    let mut only = None;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = v.replace('+', " ");
        let Some(v) = crate::static_files::path::percent_decode(v.as_bytes())
            .and_then(|v| String::from_utf8(v).ok())
        else {
            return (400, "{\"error\":\"bad percent-encoding\"}\n".into());
        };
        match k {
            "key" => selector = Some(crate::cache::Purge::Key(v)),
            "prefix" => selector = Some(crate::cache::Purge::Prefix(v)),
            "tag" => selector = Some(crate::cache::Purge::Tag(v)),
            "cache" => only = Some(v),
            _ => {}
        }
    }
    let Some(selector) = selector else {
        return (400, "{\"error\":\"give key=, prefix= or tag=\"}\n".into());
    };
    let stores = shared.live.stores();
    if let Some(name) = &only {
        if !stores.iter().any(|s| *s.name == **name) {
            return (404, format!("{{\"error\":\"no cache named {name:?}\"}}\n"));
        }
    }
    let purged: usize = stores
        .iter()
        .filter(|s| only.as_deref().is_none_or(|n| *s.name == *n))
        .map(|s| s.purge(&selector))
        .sum();
    (200, format!("{{\"purged\":{purged}}}\n"))
}

fn upstreams_json(shared: &Shared) -> String {
    let snapshot = shared.snapshot.load_full();
    let mut out = String::from("{\"upstreams\":[");
    for (gi, g) in snapshot.upstreams.iter().enumerate() {
        if gi > 0 {
            out.push(',');
        }
        let down = g.health.down_set();
        let _ = write!(
            out,
            "{{\"name\":{:?},\"policy\":{:?},\"backends\":[",
            g.name,
            g.policy.name()
        );
        for (i, b) in g.health.backends.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let ejected_ms = b
                .ejected_until_ms
                .load(Ordering::Relaxed)
                .saturating_sub(crate::clock::now_ms());
            // Per-worker views, published by each worker's heartbeat (at most 50 ms old).
            let mut workers = String::from("[");
            let (mut in_flight, mut idle, mut ewma_sum, mut ewma_n) = (0u64, 0u64, 0u64, 0u64);
            for (w, v) in b.workers.iter().enumerate() {
                let (f, i, e) = (
                    v.in_flight.load(Ordering::Relaxed),
                    v.idle.load(Ordering::Relaxed),
                    v.ewma_us.load(Ordering::Relaxed),
                );
                in_flight += u64::from(f);
                idle += u64::from(i);
                if e > 0 {
                    ewma_sum += e;
                    ewma_n += 1;
                }
                if w > 0 {
                    workers.push(',');
                }
                let _ = write!(
                    workers,
                    "{{\"in_flight\":{f},\"idle_connections\":{i},\"ewma_latency_ms\":{:.3}}}",
                    e as f64 / 1000.0
                );
            }
            workers.push(']');
            let ewma_ms = if ewma_n > 0 {
                ewma_sum as f64 / ewma_n as f64 / 1000.0
            } else {
                0.0
            };
            let _ = write!(
                out,
                "{{\"addr\":\"{}\",\"weight\":{},\"usable\":{},\"active_check_up\":{},\"ejected_for_ms\":{},\"consecutive_failures\":{},\"open_connections\":{},\"checks_passed\":{},\"checks_failed\":{},\"state\":\"{}\",\"in_flight\":{in_flight},\"idle_connections\":{idle},\"ewma_latency_ms\":{ewma_ms:.3},\"workers\":{workers}}}",
                b.addr,
                g.backends.get(i).map_or(1, |x| x.weight),
                !down.contains(i),
                b.active_up.load(Ordering::Relaxed),
                ejected_ms,
                b.consecutive_failures.load(Ordering::Relaxed),
                b.open_connections.load(Ordering::Relaxed),
                b.checks_passed.load(Ordering::Relaxed),
                b.checks_failed.load(Ordering::Relaxed),
                ["in service", "drained", "removed"][usize::from(b.drained.load(Ordering::Relaxed).min(2))],
            );
        }
        out.push(']');
        if let Some(search) = &g.search {
            let h = search
                .cluster
                .try_get()
                .map(|c| c.health())
                .unwrap_or_default();
            let shedding: Vec<String> = h.shedding.iter().map(|a| format!("\"{a}\"")).collect();
            let _ = write!(
                out,
                ",\"cluster\":{{\"status\":{:?},\"nodes\":{},\"shedding\":[{}]}}",
                h.status,
                h.nodes,
                shedding.join(",")
            );
        }
        out.push('}');
    }
    out.push_str("]}\n");
    out
}

async fn respond(s: &mut tokio::net::TcpStream, status: u16, content_type: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        crate::http1::reason(status),
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// The token of an `Authorization: Bearer TOKEN` value; the scheme is case-insensitive
/// (RFC 9110 section 11.1).
fn bearer_token(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}
