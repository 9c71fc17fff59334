//! The cache fill's upstream request (any client protocol): a GET on the group's HTTP/1.1
//! keep-alive pool, through the same attempt loop as every request (retries, outlier
//! feedback, health) and the one HTTP/1 client ([`super::h1`]), with the whole response read
//! into memory. The cache knows it only as its [`crate::cache::fetch::Upstream`].

use std::rc::Rc;

use bytes::{Buf, Bytes};
use tokio::io::AsyncReadExt;
use tokio::time::{timeout, Instant};

use crate::cache::fetch::{Fetched, Upstream};
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::attempt::{self, AttemptFail, Plan};
use crate::exchange::ProxyTarget;
use crate::http1::body::{reserve, BodyState, READ_CHUNK};
use crate::worker::{Generation, Worker};

/// The upstream of a request's cache fill (any client protocol): a GET on the group's
/// HTTP/1.1 keep-alive pool, through the same attempt loop as every request (retries,
/// outlier feedback, health), with the whole response read into memory.
pub(crate) struct FillUpstream<'a> {
    pub worker: &'a Rc<Worker>,
    pub gen: &'a Rc<Generation>,
    pub target: &'a ProxyTarget,
    /// Where the upstream's interim (1xx) heads go: to the client whose request fills.
    pub interims: Option<crate::hints::Interims>,
    /// The exchange is sampled: each attempt gets a span (a background refresh, detached
    /// from its exchange, has none).
    pub trace: Option<crate::otel::TraceRef>,
}

/// A [`FillUpstream`] that owns what it refers to, for a background refresh.
struct Detached {
    worker: Rc<Worker>,
    gen: Rc<Generation>,
    target: ProxyTarget,
}

impl Upstream for FillUpstream<'_> {
    async fn fetch(&self, head: &[u8], max: u64) -> Result<Option<Fetched>, ProxyError> {
        let to = (self.target, self.interims.as_ref());
        fetch((self.worker, self.gen), to, self.trace.clone(), head, max).await
    }

    fn detach(&self) -> impl Upstream + 'static {
        let mut target = self.target.clone();
        if let Some(e) = target.edit.as_mut() {
            e.untrace(); // the exchange ends before a background refresh does
        }
        Detached {
            worker: self.worker.clone(),
            gen: self.gen.clone(),
            target,
        }
    }
}

impl Upstream for Detached {
    async fn fetch(&self, head: &[u8], max: u64) -> Result<Option<Fetched>, ProxyError> {
        fetch(
            (&self.worker, &self.gen),
            (&self.target, None),
            None,
            head,
            max,
        )
        .await
    }

    fn detach(&self) -> impl Upstream + 'static {
        Detached {
            worker: self.worker.clone(),
            gen: self.gen.clone(),
            target: self.target.clone(),
        }
    }
}

type Fail = AttemptFail<ProxyError>;

fn up(kind: ErrorKind) -> ProxyError {
    ProxyError::upstream(kind)
}

/// Sends `head` (complete, blank line included) and reads the response; `Ok(None)` when its
/// body is larger than `max` (the connection is then closed, not pooled).
async fn fetch(
    (worker, gen): (&Worker, &Generation),
    (t, interims): (&ProxyTarget, Option<&crate::hints::Interims>),
    trace: Option<crate::otel::TraceRef>,
    head: &[u8],
    max: u64,
) -> Result<Option<Fetched>, ProxyError> {
    let plan = Plan {
        worker,
        gen,
        upstream: t.upstream,
        client: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        hash: t.hash,
        replayable: true,
        trace,
    };
    let mut last = None;
    attempt::run(&plan, t.backend, &mut last, async |backend, may_retry| {
        // A sampled exchange's head names the current attempt (a copy: the head is shared).
        let patched = plan.trace.as_ref().map(|tr| {
            let mut h = head.to_vec();
            tr.patch_head(&mut h);
            h
        });
        let head = patched.as_deref().unwrap_or(head);
        let t0 = Instant::now();
        let to = (t, interims.cloned());
        let r = once(worker, gen, to, backend, head, max, may_retry).await?;
        worker.metrics.upstream_duration.observe(t0.elapsed());
        let status = r.as_ref().map_or(200, |f| f.status);
        Ok((r, status))
    })
    .await
}

/// One attempt on one backend.
async fn once(
    worker: &Worker,
    gen: &Generation,
    (t, interims): (&ProxyTarget, Option<crate::hints::Interims>),
    backend: usize,
    head: &[u8],
    max: u64,
    may_retry_status: bool,
) -> Result<Option<Fetched>, Fail> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let (mut conn, parsed, mut buf) = crate::exchange::h1::foreign_relaying(
        (worker, gen),
        t.to(backend),
        head,
        async |_: &mut crate::upstream::pool::UpstreamConn| Ok(()),
        (
            crate::exchange::h1::Tries {
                is_head: false,
                replayable: true,
                may_retry_status,
                whole: true,
            },
            interims,
        ),
    )
    .await?;
    if let crate::http1::BodyKind::Length(n) = parsed.body {
        if n > max {
            return Ok(None);
        }
    }
    let mut state = BodyState::new(parsed.body, true);
    let mut body = Vec::new();
    loop {
        let used = state
            .take_into(&buf, &mut body)
            .map_err(|_| Fail::Fatal(up(ErrorKind::BadResponse("invalid chunked body"))))?;
        buf.advance(used);
        if body.len() as u64 > max {
            return Ok(None);
        }
        if state.is_done() {
            break;
        }
        reserve(&mut buf, READ_CHUNK);
        match timeout(group.read_timeout, conn.stream.read_buf(&mut buf)).await {
            Err(_) => return Err(Fail::Fatal(up(ErrorKind::ReadTimeout))),
            Ok(Ok(n)) if n > 0 => {}
            _ if matches!(state, BodyState::UntilClose) => {
                state = BodyState::Done;
                break;
            }
            _ => return Err(Fail::Fatal(up(ErrorKind::UpstreamClosed))),
        }
    }
    if parsed.upstream_reusable && buf.is_empty() {
        worker.pool_upstream(gen, (t.upstream, backend), conn);
    }
    let _ = state;
    Ok(Some(Fetched {
        status: parsed.status,
        headers: parsed.headers,
        body: Bytes::from(body),
    }))
}
