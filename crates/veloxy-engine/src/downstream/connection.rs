//! The HTTP/1 downstream codec, once [`super::setup`] has settled on HTTP/1: request heads are
//! read (keep-alive, pipelining, header timeout, idle buffers freed), admitted through the
//! [`crate::exchange`] core, and forwarded by [`crate::downstream::proxy`] (or the HTTP/1 -> h2
//! bridge) or answered from files; errors get an answer and a clean (lingering) close.

use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::idle::{IdleRead, IdleTls, Waited};
use crate::config::UpstreamProtocol;
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::{self, Admitted, Fields, Head, Peer, ProxyTarget, Record};
use crate::http1::request::{self, Forwarded, Limits, RequestView};
use crate::http1::{write_error_response, BodyKind, MAX_HEADERS};
use crate::tls::DownstreamIo;
use crate::worker::{Generation, Worker};

/// Read buffer for request heads starts this big and grows only for large heads.
pub(super) const HEAD_BUF: usize = 8 * 1024;

pub(crate) struct Downstream {
    pub stream: DownstreamIo,
    pub peer: SocketAddr,
    /// The address the client connected to: known when some upstream group sends PROXY
    /// headers (which name it), else `None` (no syscall spent on it).
    pub local: Option<SocketAddr>,
    /// Formatted once per connection for X-Forwarded-For.
    pub client_ip: String,
    pub rbuf: BytesMut,
    /// The listener this connection came in on; routes are looked up by its name in the
    /// current config, with the index cached per config generation.
    pub listener: std::sync::Arc<crate::runtime::ListenerState>,
    pub listener_index: std::cell::Cell<(u64, usize)>,
    pub metrics: std::sync::Arc<crate::metrics::WorkerMetrics>,
    /// Bytes written to this client so far (access log byte counts).
    pub bytes_sent: u64,
    /// Close with a reset (the response was cut short by the upstream: a clean close could
    /// look like a complete close-delimited body).
    pub reset: bool,
    /// h2c prior knowledge is accepted on this (plain) connection.
    pub http2: bool,
    /// `[server] send_timeout`, `body_timeout` and `request_buffering` of the generation the
    /// current request runs on.
    pub send_timeout: Duration,
    pub body_timeout: Duration,
    pub request_buffering: crate::config::RequestBuffering,
}

/// A request refused before forwarding.
pub(crate) struct Refusal {
    error: ProxyError,
    /// Close after answering: the body is unread or the client asked to.
    must_close: bool,
    is_head: bool,
    /// Boxed: refusals are rare, and the `Result` carrying one stays small.
    record: Box<Record>,
}

impl Refusal {
    fn closing(error: ProxyError) -> Self {
        Refusal {
            error,
            must_close: true,
            is_head: false,
            record: Box::new(Record::unlogged()),
        }
    }
}

/// Starts an HTTP/1 request's record (its log fields copied only when the log is on).
fn start_record(worker: &Worker, req: &RequestView, down: &Downstream) -> Record {
    let mut record = Record::start(worker, || {
        (
            req.method.to_owned(),
            req.path.to_owned(),
            req.version,
            req.header("referer").unwrap_or(b"").to_vec(),
            req.header("user-agent").unwrap_or(b"").to_vec(),
        )
    });
    record.bytes_before = down.bytes_sent;
    record
}

/// Ends an HTTP/1 exchange's record: the bytes sent are what the connection sent since it
/// began.
pub(crate) fn finish_record(worker: &Worker, down: &Downstream, record: &mut Record, status: u16) {
    let sent = down.bytes_sent - record.bytes_before;
    record.finish(worker, down.peer, status, sent);
}

/// The settings a connection needs while it waits for a request head.
#[derive(Clone, Copy)]
struct ReadLimits {
    limits: Limits,
    header_timeout: Duration,
    keepalive_timeout: Duration,
}

impl ReadLimits {
    fn new(s: &crate::config::Settings) -> Self {
        ReadLimits {
            limits: Limits {
                max_header_bytes: s.max_header_bytes,
                max_uri_bytes: s.max_uri_bytes,
            },
            header_timeout: s.header_timeout,
            keepalive_timeout: s.keepalive_timeout,
        }
    }
}

/// What to do with a routed request.
// Forward is the hot path and lives on the stack for one request: boxing it would cost an
// allocation per request to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Next {
    Forward(Prepared),
    /// A file route's answer, computed while the request head was at hand.
    Static(Box<crate::downstream::files::StaticReply>),
}

/// A routed request, ready to forward.
pub(crate) struct Prepared {
    pub body: BodyKind,
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub is_head: bool,
    pub idempotent: bool,
    /// The client asked for a protocol upgrade (WebSocket).
    pub upgrade: bool,
    pub version: u8,
    /// Where admission sent it.
    pub target: ProxyTarget,
    /// The upstream request head, complete with its blank line (HTTP/1 upstream groups).
    pub head: Vec<u8>,
    /// The upstream request head for an `h2`/`h2c` group, built from the parsed request.
    pub h2_head: Option<Box<crate::exchange::h2_head::H2Head>>,
    pub record: Record,
    /// The route's concurrency slot once taken (see [`exchange::hold_slot`]): a cache fill
    /// that lets the request go upstream hands it on to the forward.
    pub slot: exchange::Slot,
}

/// Serves requests until the connection closes (`None`), or, for a connection idle for
/// `[server] park_idle_after`, until it should be parked: `Some(deadline)`, the end of its
/// keep-alive time (see [`crate::park`]).
pub(super) async fn serve_requests(
    worker: &Rc<Worker>,
    down: &mut Downstream,
    fresh: &mut bool,
) -> Option<Instant> {
    loop {
        // Bytes already read before the first request (an h2c listener's preface sniff read
        // them): its header timeout runs from now, not from a later read.
        let mut started = *fresh && !down.rbuf.is_empty();
        if down.rbuf.is_empty() {
            if let DownstreamIo::Plain(tcp) = &down.stream {
                // Between requests: the wait holds no buffer and no request state. Only the
                // keep-alive timeout is taken from the current config: holding the whole
                // generation would keep an old config's pools alive while the client idles.
                // Made in a block, so its settings are not kept in this future beside it.
                let idle = {
                    let s = &worker.current().snapshot.settings;
                    let (keepalive, park) = (s.keepalive_timeout, s.park_idle_after);
                    // A connection whose first request has not come stays: shutdown waits
                    // for it.
                    let park = (!*fresh && !park.is_zero() && park < keepalive).then_some(park);
                    IdleRead::new(worker, tcp, &mut down.rbuf, keepalive, park)
                };
                match idle.await {
                    Waited::Read(n) => {
                        down.metrics.bytes_in.add(n as u64);
                        started = true;
                    }
                    Waited::Gone => {
                        leave_fresh(worker, fresh);
                        return None;
                    }
                    Waited::Park(deadline) => return Some(deadline),
                }
            } else if let DownstreamIo::Tls(tls) = &mut down.stream {
                // TLS with nothing decrypted waiting: the wait holds no buffer and no request
                // state either (inside `serve_one` it held both, 10 KB more per idle client);
                // once a request is decrypted, it is read through TLS as usual.
                if tls.get_ref().1.wants_read() {
                    let keepalive = worker.current().snapshot.settings.keepalive_timeout;
                    if down.rbuf.capacity() > 0 {
                        worker.give_head_buf(std::mem::take(&mut down.rbuf));
                    }
                    if !IdleTls::new(tls, keepalive).await {
                        leave_fresh(worker, fresh);
                        return None;
                    }
                    down.rbuf = worker.take_head_buf(HEAD_BUF);
                }
            }
        }
        // Boxed: one request's state (the rest of its head, the routed request, forwarding,
        // file answers) is a few KiB; inline it would make every connection's future that
        // big for its whole life, idle keep-alive time included. The box is the request's
        // only allocation for it, and is freed before the connection waits again.
        if !Box::pin(serve_one(worker, down, started, fresh)).await {
            return None;
        }
    }
}

/// A connection's first request read (or its wait ended): it is no longer counted as fresh.
fn leave_fresh(worker: &Worker, fresh: &mut bool) {
    if std::mem::take(fresh) {
        worker.fresh.set(worker.fresh.get() - 1);
    }
}

/// Reads the rest of one request's head, then answers it; returns whether the connection
/// may serve another request. `started`: its first bytes are in the buffer, read after an
/// idle wait (the header timeout runs from now).
async fn serve_one(
    worker: &Rc<Worker>,
    down: &mut Downstream,
    started: bool,
    fresh: &mut bool,
) -> bool {
    let limits = ReadLimits::new(&worker.current().snapshot.settings);
    let outcome = read_request(worker, limits, down, started).await;
    leave_fresh(worker, fresh);
    let (prepared, gen) = match outcome {
        Ok(Some(p)) => p,
        Ok(None) => return false,
        // Boxed: an error answer is rare, and inline its state (the refusal's record among
        // it) would make every request's box bigger.
        Err(refusal) => return Box::pin(answer_refusal(worker, down, refusal)).await,
    };
    let keep = handle(worker, down, prepared, gen).await;
    worker.metrics.in_flight_done.inc();
    if down.reset {
        // SO_LINGER 0 is set: dropping the socket sends a reset, not a FIN.
        return false;
    }
    if !keep || worker.shutting_down() {
        // Lingering close: a client that pipelined more requests must not get a reset
        // that destroys the response it is still reading.
        linger_close(&mut down.stream).await;
        return false;
    }
    true
}

/// Answers a request refused before forwarding, then closes if the body (or the rest of a
/// malformed stream) is still unread, or the client asked to; returns whether the connection
/// may serve another request.
async fn answer_refusal(worker: &Rc<Worker>, down: &mut Downstream, refusal: Refusal) -> bool {
    let Refusal {
        error: e,
        must_close,
        is_head,
        mut record,
    } = refusal;
    let close = must_close || e.closes_connection();
    tracing::debug!(client = %down.peer, error = %e, "request refused");
    let a = crate::downstream::proxy::answer_error(worker, down, &e, close, is_head, &record).await;
    finish_record(worker, down, &mut record, e.status());
    if a.linger {
        linger_close(&mut down.stream).await;
    }
    a.keep
}

/// One routed request, from its admission to the end of its answer, through the exchange
/// driver ([`exchange::drive`]). Returns whether the connection may serve another request.
async fn handle(
    worker: &Rc<Worker>,
    down: &mut Downstream,
    prepared: Next,
    gen: Rc<Generation>,
) -> bool {
    let settings = &gen.snapshot.settings;
    down.send_timeout = settings.send_timeout;
    down.body_timeout = settings.body_timeout;
    down.request_buffering = settings.request_buffering;
    worker.metrics.in_flight.inc();
    let codec = crate::downstream::codec::H1 {
        interims: None,
        worker,
        down,
        next: prepared,
        spare: None,
    };
    exchange::drive::drive(worker, &gen, codec).await
}

/// Parses a complete request head already in the read buffer and prepares it; `Ok(None)`
/// while the head is incomplete. Synchronous on purpose: the header array (4 KiB) then lives
/// on the stack for the parse, not in every connection's future for its whole life.
fn parse_buffered(
    worker: &Worker,
    limits: &Limits,
    down: &mut Downstream,
) -> Result<Option<(Next, Rc<Generation>)>, Refusal> {
    let mut headers = [MaybeUninit::uninit(); MAX_HEADERS];
    match request::parse(&down.rbuf, &mut headers, limits) {
        Ok(Some(req)) => {
            let head_len = req.head_len;
            // On error: close if the body is unread or the client did not want more.
            let must_close = req.body != BodyKind::None || !req.keep_alive;
            let is_head = req.is_head();
            let record = start_record(worker, &req, down);
            let current = worker.current();
            let prepared = prepare(worker, &current, down, &req, record);
            // Consume the head either way: after an error answered on a kept
            // connection (404, 429, ...) the next request must start clean.
            down.rbuf.advance(head_len);
            match prepared {
                Ok(next) => Ok(Some((next, current))),
                Err(refused) => {
                    let (error, record) = *refused;
                    Err(Refusal {
                        error,
                        must_close,
                        is_head,
                        record: Box::new(record),
                    })
                }
            }
        }
        Ok(None) => {
            request::check_partial(&down.rbuf, limits).map_err(Refusal::closing)?;
            Ok(None)
        }
        Err(e) => Err(Refusal::closing(e)),
    }
}

/// Reads and prepares the next request. `Ok(None)`: the client closed or idled out.
///
/// Waiting uses `settings` (taken from the config current when the wait began); the request
/// itself is admitted on the generation current when its head is complete (returned with it),
/// so a reload reaches idle keep-alive clients. `started`: the buffer's bytes were just read
/// after an idle wait, so the header timeout runs from now.
async fn read_request(
    worker: &Worker,
    settings: ReadLimits,
    down: &mut Downstream,
    started: bool,
) -> Result<Option<(Next, Rc<Generation>)>, Refusal> {
    let limits = settings.limits;
    // The header timeout runs once bytes of the head have come; the clock is read only when
    // the head is not all there (most heads are complete in their first read).
    let mut timing = started;
    let mut deadline = None;
    loop {
        if !down.rbuf.is_empty() {
            if let Some(request) = parse_buffered(worker, &limits, down)? {
                return Ok(Some(request));
            }
        }
        let wait = if timing {
            let now = Instant::now();
            let d = *deadline.get_or_insert(now + settings.header_timeout);
            d.saturating_duration_since(now)
        } else if down.rbuf.is_empty() {
            settings.keepalive_timeout
        } else {
            settings.header_timeout
        };
        if down.rbuf.capacity() - down.rbuf.len() < 1024 {
            down.rbuf.reserve(HEAD_BUF);
        }
        match crate::deadline::timeout(wait, down.stream.read_buf(&mut down.rbuf)).await {
            Err(_) if down.rbuf.is_empty() => return Ok(None),
            Err(_) => {
                return Err(Refusal::closing(ProxyError::downstream(
                    ErrorKind::HeaderTimeout,
                )))
            }
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(n)) => {
                down.metrics.bytes_in.add(n as u64);
                timing = true;
            }
        }
    }
}

/// Admits the request through the exchange core, then, for a proxied route, writes the
/// upstream head; a file route's answer is computed while the head is at hand.
fn prepare(
    worker: &Worker,
    gen: &Generation,
    down: &Downstream,
    req: &RequestView,
    mut record: Record,
) -> Result<Next, Box<(ProxyError, Record)>> {
    let head = Head {
        method: req.method,
        target: req.path,
        host: req.host.unwrap_or(b""),
        version: req.version,
        fields: Fields::H1(req.headers),
    };
    let peer = Peer {
        addr: down.peer,
        local: down.local,
        client_ip: &down.client_ip,
        listener: &down.listener.name,
        listener_index: &down.listener_index,
        tls: down.stream.is_tls(),
        server_port: down.listener.port,
    };
    let target = match exchange::admit(worker, gen, &peer, &head, &mut record) {
        Err(e) => return Err(Box::new((e, record))),
        Ok(Admitted::Files(files)) => {
            let reply = crate::downstream::files::reply(worker, &files, req, record);
            return Ok(Next::Static(Box::new(reply)));
        }
        Ok(Admitted::Answer(answer)) => {
            let reply = crate::downstream::files::answer(worker, answer, req, record);
            return Ok(Next::Static(Box::new(reply)));
        }
        Ok(Admitted::Cached(r)) => {
            let reply = crate::downstream::files::StaticReply::new(worker, r, req, record);
            return Ok(Next::Static(Box::new(reply)));
        }
        Ok(Admitted::Proxy(t)) => t,
    };
    let (head, h2_head) = match upstream_head(worker, gen, down, req, &target, &record) {
        Ok(heads) => heads,
        Err(e) => return Err(Box::new((e, record))),
    };
    Ok(Next::Forward(Prepared {
        body: req.body,
        keep_alive: req.keep_alive,
        expect_continue: req.expect_continue,
        is_head: req.is_head(),
        idempotent: req.is_idempotent(),
        upgrade: req.upgrade.is_some(),
        version: req.version,
        target,
        head,
        h2_head,
        record,
        slot: None,
    }))
}

/// The upstream request head of a proxied request, written while the parsed head is at
/// hand: HTTP/1.1 bytes for an HTTP/1 group (complete with its blank line), else the HTTP/2
/// head for an `h2`/`h2c` group.
#[allow(clippy::type_complexity)]
fn upstream_head(
    worker: &Worker,
    gen: &Generation,
    down: &Downstream,
    req: &RequestView,
    target: &ProxyTarget,
    record: &Record,
) -> Result<(Vec<u8>, Option<Box<crate::exchange::h2_head::H2Head>>), ProxyError> {
    let group = &gen.snapshot.upstreams[target.upstream];
    let proto = if down.stream.is_tls() {
        "https"
    } else {
        "http"
    };
    let keep_underscores = gen.snapshot.settings.underscores_in_headers;
    let mut head = Vec::new();
    let mut h2_head = None;
    if group.protocol == UpstreamProtocol::Http1 {
        head = worker.take_vec();
        let fwd = Forwarded {
            client_ip: &down.client_ip,
            proto,
            keep_underscores,
            target: target.path.as_deref(),
            edit: target.edit.as_ref(),
        };
        request::write_upstream_head(req, &fwd, &mut head);
        if let Some(e) = &target.edit {
            e.added()
                .into_iter()
                .for_each(|l| head.extend_from_slice(l));
        }
        if req.host.is_none() && !target.edit.as_ref().is_some_and(|e| e.drops("host")) {
            // An HTTP/1.0 request without Host: HTTP/1.1 upstreams require one.
            let addr = group.backends[target.backend].authority();
            head.extend_from_slice(format!("Host: {addr}\r\n").as_bytes());
        }
        if let Some(c) = &record.ctx {
            head.extend_from_slice(&c.upstream_headers);
        }
        head.extend_from_slice(b"\r\n");
    } else {
        let host = std::str::from_utf8(req.host.unwrap_or(b"")).unwrap_or("");
        let fwd = crate::exchange::h2_head::Forwarding {
            client_ip: &down.client_ip,
            proto,
            host,
            keep_underscores,
            edit: target.edit.as_ref(),
        };
        let lines = record.ctx.as_ref().map(|c| c.upstream_headers.as_slice());
        let path = target.path.as_deref().unwrap_or(req.path);
        match crate::exchange::h2_head::H2Head::build(req, path, &fwd, group, target.backend, lines)
        {
            Ok(mut h) => {
                if let Some(web) = target.grpc_web {
                    h.grpc_web(web);
                }
                h2_head = Some(Box::new(h))
            }
            Err(e) => return Err(e),
        }
    }
    Ok((head, h2_head))
}

/// Answers a connection over the listener's `max_connections` with 503 and closes it.
pub(crate) async fn refuse(worker: Rc<Worker>, mut stream: TcpStream, tls: bool) {
    worker.metrics.shed_503.inc();
    if tls {
        // A plain-text answer would be garbage to a TLS client, and a handshake is the
        // expensive part this limit exists to avoid: close at once.
        return;
    }
    let msg = ErrorKind::TooManyConnections.to_string();
    if send_error(&worker, &mut stream, 503, &msg, true, false).await > 0 {
        linger_close(&mut stream).await;
    }
}

/// Writes one of veloxy's own short error responses; returns the bytes written (0: the client
/// is gone).
pub(crate) async fn send_error<S: tokio::io::AsyncWrite + Unpin>(
    worker: &Worker,
    stream: &mut S,
    status: u16,
    message: &str,
    close: bool,
    head_only: bool,
) -> usize {
    let mut out = worker.take_vec();
    write_error_response(&mut out, status, message, close, head_only);
    let written = send_all_within(stream, &out).await;
    worker.give_vec(out);
    written
}

/// Writes an error answer within 5 s; returns the bytes written (0: the client is gone).
pub(crate) async fn send_all_within<S: tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    out: &[u8],
) -> usize {
    let ok = tokio::time::timeout(Duration::from_secs(5), crate::tls::send_all(stream, out))
        .await
        .is_ok_and(|r| r.is_ok());
    if ok {
        out.len()
    } else {
        0
    }
}

/// Closes after an error without losing the response: half-close, then drain what the client
/// still sends for a moment so the kernel does not answer it with a reset that would destroy
/// the response in flight.
pub(crate) async fn linger_close<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
) {
    if stream.shutdown().await.is_err() {
        return;
    }
    // On the heap: an array here would sit in every connection's future for its whole life.
    let mut sink = vec![0u8; 4096];
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut drained = 0usize;
    while drained < 256 * 1024 {
        match tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
}
