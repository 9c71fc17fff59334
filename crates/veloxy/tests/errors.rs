//! Errors never hang: every failure gets a fast, honest status and a clean connection state.

use veloxy_testkit::*;

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

#[test]
fn refused_upstream_is_a_fast_502() {
    let (dead, _held) = veloxy_testkit::refusing_addr();
    let v = veloxy(&simple_config(&[dead], ""));
    let start = Instant::now();
    let r = get(v.addr, "/");
    assert_eq!(r.status, 502);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert!(!r.body.is_empty() && r.body.len() < 200);
}

#[test]
fn error_keeps_client_connection_when_request_was_complete() {
    let (dead, _held) = veloxy_testkit::refusing_addr();
    let v = veloxy(&simple_config(&[dead], ""));
    let mut c = Client::connect(v.addr);
    for _ in 0..2 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).status, 502);
    }
}

#[test]
fn connect_timeout_is_504() {
    // A listener whose accept queue is full: further SYNs are dropped, so connect() hangs.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    sock.listen(0).unwrap();
    let addr = sock.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        fillers.push(s);
    }
    let v = veloxy(&simple_config(&[addr], "connect_timeout = \"300ms\""));
    let start = Instant::now();
    let r = get(v.addr, "/");
    assert_eq!(r.status, 504);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn read_timeout_is_504() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], "read_timeout = \"300ms\""));
    let start = Instant::now();
    assert_eq!(get(v.addr, "/hang").status, 504);
    assert!(start.elapsed() < Duration::from_secs(3));
    // The proxy still serves.
    assert_eq!(get(v.addr, "/").status, 200);
}

#[test]
fn upstream_dropping_the_connection_is_502() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    assert_eq!(get(v.addr, "/drop").status, 502);
    assert_eq!(get(v.addr, "/").status, 200);
}

#[test]
fn no_route_is_404() {
    let up = upstream(&[]);
    let config = format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nhost = \"known.test\"\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    );
    let v = veloxy(&config);
    let r = request(
        v.addr,
        "GET / HTTP/1.1\r\nHost: unknown.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 404);
    let r = request(
        v.addr,
        "GET / HTTP/1.1\r\nHost: known.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
}

fn expect_status_and_close(v: &Veloxy, raw: &[u8], status: u16) {
    let mut c = Client::connect(v.addr);
    c.send(raw);
    let r = c.read_response(false);
    assert_eq!(
        r.status,
        status,
        "for {:?}",
        String::from_utf8_lossy(&raw[..raw.len().min(120)])
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert!(
        c.is_closed(),
        "connection must close after a malformed request"
    );
}

#[test]
fn malformed_and_oversized_requests() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    expect_status_and_close(&v, b"NOT A REQUEST\r\n\r\n", 400);
    expect_status_and_close(&v, b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n", 400);
    expect_status_and_close(&v, b"GET / HTTP/9.9\r\nHost: a\r\n\r\n", 400);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(10_000));
    expect_status_and_close(&v, long_uri.as_bytes(), 414);
    let big_head = format!(
        "GET / HTTP/1.1\r\nHost: a\r\n{}\r\n",
        "X-Fill: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(3000)
    );
    expect_status_and_close(&v, big_head.as_bytes(), 431);
    let many = format!(
        "GET / HTTP/1.1\r\nHost: a\r\n{}\r\n",
        "X: y\r\n".repeat(200)
    );
    expect_status_and_close(&v, many.as_bytes(), 431);
}

/// Each case would let a front end and a back end disagree about where a request ends.
#[test]
fn request_smuggling_shapes_are_refused() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    let cases: &[&[u8]] = &[
        // CL.TE and TE.CL
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
        // Differing duplicate Content-Length, list form, signs
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\nabcd",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
        // Obfuscated Transfer-Encoding
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        // Bad chunk sizes
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
        // Bare LF and bare CR line endings, obs-fold
        b"GET / HTTP/1.1\nHost: a\n\n",
        b"GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\rX-A: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n  folded\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",
        // Missing or duplicate Host
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        // Transfer-Encoding on HTTP/1.0
        b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ];
    for raw in cases {
        expect_status_and_close(&v, raw, 400);
    }
    // The upstream never saw a smuggled request: the next request is served normally.
    assert_eq!(get(v.addr, "/").status, 200);
}

#[test]
fn slowloris_is_cut_by_the_header_timeout() {
    let up = upstream(&[]);
    let config = simple_config(&[up.addr], "")
        .replace("workers = 1", "workers = 1\nheader_timeout = \"400ms\"");
    let v = veloxy(&config);
    let mut c = Client::connect(v.addr);
    let start = Instant::now();
    c.send(b"GET / HTTP/1.1\r\n");
    // Trickle a header byte now and then; the deadline counts from the first byte.
    let mut closed = false;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        if std::io::Write::write_all(&mut c.stream, b"X").is_err() {
            closed = true;
            break;
        }
        c.stream.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        let got = c.stream.read(&mut buf);
        c.stream.set_nonblocking(false).unwrap();
        if let Ok(n) = got {
            assert!(n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"));
            closed = true;
            break;
        }
    }
    assert!(closed, "slow client was not cut off");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn idle_keepalive_clients_are_closed() {
    let up = upstream(&[]);
    let config = simple_config(&[up.addr], "")
        .replace("workers = 1", "workers = 1\nkeepalive_timeout = \"300ms\"");
    let v = veloxy(&config);
    let mut c = Client::connect(v.addr);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
    let start = Instant::now();
    assert!(c.is_closed());
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn interim_and_final_response_in_one_read_are_both_parsed() {
    use std::io::Write;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            );
            std::thread::sleep(Duration::from_secs(5));
        }
    });
    let v = veloxy(&simple_config(&[addr], "read_timeout = \"3s\""));
    let start = Instant::now();
    // The 103 is forwarded to the HTTP/1.1 client (early_hints.rs), then the final answer.
    let mut c = Client::connect(v.addr);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(c.read_response(false).status, 103);
    let r = c.read_response(false);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn head_errors_carry_no_body_so_pipelining_stays_in_sync() {
    let up = upstream(&[]);
    let config = format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nhost = \"known.test\"\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    );
    let v = veloxy(&config);
    let mut c = Client::connect(v.addr);
    c.send(b"HEAD / HTTP/1.1\r\nHost: nope.test\r\n\r\nGET /size/3 HTTP/1.1\r\nHost: known.test\r\n\r\n");
    let head = c.read_response(true);
    assert_eq!(head.status, 404);
    assert!(head.header("content-length").is_some());
    let next = c.read_response(false);
    assert_eq!((next.status, next.body.as_slice()), (200, &b"abc"[..]));
}

#[test]
fn upstream_reset_mid_body_is_a_reset_for_the_client_not_a_clean_end() {
    use std::io::Write;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            // A close-delimited body, cut by a reset: a FIN would have meant "complete".
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npartial");
            std::thread::sleep(Duration::from_millis(100));
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            drop(s);
        }
    });
    let v = veloxy(&simple_config(&[addr], ""));
    let mut c = std::net::TcpStream::connect(v.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Write::write_all(&mut c, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = loop {
        match c.read(&mut buf) {
            Ok(0) => break "clean end of stream",
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
            Err(e) => panic!("unexpected error {e}"),
        }
    };
    assert_eq!(ended, "reset", "got {:?}", String::from_utf8_lossy(&got));
}
