//! FastCGI (PHP-FPM and the like): a route's `fastcgi = { root, index, split_path, params }`
//! compiled ([`FastcgiRoute`]), the CGI/1.1 parameters of a request ([`params`]), and one
//! request over a connection ([`exchange`]): the records of the FastCGI 1.0 specification,
//! the response's CGI header section turned into an HTTP status and fields.
//!
//! The record codec is hand-written: it is a few dozen lines, and the crates that implement
//! FastCGI own their connections, where veloxy's come from its keep-alive pool and go back to
//! it (`FCGI_KEEP_CONN`). The request body is sent whole (read before anything goes upstream,
//! as nginx's `fastcgi_request_buffering` does by default); the response is read whole, up to
//! [`MAX_RESPONSE`] (larger: 502), then answered.

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A route's `fastcgi` table, compiled.
#[derive(Debug, Clone)]
pub struct FastcgiRoute {
    /// The document root the scripts are in, as the FastCGI server sees it (absolute).
    pub root: PathBuf,
    /// The script of a path that ends in `/`, and the front controller (`index.php`).
    pub index: String,
    /// Splits a path into the script and PATH_INFO (default `^(.+\.php)(/.*)$`; groups 1
    /// and 2).
    pub split_path: regex_automata::meta::Regex,
    /// `split_path` as written (for `check --print`).
    pub split_path_text: String,
    /// Extra parameters (`APP_ENV = "prod"`), sent after the standard ones.
    pub params: Vec<(String, String)>,
}

/// The longest response read (head and body).
pub const MAX_RESPONSE: usize = 64 << 20;

/// What a request tells the parameters.
pub struct RequestInfo<'a> {
    pub method: &'a str,
    /// The request target (path and query).
    pub target: &'a str,
    /// `Host` / `:authority` ("" when none).
    pub host: &'a str,
    /// The request's fields as (name, value).
    pub fields: Vec<(&'a str, &'a [u8])>,
    pub client: std::net::SocketAddr,
    /// The listener's port.
    pub server_port: u16,
    pub tls: bool,
    /// `HTTP/1.1`, `HTTP/2.0` ...
    pub protocol: &'static str,
    /// The body's length (it is sent whole).
    pub content_length: usize,
}

/// The CGI/1.1 parameters of a request on `route`: SCRIPT_FILENAME and SCRIPT_NAME (the
/// path's script by `split_path`, the index of a directory, else the front controller
/// `/index`), PATH_INFO, QUERY_STRING, REQUEST_METHOD, REQUEST_URI, DOCUMENT_ROOT,
/// CONTENT_TYPE and CONTENT_LENGTH, REMOTE_ADDR and REMOTE_PORT, SERVER_NAME, SERVER_PORT,
/// SERVER_PROTOCOL, GATEWAY_INTERFACE, HTTPS (`on` over TLS), an HTTP_* parameter for each
/// field (but Proxy, an httpoxy vector), then the route's own.
pub fn params(route: &FastcgiRoute, r: &RequestInfo) -> Vec<(String, Vec<u8>)> {
    let (path, query) = r.target.split_once('?').unwrap_or((r.target, ""));
    let mut caps = route.split_path.create_captures();
    route.split_path.captures(path, &mut caps);
    let group = |i| caps.get_group(i).map(|s| &path[s.range()]);
    let (script, path_info) = match (caps.is_match(), group(1)) {
        (true, Some(script)) => (script.to_owned(), group(2).unwrap_or("").to_owned()),
        _ if path.ends_with('/') => (format!("{path}{}", route.index), String::new()),
        _ if path.ends_with(".php") => (path.to_owned(), String::new()),
        _ => (format!("/{}", route.index), String::new()),
    };
    let root = route
        .root
        .to_string_lossy()
        .trim_end_matches('/')
        .to_owned();
    let server_name = r.host.rsplit_once(':').map_or(r.host, |(h, _)| h);
    let mut p: Vec<(String, Vec<u8>)> = vec![
        ("GATEWAY_INTERFACE".into(), b"CGI/1.1".to_vec()),
        ("SERVER_SOFTWARE".into(), b"veloxy".to_vec()),
        ("SERVER_PROTOCOL".into(), r.protocol.as_bytes().to_vec()),
        ("REQUEST_METHOD".into(), r.method.as_bytes().to_vec()),
        ("REQUEST_URI".into(), r.target.as_bytes().to_vec()),
        ("QUERY_STRING".into(), query.as_bytes().to_vec()),
        ("DOCUMENT_ROOT".into(), root.as_bytes().to_vec()),
        (
            "SCRIPT_FILENAME".into(),
            format!("{root}{script}").into_bytes(),
        ),
        ("SCRIPT_NAME".into(), script.into_bytes()),
        ("PATH_INFO".into(), path_info.into_bytes()),
        ("REMOTE_ADDR".into(), r.client.ip().to_string().into_bytes()),
        (
            "REMOTE_PORT".into(),
            r.client.port().to_string().into_bytes(),
        ),
        ("SERVER_NAME".into(), server_name.as_bytes().to_vec()),
        ("SERVER_PORT".into(), r.server_port.to_string().into_bytes()),
        (
            "CONTENT_LENGTH".into(),
            r.content_length.to_string().into_bytes(),
        ),
    ];
    if r.tls {
        p.push(("HTTPS".into(), b"on".to_vec()));
    }
    for (name, value) in &r.fields {
        if name.eq_ignore_ascii_case("content-type") {
            p.push(("CONTENT_TYPE".into(), value.to_vec()));
            continue;
        }
        if name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("proxy") {
            continue;
        }
        let key = format!("HTTP_{}", name.to_ascii_uppercase().replace('-', "_"));
        match p.iter_mut().find(|(k, _)| *k == key) {
            // Repeated fields (HTTP/2's split cookies) make one parameter.
            Some((_, v)) => {
                v.extend_from_slice(if key == "HTTP_COOKIE" { b"; " } else { b", " });
                v.extend_from_slice(value);
            }
            None => p.push((key, value.to_vec())),
        }
    }
    if !r.host.is_empty() && !p.iter().any(|(k, _)| k == "HTTP_HOST") {
        p.push(("HTTP_HOST".into(), r.host.as_bytes().to_vec()));
    }
    for (k, v) in &route.params {
        p.push((k.clone(), v.as_bytes().to_vec()));
    }
    p
}

const VERSION: u8 = 1;
const BEGIN_REQUEST: u8 = 1;
const END_REQUEST: u8 = 3;
const PARAMS: u8 = 4;
const STDIN: u8 = 5;
const STDOUT: u8 = 6;
const STDERR: u8 = 7;
const RESPONDER: u16 = 1;
const KEEP_CONN: u8 = 1;
/// One request per connection at a time: its id.
const ID: u16 = 1;

/// Appends one record of `kind` carrying `content` (at most 65,535 bytes).
fn record(out: &mut Vec<u8>, kind: u8, content: &[u8]) {
    let len = content.len() as u16;
    let pad = (8 - content.len() % 8) % 8;
    out.extend_from_slice(&[VERSION, kind]);
    out.extend_from_slice(&ID.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&[pad as u8, 0]);
    out.extend_from_slice(content);
    out.extend_from_slice(&[0u8; 8][..pad]);
}

/// Appends `data` as records of `kind` (split at 65,535 bytes) and the empty one that ends
/// the stream.
fn stream(out: &mut Vec<u8>, kind: u8, data: &[u8]) {
    for chunk in data.chunks(65_535) {
        record(out, kind, chunk);
    }
    record(out, kind, &[]);
}

/// A name-value pair's length: one byte below 128, else four with the high bit set.
fn push_len(out: &mut Vec<u8>, n: usize) {
    if n < 128 {
        out.push(n as u8);
    } else {
        out.extend_from_slice(&((n as u32) | 0x8000_0000).to_be_bytes());
    }
}

/// The whole request: BEGIN_REQUEST (responder, keep the connection), the parameters and
/// the body.
pub fn request_bytes(params: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024 + body.len() + body.len() / 8192 * 8);
    let mut begin = [0u8; 8];
    begin[..2].copy_from_slice(&RESPONDER.to_be_bytes());
    begin[2] = KEEP_CONN;
    record(&mut out, BEGIN_REQUEST, &begin);
    let mut p = Vec::with_capacity(1024);
    for (k, v) in params {
        push_len(&mut p, k.len());
        push_len(&mut p, v.len());
        p.extend_from_slice(k.as_bytes());
        p.extend_from_slice(v);
    }
    stream(&mut out, PARAMS, &p);
    stream(&mut out, STDIN, body);
    out
}

/// Why a FastCGI exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum FastcgiError {
    #[error("the FastCGI server closed the connection before the end of the response")]
    Closed,
    #[error("FastCGI I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the FastCGI server's response is larger than {MAX_RESPONSE} bytes")]
    TooLarge,
    #[error("the FastCGI server sent a record of version {0}")]
    BadRecord(u8),
    #[error("the FastCGI server refused the request (protocol status {0})")]
    Refused(u8),
    #[error("the FastCGI response's header section is malformed")]
    BadHead,
}

/// What the FastCGI server answered.
pub struct Answered {
    /// The response's stdout: CGI header section and body.
    pub stdout: BytesMut,
    /// What it wrote to stderr (for the log).
    pub stderr: Vec<u8>,
}

/// Sends `request` (from [`request_bytes`]) on `io` and reads the response to its
/// END_REQUEST record; the connection may then serve another request.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    request: &[u8],
) -> Result<Answered, FastcgiError> {
    io.write_all(request).await?;
    let mut out = Answered {
        stdout: BytesMut::with_capacity(16 * 1024),
        stderr: Vec::new(),
    };
    let mut head = [0u8; 8];
    loop {
        if let Err(e) = io.read_exact(&mut head).await {
            return Err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => FastcgiError::Closed,
                _ => FastcgiError::Io(e),
            });
        }
        if head[0] != VERSION {
            return Err(FastcgiError::BadRecord(head[0]));
        }
        let len = u16::from_be_bytes([head[4], head[5]]) as usize;
        let pad = head[6] as usize;
        let mut content = vec![0u8; len + pad];
        io.read_exact(&mut content)
            .await
            .map_err(|_| FastcgiError::Closed)?;
        content.truncate(len);
        match head[1] {
            STDOUT => {
                if out.stdout.len() + len > MAX_RESPONSE {
                    return Err(FastcgiError::TooLarge);
                }
                out.stdout.extend_from_slice(&content);
            }
            STDERR if out.stderr.len() < 64 * 1024 => out.stderr.extend_from_slice(&content),
            END_REQUEST => {
                let protocol_status = content.get(4).copied().unwrap_or(0);
                if protocol_status != 0 {
                    return Err(FastcgiError::Refused(protocol_status));
                }
                return Ok(out);
            }
            // Management records and unknown types carry nothing for this request.
            _ => {}
        }
    }
}

/// A CGI response: the status (`Status:`, else 302 with a `Location`, else 200), the other
/// fields of its header section, and the body.
pub struct CgiResponse {
    pub status: u16,
    pub fields: Vec<(String, Bytes)>,
    pub body: Bytes,
}

/// Splits a CGI response (stdout) into status, fields and body.
pub fn parse_response(stdout: BytesMut) -> Result<CgiResponse, FastcgiError> {
    let stdout = stdout.freeze();
    let (head_end, body_start) = match memchr::memmem::find(&stdout, b"\r\n\r\n") {
        Some(i) => (i, i + 4),
        None => match memchr::memmem::find(&stdout, b"\n\n") {
            Some(i) => (i, i + 2),
            None => return Err(FastcgiError::BadHead),
        },
    };
    let head = std::str::from_utf8(&stdout[..head_end]).map_err(|_| FastcgiError::BadHead)?;
    let mut status = None;
    let mut location = false;
    let mut fields = Vec::new();
    for line in head.split('\n').map(|l| l.trim_end_matches('\r')) {
        if line.is_empty() {
            continue;
        }
        let (name, value) = line.split_once(':').ok_or(FastcgiError::BadHead)?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split(' ').next().and_then(|c| c.parse::<u16>().ok());
            status = Some(
                code.filter(|c| (100..1000).contains(c))
                    .ok_or(FastcgiError::BadHead)?,
            );
            continue;
        }
        location |= name.eq_ignore_ascii_case("location");
        fields.push((name.to_owned(), Bytes::copy_from_slice(value.as_bytes())));
    }
    let status = status.unwrap_or(if location { 302 } else { 200 });
    Ok(CgiResponse {
        status,
        fields,
        body: stdout.slice(body_start..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_frame_and_pad_and_lengths_take_four_bytes_from_128() {
        let long = "x".repeat(200);
        let out = request_bytes(&[("A".into(), long.clone().into_bytes())], b"body");
        // BEGIN_REQUEST: 8-byte header + 8-byte body.
        assert_eq!(&out[..4], &[1, BEGIN_REQUEST, 0, 1]);
        assert_eq!(out[8..10], RESPONDER.to_be_bytes());
        assert_eq!(out[10], KEEP_CONN);
        // PARAMS: name length 1 byte, value length 4 bytes (200 >= 128).
        let p = &out[16..];
        assert_eq!(p[1], PARAMS);
        let len = u16::from_be_bytes([p[4], p[5]]) as usize;
        assert_eq!(len, 1 + 4 + 1 + 200);
        assert_eq!(&p[8..13], &[1, 0x80, 0, 0, 200]);
        assert_eq!((len + p[6] as usize) % 8, 0);
    }

    #[test]
    fn cgi_responses_give_their_status() {
        let r = parse_response(BytesMut::from(
            &b"Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\nnope"[..],
        ))
        .unwrap();
        assert_eq!((r.status, &r.body[..]), (404, &b"nope"[..]));
        assert_eq!(r.fields.len(), 1);
        let r = parse_response(BytesMut::from(&b"Location: /x\n\n"[..])).unwrap();
        assert_eq!(r.status, 302);
        let r = parse_response(BytesMut::from(&b"X-A: 1\r\n\r\n"[..])).unwrap();
        assert_eq!(r.status, 200);
        assert!(parse_response(BytesMut::from(&b"no head"[..])).is_err());
    }
}
