//! [`script_origin`]: an in-process HTTP/1.1 keep-alive origin whose every answer the test
//! computes from the whole request (method, target, headers, body), with a log of the requests
//! it saw and a [`ScriptOrigin::stop`] that makes it unreachable (connection refused): what the
//! cache tests need to script freshness, validators, `Vary`, slow refreshes and dead origins.
//!
//! Every response carries `x-origin-seq: N`, the 1-based sequence number of the request it
//! answers (also [`SeenRequest::seq`]), so a test can tell which upstream response it got.
//! `Content-Length` is always computed from the scripted body (a scripted `Content-Length` or
//! `Transfer-Encoding` is dropped); 1xx, 204 and 304 answers have neither a body nor a
//! `Content-Length`, and an answer to `HEAD` has the body's `Content-Length` but no body.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// One request as the origin received it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// 1-based arrival order (the `x-origin-seq` of its answer).
    pub seq: usize,
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// In order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// De-chunked when it came chunked.
    pub body: Vec<u8>,
}

impl SeenRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// The answer to one request.
#[derive(Debug, Clone)]
pub struct Scripted {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Waited before the answer is written.
    pub delay: Duration,
}

impl Scripted {
    /// `status` with no header and an empty body.
    pub fn new(status: u16) -> Scripted {
        Scripted {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// 200 with `body`.
    pub fn ok(body: impl Into<Vec<u8>>) -> Scripted {
        Scripted::new(200).with_body(body)
    }

    /// 304 Not Modified (no body).
    pub fn not_modified() -> Scripted {
        Scripted::new(304)
    }

    /// Adds a header (kept in order; repeat the call for several values).
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Scripted {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// Replaces the body.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Scripted {
        self.body = body.into();
        self
    }

    /// Waits `delay` before answering.
    pub fn delay(mut self, delay: Duration) -> Scripted {
        self.delay = delay;
        self
    }
}

/// `t` as an HTTP-date (`Sun, 06 Nov 1994 08:49:37 GMT`), for `Date`, `Expires` and
/// `Last-Modified`.
pub fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

type Handler = dyn Fn(&SeenRequest) -> Scripted + Send + Sync;

struct Shared {
    handler: Box<Handler>,
    hits: Arc<AtomicUsize>,
    log: Mutex<Vec<SeenRequest>>,
    stopped: AtomicBool,
    /// Open connections by id, shut down by `stop`; guards the `stopped` check at accept.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
}

/// A running scripted origin; dropping it stops it.
pub struct ScriptOrigin {
    pub addr: SocketAddr,
    /// Requests received so far.
    pub hits: Arc<AtomicUsize>,
    shared: Arc<Shared>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl ScriptOrigin {
    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        let mut all = self.shared.log.lock().unwrap().clone();
        all.sort_by_key(|r| r.seq);
        all
    }

    /// The request with sequence number `seq` (1-based), if it arrived.
    pub fn request(&self, seq: usize) -> Option<SeenRequest> {
        self.requests().into_iter().find(|r| r.seq == seq)
    }

    /// Closes every open connection and the listening socket: from its return on, connecting
    /// to [`ScriptOrigin::addr`] is refused. Answers being delayed are not sent. Idempotent.
    pub fn stop(&self) {
        {
            let conns = self.shared.conns.lock().unwrap();
            self.shared.stopped.store(true, Ordering::SeqCst);
            for s in conns.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(acceptor) = self.acceptor.lock().unwrap().take() {
            // Wake the blocked accept; the acceptor sees `stopped` and drops the listener.
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2));
            let _ = acceptor.join();
        }
    }
}

impl Drop for ScriptOrigin {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts a threaded HTTP/1.1 keep-alive origin on 127.0.0.1 (ephemeral port) answering each
/// request with `handler(&request)`.
pub fn script_origin(
    handler: impl Fn(&SeenRequest) -> Scripted + Send + Sync + 'static,
) -> ScriptOrigin {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let shared = Arc::new(Shared {
        handler: Box::new(handler),
        hits: hits.clone(),
        log: Mutex::new(Vec::new()),
        stopped: AtomicBool::new(false),
        conns: Mutex::new(HashMap::new()),
        next_conn: AtomicU64::new(0),
    });
    let acceptor = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else {
                    if shared.stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    continue;
                };
                let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
                {
                    let mut conns = shared.conns.lock().unwrap();
                    if shared.stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(clone) = s.try_clone() else { continue };
                    conns.insert(id, clone);
                }
                let shared = shared.clone();
                std::thread::spawn(move || {
                    serve(&shared, s);
                    shared.conns.lock().unwrap().remove(&id);
                });
            }
            // The listener is dropped here: the port now refuses connections.
        })
    };
    ScriptOrigin {
        addr,
        hits,
        shared,
        acceptor: Mutex::new(Some(acceptor)),
    }
}

/// Serves one connection until EOF, an error, `Connection: close` or `stop`.
fn serve(shared: &Shared, mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    while let Some((method, target, headers, body)) = read_request(&mut s, &mut buf) {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let seq = shared.hits.fetch_add(1, Ordering::SeqCst) + 1;
        let seen = SeenRequest {
            seq,
            method,
            target,
            headers,
            body,
        };
        shared.log.lock().unwrap().push(seen.clone());
        let reply = (shared.handler)(&seen);
        std::thread::sleep(reply.delay);
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let close = seen
            .header("connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"));
        if s.write_all(&encode(&reply, seq, seen.method == "HEAD", close))
            .is_err()
            || close
        {
            return;
        }
    }
}

/// The bytes of the response `reply` to request `seq`.
fn encode(reply: &Scripted, seq: usize, head_request: bool, close: bool) -> Vec<u8> {
    let status = reply.status;
    let bodiless_status = (100..200).contains(&status) || status == 204 || status == 304;
    let mut out = format!("HTTP/1.1 {status} Scripted\r\n");
    for (n, v) in &reply.headers {
        if n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding") {
            continue;
        }
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str(&format!("x-origin-seq: {seq}\r\n"));
    if !bodiless_status {
        out.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
    }
    if close {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !bodiless_status && !head_request {
        out.extend_from_slice(&reply.body);
    }
    out
}

type Parsed = (String, String, Vec<(String, String)>, Vec<u8>);

/// Reads more bytes into `buf`; false on EOF or error.
fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut tmp = [0u8; 16384];
    match s.read(&mut tmp) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            true
        }
    }
}

/// One request (head and body) from `s`, bytes past it kept in `buf`; `None` at EOF or on a
/// malformed request.
fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Parsed> {
    let (method, target, headers, head_len) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut hs);
        match req.parse(buf).ok()? {
            httparse::Status::Complete(n) => {
                let headers: Vec<(String, String)> = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                break (req.method?.to_string(), req.path?.to_string(), headers, n);
            }
            httparse::Status::Partial => {
                if !fill(s, buf) {
                    return None;
                }
            }
        }
    };
    buf.drain(..head_len);
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim().to_ascii_lowercase())
    };
    let body = if get("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
        read_chunked(s, buf)?
    } else {
        let len: usize = match get("content-length") {
            Some(v) => v.parse().ok()?,
            None => 0,
        };
        while buf.len() < len {
            if !fill(s, buf) {
                return None;
            }
        }
        buf.drain(..len).collect()
    };
    Some((method, target, headers, body))
}

/// A chunked body (trailers discarded).
fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    fn line(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
        loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                let text = String::from_utf8_lossy(&buf[..i]).into_owned();
                buf.drain(..i + 2);
                return Some(text);
            }
            if !fill(s, buf) {
                return None;
            }
        }
    }
    let mut body = Vec::new();
    loop {
        let size_line = line(s, buf)?;
        let size = usize::from_str_radix(size_line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            while !line(s, buf)?.is_empty() {}
            return Some(body);
        }
        while buf.len() < size + 2 {
            if !fill(s, buf) {
                return None;
            }
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(addr: SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn answers_from_the_request_logs_it_and_refuses_connections_after_stop() {
        let o = script_origin(|r| {
            Scripted::ok(format!("{} {} {}", r.method, r.target, r.body.len()))
                .header("cache-control", "max-age=60")
                .header("content-length", "999")
        });
        let raw = exchange(
            o.addr,
            b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n\
              HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(
            raw.starts_with("HTTP/1.1 200 Scripted\r\ncache-control: max-age=60\r\nx-origin-seq: 1\r\nContent-Length: 13\r\n\r\nPOST /a?b=1 5HTTP/1.1 200"),
            "{raw}"
        );
        assert!(
            raw.ends_with("x-origin-seq: 2\r\nContent-Length: 9\r\nConnection: close\r\n\r\n"),
            "HEAD: the GET body's length, no body: {raw}"
        );
        assert_eq!(o.hits(), 2);
        let log = o.requests();
        assert_eq!(log[0].body, b"abcde");
        assert_eq!(log[0].header("Host"), Some("x"));
        assert_eq!((log[1].method.as_str(), log[1].path()), ("HEAD", "/h"));

        // An idle keep-alive connection is closed by stop, and new ones are refused.
        let mut idle = TcpStream::connect(o.addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut got = [0u8; 4096];
        assert!(idle.read(&mut got).unwrap() > 0);
        o.stop();
        assert!(matches!(idle.read(&mut got), Ok(0) | Err(_)));
        let refused = TcpStream::connect_timeout(&o.addr, Duration::from_secs(2));
        assert_eq!(
            refused.map(|_| ()).unwrap_err().kind(),
            std::io::ErrorKind::ConnectionRefused
        );
    }
}
