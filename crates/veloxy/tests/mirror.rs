//! A route's `mirror` (issue 37, "mirrors"): copies of the requests reach a shadow group with
//! their method, rewritten path, headers and body, over HTTP/1.1, HTTP/2 and HTTP/3; the
//! primary's answer is neither changed nor delayed by a slow or dead shadow; a body over the
//! bound is not copied and reaches the primary whole; `percent = 0`, a refused request and a
//! cache hit are not copied. Real binary, real origins (the test kit's scripted origin
//! records what it saw).

use std::time::{Duration, Instant};

use bytes::Bytes;
use veloxy_testkit::*;

/// Waits until `origin` has seen `n` requests (bounded).
fn seen(origin: &ScriptOrigin, n: usize) -> Vec<SeenRequest> {
    assert!(
        eventually(Duration::from_secs(5), || origin.hits() >= n),
        "the shadow saw {} requests, not {n}",
        origin.hits()
    );
    origin.requests()
}

fn metric(v: &Veloxy, name: &str) -> u64 {
    let text = admin_call(v, "GET", "/metrics", "").body_str();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

fn post_h2(s: &Site, path: &str, body: &'static [u8], length: bool) -> H2Reply {
    let mut req = h2_get("localhost", path, true);
    *req.method_mut() = http::Method::POST;
    req.headers_mut()
        .insert("x-custom", http::HeaderValue::from_static("h2"));
    if length {
        req.headers_mut()
            .insert("content-length", http::HeaderValue::from(body.len()));
    }
    s.h2_req(req, Some(Bytes::from_static(body)))
}

#[test]
fn mirrored_requests_reach_the_shadow_whole_over_http1_http2_and_http3() {
    let primary = script_origin(|_| Scripted::ok("primary"));
    let shadow = script_origin(|_| Scripted::ok("shadow"));
    let s = Site::start_with(
        "admin = \"127.0.0.1:0\"",
        "http3 = true\n",
        "",
        &format!(
            "[[routes]]\npath = \"/api/\"\nstrip_prefix = true\nupstream = \"app\"\n\
             request_headers = {{ set = {{ \"X-Set\" = \"yes\" }} }}\n\
             mirror = {{ upstream = \"shadow\", percent = 100 }}\n\
             [[routes]]\npath = \"/headonly/\"\nupstream = \"app\"\n\
             mirror = [{{ upstream = \"shadow\", body = false, host = \"shadow.internal\" }}]\n\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.shadow]\nservers = [\"{}\"]\n",
            primary.addr, shadow.addr
        ),
    );
    // HTTP/1.1, a body of declared length.
    let (status, raw) = s.h1_raw(
        "POST /api/thing?q=1 HTTP/1.1\r\nHost: localhost\r\nX-Custom: one\r\n\
         Content-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw_body(&raw), "primary");
    let r = &seen(&shadow, 1)[0];
    assert_eq!(
        (r.method.as_str(), r.target.as_str()),
        ("POST", "/thing?q=1")
    );
    assert_eq!(r.header("x-custom"), Some("one"));
    assert_eq!(r.header("x-set"), Some("yes"));
    assert_eq!(r.header("host"), Some("localhost"));
    assert_eq!(r.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(r.body, b"hello");
    assert_eq!(
        primary.requests()[0].body,
        b"hello",
        "the primary's body is intact"
    );
    // HTTP/1.1, chunked.
    let (status, _) = s.h1_raw(
        "PUT /api/chunked HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    );
    assert_eq!(status, 200);
    let r = &seen(&shadow, 2)[1];
    assert_eq!((r.method.as_str(), r.target.as_str()), ("PUT", "/chunked"));
    assert_eq!(r.body, b"abcde");
    assert_eq!(primary.requests()[1].body, b"abcde");
    // HTTP/2, with and without a declared length.
    for (i, length) in [(3, true), (4, false)] {
        let r = post_h2(&s, "/api/h2?x=2", b"h2 body", length);
        assert_eq!((r.status, r.body_str()), (200, "primary".to_owned()));
        let r = &seen(&shadow, i)[i - 1];
        assert_eq!((r.method.as_str(), r.target.as_str()), ("POST", "/h2?x=2"));
        assert_eq!(r.header("x-custom"), Some("h2"));
        assert_eq!(r.header("x-set"), Some("yes"));
        assert_eq!(r.header("host"), Some("localhost"));
        assert_eq!(r.body, b"h2 body", "length declared: {length}");
        assert_eq!(primary.requests()[i - 1].body, b"h2 body");
    }
    // `body = false`: the head only; `host`: the copy's own Host.
    let (status, _) = s.h1_raw(
        "POST /headonly/x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\
         Connection: close\r\n\r\nabc",
    );
    assert_eq!(status, 200);
    let r = &seen(&shadow, 5)[4];
    assert_eq!(
        (r.method.as_str(), r.target.as_str()),
        ("POST", "/headonly/x")
    );
    assert!(r.body.is_empty());
    assert_eq!(r.header("host"), Some("shadow.internal"));
    assert_eq!(primary.requests()[4].body, b"abc");
    assert_eq!(primary.requests()[4].header("host"), Some("localhost"));
    // HTTP/3, a body of unknown length.
    let r = runtime().block_on(async {
        let mut c = h3_connect(s.addr("web"), "localhost", &s.pki.ca_pem)
            .await
            .expect("h3 connect");
        let mut req = h3_get("localhost", "/api/h3");
        *req.method_mut() = http::Method::PUT;
        h3_send(&mut c, req, Some(Bytes::from_static(b"over quic")))
            .await
            .unwrap()
    });
    assert_eq!((r.status, r.body_str()), (200, "primary".to_owned()));
    let r = &seen(&shadow, 6)[5];
    assert_eq!((r.method.as_str(), r.target.as_str()), ("PUT", "/h3"));
    assert_eq!(r.body, b"over quic");
    assert_eq!(primary.requests()[5].body, b"over quic");
    assert_eq!(metric(&s.v, "veloxy_mirrored_total"), 6);
}

#[test]
fn a_slow_or_dead_shadow_never_delays_or_changes_the_primary() {
    let primary = script_origin(|_| Scripted::ok("primary"));
    let slow = script_origin(|_| Scripted::new(500).delay(Duration::from_secs(3)));
    let s = Site::start(
        "admin = \"127.0.0.1:0\"",
        "",
        &format!(
            "[[routes]]\npath = \"/slow/\"\nupstream = \"app\"\n\
             mirror = {{ upstream = \"slow\" }}\n\
             [[routes]]\npath = \"/dead/\"\nupstream = \"app\"\n\
             mirror = {{ upstream = \"dead\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.slow]\nservers = [\"{}\"]\nconnect_timeout = \"500ms\"\nread_timeout = \"1s\"\n\
             [upstreams.dead]\nservers = [\"127.0.0.1:9\"]\n",
            primary.addr, slow.addr
        ),
    );
    for path in ["/slow/a", "/dead/a"] {
        let started = Instant::now();
        let (status, raw) = s.h1(path, "");
        assert_eq!((status, raw_body(&raw)), (200, "primary"), "{path}");
        let r = s.h2(path, &[]);
        assert_eq!((r.status, r.body_str()), (200, "primary".to_owned()));
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1500), "{path}: {took:?}");
    }
    assert_eq!(seen(&slow, 2).len(), 2);
    // Both copies to the dead group failed; both to the slow one passed their deadline.
    assert!(
        eventually(Duration::from_secs(5), || metric(
            &s.v,
            "veloxy_mirror_failed_total"
        ) == 4),
        "{}",
        metric(&s.v, "veloxy_mirror_failed_total")
    );
    assert_eq!(metric(&s.v, "veloxy_mirrored_total"), 4);
}

#[test]
fn percent_zero_refused_requests_and_cache_hits_are_not_mirrored_and_a_reload_changes_it() {
    let primary = script_origin(|_| Scripted::ok("primary").header("cache-control", "max-age=60"));
    let shadow = script_origin(|_| Scripted::ok("shadow"));
    let s = Site::start(
        "admin = \"127.0.0.1:0\"",
        "",
        &format!(
            "[caches.main]\nmemory = \"1MiB\"\n\
             [[routes]]\npath = \"/zero/\"\nupstream = \"app\"\n\
             mirror = {{ upstream = \"shadow\", percent = 0.0 }}\n\
             [[routes]]\npath = \"/denied/\"\nupstream = \"app\"\ndeny = [\"127.0.0.1\"]\n\
             mirror = {{ upstream = \"shadow\" }}\n\
             [[routes]]\npath = \"/cached/\"\nupstream = \"app\"\n\
             cache = {{ store = \"main\" }}\nmirror = {{ upstream = \"shadow\" }}\n\
             [[routes]]\npath = \"/half/\"\nupstream = \"app\"\n\
             mirror = {{ upstream = \"shadow\", percent = 50 }}\n\
             [[routes]]\nupstream = \"app\"\nmirror = {{ upstream = \"shadow\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.shadow]\nservers = [\"{}\"]\n",
            primary.addr, shadow.addr
        ),
    );
    for _ in 0..10 {
        assert_eq!(s.h1("/zero/a", "").0, 200);
        assert_eq!(s.h1("/denied/a", "").0, 403);
        assert_eq!(s.h2("/denied/a", &[]).status, 403);
    }
    // The first is filled by the cache, the others are hits: none is copied.
    for _ in 0..3 {
        assert_eq!(s.h1("/cached/a", "").0, 200);
        assert_eq!(s.h2("/cached/a", &[]).status, 200);
    }
    // A request that is copied, last: once it has arrived, nothing else is on its way.
    assert_eq!(s.h1("/last", "").0, 200);
    let all = seen(&shadow, 1);
    assert_eq!(
        all.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        ["/last"]
    );
    // Half of 200 requests: sampled, not all and not none.
    for _ in 0..200 {
        assert_eq!(s.h1_raw_plain("/half/a"), 200);
    }
    let n = metric(&s.v, "veloxy_mirrored_total") - 1;
    assert!((50..150).contains(&n), "{n} of 200 copied at 50%");
    // A reload changes the share.
    let conf = std::fs::read_to_string(s.v.dir.path().join("veloxy.toml")).unwrap();
    let conf = conf.replace("percent = 0.0", "percent = 100.0");
    reload_with(&s.v, &conf, "reloaded");
    let before = shadow.hits();
    assert_eq!(s.h1_raw_plain("/zero/after-reload"), 200);
    let all = seen(&shadow, before + 1);
    assert_eq!(all.last().unwrap().target, "/zero/after-reload");
}

/// A body over the 64 KiB bound is not copied (counted), and the primary gets all of it:
/// declared over HTTP/1.1, chunked over HTTP/1.1, and of unknown length over HTTP/2 (read
/// ahead up to the bound, the rest streamed after it).
#[test]
fn a_body_over_the_bound_is_not_copied_and_reaches_the_primary_whole() {
    let (primary, shadow, s) = mirrored_site("", "");
    let big: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let text = String::from_utf8(big.clone()).unwrap();
    let (status, _) = s.h1_raw(&format!(
        "POST /declared HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{text}",
        big.len()
    ));
    assert_eq!(status, 200);
    let (status, _) = s.h1_raw(&format!(
        "POST /chunked HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n{:x}\r\n{text}\r\n0\r\n\r\n",
        big.len()
    ));
    assert_eq!(status, 200);
    let mut req = h2_get("localhost", "/h2", true);
    *req.method_mut() = http::Method::POST;
    let r = s.h2_req(req, Some(Bytes::from(big.clone())));
    assert_eq!(r.status, 200);
    let got = primary.requests();
    assert_eq!(got.len(), 3);
    for r in &got {
        assert!(r.body == big, "{}: {} bytes", r.target, r.body.len());
    }
    assert_eq!(metric(&s.v, "veloxy_mirror_skipped_total"), 3);
    // A small one after them is copied: nothing else was.
    only_small_copied(&s, &shadow);
}

/// A body of unknown length over the route's `max_body_bytes` is refused (413) as it is
/// relayed; its copy must not have gone out whole before (the mirror's read-ahead bound was
/// 64 KiB whatever the route's limit).
#[test]
fn a_body_over_max_body_bytes_is_not_copied() {
    let (_primary, shadow, s) = mirrored_site("max_body_bytes = \"1KiB\"\n", "");
    let text = "x".repeat(10_000);
    let (status, _) = s.h1_raw(&format!(
        "POST /chunked HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n{:x}\r\n{text}\r\n0\r\n\r\n",
        text.len()
    ));
    assert_eq!(status, 413);
    only_small_copied(&s, &shadow);
}

/// A copy carries the fields `forward_auth` copied, as the primary does (the copies are
/// rendered at admission, before the auth service answers: they went out with no identity,
/// the client's own `Remote-User` dropped).
#[test]
fn a_copy_carries_the_fields_forward_auth_copied() {
    let auth = script_origin(|_| Scripted::new(200).header("Remote-User", "alice"));
    let (primary, shadow, s) = mirrored_site(
        "forward_auth = { upstream = \"auth\", path = \"/verify\", copy_headers = [\"Remote-User\"], timeout = \"2s\" }\n",
        &format!("[upstreams.auth]\nservers = [\"{}\"]\nretries = 0\n", auth.addr),
    );
    assert_eq!(s.h1("/who", "").0, 200);
    let got = primary.requests();
    assert_eq!(got[0].header("remote-user"), Some("alice"));
    let seen = seen(&shadow, 1);
    assert_eq!(
        seen[0].header("remote-user"),
        Some("alice"),
        "{:?}",
        seen[0].headers
    );
}

/// A client that stalls in its body is answered 408 after one `body_timeout`, not two: the
/// mirror's read-ahead had waited the whole timeout, and the attempts used to wait again.
#[test]
fn a_stalled_body_is_waited_for_once() {
    let primary = script_origin(|_| Scripted::ok("primary"));
    let shadow = script_origin(|_| Scripted::ok("shadow"));
    let s = Site::start(
        "body_timeout = \"2s\"",
        "",
        &format!(
            "[[routes]]\nupstream = \"app\"\nmirror = {{ upstream = \"shadow\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n[upstreams.shadow]\nservers = [\"{}\"]\n",
            primary.addr, shadow.addr
        ),
    );
    let started = Instant::now();
    let (status, _) = s
        .h1_raw("POST /stall HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nonly ten b");
    let took = started.elapsed();
    assert_eq!(status, 408);
    // One timeout is 2 s; two would be 4 s.
    assert!(
        took < Duration::from_millis(3500),
        "answered after {took:?}"
    );
    assert_eq!(shadow.hits(), 0, "a body never whole is not copied");
}

/// The same over HTTP/2 (h2c, prior knowledge): the read-ahead marks the body stalled, and
/// the attempts do not wait for it again.
#[test]
fn a_stalled_http2_body_is_waited_for_once() {
    let primary = script_origin(|_| Scripted::ok("primary"));
    let shadow = script_origin(|_| Scripted::ok("shadow"));
    let v = veloxy(&format!(
        "[server]\nworkers = 1\nbody_timeout = \"2s\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"app\"\nmirror = {{ upstream = \"shadow\" }}\n\
         [upstreams.app]\nservers = [\"{}\"]\n[upstreams.shadow]\nservers = [\"{}\"]\n",
        primary.addr, shadow.addr
    ));
    let authority = v.addr.to_string();
    let (status, took) = runtime().block_on(async {
        let c = h2_connect(v.addr, None).await;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{authority}/stall"))
            .header("content-length", 100)
            .body(())
            .unwrap();
        let mut ready = c.ready().await.unwrap();
        let started = Instant::now();
        let (resp, mut body) = ready.send_request(req, false).unwrap();
        body.send_data(Bytes::from_static(b"only ten b"), false)
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), resp)
            .await
            .expect("an answer within 10 s")
            .unwrap();
        (resp.status().as_u16(), started.elapsed())
    });
    assert_eq!(status, 408);
    // One timeout is 2 s; two would be 4 s.
    assert!(
        took < Duration::from_millis(3500),
        "answered after {took:?}"
    );
    assert_eq!(shadow.hits(), 0, "a body never whole is not copied");
}

/// A site (with the admin endpoint) whose one route goes to `app` (an origin answering
/// "primary") with `mirror = { upstream = "shadow" }` (one answering "shadow"); `keys` are
/// more keys of the route, `groups` more group tables. Returns the two origins and the site.
fn mirrored_site(keys: &str, groups: &str) -> (ScriptOrigin, ScriptOrigin, Site) {
    let primary = script_origin(|_| Scripted::ok("primary"));
    let shadow = script_origin(|_| Scripted::ok("shadow"));
    let s = Site::start(
        "admin = \"127.0.0.1:0\"",
        "",
        &format!(
            "[[routes]]\nupstream = \"app\"\nmirror = {{ upstream = \"shadow\" }}\n{keys}\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.shadow]\nservers = [\"{}\"]\n{groups}",
            primary.addr, shadow.addr
        ),
    );
    (primary, shadow, s)
}

/// A small request now is copied, and it is the only copy the shadow ever saw.
fn only_small_copied(s: &Site, shadow: &ScriptOrigin) {
    assert_eq!(s.h1("/small", "").0, 200);
    let seen = seen(shadow, 1);
    assert_eq!(
        seen.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        ["/small"]
    );
}

trait Plain {
    fn h1_raw_plain(&self, path: &str) -> u16;
}

impl Plain for Site {
    /// GET over the plain listener (no TLS handshake per request).
    fn h1_raw_plain(&self, path: &str) -> u16 {
        request(
            self.addr("plain"),
            &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
        )
        .status
    }
}
