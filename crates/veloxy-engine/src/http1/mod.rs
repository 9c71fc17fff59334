//! HTTP/1.x wire handling, hand-written on `httparse`.
//!
//! Why not hyper: a proxy's hot path wants to parse a request head in place, copy the headers it
//! keeps straight into the upstream write buffer and send head plus small body in one write,
//! with no header map, no per-request allocation and no body channels. It also needs exact
//! control over framing checks (request smuggling) and over which bytes are forwarded verbatim.
//! `httparse` does the tokenizing; this module does the semantics.

pub(crate) mod body;
pub mod chunked;
pub(crate) mod interim;
pub mod request;
pub mod response;

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    None,
    Length(u64),
    Chunked,
    /// Responses only: the body runs until the upstream closes.
    UntilClose,
}

/// Headers parsed into a stack array: a request with more is refused (431); an upstream
/// response with more is parsed again into a heap array (bounded by the head's byte limit).
pub const MAX_HEADERS: usize = 128;

/// Hop-by-hop headers (RFC 9110 section 7.6.1) plus the ones veloxy rewrites itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    /// Forward as is.
    None,
    /// Never forward.
    HopByHop,
    Connection,
    TransferEncoding,
    ContentLength,
    Host,
    Expect,
    XForwardedFor,
    /// X-Forwarded-Proto / X-Forwarded-Host: replaced by veloxy's own.
    XForwardedOther,
}

/// Classifies a header name; the length switch keeps the common case to one comparison.
pub(crate) fn classify(name: &str) -> Special {
    let eq = |s: &str| name.eq_ignore_ascii_case(s);
    match name.len() {
        2 if eq("te") => Special::HopByHop,
        4 if eq("host") => Special::Host,
        6 if eq("expect") => Special::Expect,
        7 if eq("trailer") || eq("upgrade") => Special::HopByHop,
        10 if eq("connection") => Special::Connection,
        10 if eq("keep-alive") => Special::HopByHop,
        14 if eq("content-length") => Special::ContentLength,
        15 if eq("x-forwarded-for") => Special::XForwardedFor,
        16 if eq("proxy-connection") => Special::HopByHop,
        16 if eq("x-forwarded-host") => Special::XForwardedOther,
        17 if eq("transfer-encoding") => Special::TransferEncoding,
        17 if eq("x-forwarded-proto") => Special::XForwardedOther,
        _ => Special::None,
    }
}

/// Writes the framing header of an upstream request head for `body`: its Content-Length, or
/// chunked Transfer-Encoding; nothing for a request without a body.
pub(crate) fn write_framing(body: BodyKind, out: &mut Vec<u8>) {
    match body {
        BodyKind::Length(n) => {
            out.extend_from_slice(b"Content-Length: ");
            out.extend_from_slice(itoa(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        BodyKind::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        BodyKind::None | BodyKind::UntilClose => {}
    }
}

/// Which of the client's fields a request's edit keeps from the upstream (those a route's
/// `request_headers` set or remove, the request ID's, forward_auth's copied fields):
/// `exchange::edit::UpstreamEdit` says. A trait, so the head writers here need nothing of
/// routes and rules.
pub(crate) trait DropsFields {
    /// The client's `name` fields are not forwarded.
    fn drops(&self, name: &str) -> bool;
}

/// Writes the X-Forwarded-* lines of an upstream HTTP/1 head: X-Forwarded-For with the
/// client's prior values (in order, empty ones dropped) then `client_ip`, X-Forwarded-Proto,
/// and X-Forwarded-Host when there is a `host`; a field the route's `request_headers` set or
/// remove is left to them. The one writer for every downstream protocol.
pub(crate) fn write_forwarded<'a, E: DropsFields>(
    out: &mut Vec<u8>,
    prior: impl Iterator<Item = &'a [u8]>,
    client_ip: &str,
    proto: &str,
    host: Option<&[u8]>,
    edit: Option<&E>,
) {
    let dropped = |name: &str| edit.is_some_and(|e| e.drops(name));
    if !dropped("x-forwarded-for") {
        out.extend_from_slice(b"X-Forwarded-For: ");
        for v in prior {
            let v = v.trim_ascii();
            if !v.is_empty() {
                out.extend_from_slice(v);
                out.extend_from_slice(b", ");
            }
        }
        out.extend_from_slice(client_ip.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !dropped("x-forwarded-proto") {
        out.extend_from_slice(b"X-Forwarded-Proto: ");
        out.extend_from_slice(proto.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(host) = host.filter(|_| !dropped("x-forwarded-host")) {
        out.extend_from_slice(b"X-Forwarded-Host: ");
        out.extend_from_slice(host);
        out.extend_from_slice(b"\r\n");
    }
}

/// The (name, value) pairs of "Name: value\r\n" lines.
pub(crate) fn lines(raw: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    raw.split(|&b| b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = memchr::memchr(b':', line)?;
        Some((&line[..colon], line[colon + 1..].trim_ascii()))
    })
}

/// The host of a Host header or `:authority`, without its port (`[::1]:8080` -> `[::1]`).
pub(crate) fn host_without_port(host: &[u8]) -> &[u8] {
    let end = if host.first() == Some(&b'[') {
        memchr::memchr(b']', host).map_or(host.len(), |i| i + 1)
    } else {
        memchr::memrchr(b':', host).unwrap_or(host.len())
    };
    &host[..end]
}

/// The value of cookie `name` among the values of a request's Cookie fields.
pub(crate) fn cookie_value<'a>(
    cookies: impl Iterator<Item = &'a [u8]>,
    name: &str,
) -> Option<&'a [u8]> {
    cookies
        .flat_map(|v| v.split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (&pair[..eq] == name.as_bytes()).then(|| &pair[eq + 1..])
        })
}

/// True when `value` (a Connection header) lists `token`, case-insensitively.
pub(crate) fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// True when header `name` is listed in any of the Connection header values.
pub(crate) fn named_by_connection(connection: &[&[u8]], name: &str) -> bool {
    connection.iter().any(|v| has_token(v, name))
}

/// Parses a Content-Length value: 1*DIGIT, nothing else.
pub(crate) fn parse_content_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Standard reason phrase for the statuses veloxy generates.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        412 => "Precondition Failed",
        414 => "URI Too Long",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        // Every other registered status by its name (401, 302, 307, ...); an unregistered one
        // with an empty phrase, which RFC 9112 allows.
        s => http::StatusCode::from_u16(s)
            .ok()
            .and_then(|c| c.canonical_reason())
            .unwrap_or(""),
    }
}

/// Writes a complete short plain-text response veloxy generates itself. For a HEAD request
/// (`head_only`) the body is left out and Content-Length still announces it.
pub fn write_error_response(
    out: &mut Vec<u8>,
    status: u16,
    message: &str,
    close: bool,
    head_only: bool,
) {
    let reason = reason(status);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa(status as u64).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(
        b"\r\nServer: veloxy\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ",
    );
    out.extend_from_slice(itoa((message.len() + 1) as u64).as_bytes());
    if status == 503 || status == 429 {
        out.extend_from_slice(b"\r\nRetry-After: 1");
    }
    if close {
        out.extend_from_slice(b"\r\nConnection: close");
    }
    out.extend_from_slice(b"\r\n\r\n");
    if !head_only {
        out.extend_from_slice(message.as_bytes());
        out.push(b'\n');
    }
}

/// Small allocation-free integer formatting into a stack buffer.
pub(crate) fn itoa(mut n: u64) -> Itoa {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    Itoa { buf, start: i }
}

pub(crate) struct Itoa {
    buf: [u8; 20],
    start: usize,
}

impl Itoa {
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_strict() {
        assert_eq!(parse_content_length(b"42"), Some(42));
        assert_eq!(parse_content_length(b" 0 "), Some(0));
        for bad in [
            &b""[..],
            b"+1",
            b"-1",
            b"1,1",
            b"0x10",
            b"1 2",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_content_length(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cookie_values() {
        let fields: [&[u8]; 2] = [b"a=1; session=abc", b"b=2;c=3"];
        assert_eq!(
            cookie_value(fields.into_iter(), "session"),
            Some(&b"abc"[..])
        );
        assert_eq!(cookie_value(fields.into_iter(), "c"), Some(&b"3"[..]));
        assert_eq!(cookie_value(fields.into_iter(), "sess"), None);
    }

    #[test]
    fn classify_names() {
        assert_eq!(classify("Transfer-Encoding"), Special::TransferEncoding);
        assert_eq!(classify("KEEP-ALIVE"), Special::HopByHop);
        assert_eq!(classify("x-custom"), Special::None);
        assert!(has_token(b"keep-alive, X-Foo", "x-foo"));
        assert!(!has_token(b"keep-alive", "close"));
        assert_eq!(itoa(0).as_bytes(), b"0");
        assert_eq!(itoa(1234567).as_bytes(), b"1234567");
    }
}
