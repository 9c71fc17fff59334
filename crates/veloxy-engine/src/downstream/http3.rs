//! HTTP/3 clients (`http3 = true` on a TLS listener): QUIC by quinn, HTTP/3 framing by h3.
//!
//! Each request stream goes to the stream handler HTTP/2 uses ([`http2::handle`]), with its
//! body as a [`RequestBody::H3`]: the same exchange core (routes, rules, limits, hooks,
//! retries, pools, files, compression, access log and metrics, where the protocol is
//! `HTTP/3`), written once for both protocols.
//!
//! One UDP socket per worker per listener, bound with SO_REUSEPORT on the listener's port:
//! the kernel hashes the client's address and port, so every packet of a connection reaches
//! the worker that owns it as long as the client keeps its address (a migrating client is
//! dropped, and reconnects) and the set of sockets does not change.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::time::timeout;

use super::http2::request_body::H3Body;
use super::http2::{self, ConnCtx, RequestBody};
use crate::config::Http3Spec;
use crate::runtime::ListenerState;
use crate::worker::Worker;

type H3Stream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// Accepts QUIC connections on `socket` until the worker stops.
pub(crate) async fn serve_endpoint(
    worker: Rc<Worker>,
    socket: std::net::UdpSocket,
    listener: Arc<ListenerState>,
    spec: Arc<Http3Spec>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let endpoint = match quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(spec.quic.clone()),
        socket,
        Arc::new(quinn::TokioRuntime),
    ) {
        Ok(e) => e,
        Err(e) => {
            return tracing::error!(listener = %listener.name, error = %e, "HTTP/3: cannot start QUIC")
        }
    };
    let local = endpoint.local_addr().ok();
    let open = Rc::new(std::cell::Cell::new(0usize));
    let mut spec = spec;
    let mut generation = worker.current().number;
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i { Some(i) => i, None => break },
            _ = stop.wait_for(|s| *s) => break,
        };
        // A reload may have changed the listener's certificates or limits.
        let current = worker.current();
        if current.number != generation {
            generation = current.number;
            let now = current
                .snapshot
                .listeners
                .iter()
                .find(|l| *l.name == *listener.name);
            match now.and_then(|l| l.http3.clone()) {
                Some(new) => {
                    if !Arc::ptr_eq(&new, &spec) {
                        endpoint.set_server_config(Some(new.quic.clone()));
                        spec = new;
                    }
                }
                None => {
                    // HTTP/3 (or the listener) was removed: no new connections, and the
                    // socket closes once the open ones end (so turning it on again later
                    // binds afresh, with no stale socket sharing the port).
                    incoming.refuse();
                    break;
                }
            }
        }
        if spec.max_connections > 0 && open.get() >= spec.max_connections {
            incoming.refuse();
            continue;
        }
        // Under load, make unvalidated clients prove their address first (a Retry token):
        // a flood of spoofed Initials then costs a stateless answer each, no connection.
        if open.get() >= RETRY_ABOVE && !incoming.remote_address_validated() {
            let _ = incoming.retry();
            continue;
        }
        let (w, l, open, stop) = (worker.clone(), listener.clone(), open.clone(), stop.clone());
        open.set(open.get() + 1);
        let zero_rtt = spec.zero_rtt;
        let handshake_limit = current.snapshot.settings.header_timeout;
        tokio::task::spawn_local(async move {
            // A handshake that does not complete within the header timeout is dropped (quinn
            // closes the connection): a client that echoes a Retry token and stops there
            // holds its slot and its state no longer than a slow HTTP/1 head does.
            let established = tokio::time::timeout(handshake_limit, establish(incoming, zero_rtt));
            if let Ok(Some((conn, early))) = established.await {
                serve_connection(w.clone(), conn, (l, local, early), stop).await;
            }
            open.set(open.get() - 1);
            // Counted toward the worker's memory trim after a burst, as closed TCP clients
            // are: a burst of handshakes leaves tens of KB each in the allocator's arenas.
            w.idle_memory_freed(1);
        });
    }
    // Shutting down: no new connections; open ones get GOAWAY and finish their streams
    // (the worker waits for them up to `shutdown_timeout`).
    endpoint.set_server_config(None);
}

/// Completes the handshake, or with `quic_0rtt` lets the connection serve requests before it
/// completes; then the flag says whether the handshake is still under way (requests read
/// until then may be replayed copies).
async fn establish(
    incoming: quinn::Incoming,
    zero_rtt: bool,
) -> Option<(quinn::Connection, Option<Rc<Cell<bool>>>)> {
    if !zero_rtt {
        return incoming.await.ok().map(|c| (c, None));
    }
    let connecting = incoming.accept().ok()?;
    match connecting.into_0rtt() {
        Ok((conn, done)) => {
            let early = Rc::new(Cell::new(true));
            let flag = early.clone();
            tokio::task::spawn_local(async move {
                done.await;
                flag.set(false);
            });
            Some((conn, Some(early)))
        }
        Err(connecting) => connecting.await.ok().map(|c| (c, None)),
    }
}

/// Open connections per worker above which new clients get a Retry first.
const RETRY_ABOVE: usize = 1000;

/// Serves one QUIC connection: each request stream through the stream handler it shares
/// with HTTP/2.
async fn serve_connection(
    worker: Rc<Worker>,
    conn: quinn::Connection,
    (listener, local, early): (
        Arc<ListenerState>,
        Option<SocketAddr>,
        Option<Rc<Cell<bool>>>,
    ),
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let peer: SocketAddr = conn.remote_address();
    let (max_head, body_timeout, send_timeout) = {
        let s = &worker.current().snapshot.settings;
        (s.max_header_bytes as u64, s.body_timeout, s.send_timeout)
    };
    // Header sections (QPACK) are limited like HTTP/1 and HTTP/2 heads: h3's default is none.
    let built = h3::server::builder()
        .max_field_section_size(max_head)
        .build::<_, Bytes>(h3_quinn::Connection::new(conn))
        .await;
    let mut h3 = match built {
        Ok(h3) => h3,
        Err(e) => return tracing::debug!(client = %peer, error = %e, "HTTP/3 setup failed"),
    };
    let ctx = Rc::new(ConnCtx::new(
        worker,
        (peer, local),
        listener,
        http2::Multiplexed::H3,
        body_timeout,
    ));
    let mut stopping = false;
    loop {
        let accepted = tokio::select! {
            a = h3.accept() => a,
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                // GOAWAY: requests already open finish, no new ones start.
                let _ = h3.shutdown(0).await;
                continue;
            }
        };
        match accepted {
            Ok(Some(resolver)) => {
                let ctx = ctx.clone();
                // Opened before the handshake completed: the request came in 0-RTT data.
                let in_early_data = early.as_ref().is_some_and(|e| e.get());
                tokio::task::spawn_local(async move {
                    if let Ok((mut req, stream)) = resolver.resolve_request().await {
                        if in_early_data {
                            req.extensions_mut().insert(http2::EarlyData);
                        }
                        exchange(ctx, req, stream, send_timeout).await;
                    }
                });
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(client = %peer, error = %e, "HTTP/3 connection ended");
                break;
            }
        }
    }
}

/// Runs the exchange `handled`, sending the informational responses (103 Early Hints) it
/// queues as they come, then those still queued when it ends: all before the final head.
/// `None`: the client is gone or stalled.
async fn with_interims<R>(
    handled: impl std::future::Future<Output = R>,
    queued: crate::hints::Interims,
    send: &mut h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>,
    send_timeout: Duration,
) -> Option<R> {
    tokio::pin!(handled);
    let res = loop {
        tokio::select! {
            biased;
            interim = queued.next() => {
                if !matches!(timeout(send_timeout, send.send_response(interim)).await, Ok(Ok(()))) {
                    return None;
                }
            }
            res = &mut handled => break res,
        }
    };
    while let Some(interim) = queued.take() {
        if !matches!(
            timeout(send_timeout, send.send_response(interim)).await,
            Ok(Ok(()))
        ) {
            return None;
        }
    }
    Some(res)
}

/// One request stream: through the exchange, and its answer back to the client. Each write
/// waits at most `send_timeout` for the client's flow-control window, as on HTTP/2.
async fn exchange(
    ctx: Rc<ConnCtx>,
    req: http::Request<()>,
    stream: H3Stream,
    send_timeout: Duration,
) {
    let (mut send, recv) = stream.split();
    let mut req = req.map(|()| RequestBody::H3(H3Body::new(recv)));
    let queued = crate::hints::Interims::default();
    req.extensions_mut().insert(queued.clone());
    let handled = http2::handle(ctx.clone(), req);
    let Some(res) = with_interims(handled, queued, &mut send, send_timeout).await else {
        return;
    };
    let (mut parts, mut body) = res.into_parts();
    parts
        .headers
        .entry(http::header::DATE)
        .or_insert_with(super::files::date_value);
    let head = send.send_response(http::Response::from_parts(parts, ()));
    if !matches!(timeout(send_timeout, head).await, Ok(Ok(()))) {
        return;
    }
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            // The response was cut short upstream: so is the client's stream.
            send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
            return;
        };
        let sent = match frame.into_data() {
            Ok(data) => timeout(send_timeout, send.send_data(data)).await,
            Err(frame) => match frame.into_trailers() {
                Ok(trailers) => timeout(send_timeout, send.send_trailers(trailers)).await,
                Err(_) => Ok(Ok(())),
            },
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return, // the client reset the stream or left
            Err(_) => {
                crate::exchange::framed::FramedClient::worker(&*ctx)
                    .metrics
                    .send_timeouts
                    .inc();
                send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
                return;
            }
        }
    }
    let _ = timeout(send_timeout, send.finish()).await;
}
