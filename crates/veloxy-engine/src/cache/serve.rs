//! A stored object as an answer, in the form every codec writes (a static response): its
//! stored fields, `Age`, the status header, and the client's own conditionals (304) and
//! range (206) answered from the object.

use bytes::Bytes;

use super::lookup::{ClientHead, RouteCache};
use super::{policy, Object};
use crate::static_files::range::{self, RangeRequest};
use crate::static_files::{Body, Response};

/// The answer to the client for `obj`; `label` goes in the status header (HIT, STALE, ...).
pub(crate) fn respond(
    rc: &RouteCache,
    obj: &Object,
    client: ClientHead,
    label: &str,
    now_ms: u64,
) -> Response {
    let mut headers = Vec::with_capacity(3);
    headers.push(("age", Bytes::from((obj.age_ms(now_ms) / 1000).to_string())));
    let status_line = rc.status_line(label);
    // A body veloxy may compress varies on Accept-Encoding, whichever coding this answer has.
    let compress = obj.compressible && rc.compress;
    let own = if compress {
        let mut l = status_line.to_vec();
        l.extend_from_slice(b"vary: Accept-Encoding\r\n");
        Bytes::from(l)
    } else {
        status_line
    };
    let raw = [obj.lines.clone(), own];
    if obj.status == 200 && not_modified(obj, &client) {
        return Response {
            status: 304,
            headers,
            body: Body::Empty,
            raw,
        };
    }
    if let (true, Some(e), None) = (compress, client.encoding, &client.range) {
        // The route compresses: the coded copy, made once per object and coding.
        if let Some(coded) = obj.encoded(e) {
            headers.push(("content-encoding", Bytes::from_static(e.token().as_bytes())));
            headers.push(("content-length", Bytes::from(coded.len().to_string())));
            let body = if client.is_head {
                Body::Empty
            } else {
                Body::Bytes(coded)
            };
            return Response {
                status: 200,
                headers,
                body,
                raw,
            };
        }
    }
    let len = obj.body.len() as u64;
    if let (200, Some(r)) = (obj.status, client.range.as_deref()) {
        if if_range_holds(obj, client.if_range.as_deref()) {
            match range::parse(r, len) {
                RangeRequest::Ranges(ranges) if ranges.len() == 1 => {
                    let r = ranges[0];
                    headers.push((
                        "content-range",
                        Bytes::from(format!("bytes {}-{}/{len}", r.start, r.end())),
                    ));
                    headers.push(("content-length", Bytes::from(r.len.to_string())));
                    let body = obj.body.slice(r.start as usize..(r.start + r.len) as usize);
                    return Response {
                        status: 206,
                        headers,
                        body: if client.is_head {
                            Body::Empty
                        } else {
                            Body::Bytes(body)
                        },
                        raw,
                    };
                }
                RangeRequest::Unsatisfiable => {
                    headers.push(("content-range", Bytes::from(format!("bytes */{len}"))));
                    headers.push(("content-length", Bytes::from_static(b"0")));
                    return Response {
                        status: 416,
                        headers,
                        body: Body::Empty,
                        raw,
                    };
                }
                // Several ranges: the whole object (the RFC allows it, and it is cheap here).
                _ => {}
            }
        }
    }
    if !matches!(obj.status, 204 | 304) {
        headers.push(("content-length", Bytes::from(len.to_string())));
    }
    let body = if client.is_head || obj.body.is_empty() {
        Body::Empty
    } else {
        Body::Bytes(obj.body.clone())
    };
    Response {
        status: obj.status,
        headers,
        body,
        raw,
    }
}

/// The client's `If-None-Match` (or, without it, `If-Modified-Since`) holds for `obj`.
fn not_modified(obj: &Object, client: &ClientHead) -> bool {
    if let Some(inm) = &client.if_none_match {
        return obj
            .etag
            .as_ref()
            .is_some_and(|e| policy::none_match(inm, e));
    }
    match (client.if_modified_since, &obj.last_modified) {
        (Some(since), Some((_, modified))) => *modified <= since,
        _ => false,
    }
}

/// `If-Range`: the range applies only to the representation the client already has (a
/// strong ETag or its Last-Modified date).
fn if_range_holds(obj: &Object, if_range: Option<&[u8]>) -> bool {
    let Some(v) = if_range else {
        return true;
    };
    if v.starts_with(b"\"") {
        return obj.etag.as_deref() == Some(v);
    }
    match (policy::http_date(v), &obj.last_modified) {
        (Some(d), Some((_, m))) => d == *m,
        _ => false,
    }
}
