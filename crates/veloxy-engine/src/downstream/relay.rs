//! Relaying bodies: the framing state of a body in transit, and the pumps that move it
//! between downstream and upstream through bounded buffers.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::UpstreamGroup;
use crate::deadline::timeout;
use crate::downstream::connection::Downstream;
use crate::downstream::proxy::{up, Fail};
use crate::error::{ErrorKind, ProxyError};
use crate::http1::chunked::{ChunkError, ChunkedScanner};
use crate::http1::BodyKind;
use crate::tls::UpstreamIo;
use crate::upstream::pool::UpstreamConn;

/// Keep at least this much free space before reading a body chunk.
pub(crate) const READ_CHUNK: usize = 16 * 1024;

pub(crate) fn reserve(buf: &mut BytesMut, min: usize) {
    if buf.capacity() - buf.len() < min {
        buf.reserve(min);
    }
}

/// Where a body stands while it is relayed.
pub(crate) enum BodyState {
    Done,
    Length(u64),
    Chunked {
        scanner: ChunkedScanner,
        decode: bool,
        /// Request bodies: the trailer section, held until it ends so it can be forwarded
        /// filtered (see [`BodyState::take_request`]). `None`: forwarded as it comes.
        held: Option<Vec<u8>>,
        /// Request bodies: the bytes (chunk framing included) still allowed by the route's
        /// `max_body_bytes`.
        budget: u64,
    },
    UntilClose,
}

impl BodyState {
    pub fn new(kind: BodyKind, decode: bool) -> Self {
        match kind {
            BodyKind::None | BodyKind::Length(0) => BodyState::Done,
            BodyKind::Length(n) => BodyState::Length(n),
            BodyKind::Chunked => BodyState::Chunked {
                scanner: ChunkedScanner::new(),
                decode,
                held: None,
                budget: u64::MAX,
            },
            BodyKind::UntilClose => BodyState::UntilClose,
        }
    }

    /// A request body on its way upstream: verbatim, except that a chunked body's trailer
    /// section loses the fields an upstream could take for framing or routing.
    /// `max_body`: the route's `max_body_bytes` (a declared length was checked at
    /// admission; a chunked body is counted as it comes, framing included).
    pub fn request(kind: BodyKind, max_body: Option<u64>) -> Self {
        match BodyState::new(kind, false) {
            BodyState::Chunked { scanner, .. } => BodyState::Chunked {
                scanner,
                decode: false,
                held: Some(Vec::new()),
                budget: max_body.unwrap_or(u64::MAX),
            },
            other => other,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, BodyState::Done)
    }

    pub fn decodes(&self) -> bool {
        matches!(self, BodyState::Chunked { decode: true, .. })
    }

    /// Consumes the body's bytes at the start of `data`; returns how many belong to the body.
    /// Bytes past the body's end are left for the next message.
    pub fn take(&mut self, data: &[u8]) -> Result<usize, ChunkError> {
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
    pub fn take_into(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<usize, ChunkError> {
        if let BodyState::Chunked {
            scanner,
            decode: true,
            ..
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

    /// [`take`](Self::take) for a body made with [`request`](Self::request). Returns the bytes
    /// consumed and how many of them, from the start of `data`, to forward as they are. The
    /// trailer section is not among those: it is held (bounded by the scanner's limit) and,
    /// once complete, appended to `extra` filtered. When nothing is filtered out of a section
    /// that arrived whole in `data`, it is forwarded in place instead (no copy, `extra` empty).
    pub fn take_request(
        &mut self,
        data: &[u8],
        extra: &mut Vec<u8>,
    ) -> Result<(usize, usize), ChunkError> {
        let BodyState::Chunked {
            scanner,
            held: Some(held),
            budget,
            ..
        } = self
        else {
            let n = self.take(data)?;
            return Ok((n, n));
        };
        let (mut off, mut verbatim) = (0, 0);
        let held_before = held.len();
        while off < data.len() && !scanner.is_done() {
            let step = scanner.step(&data[off..])?;
            if step.trailer {
                held.extend_from_slice(&data[off..off + step.consumed]);
            } else {
                verbatim = off + step.consumed;
            }
            off += step.consumed;
        }
        *budget = budget
            .checked_sub(off as u64)
            .ok_or(ChunkError::OverLimit)?;
        if scanner.is_done() {
            let start = extra.len();
            let dropped = crate::http1::request::filter_trailer_section(held, extra);
            if !dropped && held_before == 0 {
                extra.truncate(start);
                verbatim = off;
            }
            *self = BodyState::Done;
        }
        Ok((off, verbatim))
    }

    /// [`take_request`](Self::take_request), appending the bytes to forward to `out`.
    pub fn take_request_into(
        &mut self,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, ChunkError> {
        let mut extra = Vec::new();
        let (n, verbatim) = self.take_request(data, &mut extra)?;
        out.extend_from_slice(&data[..verbatim]);
        out.extend_from_slice(&extra);
        Ok(n)
    }
}

/// The error for a request body the chunked scanner refused.
pub(crate) fn request_body_error(e: ChunkError) -> ProxyError {
    ProxyError::downstream(match e {
        ChunkError::OverLimit => ErrorKind::BodyTooLarge,
        _ => ErrorKind::BadRequest("invalid chunked body"),
    })
}

pub(crate) async fn write_down(down: &mut Downstream, data: &[u8]) -> Result<(), ProxyError> {
    match timeout(
        down.send_timeout,
        crate::tls::send_all(&mut down.stream, data),
    )
    .await
    {
        Ok(Ok(())) => {
            down.metrics.bytes_out.add(data.len() as u64);
            down.bytes_sent += data.len() as u64;
            Ok(())
        }
        Ok(Err(e)) => Err(ProxyError::downstream(ErrorKind::Io(e))),
        Err(_) => {
            down.metrics.send_timeouts.inc();
            Err(ProxyError::downstream(ErrorKind::SendTimeout))
        }
    }
}

/// Reads more of a request body into the client's read buffer, within `body_timeout`. A
/// stall gets a 408 (no response has started; an upstream connection holding a partial
/// request is dropped); a client that vanished mid-body leaves nobody to answer.
pub(crate) async fn read_body_more(down: &mut Downstream) -> Result<(), Fail> {
    reserve(&mut down.rbuf, READ_CHUNK);
    match timeout(down.body_timeout, down.stream.read_buf(&mut down.rbuf)).await {
        Ok(Ok(n)) if n > 0 => {
            down.metrics.bytes_in.add(n as u64);
            Ok(())
        }
        Err(_) => {
            down.metrics.body_timeouts.inc();
            Err(Fail::BeforeResponse(ProxyError::downstream(
                ErrorKind::BodyTimeout,
            )))
        }
        _ => Err(Fail::Abort(ProxyError::downstream(ErrorKind::BadRequest(
            "request body truncated",
        )))),
    }
}

/// Streams the rest of the request body from the client to the upstream, through the client's
/// read buffer (bounded: each read is forwarded before the next).
pub(crate) async fn relay_request_body(
    group: &UpstreamGroup,
    down: &mut Downstream,
    conn: &mut UpstreamIo,
    body: &mut BodyState,
) -> Result<(), Fail> {
    let mut extra = Vec::new();
    while !body.is_done() {
        if down.rbuf.is_empty() {
            read_body_more(down).await?;
        }
        extra.clear();
        let (n, verbatim) = body
            .take_request(&down.rbuf, &mut extra)
            .map_err(|e| Fail::BeforeResponse(request_body_error(e)))?;
        // A filtered trailer section goes in the same write as what precedes it (once per
        // body: everything else is sent from the read buffer as it is).
        if !extra.is_empty() {
            extra.splice(0..0, down.rbuf[..verbatim].iter().copied());
        }
        let out = if extra.is_empty() {
            &down.rbuf[..verbatim]
        } else {
            &extra[..]
        };
        match timeout(group.write_timeout, crate::tls::send_all(conn, out)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(up(ErrorKind::Io(e))),
            Err(_) => return Err(up(ErrorKind::WriteTimeout)),
        }
        down.rbuf.advance(n);
    }
    Ok(())
}

/// Streams the rest of the response body from the upstream to the client.
pub(crate) async fn relay_response_body(
    group: &UpstreamGroup,
    down: &mut Downstream,
    conn: &mut UpstreamIo,
    ubuf: &mut BytesMut,
    body: &mut BodyState,
    scratch: &mut Vec<u8>,
    mut encoder: Option<&mut crate::compress::StreamEncoder>,
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
                if let Some(enc) = encoder.as_deref_mut() {
                    let tail = crate::downstream::proxy::compress_step(enc, &[], true)
                        .map_err(Fail::Abort)?;
                    write_down(down, &tail).await.map_err(Fail::Abort)?;
                }
                break;
            }
            return Err(abort_up(ErrorKind::UpstreamClosed));
        }
        let bad = |_| abort_up(ErrorKind::BadResponse("invalid chunked body"));
        if let Some(enc) = encoder.as_deref_mut() {
            // Compressing: payload only (the body state decodes chunked framing), encoded
            // and flushed per read, so nothing accumulates.
            scratch.clear();
            let used = body.take_into(ubuf, scratch).map_err(bad)?;
            ubuf.advance(used);
            let coded = crate::downstream::proxy::compress_step(enc, scratch, body.is_done())
                .map_err(Fail::Abort)?;
            write_down(down, &coded).await.map_err(Fail::Abort)?;
        } else if body.decodes() {
            scratch.clear();
            let used = body.take_into(ubuf, scratch).map_err(bad)?;
            ubuf.advance(used);
            write_down(down, scratch).await.map_err(Fail::Abort)?;
        } else {
            let used = body.take(ubuf).map_err(bad)?;
            write_down(down, &ubuf[..used]).await.map_err(Fail::Abort)?;
            ubuf.advance(used);
        }
    }
    Ok(())
}

/// Relays an upgraded connection (WebSocket) both ways until both sides have closed, an error
/// occurs, or nothing moves for `idle`. Each direction is half-closed when its reader ends.
/// Returns the bytes received from the client.
pub(crate) async fn tunnel(down: &mut Downstream, up: &mut UpstreamIo, idle: Duration) -> u64 {
    let mut received = 0u64;
    let mut from_down = vec![0u8; READ_CHUNK];
    let mut from_up = vec![0u8; READ_CHUNK];
    let (mut down_open, mut up_open) = (true, true);
    while down_open || up_open {
        tokio::select! {
            r = down.stream.read(&mut from_down), if down_open => match r {
                Ok(n) if n > 0 => {
                    down.metrics.bytes_in.add(n as u64);
                    received += n as u64;
                    // A peer that stops reading must not pin the tunnel: every write and
                    // shutdown is bounded by the idle limit too.
                    let sent = timeout(idle, crate::tls::send_all(up, &from_down[..n])).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        return received;
                    }
                }
                _ => {
                    down_open = false;
                    let _ = timeout(idle, up.shutdown()).await;
                }
            },
            r = up.read(&mut from_up), if up_open => match r {
                Ok(n) if n > 0 => {
                    let sent = timeout(idle, write_down(down, &from_up[..n])).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        return received;
                    }
                }
                _ => {
                    up_open = false;
                    let _ = timeout(idle, down.stream.shutdown()).await;
                }
            },
            _ = tokio::time::sleep(idle) => return received,
        }
    }
    received
}

/// One HTTP/1.1 attempt on `backend` of `t`'s group: a pooled connection (or a new one), the
/// request head `wbuf`, then what `body` writes, then the response head (interim heads
/// skipped). Returns the connection, the head and the bytes read after it. A pooled
/// connection the backend had closed is replaced once by a fresh one when the request is
/// `replayable`. With `may_retry_status`, a `retry_on` status comes back as
/// [`attempt::AttemptFail::RetryStatus`].
pub(crate) async fn exchange_head(
    worker: &crate::worker::Worker,
    gen: &crate::worker::Generation,
    (t, backend): (&crate::exchange::ProxyTarget, usize),
    wbuf: &[u8],
    mut body: impl AsyncFnMut(&mut UpstreamConn) -> Result<(), HeadFail>,
    (is_head, replayable, may_retry_status): (bool, bool, bool),
) -> Result<(UpstreamConn, crate::http1::response::ForeignHead, BytesMut), HeadFail> {
    use crate::exchange::attempt::AttemptFail;
    use crate::http1::response::{parse_foreign, MAX_RESPONSE_HEAD};
    let up = |kind| ProxyError::upstream(kind);
    let group = &gen.snapshot.upstreams[t.upstream];
    let pooled = gen.groups.borrow_mut()[t.upstream]
        .pool
        .take(backend, t.origin);
    let connect = || async {
        crate::upstream::connect::connect_backend(&*worker.metrics, group, backend, t.origin)
            .await
            .map_err(|(error, health)| AttemptFail::NotSent { error, health })
    };
    let (mut conn, mut reused) = match pooled {
        Some(conn) => {
            worker.metrics.pool_hits.inc();
            (conn, true)
        }
        None => (connect().await?, false),
    };
    // A recycled worker buffer: response bytes are copied out of it into right-sized frames,
    // so no 16 KiB allocation lives as long as a response body does.
    let mut ubuf = worker.take_bytes();
    'attempt: loop {
        match timeout(
            group.write_timeout,
            crate::tls::send_all(&mut conn.stream, wbuf),
        )
        .await
        {
            Err(_) => return Err(AttemptFail::NoResponse(up(ErrorKind::WriteTimeout))),
            Ok(Err(_)) if reused && replayable => {
                conn = connect().await?;
                reused = false;
                continue 'attempt;
            }
            Ok(Err(e)) => return Err(AttemptFail::NoResponse(up(ErrorKind::Io(e)))),
            Ok(Ok(())) => {}
        }
        body(&mut conn).await?;
        // `read_timeout` bounds the whole wait for the final head, interim responses included.
        let head_deadline = tokio::time::Instant::now() + group.read_timeout;
        ubuf.clear();
        loop {
            if !ubuf.is_empty() {
                match parse_foreign(&ubuf, is_head) {
                    Err(e) => return Err(AttemptFail::Fatal(e)),
                    Ok(None) if ubuf.len() > MAX_RESPONSE_HEAD => {
                        return Err(AttemptFail::Fatal(up(ErrorKind::BadResponse(
                            "response head too large",
                        ))))
                    }
                    Ok(None) => {}
                    Ok(Some(Err(interim))) => {
                        ubuf.advance(interim);
                        continue;
                    }
                    Ok(Some(Ok(head))) => {
                        if may_retry_status && group.retry_on.contains(&head.status) {
                            return Err(AttemptFail::RetryStatus(head.status));
                        }
                        ubuf.advance(head.head_len);
                        return Ok((conn, head, ubuf));
                    }
                }
            }
            reserve(&mut ubuf, READ_CHUNK);
            let read = conn.stream.read_buf(&mut ubuf);
            let n = match tokio::time::timeout_at(head_deadline, read).await {
                Err(_) => return Err(AttemptFail::NoResponse(up(ErrorKind::ReadTimeout))),
                Ok(Ok(n)) => n,
                Ok(Err(_)) => 0,
            };
            if n == 0 {
                if ubuf.is_empty() && reused && replayable {
                    conn = connect().await?;
                    reused = false;
                    continue 'attempt;
                }
                if ubuf.is_empty() {
                    return Err(AttemptFail::NoResponse(up(ErrorKind::UpstreamClosed)));
                }
                return Err(AttemptFail::Fatal(up(ErrorKind::UpstreamClosed)));
            }
        }
    }
}

/// How an [`exchange_head`] attempt failed.
pub(crate) type HeadFail = crate::exchange::attempt::AttemptFail<ProxyError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `body` to a request body state in pieces of `step` bytes; returns what would be
    /// forwarded and whether it was forwarded in place (no filtered copy) throughout.
    fn forward(body: &[u8], step: usize) -> (Vec<u8>, bool) {
        let mut state = BodyState::request(BodyKind::Chunked, None);
        let (mut out, mut in_place, mut off) = (Vec::new(), true, 0);
        while !state.is_done() {
            let end = (off + step).min(body.len());
            let mut extra = Vec::new();
            let (n, verbatim) = state.take_request(&body[off..end], &mut extra).unwrap();
            out.extend_from_slice(&body[off..off + verbatim]);
            out.extend_from_slice(&extra);
            in_place &= extra.is_empty();
            off += n;
        }
        assert_eq!(off, body.len());
        (out, in_place)
    }

    #[test]
    fn request_trailers_are_filtered_whatever_the_reads() {
        let body = b"3\r\nabc\r\n0\r\nContent-Length: 9\r\nX-Sum: 1\r\nHost: evil\r\n\r\n";
        for step in [1, 2, 7, body.len()] {
            let (out, _) = forward(body, step);
            assert_eq!(out, b"3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n", "reads of {step}");
        }
        // Nothing to drop, all in one read: forwarded in place.
        let clean = b"3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n";
        assert_eq!(forward(clean, clean.len()), (clean.to_vec(), true));
        assert_eq!(forward(b"0\r\n\r\n", 5), (b"0\r\n\r\n".to_vec(), true));
        assert_eq!(forward(clean, 3).0, clean);
    }
}
