//! The HTTP/1.1 upstream client: one attempt on one backend, written once for every caller
//! (an HTTP/1 client's request, an HTTP/2 or HTTP/3 client's request to an HTTP/1 group, a
//! cache fill). The HTTP/2 client is [`super::h2`].
//!
//! An attempt takes a pooled connection (or opens one), writes the request head, lets the
//! caller stream the body, then reads the response head within the group's `read_timeout`
//! (interim 1xx heads skipped, the deadline not extended by them, or forwarded: the HTTP/1
//! client's reader returns them to the caller, which writes them and reads on with
//! [`next_head`] within one more `read_timeout`; the framed clients' reader hands them to the
//! codec's [`crate::hints::Interims`]). A pooled connection the backend had closed (a write
//! error, or a close before any response byte) is replaced once
//! by a fresh one when the request is replayable; that is not a retry. What the head means is
//! the caller's [`HeadReader`]: the HTTP/1 client's writes the downstream head while it
//! parses (the fast path: no second pass), the others parse into a header map.

use bytes::{Buf, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::attempt::{AttemptFail, ExchangeError};
use crate::deadline::timeout;
use crate::error::{ErrorKind, ProxyError};
use crate::http1::body::{reserve, READ_CHUNK};
use crate::otel::span::EventName;
use crate::upstream::pool::UpstreamConn;
use crate::worker::{Generation, Worker};

/// What a [`HeadReader`] made of the bytes read so far.
pub(crate) enum HeadParse<H> {
    /// Not a whole head yet.
    Partial,
    /// An interim (1xx) head this long: skipped.
    Interim(usize),
    /// The final head.
    Final(H),
}

/// Parses a response head for one caller of [`attempt`].
pub(crate) trait HeadReader {
    type Head;
    fn parse(&mut self, buf: &[u8]) -> Result<HeadParse<Self::Head>, ProxyError>;
}

/// Where an attempt goes: a backend of an upstream group, for a client (the PROXY header's
/// origin, for groups that send one).
#[derive(Clone, Copy)]
pub(crate) struct Backend<'a> {
    pub upstream: usize,
    pub backend: usize,
    pub origin: Option<crate::upstream::proxy_header::Origin>,
    /// A sampled exchange: the attempt's events (connected, request sent, response head).
    pub trace: Option<&'a crate::otel::Trace>,
}

/// One HTTP/1.1 attempt on `to`: a pooled connection (or a new one), the request head `wbuf`,
/// then what `body` writes, then the response head (interim heads skipped) read into `ubuf`,
/// which holds it and the bytes after it on return. `replayable`: a stale pooled connection
/// may be replaced by a fresh one.
pub(crate) async fn attempt<E: ExchangeError, R: HeadReader>(
    (worker, gen): (&Worker, &Generation),
    to: Backend<'_>,
    wbuf: &[u8],
    ubuf: &mut BytesMut,
    mut body: impl AsyncFnMut(&mut UpstreamConn) -> Result<(), AttemptFail<E>>,
    reader: &mut R,
    replayable: bool,
) -> Result<(UpstreamConn, R::Head), AttemptFail<E>> {
    let up = |kind| ProxyError::upstream(kind);
    let group = &gen.snapshot.upstreams[to.upstream];
    let pooled = gen.group(to.upstream).pool.take(to.backend, to.origin);
    let connect = || async {
        crate::upstream::connect::connect_backend(&*worker.metrics, group, to.backend, to.origin)
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
    'attempt: loop {
        if let Some(t) = to.trace {
            super::trace::connected(t, &conn, reused);
        }
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
        if let Some(t) = to.trace {
            super::trace::event(t, EventName::RequestSent, None);
        }
        match read_head(group.read_timeout, &mut conn, ubuf, reader).await? {
            Some(head) => {
                if let Some(t) = to.trace {
                    super::trace::event(t, EventName::ResponseHead, None);
                }
                return Ok((conn, head));
            }
            None if reused && replayable => {
                // A pooled connection the upstream had closed: replay on a fresh one.
                conn = connect().await?;
                reused = false;
            }
            None => return Err(AttemptFail::NoResponse(up(ErrorKind::UpstreamClosed))),
        }
    }
}

/// Reads the final response head. Bytes already read are parsed before reading more: an
/// interim and the final head often arrive together. `None`: the upstream closed before
/// sending a byte.
async fn read_head<E: ExchangeError, R: HeadReader>(
    read_timeout: std::time::Duration,
    conn: &mut UpstreamConn,
    ubuf: &mut BytesMut,
    reader: &mut R,
) -> Result<Option<R::Head>, AttemptFail<E>> {
    // `read_timeout` bounds the whole wait for the final head, interim responses included.
    let deadline = Instant::now() + read_timeout;
    ubuf.clear();
    next_head(deadline, conn, ubuf, reader).await
}

/// Reads on to the next head the reader stops at (after an interim head a caller forwards:
/// its bytes are advanced past, and `ubuf` may already hold the next one), until `deadline`.
/// `None`: the upstream closed with `ubuf` empty.
pub(crate) async fn next_head<E: ExchangeError, R: HeadReader>(
    deadline: Instant,
    conn: &mut UpstreamConn,
    ubuf: &mut BytesMut,
    reader: &mut R,
) -> Result<Option<R::Head>, AttemptFail<E>> {
    use crate::http1::response::MAX_RESPONSE_HEAD;
    let no_response = |kind| AttemptFail::NoResponse(ProxyError::upstream(kind));
    let fatal = |kind| AttemptFail::Fatal(E::from_error(ProxyError::upstream(kind)));
    loop {
        if !ubuf.is_empty() {
            match reader.parse(ubuf) {
                Err(e) => return Err(AttemptFail::Fatal(E::from_error(e))),
                Ok(HeadParse::Partial) if ubuf.len() > MAX_RESPONSE_HEAD => {
                    return Err(fatal(ErrorKind::BadResponse("response head too large")))
                }
                Ok(HeadParse::Partial) => {}
                Ok(HeadParse::Interim(len)) => {
                    ubuf.advance(len);
                    continue;
                }
                Ok(HeadParse::Final(head)) => return Ok(Some(head)),
            }
        }
        reserve(ubuf, READ_CHUNK);
        let n = match tokio::time::timeout_at(deadline, conn.stream.read_buf(ubuf)).await {
            Err(_) => return Err(no_response(ErrorKind::ReadTimeout)),
            Ok(Ok(n)) => n,
            Ok(Err(e)) if ubuf.is_empty() && e.kind() != std::io::ErrorKind::ConnectionReset => {
                return Err(no_response(ErrorKind::Io(e)))
            }
            Ok(Err(_)) => 0,
        };
        if n == 0 {
            return match ubuf.is_empty() {
                true => Ok(None),
                false => Err(fatal(ErrorKind::UpstreamClosed)),
            };
        }
    }
}

/// The [`HeadReader`] of callers that want the head as a header map (HTTP/2 and HTTP/3
/// clients, the cache fill). With `retry_on`, a status in it comes back as
/// [`AttemptFail::RetryStatus`] from [`foreign_relaying`].
pub(crate) struct Foreign {
    pub request_is_head: bool,
    /// [`Tries::whole`].
    pub te_over_cl: bool,
    /// Where a forwardable interim head goes (a framed client's codec that can send one);
    /// `None`: skipped.
    pub interims: Option<crate::hints::Interims>,
}

impl HeadReader for Foreign {
    type Head = crate::http1::response::ForeignHead;
    fn parse(&mut self, buf: &[u8]) -> Result<HeadParse<Self::Head>, ProxyError> {
        Ok(
            match crate::http1::response::parse_foreign(buf, self.request_is_head, self.te_over_cl)?
            {
                None => HeadParse::Partial,
                Some(Err(interim)) => {
                    if let Some(to) = &self.interims {
                        to.forward(&buf[..interim]);
                    }
                    HeadParse::Interim(interim)
                }
                Some(Ok(head)) => HeadParse::Final(head),
            },
        )
    }
}

/// How an attempt through [`foreign_relaying`] may go.
#[derive(Clone, Copy)]
pub(crate) struct Tries {
    /// The request is a HEAD: its response has no body whatever its fields say.
    pub is_head: bool,
    /// A stale pooled connection may be replaced by a fresh one (idempotent, body buffered).
    pub replayable: bool,
    /// A `retry_on` status comes back as [`AttemptFail::RetryStatus`].
    pub may_retry_status: bool,
    /// The caller reads the body whole and the connection is then dropped when its framing
    /// was ambiguous (the cache fill): a Content-Length beside a chunked Transfer-Encoding is
    /// dropped rather than refused (RFC 9112 6.3).
    pub whole: bool,
}

/// How an attempt through [`foreign_relaying`] failed.
pub(crate) type HeadFail = AttemptFail<ProxyError>;

/// An [`attempt`] whose head is parsed into a header map, in a recycled worker buffer
/// returned with the bytes read after the head. With `may_retry_status`, a `retry_on` status
/// comes back as [`AttemptFail::RetryStatus`]. A forwardable interim
/// (1xx) head goes to `interims` when there is one.
pub(crate) async fn foreign_relaying(
    (worker, gen): (&Worker, &Generation),
    to: Backend<'_>,
    wbuf: &[u8],
    body: impl AsyncFnMut(&mut UpstreamConn) -> Result<(), HeadFail>,
    (tries, interims): (Tries, Option<crate::hints::Interims>),
) -> Result<(UpstreamConn, crate::http1::response::ForeignHead, BytesMut), HeadFail> {
    // A recycled worker buffer: response bytes are copied out of it into right-sized frames,
    // so no 16 KiB allocation lives as long as a response body does.
    let mut ubuf = worker.take_bytes();
    let mut reader = Foreign {
        request_is_head: tries.is_head,
        te_over_cl: tries.whole,
        interims,
    };
    let (conn, head) = attempt(
        (worker, gen),
        to,
        wbuf,
        &mut ubuf,
        body,
        &mut reader,
        tries.replayable,
    )
    .await?;
    let group = &gen.snapshot.upstreams[to.upstream];
    if tries.may_retry_status && group.retry_on.contains(&head.status) {
        return Err(AttemptFail::RetryStatus(head.status));
    }
    ubuf.advance(head.head_len);
    Ok((conn, head, ubuf))
}
