//! HTTP/1.1 clients routed to `h2`/`h2c` upstream groups.
//!
//! The HTTP/2 request is built from the parsed HTTP/1 request at admission ([`H2Head`]: the
//! same field filtering and `X-Forwarded-*` as for HTTP/2 clients), with its body buffered up to the
//! group's `retry_body_limit` (larger bodies get 413: streaming an HTTP/1 body into an HTTP/2
//! stream would tie the client connection to a second task). It goes over the worker's
//! multiplexed connection to the backend, through the same retry loop as an HTTP/2 client's
//! request ([`crate::exchange::attempt`]): a failed connect moves to another backend, and as
//! the body is buffered, an idempotent request is retried after a reset or a `retry_on`
//! status. The response streams back as HTTP/1.1: with its
//! `content-length` when it has one, else chunked, with HTTP/2 trailers (gRPC status, ...) in
//! the chunked trailer section; HTTP/1.0 clients get a close-delimited body.

use std::time::Duration;

use http_body_util::BodyExt;
use tokio::time::timeout;

use crate::downstream::connection::{Downstream, Prepared};
use crate::downstream::proxy::{answer_error, reset_downstream};
use crate::downstream::relay::write_down;
use crate::error::{ErrorKind, ProxyError, Side};
use crate::exchange::attempt::{self, Plan};
use crate::exchange::{self, Record};
use crate::http1::{itoa, reason, BodyKind};
use crate::worker::{Generation, Worker};

/// Forwards one HTTP/1 request to an HTTP/2 upstream group; returns whether the client
/// connection stays open.
pub(crate) async fn relay(
    worker: &Worker,
    gen: &Generation,
    down: &mut Downstream,
    mut p: Prepared,
) -> bool {
    let group = &gen.snapshot.upstreams[p.target.upstream];
    let sent_before = down.bytes_sent;
    let mut record = std::mem::replace(&mut p.record, Record::placeholder());
    let mut last = None;
    let result = exchange(worker, gen, down, &mut p, &mut record, &mut last).await;
    // Free once the response is delivered (not while an error answer lingers).
    p.slot = None;
    record.backend = last.map(|b| group.backends[b].addr.clone());
    let (keep, status, linger) = match result {
        Ok((keep, status)) => (keep, status, false),
        Err(_) if down.bytes_sent > sent_before => {
            // The response had started: only a reset is honest now.
            reset_downstream(down);
            (false, 0, false)
        }
        Err(e) => {
            if e.side == Side::Upstream {
                tracing::warn!(upstream = %group.name, error = %e.report(), "upstream error (HTTP/2 upstream)");
            }
            let close = e.closes_connection() || !p.keep_alive || p.body != BodyKind::None;
            let a = answer_error(worker, down, &e, close, p.is_head, &record).await;
            (a.keep, e.status(), a.linger)
        }
    };
    crate::downstream::connection::finish_record(worker, down, &mut record, status);
    if linger {
        crate::downstream::connection::linger_close(&mut down.stream).await;
    }
    keep
}

/// Reads the body, takes the route's concurrency slot, sends the request through the retry
/// loop (the same attempts as for HTTP/2 clients: [`crate::exchange::h2::attempt_on`]; the body is
/// buffered, so an idempotent request is replayable), relays the response.
/// `Ok((keep_alive, status))`; `last`: the last backend tried.
async fn exchange(
    worker: &Worker,
    gen: &Generation,
    down: &mut Downstream,
    p: &mut Prepared,
    record: &mut Record,
    last: &mut Option<usize>,
) -> Result<(bool, u16), ProxyError> {
    let group = &gen.snapshot.upstreams[p.target.upstream];
    // The body goes whole (its limit is the group's `retry_body_limit`): a declared length
    // over it is refused before a 100 Continue invites it.
    let limit = group.retry_body_limit as u64;
    if matches!(p.body, BodyKind::Length(n) if n > limit) {
        return Err(ProxyError::downstream(ErrorKind::BodyTooLarge));
    }
    let mut body = crate::downstream::codec::read_body(down, p, limit).await?;
    if p.target.grpc_web.is_some_and(|w| w.text) {
        body = crate::exchange::grpc_web::decode_all(&body)?;
    }
    exchange::hold_slot(&p.target.concurrency, &mut p.slot, record.trace.as_ref()).await?;
    let head = p.h2_head.as_deref().ok_or_else(|| {
        ProxyError::downstream(ErrorKind::BadRequest("request not expressible in HTTP/2"))
    })?;
    let plan = Plan {
        worker,
        gen,
        upstream: p.target.upstream,
        client: down.peer,
        hash: p.target.hash,
        replayable: p.idempotent,
        trace: record.trace.clone(),
    };
    let upstream = p.target.upstream;
    let resp = attempt::run(&plan, p.target.backend, last, async |backend, may_retry| {
        let make = || {
            let mut r = head.request(group, backend, body.clone())?;
            if let Some(t) = &plan.trace {
                exchange::trace::set_traceparent(t, r.headers_mut());
            }
            Ok(r)
        };
        let trace = plan.trace.as_deref();
        crate::exchange::h2::attempt_on(worker, gen, (upstream, backend), may_retry, make, trace)
            .await
    })
    .await?;
    relay_response(worker, down, p, record, resp, group.read_timeout).await
}

fn exchange_error_page(record: &Record, status: u16) -> bool {
    crate::exchange::error_page(record, status).is_some()
}

/// Writes the HTTP/1.1 response head and streams the body (and trailers) to the client.
async fn relay_response(
    worker: &Worker,
    down: &mut Downstream,
    p: &Prepared,
    record: &mut Record,
    resp: http::Response<hyper::body::Incoming>,
    read_timeout: Duration,
) -> Result<(bool, u16), ProxyError> {
    let status = resp.status().as_u16();
    if exchange_error_page(record, status) {
        // The route's error page instead; the upstream stream is dropped (reset).
        let mut out = worker.take_vec();
        let keep = p.keep_alive;
        crate::downstream::proxy::write_edited_error(
            record, status, "", !keep, p.is_head, &mut out,
        );
        let ok = write_down(down, &out).await;
        worker.give_vec(out);
        return ok.map(|_| (keep, status));
    }
    let (mut parts, body) = resp.into_parts();
    match p.target.grpc_web {
        // gRPC-Web: the fields first, so that the route's rules see (and may change) them.
        Some(web) => {
            let body = crate::exchange::grpc_web::Encode::new(body, web, &mut parts.headers);
            stream_response(worker, down, p, record, (parts, body), read_timeout).await
        }
        None => stream_response(worker, down, p, record, (parts, body), read_timeout).await,
    }
}

/// Writes the HTTP/1.1 response head of `parts` and streams `body` (and its trailers).
async fn stream_response<B>(
    worker: &Worker,
    down: &mut Downstream,
    p: &Prepared,
    record: &mut Record,
    (mut parts, mut body): (http::response::Parts, B),
    read_timeout: Duration,
) -> Result<(bool, u16), ProxyError>
where
    B: http_body::Body<Data = bytes::Bytes, Error = hyper::Error> + Unpin,
{
    let status = parts.status.as_u16();
    let no_body = p.is_head || status == 204 || status == 304 || (100..200).contains(&status);
    let length = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let chunked = !no_body && length.is_none() && p.version == 1;
    let keep = p.keep_alive && (no_body || length.is_some() || chunked);
    let mut out = worker.take_vec();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa(u64::from(status)).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    crate::exchange::invalidate_map(record, status, &parts.headers);
    if let Some(view) = crate::exchange::on_response(worker, record, status) {
        view.apply_map(&mut parts.headers);
    }
    for (name, value) in &parts.headers {
        if name == http::header::TRANSFER_ENCODING || name == http::header::CONNECTION {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !keep {
        out.extend_from_slice(b"connection: close\r\n");
    } else if p.version == 0 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let result = async {
        write_down(down, &out).await?;
        if no_body {
            return Ok(());
        }
        let mut trailers = None;
        loop {
            // Each frame must come within the group's read_timeout, like an HTTP/1 read.
            let frame = timeout(read_timeout, body.frame())
                .await
                .map_err(|_| ProxyError::upstream(ErrorKind::ReadTimeout))?;
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| crate::downstream::http2::hyper_error(true, e))?;
            match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) if chunked => {
                    out.clear();
                    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                    out.extend_from_slice(&data);
                    out.extend_from_slice(b"\r\n");
                    write_down(down, &out).await?;
                }
                Ok(data) => write_down(down, &data).await?,
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        if chunked {
            out.clear();
            out.extend_from_slice(b"0\r\n");
            for (name, value) in trailers.iter().flatten() {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
            write_down(down, &out).await?;
        }
        Ok::<_, ProxyError>(())
    }
    .await;
    worker.give_vec(out);
    result.map(|()| (keep, status))
}
