//! veloxy's own answers to an HTTP/2 or HTTP/3 stream it could not forward (gRPC-aware),
//! and the drain of a refused body after a 413.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};

use super::request_body::RequestBody;
use super::{Finish, ProxyBody};
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::grpc_web::Web;
use crate::worker::Worker;

/// Whether veloxy's own error answers the request as gRPC (`Some`), and then as gRPC-Web
/// (`Some(Some(_))`: its gRPC-Web encoding); `None`: as plain HTTP. Only a gRPC request's
/// content-type is read further.
pub(super) fn grpc_kind(headers: &HeaderMap) -> Option<Option<Web>> {
    let ct = headers.get(http::header::CONTENT_TYPE)?.as_bytes();
    ct.starts_with(b"application/grpc")
        .then(|| crate::exchange::grpc_web::detect(Some(ct)))
}

/// veloxy's own answer to a stream it could not forward. gRPC clients get a trailers-only
/// response with a gRPC status, as gRPC proxies do, rather than an HTTP error they would
/// report as a protocol failure; gRPC-Web clients get it in their gRPC-Web content-type, the
/// status also in a trailer frame ([`crate::exchange::grpc_web::trailers_only`]).
pub(super) fn error_response(
    e: &ProxyError,
    grpc: Option<Option<Web>>,
    mut fin: Box<Finish>,
) -> Response<ProxyBody> {
    let status = e.status();
    let message = e.kind.to_string();
    let mut headers = HeaderMap::new();
    if status == 503 || status == 429 {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    let body = if let Some(web) = grpc {
        let code = match status {
            404 => "12",      // UNIMPLEMENTED
            429 => "8",       // RESOURCE_EXHAUSTED
            400 | 413 => "3", // INVALID_ARGUMENT
            504 => "4",       // DEADLINE_EXCEEDED
            401 | 403 => "7", // PERMISSION_DENIED
            _ => "14",        // UNAVAILABLE
        };
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from_static(code));
        if let Ok(v) = HeaderValue::from_str(&message) {
            headers.insert("grpc-message", v);
        }
        web.map(|web| {
            let frame = crate::exchange::grpc_web::trailers_only(web, &mut headers);
            fin.bytes_sent = frame.len() as u64;
            frame
        })
    } else {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        let text = match crate::exchange::error_page(&fin.record, status) {
            Some(page) => {
                let ct = HeaderValue::from_static(page.content_type);
                headers.insert(http::header::CONTENT_TYPE, ct);
                page.body.clone()
            }
            None => Bytes::from(format!(
                "{status} {}: {message}\n",
                crate::http1::reason(status)
            )),
        };
        let view = crate::exchange::edit::ResponseView {
            edit: fin.record.edit.as_ref(),
            hooks: &[],
            backend: None,
        };
        view.apply_map(&mut headers);
        fin.bytes_sent = text.len() as u64;
        Some(text)
    };
    let mut resp = Response::new(ProxyBody::Full(body, Some(fin)));
    let status = if grpc.is_some() { 200 } else { status };
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    *resp.headers_mut() = headers;
    resp
}

/// How much of a refused body is read and dropped after a 413, and for how long.
const DRAIN_MAX: u64 = 4 << 20;
const DRAIN_FOR: Duration = Duration::from_secs(5);

/// After a 413 (`max_body_bytes`), the rest of the client's body is read and dropped, up to
/// [`DRAIN_MAX`] bytes and [`DRAIN_FOR`], before the stream is reset: answering while the
/// client still sends, then resetting at once (RFC 9113 allows it) makes curl, and other
/// clients that stop reading on a reset, report a transport error instead of the 413. The 413
/// goes out first; this runs beside it. Returns `e` for the caller to answer.
pub(crate) fn drain_after_413(
    worker: &Rc<Worker>,
    mut body: RequestBody,
    e: ProxyError,
) -> ProxyError {
    use http_body_util::BodyExt;
    if matches!(e.kind, ErrorKind::BodyTooLarge) && !http_body::Body::is_end_stream(&body) {
        let worker = worker.clone();
        tokio::task::spawn_local(async move {
            let mut read = 0u64;
            let _ = tokio::time::timeout(DRAIN_FOR, async {
                while let Some(Ok(frame)) = body.frame().await {
                    let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                    worker.metrics.bytes_in.add(n);
                    read += n;
                    if read > DRAIN_MAX {
                        break;
                    }
                }
            })
            .await;
        });
    }
    e
}
