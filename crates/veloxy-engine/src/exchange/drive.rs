//! The exchange driver: every step after admission, in one order, for every client protocol.
//!
//! A downstream codec admits a request ([`super::admit`]), wraps what admission decided in
//! its [`Codec`], and hands it to [`drive`], which runs the steps in this order:
//!
//! 1. the `basic_auth` check admission left in the record, off the worker ([`super::verified`]):
//!    nothing (a file, a cache hit, a backend's answer) reaches a client whose credentials
//!    have not passed;
//! 2. a request admission answered (a file route, veloxy's own answer, a fresh cache hit)
//!    is sent ([`Codec::ready`]);
//! 3. `forward_auth` ([`super::forward_auth`]): its refusal is the answer; when it lets the
//!    request pass, the fields it copies go on every upstream request made for it;
//! 4. a cache hit held for forward_auth is served;
//! 5. a search job: the body read whole, the route's concurrency slot, the job's answer;
//! 6. a cache fill: the slot, then the fill's answer, or the request goes on upstream;
//! 7. the route's `mirror` copies, started as tasks of their own ([`super::mirror`]);
//! 8. the attempts on the group's backends in the group's protocol ([`Codec::attempts`]):
//!    the part of the body read before anything goes upstream ([`super::body_buffering`]),
//!    the slot ([`super::hold_slot`], unless held), attempts with retries
//!    ([`super::attempt`]), the response through the route's response rules, the hooks
//!    ([`super::on_response`]) and compression;
//!
//! and every path ends in the record ([`super::Record`]): access log, metrics, `on_done`.
//! The codec only moves bytes: it reads bodies, writes heads, bodies and trailers in its
//! protocol, and knows when its client is gone.

use std::rc::Rc;

use bytes::Bytes;

use super::forward_auth::Outcome;
use super::mirror::MirrorRead;
use super::{Answer, ProxyTarget, Record, Slot};
use crate::error::ProxyError;
use crate::worker::{Generation, Worker};

/// What a downstream codec offers the driver for one exchange.
///
/// Methods that take `self` end the exchange: they send the answer (or the error) in the
/// codec's protocol and return what the codec's caller needs ([`Codec::Out`]).
pub(crate) trait Codec {
    /// How an exchange ends for the codec: HTTP/1, whether the connection stays open;
    /// HTTP/2 and HTTP/3, the stream's response.
    type Out;

    /// The exchange's record.
    fn record(&mut self) -> &mut Record;
    /// The proxied request's target; `None` when admission answered the request.
    fn target(&mut self) -> Option<&mut ProxyTarget>;
    /// Where the route's concurrency slot is held until the answer is complete.
    fn slot(&mut self) -> &mut Slot;
    /// forward_auth let the request pass: `lines` (`Name: value\r\n` fields it copied from
    /// the auth service's answer) go on the upstream request.
    fn add_upstream_lines(&mut self, lines: &[u8]);
    /// Where a cache fill's upstream interim (1xx) heads go to reach the client, if its
    /// protocol can carry them (HTTP/1.1, HTTP/3); drained before the cached answer.
    fn interims(&mut self) -> Option<crate::hints::Interims> {
        None
    }
    /// The request body, read whole within the body timeout; more than `limit` bytes is 413.
    async fn whole_body(&mut self, limit: u64) -> Result<Bytes, ProxyError>;

    /// A copy of the request body for `mirror`, the body left for the attempts as it was:
    /// empty for a request without one; [`MirrorRead::Uncopied`] when it cannot be copied
    /// (more than `limit` bytes, or of unknown length and not at hand), and
    /// [`MirrorRead::Stalled`] when the client stalled past `body_timeout` during the read. A body of unknown length is waited for
    /// only with `wait` (the route's group buffers such a body anyway); without, only what
    /// has arrived is looked at, so a stream (gRPC) is never held. See [`super::mirror`].
    async fn mirror_body(&mut self, limit: usize, wait: bool) -> super::mirror::MirrorRead;
    /// The client stalled past `body_timeout` in this request's body (a `mirror` copy's read
    /// waited it out): the attempts must not wait for the rest of it again.
    fn body_stalled(&mut self);

    /// Sends what admission prepared (a file, veloxy's own answer, a cache hit).
    async fn ready(self) -> Self::Out;
    /// Sends veloxy's answer `a` instead of anything else.
    async fn answer(self, a: Answer) -> Self::Out;
    /// Sends a response from the cache.
    async fn cached(self, r: crate::static_files::Response) -> Self::Out;
    /// Sends a FastCGI response's head `r` and then its body as it comes from `body`.
    async fn streamed(
        self,
        r: crate::static_files::Response,
        body: Box<super::fastcgi_body::FcgiStream>,
    ) -> Self::Out;
    /// Answers `e` (nothing of the response has been sent).
    async fn fail(self, e: ProxyError) -> Self::Out;
    /// Step 8: the attempts on the group's backends, and the response.
    async fn attempts(self, worker: &Rc<Worker>, gen: &Rc<Generation>) -> Self::Out;
}

/// Runs one admitted exchange to its end (see the module doc for the order of the steps).
pub(crate) async fn drive<C: Codec>(worker: &Rc<Worker>, gen: &Rc<Generation>, mut c: C) -> C::Out {
    if c.record().verify.is_some() {
        // Boxed, like every rare step: the driver's future stays the size of the common path.
        if let Err(denied) = Box::pin(super::verified(c.record())).await {
            return c.answer(denied.into_answer(worker)).await;
        }
    }
    let Some(t) = c.target() else {
        return c.ready().await;
    };
    if let Some(auth) = t.forward_auth.take() {
        let span = c
            .record()
            .trace
            .as_ref()
            .map(|t| t.phase(crate::otel::span::Step::ForwardAuth));
        let outcome = Box::pin(auth.run(worker, gen)).await;
        if let (Some(t), Some(span)) = (&c.record().trace, span) {
            super::trace::forward_auth(t, span, &outcome);
        }
        match outcome {
            Ok(Outcome::Pass(lines)) => {
                c.target().expect("proxied").authorized(&lines);
                c.add_upstream_lines(&lines);
            }
            Ok(Outcome::Deny(answer)) => return c.answer(answer).await,
            Err(e) => {
                tracing::warn!(error = %e.report(), "forward_auth: the auth service did not answer");
                return c.fail(e).await;
            }
        }
    }
    let t = c.target().expect("proxied");
    if let Some(hit) = t.hit.take() {
        return c.cached(*hit).await;
    }
    if t.search.is_some() {
        return Box::pin(search(c)).await;
    }
    if t.fastcgi.is_some() {
        return Box::pin(fastcgi(worker, gen, c)).await;
    }
    if t.cache.is_some() {
        return Box::pin(fill(worker, gen, c)).await;
    }
    if t.mirror.is_some() {
        Box::pin(mirror(worker, gen, &mut c)).await;
    }
    c.attempts(worker, gen).await
}

/// Starts the request's `mirror` copies admission took (if any), right before the attempts:
/// they never delay or change the primary's answer.
async fn mirror<C: Codec>(worker: &Rc<Worker>, gen: &Rc<Generation>, c: &mut C) {
    let Some((copies, upstream, max_body)) = c
        .target()
        .and_then(|t| Some((t.mirror.take()?, t.upstream, t.max_body)))
    else {
        return;
    };
    let http1 = crate::config::UpstreamProtocol::Http1;
    let wait = gen.snapshot.upstreams[upstream].protocol == http1;
    // Never more than the route's `max_body_bytes`: a body of unknown length over it is
    // refused (413) as it is relayed, and its copy must not go out whole before that.
    let limit = max_body.map_or(super::mirror::BODY_LIMIT, |m| {
        usize::try_from(m).map_or(super::mirror::BODY_LIMIT, |m| {
            m.min(super::mirror::BODY_LIMIT)
        })
    });
    let body = match copies.wants_body() {
        true => match c.mirror_body(limit, wait).await {
            MirrorRead::Copy(body) => Some(body),
            MirrorRead::Uncopied => None,
            // The client has had its whole `body_timeout`: one wait, not one per reader.
            MirrorRead::Stalled => {
                c.body_stalled();
                None
            }
        },
        false => Some(Bytes::new()),
    };
    super::mirror::send(worker, gen, *copies, body);
}

/// Step 5: the search gateway's job (a bulk to split, a search to clamp).
async fn search<C: Codec>(mut c: C) -> C::Out {
    let t = c.target().expect("proxied");
    let job = t.search.take().expect("a search job");
    let limit = t.concurrency.clone();
    let body = match c.whole_body(job.body_limit()).await {
        Ok(body) => body,
        Err(e) => return c.fail(e).await,
    };
    // After the body: a slow sender holds no slot.
    let trace = c.record().trace.clone();
    if let Err(e) = super::hold_slot(&limit, c.slot(), trace.as_ref()).await {
        return c.fail(e).await;
    }
    let answer = job.run(body).await;
    c.answer(answer).await
}

/// A FastCGI route's request: the body read whole, the slot, the request to the group, the
/// answer (its body streamed unless it came whole; an error page of the route replaces it).
async fn fastcgi<C: Codec>(worker: &Rc<Worker>, gen: &Rc<Generation>, mut c: C) -> C::Out {
    let t = c.target().expect("proxied");
    let job = t.fastcgi.take().expect("a FastCGI request");
    let limit = t.concurrency.clone();
    let body = match c.whole_body(job.body_limit).await {
        Ok(body) => body,
        Err(e) => return c.fail(e).await,
    };
    let trace = c.record().trace.clone();
    if let Err(e) = super::hold_slot(&limit, c.slot(), trace.as_ref()).await {
        return c.fail(e).await;
    }
    let answered = {
        let t = &*c.target().expect("proxied");
        job.run(worker, gen, t, body, trace).await
    };
    use super::fastcgi::Answer;
    match answered {
        Ok(Answer::Whole(r)) => c.cached(r).await,
        Ok(Answer::Stream(r, _)) if super::error_page(c.record(), r.status).is_some() => {
            c.cached(r).await
        }
        Ok(Answer::Stream(r, body)) => c.streamed(r, body).await,
        Err(e) => {
            tracing::warn!(error = %e.report(), "upstream error (FastCGI)");
            c.fail(e).await
        }
    }
}

/// Step 6: the cache fill (GET or HEAD: no body to read before the slot; a QUERY's body is
/// read first, since its key needs it). When the cache lets the request go upstream, the slot
/// stays held for the attempts.
async fn fill<C: Codec>(worker: &Rc<Worker>, gen: &Rc<Generation>, mut c: C) -> C::Out {
    use crate::cache::query::Keyed;
    let t = c.target().expect("proxied");
    let mut fill = t.cache.take().expect("a fill");
    let limit = t.concurrency.clone();
    let mut pass = false;
    if fill.is_query() {
        let body = match c.whole_body(crate::cache::query::BODY_LIMIT).await {
            Ok(body) => body,
            Err(e) => return c.fail(e).await,
        };
        fill = match crate::cache::query::with_body(fill, body) {
            Keyed::Hit(r) => return c.cached(r).await,
            Keyed::Pass(f) => {
                pass = true;
                f
            }
            Keyed::Fill(f) => f,
        };
    }
    let trace = c.record().trace.clone();
    if let Err(e) = super::hold_slot(&limit, c.slot(), trace.as_ref()).await {
        return c.fail(e).await;
    }
    let filled = {
        let interims = c.interims();
        let trace = c.record().trace.clone();
        let target = &*c.target().expect("proxied");
        let up = super::fill::FillUpstream {
            worker,
            gen,
            target,
            interims,
            trace,
        };
        fill_or_forward(&up, fill, pass).await
    };
    match filled {
        Ok(crate::cache::fill::Filled::Answer(r)) => c.cached(r).await,
        Ok(crate::cache::fill::Filled::Forward(line)) => {
            super::add_answer_line(c.record(), &line);
            mirror(worker, gen, &mut c).await;
            c.attempts(worker, gen).await
        }
        Err(e) => {
            tracing::warn!(error = %e.report(), "upstream error (cache fill)");
            c.fail(e).await
        }
    }
}

/// Runs the fill; a QUERY (its body read already) that the fill does not answer is sent once
/// more and answered whole, `BYPASS` for a hit-for-pass (`pass`), `MISS` otherwise.
async fn fill_or_forward(
    up: &super::fill::FillUpstream<'_>,
    fill: Box<crate::cache::fill::Fill>,
    pass: bool,
) -> Result<crate::cache::fill::Filled, ProxyError> {
    use crate::cache::fill::Filled;
    if pass {
        return crate::cache::query::forward(up, &fill, "BYPASS").await;
    }
    let query = fill.is_query().then(|| fill.clone());
    match (crate::cache::fill::run(up, fill).await, query) {
        (Ok(Filled::Forward(_)), Some(q)) => crate::cache::query::forward(up, &q, "MISS").await,
        (filled, _) => filled,
    }
}
