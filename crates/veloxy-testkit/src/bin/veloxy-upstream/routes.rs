//! Route table, precomputed responses and small formatting helpers.

use std::sync::atomic::AtomicU64;

use anyhow::{bail, Result};

/// Bytes of the `/size` pattern available from any starting phase; bodies are
/// written from `Shared::pattern` in slices of at most this many bytes.
pub const PATTERN_BLOCK: usize = 64 * 1024;

/// Bodies of `--body-size` up to this size are precomputed; larger ones are
/// streamed from the pattern buffer like `/size/N`.
const MAX_STATIC_BODY: u64 = 1024 * 1024;

/// The built-in default body: exactly 100 bytes of JSON.
const DEFAULT_BODY: &str = r#"{"status":"ok","service":"veloxy-upstream","message":"hello from the upstream","padding":"xxxxxxxx"}"#;

/// Body of `/_search`: looks like an Elasticsearch search response.
const SEARCH_BODY: &str = concat!(
    r#"{"took":3,"timed_out":false,"_shards":{"total":1,"successful":1,"skipped":0,"failed":0},"#,
    r#""hits":{"total":{"value":3,"relation":"eq"},"max_score":1.2,"hits":["#,
    r#"{"_index":"logs","_id":"1","_score":1.2,"_source":{"ts":"2024-05-01T12:00:00Z","level":"info","msg":"served","latency_ms":3}},"#,
    r#"{"_index":"logs","_id":"2","_score":1.1,"_source":{"ts":"2024-05-01T12:00:01Z","level":"warn","msg":"slow","latency_ms":250}},"#,
    r#"{"_index":"logs","_id":"3","_score":0.9,"_source":{"ts":"2024-05-01T12:00:02Z","level":"error","msg":"reset","latency_ms":0}}"#,
    r#"]}}"#,
);

pub const TEXT_PLAIN: &str = "text/plain";
pub const APPLICATION_JSON: &str = "application/json";
pub const OCTET_STREAM: &str = "application/octet-stream";

/// A precomputed response: `head` holds the status line and every header that
/// does not vary per request (including `x-upstream`), without the final blank
/// line; `body` is the complete body.
pub struct Canned {
    pub head: Box<[u8]>,
    pub body: Box<[u8]>,
}

impl Canned {
    fn new(upstream_hdr: &[u8], content_type: &str, body: Vec<u8>) -> Self {
        let mut head = Vec::with_capacity(128);
        push_head_start(&mut head, 200, Some(content_type), Some(body.len() as u64));
        head.extend_from_slice(upstream_hdr);
        Canned {
            head: head.into_boxed_slice(),
            body: body.into_boxed_slice(),
        }
    }
}

/// What `/` (and `/delay`, `/close`) answers with.
pub enum DefaultBody {
    /// Precomputed response.
    Static(Canned),
    /// `head` as in [`Canned`]; the body is `len` pattern bytes, streamed.
    Pattern { head: Box<[u8]>, len: u64 },
}

/// State shared by all connections of all worker threads.
pub struct Shared {
    /// `x-upstream: NAME\r\n`.
    pub upstream_hdr: Box<[u8]>,
    pub default: DefaultBody,
    pub search: Canned,
    pub health: Canned,
    /// `PATTERN_BLOCK + 26` bytes of the `/size` pattern, so that a slice of
    /// up to `PATTERN_BLOCK` bytes can start at any phase `offset % 26`.
    pub pattern: Box<[u8]>,
    /// Close connections after this many responses (`u64::MAX`: never).
    pub close_after: u64,
    /// Counter of accepted connections (the last id handed out).
    pub next_conn_id: AtomicU64,
}

impl Shared {
    pub fn new(name: &str, body_size: Option<u64>, close_after: Option<u64>) -> Result<Self> {
        if name.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            bail!("--name must be a valid header value (no control characters)");
        }
        let upstream_hdr = format!("x-upstream: {name}\r\n").into_bytes();
        let default = match body_size {
            None => DefaultBody::Static(Canned::new(
                &upstream_hdr,
                APPLICATION_JSON,
                DEFAULT_BODY.as_bytes().to_vec(),
            )),
            Some(len) if len <= MAX_STATIC_BODY => {
                DefaultBody::Static(Canned::new(&upstream_hdr, OCTET_STREAM, pattern(0, len)))
            }
            Some(len) => {
                let mut head = Vec::with_capacity(128);
                push_head_start(&mut head, 200, Some(OCTET_STREAM), Some(len));
                head.extend_from_slice(&upstream_hdr);
                DefaultBody::Pattern {
                    head: head.into_boxed_slice(),
                    len,
                }
            }
        };
        Ok(Shared {
            search: Canned::new(
                &upstream_hdr,
                APPLICATION_JSON,
                SEARCH_BODY.as_bytes().to_vec(),
            ),
            health: Canned::new(&upstream_hdr, TEXT_PLAIN, b"ok\n".to_vec()),
            upstream_hdr: upstream_hdr.into_boxed_slice(),
            default,
            pattern: pattern(0, (PATTERN_BLOCK + 26) as u64).into_boxed_slice(),
            close_after: close_after.unwrap_or(u64::MAX),
            next_conn_id: AtomicU64::new(0),
        })
    }
}

/// `len` bytes of the pattern `b'a' + (i % 26)` starting at offset `start`.
fn pattern(start: u64, len: u64) -> Vec<u8> {
    (start..start + len)
        .map(|i| b'a' + (i % 26) as u8)
        .collect()
}

/// How `/size/N` frames its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeMode {
    Length,
    Chunked,
    CloseDelimited,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Default,
    Echo,
    Sink,
    Size {
        len: u64,
        mode: SizeMode,
        /// `?text=1`: `content-type: text/plain` instead of octet-stream (compressible).
        text: bool,
    },
    Delay(u64),
    Status(u16),
    Drop,
    Hang,
    Close,
    Health,
    Search,
    Bulk,
    /// A route with an unparsable numeric parameter.
    BadParam,
}

/// Maps a request target to its route.
pub fn parse_route(target: &str) -> Route {
    let target = strip_absolute_form(target);
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/echo" => Route::Echo,
        "/sink" => Route::Sink,
        "/drop" => Route::Drop,
        "/hang" => Route::Hang,
        "/close" => Route::Close,
        "/health" => Route::Health,
        _ => {
            if let Some(n) = path.strip_prefix("/size/") {
                match n.parse::<u64>() {
                    Ok(len) => Route::Size {
                        len,
                        mode: size_mode(query),
                        text: query.split('&').any(|p| p == "text=1"),
                    },
                    Err(_) => Route::BadParam,
                }
            } else if let Some(ms) = path.strip_prefix("/delay/") {
                ms.parse().map_or(Route::BadParam, Route::Delay)
            } else if let Some(code) = path.strip_prefix("/status/") {
                match code.parse::<u16>() {
                    Ok(code) if (200..=999).contains(&code) => Route::Status(code),
                    _ => Route::BadParam,
                }
            } else if path.ends_with("/_search") {
                Route::Search
            } else if path.ends_with("/_bulk") {
                Route::Bulk
            } else {
                Route::Default
            }
        }
    }
}

/// `http://host:port/path?q` -> `/path?q`; other targets are returned as is.
fn strip_absolute_form(target: &str) -> &str {
    let rest = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"));
    match rest {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    }
}

fn size_mode(query: &str) -> SizeMode {
    let (mut chunked, mut close) = (false, false);
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let on = matches!(value, "1" | "true" | "yes");
        match key {
            "chunked" => chunked = on,
            "close" => close = on,
            _ => {}
        }
    }
    if close {
        SizeMode::CloseDelimited
    } else if chunked {
        SizeMode::Chunked
    } else {
        SizeMode::Length
    }
}

/// Appends the status line and the optional `content-type` and
/// `content-length` headers.
pub fn push_head_start(
    out: &mut Vec<u8>,
    status: u16,
    content_type: Option<&str>,
    content_length: Option<u64>,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(content_type) = content_type {
        out.extend_from_slice(b"content-type: ");
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(len) = content_length {
        out.extend_from_slice(b"content-length: ");
        push_u64(out, len);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends the decimal representation of `n`.
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// Appends the lowercase hexadecimal representation of `n`.
pub fn push_hex(out: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; 16];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        418 => "I'm a teapot",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}
