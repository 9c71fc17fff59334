//! Hardening of the HTTP/1 codec (issue #10): response transfer-codings, chunk sizes that do
//! not fit a signed 64-bit integer, request headers and trailers an upstream could misread,
//! and upstream responses with hundreds of headers. Exotic upstreams are raw TCP listeners on
//! 127.0.0.1 that write exact bytes.

use veloxy_testkit::*;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

/// Bound on every wait in this file.
const WAIT: Duration = Duration::from_secs(10);

/// A raw origin: for each connection it reads until `complete` says the request is whole,
/// reporting the bytes read so far on the returned channel after every read, then writes
/// `response` and closes.
fn raw_origin(
    response: Vec<u8>,
    complete: fn(&[u8]) -> bool,
) -> (SocketAddr, mpsc::Receiver<Vec<u8>>) {
    let (tx, rx) = mpsc::channel();
    let addr = tcp_origin(move |mut s| {
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !complete(&got) {
            match s.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => return,
            }
            let _ = tx.send(got.clone());
        }
        let _ = s.write_all(&response);
        let _ = s.shutdown(std::net::Shutdown::Write);
        // Drain until veloxy closes, so the close is a FIN and not a reset.
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    (addr, rx)
}

/// The request head is complete (bodies are not read).
fn head_done(got: &[u8]) -> bool {
    got.windows(4).any(|w| w == b"\r\n\r\n")
}

/// A chunked request body is complete: the last chunk and the trailer section have arrived.
fn chunked_done(got: &[u8]) -> bool {
    let Some(i) = got.windows(5).position(|w| w == b"\r\n0\r\n") else {
        return false;
    };
    // After the last-chunk line: an empty trailer section, or fields up to a blank line.
    let rest = &got[i + 5..];
    rest.starts_with(b"\r\n") || rest.windows(4).any(|w| w == b"\r\n\r\n")
}

/// Sends `raw` on a fresh connection and reads until the server closes; returns the status,
/// the head and the bytes after it. Parses up to 1024 headers (the shared client stops at 64).
fn exchange(addr: SocketAddr, raw: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(raw).unwrap();
    // Nothing more is coming: a veloxy waiting for more request bytes fails fast.
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    // A reset after a complete answer still leaves that answer readable.
    let _ = s.read_to_end(&mut out);
    let mut headers = vec![httparse::EMPTY_HEADER; 1024];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(&out) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "no complete response head ({other:?}): {:?}",
            String::from_utf8_lossy(&out)
        ),
    };
    let head = String::from_utf8_lossy(&out[..n]).into_owned();
    (r.code.unwrap(), head, out[n..].to_vec())
}

/// One listener (HTTP/1.1 and h2c) and one upstream group, with extra `[server]` and group keys.
fn config(servers: &[SocketAddr], server_keys: &str, group_keys: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[server]\nworkers = 1\n{server_keys}\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n[[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [{}]\nretries = 0\n{group_keys}\n",
        list.join(", ")
    )
}

fn h2c_config(servers: &[SocketAddr], server_keys: &str) -> String {
    config(servers, server_keys, "")
}

/// One HTTP/2 (h2c prior knowledge) request to veloxy, within [`WAIT`].
fn h2c_request(addr: SocketAddr, req: http::Request<()>, body: Option<&'static [u8]>) -> H2Reply {
    runtime().block_on(async {
        tokio::time::timeout(WAIT, async {
            let mut c = h2_connect(addr, None).await;
            h2_send(&mut c, req, body.map(bytes::Bytes::from_static))
                .await
                .expect("HTTP/2 response")
        })
        .await
        .expect("HTTP/2 exchange within the time limit")
    })
}

// ---- 7: transfer-codings other than a final chunked --------------------------------------

/// An upstream answering `Transfer-Encoding: gzip` with a close-delimited gzip body. veloxy
/// cannot decode it, HTTP/2 cannot carry it, and stripping the header would hand the client
/// gzip bytes as content: 502 for every client, like the HTTP/2 path always did.
#[test]
fn transfer_coding_not_ending_in_chunked_is_502_for_every_client() {
    let mut resp =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\n".to_vec();
    resp.extend_from_slice(&[0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03]);
    let (origin, _) = raw_origin(resp, head_done);
    let v = veloxy(&h2c_config(&[origin], ""));

    let (status, head, _) = exchange(
        v.addr,
        b"GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 502, "HTTP/1.1 client: {head}");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: gzip"),
        "{head}"
    );
    let (status, head, _) = exchange(v.addr, b"GET /x HTTP/1.0\r\nHost: a.test\r\n\r\n");
    assert_eq!(status, 502, "HTTP/1.0 client: {head}");
    let r = h2c_request(v.addr, h2_get(&v.addr.to_string(), "/x", false), None);
    assert_eq!(r.status, 502, "HTTP/2 client");
}

/// `gzip, chunked` is chunked framing (RFC 9112 6.1): HTTP/1.1 clients get it verbatim and
/// the connection stays usable; the body ends where the chunks end, not at the close.
#[test]
fn codings_before_a_final_chunked_are_chunked_framing() {
    let resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let (origin, _) = raw_origin(resp.to_vec(), head_done);
    let v = veloxy(&h2c_config(&[origin], ""));
    let mut s = TcpStream::connect(v.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    for _ in 0..2 {
        s.write_all(b"GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n")
            .unwrap();
        let got = read_until(&mut s, b"\r\n0\r\n\r\n");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
        assert!(
            text.contains("\r\nTransfer-Encoding: gzip, chunked\r\n"),
            "{text}"
        );
        assert!(!text.contains("Connection: close"), "kept alive: {text}");
        assert!(text.ends_with("\r\n\r\n3\r\nabc\r\n0\r\n\r\n"), "{text}");
    }
}

/// Reads from `s` until what was read ends with `suffix` (each read bounded by its timeout).
fn read_until(s: &mut TcpStream, suffix: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(suffix) {
        match s.read(&mut buf) {
            Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
            other => panic!(
                "{other:?} before {:?}; got {:?}",
                String::from_utf8_lossy(suffix),
                String::from_utf8_lossy(&got)
            ),
        }
    }
    got
}

// ---- 8: chunk sizes beyond i64::MAX ------------------------------------------------------

/// A request chunk size of 2^63 or more reads as negative (or wraps) in servers that hold it
/// in a signed 64-bit integer: refused with 400 rather than forwarded. The origin answers as
/// soon as it has a head, so a forwarded request would come back 200.
#[test]
fn request_chunk_size_beyond_i64_is_400() {
    let (origin, _) = raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        head_done,
    );
    let v = veloxy(&simple_config(&[origin], "retries = 0"));
    for size in ["8000000000000000", "ffffffffffffffff"] {
        let raw = format!(
            "POST /up HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nabc"
        );
        let (status, head, _) = exchange(v.addr, raw.as_bytes());
        assert_eq!(status, 400, "chunk size {size}: {head}");
        assert!(head.contains("Connection: close"), "{head}");
    }
    // A well-formed chunked request on the same route still goes through.
    let raw = "POST /up HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n1\r\na\r\n0\r\n\r\n";
    assert_eq!(exchange(v.addr, raw.as_bytes()).0, 200);
}

/// The same limit on response bodies: 502 instead of relaying a size the client may misread.
#[test]
fn response_chunk_size_beyond_i64_is_502() {
    let (origin, _) = raw_origin(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8000000000000000\r\nabc".to_vec(),
        head_done,
    );
    let v = veloxy(&simple_config(&[origin], "retries = 0"));
    let (status, head, _) = exchange(
        v.addr,
        b"GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 502, "{head}");
}

// ---- 9a: request header names with underscores -------------------------------------------

/// An h2c origin that answers every request with the names of the headers it got, one a line.
fn h2c_header_echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        let names: String =
                            req.headers().keys().map(|k| format!("{k}\n")).collect();
                        let resp = http::Response::new(());
                        if let Ok(mut send) = respond.send_response(resp, false) {
                            let _ = send.send_data(bytes::Bytes::from(names), true);
                        }
                    }
                });
            }
        });
    });
    addr
}

/// What the upstream saw of a request carrying `x_user` and `x-ok`, lowercased.
fn seen_by_upstream(v: &Veloxy, over_h2: bool) -> String {
    let seen = if over_h2 {
        let req = http::Request::builder()
            .uri(format!("http://{}/echo", v.addr))
            .header("x_user", "root")
            .header("x-ok", "1")
            .body(())
            .unwrap();
        let r = h2c_request(v.addr, req, None);
        assert_eq!(r.status, 200);
        r.body_str()
    } else {
        let raw = b"GET /echo HTTP/1.1\r\nHost: a.test\r\nX_User: root\r\nX-Ok: 1\r\nConnection: close\r\n\r\n";
        let (status, _, body) = exchange(v.addr, raw);
        assert_eq!(status, 200);
        String::from_utf8_lossy(&body).into_owned()
    };
    seen.to_ascii_lowercase()
}

/// Names with `_` are dropped before forwarding unless `underscores_in_headers = true`, from
/// HTTP/1.1 and HTTP/2 clients to HTTP/1.1 upstreams alike.
#[test]
fn underscored_request_headers_are_dropped_by_default() {
    let up = upstream(&[]);
    for (keys, kept) in [("", false), ("underscores_in_headers = true", true)] {
        let v = veloxy(&h2c_config(&[up.addr], keys));
        for over_h2 in [false, true] {
            let seen = seen_by_upstream(&v, over_h2);
            assert!(seen.contains("x-ok: 1"), "h2 {over_h2}: {seen}");
            assert_eq!(
                seen.contains("x_user: root"),
                kept,
                "[server] {keys:?}, h2 {over_h2}: {seen}"
            );
        }
    }
}

/// The same for `h2c` upstream groups: HTTP/2 clients (the `framed_h2` relay) and HTTP/1.1 clients
/// (the bridge).
#[test]
fn underscored_request_headers_are_dropped_toward_h2_upstreams() {
    let origin = h2c_header_echo();
    for (keys, kept) in [("", false), ("underscores_in_headers = true", true)] {
        let v = veloxy(&config(&[origin], keys, "protocol = \"h2c\""));
        for over_h2 in [false, true] {
            let seen = seen_by_upstream(&v, over_h2);
            let names: Vec<&str> = seen.lines().collect();
            assert!(names.contains(&"x-ok"), "h2 {over_h2}: {seen}");
            assert_eq!(
                names.contains(&"x_user"),
                kept,
                "[server] {keys:?}, h2 {over_h2}: {seen}"
            );
        }
    }
}

// ---- 9b: request trailers ----------------------------------------------------------------

/// Waits until the origin has read bytes that satisfy `pred`; returns them.
fn origin_saw(rx: &mpsc::Receiver<Vec<u8>>, pred: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let got = rx
            .recv_timeout(left)
            .expect("origin read within the time limit");
        if pred(&got) {
            return got;
        }
    }
}

const TRAILERS: &str = "Content-Length: 100\r\nTransfer-Encoding: chunked\r\nHost: evil.test\r\nConnection: keep-alive\r\nTE: trailers\r\nTrailer: X-Sum\r\nUpgrade: websocket\r\nX-Sum: 42\r\nno colon here\r\n\r\n";

/// Trailer fields that an upstream merging trailers into the head could take for framing or
/// routing are dropped; others pass. The whole request in one write (veloxy's first read).
#[test]
fn request_trailers_lose_framing_and_routing_fields() {
    let (origin, rx) = raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        chunked_done,
    );
    let v = veloxy(&simple_config(&[origin], "retries = 0"));
    let raw = format!(
        "POST /t HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n{TRAILERS}"
    );
    let (status, head, _) = exchange(v.addr, raw.as_bytes());
    assert_eq!(status, 200, "{head}");
    let got = origin_saw(&rx, chunked_done);
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.ends_with("\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 42\r\n\r\n"),
        "upstream got {text:?}"
    );
}

/// The same when the body streams: the trailer section arrives over several reads, after the
/// head and first chunk were already forwarded.
#[test]
fn request_trailers_are_filtered_when_the_body_streams() {
    let (origin, rx) = raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        chunked_done,
    );
    // request_buffering = "off": the body streams to the upstream as it arrives.
    let config = simple_config(&[origin], "retries = 0")
        .replace("[server]\n", "[server]\nrequest_buffering = \"off\"\n");
    let v = veloxy(&config);
    let mut s = TcpStream::connect(v.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"POST /t HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n")
        .unwrap();
    origin_saw(&rx, |got| got.ends_with(b"3\r\nabc\r\n"));
    let (first, second) = TRAILERS.split_at(30);
    // Two writes: the section usually reaches veloxy in two reads (the unit tests in relay.rs
    // split it at every byte).
    s.write_all(format!("0\r\n{first}").as_bytes()).unwrap();
    s.write_all(second.as_bytes()).unwrap();
    let got = origin_saw(&rx, chunked_done);
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.ends_with("\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 42\r\n\r\n"),
        "upstream got {text:?}"
    );
    let got = read_until(&mut s, b"ok");
    assert!(got.starts_with(b"HTTP/1.1 200 "), "{got:?}");
}

// ---- 13: responses with hundreds of headers ------------------------------------------------

/// An upstream answering with 300 Set-Cookie headers (12 KB of head, well within the 64 KiB
/// limit): every cookie reaches HTTP/1.1 and HTTP/2 clients, instead of a 502 at 128 headers.
#[test]
fn three_hundred_set_cookie_headers_reach_http1_and_http2_clients() {
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n".to_vec();
    for i in 0..300 {
        resp.extend_from_slice(format!("Set-Cookie: c{i}=value{i}; Path=/\r\n").as_bytes());
    }
    resp.extend_from_slice(b"\r\nok");
    let (origin, _) = raw_origin(resp, head_done);
    let v = veloxy(&h2c_config(&[origin], ""));

    let (status, head, body) = exchange(
        v.addr,
        b"GET /c HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{head}");
    assert_eq!(head.matches("Set-Cookie: ").count(), 300);
    assert!(head.contains("Set-Cookie: c299=value299; Path=/\r\n"));
    assert_eq!(body, b"ok");

    let r = h2c_request(v.addr, h2_get(&v.addr.to_string(), "/c", false), None);
    assert_eq!(r.status, 200);
    let cookies: Vec<&str> = r
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap())
        .collect();
    assert_eq!(cookies.len(), 300);
    assert_eq!(cookies[299], "c299=value299; Path=/");
    assert_eq!(r.body_str(), "ok");
}
