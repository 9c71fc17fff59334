//! Proxying behaviour over real processes: headers, framing, keep-alive and pooling.

use veloxy_testkit::*;

fn setup() -> (Upstream, Veloxy) {
    let up = upstream(&["--name", "u1"]);
    let v = veloxy(&simple_config(&[up.addr], "keepalive = 16"));
    (up, v)
}

#[test]
fn forwards_get_with_forwarding_headers_and_without_hop_by_hop() {
    let (_up, v) = setup();
    let r = request(
        v.addr,
        "GET /echo?q=1 HTTP/1.1\r\nHost: Example.test:8080\r\nConnection: keep-alive, X-Private\r\nX-Private: secret\r\n\
         Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nUpgrade: h2c\r\nTrailer: X\r\n\
         X-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\nX-Custom: kept\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-upstream"), Some("u1"));
    let seen = r.body_str();
    let lower = seen.to_ascii_lowercase();
    assert!(seen.starts_with("GET /echo?q=1 HTTP/1.1\r\n"), "{seen}");
    assert!(
        seen.contains("Host: Example.test:8080\r\n"),
        "Host preserved: {seen}"
    );
    assert!(seen.contains("X-Custom: kept\r\n"));
    assert!(
        lower.contains("x-forwarded-for: 203.0.113.7, 127.0.0.1\r\n"),
        "{seen}"
    );
    assert!(lower.contains("x-forwarded-proto: http\r\n"), "{seen}");
    assert!(
        lower.contains("x-forwarded-host: example.test:8080\r\n"),
        "{seen}"
    );
    for gone in [
        "x-private",
        "keep-alive",
        "proxy-connection",
        "\r\nte:",
        "upgrade",
        "trailer",
        "connection:",
    ] {
        assert!(
            !lower.contains(gone),
            "{gone} must not reach the upstream: {seen}"
        );
    }
}

#[test]
fn client_keep_alive_and_upstream_pool_reuse() {
    let (_up, v) = setup();
    let mut c = Client::connect(v.addr);
    let mut conn_ids = Vec::new();
    for i in 0..5 {
        c.send(format!("GET /r{i} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        assert_eq!(r.status, 200);
        assert!(
            r.header("connection").is_none(),
            "keep-alive is implicit in 1.1"
        );
        conn_ids.push(r.header("x-conn-id").unwrap().to_string());
    }
    // All five went over one pooled upstream connection.
    assert!(conn_ids.iter().all(|id| id == &conn_ids[0]), "{conn_ids:?}");
    // A second client reuses the same idle upstream connection too.
    let r = get(v.addr, "/");
    assert_eq!(r.header("x-conn-id").unwrap(), conn_ids[0]);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_up, v) = setup();
    let mut c = Client::connect(v.addr);
    c.send(b"GET /status/201 HTTP/1.1\r\nHost: a\r\n\r\nGET /status/202 HTTP/1.1\r\nHost: a\r\n\r\nGET /status/203 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    for s in [201, 202, 203] {
        assert_eq!(c.read_response(false).status, s);
    }
    assert!(c.is_closed());
}

#[test]
fn bodiless_responses() {
    let (_up, v) = setup();
    let mut c = Client::connect(v.addr);
    c.send(b"HEAD /size/1000 HTTP/1.1\r\nHost: a\r\n\r\n");
    let r = c.read_response(true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("1000"));
    for s in [204, 304] {
        c.send(format!("GET /status/{s} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        assert_eq!(r.status, s);
        assert!(r.body.is_empty());
    }
    // The connection is still in sync after bodiless responses.
    c.send(b"GET /size/10 HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(c.read_response(false).body, b"abcdefghij");
}

#[test]
fn response_framings() {
    let (_up, v) = setup();
    let mut c = Client::connect(v.addr);
    c.send(b"GET /size/70000?chunked=1 HTTP/1.1\r\nHost: a\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body.len(), 70000);
    assert!(r
        .body
        .iter()
        .enumerate()
        .all(|(i, &b)| b == b'a' + (i % 26) as u8));
    // Close-delimited upstream body: forwarded, then the client connection closes.
    c.send(b"GET /size/5000?close=1 HTTP/1.1\r\nHost: a\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.body.len(), 5000);
}

#[test]
fn http10_client_gets_decoded_body_and_close() {
    let (_up, v) = setup();
    let r = request(v.addr, "GET /size/3000?chunked=1 HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200);
    assert!(r.header("transfer-encoding").is_none());
    assert_eq!(r.body.len(), 3000);
    // HTTP/1.0 with keep-alive is honoured.
    let mut c = Client::connect(v.addr);
    c.send(b"GET /size/10 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.header("connection"), Some("keep-alive"));
    c.send(b"GET /size/3 HTTP/1.0\r\n\r\n");
    assert_eq!(c.read_response(false).body, b"abc");
}

#[test]
fn request_bodies_content_length_and_chunked() {
    let (_up, v) = setup();
    let mut c = Client::connect(v.addr);
    c.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world");
    let r = c.read_response(false);
    assert_eq!(r.header("x-body-bytes"), Some("11"));
    c.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.header("x-body-bytes"), Some("11"));
    assert!(
        r.body_str().contains("Transfer-Encoding: chunked"),
        "{}",
        r.body_str()
    );
    // Body split across writes.
    c.send(b"PUT /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\nabc");
    std::thread::sleep(std::time::Duration::from_millis(30));
    c.send(b"def");
    let r = c.read_response(false);
    assert!(r.body_str().contains("\"bytes\":6"), "{}", r.body_str());
}

#[test]
fn expect_100_continue() {
    let (_up, v) = setup();
    let mut c = Client::connect(v.addr);
    c.send(b"POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
    let interim = c.read_response(false);
    assert_eq!(
        interim.status, 100,
        "the client is told to go on before it sends the body"
    );
    c.send(b"data");
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert!(r.body_str().contains("\"bytes\":4"));
    // An unknown expectation is refused.
    let r = request(
        v.addr,
        "POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: teapot\r\n\r\nx",
    );
    assert_eq!(r.status, 417);
}

#[test]
fn routes_by_host_and_longest_prefix() {
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let c = upstream(&["--name", "c"]);
    let config = format!(
        r#"
[server]
workers = 1
[listeners.web]
addr = "127.0.0.1:0"
[[routes]]
upstream = "a"
[[routes]]
path = "/api/"
upstream = "b"
[[routes]]
host = "*.example.test"
upstream = "c"
[[routes]]
host = "only.test"
path = "/x/"
upstream = "c"
[upstreams.a]
servers = ["{}"]
[upstreams.b]
servers = ["{}"]
[upstreams.c]
servers = ["{}"]
"#,
        a.addr, b.addr, c.addr
    );
    let v = veloxy(&config);
    let who = |host: &str, path: &str| {
        let r = request(
            v.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        r.header("x-upstream")
            .map(str::to_owned)
            .unwrap_or_else(|| r.status.to_string())
    };
    assert_eq!(who("x.test", "/"), "a");
    assert_eq!(who("x.test", "/api/users"), "b");
    assert_eq!(who("www.Example.test", "/api/users"), "c");
    assert_eq!(who("only.test", "/x/1"), "c");
    assert_eq!(who("only.test", "/api/"), "b");
}

#[test]
fn weighted_round_robin_over_backends() {
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let config = format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\", {{ addr = \"{}\", weight = 2 }}]\n",
        a.addr, b.addr
    );
    let v = veloxy(&config);
    let mut c = Client::connect(v.addr);
    let mut seq = String::new();
    for _ in 0..6 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        seq += c.read_response(false).header("x-upstream").unwrap();
    }
    assert_eq!(seq, "babbab");
}

#[test]
fn proxy_one_liner_with_workers() {
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let dir = tempfile::tempdir().unwrap();
    let (aa, ba) = (a.addr.to_string(), b.addr.to_string());
    let v = veloxy_cmd(
        std::process::Command::new(VELOXY),
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--to",
            &aa,
            "--to",
            &ba,
            "--workers",
            "2",
        ],
        dir,
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut c = Client::connect(v.addr);
    for _ in 0..4 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        seen.insert(
            c.read_response(false)
                .header("x-upstream")
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(seen.len(), 2, "round robin reaches both backends");
    // Two worker threads, each with its own runtime.
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", v.proc.pid()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .filter(|n| n.starts_with("veloxy-w"))
        .collect();
    assert_eq!(threads.len(), 2, "{threads:?}");
}

/// `[server] io` (issue 18's switch): `"epoll"` and `"io_uring"` both load and proxy over
/// HTTP/1.1 and HTTP/2; io_uring is not built in, so that value is served with epoll and the
/// log says so.
#[test]
fn both_io_modes_serve_http1_and_http2() {
    let up = upstream(&["--name", "a"]);
    for mode in ["epoll", "io_uring"] {
        let config = simple_config(&[up.addr], "")
            .replace("workers = 1", &format!("workers = 1\nio = \"{mode}\""))
            .replace(
                "addr = \"127.0.0.1:0\"",
                "addr = \"127.0.0.1:0\"\nhttp2 = true",
            );
        let v = veloxy(&config);
        let mut c = Client::connect(v.addr);
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        let r = c.read_response(false);
        assert_eq!(
            (r.status, r.header("x-upstream")),
            (200, Some("a")),
            "{mode}"
        );
        runtime().block_on(async {
            let mut h2 = h2_connect(v.addr, None).await;
            let r = h2_send(&mut h2, h2_get("a", "/", false), None)
                .await
                .unwrap();
            assert_eq!(
                (r.status, r.header("x-upstream")),
                (200, Some("a")),
                "{mode}"
            );
        });
        let warned = v
            .proc
            .log_text()
            .contains("server.io: warning: io_uring is not built in");
        assert_eq!(warned, mode == "io_uring", "{mode}: {}", v.proc.log_text());
    }
}
