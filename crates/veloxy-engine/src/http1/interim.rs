//! Interim (1xx) responses an upstream sends before its final one: which are forwarded to
//! clients, and their fields with the hop-by-hop ones removed.
//!
//! `100 Continue` is not forwarded: veloxy answers a client's `Expect: 100-continue` itself,
//! and drops the upstream's. `101 Switching Protocols` is the upgrade path's. Every other
//! 1xx (`103 Early Hints` above all) is forwarded to clients that can take one (HTTP/1.1, and
//! the framed codecs that can send an informational head); HTTP/1.0 clients get none (RFC
//! 9110 15.2: a server must not send a 1xx to an HTTP/1.0 client). Response-side rules
//! (`response_headers`) do not apply to them, and a cache fill never stores one.

use super::{classify, named_by_connection, Special};

/// A status forwarded to clients when an upstream sends it before its final response.
pub(crate) fn forwardable(status: u16) -> bool {
    (102..200).contains(&status)
}

/// The status of an interim head (`None`: not a forwardable one, or not a head).
pub(crate) fn status(head: &[u8]) -> Option<u16> {
    let mut stack = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
    let mut res = httparse::Response::new(&mut stack);
    match res.parse(head) {
        Ok(httparse::Status::Complete(_)) => res.code.filter(|&s| forwardable(s)),
        _ => None,
    }
}

/// Calls `field` with each end-to-end field of the complete interim head `head`: framing,
/// hop-by-hop fields and those its Connection names are left out. Returns the status, or
/// `None` when `head` is not a forwardable interim head.
pub(crate) fn fields(head: &[u8], mut field: impl FnMut(&str, &[u8])) -> Option<u16> {
    let mut stack = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
    let mut res = httparse::Response::new(&mut stack);
    if !matches!(res.parse(head), Ok(httparse::Status::Complete(_))) {
        return None;
    }
    let status = res.code.filter(|&s| forwardable(s))?;
    let mut connection: [&[u8]; 8] = [&[]; 8];
    let mut n = 0;
    for h in res.headers.iter() {
        if matches!(classify(h.name), Special::Connection) && n < connection.len() {
            connection[n] = h.value;
            n += 1;
        }
    }
    let connection = &connection[..n];
    for h in res.headers.iter() {
        match classify(h.name) {
            Special::HopByHop
            | Special::Connection
            | Special::TransferEncoding
            | Special::ContentLength => continue,
            _ if !connection.is_empty() && named_by_connection(connection, h.name) => continue,
            _ => field(h.name, h.value),
        }
    }
    Some(status)
}

/// The reason phrase veloxy writes for an interim status.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        102 => "Processing",
        103 => "Early Hints",
        _ => "Informational",
    }
}

/// Writes the interim head `head` (an upstream's) for an HTTP/1.1 client into `out`, blank
/// line included. Returns false (and writes nothing) when it is not one to forward.
pub(crate) fn write_h1(head: &[u8], out: &mut Vec<u8>) -> bool {
    let start = out.len();
    out.extend_from_slice(b"HTTP/1.1 000 ");
    let status = fields(head, |name, value| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    });
    let Some(status) = status else {
        out.truncate(start);
        return false;
    };
    let code = status.to_string();
    out[start + 9..start + 12].copy_from_slice(code.as_bytes());
    let reason = reason(status);
    out.splice(start + 13..start + 13, reason.bytes().chain(*b"\r\n"));
    out.extend_from_slice(b"\r\n");
    true
}

/// Writes `res` (an informational response) as an HTTP/1.1 head.
pub(crate) fn write_response(res: &http::Response<()>, out: &mut Vec<u8>) {
    let status = res.status().as_u16();
    out.extend_from_slice(format!("HTTP/1.1 {status} {}\r\n", reason(status)).as_bytes());
    for (name, value) in res.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The interim head `head` as an HTTP/2 or HTTP/3 informational response (fields a framed
/// protocol cannot carry dropped too). `None`: not one to forward.
pub(crate) fn to_response(head: &[u8]) -> Option<http::Response<()>> {
    let mut map = http::HeaderMap::new();
    let status = fields(head, |name, value| {
        let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) else {
            return;
        };
        if n != http::header::HOST {
            map.append(n, v);
        }
    })?;
    let mut res = http::Response::new(());
    *res.status_mut() = http::StatusCode::from_u16(status).ok()?;
    *res.headers_mut() = map;
    Some(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_early_hints_without_hop_by_hop_fields() {
        let head = b"HTTP/1.1 103 Whatever\r\nLink: </a.css>; rel=preload\r\n\
            Connection: x-drop\r\nX-Drop: 1\r\nKeep-Alive: 5\r\nContent-Length: 3\r\n\r\n";
        let mut out = b"before".to_vec();
        assert!(write_h1(head, &mut out));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "beforeHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        );
        let res = to_response(head).unwrap();
        assert_eq!(res.status(), 103);
        assert_eq!(res.headers().len(), 1);
    }

    #[test]
    fn continue_and_switch_are_not_forwarded() {
        let mut out = Vec::new();
        assert!(!write_h1(b"HTTP/1.1 100 Continue\r\n\r\n", &mut out));
        assert!(!write_h1(b"HTTP/1.1 101 Switching\r\n\r\n", &mut out));
        assert!(out.is_empty());
        assert_eq!(status(b"HTTP/1.1 102 Processing\r\n\r\n"), Some(102));
        assert_eq!(status(b"HTTP/1.1 100 Continue\r\n\r\n"), None);
    }
}
