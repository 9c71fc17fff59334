//! The upstream request of a fill: a GET on the group's HTTP/1.1 keep-alive pool, through
//! the same attempt loop as every request (retries, outlier feedback, health), with the
//! whole response read into memory up to `max_object`.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::time::{timeout, timeout_at, Instant};

use crate::downstream::relay::{reserve, BodyState, READ_CHUNK};
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::attempt::{self, AttemptFail, Plan};
use crate::exchange::ProxyTarget;
use crate::http1::response::{parse_foreign, MAX_RESPONSE_HEAD};
use crate::upstream::connect::connect_backend;
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
    let pooled = gen.groups.borrow_mut()[t.upstream]
        .pool
        .take(backend, t.origin);
    let connect = || async {
        connect_backend(&worker.metrics, group, backend, t.origin)
            .await
            .map_err(|(error, health)| Fail::NotSent { error, health })
    };
    let (mut conn, mut reused) = match pooled {
        Some(c) => (c, true),
        None => (connect().await?, false),
    };
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let parsed = loop {
        match timeout(
            group.write_timeout,
            crate::tls::send_all(&mut conn.stream, head),
        )
        .await
        {
            Err(_) => return Err(Fail::NoResponse(up(ErrorKind::WriteTimeout))),
            Ok(Err(_)) if reused => {
                (conn, reused) = (connect().await?, false);
                continue;
            }
            Ok(Err(e)) => return Err(Fail::NoResponse(up(ErrorKind::Io(e)))),
            Ok(Ok(())) => {}
        }
        let deadline = Instant::now() + group.read_timeout;
        buf.clear();
        let head = loop {
            if !buf.is_empty() {
                match parse_foreign(&buf, false).map_err(Fail::Fatal)? {
                    None if buf.len() > MAX_RESPONSE_HEAD => {
                        return Err(Fail::Fatal(up(ErrorKind::BadResponse(
                            "response head too large",
                        ))))
                    }
                    None => {}
                    Some(Err(interim)) => {
                        buf.advance(interim);
                        continue;
                    }
                    Some(Ok(h)) => break Some(h),
                }
            }
            reserve(&mut buf, READ_CHUNK);
            match timeout_at(deadline, conn.stream.read_buf(&mut buf)).await {
                Err(_) => return Err(Fail::NoResponse(up(ErrorKind::ReadTimeout))),
                Ok(Ok(n)) if n > 0 => {}
                _ if buf.is_empty() && reused => break None,
                _ if buf.is_empty() => return Err(Fail::NoResponse(up(ErrorKind::UpstreamClosed))),
                _ => return Err(Fail::Fatal(up(ErrorKind::UpstreamClosed))),
            }
        };
        match head {
            Some(h) => break h,
            // A pooled connection the backend had closed: once more on a fresh one.
            None => (conn, reused) = (connect().await?, false),
        }
    };
    if may_retry_status && group.retry_on.contains(&parsed.status) {
        return Err(Fail::RetryStatus(parsed.status));
    }
    buf.advance(parsed.head_len);
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
    if parsed.upstream_reusable && buf.is_empty() && !worker.shutting_down() {
        gen.groups.borrow_mut()[t.upstream].pool.put(backend, conn);
    }
    let _ = state;
    Ok(Some(Fetched {
        status: parsed.status,
        headers: parsed.headers,
        body: Bytes::from(body),
    }))
}
