//! Exchanges of clients whose bodies travel as frames (HTTP/2 and HTTP/3 streams), written
//! once for both: what the relays need of the client connection ([`FramedClient`]) and of the
//! codec's end-of-exchange guard ([`End`]), the response body they hand back
//! ([`ResponseBody`]: veloxy's own bytes, a file, or an HTTP/1 or HTTP/2 upstream's stream),
//! and the static answers (file routes, redirects, fixed responses, cache hits, error pages).
//!
//! The relays to each upstream protocol are [`super::framed_h1`] and [`super::framed_h2`].
//! The HTTP/1 client keeps its own path (`downstream::proxy`): it writes bytes, not frames,
//! and its fast path is four syscalls a request.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::h1_body::H1Body;
use super::{Record, Slot};
use crate::deadline::timeout;
use crate::error::{ErrorKind, ProxyError};
use crate::static_files::Part;
use crate::worker::Worker;

/// A request body error, as hyper's HTTP/2 client takes it.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The client connection of a framed exchange, as the relays see it.
pub(crate) trait FramedClient {
    /// The request body: an HTTP/2 or HTTP/3 stream's.
    type Body: Body<Data = Bytes, Error = BodyError> + Send + Unpin + 'static;
    /// The codec's end-of-exchange guard, carried by the response body.
    type End: End;
    fn worker(&self) -> &Rc<Worker>;
    fn peer(&self) -> SocketAddr;
    /// The client's IP, formatted once per connection.
    fn client_ip(&self) -> &str;
    /// "http" or "https": the client's scheme.
    fn proto(&self) -> &'static str;
    /// 2 or 3 (logs, metrics, the Via-less HTTP/1 head's version).
    fn version(&self) -> u8;
    /// `[server] body_timeout`: the longest wait for the next frame of a request body.
    fn body_timeout(&self) -> Duration;
    /// Whether the client already stalled past `body_timeout` in `body` (a `mirror`
    /// read-ahead waited it out): then [`body_wait`] does not wait again.
    fn stalled(&self, _body: &Self::Body) -> bool {
        false
    }
    /// After a 413, reads and drops the rest of `body` beside the answer (clients that stop
    /// reading on a reset would report a transport error instead); returns `e`.
    fn drain(&self, body: Self::Body, e: ProxyError) -> ProxyError;
}

/// The codec's end of an exchange whose response goes out as frames: told what each frame
/// carried, and dropped (recording the exchange) when the body is complete or cut.
pub(crate) trait End {
    /// `n` more body bytes went to the client.
    fn sent(&mut self, n: u64);
    /// The response's status (for the log of a body cut short).
    fn status(&self) -> u16;
    fn set_status(&mut self, status: u16);
    fn record(&mut self) -> &mut Record;
    /// The route's concurrency slot, held until the response body ends.
    fn slot(&mut self) -> &mut Slot;
}

/// A response body: veloxy's own short answers, a file, or a stream from the upstream.
pub(crate) enum ResponseBody<F: End> {
    Full(Option<Bytes>, Option<Box<F>>),
    H1(Box<H1Body<F>>),
    H2(Incoming, Option<Box<F>>),
    /// An HTTP/2 upstream's gRPC answer to a gRPC-Web request, translated.
    GrpcWeb(Box<super::grpc_web::Encode<Incoming>>, Option<Box<F>>),
    File(Box<FileBody<F>>),
    /// A FastCGI response's body, as its records arrive.
    Fastcgi(Box<super::fastcgi_body::FcgiStream>, Option<Box<F>>),
}

/// The next frame of an upstream's HTTP/2 body, counted as sent to the client; the end of
/// the body ends the exchange (`fin` dropped).
fn poll_upstream<B, F: End>(
    body: Pin<&mut B>,
    fin: &mut Option<Box<F>>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>>
where
    B: Body<Data = Bytes, Error = hyper::Error>,
{
    let r = match body.poll_frame(cx) {
        Poll::Pending => return Poll::Pending,
        Poll::Ready(r) => r,
    };
    match r {
        None => {
            fin.take();
            Poll::Ready(None)
        }
        Some(Ok(frame)) => {
            if let (Some(d), Some(f)) = (frame.data_ref(), fin.as_deref_mut()) {
                f.sent(d.len() as u64);
            }
            Poll::Ready(Some(Ok(frame)))
        }
        Some(Err(e)) => Poll::Ready(Some(
            Err(ProxyError::upstream(ErrorKind::Stream).because(e)),
        )),
    }
}

impl<F: End> Body for ResponseBody<F> {
    type Data = Bytes;
    type Error = ProxyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>> {
        match self.get_mut() {
            ResponseBody::Full(data, fin) => {
                let out = data.take().map(|d| Ok(Frame::data(d)));
                if out.is_none() {
                    fin.take();
                }
                Poll::Ready(out)
            }
            ResponseBody::H1(b) => b.poll_frame(cx),
            ResponseBody::File(b) => match b.next() {
                Some(r) => Poll::Ready(Some(r.map(Frame::data))),
                None => {
                    b.fin.take();
                    Poll::Ready(None)
                }
            },
            ResponseBody::H2(body, fin) => poll_upstream(Pin::new(body), fin, cx),
            ResponseBody::GrpcWeb(body, fin) => poll_upstream(Pin::new(&mut **body), fin, cx),
            ResponseBody::Fastcgi(body, fin) => match body.poll_data(cx) {
                Poll::Ready(None) => {
                    fin.take();
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Ok(data))) => {
                    if let Some(f) = fin.as_deref_mut() {
                        f.sent(data.len() as u64);
                    }
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(d, _) => d.is_none(),
            ResponseBody::H1(b) => b.is_end_stream(),
            ResponseBody::H2(b, _) => b.is_end_stream(),
            ResponseBody::GrpcWeb(b, _) => b.is_end_stream(),
            ResponseBody::File(b) => b.parts.is_empty(),
            ResponseBody::Fastcgi(b, _) => b.is_end_stream(),
        }
    }
}

/// A static body: parts in memory or file regions read 64 KiB at a time (page-cache reads
/// on the worker thread, as nginx does without aio).
pub(crate) struct FileBody<F: End> {
    parts: VecDeque<Part>,
    fin: Option<Box<F>>,
}

impl<F: End> FileBody<F> {
    fn next(&mut self) -> Option<Result<Bytes, ProxyError>> {
        use std::os::unix::fs::FileExt;
        let data = match self.parts.pop_front()? {
            Part::Bytes(b) => b,
            Part::File { file, offset, len } => {
                let want = len.min(64 * 1024) as usize;
                let mut buf = vec![0u8; want];
                match file.read_at(&mut buf, offset) {
                    Ok(0) => {
                        return Some(Err(ProxyError::downstream(ErrorKind::Io(
                            std::io::ErrorKind::UnexpectedEof.into(),
                        ))))
                    }
                    Ok(n) => {
                        buf.truncate(n);
                        if (n as u64) < len {
                            self.parts.push_front(Part::File {
                                file,
                                offset: offset + n as u64,
                                len: len - n as u64,
                            });
                        }
                        Bytes::from(buf)
                    }
                    Err(e) => return Some(Err(ProxyError::downstream(ErrorKind::Io(e)))),
                }
            }
        };
        if let Some(f) = self.fin.as_deref_mut() {
            f.sent(data.len() as u64);
        }
        Some(Ok(data))
    }
}

/// Request fields of a framed request, as the file server reads them.
struct MapHeaders<'a>(&'a HeaderMap);

impl crate::static_files::Headers for MapHeaders<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|v| v.as_bytes())
    }
}

/// Answers from a file route: the same decision as for HTTP/1, the body streamed from memory
/// or read from the file in chunks.
pub(crate) fn serve_file<F: End>(
    worker: &Worker,
    files: &crate::static_files::StaticRoute,
    (method, target, headers): (&http::Method, &str, &HeaderMap),
    fin: Box<F>,
) -> Response<ResponseBody<F>> {
    let headers = MapHeaders(headers);
    let request = crate::static_files::Request {
        method: method.as_str(),
        target,
        headers: &headers,
    };
    let r = crate::static_files::respond(files, &request);
    serve_static(worker, r, fin)
}

/// A static response (a file route's, the cache's, or an answer of veloxy's own) as frames;
/// the route's error page replaces it when it has one for the status.
pub(crate) fn serve_static<F: End>(
    worker: &Worker,
    r: crate::static_files::Response,
    mut fin: Box<F>,
) -> Response<ResponseBody<F>> {
    let r = super::with_error_page(fin.record(), r);
    fin.set_status(r.status);
    let mut map = HeaderMap::with_capacity(r.headers.len());
    for (name, value) in r.headers {
        if name.eq_ignore_ascii_case("connection") {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            map.append(n, v);
        }
    }
    for lines in &r.raw {
        super::edit::append_fields(super::edit::lines(lines), &mut map);
    }
    if let Some(view) = super::on_response(worker, fin.record(), r.status) {
        view.apply_map(&mut map);
    }
    let parts: VecDeque<Part> = match r.body {
        crate::static_files::Body::Empty => Default::default(),
        crate::static_files::Body::Bytes(b) => [Part::Bytes(b)].into(),
        crate::static_files::Body::File { file, offset, len } => {
            [Part::File { file, offset, len }].into()
        }
        crate::static_files::Body::Multipart(parts) => parts.into(),
    };
    let body = FileBody {
        parts,
        fin: Some(fin),
    };
    let status =
        http::StatusCode::from_u16(r.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    respond(status, map, ResponseBody::File(Box::new(body)))
}

/// A FastCGI response: its head `r` as [`serve_static`] sends it, its body streamed from
/// `stream`.
pub(crate) fn serve_stream<F: End>(
    worker: &Worker,
    r: crate::static_files::Response,
    stream: Box<super::fastcgi_body::FcgiStream>,
    fin: Box<F>,
) -> Response<ResponseBody<F>> {
    let (parts, body) = serve_static(worker, r, fin).into_parts();
    let ResponseBody::File(mut file) = body else {
        unreachable!("a static response has a file body")
    };
    let body = ResponseBody::Fastcgi(stream, file.fin.take());
    Response::from_parts(parts, body)
}

/// An answer of veloxy's own (redirect, fixed response, error page).
pub(crate) fn serve_answer<F: End>(
    worker: &Worker,
    answer: super::Answer,
    is_head: bool,
    fin: Box<F>,
) -> Response<ResponseBody<F>> {
    serve_static(worker, answer.into_response(is_head), fin)
}

/// The route's error page instead of an upstream's error response (whose body is dropped,
/// with its connection), if the route has one for `status`.
pub(crate) fn upstream_error_page<F: End>(
    worker: &Worker,
    status: u16,
    is_head: bool,
    fin: &mut Option<Box<F>>,
) -> Option<Response<ResponseBody<F>>> {
    let page = super::error_page(fin.as_deref_mut()?.record(), status)?;
    let answer = super::Answer::page(status, page);
    Some(serve_answer(worker, answer, is_head, fin.take()?))
}

/// A response with `status`, `headers` and `body`.
pub(crate) fn respond<B>(status: http::StatusCode, headers: HeaderMap, body: B) -> Response<B> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// What the attempts of a framed request start from: the route's concurrency slot, taken now
/// (after whatever part of the body the relay buffers: a slow sender holds no slot while it
/// trickles), and the plan of the retry loop.
pub(crate) async fn start_attempts<'a, C: FramedClient>(
    c: &'a C,
    gen: &'a std::rc::Rc<crate::worker::Generation>,
    t: &super::ProxyTarget,
    fin: &mut Option<Box<C::End>>,
    replayable: bool,
) -> Result<super::attempt::Plan<'a>, ProxyError> {
    let f = fin.as_deref_mut().expect("present until success");
    let trace = f.record().trace.clone();
    super::hold_slot(&t.concurrency, f.slot(), trace.as_ref()).await?;
    Ok(super::attempt::Plan {
        worker: c.worker(),
        gen,
        upstream: t.upstream,
        client: c.peer(),
        hash: t.hash,
        replayable,
        trace,
    })
}

/// The longest wait for the next frame of `body`: `body_timeout`, or none at all once the
/// client stalled past it in this body (see [`FramedClient::stalled`]).
pub(crate) fn body_wait<C: FramedClient>(c: &C, body: &C::Body) -> Duration {
    match c.stalled(body) {
        true => Duration::ZERO,
        false => c.body_timeout(),
    }
}

/// The next frame of a request body, waiting at most `body_timeout` for it: a client that
/// stops sending mid-body must not hold an upstream connection (and a route's concurrency
/// slot) forever. A client that reset its stream is [`ErrorKind::Stream`].
pub(crate) async fn next_frame<C: FramedClient>(
    c: &C,
    body: &mut C::Body,
) -> Result<Option<Frame<Bytes>>, ProxyError> {
    match timeout(body_wait(c, body), body.frame()).await {
        Ok(Some(Ok(frame))) => Ok(Some(frame)),
        Ok(Some(Err(e))) => Err(ProxyError::downstream(ErrorKind::Stream).because(e)),
        Ok(None) => Ok(None),
        Err(_) => {
            c.worker().metrics.body_timeouts.inc();
            Err(ProxyError::downstream(ErrorKind::BodyTimeout))
        }
    }
}

/// The whole request body, up to `limit` bytes (413 beyond), for the steps that need it
/// before any upstream does (a search job, a body-keyed cache lookup).
pub(crate) async fn whole_body<C: FramedClient>(
    c: &C,
    body: &mut C::Body,
    limit: u64,
) -> Result<Bytes, ProxyError> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = next_frame(c, body).await? {
        if let Ok(data) = frame.into_data() {
            if (out.len() + data.len()) as u64 > limit {
                return Err(ProxyError::downstream(ErrorKind::BodyTooLarge));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

/// The request's host: `:authority`, else the Host field ("" when there is neither).
pub(crate) fn authority<'a>(uri: &'a http::Uri, headers: &'a HeaderMap) -> &'a str {
    uri.authority()
        .map(|a| a.as_str())
        .or_else(|| {
            headers
                .get(http::header::HOST)
                .and_then(|v| v.to_str().ok())
        })
        .unwrap_or("")
}
