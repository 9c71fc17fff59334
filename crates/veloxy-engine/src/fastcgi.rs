//! FastCGI (PHP-FPM and the like): a route's `fastcgi = { root, index, split_path, params }`
//! compiled ([`FastcgiRoute`]), the CGI/1.1 parameters of a request ([`params`]), and one
//! request over a connection ([`request_bytes`], [`next_record`]): the records of the FastCGI 1.0 specification,
//! the response's CGI header section turned into an HTTP status and fields.
//!
//! The record codec is hand-written: it is a few dozen lines, and the crates that implement
//! FastCGI own their connections, where veloxy's come from its keep-alive pool and go back to
//! it (`FCGI_KEEP_CONN`). The request body is sent whole (read before anything goes upstream,
//! as nginx's `fastcgi_request_buffering` does by default); the response is taken off the
//! connection record by record ([`next_record`]): its header section (up to [`MAX_HEAD`]),
//! then the body as it comes (`exchange::fastcgi_body`).

use std::path::PathBuf;

use bytes::{Buf, Bytes, BytesMut};

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
    /// The route's `try_files`: static files served from `root` before the script runs.
    pub try_files: Option<TryFiles>,
}

/// `try_files = ["$uri", "$uri/", "/index.php"]` on a FastCGI route, nginx's front
/// controller (`try_files $uri $uri/ /index.php?$query_string`): a request for a script (a
/// path `split_path` splits, or ending in `.php`) runs it; else, with `$uri`, an existing
/// file under the root is served as a file route serves it (never a script's source); with
/// `$uri/`, a directory holding the index script runs that script; else the last entry, a
/// script, runs with the request's query (REQUEST_URI stays the request's). A path that
/// climbs out of the root is refused (400).
#[derive(Debug, Clone)]
pub struct TryFiles {
    /// `$uri` is listed.
    pub file: bool,
    /// `$uri/` is listed.
    pub dir: bool,
    /// The script run when nothing else is (`/index.php`).
    pub fallback: String,
    /// The entries as written (for `check --print`).
    pub entries: Vec<String>,
    /// The files under `root`, served as a file route with that root serves them.
    pub files: std::sync::Arc<crate::static_files::StaticRoute>,
}

/// Where `try_files` sends a request.
pub enum Tried {
    /// A file under the root: served by [`TryFiles::files`].
    File,
    /// A script: the path's own (`None`), or this one (an index script, the fallback).
    Script(Option<String>),
    /// A path that is not a clean path under the root (400).
    Refused,
}

/// Whether `path` names a script: `split_path` splits it (with or without PATH_INFO), or it
/// ends in `.php`. Such a path is never served as a file.
fn is_script(route: &FastcgiRoute, path: &str) -> bool {
    path.ends_with(".php")
        || route.split_path.is_match(path)
        || route.split_path.is_match(&format!("{path}/"))
}

/// Decides a request's way on a route with `try_files` (see [`TryFiles`]).
pub fn try_files(route: &FastcgiRoute, t: &TryFiles, target: &str) -> Tried {
    use crate::static_files::path::{clean, PathError};
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let clean = match clean(target, false) {
        Ok(c) => c,
        Err(PathError::Invalid) => return Tried::Refused,
        // A dot file is not served: the application decides.
        Err(PathError::Hidden) => return Tried::Script(Some(t.fallback.clone())),
    };
    if is_script(route, path) || is_script(route, &clean.path) {
        return Tried::Script(None);
    }
    if t.file && !clean.trailing_slash && t.files.is_file(&clean.path) {
        return Tried::File;
    }
    if t.dir {
        let dir = clean.path.trim_end_matches('/');
        let index = format!("{dir}/{}", route.index);
        if t.files.is_file(&index) {
            return Tried::Script(Some(index));
        }
    }
    Tried::Script(Some(t.fallback.clone()))
}

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
    /// The script `try_files` chose (`None`: the path's own, by `split_path`).
    pub script: Option<&'a str>,
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
        _ if r.script.is_some() => (r.script.unwrap_or_default().to_owned(), String::new()),
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
    #[error("the FastCGI server was silent for longer than the group's read_timeout")]
    TimedOut,
    #[error("the FastCGI response's header section is longer than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("the FastCGI server sent a record of version {0}")]
    BadRecord(u8),
    #[error("the FastCGI server refused the request (protocol status {0})")]
    Refused(u8),
    #[error("the FastCGI response's header section is malformed")]
    BadHead,
}

/// The longest CGI header section read before the body (larger: 502).
pub const MAX_HEAD: usize = 64 * 1024;

/// One record of the response, as [`next_record`] takes it off the read buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    /// Response bytes (the CGI header section, then the body); empty at the stream's end.
    Stdout(Bytes),
    /// What the application wrote to stderr.
    Stderr(Bytes),
    /// FCGI_END_REQUEST with its protocol status (0: the request completed).
    End(u8),
    /// Management records and unknown types carry nothing for this request.
    Other,
}

/// How many bytes the record at the start of `buf` needs in all (its 8-byte header, content
/// and padding; 8 while the header is incomplete): the reader keeps that much room.
pub fn record_len(buf: &[u8]) -> usize {
    if buf.len() < 8 {
        return 8;
    }
    8 + u16::from_be_bytes([buf[4], buf[5]]) as usize + buf[6] as usize
}

/// Takes the first complete record off `buf` (`None`: it is not all there yet).
pub fn next_record(buf: &mut BytesMut) -> Result<Option<Record>, FastcgiError> {
    if buf.len() < 8 {
        return Ok(None);
    }
    if buf[0] != VERSION {
        return Err(FastcgiError::BadRecord(buf[0]));
    }
    if buf.len() < record_len(buf) {
        return Ok(None);
    }
    let (kind, len, pad) = (
        buf[1],
        u16::from_be_bytes([buf[4], buf[5]]) as usize,
        buf[6],
    );
    buf.advance(8);
    let content = buf.split_to(len).freeze();
    buf.advance(pad as usize);
    Ok(Some(match kind {
        STDOUT => Record::Stdout(content),
        STDERR => Record::Stderr(content),
        END_REQUEST => Record::End(content.get(4).copied().unwrap_or(0)),
        _ => Record::Other,
    }))
}

/// Whether `buf` holds the response's FCGI_END_REQUEST record whole: the rest of the
/// response can then be taken without reading.
pub fn complete_in(mut buf: &[u8]) -> bool {
    while buf.len() >= 8 && buf[0] == VERSION {
        let n = record_len(buf);
        if buf.len() < n {
            return false;
        }
        if buf[1] == END_REQUEST {
            return true;
        }
        buf = &buf[n..];
    }
    false
}

/// Where the CGI header section in `stdout` ends: (its end, the body's start).
pub fn head_end(stdout: &[u8]) -> Option<(usize, usize)> {
    let crlf = memchr::memmem::find(stdout, b"\r\n\r\n").map(|i| (i, i + 4));
    let lf = memchr::memmem::find(stdout, b"\n\n").map(|i| (i, i + 2));
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// A CGI response head: the status (`Status:`, else 302 with a `Location`, else 200) and
/// the other fields of its header section.
pub struct CgiHead {
    pub status: u16,
    pub fields: Vec<(String, Bytes)>,
}

/// Parses a CGI header section (without the blank line that ends it).
pub fn parse_head(head: &[u8]) -> Result<CgiHead, FastcgiError> {
    let head = std::str::from_utf8(head).map_err(|_| FastcgiError::BadHead)?;
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
    Ok(CgiHead { status, fields })
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
    fn cgi_heads_give_their_status() {
        let r = parse_head(b"Status: 404 Not Found\r\nContent-Type: text/plain").unwrap();
        assert_eq!((r.status, r.fields.len()), (404, 1));
        assert_eq!(parse_head(b"Location: /x").unwrap().status, 302);
        assert_eq!(parse_head(b"X-A: 1\r\n").unwrap().status, 200);
        assert!(parse_head(b"no head").is_err());
        assert_eq!(head_end(b"A: 1\r\n\r\nbody"), Some((4, 8)));
        assert_eq!(head_end(b"A: 1\n\nbody\r\n\r\n"), Some((4, 6)));
        assert_eq!(head_end(b"A: 1\r\n"), None);
    }

    #[test]
    fn records_come_off_the_buffer_whole() {
        let mut out = Vec::new();
        record(&mut out, STDOUT, b"hello");
        record(&mut out, STDERR, b"oops");
        record(&mut out, END_REQUEST, &[0; 8]);
        assert!(complete_in(&out));
        assert!(!complete_in(&out[..out.len() - 1]));
        // A record split anywhere waits for the rest.
        let mut buf = BytesMut::from(&out[..12]);
        assert_eq!(next_record(&mut buf).unwrap(), None);
        assert_eq!(record_len(&buf), 16);
        buf.extend_from_slice(&out[12..]);
        assert_eq!(
            next_record(&mut buf).unwrap(),
            Some(Record::Stdout(Bytes::from_static(b"hello")))
        );
        assert_eq!(
            next_record(&mut buf).unwrap(),
            Some(Record::Stderr(Bytes::from_static(b"oops")))
        );
        assert_eq!(next_record(&mut buf).unwrap(), Some(Record::End(0)));
        assert!(buf.is_empty());
        let mut bad = BytesMut::from(&[9u8, 6, 0, 1, 0, 0, 0, 0][..]);
        assert!(next_record(&mut bad).is_err());
    }
}
