//! Forwarding one request: admission, upstream connection (pooled or new), request head and
//! body, response head and body, retries to other backends, and the keep-alive decisions.
//!
//! The fast path for a small request is four syscalls: read the request, write head and body to
//! the upstream in one write, read the response, write head and body to the client in one write.
//!
//! Retries (to a different backend, `retries` times at most, within the worker's retry budget):
//! * connect failure or timeout, and a backend at its `max_connections`: always (nothing was
//!   sent);
//! * a reset or close before any response byte, and a status in `retry_on`: only idempotent
//!   requests whose body is fully buffered (`retry_body_limit`), never a half-sent body.
//!
//! A pooled connection found dead as it is reused is replayed once on a fresh connection to the
//! same backend, under the same idempotency rule; that is not counted as a retry.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::time::Instant;

use crate::compress::{self, StreamEncoder};
use crate::config::UpstreamGroup;
use crate::deadline::timeout;
use crate::downstream::connection::{linger_close, send_error, Downstream, Prepared};
use crate::downstream::relay::{
    read_body_more, relay_request_body, relay_response_body, write_down,
};
use crate::error::{ErrorKind, ProxyError, Side};
use crate::exchange::attempt::{self, ExchangeError, Plan};
use crate::exchange::h1::{self, HeadParse, HeadReader};
use crate::exchange::{self, Buffering, Record};
use crate::http1::body::BodyState;
use crate::http1::response::{self, Parsed, ResponseMeta};
use crate::http1::BodyKind;
use crate::upstream::pool::UpstreamConn;
use crate::worker::{Generation, Worker};

/// Encodes `data` and, when the body is complete, ends the coded stream.
pub(crate) fn compress_step(
    enc: &mut StreamEncoder,
    data: &[u8],
    last: bool,
) -> Result<Vec<u8>, ProxyError> {
    // A coder that fails is veloxy's fault, not the client's.
    let io = |e| ProxyError::internal(ErrorKind::Io(e));
    let mut out = enc.encode(data).map_err(io)?.to_vec();
    if last {
        out.extend_from_slice(enc.finish().map_err(io)?);
    }
    Ok(out)
}

/// How an exchange failed.
pub(crate) enum Fail {
    /// Nothing was sent to the client yet: answer with this error.
    BeforeResponse(ProxyError),
    /// The response started, or the client is gone: only closing is left.
    Abort(ProxyError),
}

pub(crate) fn up(kind: ErrorKind) -> Fail {
    Fail::BeforeResponse(ProxyError::upstream(kind))
}

impl ExchangeError for Fail {
    fn from_error(e: ProxyError) -> Self {
        Fail::BeforeResponse(e)
    }
    fn side(&self) -> Side {
        match self {
            Fail::BeforeResponse(e) | Fail::Abort(e) => e.side,
        }
    }
}

type AttemptFail = attempt::AttemptFail<Fail>;

/// Step 7 of the exchange driver for an HTTP/1 client and an HTTP/1 group: the body part
/// read first, the concurrency slot, the attempts, the response relayed; returns whether the
/// downstream connection stays open.
pub(crate) async fn relay(
    worker: &Worker,
    gen: &Generation,
    down: &mut Downstream,
    mut p: Prepared,
) -> bool {
    let group = &gen.snapshot.upstreams[p.target.upstream];
    let mut wbuf = std::mem::take(&mut p.head);
    let mut record = std::mem::replace(&mut p.record, Record::placeholder());
    let mut ubuf = worker.take_bytes();
    let mut obuf = worker.take_vec();
    let mut req_body = BodyState::request(p.body, p.target.max_body);
    let mut backend = None;
    if p.target.hints.is_some() && p.version >= 1 {
        super::interim::send_hints(worker, gen, down, &p).await;
    }

    // The body is read before a concurrency slot or an upstream connection is taken: a slow
    // sender then holds neither (`request_buffering = "auto"`).
    let outcome = match buffer_request_body(group, down, &mut p, &mut req_body, &mut wbuf).await {
        Err(f) => Err(f),
        Ok(()) => {
            match exchange::hold_slot(&p.target.concurrency, &mut p.slot, record.trace.as_ref())
                .await
            {
                Err(e) => Err(Fail::BeforeResponse(e)),
                Ok(()) => {
                    let plan = Plan {
                        worker,
                        gen,
                        upstream: p.target.upstream,
                        client: down.peer,
                        hash: p.target.hash,
                        replayable: p.idempotent && req_body.is_done(),
                        trace: record.trace.clone(),
                    };
                    let mut run = Run {
                        worker,
                        gen,
                        group,
                        p: &p,
                        record: &mut record,
                        req_body: &mut req_body,
                        wbuf: &mut wbuf,
                        ubuf: &mut ubuf,
                        obuf: &mut obuf,
                    };
                    let first = p.target.backend;
                    attempt::run(&plan, first, &mut backend, async |b, may_retry_status| {
                        let meta = run.attempt(down, b, may_retry_status).await?;
                        let status = meta.status;
                        Ok((meta, status))
                    })
                    .await
                }
            }
        }
    };

    // The slot is free once the response is delivered (not while an error answer lingers).
    p.slot = None;
    let (keep, status, linger) = match outcome {
        Ok(meta) => (
            meta.downstream_keep_alive && p.keep_alive,
            meta.status,
            false,
        ),
        Err(Fail::BeforeResponse(e)) => {
            e.log(&group.name, backend.map(|b| &group.backends[b].addr));
            // Keep the client only if its request was fully read and the error is not its fault.
            let close = !req_body.is_done() || e.closes_connection() || !p.keep_alive;
            let a = answer_error(worker, down, &e, close, p.is_head, &record).await;
            (a.keep, e.status(), a.linger)
        }
        Err(Fail::Abort(e)) => {
            e.log(&group.name, backend.map(|b| &group.backends[b].addr));
            if e.side == Side::Upstream {
                reset_downstream(down);
            }
            (false, 0, false)
        }
    };
    record.backend = backend.map(|b| group.backends[b].addr.clone());
    crate::downstream::connection::finish_record(worker, down, &mut record, status);
    if linger {
        linger_close(&mut down.stream).await;
    }
    worker.give_vec(wbuf);
    worker.give_vec(obuf);
    worker.give_bytes(ubuf);
    keep
}

/// How an error answer went.
#[derive(Clone, Copy)]
pub(crate) struct Answered {
    /// The client connection stays open.
    pub keep: bool,
    /// The answer was sent and the connection must close: linger first (after recording the
    /// exchange, so the record does not wait on the client).
    pub linger: bool,
}

/// Answers a prepared request that failed before any response (forward_auth's, a cache
/// fill's or a search job's): the error, its record finished, a lingering close when the answer asks for one.
/// Returns whether the connection stays open.
pub(crate) async fn fail_prepared(
    worker: &Worker,
    down: &mut Downstream,
    p: &mut Prepared,
    e: &ProxyError,
    close: bool,
) -> bool {
    let mut record = std::mem::replace(&mut p.record, Record::placeholder());
    let a = answer_error(worker, down, e, close, p.is_head, &record).await;
    crate::downstream::connection::finish_record(worker, down, &mut record, e.status());
    if a.linger {
        linger_close(&mut down.stream).await;
    }
    a.keep
}

/// Answers an error before any response byte went out (counting shed or rate-limited
/// refusals). The caller records the exchange, then lingers if [`Answered::linger`].
pub(crate) async fn answer_error(
    worker: &Worker,
    down: &mut Downstream,
    e: &ProxyError,
    close: bool,
    is_head: bool,
    record: &Record,
) -> Answered {
    worker.count_error(e);
    let message = e.kind.to_string();
    let written = match record.edit {
        None => {
            send_error(
                worker,
                &mut down.stream,
                e.status(),
                &message,
                close,
                is_head,
            )
            .await
        }
        Some(_) => {
            let mut out = worker.take_vec();
            write_edited_error(record, e.status(), &message, close, is_head, &mut out);
            let n = crate::downstream::connection::send_all_within(&mut down.stream, &out).await;
            worker.give_vec(out);
            n
        }
    };
    down.bytes_sent += written as u64;
    let sent = written > 0;
    Answered {
        keep: sent && !close,
        linger: sent && close,
    }
}

/// veloxy's own error answer on a route with rules: its error page (or the plain message),
/// with the route's response header rules applied.
pub(crate) fn write_edited_error(
    record: &Record,
    status: u16,
    message: &str,
    close: bool,
    is_head: bool,
    out: &mut Vec<u8>,
) {
    let text;
    let (content_type, body) = match exchange::error_page(record, status) {
        Some(p) => (p.content_type, &p.body[..]),
        None => {
            text = format!("{message}\n");
            ("text/plain; charset=utf-8", text.as_bytes())
        }
    };
    let reason = crate::http1::reason(status);
    out.extend_from_slice(format!("HTTP/1.1 {status} {reason}\r\nServer: veloxy\r\n").as_bytes());
    out.extend_from_slice(format!("Content-Type: {content_type}\r\n").as_bytes());
    out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    if status == 503 || status == 429 {
        out.extend_from_slice(b"Retry-After: 1\r\n");
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    let view = crate::exchange::edit::ResponseView {
        edit: record.edit.as_ref(),
        hooks: &[],
        backend: None,
    };
    view.apply_h1(out);
    out.extend_from_slice(b"\r\n");
    if !is_head {
        out.extend_from_slice(body);
    }
}

/// The response was cut short: close with a reset so the client sees an error, not an ending.
pub(crate) fn reset_downstream(down: &mut Downstream) {
    let _ = socket2::SockRef::from(down.stream.tcp()).set_linger(Some(Duration::ZERO));
    down.reset = true;
}

/// Moves the request body bytes already read into the upstream write buffer, then reads as
/// much more of the body as [`exchange::body_buffering`] says before any upstream is
/// involved. A body that is read completely can be replayed on another backend.
async fn buffer_request_body(
    group: &UpstreamGroup,
    down: &mut Downstream,
    p: &mut Prepared,
    body: &mut BodyState,
    wbuf: &mut Vec<u8>,
) -> Result<(), Fail> {
    let bad = |e| Fail::BeforeResponse(crate::http1::body::request_body_error(e));
    let head_len = wbuf.len();
    let n = body.take_request_into(&down.rbuf, wbuf).map_err(bad)?;
    down.rbuf.advance(n);
    let length = match p.body {
        BodyKind::Length(n) => Some(n),
        _ => None,
    };
    let limit = match exchange::body_buffering(down.request_buffering, length, p.idempotent, group)
    {
        Buffering::Stream => return Ok(()),
        // A declared length within the limit: the loop ends with the body.
        Buffering::Whole => group.retry_body_limit,
        Buffering::UpTo(limit) => limit,
    };
    if body.is_done() || p.upgrade {
        return Ok(());
    }
    if p.expect_continue {
        // Asked once: the upstream never sees the expectation answered twice.
        p.expect_continue = false;
        let _ = write_down(down, b"HTTP/1.1 100 Continue\r\n\r\n").await;
    }
    // A chunked body of unknown size is read up to the limit; the rest streams.
    while !body.is_done() && wbuf.len() - head_len <= limit {
        read_body_more(down).await?;
        let n = body.take_request_into(&down.rbuf, wbuf).map_err(bad)?;
        down.rbuf.advance(n);
    }
    Ok(())
}

/// The HTTP/1 client's [`HeadReader`]: parses the upstream's response head and writes the
/// client's in the same pass (into `obuf`).
struct Relayed<'a> {
    p: &'a Prepared,
    obuf: &'a mut Vec<u8>,
    /// Interim heads forwarded so far (at most [`crate::hints::MAX_FORWARDED`]).
    interims: u8,
}

/// A final response head, as [`Relayed`] read it.
enum RelayedHead {
    Final(ResponseMeta),
    /// An interim (1xx) head to forward to the client (an HTTP/1.1 one); it is this long.
    Interim(usize),
    /// `101 Switching Protocols` to an upgrade request; the head is this long.
    Switch(usize),
}

impl HeadReader for Relayed<'_> {
    type Head = RelayedHead;
    fn parse(&mut self, buf: &[u8]) -> Result<HeadParse<RelayedHead>, ProxyError> {
        self.obuf.clear();
        let p = self.p;
        Ok(
            match response::parse_and_write_upgrade(
                buf,
                p.is_head,
                p.version,
                p.keep_alive,
                p.upgrade,
                self.obuf,
            )? {
                Parsed::Switch { head_len } => HeadParse::Final(RelayedHead::Switch(head_len)),
                Parsed::Partial => HeadParse::Partial,
                Parsed::Interim(len)
                    if super::interim::forwards(p, &mut self.interims, &buf[..len]) =>
                {
                    HeadParse::Final(RelayedHead::Interim(len))
                }
                Parsed::Interim(len) => HeadParse::Interim(len),
                Parsed::Final(meta) => HeadParse::Final(RelayedHead::Final(meta)),
            },
        )
    }
}

/// The state of one request across attempts.
struct Run<'a> {
    worker: &'a Worker,
    gen: &'a Generation,
    group: &'a UpstreamGroup,
    p: &'a Prepared,
    record: &'a mut Record,
    req_body: &'a mut BodyState,
    wbuf: &'a mut Vec<u8>,
    ubuf: &'a mut BytesMut,
    obuf: &'a mut Vec<u8>,
}

impl Run<'_> {
    /// One attempt against `backend` (the one HTTP/1 upstream client, [`h1::attempt`]). On
    /// success the response has been relayed downstream.
    async fn attempt(
        &mut self,
        down: &mut Downstream,
        backend: usize,
        may_retry_status: bool,
    ) -> Result<ResponseMeta, AttemptFail> {
        let (group, p) = (self.group, self.p);
        if let Some(t) = &self.record.trace {
            t.patch_head(self.wbuf);
        }
        let replayable = p.idempotent && self.req_body.is_done();
        let t0 = Instant::now();
        let req_body = &mut *self.req_body;
        let body = async |conn: &mut UpstreamConn| {
            if !req_body.is_done() {
                if p.expect_continue {
                    let _ = write_down(down, b"HTTP/1.1 100 Continue\r\n\r\n").await;
                }
                relay_request_body(group, down, &mut conn.stream, req_body)
                    .await
                    .map_err(AttemptFail::Fatal)?;
            }
            Ok(())
        };
        let mut reader = Relayed {
            p,
            obuf: &mut *self.obuf,
            interims: 0,
        };
        let (mut conn, mut head) = h1::attempt(
            (self.worker, self.gen),
            p.target.to(backend),
            &*self.wbuf,
            self.ubuf,
            body,
            &mut reader,
            replayable,
        )
        .await?;
        // After a forwarded interim head, `read_timeout` bounds the wait for the final one.
        let deadline = Instant::now() + group.read_timeout;
        while let RelayedHead::Interim(len) = head {
            super::interim::forward(self.worker, down, &self.ubuf[..len])
                .await
                .map_err(|e| AttemptFail::Fatal(Fail::Abort(e)))?;
            self.ubuf.advance(len);
            head = h1::next_head(deadline, &mut conn, self.ubuf, &mut reader)
                .await?
                .ok_or(AttemptFail::Fatal(up(ErrorKind::UpstreamClosed)))?;
        }
        self.worker.metrics.upstream_duration.observe(t0.elapsed());
        let meta = match head {
            RelayedHead::Final(meta) => meta,
            RelayedHead::Interim(_) => unreachable!("forwarded above"),
            RelayedHead::Switch(head_len) => {
                return self
                    .switch(down, conn, head_len)
                    .await
                    .map_err(AttemptFail::Fatal)
            }
        };
        if may_retry_status && group.retry_on.contains(&meta.status) {
            // Discard this response (and its connection) and let the caller try elsewhere.
            return Err(AttemptFail::RetryStatus(meta.status));
        }
        self.deliver(down, conn, backend, meta)
            .await
            .map_err(AttemptFail::Fatal)
    }

    /// The upstream accepted an upgrade: send its 101 downstream, then relay bytes both ways
    /// until either side closes or the tunnel idles out.
    async fn switch(
        &mut self,
        down: &mut Downstream,
        mut conn: UpstreamConn,
        head_len: usize,
    ) -> Result<ResponseMeta, Fail> {
        self.ubuf.advance(head_len);
        // Bytes the upstream sent after its 101 go down with it, in one write.
        self.obuf.extend_from_slice(self.ubuf);
        self.ubuf.clear();
        write_down(down, self.obuf).await.map_err(Fail::Abort)?;
        if !down.rbuf.is_empty() {
            let early = down.rbuf.split();
            timeout(
                self.group.write_timeout,
                crate::tls::send_all(&mut conn.stream, &early),
            )
            .await
            .map_err(|_| Fail::Abort(ProxyError::upstream(ErrorKind::WriteTimeout)))?
            .map_err(|e| Fail::Abort(ProxyError::upstream(ErrorKind::Io(e))))?;
        }
        self.worker.metrics.upgrades.inc();
        let idle = self
            .gen
            .snapshot
            .listeners
            .get(down.listener_index.get().1)
            .map_or(Duration::from_secs(600), |l| l.upgrade_idle_timeout);
        crate::downstream::relay::tunnel(down, &mut conn.stream, idle).await;
        Ok(ResponseMeta {
            status: 101,
            head_len,
            body: crate::http1::BodyKind::None,
            upstream_reusable: false,
            downstream_keep_alive: false,
            decode_chunked: false,
        })
    }

    /// Sends the response head (and the body bytes already read) downstream in one write, then
    /// streams the rest, and pools the upstream connection if it is clean.
    async fn deliver(
        &mut self,
        down: &mut Downstream,
        mut conn: UpstreamConn,
        backend: usize,
        mut meta: ResponseMeta,
    ) -> Result<ResponseMeta, Fail> {
        if exchange::error_page(self.record, meta.status).is_some() {
            // The route's error page instead of the upstream's body; its connection closes
            // (the body is not read).
            drop(conn);
            meta.downstream_keep_alive &= self.req_body.is_done();
            let close = !(meta.downstream_keep_alive && self.p.keep_alive);
            self.obuf.clear();
            let (status, is_head) = (meta.status, self.p.is_head);
            write_edited_error(self.record, status, "", close, is_head, self.obuf);
            write_down(down, self.obuf).await.map_err(Fail::Abort)?;
            return Ok(meta);
        }
        // `location_rewrite` recognizes the backend's address.
        self.record.backend = Some(self.group.backends[backend].addr.clone());
        if self.record.invalidate.is_some() {
            let head: &[u8] = self.obuf;
            exchange::invalidate(self.record, meta.status, |n| {
                crate::http1::lines(head)
                    .find(|(f, _)| f.eq_ignore_ascii_case(n.as_bytes()))
                    .map(|(_, v)| v)
            });
        }
        if self.p.target.hints.is_some() {
            let links = crate::http1::lines(self.obuf)
                .filter(|(name, _)| name.eq_ignore_ascii_case(b"link"))
                .map(|(_, value)| value);
            exchange::learn_early_hints(self.gen, &self.p.target, meta.status, links);
        }
        if let Some(view) = exchange::on_response(self.worker, self.record, meta.status) {
            view.apply_h1(self.obuf);
        }
        // `compress = true`: maybe rewrite the head and encode the (de-chunked) payload.
        let mut encoder = if self.p.target.compress {
            let has_body = meta.body != BodyKind::None;
            compress::filter_proxy_head(self.obuf, meta.status, has_body, self.p.target.encoding)
        } else {
            None
        };
        self.obuf.extend_from_slice(b"\r\n");
        self.ubuf.advance(meta.head_len);
        let decode = meta.decode_chunked || encoder.is_some();
        let mut resp_body = BodyState::new(meta.body, decode);
        let bad = |_| up(ErrorKind::BadResponse("invalid chunked body"));
        let n = match encoder.as_mut() {
            None => resp_body.take_into(self.ubuf, self.obuf).map_err(bad)?,
            Some(enc) => {
                let mut plain = self.worker.take_vec();
                let n = resp_body.take_into(self.ubuf, &mut plain).map_err(bad)?;
                let coded = compress_step(enc, &plain, resp_body.is_done());
                self.worker.give_vec(plain);
                self.obuf.extend_from_slice(&coded.map_err(Fail::Abort)?);
                n
            }
        };
        self.ubuf.advance(n);
        write_down(down, self.obuf).await.map_err(Fail::Abort)?;
        if !resp_body.is_done() {
            relay_response_body(
                self.group,
                down,
                &mut conn.stream,
                self.ubuf,
                &mut resp_body,
                self.obuf,
                encoder.as_mut(),
            )
            .await?;
        }
        let clean = meta.upstream_reusable
            && resp_body.is_done()
            && self.ubuf.is_empty()
            && self.req_body.is_done();
        if clean {
            let upstream = self.p.target.upstream;
            self.worker
                .pool_upstream(self.gen, (upstream, backend), conn);
        } else if !resp_body.is_done() {
            meta.downstream_keep_alive = false;
        }
        Ok(meta)
    }
}
