//! Request head parsing and request framing rules.

use std::mem::MaybeUninit;

use crate::routes::{self, Route};

/// Maximum number of request header fields.
const MAX_HEADERS: usize = 100;

/// Why request processing stopped.
pub enum Fail {
    /// The peer went away or an I/O error happened: drop the socket.
    Closed,
    /// Protocol error: answer with this status and `connection: close`.
    Bad(u16),
}

impl From<std::io::Error> for Fail {
    fn from(_: std::io::Error) -> Self {
        Fail::Closed
    }
}

pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// What the connection handler needs from a parsed request head.
pub struct Req {
    pub head_len: usize,
    pub is_head: bool,
    pub http10: bool,
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub body: Framing,
    pub route: Route,
}

/// Parses a request head at the start of `data`. `Ok(None)`: incomplete.
pub fn parse_head(data: &[u8]) -> Result<Option<Req>, Fail> {
    let mut headers = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(data, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Fail::Bad(431)),
        Err(_) => return Err(Fail::Bad(400)),
    };

    let http10 = req.version == Some(0);
    let mut content_length: Option<u64> = None;
    let mut transfer_encoding = false;
    let mut chunked = false;
    let mut close = false;
    let mut keep_alive = false;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let len = parse_content_length(h.value).ok_or(Fail::Bad(400))?;
            if content_length.is_some_and(|prev| prev != len) {
                return Err(Fail::Bad(400));
            }
            content_length = Some(len);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            transfer_encoding = true;
            for coding in tokens(h.value) {
                // `chunked` must be the last coding and appear only once.
                if chunked {
                    return Err(Fail::Bad(400));
                }
                chunked = coding.eq_ignore_ascii_case(b"chunked");
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in tokens(h.value) {
                if option.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            expect_continue |= trim(h.value).eq_ignore_ascii_case(b"100-continue");
        }
    }

    let body = if transfer_encoding {
        if !chunked || content_length.is_some() {
            return Err(Fail::Bad(400));
        }
        Framing::Chunked
    } else {
        match content_length {
            Some(len) if len > 0 => Framing::Length(len),
            _ => Framing::None,
        }
    };
    Ok(Some(Req {
        head_len,
        is_head: req.method == Some("HEAD"),
        http10,
        keep_alive: !close && (!http10 || keep_alive),
        expect_continue,
        body,
        route: routes::parse_route(req.path.unwrap_or("/")),
    }))
}

fn parse_content_length(value: &[u8]) -> Option<u64> {
    let value = trim(value);
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Parses `chunk-size [ BWS ; chunk-ext ]`; extensions are ignored.
pub fn parse_chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return None;
    }
    let size = line[..digits].iter().try_fold(0u64, |acc, &b| {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        acc.checked_mul(16)?.checked_add(u64::from(d))
    })?;
    let rest = trim(&line[digits..]);
    (rest.is_empty() || rest[0] == b';').then_some(size)
}

/// Non-empty, whitespace-trimmed elements of a comma-separated header value.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|t| !t.is_empty())
}

fn trim(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}
