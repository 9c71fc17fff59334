//! Forwarding one request: upstream connection (pooled or new), request head and body,
//! response head and body, and the keep-alive decisions on both sides.
//!
//! The fast path for a small request is four syscalls: read the request, write head and body to
//! the upstream in one write, read the response, write head and body to the client in one write.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

use crate::config::UpstreamGroup;
use crate::connection::{linger_close, send_error, Downstream, Prepared};
use crate::error::{ErrorKind, ProxyError, Side};
use crate::hooks::RequestSummary;
use crate::http1::chunked::{ChunkError, ChunkedScanner};
use crate::http1::response::{self, Parsed, ResponseMeta};
use crate::http1::BodyKind;
use crate::worker::{Generation, Worker};

/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Keep at least this much free space before reading a body chunk.
const READ_CHUNK: usize = 16 * 1024;
/// Time allowed for each write to, or read from, the client while a body is transferred.
const DOWNSTREAM_IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a body stands while it is relayed.
enum BodyState {
    Done,
    Length(u64),
    Chunked {
        scanner: ChunkedScanner,
        decode: bool,
    },
    UntilClose,
}

impl BodyState {
    fn new(kind: BodyKind, decode: bool) -> Self {
        match kind {
            BodyKind::None | BodyKind::Length(0) => BodyState::Done,
            BodyKind::Length(n) => BodyState::Length(n),
            BodyKind::Chunked => BodyState::Chunked {
                scanner: ChunkedScanner::new(),
                decode,
            },
            BodyKind::UntilClose => BodyState::UntilClose,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self, BodyState::Done)
    }

    fn decodes(&self) -> bool {
        matches!(self, BodyState::Chunked { decode: true, .. })
    }

    /// Consumes the body's bytes at the start of `data`; returns how many belong to the body.
    /// Bytes past the body's end are left for the next message.
    fn take(&mut self, data: &[u8]) -> Result<usize, ChunkError> {
        let n = match self {
            BodyState::Done => 0,
            BodyState::Length(rem) => {
                let n = (*rem).min(data.len() as u64);
                *rem -= n;
                n as usize
            }
            BodyState::Chunked { scanner, .. } => scanner.scan(data)?,
            BodyState::UntilClose => data.len(),
        };
        if matches!(self, BodyState::Length(0))
            || matches!(self, BodyState::Chunked { scanner, .. } if scanner.is_done())
        {
            *self = BodyState::Done;
        }
        Ok(n)
    }

    /// Like [`take`](Self::take), but appends the bytes to forward to `out`: the payload only
    /// when decoding chunked framing, everything otherwise.
    fn take_into(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<usize, ChunkError> {
        if let BodyState::Chunked {
            scanner,
            decode: true,
        } = self
        {
            let mut off = 0;
            while off < data.len() && !scanner.is_done() {
                let step = scanner.step(&data[off..])?;
                if step.payload {
                    out.extend_from_slice(&data[off..off + step.consumed]);
                }
                off += step.consumed;
            }
            if scanner.is_done() {
                *self = BodyState::Done;
            }
            return Ok(off);
        }
        let n = self.take(data)?;
        out.extend_from_slice(&data[..n]);
        Ok(n)
    }
}

/// How an exchange failed.
enum Fail {
    /// Nothing was sent to the client yet: answer with this error.
    BeforeResponse(ProxyError),
    /// The response started, or the client is gone: only closing is left.
    Abort(ProxyError),
}

fn up(kind: ErrorKind) -> Fail {
    Fail::BeforeResponse(ProxyError::upstream(kind))
}

fn reserve(buf: &mut BytesMut, min: usize) {
    if buf.capacity() - buf.len() < min {
        buf.reserve(min);
    }
}

/// Forwards one prepared request; returns whether the downstream connection stays open.
pub(crate) async fn forward(
    worker: &Worker,
    gen: &Generation,
    down: &mut Downstream,
    mut p: Prepared,
) -> bool {
    let group = &gen.snapshot.upstreams[p.upstream];
    let started = worker.shared.hooks.as_ref().map(|_| Instant::now());
    let mut wbuf = std::mem::take(&mut p.head);
    let mut ctx = p.ctx.take();
    let mut ubuf = worker.take_bytes();
    let mut obuf = worker.take_vec();

    // Body bytes that arrived with the head go out in the same write as the upstream head.
    let mut req_body = BodyState::new(p.body, false);
    let outcome = match req_body.take(&down.rbuf) {
        Err(_) => Err(Fail::BeforeResponse(ProxyError::downstream(
            ErrorKind::BadRequest("invalid chunked body"),
        ))),
        Ok(n) => {
            wbuf.extend_from_slice(&down.rbuf[..n]);
            down.rbuf.advance(n);
            exchange(
                worker,
                gen,
                group,
                down,
                &p,
                &mut ctx,
                &mut req_body,
                &wbuf,
                &mut ubuf,
                &mut obuf,
            )
            .await
        }
    };

    let (keep, status) = match outcome {
        Ok(meta) => (meta.downstream_keep_alive && p.keep_alive, meta.status),
        Err(Fail::BeforeResponse(e)) => {
            log_error(&e, group, p.backend);
            // Keep the client only if its request was fully read and the error is not its fault.
            let close = !req_body.is_done() || e.side == Side::Downstream || !p.keep_alive;
            let status = e.status();
            let sent =
                send_error(worker, &mut down.stream, status, &e.kind.to_string(), close).await;
            if close && sent {
                linger_close(&mut down.stream).await;
            }
            (sent && !close, status)
        }
        Err(Fail::Abort(e)) => {
            log_error(&e, group, p.backend);
            (false, 0)
        }
    };
    if let (Some(hooks), Some(ctx)) = (&worker.shared.hooks, ctx.as_deref_mut()) {
        let summary = RequestSummary {
            status,
            duration: started.map_or(Duration::ZERO, |s| s.elapsed()),
            backend: Some(group.backends[p.backend].addr),
        };
        hooks.on_done(&summary, ctx);
    }
    worker.give_vec(wbuf);
    worker.give_vec(obuf);
    worker.give_bytes(ubuf);
    keep
}

fn log_error(e: &ProxyError, group: &UpstreamGroup, backend: usize) {
    match e.side {
        Side::Upstream => tracing::warn!(
            upstream = %group.name,
            backend = %group.backends[backend].addr,
            error = %e.kind,
            "upstream error"
        ),
        Side::Downstream => tracing::debug!(error = %e.kind, "downstream error"),
    }
}

async fn connect(group: &UpstreamGroup, backend: usize) -> Result<TcpStream, Fail> {
    let addr = group.backends[backend].addr;
    match timeout(group.connect_timeout, TcpStream::connect(addr)).await {
        Err(_) => Err(up(ErrorKind::ConnectTimeout)),
        Ok(Err(e)) => Err(up(ErrorKind::Connect(e))),
        Ok(Ok(s)) => {
            // Once per upstream connection, never per request.
            let _ = s.set_nodelay(true);
            Ok(s)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn exchange(
    worker: &Worker,
    gen: &Generation,
    group: &UpstreamGroup,
    down: &mut Downstream,
    p: &Prepared,
    ctx: &mut Option<Box<crate::hooks::RequestCtx>>,
    req_body: &mut BodyState,
    wbuf: &[u8],
    ubuf: &mut BytesMut,
    obuf: &mut Vec<u8>,
) -> Result<ResponseMeta, Fail> {
    // A request that is idempotent and fully in `wbuf` can be replayed on a fresh connection
    // when a pooled one turns out to be dead (closed by the backend while idle).
    let replayable = p.idempotent && req_body.is_done();
    let pooled = gen.groups.borrow_mut()[p.upstream].pool.take(p.backend);
    let (mut conn, mut reused) = match pooled {
        Some(s) => (s, true),
        None => (connect(group, p.backend).await?, false),
    };

    let meta = 'attempt: loop {
        match timeout(group.write_timeout, conn.write_all(wbuf)).await {
            Err(_) => return Err(up(ErrorKind::WriteTimeout)),
            Ok(Err(_)) if reused && replayable => {
                conn = connect(group, p.backend).await?;
                reused = false;
                continue 'attempt;
            }
            Ok(Err(e)) => return Err(up(ErrorKind::Io(e))),
            Ok(Ok(())) => {}
        }
        if !req_body.is_done() {
            if p.expect_continue {
                let _ = down
                    .stream
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await;
            }
            relay_request_body(group, down, &mut conn, req_body, obuf).await?;
        }
        // Response head, skipping 1xx interim responses.
        ubuf.clear();
        loop {
            reserve(ubuf, READ_CHUNK);
            let n = match timeout(group.read_timeout, conn.read_buf(ubuf)).await {
                Err(_) => return Err(up(ErrorKind::ReadTimeout)),
                Ok(Ok(n)) => n,
                Ok(Err(e))
                    if ubuf.is_empty() && e.kind() != std::io::ErrorKind::ConnectionReset =>
                {
                    return Err(up(ErrorKind::Io(e)))
                }
                Ok(Err(_)) => 0,
            };
            if n == 0 {
                if ubuf.is_empty() && reused && replayable {
                    conn = connect(group, p.backend).await?;
                    reused = false;
                    continue 'attempt;
                }
                return Err(up(ErrorKind::UpstreamClosed));
            }
            obuf.clear();
            match response::parse_and_write(ubuf, p.is_head, p.version, p.keep_alive, obuf) {
                Err(e) => return Err(Fail::BeforeResponse(e)),
                Ok(Parsed::Partial) if ubuf.len() > MAX_RESPONSE_HEAD => {
                    return Err(up(ErrorKind::BadResponse("response head too large")))
                }
                Ok(Parsed::Partial) => {}
                Ok(Parsed::Interim(len)) => ubuf.advance(len),
                Ok(Parsed::Final(meta)) => break 'attempt meta,
            }
        }
    };

    // Downstream head, plus whatever body bytes already arrived, in one write.
    let mut meta = meta;
    if let (Some(hooks), Some(ctx)) = (&worker.shared.hooks, ctx.as_deref_mut()) {
        hooks.on_response(meta.status, ctx);
        obuf.extend_from_slice(&ctx.response_headers);
    }
    obuf.extend_from_slice(b"\r\n");
    ubuf.advance(meta.head_len);
    let mut resp_body = BodyState::new(meta.body, meta.decode_chunked);
    let n = resp_body
        .take_into(ubuf, obuf)
        .map_err(|_| up(ErrorKind::BadResponse("invalid chunked body")))?;
    ubuf.advance(n);
    if let Err(e) = write_down(&mut down.stream, obuf).await {
        return Err(Fail::Abort(e));
    }
    if !resp_body.is_done() {
        relay_response_body(group, down, &mut conn, ubuf, &mut resp_body, obuf).await?;
    }
    if meta.upstream_reusable
        && resp_body.is_done()
        && ubuf.is_empty()
        && req_body.is_done()
        && !worker.shutting_down()
    {
        gen.groups.borrow_mut()[p.upstream]
            .pool
            .put(p.backend, conn);
    } else if !resp_body.is_done() {
        meta.downstream_keep_alive = false;
    }
    Ok(meta)
}

async fn write_down(stream: &mut TcpStream, data: &[u8]) -> Result<(), ProxyError> {
    match timeout(DOWNSTREAM_IO_TIMEOUT, stream.write_all(data)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ProxyError::downstream(ErrorKind::Io(e))),
        Err(_) => Err(ProxyError::downstream(ErrorKind::Io(
            std::io::ErrorKind::TimedOut.into(),
        ))),
    }
}

/// Streams the rest of the request body from the client to the upstream, through the client's
/// read buffer (bounded: each read is forwarded before the next).
async fn relay_request_body(
    group: &UpstreamGroup,
    down: &mut Downstream,
    conn: &mut TcpStream,
    body: &mut BodyState,
    scratch: &mut Vec<u8>,
) -> Result<(), Fail> {
    while !body.is_done() {
        if down.rbuf.is_empty() {
            reserve(&mut down.rbuf, READ_CHUNK);
            match timeout(DOWNSTREAM_IO_TIMEOUT, down.stream.read_buf(&mut down.rbuf)).await {
                Ok(Ok(n)) if n > 0 => {}
                // The client vanished mid-body: nobody to answer.
                _ => {
                    return Err(Fail::Abort(ProxyError::downstream(ErrorKind::BadRequest(
                        "request body truncated",
                    ))))
                }
            }
        }
        let n = body.take(&down.rbuf).map_err(|_| {
            Fail::BeforeResponse(ProxyError::downstream(ErrorKind::BadRequest(
                "invalid chunked body",
            )))
        })?;
        scratch.clear();
        match timeout(group.write_timeout, conn.write_all(&down.rbuf[..n])).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(up(ErrorKind::Io(e))),
            Err(_) => return Err(up(ErrorKind::WriteTimeout)),
        }
        down.rbuf.advance(n);
    }
    Ok(())
}

/// Streams the rest of the response body from the upstream to the client.
async fn relay_response_body(
    group: &UpstreamGroup,
    down: &mut Downstream,
    conn: &mut TcpStream,
    ubuf: &mut BytesMut,
    body: &mut BodyState,
    scratch: &mut Vec<u8>,
) -> Result<(), Fail> {
    let abort_up = |kind| Fail::Abort(ProxyError::upstream(kind));
    while !body.is_done() {
        ubuf.clear();
        reserve(ubuf, READ_CHUNK * 2);
        let n = match timeout(group.read_timeout, conn.read_buf(ubuf)).await {
            Err(_) => return Err(abort_up(ErrorKind::ReadTimeout)),
            Ok(Err(e)) => return Err(abort_up(ErrorKind::Io(e))),
            Ok(Ok(n)) => n,
        };
        if n == 0 {
            if matches!(body, BodyState::UntilClose) {
                *body = BodyState::Done;
                break;
            }
            return Err(abort_up(ErrorKind::UpstreamClosed));
        }
        let bad = |_| abort_up(ErrorKind::BadResponse("invalid chunked body"));
        if body.decodes() {
            scratch.clear();
            let used = body.take_into(ubuf, scratch).map_err(bad)?;
            ubuf.advance(used);
            write_down(&mut down.stream, scratch)
                .await
                .map_err(Fail::Abort)?;
        } else {
            let used = body.take(ubuf).map_err(bad)?;
            write_down(&mut down.stream, &ubuf[..used])
                .await
                .map_err(Fail::Abort)?;
            ubuf.advance(used);
        }
    }
    Ok(())
}
