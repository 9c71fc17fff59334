//! Request heads: parse, validate (framing, smuggling), and write the upstream copy.

use std::mem::MaybeUninit;

use httparse::{Header, Status};

use super::{classify, has_token, named_by_connection, parse_content_length, BodyKind, Special};
use crate::error::{ErrorKind, ProxyError};

/// Limits on a request head, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
}

/// A parsed, validated request head borrowing the read buffer.
#[derive(Debug)]
pub struct RequestView<'a> {
    pub method: &'a str,
    /// Origin-form path with query (absolute-form targets are reduced to this).
    pub path: &'a str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    pub headers: &'a [Header<'a>],
    /// The effective host: the absolute-form authority if any, else the Host header.
    pub host: Option<&'a [u8]>,
    /// True when `host` came from an absolute-form target and replaces the Host header.
    host_from_target: bool,
    connection: [&'a [u8]; 8],
    connection_len: usize,
    /// Bytes of the head, including the final CRLF.
    pub head_len: usize,
    pub body: BodyKind,
    /// The client wants the connection kept open after this exchange.
    pub keep_alive: bool,
    pub expect_continue: bool,
    /// An HTTP/1.1 protocol upgrade (WebSocket): `Connection: upgrade` with an `Upgrade`
    /// header, on a request without a body. Forwarded with both headers; a 101 answer turns
    /// the connection into a tunnel.
    pub upgrade: Option<&'a [u8]>,
}

impl RequestView<'_> {
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }

    /// Methods RFC 9110 calls idempotent: safe to send twice (see [`idempotent_method`]).
    pub fn is_idempotent(&self) -> bool {
        idempotent_method(self.method)
    }

    /// The first value of header `name`, case-insensitively.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    fn connection_values(&self) -> &[&[u8]] {
        &self.connection[..self.connection_len]
    }
}

/// Whether a method is idempotent (RFC 9110 section 9.2.2), so a request with it may be sent
/// again after a failure: GET, HEAD, OPTIONS, TRACE, PUT, DELETE, and QUERY
/// (draft-ietf-httpbis-safe-method-w-body: safe and idempotent, with a body). Every client
/// protocol and the FastCGI client decide retries with this one list.
pub fn idempotent_method(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE" | "QUERY"
    )
}

fn bad(msg: &'static str) -> ProxyError {
    ProxyError::downstream(ErrorKind::BadRequest(msg))
}

/// Parses the head at the start of `buf`. `Ok(None)`: incomplete, read more (the caller enforces
/// the size limit with [`check_partial`]).
pub fn parse<'a>(
    buf: &'a [u8],
    headers: &'a mut [MaybeUninit<Header<'a>>],
    limits: &Limits,
) -> Result<Option<RequestView<'a>>, ProxyError> {
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, headers) {
        Ok(Status::Complete(n)) => n,
        Ok(Status::Partial) => return Ok(None),
        Err(e) => return Err(head_error(e)),
    };
    if head_len > limits.max_header_bytes {
        return Err(ProxyError::downstream(ErrorKind::HeadTooLarge));
    }
    reject_bare_lf(&buf[..head_len])?;
    let method = req.method.unwrap_or("");
    let target = req.path.unwrap_or("");
    let version = req.version.unwrap_or(1);
    if target.len() > limits.max_uri_bytes {
        return Err(ProxyError::downstream(ErrorKind::UriTooLong));
    }
    if method == "CONNECT" {
        return Err(ProxyError::downstream(ErrorKind::Rejected(501)));
    }
    let headers: &'a [Header<'a>] = req.headers;

    let mut fields = Fields::new();
    for h in headers {
        fields.take(h, version)?;
    }
    fields.check(version)?;

    // Absolute-form (`GET http://host/path`): its authority replaces the Host header.
    let (path, authority) = resolve_target(target, method)?;
    let host_from_target = authority.is_some();
    let host = authority.or(fields.host);

    let conn_values = &fields.connection[..fields.connection_len];
    let keep_alive = wants_keep_alive(version, conn_values);
    let body = body_kind(fields.chunked, fields.content_length);
    let upgrade = upgrade_protocol(version, body, conn_values, headers);
    Ok(Some(RequestView {
        method,
        path,
        version,
        headers,
        host,
        host_from_target,
        connection: fields.connection,
        connection_len: fields.connection_len,
        head_len,
        body,
        keep_alive,
        expect_continue: fields.expect_continue && body != BodyKind::None,
        upgrade,
    }))
}

/// The answer to a head httparse refused.
#[inline]
fn head_error(e: httparse::Error) -> ProxyError {
    match e {
        httparse::Error::TooManyHeaders => ProxyError::downstream(ErrorKind::HeadTooLarge),
        httparse::Error::Version => bad("unsupported HTTP version"),
        _ => bad("invalid request head"),
    }
}

/// httparse accepts a bare LF as a line end; RFC 9112 allows rejecting it, and a proxy must:
/// a front end and a back end that disagree on line ends is a request smuggling vector.
#[inline]
fn reject_bare_lf(head: &[u8]) -> Result<(), ProxyError> {
    for i in memchr::memchr_iter(b'\n', head) {
        if i == 0 || head[i - 1] != b'\r' {
            return Err(bad("bare LF in request head"));
        }
    }
    Ok(())
}

/// What the header lines of a request say about its framing, host and connection.
struct Fields<'a> {
    content_length: Option<u64>,
    chunked: bool,
    host: Option<&'a [u8]>,
    connection: [&'a [u8]; 8],
    connection_len: usize,
    expect_continue: bool,
}

impl<'a> Fields<'a> {
    #[inline]
    fn new() -> Self {
        Fields {
            content_length: None,
            chunked: false,
            host: None,
            connection: [&[]; 8],
            connection_len: 0,
            expect_continue: false,
        }
    }

    /// Takes in one header line, refusing a duplicate or conflicting one.
    #[inline]
    fn take(&mut self, h: &Header<'a>, version: u8) -> Result<(), ProxyError> {
        match classify(h.name) {
            Special::ContentLength => {
                let n =
                    parse_content_length(h.value).ok_or_else(|| bad("invalid Content-Length"))?;
                if self.content_length.is_some_and(|prev| prev != n) {
                    return Err(bad("conflicting Content-Length headers"));
                }
                self.content_length = Some(n);
            }
            Special::TransferEncoding => {
                // Only a single, final `chunked` coding is accepted: anything else is either
                // unsupported or an attempt to make two parsers disagree on the body's end.
                if self.chunked || !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(bad("unsupported Transfer-Encoding"));
                }
                self.chunked = true;
            }
            Special::Host => {
                if self.host.is_some() {
                    return Err(bad("duplicate Host header"));
                }
                self.host = Some(h.value);
            }
            Special::Connection => {
                if self.connection_len == self.connection.len() {
                    return Err(bad("too many Connection headers"));
                }
                self.connection[self.connection_len] = h.value;
                self.connection_len += 1;
            }
            Special::Expect => {
                if h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue") {
                    self.expect_continue = version == 1;
                } else {
                    return Err(ProxyError::downstream(ErrorKind::Rejected(417)));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Checks the header lines together, once all are in.
    #[inline]
    fn check(&self, version: u8) -> Result<(), ProxyError> {
        if self.chunked && self.content_length.is_some() {
            return Err(bad("both Content-Length and Transfer-Encoding"));
        }
        if self.chunked && version == 0 {
            return Err(bad("Transfer-Encoding in an HTTP/1.0 request"));
        }
        if version == 1 && self.host.is_none() {
            return Err(bad("missing Host header"));
        }
        if self.host.is_some_and(|h| !valid_authority(h)) {
            return Err(bad("invalid Host header"));
        }
        Ok(())
    }
}

/// The origin-form path of a request target, and the authority of an absolute-form one.
#[inline]
fn resolve_target<'a>(
    target: &'a str,
    method: &str,
) -> Result<(&'a str, Option<&'a [u8]>), ProxyError> {
    match split_absolute(target) {
        Some((authority, _)) if !valid_authority(authority.as_bytes()) => {
            Err(bad("invalid request target"))
        }
        Some((authority, path)) => Ok((path, Some(authority.as_bytes()))),
        None if target.starts_with('/') || (target == "*" && method == "OPTIONS") => {
            Ok((target, None))
        }
        None => Err(bad("invalid request target")),
    }
}

/// Whether the client wants the connection kept open, by its version and Connection values.
#[inline]
fn wants_keep_alive(version: u8, conn_values: &[&[u8]]) -> bool {
    if version == 1 {
        !conn_values.iter().any(|v| has_token(v, "close"))
    } else {
        conn_values.iter().any(|v| has_token(v, "keep-alive"))
    }
}

#[inline]
fn body_kind(chunked: bool, content_length: Option<u64>) -> BodyKind {
    if chunked {
        BodyKind::Chunked
    } else {
        match content_length {
            Some(0) | None => BodyKind::None,
            Some(n) => BodyKind::Length(n),
        }
    }
}

/// The protocol an HTTP/1.1 request without a body asks to upgrade to, if any.
#[inline]
fn upgrade_protocol<'a>(
    version: u8,
    body: BodyKind,
    conn_values: &[&[u8]],
    headers: &'a [Header<'a>],
) -> Option<&'a [u8]> {
    if version == 1 && body == BodyKind::None && conn_values.iter().any(|v| has_token(v, "upgrade"))
    {
        headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("upgrade"))
            .map(|h| h.value)
            .filter(|v| !v.is_empty())
    } else {
        None
    }
}

/// For an incomplete head: `Err` once it can no longer fit the limits.
pub fn check_partial(buf: &[u8], limits: &Limits) -> Result<(), ProxyError> {
    let line_end = memchr::memchr(b'\n', buf);
    if line_end.map_or(buf.len(), |i| i) > limits.max_uri_bytes + 64 {
        return Err(ProxyError::downstream(ErrorKind::UriTooLong));
    }
    if buf.len() >= limits.max_header_bytes {
        return Err(ProxyError::downstream(ErrorKind::HeadTooLarge));
    }
    Ok(())
}

/// A Host value or absolute-form authority: `host[:port]`, nothing that could smuggle a path,
/// userinfo or whitespace to the upstream, or vary what an upstream sees beyond the cache key.
/// The host is a name of letters, digits, `-`, `.`, `_` and `~` (percent-encoding and RFC
/// 3986's sub-delims have no place in a DNS name, and quotes in a Host are an attack) or a
/// bracketed IPv6 literal; the port, if any, is digits only (at most 5: as nginx, 400 for
/// `site:'x'`). An empty port (`site:`) is allowed, as RFC 3986 allows it.
pub(crate) fn valid_authority(h: &[u8]) -> bool {
    if h.is_empty() || h.len() > 255 {
        return false;
    }
    let (host, port) = if h[0] == b'[' {
        let Some(end) = memchr::memchr(b']', h) else {
            return false;
        };
        let literal = &h[1..end];
        if literal.is_empty()
            || !literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        match &h[end + 1..] {
            [] => return true,
            [b':', port @ ..] => (&h[..=end], port),
            _ => return false,
        }
    } else {
        match memchr::memchr(b':', h) {
            Some(i) => (&h[..i], &h[i + 1..]),
            None => (h, &b""[..]),
        }
    };
    let name_ok = host[0] == b'['
        || (!host.is_empty()
            && host
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"-._~".contains(&b)));
    name_ok && port.len() <= 5 && port.iter().all(u8::is_ascii_digit)
}

fn split_absolute(target: &str) -> Option<(&str, &str)> {
    let rest = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))?;
    let slash = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(slash);
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some((authority, if path.is_empty() { "/" } else { path }))
}

/// What veloxy adds about the client (the `X-Forwarded-*` family), and which of the client's
/// headers it keeps.
pub struct Forwarded<'a, E> {
    /// The client's IP address, formatted.
    pub client_ip: &'a str,
    /// `http` or `https`.
    pub proto: &'a str,
    /// Keep headers whose names contain `_` (`[server] underscores_in_headers`).
    pub keep_underscores: bool,
    /// The request target to send instead of the client's (a route's `rewrite`).
    pub target: Option<&'a str>,
    /// The route's `request_headers` and the request ID: the fields it drops are left out
    /// (its own lines are added by the caller).
    pub edit: Option<&'a E>,
}

/// Writes the upstream request head into `out`, without the final blank line (the caller may
/// still add headers). Hop-by-hop headers and the ones named by Connection are dropped, so are
/// names with `_` unless `fwd.keep_underscores`; Host is kept, framing is normalized, and
/// X-Forwarded-For/-Proto/-Host are set.
pub fn write_upstream_head<E: super::DropsFields>(
    req: &RequestView,
    fwd: &Forwarded<'_, E>,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(req.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(fwd.target.unwrap_or(req.path).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if req.host_from_target && !fwd.edit.is_some_and(|e| e.drops("host")) {
        if let Some(h) = req.host {
            out.extend_from_slice(b"Host: ");
            out.extend_from_slice(h);
            out.extend_from_slice(b"\r\n");
        }
    }
    let conn = req.connection_values();
    let mut xff_seen = false;
    let dropped = |name: &str| fwd.edit.is_some_and(|e| e.drops(name));
    for h in req.headers {
        if dropped(h.name) {
            continue;
        }
        match classify(h.name) {
            Special::None => {
                if !conn.is_empty() && named_by_connection(conn, h.name) {
                    continue;
                }
                // CGI-style backends read `X_User` and `X-User` as one variable: a client
                // could pass off the one a front end did not check or set.
                if !fwd.keep_underscores && h.name.as_bytes().contains(&b'_') {
                    continue;
                }
            }
            Special::Host if !req.host_from_target => {}
            Special::XForwardedFor => {
                // Appended below, all values joined in order.
                xff_seen = true;
                continue;
            }
            _ => continue,
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    super::write_framing(req.body, out);
    let prior = req
        .headers
        .iter()
        .filter(|h| xff_seen && classify(h.name) == Special::XForwardedFor)
        .map(|h| h.value);
    super::write_forwarded(out, prior, fwd.client_ip, fwd.proto, req.host, fwd.edit);
    if let Some(u) = req.upgrade {
        out.extend_from_slice(b"Connection: Upgrade\r\nUpgrade: ");
        out.extend_from_slice(u);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes the trailer section of a chunked request body (its field lines and the final CRLF,
/// as the scanner validated them) into `out` without the fields an upstream could take for
/// framing or routing, or for veloxy's own: every name [`classify`] knows (Content-Length,
/// Transfer-Encoding, Host, Connection and the other hop-by-hop names, Expect,
/// X-Forwarded-*), and lines that are not `name: value` (a continuation line would extend the
/// field before it). Returns whether anything was dropped.
pub(crate) fn filter_trailer_section(section: &[u8], out: &mut Vec<u8>) -> bool {
    let mut dropped = false;
    let mut rest = section;
    while let Some(end) = memchr::memmem::find(rest, b"\r\n") {
        let (line, next) = (&rest[..end + 2], &rest[end + 2..]);
        rest = next;
        if end == 0 {
            out.extend_from_slice(line);
            continue;
        }
        let name = line[..end].split(|&b| b == b':').next().unwrap_or(b"");
        let forwarded = line[..end].contains(&b':')
            && !name.is_empty()
            && name.iter().all(|&b| is_tchar(b))
            && std::str::from_utf8(name).is_ok_and(|n| classify(n) == Special::None);
        if forwarded {
            out.extend_from_slice(line);
        } else {
            dropped = true;
        }
    }
    dropped
}

/// A token character (RFC 9110 5.6.2): what a field name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct KeepAll;
    impl crate::http1::DropsFields for KeepAll {
        fn drops(&self, _: &str) -> bool {
            false
        }
    }
    const NO_EDIT: Option<&KeepAll> = None;

    const LIMITS: Limits = Limits {
        max_header_bytes: 8192,
        max_uri_bytes: 1024,
    };

    fn check(raw: &[u8]) -> Result<Option<(BodyKind, bool)>, u16> {
        let mut headers = [MaybeUninit::uninit(); 64];
        match parse(raw, &mut headers, &LIMITS) {
            Ok(Some(v)) => Ok(Some((v.body, v.keep_alive))),
            Ok(None) => Ok(None),
            Err(e) => Err(e.status()),
        }
    }

    #[test]
    fn framing() {
        assert_eq!(
            check(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(Some((BodyKind::None, true)))
        );
        assert_eq!(
            check(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
            Ok(Some((BodyKind::Length(5), true)))
        );
        assert_eq!(
            check(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"),
            Ok(Some((BodyKind::Chunked, false)))
        );
        assert_eq!(
            check(b"GET / HTTP/1.0\r\n\r\n"),
            Ok(Some((BodyKind::None, false)))
        );
        assert_eq!(check(b"GET / HTTP/1.1\r\nHost: a\r\n"), Ok(None));
    }

    #[test]
    fn smuggling_rejected() {
        for raw in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
            b"GET / HTTP/1.1\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n z\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: a/b@c\r\n\r\n",
            b"GET http://evil/x HTTP/1.1\r\nHost: a b\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert_eq!(check(raw), Err(400), "accepted {:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn upstream_head_drops_hop_by_hop() {
        let raw = b"GET /x?y HTTP/1.1\r\nHost: h.test\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nUpgrade: foo\r\nProxy-Connection: x\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-Proto: evil\r\nAccept: */*\r\n\r\n";
        let mut headers = [MaybeUninit::uninit(); 64];
        let v = parse(raw, &mut headers, &LIMITS).unwrap().unwrap();
        let mut out = Vec::new();
        write_upstream_head(
            &v,
            &Forwarded {
                client_ip: "10.0.0.9",
                proto: "http",
                keep_underscores: false,
                target: None,
                edit: NO_EDIT,
            },
            &mut out,
        );
        let s = String::from_utf8(out).unwrap();
        assert_eq!(
            s,
            "GET /x?y HTTP/1.1\r\nHost: h.test\r\nAccept: */*\r\nX-Forwarded-For: 1.2.3.4, 10.0.0.9\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: h.test\r\n"
        );
    }

    #[test]
    fn underscored_names_are_dropped_unless_kept() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nX_User: root\r\nX-User: bob\r\n_: 1\r\n\r\n";
        let mut headers = [MaybeUninit::uninit(); 64];
        let v = parse(raw, &mut headers, &LIMITS).unwrap().unwrap();
        for keep in [false, true] {
            let mut out = Vec::new();
            let fwd = Forwarded {
                client_ip: "10.0.0.9",
                proto: "http",
                keep_underscores: keep,
                target: None,
                edit: NO_EDIT,
            };
            write_upstream_head(&v, &fwd, &mut out);
            let s = String::from_utf8(out).unwrap();
            assert!(s.contains("\r\nX-User: bob\r\n"), "{s}");
            assert_eq!(s.contains("X_User: root"), keep, "{s}");
            assert_eq!(s.contains("\r\n_: 1\r\n"), keep, "{s}");
        }
    }

    #[test]
    fn trailer_fields_for_framing_and_routing_are_dropped() {
        let section = b"Content-Length: 5\r\nX-Sum: 42\r\ntransfer-encoding: chunked\r\nHost: evil\r\nConnection: close\r\nTE: x\r\nTrailer: x\r\nUpgrade: x\r\nX-Forwarded-For: 1.1.1.1\r\n folded\r\nno colon\r\nBad Name: 1\r\nX-B:2\r\n\r\n";
        let mut out = Vec::new();
        assert!(filter_trailer_section(section, &mut out));
        assert_eq!(out, b"X-Sum: 42\r\nX-B:2\r\n\r\n");
        let clean = b"X-Sum: 42\r\n\r\n";
        out.clear();
        assert!(!filter_trailer_section(clean, &mut out));
        assert_eq!(out, clean);
        out.clear();
        assert!(!filter_trailer_section(b"\r\n", &mut out));
        assert_eq!(out, b"\r\n");
    }

    #[test]
    fn absolute_form() {
        let raw = b"GET http://a.test:8080/p?q HTTP/1.1\r\nHost: ignored\r\n\r\n";
        let mut headers = [MaybeUninit::uninit(); 64];
        let v = parse(raw, &mut headers, &LIMITS).unwrap().unwrap();
        assert_eq!(v.path, "/p?q");
        assert_eq!(v.host, Some(&b"a.test:8080"[..]));
    }

    #[test]
    fn limits() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(2000));
        assert_eq!(check(long.as_bytes()), Err(414));
        assert_eq!(
            check_partial(&vec![b'a'; 2000], &LIMITS)
                .unwrap_err()
                .status(),
            414
        );
        let many = format!("GET / HTTP/1.1\r\nHost: a\r\n{}", "X-A: b\r\n".repeat(2000));
        assert_eq!(
            check_partial(many.as_bytes(), &LIMITS)
                .unwrap_err()
                .status(),
            431
        );
    }
}
