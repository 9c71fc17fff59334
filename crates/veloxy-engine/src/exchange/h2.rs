//! HTTP/2 upstream requests, for every client protocol: the HTTP/1 -> h2 bridge and HTTP/2
//! and HTTP/3 streams send through [`attempt_on`], run by the [`super::attempt`] loop. Each
//! worker keeps one multiplexed connection per backend ([`sender_for`]: hyper's client,
//! driven by a task on the worker's thread).

use http::{HeaderMap, Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::time::{timeout, Instant};

use crate::config::UpstreamProtocol;
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::attempt::AttemptFail;
use crate::upstream::connect::connect_backend;
use crate::upstream::{H2Body, H2Sender, LocalExec};
use crate::worker::{Generation, Worker};

/// Receive windows of an upstream connection: how much response body a backend may send
/// ahead of the client reading it.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONNECTION_WINDOW: u32 = 1024 * 1024;

fn up(kind: ErrorKind) -> ProxyError {
    ProxyError::upstream(kind)
}

/// A failure of the upstream connection or stream, as hyper reports it.
fn upstream_error(e: hyper::Error) -> ProxyError {
    up(ErrorKind::Stream).because(e)
}

/// The upstream request: the group's scheme, the client's authority (`host`; the backend's
/// address when the client sent none) and `path`, the fields and the body.
pub(crate) fn upstream_request(
    group: &crate::config::UpstreamGroup,
    backend: usize,
    (host, path): (&str, &str),
    method: http::Method,
    headers: HeaderMap,
    body: H2Body,
) -> Result<Request<H2Body>, ProxyError> {
    let scheme = if group.protocol == UpstreamProtocol::H2 {
        "https"
    } else {
        "http"
    };
    let addr;
    let authority = if host.is_empty() {
        addr = group.backends[backend].addr.to_string();
        &addr
    } else {
        host
    };
    let uri: Uri = format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|_| ProxyError::downstream(ErrorKind::BadRequest("invalid request target")))?;
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Ok(req)
}

/// One attempt of an HTTP/2 upstream request on `backend`, for every client protocol (the
/// HTTP/1 bridge and HTTP/2 and HTTP/3 streams): the connection first (a failure sends
/// nothing: [`AttemptFail::NotSent`]), then the request `make` builds, and its response
/// head within the group's `read_timeout` (a failure then: [`AttemptFail::NoResponse`]). A
/// status in `retry_on` when `may_retry_status` is [`AttemptFail::RetryStatus`].
pub(crate) async fn attempt_on(
    worker: &Worker,
    gen: &Generation,
    (upstream, backend): (usize, usize),
    may_retry_status: bool,
    make: impl FnOnce() -> Result<Request<H2Body>, ProxyError>,
    trace: Option<&crate::otel::Trace>,
) -> Result<(Response<Incoming>, u16), AttemptFail<ProxyError>> {
    use crate::otel::span::EventName;
    let group = &gen.snapshot.upstreams[upstream];
    let open = |s: &H2Sender| !s.is_closed() && s.is_ready();
    let reused = trace.is_some() && gen.group(upstream).h2[backend].as_ref().is_some_and(open);
    let sender = sender_for(worker, gen, upstream, backend)
        .await
        .map_err(|(error, health)| AttemptFail::NotSent { error, health })?;
    if let Some(t) = trace {
        super::trace::event(t, EventName::Connected, Some(reused));
    }
    let req = make().map_err(AttemptFail::Fatal)?;
    let t0 = Instant::now();
    let sent = timeout(
        group.read_timeout,
        send_with_one_reconnect(worker, gen, (upstream, backend), sender, req),
    )
    .await;
    let failed = match sent {
        Ok(Ok(r)) => {
            worker.metrics.upstream_duration.observe(t0.elapsed());
            if let Some(t) = trace {
                // The head came: the time to first byte (the body streams on).
                super::trace::event(t, EventName::ResponseHead, None);
            }
            let status = r.status().as_u16();
            if may_retry_status && group.retry_on.contains(&status) {
                // Dropped unread: the stream is reset, the connection stays.
                return Err(AttemptFail::RetryStatus(status));
            }
            return Ok((r, status));
        }
        Ok(Err(e)) => e,
        Err(_) => up(ErrorKind::ReadTimeout),
    };
    // Maybe a connection that died silently: the next request opens a fresh one.
    gen.group(upstream).h2[backend] = None;
    Err(AttemptFail::NoResponse(failed))
}

/// Sends on the cached connection; when the request never left (the connection was closing:
/// GOAWAY, a refused stream, a dead connection), it is sent once more on a fresh connection.
async fn send_with_one_reconnect(
    worker: &Worker,
    gen: &Generation,
    (upstream, backend): (usize, usize),
    mut sender: H2Sender,
    req: Request<H2Body>,
) -> Result<Response<Incoming>, ProxyError> {
    let io_err = upstream_error;
    match sender.try_send_request(req).await {
        Ok(r) => Ok(r),
        Err(mut e) => {
            let Some(req) = e.take_message() else {
                return Err(io_err(e.into_error()));
            };
            gen.group(upstream).h2[backend] = None;
            let mut fresh = sender_for(worker, gen, upstream, backend)
                .await
                .map_err(|(e, _)| e)?;
            fresh.send_request(req).await.map_err(io_err)
        }
    }
}

/// The worker's connection to `backend`, opened (TCP, TLS, HTTP/2 handshake) if there is
/// none or it has closed.
pub(crate) async fn sender_for(
    worker: &Worker,
    gen: &Generation,
    upstream: usize,
    backend: usize,
) -> Result<H2Sender, (ProxyError, bool)> {
    if let Some(s) = gen.group(upstream).h2[backend].as_ref() {
        if !s.is_closed() && s.is_ready() {
            return Ok(s.clone());
        }
    }
    let group = &gen.snapshot.upstreams[upstream];
    // HTTP/2 groups never send PROXY headers (one connection carries every client).
    let conn = connect_backend(&*worker.metrics, group, backend, None).await?;
    let mut builder = hyper::client::conn::http2::Builder::new(LocalExec);
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        // Pings find a connection that died silently (NAT or conntrack expiry) before a
        // request waits on it.
        .keep_alive_interval(std::time::Duration::from_secs(30))
        .keep_alive_timeout(std::time::Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let (sender, connection) =
        match timeout(group.connect_timeout, builder.handshake(TokioIo::new(conn))).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err((upstream_error(e), true)),
            Err(_) => return Err((up(ErrorKind::ConnectTimeout), true)),
        };
    let addr = group.backends[backend].addr.clone();
    tokio::task::spawn_local(async move {
        if let Err(e) = connection.await {
            tracing::debug!(backend = %addr, error = %e, "HTTP/2 upstream connection ended");
        }
    });
    gen.group(upstream).h2[backend] = Some(sender.clone());
    Ok(sender)
}
