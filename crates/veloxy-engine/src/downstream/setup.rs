//! A new client connection, before its first request: the PROXY protocol header (trusted
//! peers), SNI passthrough to `[[streams]]`, the TLS handshake (and the tls-alpn-01 validation
//! handshakes it ends), then the protocol: an L4 stream, HTTP/2 (ALPN `h2` or the h2c
//! preface) or HTTP/1, whose codec is [`super::connection`].

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::connection::{serve_requests, Downstream, HEAD_BUF};
use crate::park::Parked;
use crate::tls::DownstreamIo;
use crate::worker::Worker;

/// A new connection's first steps (PROXY header, SNI peek, TLS handshake, the other
/// protocols), run as a task of their own: for HTTP/1 it ends by starting the connection's
/// long-lived task, [`serve_http1`], so none of this state (a few KiB) stays with it.
pub(crate) async fn start(
    worker: Rc<Worker>,
    stream: TcpStream,
    peer: SocketAddr,
    listener: std::sync::Arc<crate::runtime::ListenerState>,
) {
    match begin(worker.clone(), stream, peer, listener.clone()).await {
        Some(down) => {
            worker.fresh.set(worker.fresh.get() + 1);
            tokio::task::spawn_local(serve_http1(worker, down, true));
        }
        None => connection_closed(&worker, &listener),
    }
}

/// Serves HTTP/1 requests on a connection until it closes or parks: the task of every open
/// HTTP/1 connection, started by [`start`] or when a parked connection wakes.
///
/// Every idle keep-alive client costs this future until it parks, so it holds only the
/// `Downstream` and the wait for the next request; each request's state is boxed in
/// `serve_requests`.
async fn serve_http1(worker: Rc<Worker>, mut down: Box<Downstream>, mut fresh: bool) {
    let parkable = serve_requests(&worker, &mut down, &mut fresh).await;
    if fresh {
        worker.fresh.set(worker.fresh.get() - 1);
    }
    if let Some(deadline) = parkable {
        match park(&worker, down, deadline) {
            Ok(()) => return,
            // Not parked (no epoll instance): it waits in its task as before.
            Err(down) => return Box::pin(serve_unparked(&worker, down)).await,
        }
    }
    connection_closed(&worker, &down.listener);
}

/// A connection that could not park: served to its end without parking (boxed in
/// `serve_http1`, which would otherwise contain it).
async fn serve_unparked(worker: &Rc<Worker>, mut down: Box<Downstream>) {
    let mut fresh = false;
    while let Some(deadline) = serve_requests(worker, &mut down, &mut fresh).await {
        if Instant::now() >= deadline {
            break;
        }
    }
    connection_closed(worker, &down.listener);
}

fn connection_closed(worker: &Worker, listener: &crate::runtime::ListenerState) {
    listener
        .open
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    worker.connection_closed();
}

/// Parks an idle plain connection (see [`crate::park`]): its task ends, the connection stays
/// open and counted. On the worker's first park, its parking task starts.
fn park(
    worker: &Rc<Worker>,
    down: Box<Downstream>,
    deadline: Instant,
) -> Result<(), Box<Downstream>> {
    let Downstream {
        stream,
        peer,
        local,
        listener,
        http2,
        ..
    } = *down;
    let DownstreamIo::Plain(tcp) = stream else {
        unreachable!("only plain connections wait in IdleRead")
    };
    let tcp = match tcp.into_std() {
        Ok(tcp) => tcp,
        Err(_) => {
            connection_closed(worker, &listener);
            return Ok(());
        }
    };
    let parked = Parked {
        tcp,
        peer,
        local,
        listener,
        http2,
    };
    match worker.parking.park(parked, deadline) {
        Ok(lot) => {
            worker.metrics.parked.inc();
            // Its task, reactor slot and Downstream were freed: count it toward a trim.
            worker.idle_memory_freed(1);
            if let Some(lot) = lot {
                tokio::task::spawn_local(serve_parked(worker.clone(), lot));
            }
            Ok(())
        }
        Err(p) => unpark(worker, p).map_or(Ok(()), Err),
    }
}

/// A parked connection's socket back in the runtime, as a `Downstream`; `None` (counted as
/// closed) when the runtime refuses the socket.
fn unpark(worker: &Worker, p: Parked) -> Option<Box<Downstream>> {
    match TcpStream::from_std(p.tcp) {
        Ok(tcp) => {
            let io = DownstreamIo::Plain(tcp);
            let down = downstream(worker, io, p.peer, p.local, p.listener, p.http2);
            Some(Box::new(down))
        }
        Err(_) => {
            connection_closed(worker, &p.listener);
            None
        }
    }
}

/// The worker's parking task: starts the task of each parked connection whose client sent
/// something (or closed), and closes those whose keep-alive time ran out.
async fn serve_parked(worker: Rc<Worker>, mut lot: crate::park::Lot) {
    let (mut woken, mut expired) = (Vec::new(), Vec::new());
    loop {
        if let Err(e) = lot.next(&worker.parking, &mut woken, &mut expired).await {
            // Not expected (an epoll_wait error): log and look again a little later.
            tracing::warn!(error = %e, "parked connections' wait failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for p in woken.drain(..) {
            worker.metrics.unparked.inc();
            if let Some(down) = unpark(&worker, p) {
                tokio::task::spawn_local(serve_http1(worker.clone(), down, false));
            }
        }
        for p in expired.drain(..) {
            // Dropping the socket closes it: the keep-alive time is over.
            worker.metrics.unparked.inc();
            connection_closed(&worker, &p.listener);
        }
    }
}

/// A connection's state for HTTP/1, as it is before its first request.
fn downstream(
    worker: &Worker,
    stream: DownstreamIo,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    listener: std::sync::Arc<crate::runtime::ListenerState>,
    http2: bool,
) -> Downstream {
    let s = &worker.current().snapshot.settings;
    Downstream {
        stream,
        peer,
        local,
        client_ip: peer.ip().to_string(),
        rbuf: BytesMut::new(),
        listener,
        listener_index: std::cell::Cell::new((0, 0)),
        metrics: worker.metrics.clone(),
        bytes_sent: 0,
        reset: false,
        http2,
        send_timeout: s.send_timeout,
        body_timeout: s.body_timeout,
        request_buffering: s.request_buffering,
    }
}

/// A new connection up to its first HTTP/1 request: `None` when it ended here or was served
/// as another protocol (an L4 stream, HTTP/2).
async fn begin(
    worker: Rc<Worker>,
    mut stream: TcpStream,
    mut peer: SocketAddr,
    listener: std::sync::Arc<crate::runtime::ListenerState>,
) -> Option<Box<Downstream>> {
    worker.metrics.downstream_connections.inc();
    let ConnSetup {
        tls,
        plain_http,
        http2,
        header_timeout,
        tcp,
        stream_group,
        sni_streams,
        local,
    } = setup(&worker, &mut stream, &mut peer, &listener).await?;
    // SNI passthrough: a ClientHello naming a `[[streams]] sni` host is relayed untouched.
    let passthrough = match sni_streams.is_empty() {
        true => None,
        false => passthrough(&stream, &sni_streams, header_timeout).await?,
    };
    // A tcp listener routes by SNI too (nginx's ssl_preread): a named group, else its
    // default stream, else the connection is closed.
    if tcp && passthrough.or(stream_group).is_none() {
        return None;
    }
    let tls = if passthrough.is_some() { None } else { tls };
    let tls = Box::pin(tls_or_plain(
        &worker,
        &mut stream,
        tls,
        plain_http,
        header_timeout,
    ))
    .await?;
    let stream = match tls {
        None => DownstreamIo::Plain(stream),
        Some(config) => {
            match Box::pin(handshake(&worker, config, stream, peer, header_timeout)).await {
                None => return None,
                Some((io, true)) => {
                    Box::pin(crate::downstream::http2::serve(
                        worker.clone(),
                        io,
                        (peer, local),
                        listener,
                        crate::downstream::http2::Multiplexed::H2,
                    ))
                    .await;
                    return None;
                }
                Some((io, false)) => io,
            }
        }
    };
    // Boxed, as the first steps: inline it would make `serve`'s future 480 bytes, and tokio
    // rounds a task to 128 bytes (5 lines of them where the box makes it 3 plus 2 in the
    // allocator's own size classes).
    let mut down = Box::new(downstream(&worker, stream, peer, local, listener, http2));
    down.rbuf = BytesMut::with_capacity(HEAD_BUF);
    if let Some(group) = passthrough.or(stream_group) {
        Box::pin(crate::downstream::l4::serve(&worker, &mut down, group)).await;
        return None;
    }
    if down.http2 && !down.stream.is_tls() {
        // h2c prior knowledge: the connection opens with the HTTP/2 preface instead of a
        // request head. Anything else is HTTP/1 and goes on below with the bytes read.
        match Box::pin(sniff_preface(&mut down, header_timeout)).await {
            Sniffed::Http2 => {
                let Downstream {
                    stream,
                    rbuf,
                    peer,
                    local,
                    listener,
                    ..
                } = *down;
                let DownstreamIo::Plain(tcp) = stream else {
                    unreachable!("checked plain above")
                };
                let io = crate::tls::Prefixed::new(rbuf.freeze(), tcp);
                Box::pin(crate::downstream::http2::serve(
                    worker.clone(),
                    io,
                    (peer, local),
                    listener,
                    crate::downstream::http2::Multiplexed::H2c,
                ))
                .await;
                return None;
            }
            Sniffed::Gone => return None,
            Sniffed::Http1 => {}
        }
    }
    Some(down)
}

/// What a new connection needs of its listener's current config.
struct ConnSetup {
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// A TLS listener's `plain_http`.
    plain_http: Option<crate::config::PlainHttp>,
    http2: bool,
    header_timeout: Duration,
    /// A `protocol = "tcp"` listener, and its default L4 group.
    tcp: bool,
    stream_group: Option<usize>,
    sni_streams: Vec<(crate::router::HostMatch, usize)>,
    /// The address the client connected to, when some group sends PROXY headers.
    local: Option<SocketAddr>,
}

/// Reads the listener's settings from the current config and, on a `proxy_protocol`
/// listener, the PROXY header (which replaces `peer`). `None`: close the connection.
async fn setup(
    worker: &Worker,
    stream: &mut TcpStream,
    peer: &mut SocketAddr,
    listener: &crate::runtime::ListenerState,
) -> Option<ConnSetup> {
    let gen = worker.current();
    let spec = gen
        .snapshot
        .listeners
        .iter()
        .find(|l| *l.name == *listener.name);
    if spec.is_some_and(|l| l.proxy_protocol) {
        let trusted = gen.snapshot.settings.real_ip.as_ref();
        let limit = gen.snapshot.settings.header_timeout;
        // Boxed (as the other once-per-connection steps below): a header buffer inline
        // would stay in every connection's future for its whole life.
        let accept = crate::listener::proxy_protocol::accept(stream, *peer, trusted, limit);
        *peer = Box::pin(accept).await?;
    }
    Some(ConnSetup {
        tls: spec.and_then(|l| l.tls.clone()),
        plain_http: spec.and_then(|l| l.plain_http),
        http2: spec.is_some_and(|l| l.http2),
        header_timeout: gen.snapshot.settings.header_timeout,
        tcp: spec.is_some_and(|l| l.tcp),
        stream_group: spec.and_then(|l| l.stream),
        sni_streams: spec.map_or_else(Vec::new, |l| l.sni_streams.clone()),
        local: gen
            .snapshot
            .upstreams
            .iter()
            .any(|g| g.proxy_protocol > 0)
            .then(|| stream.local_addr().ok())
            .flatten(),
    })
}

/// The `[[streams]] sni` group the ClientHello's server name picks (`Some(None)`: none, the
/// connection is terminated here); `None`: the client closed.
async fn passthrough(
    stream: &TcpStream,
    sni_streams: &[(crate::router::HostMatch, usize)],
    header_timeout: Duration,
) -> Option<Option<usize>> {
    let peek = crate::listener::sni::peek_server_name(stream, header_timeout);
    match Box::pin(peek).await {
        crate::listener::sni::Hello::Name(name) => Some(
            sni_streams
                .iter()
                .find(|(m, _)| m.matches(name.as_bytes()))
                .map(|(_, g)| *g),
        ),
        crate::listener::sni::Hello::NoName => Some(None),
        crate::listener::sni::Hello::Close => None,
    }
}

/// The TLS handshake, bounded by the header timeout: a client that sends garbage or stalls
/// mid-handshake costs this one connection. Returns the stream and whether ALPN chose h2;
/// `None` when the handshake failed (counted).
async fn handshake(
    worker: &Worker,
    config: std::sync::Arc<rustls::ServerConfig>,
    stream: TcpStream,
    peer: SocketAddr,
    limit: Duration,
) -> Option<(DownstreamIo, bool)> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    // Boxed: the handshake state is large and would otherwise sit in every connection's
    // future for its whole life.
    let accept = Box::pin(tokio::time::timeout(limit, acceptor.accept(stream)));
    match accept.await {
        Ok(Ok(tls)) => {
            let alpn = tls.get_ref().1.alpn_protocol();
            if alpn == Some(crate::tls::ACME_TLS_ALPN) {
                // A tls-alpn-01 validation: the handshake was the whole exchange (RFC 8737).
                return None;
            }
            let h2 = alpn == Some(b"h2");
            Some((DownstreamIo::Tls(Box::new(tls)), h2))
        }
        Ok(Err(e)) => {
            worker.metrics.tls_handshake_errors.inc();
            tracing::debug!(client = %peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            worker.metrics.tls_handshake_errors.inc();
            None
        }
    }
}

/// The HTTP/2 connection preface (RFC 9113 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

enum Sniffed {
    Http1,
    Http2,
    Gone,
}

/// Reads until the bytes either complete the HTTP/2 preface or differ from it.
async fn sniff_preface(down: &mut Downstream, limit: Duration) -> Sniffed {
    let deadline = Instant::now() + limit;
    loop {
        let n = down.rbuf.len().min(H2_PREFACE.len());
        if down.rbuf[..n] != H2_PREFACE[..n] {
            // "PRI" is reserved for the preface (RFC 9113 3.4): a broken preface is closed
            // as HTTP/2 requires, not answered as an HTTP/1 request.
            if n >= 4 && down.rbuf.starts_with(b"PRI ") {
                return Sniffed::Gone;
            }
            return Sniffed::Http1;
        }
        if n == H2_PREFACE.len() {
            return Sniffed::Http2;
        }
        match tokio::time::timeout_at(deadline, down.stream.read_buf(&mut down.rbuf)).await {
            Ok(Ok(n)) if n > 0 => down.metrics.bytes_in.add(n as u64),
            _ => return Sniffed::Gone,
        }
    }
}

/// `plain_http` on a TLS listener: the TLS config when the client speaks TLS (its first
/// byte, peeked, is a handshake record), `Some(None)` when it speaks plain HTTP and is to be
/// served so (`"serve"`; `"redirect"` is answered at admission); `None` when it closed, sent
/// nothing in time, or was refused (`"reject"`: answered and closed here).
async fn tls_or_plain(
    worker: &Worker,
    stream: &mut TcpStream,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    plain_http: Option<crate::config::PlainHttp>,
    limit: Duration,
) -> Option<Option<std::sync::Arc<rustls::ServerConfig>>> {
    let (Some(config), Some(mode)) = (&tls, plain_http) else {
        return Some(tls);
    };
    match first_byte(stream, limit).await? {
        TLS_HANDSHAKE => Some(Some(config.clone())),
        _ if mode == crate::config::PlainHttp::Reject => {
            reject_plain(worker, stream).await;
            None
        }
        _ => Some(None),
    }
}

/// The first byte of every TLS connection: a handshake record (a ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// The client's first byte, left in the socket; `None` when it closed or sent nothing within
/// `limit`.
async fn first_byte(stream: &TcpStream, limit: Duration) -> Option<u8> {
    let mut buf = [0u8; 1];
    let deadline = Instant::now() + limit;
    match crate::listener::peek::peek_more(stream, &mut buf, 0, deadline).await {
        Ok(1) => Some(buf[0]),
        _ => None,
    }
}

/// `plain_http = "reject"`: a 400 that says what happened (nginx answers 400 for its 497),
/// then a lingering close so the client reads it.
async fn reject_plain(worker: &Worker, stream: &mut TcpStream) {
    let msg =
        "this port speaks HTTPS: the plain HTTP request was sent to an HTTPS port; use https://";
    if super::connection::send_error(worker, stream, 400, msg, true, false).await > 0 {
        super::connection::linger_close(stream).await;
    }
}
