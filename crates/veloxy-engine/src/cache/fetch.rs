//! The upstream request of a fill: a GET on the group's HTTP/1.1 keep-alive pool, through
//! the same attempt loop as every request (retries, outlier feedback, health), with the
//! whole response read into memory up to `max_object`.

use bytes::{Buf, Bytes};
use tokio::io::AsyncReadExt;
use tokio::time::{timeout, Instant};

use crate::downstream::relay::{reserve, BodyState, READ_CHUNK};
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::attempt::{self, AttemptFail, Plan};
use crate::exchange::ProxyTarget;
use crate::worker::{Generation, Worker};

/// A complete upstream response.
pub(crate) struct Fetched {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// A fill reads a body this large into memory to answer it even when it is too large to
/// store (above `max_object`); only larger ones make the request go upstream a second time.
pub(crate) const SERVE_LIMIT: u64 = 16 << 20;

type Fail = AttemptFail<ProxyError>;

fn up(kind: ErrorKind) -> ProxyError {
    ProxyError::upstream(kind)
}

/// Sends `head` (complete, blank line included) and reads the response; `Ok(None)` when its
/// body is larger than `max` (the connection is then closed, not pooled).
pub(crate) async fn fetch(
    worker: &Worker,
    gen: &Generation,
    t: &ProxyTarget,
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
    };
    let mut last = None;
    attempt::run(&plan, t.backend, &mut last, async |backend, may_retry| {
        let t0 = Instant::now();
        let r = once(worker, gen, t, backend, head, max, may_retry).await?;
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
    t: &ProxyTarget,
    backend: usize,
    head: &[u8],
    max: u64,
    may_retry_status: bool,
) -> Result<Option<Fetched>, Fail> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let (mut conn, parsed, mut buf) = crate::downstream::relay::exchange_head(
        worker,
        gen,
        (t, backend),
        head,
        async |_: &mut crate::upstream::pool::UpstreamConn| Ok(()),
        (false, true, may_retry_status),
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
