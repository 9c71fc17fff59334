//! An HTTP/2 stream forwarded to an HTTP/2 upstream (`protocol = "h2"` over TLS, or `"h2c"`):
//! what gRPC needs. Each worker keeps one multiplexed connection per backend (hyper's client,
//! driven by a task on the worker's thread). Bodies and trailers pass through as frames, in
//! both directions, without buffering.

use std::rc::Rc;

use http::{HeaderMap, HeaderValue, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::time::{timeout, Instant};

use super::{feedback, pick, ConnCtx, Finish, LocalExec, ProxyBody, Target};
use crate::config::UpstreamProtocol;
use crate::error::{ErrorKind, ProxyError};
use crate::proxy::connect_backend;
use crate::upstream::H2Sender;
use crate::worker::Generation;

fn up(kind: ErrorKind) -> ProxyError {
    ProxyError::upstream(kind)
}

pub(super) async fn forward(
    c: &Rc<ConnCtx>,
    gen: &Rc<Generation>,
    t: Target,
    req: Request<Incoming>,
    fin: &mut Option<Box<Finish>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let (parts, body) = req.into_parts();
    let host = super::authority_of(&parts).to_owned();

    // Connection-level headers are already absent in HTTP/2; veloxy's own are rewritten.
    let mut headers = HeaderMap::with_capacity(parts.headers.len() + 3);
    let keep_underscores = gen.snapshot.settings.underscores_in_headers;
    for (name, value) in &parts.headers {
        if super::skip_request_header(name) || super::dropped_underscore(name, keep_underscores) {
            continue;
        }
        if name == http::header::TE && value.as_bytes() != b"trailers" {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    let mut xff = Vec::new();
    for v in parts.headers.get_all("x-forwarded-for") {
        let v = v.as_bytes().trim_ascii();
        if !v.is_empty() {
            xff.extend_from_slice(v);
            xff.extend_from_slice(b", ");
        }
    }
    xff.extend_from_slice(c.client_ip().as_bytes());
    if let Ok(v) = HeaderValue::from_bytes(&xff) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(c.proto()));
    if let Ok(v) = HeaderValue::from_str(&host) {
        headers.insert("x-forwarded-host", v);
    }
    if let Some(ctx) = fin.as_ref().and_then(|f| f.hook_ctx.as_deref()) {
        super::add_hook_headers(&ctx.upstream_headers, &mut headers);
    }

    // Find a backend with a live connection; nothing is sent before that, so a failed
    // connect moves on to another backend whatever the method.
    let mut tried = 0u64;
    let mut retries_left = group.retries;
    let mut backend = pick(c, gen, t, 0, false).ok_or_else(|| up(ErrorKind::NoBackend))?;
    let sender = loop {
        tried |= 1 << backend;
        match sender_for(c.worker(), gen, t.upstream, backend).await {
            Ok(s) => break s,
            Err((e, health)) => {
                if health {
                    feedback(gen, t, backend, std::time::Duration::ZERO, false);
                }
                let next = (retries_left > 0)
                    .then(|| pick(c, gen, t, tried, true))
                    .flatten();
                match next {
                    Some(b) => {
                        retries_left -= 1;
                        c.worker().metrics.retries.inc();
                        backend = b;
                    }
                    None => return Err(e),
                }
            }
        }
    };
    let addr = group.backends[backend].addr;
    if let Some(f) = fin.as_deref_mut() {
        f.backend = Some(addr);
    }
    let scheme = if group.protocol == UpstreamProtocol::H2 {
        "https"
    } else {
        "http"
    };
    let authority = if host.is_empty() {
        addr.to_string()
    } else {
        host
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|_| ProxyError::downstream(ErrorKind::BadRequest("invalid request target")))?;
    let mut upstream_req = Request::new(body.boxed_unsync());
    *upstream_req.method_mut() = parts.method;
    *upstream_req.uri_mut() = uri;
    *upstream_req.headers_mut() = headers;

    let mut guard = super::AttemptGuard::start(gen, t.upstream, backend);
    let t0 = Instant::now();
    let sent = timeout(
        group.read_timeout,
        send_with_one_reconnect(c, gen, t, backend, sender, upstream_req),
    )
    .await;
    guard.disarm();
    let elapsed = t0.elapsed();
    let resp = match sent {
        Err(_) => {
            // Maybe a connection that died silently: the next request opens a fresh one.
            gen.groups.borrow_mut()[t.upstream].h2[backend] = None;
            feedback(gen, t, backend, elapsed, false);
            return Err(up(ErrorKind::ReadTimeout));
        }
        Ok(Err(e)) => {
            gen.groups.borrow_mut()[t.upstream].h2[backend] = None;
            feedback(gen, t, backend, elapsed, false);
            return Err(e);
        }
        Ok(Ok(r)) => r,
    };
    let status = resp.status().as_u16();
    feedback(
        gen,
        t,
        backend,
        elapsed,
        !(group.outlier.on_5xx && status >= 500),
    );
    c.worker().metrics.upstream_duration.observe(elapsed);
    let (mut rparts, rbody) = resp.into_parts();
    let mut fin = fin.take().expect("present until success");
    fin.status = status;
    if let (Some(hooks), Some(ctx)) = (&c.worker().shared.hooks, fin.hook_ctx.as_deref_mut()) {
        hooks.on_response(status, ctx);
        super::add_hook_headers(&ctx.response_headers, &mut rparts.headers);
    }
    let mut out = Response::new(ProxyBody::H2(rbody, Some(fin)));
    *out.status_mut() = rparts.status;
    *out.headers_mut() = rparts.headers;
    Ok(out)
}

/// Sends on the cached connection; when the request never left (the connection was closing:
/// GOAWAY, a refused stream, a dead connection), it is sent once more on a fresh connection.
async fn send_with_one_reconnect(
    c: &ConnCtx,
    gen: &Generation,
    t: Target,
    backend: usize,
    mut sender: H2Sender,
    req: Request<crate::upstream::H2Body>,
) -> Result<Response<Incoming>, ProxyError> {
    let io_err = |e: hyper::Error| super::hyper_error(true, &e);
    match sender.try_send_request(req).await {
        Ok(r) => Ok(r),
        Err(mut e) => {
            let Some(req) = e.take_message() else {
                return Err(io_err(e.into_error()));
            };
            gen.groups.borrow_mut()[t.upstream].h2[backend] = None;
            let mut fresh = sender_for(c.worker(), gen, t.upstream, backend)
                .await
                .map_err(|(e, _)| e)?;
            fresh.send_request(req).await.map_err(io_err)
        }
    }
}

/// The worker's connection to `backend`, opened (TCP, TLS, HTTP/2 handshake) if there is
/// none or it has closed.
pub(crate) async fn sender_for(
    worker: &crate::worker::Worker,
    gen: &Generation,
    upstream: usize,
    backend: usize,
) -> Result<H2Sender, (ProxyError, bool)> {
    if let Some(s) = gen.groups.borrow()[upstream].h2[backend].as_ref() {
        if !s.is_closed() && s.is_ready() {
            return Ok(s.clone());
        }
    }
    let group = &gen.snapshot.upstreams[upstream];
    let conn = connect_backend(worker, group, backend).await?;
    let mut builder = hyper::client::conn::http2::Builder::new(LocalExec);
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(super::STREAM_WINDOW)
        .initial_connection_window_size(super::CONNECTION_WINDOW)
        // Pings find a connection that died silently (NAT or conntrack expiry) before a
        // request waits on it.
        .keep_alive_interval(std::time::Duration::from_secs(30))
        .keep_alive_timeout(std::time::Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let (sender, connection) =
        match timeout(group.connect_timeout, builder.handshake(TokioIo::new(conn))).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err((super::hyper_error(true, &e), true)),
            Err(_) => return Err((up(ErrorKind::ConnectTimeout), true)),
        };
    let addr = group.backends[backend].addr;
    tokio::task::spawn_local(async move {
        if let Err(e) = connection.await {
            tracing::debug!(backend = %addr, error = %e, "HTTP/2 upstream connection ended");
        }
    });
    gen.groups.borrow_mut()[upstream].h2[backend] = Some(sender.clone());
    Ok(sender)
}
