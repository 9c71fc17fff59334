//! HTTP/2 answers from file routes: the same decision as for HTTP/1 (`static_files`), the
//! body streamed from memory or read from the file in 64 KiB chunks.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};

use super::{Finish, ProxyBody};
use crate::error::{ErrorKind, ProxyError};
use crate::exchange;
use crate::worker::Worker;

/// Request headers of an HTTP/2 stream, as the file server reads them.
struct H2Headers<'a>(&'a HeaderMap);

impl crate::static_files::Headers for H2Headers<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|v| v.as_bytes())
    }
}

/// Answers a stream from a file route: the same decision as for HTTP/1, the body streamed
/// from memory or read from the file in chunks.
pub(super) fn serve_file(
    worker: &Worker,
    files: &crate::static_files::StaticRoute,
    req: &Request<super::RequestBody>,
    target: &str,
    fin: Box<Finish>,
) -> Response<ProxyBody> {
    let headers = H2Headers(req.headers());
    let request = crate::static_files::Request {
        method: req.method().as_str(),
        target,
        headers: &headers,
    };
    let r = crate::static_files::respond(files, &request);
    serve_response(worker, r, fin)
}

/// Writes a static response (a file route's, or an answer of veloxy's own) to a stream.
fn serve_response(
    worker: &Worker,
    r: crate::static_files::Response,
    mut fin: Box<Finish>,
) -> Response<ProxyBody> {
    let r = exchange::with_error_page(&fin.record, r);
    fin.status = r.status;
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
        crate::exchange::edit::append_fields(crate::exchange::edit::lines(lines), &mut map);
    }
    if let Some(view) = exchange::on_response(worker, &mut fin.record, r.status) {
        view.apply_map(&mut map);
    }
    let parts: std::collections::VecDeque<crate::static_files::Part> = match r.body {
        crate::static_files::Body::Empty => Default::default(),
        crate::static_files::Body::Bytes(b) => [crate::static_files::Part::Bytes(b)].into(),
        crate::static_files::Body::File { file, offset, len } => {
            [crate::static_files::Part::File { file, offset, len }].into()
        }
        crate::static_files::Body::Multipart(parts) => parts.into(),
    };
    let mut resp = Response::new(ProxyBody::File(Box::new(FileBody {
        parts,
        fin: Some(fin),
    })));
    *resp.status_mut() =
        http::StatusCode::from_u16(r.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    *resp.headers_mut() = map;
    resp
}

/// A file route's body: parts in memory or file regions read 64 KiB at a time (page-cache
/// reads on the worker thread, as nginx does without aio).
pub(crate) struct FileBody {
    pub(super) parts: std::collections::VecDeque<crate::static_files::Part>,
    pub(super) fin: Option<Box<Finish>>,
}

impl FileBody {
    pub(super) fn next(&mut self) -> Option<Result<Bytes, ProxyError>> {
        use crate::static_files::Part;
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
            f.bytes_sent += data.len() as u64;
            f.conn.worker.metrics.bytes_out.add(data.len() as u64);
        }
        Some(Ok(data))
    }
}

/// The route's error page instead of an upstream's error response (whose body is dropped,
/// with its connection), if the route has one for `status`.
pub(super) fn upstream_error_page(
    worker: &Worker,
    status: u16,
    is_head: bool,
    fin: &mut Option<Box<Finish>>,
) -> Option<Response<ProxyBody>> {
    let page = exchange::error_page(&fin.as_ref()?.record, status)?;
    let answer = exchange::Answer::page(status, page);
    Some(serve_answer(worker, answer, is_head, fin.take()?))
}

/// An answer of veloxy's own (redirect, fixed response) to an HTTP/2 stream.
/// An answer from the route's cache.
pub(super) fn serve_cached(
    worker: &Worker,
    r: crate::static_files::Response,
    fin: Box<Finish>,
) -> Response<ProxyBody> {
    serve_response(worker, r, fin)
}

pub(super) fn serve_answer(
    worker: &Worker,
    answer: exchange::Answer,
    is_head: bool,
    fin: Box<Finish>,
) -> Response<ProxyBody> {
    serve_response(worker, answer.into_response(is_head), fin)
}
