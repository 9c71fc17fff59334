//! A framed client's request (an HTTP/2 or HTTP/3 stream) forwarded to an HTTP/1.1 upstream
//! through the worker's keep-alive pool.
//!
//! The request head is written in HTTP/1.1 form (`:authority` becomes Host, cookies split by
//! HTTP/2 are joined again, a body of unknown length goes chunked). Small request bodies of
//! idempotent requests are buffered so the request can be retried on another backend, like
//! the HTTP/1 path; larger ones stream. The response body streams back through [`H1Body`],
//! which returns the upstream connection to the pool once the body is complete.

use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response};
use http_body::Body;
use tokio::time::Instant;

use super::framed::{next_frame, End, FramedClient, ResponseBody};
use crate::deadline::timeout;
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::attempt;
use crate::exchange::h1_body::H1Body;
use crate::exchange::{Buffering, ProxyTarget};
use crate::http1::body::{BodyState, READ_CHUNK};
use crate::http1::response::ForeignHead;
use crate::http1::BodyKind;
use crate::upstream::pool::UpstreamConn;
use crate::worker::Generation;

type Fail = attempt::AttemptFail<ProxyError>;

fn up(kind: ErrorKind) -> ProxyError {
    ProxyError::upstream(kind)
}

/// Forwards the request: its head written for HTTP/1.1, the body buffered as far as
/// `request_buffering` says, the route's concurrency slot, the attempts (retried while the
/// body is replayable), then the response, streamed.
pub(crate) async fn relay<C: FramedClient>(
    c: &C,
    gen: &Rc<Generation>,
    t: &ProxyTarget,
    req: Request<C::Body>,
    fin: &mut Option<Box<C::End>>,
) -> Result<Response<ResponseBody<C::End>>, ProxyError> {
    let mut wbuf = c.worker().take_vec();
    let result = forward_with(c, gen, t, req, fin, &mut wbuf).await;
    c.worker().give_vec(wbuf);
    result
}

async fn forward_with<C: FramedClient>(
    c: &C,
    gen: &Rc<Generation>,
    t: &ProxyTarget,
    req: Request<C::Body>,
    fin: &mut Option<Box<C::End>>,
    wbuf: &mut Vec<u8>,
) -> Result<Response<ResponseBody<C::End>>, ProxyError> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let (parts, mut body) = req.into_parts();
    let is_head = parts.method == Method::HEAD;
    let idempotent = crate::http1::request::idempotent_method(parts.method.as_str());
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let framing = if body.is_end_stream() {
        // An empty POST/PUT/PATCH still says so: some servers answer 411 without a length.
        let empty_with_length = matches!(parts.method, Method::POST | Method::PUT | Method::PATCH)
            || parts.method.as_str() == "QUERY";
        if empty_with_length {
            BodyKind::Length(0)
        } else {
            BodyKind::Length(declared.unwrap_or(0)).min_none()
        }
    } else {
        declared.map_or(BodyKind::Chunked, BodyKind::Length)
    };
    write_head(c, gen, (&parts, t), framing, fin, wbuf);
    let interims = send_hints(gen, t, &parts.extensions);

    let mut streaming = !body.is_end_stream();
    let mut buffered = 0;
    if streaming {
        let setting = gen.snapshot.settings.request_buffering;
        let buffering = crate::exchange::body_buffering(setting, declared, idempotent, group);
        let buffered_body = buffer_body(c, &mut body, buffering, framing, wbuf, t.max_body).await;
        let (done, got) = match buffered_body {
            Ok(x) => x,
            Err(e) => return Err(c.drain(body, e)),
        };
        streaming = !done;
        buffered = got;
    }
    let replayable = idempotent && !streaming;
    // After the buffered part of the body: a slow sender held no slot while it trickled.
    let plan = super::framed::start_attempts(c, gen, t, fin, replayable).await?;
    let mut last = None;
    let result = attempt::run(
        &plan,
        t.backend,
        &mut last,
        async |backend, may_retry_status| {
            // What is left of `max_body_bytes` for the streamed rest.
            let budget = t.max_body.map(|m| m.saturating_sub(buffered));
            let body_ref = if streaming {
                Some((&mut body, budget))
            } else {
                None
            };
            if let Some(tr) = &plan.trace {
                tr.patch_head(wbuf);
            }
            let t0 = Instant::now();
            let tries = crate::exchange::h1::Tries {
                is_head,
                replayable,
                may_retry_status,
                whole: false,
            };
            let to = (t, backend);
            let tries = (tries, interims.clone());
            let (conn, head, rest) = attempt(c, gen, to, wbuf, (body_ref, framing), tries).await?;
            c.worker().metrics.upstream_duration.observe(t0.elapsed());
            let status = head.status;
            Ok(((backend, conn, head, rest), status))
        },
    )
    .await;
    if let (Some(f), Some(b)) = (fin.as_deref_mut(), last) {
        f.record().backend = Some(group.backends[b].addr.clone());
    }
    let (backend, conn, head, rest) = match result {
        Ok(x) => x,
        Err(e) => return Err(c.drain(body, e)),
    };
    if let Some(page) = super::framed::upstream_error_page(c.worker(), head.status, is_head, fin) {
        return Ok(page);
    }
    let links = head.headers.get_all(http::header::LINK).iter();
    super::learn_early_hints(gen, t, head.status, links.map(|v| v.as_bytes()));
    Ok(respond(c, gen, t, backend, conn, head, rest, fin))
}

/// Reads the body into `wbuf` (after the head) as `buffering` says, before any upstream is
/// involved; returns whether it was read to its end. A body of unknown length goes chunked,
/// so what is read is chunk-encoded and the rest streams after it.
async fn buffer_body<C: FramedClient>(
    c: &C,
    body: &mut C::Body,
    buffering: Buffering,
    framing: BodyKind,
    wbuf: &mut Vec<u8>,
    max_body: Option<u64>,
) -> Result<(bool, u64), ProxyError> {
    let limit = match buffering {
        Buffering::Stream => return Ok((false, 0)),
        Buffering::Whole => usize::MAX,
        Buffering::UpTo(limit) => limit,
    };
    let chunked = framing == BodyKind::Chunked;
    let mut got = 0u64;
    while (got as usize) <= limit {
        let Some(frame) = next_frame(c, body).await? else {
            if chunked {
                wbuf.extend_from_slice(b"0\r\n\r\n");
            } else if framing != BodyKind::Length(got) {
                return Err(ProxyError::downstream(ErrorKind::BadRequest(
                    "request body does not match its content-length",
                )));
            }
            return Ok((true, got));
        };
        // Request trailers: HTTP/1.1 upstreams rarely accept them.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        got += data.len() as u64;
        c.worker().metrics.bytes_in.add(data.len() as u64);
        if max_body.is_some_and(|m| got > m) {
            return Err(ProxyError::downstream(ErrorKind::BodyTooLarge));
        }
        if chunked {
            push_chunk(wbuf, &data);
        } else {
            wbuf.extend_from_slice(&data);
        }
    }
    Ok((false, got))
}

/// Appends `data` as one chunk of a chunked body.
fn push_chunk(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

trait MinNone {
    fn min_none(self) -> Self;
}

impl MinNone for BodyKind {
    /// `Length(0)` without a declared length is no body at all.
    fn min_none(self) -> Self {
        match self {
            BodyKind::Length(0) => BodyKind::None,
            k => k,
        }
    }
}

/// The rest of a request body still to stream (with what is left of `max_body_bytes`), and
/// its framing on the HTTP/1.1 hop.
type Streamed<'b, B> = (Option<(&'b mut B, Option<u64>)>, BodyKind);

/// Writes the HTTP/1.1 request head for an HTTP/2 or HTTP/3 request, complete with its blank
/// line (the one writer of [`crate::exchange::h1_head`]).
fn write_head<C: FramedClient>(
    c: &C,
    gen: &Generation,
    (parts, t): (&http::request::Parts, &ProxyTarget),
    framing: BodyKind,
    fin: &mut Option<Box<C::End>>,
    out: &mut Vec<u8>,
) {
    let head = crate::exchange::Head {
        method: parts.method.as_str(),
        target: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        host: super::framed::authority(&parts.uri, &parts.headers).as_bytes(),
        version: c.version(),
        fields: crate::exchange::Fields::H2(&parts.headers),
    };
    let host = gen.snapshot.upstreams[t.upstream].backends[t.backend].authority();
    let options = crate::exchange::h1_head::HeadOptions {
        method: parts.method.as_str(),
        framing,
        unconditional: false,
        fallback_host: &host,
        client_ip: c.client_ip(),
        proto: c.proto(),
        keep_underscores: gen.snapshot.settings.underscores_in_headers,
        hook_lines: fin
            .as_deref_mut()
            .and_then(|f| f.record().ctx.as_deref())
            .map(|ctx| ctx.upstream_headers.as_slice()),
    };
    crate::exchange::h1_head::write(&head, t, &options, out);
    out.extend_from_slice(b"\r\n");
}

/// One attempt against one backend: returns the connection, the response head and the bytes
/// read after it.
async fn attempt<C: FramedClient>(
    c: &C,
    gen: &Generation,
    (t, backend): (&ProxyTarget, usize),
    wbuf: &[u8],
    (mut body, framing): Streamed<'_, C::Body>,
    tries: (crate::exchange::h1::Tries, Option<crate::hints::Interims>),
) -> Result<(UpstreamConn, ForeignHead, BytesMut), Fail> {
    let write_timeout = gen.snapshot.upstreams[t.upstream].write_timeout;
    let stream = async |conn: &mut UpstreamConn| match body.as_mut() {
        Some((body, budget)) => stream_body(c, write_timeout, conn, body, framing, *budget).await,
        None => Ok(()),
    };
    crate::exchange::h1::foreign_relaying((c.worker(), gen), t.to(backend), wbuf, stream, tries)
        .await
}

/// The request's way to send informational responses, if its codec has one (HTTP/3); first
/// through it, on an `early_hints` route, the `103 Early Hints` of the path's last 200.
fn send_hints(
    gen: &Generation,
    t: &ProxyTarget,
    extensions: &http::Extensions,
) -> Option<crate::hints::Interims> {
    let interims = extensions.get::<crate::hints::Interims>()?;
    if let Some(links) = super::early_hints(gen, t) {
        interims.send(crate::hints::response(links));
    }
    Some(interims.clone())
}

/// Streams the request body from the HTTP/2 stream to the upstream (chunk-encoded when its
/// length is unknown). Flow control bounds what the client sends ahead.
async fn stream_body<C: FramedClient>(
    c: &C,
    write_timeout: Duration,
    conn: &mut UpstreamConn,
    body: &mut C::Body,
    framing: BodyKind,
    mut budget: Option<u64>,
) -> Result<(), Fail> {
    let chunked = framing == BodyKind::Chunked;
    let mut out = Vec::with_capacity(READ_CHUNK);
    while let Some(frame) = next_frame(c, body).await.map_err(Fail::Fatal)? {
        let Ok(data) = frame.into_data() else {
            continue; // request trailers: HTTP/1.1 upstreams rarely accept them
        };
        if data.is_empty() {
            continue;
        }
        c.worker().metrics.bytes_in.add(data.len() as u64);
        if let Some(left) = budget.as_mut() {
            // `max_body_bytes`: 413; the upstream connection, holding a partial body, closes.
            *left = left
                .checked_sub(data.len() as u64)
                .ok_or(Fail::Fatal(ProxyError::downstream(ErrorKind::BodyTooLarge)))?;
        }
        out.clear();
        if chunked {
            push_chunk(&mut out, &data);
            write_up(conn, write_timeout, &out).await?;
        } else {
            write_up(conn, write_timeout, &data).await?;
        }
    }
    if chunked {
        write_up(conn, write_timeout, b"0\r\n\r\n").await?;
    }
    Ok(())
}

async fn write_up(conn: &mut UpstreamConn, limit: Duration, data: &[u8]) -> Result<(), Fail> {
    match timeout(limit, crate::tls::send_all(&mut conn.stream, data)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Fail::Fatal(up(ErrorKind::Io(e)))),
        Err(_) => Err(Fail::Fatal(up(ErrorKind::WriteTimeout))),
    }
}

#[allow(clippy::too_many_arguments)]
fn respond<C: FramedClient>(
    c: &C,
    gen: &Rc<Generation>,
    t: &ProxyTarget,
    backend: usize,
    conn: UpstreamConn,
    head: ForeignHead,
    rest: BytesMut,
    fin: &mut Option<Box<C::End>>,
) -> Response<ResponseBody<C::End>> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let mut fin = fin.take().expect("present until success");
    fin.set_status(head.status);
    let mut headers = head.headers;
    if matches!(head.status, 204 | 304) {
        // These responses have no content. A Content-Length on a 204 is forbidden, and HTTP/2
        // clients treat one that promises bytes no DATA frame carries as a malformed response
        // (a stream reset with no status): answer the status without it.
        if let Some(len) = headers.remove(http::header::CONTENT_LENGTH) {
            if len.as_bytes() != b"0" {
                tracing::warn!(
                    upstream = %group.name,
                    status = head.status,
                    content_length = ?len,
                    "upstream sent a Content-Length on a response without content; dropped"
                );
            }
        }
    }
    crate::exchange::invalidate_map(fin.record(), head.status, &headers);
    if let Some(view) = crate::exchange::on_response(c.worker(), fin.record(), head.status) {
        view.apply_map(&mut headers);
    }
    let has_body = !matches!(head.body, BodyKind::None | BodyKind::Length(0));
    let encoder = if t.compress {
        crate::compress::filter_proxy_headers(&mut headers, head.status, has_body, t.encoding)
    } else {
        None
    };
    if let (None, BodyKind::Length(n)) = (&encoder, head.body) {
        if n > 0 && rest.len() as u64 == n {
            // The whole body came with the head (most small responses): the connection goes
            // back to the pool now, and the stream needs no body reader, upstream read or
            // stall-watch slot (three allocations and a poll less per response).
            let reusable = head.upstream_reusable.then_some(conn);
            let to = (t.upstream, backend, reusable);
            return complete(c, gen, to, head.status, rest, headers, fin);
        }
    }
    let body = H1Body {
        worker: c.worker().clone(),
        encoder,
        conn: Some(conn),
        buf: rest,
        state: BodyState::new(head.body, true),
        gen: gen.clone(),
        upstream: t.upstream,
        backend,
        reusable: head.upstream_reusable,
        read_timeout: group.read_timeout,
        sleep: None,
        scratch: Vec::new(),
        fin: Some(fin),
    };
    let mut body = Box::new(body);
    if body.state.is_done() && body.buf.is_empty() {
        // No body (HEAD, 204, 304, empty): hyper will not poll it.
        body.release();
    }
    upstream_response(head.status, headers, ResponseBody::H1(body))
}

/// [`respond`] for a response whose body is all in `rest`: pools the upstream connection
/// (when it is given: reusable) and answers the body as one frame.
fn complete<C: FramedClient>(
    c: &C,
    gen: &Rc<Generation>,
    (upstream, backend, conn): (usize, usize, Option<UpstreamConn>),
    status: u16,
    rest: BytesMut,
    headers: http::HeaderMap,
    mut fin: Box<C::End>,
) -> Response<ResponseBody<C::End>> {
    let worker = c.worker();
    // Copied out so the worker's 16 KiB read buffer is recycled at once.
    let data = Bytes::copy_from_slice(&rest);
    worker.give_bytes(rest);
    if let Some(conn) = conn {
        worker.pool_upstream(gen, (upstream, backend), conn);
    }
    fin.sent(data.len() as u64);
    upstream_response(status, headers, ResponseBody::Full(Some(data), Some(fin)))
}

/// The response to the client: the upstream's status and (edited) headers over `body`.
fn upstream_response<B>(status: u16, headers: http::HeaderMap, body: B) -> Response<B> {
    let status = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    super::framed::respond(status, headers, body)
}
