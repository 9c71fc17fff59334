//! HTTP/2 to clients: TLS connections that chose `h2` by ALPN, and h2c prior knowledge on
//! plain listeners with `http2 = true`.
//!
//! The HTTP/2 framing, HPACK, flow control and stream state machine are hyper's (over the
//! `h2` crate), configured with bounded windows and limits: concurrent streams
//! (`h2_max_concurrent_streams`), header list size (`max_header_bytes`), and the resets a
//! client may cause (CVE-2023-44487 "rapid reset": pending-accept and locally-caused resets are
//! capped, beyond which the connection is closed with GOAWAY). CONTINUATION floods are bounded
//! by the header list size.
//!
//! Each stream is one request: routed, limited and hooked like an HTTP/1 request, then sent to
//! the upstream group in its protocol by the framed relays: HTTP/1.1 through the worker's
//! keep-alive pool ([`crate::exchange::framed_h1`]), or HTTP/2 over one multiplexed connection
//! per backend per worker ([`crate::exchange::framed_h2`]).
//! Responses stream back without buffering; a [`Finish`] guard carried by the body records
//! metrics, the access log line and `on_done` when the body ends or the client resets it.

use std::cell::Cell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::{ErrorKind, ProxyError};
use crate::exchange::{self, Admitted, Fields, Head, Peer, Record};
use crate::upstream::LocalExec;
use crate::worker::{Generation, Worker};
pub(crate) use request_body::RequestBody;

pub(crate) mod bridge;
mod codec;
mod errors;
mod hpack;
pub(crate) mod request_body;
mod stall;
mod websocket;
mod websocket_h2;

/// Per-stream receive window: how much request body a client may send ahead of the proxy.
/// Memory per connection is bounded by the connection window below.
pub(crate) const STREAM_WINDOW: u32 = 256 * 1024;
pub(crate) const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Streams a client may reset before they are even accepted (rapid reset).
const MAX_PENDING_RESETS: usize = 64;
/// Streams veloxy may reset because of client errors before closing the connection.
const MAX_LOCAL_RESETS: usize = 256;

/// What every stream of one client connection shares.
pub(crate) struct ConnCtx {
    worker: Rc<Worker>,
    peer: SocketAddr,
    /// The address the client connected to, when a PROXY-sending group needs it.
    local: Option<SocketAddr>,
    client_ip: String,
    listener: Arc<crate::runtime::ListenerState>,
    listener_index: Cell<(u64, usize)>,
    tls: bool,
    /// 2, or 3 for HTTP/3 request streams, which share this stream handler (logs, metrics).
    version: u8,
    /// Streams in progress, and when the last one ended (idle timeout; [`crate::clock::now_ms`]).
    active: Cell<usize>,
    last_active_ms: Cell<u64>,
    /// `[server] body_timeout` when the connection opened.
    body_timeout: Duration,
    /// Streaming responses, for the send-stall deadline (`send_timeout`).
    stalls: stall::Watch,
}

/// Serves one HTTP/2 connection until the client closes it, it idles out, or veloxy shuts
/// down (GOAWAY, then in-flight streams finish).
pub(crate) async fn serve<IO>(
    worker: Rc<Worker>,
    io: IO,
    (peer, local): (SocketAddr, Option<SocketAddr>),
    listener: Arc<crate::runtime::ListenerState>,
    proto: Multiplexed,
) where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (streams, header_bytes, idle_timeout, send_timeout, body_timeout) = {
        let gen = worker.current();
        let s = &gen.snapshot;
        let streams = s
            .listeners
            .iter()
            .find(|l| *l.name == *listener.name)
            .map_or(128, |l| l.h2_max_concurrent_streams);
        (
            streams,
            s.settings.max_header_bytes,
            s.settings.keepalive_timeout,
            s.settings.send_timeout,
            s.settings.body_timeout,
        )
    };
    let ctx = Rc::new(ConnCtx::new(
        worker.clone(),
        (peer, local),
        listener,
        proto,
        body_timeout,
    ));
    let builder = server_builder(streams, header_bytes);
    let svc_ctx = ctx.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let c = svc_ctx.clone();
        // Boxed: the exchange's future is several KB, and hyper moves the service's future
        // by value into its per-stream future and tokio into the stream's task, a memcpy of
        // the whole state each time (memmove was the largest user-space symbol of an h2load
        // profile). One allocation of the box costs less.
        Box::pin(async move {
            let mut resp = handle(c.clone(), req.map(RequestBody::H2)).await;
            hpack::mark_volatile(resp.headers_mut());
            Ok::<_, Infallible>(resp.map(|body| c.stalls.wrap(body)))
        })
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closing = false;
    // Set once a stream was cut for stalling: the client is broken or hostile, so the
    // connection closes as soon as no live stream is left, even one parked with no window.
    let mut stalled = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(client = %peer, error = %e, "HTTP/2 connection ended");
                }
                break;
            }
            _ = tick.tick() => {
                let cut = ctx.stalls.sweep(send_timeout);
                if cut > 0 {
                    worker.metrics.send_timeouts.add(cut as u64);
                    tracing::info!(client = %peer, streams = cut, "HTTP/2 send timeout: client opened no window; streams cut");
                    stalled = true;
                }
                if stalled && ctx.active.get() == 0 {
                    // Only cut streams are left, and hyper would wait for them forever.
                    break;
                }
                let idle_for =
                    crate::clock::since_ms(ctx.last_active_ms.get(), crate::clock::now_ms());
                let idle = ctx.active.get() == 0 && idle_for >= idle_timeout;
                if !closing && (worker.shutting_down() || idle) {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// hyper's HTTP/2 server with veloxy's bounds: streams, header list size, windows, and the
/// resets a client may cause.
fn server_builder(
    streams: u32,
    header_bytes: usize,
) -> hyper::server::conn::http2::Builder<LocalExec> {
    let mut builder = hyper::server::conn::http2::Builder::new(LocalExec);
    builder
        .timer(CoarseTimer(TokioTimer::new()))
        .max_concurrent_streams(streams)
        .max_header_list_size(header_bytes.min(u32::MAX as usize) as u32)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buf_size(STREAM_WINDOW as usize)
        .max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .max_local_error_reset_streams(Some(MAX_LOCAL_RESETS))
        // SETTINGS_ENABLE_CONNECT_PROTOCOL: WebSocket over HTTP/2 (RFC 8441, `websocket`).
        .enable_connect_protocol()
        // Pings find clients that vanished without a FIN.
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
}

/// Tokio's timer for hyper, but `now()` reads the coarse clock: hyper's keep-alive ping reads
/// the time on every frame it receives, only to compare it with a 30 s interval.
#[derive(Clone)]
struct CoarseTimer(TokioTimer);

impl hyper::rt::Timer for CoarseTimer {
    fn sleep(&self, d: Duration) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        self.0.sleep(d)
    }
    fn sleep_until(&self, at: std::time::Instant) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        self.0.sleep_until(at)
    }
    fn reset(&self, sleep: &mut std::pin::Pin<Box<dyn hyper::rt::Sleep>>, at: std::time::Instant) {
        self.0.reset(sleep, at)
    }
    fn now(&self) -> std::time::Instant {
        crate::clock::coarse_instant()
    }
}

impl Drop for ConnCtx {
    fn drop(&mut self) {
        let open = &self.worker.h2_connections;
        open.set(open.get() - 1);
    }
}

/// Ends a stream's exchange: its record (metrics, access log, `on_done`) and the connection's
/// stream count. Carried by the response body, so it runs when the body is complete or the
/// client resets the stream.
pub(crate) struct Finish {
    conn: Rc<ConnCtx>,
    pub record: Record,
    pub status: u16,
    pub bytes_sent: u64,
    /// The route's concurrency slot, once taken.
    pub admission: exchange::Slot,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let c = &self.conn;
        c.active.set(c.active.get() - 1);
        c.last_active_ms.set(crate::clock::now_ms());
        c.worker.metrics.in_flight_done.inc();
        self.record
            .finish(&c.worker, c.peer, self.status, self.bytes_sent);
    }
}

/// A stream's response body (see [`crate::exchange::framed::ResponseBody`]).
pub(crate) type ProxyBody = crate::exchange::framed::ResponseBody<Finish>;

pub(crate) async fn handle(c: Rc<ConnCtx>, req: Request<RequestBody>) -> Response<ProxyBody> {
    let w = c.worker.clone();
    if c.version == 3 {
        w.metrics.h3_streams.inc();
    } else {
        w.metrics.h2_streams.inc();
    }
    w.metrics.in_flight.inc();
    c.active.set(c.active.get() + 1);
    let record = Record::start(&w, || {
        let target = req
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        let header = |n: http::header::HeaderName| {
            req.headers()
                .get(n)
                .map_or_else(Vec::new, |v| v.as_bytes().to_vec())
        };
        (
            req.method().as_str().to_owned(),
            target,
            c.version,
            header(http::header::REFERER),
            header(http::header::USER_AGENT),
        )
    });
    let grpc = errors::grpc_kind(req.headers());
    let mut fin = Some(Box::new(Finish {
        conn: c.clone(),
        record,
        status: 0,
        bytes_sent: 0,
        admission: None,
    }));
    let gen = w.current();
    match admit_and_drive(&c, &gen, req, &mut fin).await {
        Ok(resp) => resp,
        Err(e) => {
            w.count_error(&e);
            match e.side {
                crate::error::Side::Upstream => {
                    tracing::warn!(error = %e.report(), "upstream error (HTTP/2 client)")
                }
                crate::error::Side::Internal => {
                    tracing::error!(error = %e.report(), "internal error (HTTP/2 client)")
                }
                crate::error::Side::Downstream => {
                    tracing::debug!(error = %e.report(), "request refused (HTTP/2)")
                }
            }
            let mut fin = fin.unwrap_or_else(|| unreachable!("taken only on success"));
            fin.status = if grpc.is_some() { 200 } else { e.status() };
            errors::error_response(&e, grpc, fin)
        }
    }
}

/// A multiplexed client connection's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Multiplexed {
    /// HTTP/2 with prior knowledge, in clear text.
    H2c,
    /// HTTP/2 over TLS (ALPN h2).
    H2,
    /// HTTP/3 over QUIC.
    H3,
}

/// Marks a request that arrived in TLS early data (QUIC 0-RTT, `quic_0rtt = true`).
#[derive(Clone, Copy)]
pub(crate) struct EarlyData;

/// Whether a request may be served from early data, where an attacker can replay it: only the
/// safe methods, QUERY among them (draft-ietf-httpbis-safe-method-w-body). (PUT and DELETE are idempotent, but a replay after a later change undoes
/// that change, so they wait for the handshake too.)
fn replay_safe(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    ) || method.as_str() == "QUERY"
}

/// Admits one stream through the exchange core, then runs the exchange driver on it.
async fn admit_and_drive(
    c: &Rc<ConnCtx>,
    gen: &Rc<Generation>,
    req: Request<RequestBody>,
    fin: &mut Option<Box<Finish>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let host = crate::exchange::framed::authority(req.uri(), req.headers());
    // The same check as for HTTP/1 Host headers: no userinfo, path or query characters can
    // ride in on a Host header (or `:authority`) and be spliced into the upstream request.
    if !host.is_empty() && !crate::http1::request::valid_authority(host.as_bytes()) {
        return Err(ProxyError::downstream(ErrorKind::BadRequest(
            "invalid authority",
        )));
    }
    let websocket = *req.method() == http::Method::CONNECT && websocket::extended(&req)?;
    let early = req.extensions().get::<EarlyData>().is_some();
    if early && !replay_safe(req.method()) {
        return Err(ProxyError::downstream(ErrorKind::TooEarly));
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let head = Head {
        // An extended CONNECT for a WebSocket is routed as the GET its HTTP/1.1 form is.
        method: if websocket {
            "GET"
        } else {
            req.method().as_str()
        },
        target: path,
        host: host.as_bytes(),
        version: c.version,
        fields: Fields::H2(req.headers()),
    };
    let peer = Peer {
        addr: c.peer,
        local: c.local,
        client_ip: &c.client_ip,
        listener: &c.listener.name,
        listener_index: &c.listener_index,
        tls: c.tls,
        server_port: c.listener.port,
    };
    let f = fin.as_deref_mut().expect("present until success");
    let mut admitted = match exchange::admit(&c.worker, gen, &peer, &head, &mut f.record) {
        Ok(a) => a,
        Err(e) => return Err(errors::drain_after_413(&c.worker, req.into_body(), e)),
    };
    if websocket {
        admitted = websocket::admitted(admitted)?;
    }
    if let (true, Admitted::Proxy(target)) = (early, &mut admitted) {
        // RFC 8470: the upstream learns the request may be a replay (and may answer 425).
        target
            .edit
            .get_or_insert_with(crate::exchange::edit::UpstreamEdit::empty)
            .push_lines(b"Early-Data: 1\r\n");
    }
    let codec = codec::H2 {
        c,
        req,
        admitted,
        fin,
    };
    exchange::drive::drive(&c.worker, gen, codec).await
}

/// An HTTP/2 stream or connection failure reported by hyper, as an I/O error of the side it
/// happened on.
pub(crate) fn hyper_error(upstream: bool, cause: hyper::Error) -> ProxyError {
    let e = if upstream {
        ProxyError::upstream(ErrorKind::Stream)
    } else {
        ProxyError::downstream(ErrorKind::Stream)
    };
    e.because(cause)
}

impl crate::exchange::framed::End for Finish {
    fn sent(&mut self, n: u64) {
        self.bytes_sent += n;
        self.conn.worker.metrics.bytes_out.add(n);
    }
    fn status(&self) -> u16 {
        self.status
    }
    fn set_status(&mut self, status: u16) {
        self.status = status;
    }
    fn record(&mut self) -> &mut Record {
        &mut self.record
    }
    fn slot(&mut self) -> &mut exchange::Slot {
        &mut self.admission
    }
}

impl crate::exchange::framed::FramedClient for ConnCtx {
    type Body = RequestBody;
    type End = Finish;
    fn worker(&self) -> &Rc<Worker> {
        &self.worker
    }
    fn peer(&self) -> SocketAddr {
        self.peer
    }
    fn client_ip(&self) -> &str {
        &self.client_ip
    }
    fn proto(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
    fn version(&self) -> u8 {
        self.version
    }
    fn body_timeout(&self) -> Duration {
        self.body_timeout
    }
    fn stalled(&self, body: &RequestBody) -> bool {
        body.stalled()
    }
    fn drain(&self, body: RequestBody, e: ProxyError) -> ProxyError {
        errors::drain_after_413(&self.worker, body, e)
    }
}

impl ConnCtx {
    /// The shared state of one client connection (HTTP/2, or HTTP/3 with `version` 3),
    /// counted in the worker's open multiplexed connections until its last stream ends:
    /// shutdown waits for them.
    pub(crate) fn new(
        worker: Rc<Worker>,
        (peer, local): (SocketAddr, Option<SocketAddr>),
        listener: Arc<crate::runtime::ListenerState>,
        proto: Multiplexed,
        body_timeout: Duration,
    ) -> ConnCtx {
        let (tls, version) = match proto {
            Multiplexed::H2c => (false, 2),
            Multiplexed::H2 => (true, 2),
            Multiplexed::H3 => (true, 3),
        };
        worker.h2_connections.set(worker.h2_connections.get() + 1);
        ConnCtx {
            worker,
            peer,
            local,
            client_ip: peer.ip().to_string(),
            listener,
            listener_index: Cell::new((0, 0)),
            tls,
            version,
            active: Cell::new(0),
            last_active_ms: Cell::new(crate::clock::now_ms()),
            body_timeout,
            stalls: stall::Watch::default(),
        }
    }
}
