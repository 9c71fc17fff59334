//! Attempts: trying backends until one delivers a response, for every downstream protocol.
//!
//! Retryability is decided here and only here, from how an attempt failed ([`AttemptFail`]):
//! * nothing reached the backend (connect failure or timeout, a backend at its
//!   `max_connections`, a local resource error): any request may go to another backend;
//! * the backend got the request but gave no response (reset, close, timeout), or answered a
//!   status in `retry_on`: only replayable requests (idempotent, body fully buffered) retry;
//! * anything else ends the exchange.
//!
//! Each retry goes to a backend not tried yet, at most `retries` times, and spends the group's
//! retry budget. Every attempt's end is reported to the balancer (in flight, latency) and to
//! passive health (outlier ejection), also when the exchange is cancelled mid-attempt.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, ProxyError, Side};
use crate::upstream::balancer::{BackendSet, PickContext};
use crate::worker::{Generation, Worker};

/// How one attempt against one backend ended, when it did not deliver a response.
pub(crate) enum AttemptFail<E> {
    /// Nothing reached the backend. `health`: the failure counts against the backend (a
    /// backend at its connection limit is busy, not broken; a local fd shortage is ours).
    NotSent { error: ProxyError, health: bool },
    /// The backend got the request but gave no usable response.
    NoResponse(ProxyError),
    /// The backend answered a status in `retry_on`; the response was discarded.
    RetryStatus(u16),
    /// Not retryable: the exchange ends with this.
    Fatal(E),
}

/// The error type a codec's exchange ends with: it says which side failed and can be built
/// from a plain error.
pub(crate) trait ExchangeError {
    fn from_error(e: ProxyError) -> Self;
    fn side(&self) -> Side;
}

impl ExchangeError for ProxyError {
    fn from_error(e: ProxyError) -> Self {
        e
    }
    fn side(&self) -> Side {
        self.side
    }
}

/// What the attempts of one exchange share.
pub(crate) struct Plan<'a> {
    pub worker: &'a Worker,
    pub gen: &'a Generation,
    pub upstream: usize,
    pub client: SocketAddr,
    pub hash: u64,
    /// Idempotent, with its body fully buffered: may be sent again after a response-less
    /// failure or a `retry_on` status.
    pub replayable: bool,
    /// The exchange is sampled: each attempt gets a span.
    pub trace: Option<crate::otel::TraceRef>,
}

/// Runs attempts from `first` until one delivers. `attempt(backend, may_retry_status)` makes
/// one attempt and returns its value with the response status (for outlier feedback); with
/// `may_retry_status` it should turn a `retry_on` status into [`AttemptFail::RetryStatus`].
/// `last` ends as the last backend tried.
pub(crate) async fn run<T, E: ExchangeError>(
    plan: &Plan<'_>,
    first: usize,
    last: &mut Option<usize>,
    mut attempt: impl AsyncFnMut(usize, bool) -> Result<(T, u16), AttemptFail<E>>,
) -> Result<T, E> {
    let group = &plan.gen.snapshot.upstreams[plan.upstream];
    let mut tried = BackendSet::default();
    let mut retries_left = group.retries;
    let mut current = first;
    loop {
        *last = Some(current);
        tried.insert(current);
        let has_other = {
            let mut others = group.health.down_set();
            others.union_with(&tried);
            !others.covers(group.backends.len())
        };
        let budget_left = plan.gen.group(plan.upstream).budget.available();
        let may_retry_status = retries_left > 0 && plan.replayable && has_other && budget_left;
        let mut guard = AttemptGuard::start(plan.gen, plan.upstream, current);
        let span = plan.trace.as_ref().map(|t| t.attempt());
        let result = attempt(current, may_retry_status).await;
        let elapsed = guard.disarm();
        if let (Some(t), Some(span)) = (&plan.trace, span) {
            trace_attempt(
                t,
                span,
                &group.backends[current].addr,
                group.retries - retries_left,
                &result,
            );
        }
        let (error, counts) = match result {
            Ok((value, status)) => {
                let failed = group.outlier.on_5xx && status >= 500;
                feedback(plan.gen, plan.upstream, current, elapsed, !failed);
                return Ok(value);
            }
            Err(AttemptFail::Fatal(e)) => {
                let ok = e.side() != Side::Upstream;
                feedback(plan.gen, plan.upstream, current, elapsed, ok);
                return Err(e);
            }
            Err(AttemptFail::NotSent { error, health }) => (error, health),
            Err(AttemptFail::NoResponse(e)) if plan.replayable => (e, true),
            Err(AttemptFail::NoResponse(e)) => {
                feedback(plan.gen, plan.upstream, current, elapsed, false);
                return Err(E::from_error(e));
            }
            Err(AttemptFail::RetryStatus(s)) => (
                ProxyError::upstream(ErrorKind::UpstreamStatus(s)),
                group.outlier.on_5xx && s >= 500,
            ),
        };
        if counts {
            feedback(plan.gen, plan.upstream, current, elapsed, false);
        } else {
            plan.gen.group(plan.upstream).end(current, elapsed, true);
        }
        let next = (retries_left > 0)
            .then(|| pick(plan, &tried, true))
            .flatten();
        match next {
            Some(b) => {
                retries_left -= 1;
                plan.worker.metrics.retries.inc();
                tracing::debug!(from = %group.backends[current].addr, to = %group.backends[b].addr, error = %error.kind, "retrying");
                current = b;
            }
            None => return Err(E::from_error(error)),
        }
    }
}

/// Records an attempt's span (a sampled exchange).
#[cold]
fn trace_attempt<T, E: ExchangeError>(
    t: &crate::otel::Trace,
    span: crate::otel::Phase,
    backend: &crate::upstream::addr::BackendAddr,
    resend: u32,
    result: &Result<(T, u16), AttemptFail<E>>,
) {
    use super::trace::AttemptEnd;
    let end = match result {
        Ok((_, status)) => AttemptEnd::Status(*status),
        Err(AttemptFail::RetryStatus(s)) => AttemptEnd::Status(*s),
        Err(AttemptFail::NotSent { error, .. } | AttemptFail::NoResponse(error)) => {
            AttemptEnd::Failed(error)
        }
        Err(AttemptFail::Fatal(e)) => AttemptEnd::Fatal(e.side()),
    };
    super::trace::attempt(t, span, backend, resend, end);
}

/// Picks a backend not in `tried`; a retry (`retry`) must first win the retry budget.
pub(crate) fn pick(plan: &Plan<'_>, tried: &BackendSet, retry: bool) -> Option<usize> {
    let group = &plan.gen.snapshot.upstreams[plan.upstream];
    let mut state = plan.gen.group(plan.upstream);
    if retry {
        if !state.budget.try_spend() {
            tracing::debug!(upstream = %group.name, "retry budget exhausted");
            return None;
        }
    } else {
        state.budget.earn();
    }
    let mut excluded = group.health.down_set();
    excluded.union_with(tried);
    state.pick(&PickContext {
        client: plan.client,
        excluded,
        hash: plan.hash,
    })
}

/// Reports an attempt's end to the picker and to passive health.
pub(crate) fn feedback(
    gen: &Generation,
    upstream: usize,
    backend: usize,
    elapsed: Duration,
    ok: bool,
) {
    let group = &gen.snapshot.upstreams[upstream];
    gen.end(upstream, backend, elapsed, ok);
    if ok {
        group.health.record_success(backend);
    } else {
        group.health.record_failure(backend, &group.outlier);
    }
}

/// An attempt in progress on a backend. If the exchange is dropped before the attempt ends
/// (an HTTP/2 client reset its stream), the drop reports the end, so per-backend in-flight
/// counts cannot leak.
struct AttemptGuard<'a> {
    gen: &'a Generation,
    upstream: usize,
    backend: usize,
    t0: Instant,
    armed: bool,
}

impl<'a> AttemptGuard<'a> {
    fn start(gen: &'a Generation, upstream: usize, backend: usize) -> Self {
        gen.start(upstream, backend);
        AttemptGuard {
            gen,
            upstream,
            backend,
            t0: Instant::now(),
            armed: true,
        }
    }

    /// The attempt completed; its caller reports the end. Returns how long it took.
    fn disarm(&mut self) -> Duration {
        self.armed = false;
        self.t0.elapsed()
    }
}

impl Drop for AttemptGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Cancelled by the client: not the backend's fault.
            self.gen
                .group(self.upstream)
                .end(self.backend, self.t0.elapsed(), true);
        }
    }
}
