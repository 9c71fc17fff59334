//! Defects of issue 34, each the same over every client protocol now: request bodies of
//! search-gateway routes are capped over HTTP/1 as over HTTP/2 (1); a route's
//! `max_concurrency` slot is taken by cache fills and search jobs, and only once the buffered
//! part of the body is read (2); HTTP/1 clients to h2/h2c groups are retried (3); HTTP/2 and
//! HTTP/3 bodies to h2 groups are held to `max_body_bytes` and `body_timeout` (4).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use veloxy_testkit::*;

/// A search gateway in front of the test backend (it answers `/_search`), with the query
/// cache on: the route whose HTTP/1 chunked bodies were read with no limit.
fn search_gateway(node: std::net::SocketAddr) -> Veloxy {
    veloxy(&format!(
        "[server]\nworkers = 1\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [caches.q]\nmemory = \"16MiB\"\n\
         [[routes]]\nupstream = \"es\"\n\
         search = {{ query_cache = \"q\", ttl = \"1m\" }}\n\
         [upstreams.es]\nservers = [\"{node}\"]\n\
         search = {{ kind = \"opensearch\", discover = \"0s\" }}\n"
    ))
}

/// Sends a chunked POST of `total` bytes in 64 KiB chunks (stopping early if the proxy
/// closes) and returns the status line's code.
fn chunked_post(addr: std::net::SocketAddr, path: &str, total: usize) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: es\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0;
    while sent < total {
        let n = chunk.len().min(total - sent);
        let mut frame = format!("{n:x}\r\n").into_bytes();
        frame.extend_from_slice(&chunk[..n]);
        frame.extend_from_slice(b"\r\n");
        if s.write_all(&frame).is_err() {
            break;
        }
        sent += n;
    }
    let _ = s.write_all(b"0\r\n\r\n");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Defect 1: an HTTP/1 chunked `_search` body on a query-cached route is capped like a
/// declared one (1 MiB for queries): 413, not read whole into memory.
#[test]
fn http1_chunked_search_bodies_are_capped() {
    let node = upstream(&[]);
    let v = search_gateway(node.addr);
    assert_eq!(chunked_post(v.addr, "/idx/_search", 3 << 20), 413);
    // A small chunked query goes through.
    assert_ne!(chunked_post(v.addr, "/idx/_search", 100), 413);
    // HTTP/2 without a declared length: the same cap (this path had it already).
    let status = http2::runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{}/idx/_search", v.addr))
            .body(())
            .unwrap();
        h2_send(&mut c, req, Some(bytes::Bytes::from(vec![b' '; 3 << 20])))
            .await
            .map(|r| r.status)
            .unwrap_or(0)
    });
    assert_eq!(status, 413);
}

/// The status of a one-shot HTTP/1.1 request (`Connection: close`).
fn h1(addr: std::net::SocketAddr, method: &str, path: &str) -> u16 {
    request(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )
    .status
}

/// The status of one HTTP/2 request (h2c), 0 when the stream failed.
async fn h2(addr: std::net::SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> u16 {
    let mut c = h2_connect(addr, None).await;
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(())
        .unwrap();
    let body = body.map(bytes::Bytes::copy_from_slice);
    h2_send(&mut c, req, body).await.map_or(0, |r| r.status)
}

/// Runs `slow` (a request that holds its route for a while) on another thread, then, while it
/// runs, `probe`; returns (slow's status, probe's status).
fn while_held(
    slow: impl FnOnce() -> u16 + Send + 'static,
    probe: impl FnOnce() -> u16,
) -> (u16, u16) {
    let t = std::thread::spawn(slow);
    std::thread::sleep(Duration::from_millis(400));
    let probed = probe();
    (t.join().unwrap(), probed)
}

/// A veloxy whose only route has `max_concurrency = 1`, `queue = 0` and `extra` route keys,
/// over the test backend `node` (h2c on the plain listener).
fn one_slot(node: std::net::SocketAddr, server: &str, extra: &str, group: &str) -> Veloxy {
    veloxy(&format!(
        "[server]\nworkers = 1\n{server}\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [caches.c]\nmemory = \"16MiB\"\n\
         [[routes]]\nupstream = \"b\"\nmax_concurrency = 1\nqueue = 0\n{extra}\n\
         [upstreams.b]\nservers = [\"{node}\"]\n{group}\n"
    ))
}

/// Defect 2: a cache fill holds the route's concurrency slot while it waits for the
/// upstream, over HTTP/1.1 (it took none) as over HTTP/2.
#[test]
fn cache_fills_hold_a_concurrency_slot() {
    let node = upstream(&[]);
    let v = one_slot(node.addr, "", "cache = { store = \"c\" }", "");
    let addr = v.addr;
    let (slow, probe) = while_held(
        move || h1(addr, "GET", "/delay/1500"),
        || h1(addr, "POST", "/"),
    );
    assert_eq!(
        (slow, probe),
        (200, 503),
        "HTTP/1.1: the fill holds the slot"
    );
    let (slow, probe) = runtime().block_on(async move {
        let slow = tokio::spawn(async move { h2(addr, "GET", "/delay/1501", None).await });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let probe = h2(addr, "POST", "/", None).await;
        (slow.await.unwrap(), probe)
    });
    assert_eq!((slow, probe), (200, 503), "HTTP/2: the fill holds the slot");
}

/// Defect 2: a search job needs the route's concurrency slot like any request: refused
/// while a slow request holds it, over HTTP/1.1 (it took none) as over HTTP/2.
#[test]
fn search_jobs_take_a_concurrency_slot() {
    let node = upstream(&[]);
    let v = one_slot(
        node.addr,
        "",
        "search = { query_cache = \"c\", ttl = \"1m\" }",
        "search = { kind = \"opensearch\", discover = \"0s\" }",
    );
    let addr = v.addr;
    let (slow, probe) = while_held(
        move || h1(addr, "GET", "/delay/1500"),
        || h1(addr, "POST", "/idx/_search"),
    );
    assert_eq!(
        (slow, probe),
        (200, 503),
        "HTTP/1.1: the job waits for a slot"
    );
    assert_eq!(
        h1(addr, "POST", "/idx/_search"),
        200,
        "a free slot: the job runs"
    );
    let (slow, probe) = runtime().block_on(async move {
        let slow = tokio::spawn(async move { h2(addr, "GET", "/delay/1500", None).await });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let probe = h2(addr, "POST", "/idx/_search", Some(b"{}")).await;
        (slow.await.unwrap(), probe)
    });
    assert_eq!(
        (slow, probe),
        (200, 503),
        "HTTP/2: the job waits for a slot"
    );
}

/// Sends the head of a POST to `uri` and its first body bytes over HTTP/2 (no declared
/// length), the rest `after` later (unless the answer came first); returns the stream's
/// response status (0: it failed).
async fn h2_trickle(
    c: &mut h2::client::SendRequest<bytes::Bytes>,
    uri: String,
    after: Duration,
) -> u16 {
    let req = http::Request::post(uri).body(()).unwrap();
    let mut ready = c.clone().ready().await.unwrap();
    let (mut resp, mut stream) = ready.send_request(req, false).unwrap();
    stream
        .send_data(bytes::Bytes::from_static(b"first "), false)
        .unwrap();
    // An answer before the rest is sent (408) ends the wait.
    tokio::select! {
        r = &mut resp => return r.map_or(0, |r| r.status().as_u16()),
        _ = tokio::time::sleep(after) => {}
    }
    if stream
        .send_data(bytes::Bytes::from_static(b"last"), true)
        .is_err()
    {
        return 0;
    }
    resp.await.map_or(0, |r| r.status().as_u16())
}

/// Defect 2: an HTTP/2 client trickling its body holds no concurrency slot while the
/// buffered part is read: another request gets through meanwhile (it got 503).
#[test]
fn slow_h2_senders_hold_no_concurrency_slot() {
    let node = upstream(&[]);
    let v = one_slot(node.addr, "", "", "");
    let addr = v.addr;
    let (slow, probe) = runtime().block_on(async move {
        let slow = tokio::spawn(async move {
            let mut c = h2_connect(addr, None).await;
            h2_trickle(
                &mut c,
                format!("http://{addr}/sink"),
                Duration::from_millis(1500),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let probe = h2(addr, "GET", "/", None).await;
        (slow.await.unwrap(), probe)
    });
    assert_eq!((slow, probe), (200, 200));
}

/// A veloxy serving h2c prior knowledge on its plain listener (`http2 = true`) in front of
/// `node`: the HTTP/2 backend of the tests below.
fn h2c_backend(node: std::net::SocketAddr, server: &str) -> Veloxy {
    veloxy(&format!(
        "[server]\nworkers = 1\n{server}\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"b\"\n\
         [upstreams.b]\nservers = [\"{node}\"]\n"
    ))
}

/// Defect 3: HTTP/1 clients to an h2c group retry like HTTP/2 clients: a backend that
/// refuses connections is skipped (502 before), and a `retry_on` status is retried.
#[test]
fn http1_clients_to_h2_groups_retry() {
    let node = upstream(&[]);
    let live = h2c_backend(node.addr, "");
    let (dead, _held) = veloxy_testkit::refusing_addr();
    let front = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"g\"\n\
         [upstreams.g]\nservers = [\"{dead}\", \"{}\"]\nprotocol = \"h2c\"\nretries = 1\n",
        live.addr
    ));
    for i in 0..4 {
        assert_eq!(h1(front.addr, "GET", "/"), 200, "HTTP/1.1 request {i}");
        let status = runtime().block_on(h2(front.addr, "GET", "/", None));
        assert_eq!(status, 200, "HTTP/2 request {i}");
    }
    // A backend answering 503 to everything first: retry_on moves the request on.
    let busy = veloxy(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nrespond = { status = 503, body = \"busy\\n\" }\n",
    );
    let front = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"g\"\n\
         [upstreams.g]\nservers = [\"{}\", \"{}\"]\nprotocol = \"h2c\"\nretries = 1\n\
         retry_on = [503]\n",
        busy.addr, live.addr
    ));
    for i in 0..4 {
        assert_eq!(h1(front.addr, "GET", "/"), 200, "HTTP/1.1 request {i}");
    }
}

/// A site (TLS with HTTP/3 on `web`, h2c on `plain`) with `body_timeout = 1s` whose route
/// caps bodies at 64 KiB and goes to an h2c group: a veloxy (body_timeout 30s) in front of
/// the test backend. Returns the site and what it must keep running.
fn capped_h2_site() -> (Site, Veloxy, Upstream) {
    let node = upstream(&[]);
    let back = h2c_backend(node.addr, "body_timeout = \"30s\"");
    let site = Site::start_with(
        "body_timeout = \"1s\"",
        "http3 = true\n",
        "http2 = true\n",
        &format!(
            "[[routes]]\nupstream = \"g\"\nmax_body_bytes = \"64KiB\"\n\
             [upstreams.g]\nservers = [\"{}\"]\nprotocol = \"h2c\"\n",
            back.addr
        ),
    );
    (site, back, node)
}

/// Defect 4: HTTP/2 and HTTP/3 bodies of unknown length to an h2 group are capped at
/// `max_body_bytes` (413; they streamed through whole before).
#[test]
fn h2_and_h3_bodies_to_h2_groups_are_capped() {
    let (site, _back, _node) = capped_h2_site();
    let plain = site.addr("plain");
    let big = vec![b'x'; 1 << 20];
    let status = runtime().block_on(h2(plain, "POST", "/sink", Some(&big)));
    assert_eq!(status, 413, "HTTP/2");
    // Within the cap: through.
    let status = runtime().block_on(h2(plain, "POST", "/sink", Some(&big[..1000])));
    assert_eq!(status, 200, "HTTP/2, small");
    let ca = site.pki.ca_pem.clone();
    let web = site.addr("web");
    let status = runtime().block_on(async move {
        let mut c = h3_connect(web, "localhost", &ca).await.unwrap();
        let req = http::Request::post("https://localhost/sink")
            .body(())
            .unwrap();
        h3_send(&mut c, req, Some(big.into()))
            .await
            .map(|r| r.status)
    });
    assert_eq!(status, Ok(413), "HTTP/3");
}

/// Defect 4: an HTTP/2 or HTTP/3 body to an h2 group that stalls past `body_timeout` ends
/// the exchange with 408 (it waited for the backend's own, longer, timeout before).
#[test]
fn stalled_h2_and_h3_bodies_to_h2_groups_time_out() {
    let (site, _back, _node) = capped_h2_site();
    let plain = site.addr("plain");
    let t0 = std::time::Instant::now();
    let status = runtime().block_on(async move {
        let mut c = h2_connect(plain, None).await;
        let uri = format!("http://{plain}/sink");
        tokio::time::timeout(
            Duration::from_secs(10),
            h2_trickle(&mut c, uri, Duration::from_secs(8)),
        )
        .await
        .unwrap_or(0)
    });
    assert_eq!(status, 408, "HTTP/2");
    assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
    let ca = site.pki.ca_pem.clone();
    let web = site.addr("web");
    let t0 = std::time::Instant::now();
    let status = runtime().block_on(async move {
        let mut c = h3_connect(web, "localhost", &ca).await.unwrap();
        let req = http::Request::post("https://localhost/sink")
            .body(())
            .unwrap();
        let mut stream = c.send_request(req).await.unwrap();
        stream
            .send_data(bytes::Bytes::from_static(b"first "))
            .await
            .unwrap();
        match tokio::time::timeout(Duration::from_secs(8), stream.recv_response()).await {
            Ok(Ok(r)) => r.status().as_u16(),
            _ => 0,
        }
    });
    assert_eq!(status, 408, "HTTP/3");
    assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
}

/// Defect 2: an HTTP/1 client trickling its body to an h2c group holds no concurrency slot
/// while the body is read (the bridge took the slot first: 503 for the request beside it).
#[test]
fn slow_h1_senders_to_h2_groups_hold_no_concurrency_slot() {
    let node = upstream(&[]);
    let back = h2c_backend(node.addr, "");
    let v = one_slot(back.addr, "", "", "protocol = \"h2c\"");
    let addr = v.addr;
    let (slow, probe) = while_held(
        move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let head = "POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\nConnection: close\r\n\r\nfirst";
            s.write_all(head.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            s.write_all(b" last").unwrap();
            read_to_close(&mut s).0
        },
        || h1(addr, "GET", "/"),
    );
    assert_eq!((slow, probe), (200, 200));
}
