//! Upstream response heads: parse, validate framing, and write the downstream copy.

use httparse::Status;

use super::{
    classify, has_token, itoa, named_by_connection, parse_content_length, BodyKind, Special,
};
use crate::error::{ErrorKind, ProxyError};

/// What the proxy needs to know about a response once its head is written downstream.
#[derive(Debug, Clone, Copy)]
pub struct ResponseMeta {
    pub status: u16,
    pub head_len: usize,
    pub body: BodyKind,
    /// The upstream connection may be reused after this body (if it is fully read).
    pub upstream_reusable: bool,
    /// The downstream connection stays open after this response.
    pub downstream_keep_alive: bool,
    /// Chunked upstream body sent to an HTTP/1.0 client: forward payload only, then close.
    pub decode_chunked: bool,
}

/// Parse result for one upstream head.
pub enum Parsed {
    /// Need more bytes.
    Partial,
    /// A 1xx interim response of this many bytes: skip it and read on.
    Interim(usize),
    /// A final response; its downstream head (without the final blank line) is in `out`.
    Final(ResponseMeta),
    /// `101 Switching Protocols` to an upgrade request: the complete downstream head is in
    /// `out`; the connection becomes a tunnel after `head_len` bytes.
    Switch { head_len: usize },
}

/// Largest upstream response head accepted (HTTP/1 and HTTP/2 clients alike); larger is 502.
pub(crate) const MAX_RESPONSE_HEAD: usize = 64 * 1024;

fn bad(msg: &'static str) -> ProxyError {
    ProxyError::upstream(ErrorKind::BadResponse(msg))
}

/// The framing of a response head: what its headers say about the body and the connection.
struct Framing<'a> {
    content_length: Option<u64>,
    /// Transfer-Encoding is present; [`check_codings`] made sure it ends in `chunked`.
    transfer_encoding: bool,
    te_value: &'a [u8],
    connection: [&'a [u8]; 8],
    connection_len: usize,
    /// A Content-Length beside Transfer-Encoding was dropped (see [`Framing::scan`]): the
    /// connection is not reused.
    length_dropped: bool,
}

/// Checks a response's Transfer-Encoding list: it must end in `chunked` (chunked framing).
///
/// A list whose last coding is not `chunked` (`gzip`, `identity`, `chunked, gzip`) makes the
/// body close-delimited and coded in a way veloxy would have to undo: it sends no `TE` upstream,
/// so the backend was never offered such a coding, HTTP/2 cannot carry it, and stripping the
/// header would hand clients coded bytes as if they were the content. Such responses are
/// refused (502) on every path, as nginx does. `chunked` twice is refused too (RFC 9112 6.1:
/// it is applied at most once).
fn check_codings(value: &[u8]) -> Result<(), ProxyError> {
    let mut codings = value.rsplit(|&b| b == b',').map(<[u8]>::trim_ascii);
    let last_is_chunked = codings
        .next()
        .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
    if !last_is_chunked {
        return Err(bad("transfer-coding other than chunked"));
    }
    if codings.any(|c| c.eq_ignore_ascii_case(b"chunked")) {
        return Err(bad("chunked transfer-coding applied twice"));
    }
    Ok(())
}

impl<'a> Framing<'a> {
    /// Reads the framing headers, refusing conflicting or invalid ones. With `te_over_cl`
    /// (a reader that takes the whole body and then drops the connection: the cache fill), a
    /// Content-Length beside a chunked Transfer-Encoding is dropped instead, as RFC 9112 6.3
    /// lets an intermediary do: Transfer-Encoding frames the body.
    fn scan(headers: &[httparse::Header<'a>], te_over_cl: bool) -> Result<Self, ProxyError> {
        let mut f = Framing {
            content_length: None,
            transfer_encoding: false,
            te_value: b"",
            connection: [&[]; 8],
            connection_len: 0,
            length_dropped: false,
        };
        for h in headers {
            match classify(h.name) {
                Special::ContentLength => {
                    let n = parse_content_length(h.value)
                        .ok_or_else(|| bad("invalid Content-Length"))?;
                    if f.content_length.is_some_and(|p| p != n) {
                        return Err(bad("conflicting Content-Length"));
                    }
                    f.content_length = Some(n);
                }
                Special::TransferEncoding => {
                    if f.transfer_encoding {
                        return Err(bad("multiple Transfer-Encoding headers"));
                    }
                    f.transfer_encoding = true;
                    f.te_value = h.value.trim_ascii();
                    check_codings(f.te_value)?;
                }
                Special::Connection if f.connection_len < f.connection.len() => {
                    f.connection[f.connection_len] = h.value;
                    f.connection_len += 1;
                }
                _ => {}
            }
        }
        if f.transfer_encoding && f.content_length.is_some() {
            if !te_over_cl {
                return Err(bad("both Content-Length and Transfer-Encoding"));
            }
            f.content_length = None;
            f.length_dropped = true;
        }
        Ok(f)
    }

    fn connection(&self) -> &[&'a [u8]] {
        &self.connection[..self.connection_len]
    }

    /// The body's framing for `status` (HEAD, 204 and 304 have none).
    fn body(&self, request_is_head: bool, status: u16) -> BodyKind {
        if request_is_head || status == 204 || status == 304 {
            BodyKind::None
        } else if self.transfer_encoding {
            BodyKind::Chunked
        } else {
            match self.content_length {
                Some(n) => BodyKind::Length(n),
                None => BodyKind::UntilClose,
            }
        }
    }

    /// The upstream connection can carry another request after this body.
    fn reusable(&self, body: BodyKind, version: u8) -> bool {
        body != BodyKind::UntilClose
            && !self.length_dropped
            && if version == 1 {
                !self.connection().iter().any(|v| has_token(v, "close"))
            } else {
                self.connection().iter().any(|v| has_token(v, "keep-alive"))
            }
    }
}

/// Parses the response head at the start of `buf` and writes the downstream head into `out`
/// (the upgrade-aware [`parse_and_write_upgrade`] is what the proxy calls).
#[cfg(test)]
pub fn parse_and_write(
    buf: &[u8],
    request_is_head: bool,
    client_version: u8,
    client_keep_alive: bool,
    out: &mut Vec<u8>,
) -> Result<Parsed, ProxyError> {
    parse_and_write_upgrade(
        buf,
        request_is_head,
        client_version,
        client_keep_alive,
        false,
        out,
    )
}

/// [`parse_and_write`] for a request that asked for an upgrade (`upgrade`): a 101 is then the
/// switch, with its Upgrade and Connection headers kept.
pub fn parse_and_write_upgrade(
    buf: &[u8],
    request_is_head: bool,
    client_version: u8,
    client_keep_alive: bool,
    upgrade: bool,
    out: &mut Vec<u8>,
) -> Result<Parsed, ProxyError> {
    let client = Client {
        request_is_head,
        version: client_version,
        keep_alive: client_keep_alive,
        upgrade,
    };
    let parsed = with_head(buf, |res, head_len| write_head(res, head_len, client, out))?;
    Ok(parsed.unwrap_or(Parsed::Partial))
}

/// The downstream side of an exchange, as far as the response head is concerned.
#[derive(Clone, Copy)]
struct Client {
    request_is_head: bool,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    version: u8,
    keep_alive: bool,
    /// The request asked for a protocol upgrade.
    upgrade: bool,
}

/// Parses the response head at the start of `buf` and hands it, with its length, to `f`.
/// `Ok(None)`: the head is not complete yet.
///
/// The headers go in a stack array of [`MAX_HEADERS`](super::MAX_HEADERS); a head with more
/// (sites send Set-Cookie by the hundred) is parsed again into a heap array with room for one
/// header per line of the head, so only [`MAX_RESPONSE_HEAD`] bounds the number of headers.
fn with_head<'b, R>(
    buf: &'b [u8],
    f: impl FnOnce(&httparse::Response<'_, 'b>, usize) -> Result<R, ProxyError>,
) -> Result<Option<R>, ProxyError> {
    let mut stack = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
    let mut res = httparse::Response::new(&mut stack);
    match res.parse(buf) {
        Ok(Status::Complete(n)) => return f(&res, n).map(Some),
        Ok(Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {}
        Err(_) => return Err(bad("malformed response head")),
    }
    // Every header takes a line of at least 3 bytes (`a:` and LF): the count of line ends
    // within the largest head accepted is enough, and bounded.
    let window = &buf[..buf.len().min(MAX_RESPONSE_HEAD)];
    let lines = memchr::memchr_iter(b'\n', window).count();
    let mut heap = vec![httparse::EMPTY_HEADER; lines.min(MAX_RESPONSE_HEAD / 3)];
    let mut res = httparse::Response::new(&mut heap);
    match res.parse(buf) {
        Ok(Status::Complete(n)) => f(&res, n).map(Some),
        Ok(Status::Partial) => Ok(None),
        // Only a head longer than the window can have more headers than lines in it.
        Err(httparse::Error::TooManyHeaders) => Err(bad("response head too large")),
        Err(_) => Err(bad("malformed response head")),
    }
}

/// Writes the downstream head for a parsed upstream head (see [`parse_and_write_upgrade`]).
fn write_head(
    res: &httparse::Response<'_, '_>,
    head_len: usize,
    client: Client,
    out: &mut Vec<u8>,
) -> Result<Parsed, ProxyError> {
    let Client {
        request_is_head,
        version: client_version,
        keep_alive: client_keep_alive,
        upgrade,
    } = client;
    let status = res.code.unwrap_or(0);
    if (100..200).contains(&status) {
        if status == 101 {
            if !upgrade {
                return Err(bad("unexpected protocol switch"));
            }
            out.extend_from_slice(b"HTTP/1.1 101 ");
            out.extend_from_slice(res.reason.unwrap_or("Switching Protocols").as_bytes());
            out.extend_from_slice(b"\r\n");
            for h in res.headers.iter() {
                out.extend_from_slice(h.name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(h.value);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
            return Ok(Parsed::Switch { head_len });
        }
        return Ok(Parsed::Interim(head_len));
    }
    if !(200..1000).contains(&status) {
        return Err(bad("invalid status code"));
    }
    let version = res.version.unwrap_or(1);
    let framing = Framing::scan(res.headers, false)?;
    let (transfer_encoding, te_value) = (framing.transfer_encoding, framing.te_value);
    // Codings before the final chunked (`gzip, chunked`) are the client's to decode: forwarded
    // verbatim to HTTP/1.1 clients; an HTTP/1.0 client cannot receive a transfer-coding at all.
    let other_codings = transfer_encoding && !te_value.eq_ignore_ascii_case(b"chunked");
    if other_codings && client_version == 0 {
        return Err(bad("transfer-coding an HTTP/1.0 client cannot decode"));
    }
    let conn = framing.connection();
    let body = framing.body(request_is_head, status);
    let upstream_reusable = framing.reusable(body, version);
    let decode_chunked = body == BodyKind::Chunked && client_version == 0;
    let downstream_keep_alive =
        client_keep_alive && body != BodyKind::UntilClose && !decode_chunked;

    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa(u64::from(status)).as_bytes());
    out.push(b' ');
    out.extend_from_slice(res.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in res.headers.iter() {
        match classify(h.name) {
            Special::HopByHop | Special::Connection | Special::TransferEncoding => continue,
            Special::None if !conn.is_empty() && named_by_connection(conn, h.name) => continue,
            _ => {}
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if transfer_encoding && !decode_chunked && client_version == 1 {
        out.extend_from_slice(b"Transfer-Encoding: ");
        out.extend_from_slice(te_value);
        out.extend_from_slice(b"\r\n");
    }
    if !downstream_keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if client_version == 0 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    Ok(Parsed::Final(ResponseMeta {
        status,
        head_len,
        body,
        upstream_reusable,
        downstream_keep_alive,
        decode_chunked,
    }))
}

/// An upstream HTTP/1 response head translated for an HTTP/2 client.
pub(crate) struct ForeignHead {
    pub status: u16,
    pub head_len: usize,
    pub headers: http::HeaderMap,
    pub body: BodyKind,
    pub upstream_reusable: bool,
}

/// Parses the response head at the start of `buf` for a client that does not speak HTTP/1
/// (HTTP/2): framing and hop-by-hop headers are dropped, the body framing is returned.
/// `Ok(None)`: need more bytes. `Err` as for [`parse_and_write`]. Interim (1xx) heads come
/// back as `Parsed::Interim` through the `Err(Ok(len))` arm.
///
/// `te_over_cl`: see [`Framing::scan`] (the cache fill).
pub(crate) fn parse_foreign(
    buf: &[u8],
    request_is_head: bool,
    te_over_cl: bool,
) -> Result<Option<Result<ForeignHead, usize>>, ProxyError> {
    with_head(buf, |res, head_len| {
        foreign_head(buf, res, head_len, (request_is_head, te_over_cl))
    })
}

/// [`parse_foreign`] for a parsed head: `Err(len)` for an interim (1xx) head.
///
/// Header values are slices of one copy of the head rather than one allocation each: a
/// proxied response's head is then two allocations (the copy and the map) plus one per
/// name `http` does not know.
fn foreign_head(
    buf: &[u8],
    res: &httparse::Response<'_, '_>,
    head_len: usize,
    (request_is_head, te_over_cl): (bool, bool),
) -> Result<Result<ForeignHead, usize>, ProxyError> {
    let status = res.code.unwrap_or(0);
    if (100..200).contains(&status) {
        if status == 101 {
            return Err(bad("unexpected protocol switch"));
        }
        return Ok(Err(head_len));
    }
    if !(200..1000).contains(&status) {
        return Err(bad("invalid status code"));
    }
    let version = res.version.unwrap_or(1);
    let framing = Framing::scan(res.headers, te_over_cl)?;
    if framing.transfer_encoding && !framing.te_value.eq_ignore_ascii_case(b"chunked") {
        // `gzip, chunked`: the payload is still gzip-coded and HTTP/2 has no way to say so.
        return Err(bad("transfer-coding an HTTP/2 client cannot decode"));
    }
    let conn = framing.connection();
    let body = framing.body(request_is_head, status);
    let upstream_reusable = framing.reusable(body, version);
    let mut map = http::HeaderMap::with_capacity(res.headers.len());
    let copy = bytes::Bytes::copy_from_slice(&buf[..head_len]);
    for h in res.headers.iter() {
        match classify(h.name) {
            Special::HopByHop | Special::Connection | Special::TransferEncoding => continue,
            Special::None if !conn.is_empty() && named_by_connection(conn, h.name) => continue,
            _ => {}
        }
        // httparse's values borrow from `buf`: the same range of the copy.
        let at = h.value.as_ptr() as usize - buf.as_ptr() as usize;
        let value = copy.slice(at..at + h.value.len());
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(h.name.as_bytes()),
            http::HeaderValue::from_maybe_shared(value),
        ) else {
            return Err(bad("invalid header"));
        };
        map.append(name, value);
    }
    Ok(Ok(ForeignHead {
        status,
        head_len,
        headers: map,
        body,
        upstream_reusable,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(raw: &[u8], head: bool, v: u8) -> (ResponseMeta, String) {
        let mut out = Vec::new();
        match parse_and_write(raw, head, v, true, &mut out).unwrap() {
            Parsed::Final(m) => (m, String::from_utf8(out).unwrap()),
            _ => panic!("not final"),
        }
    }

    #[test]
    fn framing_and_rewrite() {
        let (m, s) = run(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nKeep-Alive: timeout=5\r\n\r\nabc",
            false,
            1,
        );
        assert_eq!(m.body, BodyKind::Length(3));
        assert!(m.upstream_reusable && m.downstream_keep_alive);
        assert_eq!(s, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n");

        let (m, s) = run(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
            0,
        );
        assert!(m.decode_chunked && !m.downstream_keep_alive);
        assert_eq!(s, "HTTP/1.1 200 OK\r\nConnection: close\r\n");

        let (m, _) = run(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
            false,
            1,
        );
        assert_eq!(m.body, BodyKind::None);
        let (m, _) = run(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true, 1);
        assert_eq!(m.body, BodyKind::None);
        let (m, _) = run(b"HTTP/1.0 200 OK\r\n\r\n", false, 1);
        assert_eq!(m.body, BodyKind::UntilClose);
        assert!(!m.upstream_reusable && !m.downstream_keep_alive);
    }

    #[test]
    fn codings_before_chunked_pass_through_verbatim() {
        let (m, s) = run(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            false,
            1,
        );
        assert_eq!(m.body, BodyKind::Chunked);
        assert_eq!(s, "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n");
        let mut out = Vec::new();
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert!(
            parse_and_write(raw, false, 0, true, &mut out).is_err(),
            "HTTP/1.0 client"
        );
        assert!(parse_foreign(raw, false, false).is_err(), "HTTP/2 client");
    }

    #[test]
    fn transfer_coding_not_ending_in_chunked_is_refused() {
        for te in ["gzip", "identity", "chunked, gzip", "chunked, chunked", ""] {
            let raw = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: {te}\r\n\r\nbody");
            for (v, head) in [(1, false), (0, false), (1, true)] {
                let mut out = Vec::new();
                let r = parse_and_write(raw.as_bytes(), head, v, true, &mut out);
                assert!(r.is_err(), "{te:?} to HTTP/1.{v} (HEAD {head}) accepted");
            }
            assert!(
                parse_foreign(raw.as_bytes(), false, false).is_err(),
                "{te:?} to HTTP/2"
            );
        }
    }

    #[test]
    fn hundreds_of_headers_are_parsed_on_the_heap() {
        let mut raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n".to_vec();
        for i in 0..300 {
            raw.extend_from_slice(format!("Set-Cookie: c{i}=v; Path=/\r\n").as_bytes());
        }
        let (m, s) = run(&[&raw[..], b"\r\nok"].concat(), false, 1);
        assert_eq!(m.body, BodyKind::Length(2));
        assert_eq!(s.matches("Set-Cookie: ").count(), 300);
        assert!(s.ends_with("Set-Cookie: c299=v; Path=/\r\n"), "{s}");
        let Ok(Some(Ok(h))) = parse_foreign(&[&raw[..], b"\r\n"].concat(), false, false) else {
            panic!("HTTP/2 client: not parsed");
        };
        assert_eq!(h.headers.get_all("set-cookie").iter().count(), 300);
        // Incomplete with more than 128 headers so far: read more.
        let mut out = Vec::new();
        assert!(matches!(
            parse_and_write(&raw, false, 1, true, &mut out).unwrap(),
            Parsed::Partial
        ));
        assert!(matches!(parse_foreign(&raw, false, false), Ok(None)));
    }

    #[test]
    fn interim_and_bad() {
        let mut out = Vec::new();
        assert!(matches!(
            parse_and_write(
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200",
                false,
                1,
                true,
                &mut out
            )
            .unwrap(),
            Parsed::Interim(25)
        ));
        assert!(parse_and_write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
            1,
            true,
            &mut out
        )
        .is_err());
    }

    #[test]
    fn cache_fill_takes_transfer_encoding_over_a_content_length_and_drops_the_connection() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(
            parse_foreign(raw, false, false).is_err(),
            "refused elsewhere"
        );
        let Ok(Some(Ok(h))) = parse_foreign(raw, false, true) else {
            panic!("the cache fill's head parses");
        };
        assert_eq!(h.body, BodyKind::Chunked);
        assert!(!h.upstream_reusable);
    }
}
