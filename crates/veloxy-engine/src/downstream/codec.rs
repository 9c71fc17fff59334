//! The HTTP/1 codec's side of the exchange driver ([`crate::exchange::drive`]): how an
//! admitted HTTP/1 request reads its body, answers, fails, and runs its attempts (to an
//! HTTP/1 group with [`super::proxy`], to an `h2`/`h2c` group with [`super::http2::bridge`]).

use std::rc::Rc;
use std::time::Duration;

use bytes::{Buf, Bytes};

use crate::config::UpstreamProtocol;
use crate::downstream::connection::{Downstream, Next, Prepared};
use crate::downstream::files::StaticReply;
use crate::downstream::proxy::Fail;
use crate::downstream::relay::{read_body_more, write_down};
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::drive::Codec;
use crate::exchange::mirror::MirrorRead;
use crate::exchange::{Answer, ProxyTarget, Record, Slot};
use crate::http1::body::{request_body_error, BodyState};
use crate::http1::BodyKind;
use crate::worker::{Generation, Worker};

/// One admitted HTTP/1 exchange on its client connection.
pub(crate) struct H1<'a> {
    pub worker: &'a Rc<Worker>,
    pub down: &'a mut Downstream,
    pub next: Next,
    /// Where a slot would go for a request admission answered (never taken for one).
    pub spare: Slot,
    /// A cache fill's upstream interim heads, written before the cached answer.
    pub interims: Option<crate::hints::Interims>,
}

impl H1<'_> {
    fn prepared(&mut self) -> &mut Prepared {
        match &mut self.next {
            Next::Forward(p) => p,
            Next::Static(_) => unreachable!("only a proxied request runs the proxy steps"),
        }
    }
}

impl Codec for H1<'_> {
    type Out = bool;

    fn record(&mut self) -> &mut Record {
        match &mut self.next {
            Next::Forward(p) => &mut p.record,
            Next::Static(reply) => &mut reply.record,
        }
    }

    fn target(&mut self) -> Option<&mut ProxyTarget> {
        match &mut self.next {
            Next::Forward(p) => Some(&mut p.target),
            Next::Static(_) => None,
        }
    }

    fn slot(&mut self) -> &mut Slot {
        match &mut self.next {
            Next::Forward(p) => &mut p.slot,
            Next::Static(_) => &mut self.spare,
        }
    }

    fn add_upstream_lines(&mut self, lines: &[u8]) {
        let p = self.prepared();
        match p.h2_head.as_mut() {
            Some(h2) => h2.add_lines(lines),
            // Before the blank line that ends the head.
            None => {
                let at = p.head.len() - 2;
                p.head.splice(at..at, lines.iter().copied());
            }
        }
    }

    async fn whole_body(&mut self, limit: u64) -> Result<Bytes, ProxyError> {
        let Next::Forward(p) = &mut self.next else {
            unreachable!("only a proxied request reads its body here")
        };
        read_body(self.down, p, limit).await
    }

    async fn mirror_body(&mut self, limit: usize, wait: bool) -> MirrorRead {
        let Next::Forward(p) = &mut self.next else {
            return MirrorRead::Uncopied;
        };
        match mirror_body(self.down, p, limit, wait).await {
            Ok(body) => MirrorRead::Copy(body),
            Err(no) => no,
        }
    }

    fn body_stalled(&mut self) {
        // Every later read of this body (and of the connection's next requests, which a
        // stalled client does not get to) fails at once.
        self.down.body_timeout = Duration::ZERO;
    }

    async fn ready(self) -> bool {
        let Next::Static(reply) = self.next else {
            unreachable!("a proxied request is not ready")
        };
        crate::downstream::files::serve(self.worker, self.down, *reply).await
    }

    async fn answer(self, a: Answer) -> bool {
        let reply = match self.next {
            Next::Forward(mut p) => {
                let record = std::mem::replace(&mut p.record, Record::placeholder());
                StaticReply::for_answer(self.worker, a, &p, record)
            }
            Next::Static(reply) => reply.replaced(self.worker, a),
        };
        crate::downstream::files::serve(self.worker, self.down, reply).await
    }

    fn interims(&mut self) -> Option<crate::hints::Interims> {
        let http11 = matches!(&self.next, Next::Forward(p) if p.version >= 1);
        let q = http11.then(crate::hints::Interims::default)?;
        self.interims = Some(q.clone());
        Some(q)
    }

    async fn cached(mut self, r: crate::static_files::Response) -> bool {
        if let Some(q) = self.interims.take() {
            crate::downstream::interim::drain(self.worker, self.down, &q).await;
        }
        let Next::Forward(mut p) = self.next else {
            unreachable!("a hit to serve is a proxied request's")
        };
        let record = std::mem::replace(&mut p.record, Record::placeholder());
        let reply = StaticReply::for_response(self.worker, r, &p, record);
        crate::downstream::files::serve(self.worker, self.down, reply).await
    }

    async fn streamed(
        self,
        r: crate::static_files::Response,
        body: Box<crate::exchange::fastcgi_body::FcgiStream>,
    ) -> bool {
        let Next::Forward(p) = self.next else {
            unreachable!("a FastCGI answer is a proxied request's")
        };
        crate::downstream::streamed::serve(self.worker, self.down, p, r, body).await
    }

    async fn fail(mut self, e: ProxyError) -> bool {
        let p = match &mut self.next {
            Next::Forward(p) => p,
            Next::Static(_) => {
                let answer = crate::exchange::Denied::Error(e).into_answer(self.worker);
                return self.answer(answer).await;
            }
        };
        // Unless the body was read whole, the connection cannot take another request.
        let close = p.body != BodyKind::None || e.closes_connection() || !p.keep_alive;
        crate::downstream::proxy::fail_prepared(self.worker, self.down, p, &e, close).await
    }

    async fn attempts(self, worker: &Rc<Worker>, gen: &Rc<Generation>) -> bool {
        let Next::Forward(p) = self.next else {
            unreachable!("only a proxied request runs attempts")
        };
        if gen.snapshot.upstreams[p.target.upstream].protocol != UpstreamProtocol::Http1 {
            return Box::pin(crate::downstream::http2::bridge::relay(
                worker, gen, self.down, p,
            ))
            .await;
        }
        crate::downstream::proxy::relay(worker, gen, self.down, p).await
    }
}

/// A copy of the request body for `mirror`, left in the client's read buffer for the
/// attempts: one of a declared length up to `limit`, or (with `wait`) a chunked one until it
/// ends or passes `limit`, is read into the buffer first (within the body timeout); without
/// `wait`, a chunked body is copied only if it is in the buffer whole.
/// One more read of the body for a mirror's copy. A failure is the attempts' too: they meet
/// it on their own read (a stall, once the driver has called [`Codec::body_stalled`]).
async fn read_for_copy(down: &mut Downstream) -> Result<(), MirrorRead> {
    read_body_more(down).await.map_err(|f| match f {
        Fail::BeforeResponse(e) if matches!(e.kind, ErrorKind::BodyTimeout) => MirrorRead::Stalled,
        _ => MirrorRead::Uncopied,
    })
}

async fn mirror_body(
    down: &mut Downstream,
    p: &mut Prepared,
    limit: usize,
    wait: bool,
) -> Result<Bytes, MirrorRead> {
    match p.body {
        BodyKind::None | BodyKind::UntilClose => Ok(Bytes::new()),
        BodyKind::Length(n) if n <= limit as u64 => {
            let n = n as usize;
            if p.expect_continue && down.rbuf.len() < n {
                p.expect_continue = false;
                write_down(down, b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .map_err(|_| MirrorRead::Uncopied)?;
            }
            while down.rbuf.len() < n {
                read_for_copy(down).await?;
            }
            Ok(Bytes::copy_from_slice(&down.rbuf[..n]))
        }
        BodyKind::Length(_) => Err(MirrorRead::Uncopied),
        BodyKind::Chunked => loop {
            // Decoded again from the start after each read: at most `limit` bytes of it.
            let mut state = BodyState::new(p.body, true);
            let mut out = Vec::new();
            state
                .take_into(&down.rbuf, &mut out)
                .map_err(|_| MirrorRead::Uncopied)?;
            if state.is_done() {
                return match out.len() <= limit {
                    true => Ok(out.into()),
                    false => Err(MirrorRead::Uncopied),
                };
            }
            if !wait || out.len() > limit || down.rbuf.len() > 2 * limit {
                return Err(MirrorRead::Uncopied);
            }
            if p.expect_continue {
                p.expect_continue = false;
                write_down(down, b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .map_err(|_| MirrorRead::Uncopied)?;
            }
            read_for_copy(down).await?;
        },
    }
}

/// The request body, decoded, read whole within the client's body timeout (the request's
/// `body` is then `None`: the connection can take the next request); more than `limit`
/// decoded bytes is a 413 (a declared length was checked at admission; a chunked body is
/// counted as it arrives). Nothing of a response has been sent on failure.
pub(crate) async fn read_body(
    down: &mut Downstream,
    p: &mut Prepared,
    limit: u64,
) -> Result<Bytes, ProxyError> {
    let body = read_whole(down, p, limit).await.map_err(|f| match f {
        Fail::BeforeResponse(e) | Fail::Abort(e) => e,
    })?;
    p.body = BodyKind::None;
    Ok(body)
}

async fn read_whole(down: &mut Downstream, p: &mut Prepared, limit: u64) -> Result<Bytes, Fail> {
    let bad = |e| Fail::BeforeResponse(request_body_error(e));
    let mut state = BodyState::new(p.body, true);
    let mut out = Vec::new();
    if p.expect_continue && !state.is_done() {
        p.expect_continue = false;
        write_down(down, b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(Fail::Abort)?;
    }
    loop {
        let n = state.take_into(&down.rbuf, &mut out).map_err(bad)?;
        down.rbuf.advance(n);
        if out.len() as u64 > limit {
            return Err(Fail::BeforeResponse(ProxyError::downstream(
                crate::error::ErrorKind::BodyTooLarge,
            )));
        }
        if state.is_done() {
            return Ok(out.into());
        }
        read_body_more(down).await?;
    }
}
