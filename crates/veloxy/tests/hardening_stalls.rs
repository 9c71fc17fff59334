//! Hostile or broken peers that stall: clients that stop reading (HTTP/1) or never open their
//! flow-control window (HTTP/2), slow request bodies, upstreams that send interim responses
//! forever or a Content-Length on a 204, and memory after a burst of idle connections.
//! Each test fails without the fix it covers (issue 10, defects 2, 3, 6, 10 and 11).

use veloxy_testkit::*;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One listener (h2c allowed), one route, one group with `max_connections = 1`, so a request
/// that holds its upstream connection makes every other request a 503.
fn one_connection_config(up: SocketAddr, server_keys: &str) -> String {
    format!(
        "[server]\nworkers = 1\n{server_keys}\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{up}\"]\nmax_connections = 1\nretries = 0\n"
    )
}

/// Waits until a plain GET through veloxy gets a 200 (the upstream connection is free).
fn upstream_frees_within(addr: SocketAddr, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    eventually(limit, || get(addr, "/").status == 200).then(|| start.elapsed())
}

#[test]
fn http1_client_that_stops_reading_releases_its_upstream_after_send_timeout() {
    let up = upstream(&[]);
    let v = veloxy(&one_connection_config(up.addr, "send_timeout = \"1s\""));
    // A large response the client never reads: veloxy's writes stall once the socket
    // buffers are full, holding the only upstream connection.
    let mut hog = TcpStream::connect(v.addr).unwrap();
    hog.write_all(b"GET /size/400000000 HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || get(v.addr, "/").status == 503),
        "the stalled download should hold the only upstream connection"
    );
    let freed = upstream_frees_within(v.addr, Duration::from_secs(8));
    assert!(
        freed.is_some(),
        "upstream connection still held 8 s after a 1 s send_timeout"
    );
    drop(hog);
}

#[test]
fn http2_stream_with_no_window_releases_its_upstream_after_send_timeout() {
    let up = upstream(&[]);
    let v = veloxy(&one_connection_config(up.addr, "send_timeout = \"1s\""));
    let authority = v.addr.to_string();
    runtime().block_on(async {
        let tcp = tokio::net::TcpStream::connect(v.addr).await.unwrap();
        // Initial stream window 0: veloxy may send headers, never a DATA byte.
        let (client, conn) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, bytes::Bytes>(tcp)
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut client = client.ready().await.unwrap();
        let (resp, _) = client
            .send_request(h2_get(&authority, "/size/10000000", false), true)
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), resp)
            .await
            .expect("response head")
            .unwrap();
        assert_eq!(resp.status(), 200);
        let addr = v.addr;
        let held = tokio::task::spawn_blocking(move || get(addr, "/").status)
            .await
            .unwrap();
        assert_eq!(held, 503, "the parked stream should hold the upstream");
        let freed = tokio::task::spawn_blocking(move || {
            upstream_frees_within(addr, Duration::from_secs(8))
        })
        .await
        .unwrap();
        assert!(
            freed.is_some(),
            "upstream connection still held 8 s after a 1 s send_timeout"
        );
    });
    assert!(
        v.proc.log_text().contains("send timeout"),
        "{}",
        v.proc.log_text()
    );
}

#[test]
fn slow_request_body_costs_no_upstream_connection_and_gets_408() {
    let up = upstream(&[]);
    let v = veloxy(&one_connection_config(up.addr, "body_timeout = \"1s\""));
    // A POST (not retryable) whose body stalls after 10 of 1000 bytes.
    let mut slow = Client::connect(v.addr);
    slow.send(b"POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n0123456789");
    // While it stalls, the only upstream connection is free for others.
    let start = Instant::now();
    for _ in 0..3 {
        assert_eq!(get(v.addr, "/").status, 200, "slow body took the upstream");
    }
    let r = slow.read_response(false);
    assert_eq!(r.status, 408, "{}", r.head);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(slow.is_closed());
}

#[test]
fn stalled_body_of_a_streamed_request_gets_408() {
    let up = upstream(&[]);
    // Bodies over retry_body_limit stream to the upstream as they arrive.
    let v = veloxy(&format!(
        "{}retry_body_limit = 16\n",
        one_connection_config(up.addr, "body_timeout = \"1s\"")
    ));
    let mut slow = Client::connect(v.addr);
    slow.send(b"POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n0123456789");
    let start = Instant::now();
    let r = slow.read_response(false);
    assert_eq!(r.status, 408, "{}", r.head);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // The upstream connection holding a partial request was dropped, not kept.
    assert!(upstream_frees_within(v.addr, Duration::from_secs(3)).is_some());
}

#[test]
fn request_buffering_off_streams_bodies_as_before() {
    let up = upstream(&[]);
    let v = veloxy(&one_connection_config(
        up.addr,
        "body_timeout = \"2s\"\nrequest_buffering = \"off\"",
    ));
    let mut slow = Client::connect(v.addr);
    slow.send(b"POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n0123456789");
    // The POST streams, so it holds the upstream connection while its body stalls.
    assert!(eventually(Duration::from_secs(2), || get(v.addr, "/")
        .status
        == 503));
    assert_eq!(slow.read_response(false).status, 408);
}

/// An upstream that answers every request with `102 Processing` once per 200 ms, forever.
fn processing_forever() -> SocketAddr {
    tcp_origin(|mut s| {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if s.write_all(b"HTTP/1.1 102 Processing\r\n\r\n").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

#[test]
fn interim_responses_do_not_extend_read_timeout() {
    let up = processing_forever();
    let v = veloxy(
        &simple_config(&[up], "read_timeout = \"1s\"\nretries = 0").replace(
            "addr = \"127.0.0.1:0\"",
            "addr = \"127.0.0.1:0\"\nhttp2 = true",
        ),
    );
    let start = Instant::now();
    // HTTP/1.1 clients get the first few 102s forwarded (at most 8), then the 504.
    let mut c = Client::connect(v.addr);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    let mut interims = 0;
    let r = loop {
        let r = c.read_response(false);
        if r.status >= 200 {
            break r;
        }
        interims += 1;
    };
    assert_eq!(r.status, 504, "{}", r.head);
    assert!(
        (1..=8).contains(&interims),
        "{interims} interim responses forwarded"
    );
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "final head awaited {:?} with a 1 s read_timeout",
        start.elapsed()
    );
    // The same bound for HTTP/2 clients.
    let authority = v.addr.to_string();
    runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        let start = Instant::now();
        let r = h2_send(&mut c, h2_get(&authority, "/", false), None)
            .await
            .unwrap();
        assert_eq!(r.status, 504);
        assert!(start.elapsed() < Duration::from_secs(4));
    });
}

/// An upstream answering `head` (a complete response head with no body) to every request.
fn fixed_head(head: &'static [u8]) -> SocketAddr {
    tcp_origin(move |mut s| {
        let mut buf = [0u8; 4096];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {
            if s.write_all(head).is_err() {
                return;
            }
        }
    })
}

#[test]
fn no_content_statuses_with_a_content_length_reach_http2_clients() {
    for (head, status) in [
        (
            &b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"[..],
            204u16,
        ),
        (
            &b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"[..],
            304,
        ),
    ] {
        let up = fixed_head(head);
        let v = veloxy(&format!(
            "{}\n",
            simple_config(&[up], "").replace(
                "addr = \"127.0.0.1:0\"",
                "addr = \"127.0.0.1:0\"\nhttp2 = true"
            )
        ));
        let authority = v.addr.to_string();
        runtime().block_on(async {
            let mut c = h2_connect(v.addr, None).await;
            for _ in 0..2 {
                let r = h2_send(&mut c, h2_get(&authority, "/", false), None)
                    .await
                    .unwrap_or_else(|e| panic!("{status} over HTTP/2: {e}"));
                assert_eq!(r.status, status);
                assert!(r.body.is_empty());
            }
        });
        // HTTP/1.1 clients get the status without a body too.
        let mut c = Client::connect(v.addr);
        for _ in 0..2 {
            c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
            assert_eq!(c.read_response(false).status, status);
        }
        assert!(v
            .proc
            .log_text()
            .contains("Content-Length on a response without content"));
    }
}

#[test]
fn memory_is_returned_after_a_burst_of_idle_connections() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    assert_eq!(get(v.addr, "/").status, 200);
    let base = v.proc.rss_kib();
    // A burst: 3000 keep-alive clients that each made one request, then sit idle.
    let mut conns = Vec::new();
    for _ in 0..3000 {
        let mut c = Client::connect(v.addr);
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        conns.push(c);
    }
    for c in &mut conns {
        assert_eq!(c.read_response(false).status, 200);
    }
    // Idle connections hold no read buffer (they give it back between requests).
    let mut idle = 0;
    let lean = eventually(Duration::from_secs(5), || {
        idle = v.proc.rss_kib();
        (idle - base) / 3000 < 8
    });
    drop(conns);
    // Returned: most of what the burst added (without the trim, RSS stays near its peak),
    // and at most 8 MiB above the start. What stays is the allocator's fragmentation around
    // the runtime's own tables; it measured 2.5-4.9 MiB over 14 runs on this machine (the
    // old bound of 4 MiB failed 2 runs in 8 on unchanged code).
    let mut after = 0;
    let returned = eventually(Duration::from_secs(10), || {
        after = v.proc.rss_kib();
        after <= base + 8 * 1024 && (after.saturating_sub(base)) * 4 <= (idle - base) * 3
    });
    eprintln!("RSS: {base} KiB before, {idle} KiB with 3000 idle connections, {after} KiB after they closed");
    assert!(
        lean,
        "idle connections cost {} KiB each",
        (idle - base) / 3000
    );
    assert!(
        returned,
        "RSS stayed at {after} KiB after the burst (base {base} KiB)"
    );
}

/// An HTTP/2 POST to /sink that sends 10 bytes of its body, then stalls. Returns the POST's
/// status and whether the stalled POST held the only upstream connection meanwhile.
fn http2_stalled_post(server_keys: &str, content_length: Option<u64>) -> (u16, bool) {
    let up = upstream(&[]);
    let v = veloxy(&one_connection_config(up.addr, server_keys));
    let (addr, authority) = (v.addr, v.addr.to_string());
    runtime().block_on(async {
        let c = h2_connect(addr, None).await;
        let mut req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{authority}/sink"));
        if let Some(n) = content_length {
            req = req.header("content-length", n);
        }
        let mut ready = c.clone().ready().await.unwrap();
        let (resp, mut body) = ready.send_request(req.body(()).unwrap(), false).unwrap();
        body.send_data(bytes::Bytes::from_static(b"0123456789"), false)
            .unwrap();
        // A request on the same connection after the POST's frames: once it is answered,
        // veloxy has read the POST's head and its bytes.
        let mut c2 = c.clone();
        let r = h2_send(&mut c2, h2_get(&authority, "/", false), None).await;
        let followed = r.map(|r| r.status).unwrap_or(0);
        // Holding the upstream shows at once (503s); not holding it must last while the POST
        // stalls: both are checked against a fresh client.
        let held = tokio::task::spawn_blocking(move || {
            eventually(Duration::from_millis(500), || get(addr, "/").status == 503)
        })
        .await
        .unwrap();
        assert!(followed == 200 || held, "GET after the POST: {followed}");
        let resp = tokio::time::timeout(Duration::from_secs(10), resp)
            .await
            .expect("an answer within body_timeout")
            .unwrap();
        (resp.status().as_u16(), held)
    })
}

#[test]
fn http2_stalled_body_gets_408_and_costs_no_upstream_connection() {
    let keys = "body_timeout = \"1s\"\nrequest_buffering = \"auto\"";
    // A declared length within retry_body_limit, and a body of unknown length: both are read
    // before an upstream connection is taken, as for HTTP/1.
    assert_eq!(http2_stalled_post(keys, Some(1000)), (408, false));
    assert_eq!(http2_stalled_post(keys, None), (408, false));
}

#[test]
fn http2_request_buffering_off_streams_bodies() {
    let keys = "body_timeout = \"1s\"\nrequest_buffering = \"off\"";
    // A POST is not retryable, so with "off" its body streams: the upstream is taken.
    assert_eq!(http2_stalled_post(keys, Some(1000)), (408, true));
}

/// A response whose upstream pauses mid-body (an SSE stream between events) is not the
/// client's stall: send_timeout must not cut it.
#[test]
fn http2_send_timeout_spares_bodies_waiting_for_their_upstream() {
    let up = tcp_origin(|mut s| {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst");
        std::thread::sleep(Duration::from_millis(2500));
        let _ = s.write_all(b"-last");
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    let v = veloxy(&one_connection_config(up, "send_timeout = \"1s\""));
    let authority = v.addr.to_string();
    runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        let r = h2_send(&mut c, h2_get(&authority, "/", false), None)
            .await
            .unwrap();
        assert_eq!((r.status, r.body_str().as_str()), (200, "first-last"));
    });
}

/// Issue 31, item 11: on an h2c-enabled listener the header timeout runs from the first byte
/// of an HTTP/1 head (the preface sniff reads it), not from the read after it: a head that
/// stalls gets its 408 after one `header_timeout`, not nearly two.
#[test]
fn h2c_listeners_time_a_stalled_head_from_its_first_byte() {
    let v = veloxy(
        "[server]\nworkers = 1\nheader_timeout = \"2s\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nrespond = { body = \"ok\" }\n",
    );
    let mut c = std::net::TcpStream::connect(v.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let started = std::time::Instant::now();
    c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    // A slow client: its second piece comes 1.5 s later, then nothing.
    std::thread::sleep(Duration::from_millis(1500));
    c.write_all(b"Host: a\r\n").unwrap();
    let (status, _) = read_to_close(&mut c);
    let took = started.elapsed();
    assert_eq!(status, 408);
    // 2 s, plus slack for a loaded machine; the old clock started at the second read and
    // answered after 3.5 s.
    assert!(took < Duration::from_millis(2900), "408 after {took:?}");
}
