//! HTTP/3 clients (`http3 = true` on a TLS listener): QUIC by quinn, HTTP/3 framing by h3.
//!
//! Each QUIC connection is served by the HTTP/2 codec ([`super::http2`]) over an in-memory
//! pipe: the connection's request streams become streams of one HTTP/2 connection to it, so
//! every request goes through the same exchange core (routes, rules, limits, hooks, retries,
//! pools, files, compression, access log and metrics, where the protocol is `HTTP/3`) with no
//! second copy of that code. The price is one HTTP/2 framing pass in memory per request;
//! QUIC's own encryption and packet work costs far more.
//!
//! One UDP socket per worker per listener, bound with SO_REUSEPORT on the listener's port:
//! the kernel hashes the client's address and port, so every packet of a connection reaches
//! the worker that owns it as long as the client keeps its address (a migrating client is
//! dropped, and reconnects) and the set of sockets does not change.

use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use crate::config::Http3Spec;
use crate::runtime::ListenerState;
use crate::worker::Worker;

type H3Stream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;
type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

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
        tokio::task::spawn_local(async move {
            if let Ok(conn) = incoming.await {
                serve_connection(w, conn, l, stop).await;
            }
            open.set(open.get() - 1);
        });
    }
    // Shutting down: no new connections; open ones get GOAWAY and finish their streams
    // (the worker waits for them up to `shutdown_timeout`).
    endpoint.set_server_config(None);
}

/// Open connections per worker above which new clients get a Retry first.
const RETRY_ABOVE: usize = 1000;

/// Serves one QUIC connection: each request stream through the HTTP/2 codec.
async fn serve_connection(
    worker: Rc<Worker>,
    conn: quinn::Connection,
    listener: Arc<ListenerState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let peer: SocketAddr = conn.remote_address();
    let (client_io, server_io) = tokio::io::duplex(256 * 1024);
    tokio::task::spawn_local(super::http2::serve(
        worker.clone(),
        server_io,
        (peer, None),
        listener,
        (true, 3),
    ));
    let handshake = hyper::client::conn::http2::Builder::new(super::http2::LocalExec)
        .initial_stream_window_size(super::http2::STREAM_WINDOW)
        .initial_connection_window_size(super::http2::CONNECTION_WINDOW)
        .handshake::<_, H3Body>(TokioIo::new(client_io))
        .await;
    let Ok((sender, driver)) = handshake else {
        return;
    };
    tokio::task::spawn_local(driver);
    // Header sections (QPACK) are limited like HTTP/1 and HTTP/2 heads: h3's default is none.
    let max_head = worker.current().snapshot.settings.max_header_bytes as u64;
    let built = h3::server::builder()
        .max_field_section_size(max_head)
        .build::<_, Bytes>(h3_quinn::Connection::new(conn))
        .await;
    let mut h3 = match built {
        Ok(h3) => h3,
        Err(e) => return tracing::debug!(client = %peer, error = %e, "HTTP/3 setup failed"),
    };
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
                let sender = sender.clone();
                tokio::task::spawn_local(async move {
                    if let Ok((req, stream)) = resolver.resolve_request().await {
                        relay(sender, req, stream).await;
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

/// One request: to the codec, and its answer back to the client.
async fn relay(
    mut sender: hyper::client::conn::http2::SendRequest<H3Body>,
    req: http::Request<()>,
    stream: H3Stream,
) {
    let (mut send, recv) = stream.split();
    let (parts, ()) = req.into_parts();
    let req = http::Request::from_parts(parts, H3Body { recv, done: false });
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(_) => {
            let _ = send
                .send_response(
                    http::Response::builder()
                        .status(502)
                        .body(())
                        .expect("static response"),
                )
                .await;
            let _ = send.finish().await;
            return;
        }
    };
    let (parts, mut body) = resp.into_parts();
    if send
        .send_response(http::Response::from_parts(parts, ()))
        .await
        .is_err()
    {
        return;
    }
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            // The codec cut the response short: so does the client's stream.
            send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
            return;
        };
        let sent = match frame.into_data() {
            Ok(data) => send.send_data(data).await,
            Err(frame) => match frame.into_trailers() {
                Ok(trailers) => send.send_trailers(trailers).await,
                Err(_) => Ok(()),
            },
        };
        if sent.is_err() {
            return;
        }
    }
    let _ = send.finish().await;
}

/// A request body read from the client's HTTP/3 stream.
pub(crate) struct H3Body {
    recv: H3Recv,
    done: bool,
}

impl http_body::Body for H3Body {
    type Data = Bytes;
    type Error = h3::error::StreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if !this.done {
            match this.recv.poll_recv_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Ok(Some(mut buf))) => {
                    let data = buf.copy_to_bytes(buf.remaining());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Ok(None)) => this.done = true,
            }
        }
        match this.recv.poll_recv_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
        }
    }
}
