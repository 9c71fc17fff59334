//! HTTP/3 (issue 15, first part): a real HTTP/3 client (h3 over quinn) against `http3 = true`
//! on a TLS listener; every request goes through the same exchange core as HTTP/2.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use veloxy_testkit::*;

struct H3Site {
    v: Veloxy,
    pki: Pki,
    web: SocketAddr,
    log: std::path::PathBuf,
    _certs: tempfile::TempDir,
}

fn start(routes: &str) -> H3Site {
    start_with("", routes)
}

/// `listener`: more keys of `[listeners.web]`.
fn start_with(listener: &str, routes: &str) -> H3Site {
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let (other, other_key) = pki.leaf("other", &["other.test"], KeyKind::Ecdsa);
    let log = certs.path().join("access.log");
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[server.access_log]\npath = \"{}\"\nformat = \"json\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\n{listener}\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[listeners.web.tls.certs]]\nhosts = [\"other.test\"]\ncert = \"{}\"\nkey = \"{}\"\n{routes}",
        log.display(),
        cert.display(),
        key.display(),
        other.display(),
        other_key.display()
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    H3Site {
        v,
        pki,
        web,
        log,
        _certs: certs,
    }
}

#[test]
fn get_and_post_through_the_exchange_core_with_sni_and_many_streams() {
    let up = upstream(&["--name", "app"]);
    let s = start(&format!(
        "[[routes]]\npath = \"/hello\"\nrespond = {{ body = \"hello h3\" }}\n\
         response_headers = {{ add = {{ \"X-Rule\" = \"on\" }} }}\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    ));
    let ca = s.pki.ca_pem.clone();
    runtime().block_on(async {
        let mut c = h3_connect(s.web, "localhost", &ca)
            .await
            .expect("h3 connect");
        // An answer of veloxy's own, with a response header rule.
        let r = h3_send(&mut c, h3_get("localhost", "/hello"), None)
            .await
            .unwrap();
        assert_eq!((r.status, r.body_str().as_str()), (200, "hello h3"));
        assert_eq!(r.header("x-rule"), Some("on"));
        assert!(r.header("date").is_some(), "HTTP/3 answers carry Date");
        // A GET whose FIN came with its headers reaches the HTTP/1.1 upstream with no body
        // framing at all (not an empty chunked body), as from HTTP/1.1 and HTTP/2 clients.
        let r = h3_send(&mut c, h3_get("localhost", "/echo"), None)
            .await
            .unwrap();
        let seen = r.body_str().to_ascii_lowercase();
        assert_eq!(r.status, 200);
        assert!(seen.starts_with("get /echo http/1.1"), "{seen}");
        assert!(
            !seen.contains("transfer-encoding") && !seen.contains("content-length"),
            "{seen}"
        );
        // Proxied, with a body each way.
        let body = Bytes::from(vec![7u8; 300_000]);
        let req = http::Request::post("https://localhost/sink")
            .body(())
            .unwrap();
        let r = h3_send(&mut c, req, Some(body)).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body_str());
        assert_eq!(
            r.body_str(),
            format!("{{\"bytes\":300000,\"sum\":{}}}", 7 * 300_000)
        );
        let r = h3_send(&mut c, h3_get("localhost", "/size/1000000"), None)
            .await
            .unwrap();
        assert_eq!((r.status, r.body.len()), (200, 1_000_000));
        assert_eq!(r.header("x-upstream"), Some("app"));
        // 100 concurrent streams on the one connection.
        let mut tasks = Vec::new();
        for i in 0..100 {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                h3_send(
                    &mut c,
                    h3_get("localhost", &format!("/size/{}", 1000 + i)),
                    None,
                )
                .await
                .map(|r| (r.status, r.body.len()))
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), Ok((200, 1000 + i)));
        }
    });
    // SNI picks the certificate, as for TCP: a client trusting the CA, asking for
    // other.test, verifies the other certificate's name.
    runtime().block_on(async {
        let mut c = h3_connect(s.web, "other.test", &ca)
            .await
            .expect("SNI other.test");
        let r = h3_send(&mut c, h3_get("other.test", "/hello"), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    });
    // The access log names the protocol.
    let logged = eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&s.log).is_ok_and(|t| t.contains("\"protocol\":\"HTTP/3\""))
    });
    assert!(
        logged,
        "{}",
        std::fs::read_to_string(&s.log).unwrap_or_default()
    );
    let _ = &s.v;
}

#[test]
fn garbage_datagrams_do_not_disturb_served_connections() {
    let s = start("[[routes]]\nrespond = { body = \"ok\" }\n");
    let ca = s.pki.ca_pem.clone();
    runtime().block_on(async {
        let mut c = h3_connect(s.web, "localhost", &ca)
            .await
            .expect("h3 connect");
        let junk = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..2000u32 {
            let len = 1 + (i as usize * 7919) % 1400;
            let datagram: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
            let _ = junk.send_to(&datagram, s.web);
        }
        for _ in 0..5 {
            let r = h3_send(&mut c, h3_get("localhost", "/"), None)
                .await
                .unwrap();
            assert_eq!((r.status, r.body_str().as_str()), (200, "ok"));
        }
        // New connections too.
        let mut c2 = h3_connect(s.web, "localhost", &ca)
            .await
            .expect("h3 connect");
        let r = h3_send(&mut c2, h3_get("localhost", "/"), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    });
}

#[test]
fn http1_and_http2_answers_advertise_http3() {
    let s = start("[[routes]]\nrespond = { body = \"ok\" }\n");
    let ca = s.pki.ca_pem.clone();
    let want = format!("h3=\":{}\"; ma=86400", s.web.port());
    let client = default_client(&ca, &[b"http/1.1"]);
    let (mut tls, _) = tls_connect(s.web, "localhost", client).unwrap();
    let (status, raw) = https1(&mut tls, "localhost", "/");
    assert_eq!(status, 200);
    assert_eq!(raw_header(&raw, "alt-svc"), Some(want.as_str()));
    let r = runtime().block_on(async {
        let config = default_client(&ca, &[b"h2"]);
        let mut c = h2_connect(s.web, Some((config, "localhost"))).await;
        h2_send(&mut c, h2_get("localhost", "/", true), None)
            .await
            .unwrap()
    });
    assert_eq!(r.header("alt-svc"), Some(want.as_str()));
    // Not on HTTP/3 answers themselves.
    let r = runtime().block_on(async {
        let mut c = h3_connect(s.web, "localhost", &ca).await.unwrap();
        h3_send(&mut c, h3_get("localhost", "/"), None)
            .await
            .unwrap()
    });
    assert_eq!((r.status, r.header("alt-svc")), (200, None));
}

#[test]
fn shutdown_lets_a_stream_in_flight_finish() {
    let up = upstream(&["--name", "app"]);
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\nshutdown_timeout = \"10s\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        cert.display(),
        key.display(),
        up.addr
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let admin = admin_addr(&v);
    let ca = pki.ca_pem.clone();
    let pid = v.proc.pid();
    runtime().block_on(async move {
        let mut c = h3_connect(web, "localhost", &ca).await.unwrap();
        let slow =
            tokio::spawn(
                async move { h3_send(&mut c, h3_get("localhost", "/delay/1500"), None).await },
            );
        // Once the request is in flight, SIGTERM.
        let in_flight = tokio::task::spawn_blocking(move || {
            eventually(Duration::from_secs(5), || {
                let m = get(admin, "/metrics").body_str();
                // Counted as an HTTP/3 stream (not HTTP/2), and in flight.
                m.lines().any(|l| l == "veloxy_http3_streams_total 1")
                    && m.lines()
                        .any(|l| l.starts_with("veloxy_requests_in_flight ") && !l.ends_with(" 0"))
            })
        })
        .await
        .unwrap();
        assert!(in_flight);
        signal(pid, "-TERM");
        let r = slow.await.unwrap().expect("the stream in flight completes");
        assert_eq!(r.status, 200);
    });
    let mut v = v;
    let status = v.proc.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_64_mib_download_streams_with_bounded_memory() {
    let up = upstream(&["--name", "app"]);
    let s = start(&format!(
        "[[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    ));
    let before = s.v.proc.rss_kib();
    let ca = s.pki.ca_pem.clone();
    let (status, len) = runtime().block_on(async {
        let mut c = h3_connect(s.web, "localhost", &ca).await.unwrap();
        let r = h3_send(&mut c, h3_get("localhost", "/size/67108864"), None)
            .await
            .unwrap();
        (r.status, r.body.len())
    });
    assert_eq!((status, len), (200, 64 << 20));
    let grown = s.v.proc.rss_kib().saturating_sub(before);
    assert!(
        grown < 32 * 1024,
        "veloxy grew by {grown} KiB for a 64 MiB response"
    );
}

/// The Python with aioquic that `.ci/run` prepares (VELOXY_AIOQUIC_PYTHON).
fn aioquic_python() -> Option<String> {
    python_with("VELOXY_AIOQUIC_PYTHON", "py-aioquic", "aioquic")
}

#[test]
fn an_independent_quic_stack_interoperates() {
    let Some(python) = aioquic_python() else {
        return skip("aioquic is not installed (.ci/run prepares target/py-aioquic)");
    };
    let s = start(
        "[[routes]]\nrespond = { body = \"hello aioquic\" }\n\
         response_headers = { add = { \"X-Rule\" = \"on\" } }\n",
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/h3_get.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(["127.0.0.1", &s.web.port().to_string(), "localhost"])
        .arg(&s.pki.ca_pem)
        .arg("/")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text, "200\nhello aioquic");
}

#[test]
fn a_file_route_with_compression() {
    let root = tempfile::tempdir().unwrap();
    let text = "veloxy over http/3 ".repeat(2000);
    std::fs::write(root.path().join("page.txt"), &text).unwrap();
    let s = start(&format!(
        "[[routes]]\nroot = \"{}\"\n",
        root.path().display()
    ));
    let ca = s.pki.ca_pem.clone();
    let r = runtime().block_on(async {
        let mut c = h3_connect(s.web, "localhost", &ca).await.unwrap();
        let req = http::Request::get("https://localhost/page.txt")
            .header("accept-encoding", "gzip")
            .body(())
            .unwrap();
        h3_send(&mut c, req, None).await.unwrap()
    });
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert!(r.body.len() < text.len() / 10, "{} bytes", r.body.len());
    let mut plain = String::new();
    use std::io::Read;
    flate2::read::GzDecoder::new(&r.body[..])
        .read_to_string(&mut plain)
        .unwrap();
    assert_eq!(plain, text);
}

#[test]
fn oversized_header_sections_are_refused() {
    let s = start("[[routes]]\nrespond = { body = \"ok\" }\n");
    let ca = s.pki.ca_pem.clone();
    runtime().block_on(async {
        let mut c = h3_connect(s.web, "localhost", &ca).await.unwrap();
        let req = http::Request::get("https://localhost/")
            .header("x-big", "a".repeat(100_000))
            .body(())
            .unwrap();
        let r = h3_send(&mut c, req, None).await;
        // Refused (the server's QPACK limit is max_header_bytes), never served.
        assert!(
            r.as_ref().map_or(true, |r| r.status == 431),
            "a 100 KB header section was served: {:?}",
            r.map(|r| r.status)
        );
        // The server is fine: a new connection gets an answer.
        let mut c2 = h3_connect(s.web, "localhost", &ca).await.unwrap();
        let r = h3_send(&mut c2, h3_get("localhost", "/"), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    });
}

#[test]
fn a_reload_turns_http3_on_and_off() {
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let config = |h3: bool| {
        format!(
            "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = {h3}\n\
             [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
             [[routes]]\nrespond = {{ body = \"ok\" }}\n",
            cert.display(),
            key.display()
        )
    };
    let v = veloxy(&config(false));
    let web = logged_addr(&v, "listening listener=web addr=");
    // The port the reload keeps is the one bound at start, also for UDP.
    let kept = config(true).replace("127.0.0.1:0", &web.to_string());
    let ca = pki.ca_pem.clone();
    let h3_get_ok = || {
        runtime().block_on(async {
            let connect = h3_connect(web, "localhost", &ca);
            match tokio::time::timeout(Duration::from_secs(3), connect).await {
                Ok(Ok(mut c)) => h3_send(&mut c, h3_get("localhost", "/"), None)
                    .await
                    .is_ok_and(|r| r.status == 200),
                _ => false,
            }
        })
    };
    assert!(!h3_get_ok(), "no HTTP/3 before the reload");
    reload_with(&v, &kept, "HTTP/3 on");
    assert!(h3_get_ok(), "{}", v.proc.log_text());
    reload_with(
        &v,
        &config(false).replace("127.0.0.1:0", &web.to_string()),
        "reloaded",
    );
    assert!(!h3_get_ok(), "HTTP/3 still served after it was turned off");
}

#[test]
fn zero_rtt_serves_only_replay_safe_requests_early() {
    let up = upstream(&["--name", "app"]);
    let routes = format!(
        "[[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    );
    let on = start_with("quic_0rtt = true\n", &routes);
    let off = start(&routes);
    let ca = on.pki.ca_pem.clone();
    runtime().block_on(async {
        let client = H3Client::new(&ca).unwrap();
        // A first connection: a full handshake, and a session ticket for the next one.
        let mut first = client.connect(on.web, "localhost").await.unwrap();
        assert!(first.zero_rtt.is_none(), "no ticket yet");
        let r = h3_send(&mut first.send, h3_get("localhost", "/echo"), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert!(!r.body_str().to_ascii_lowercase().contains("early-data"));
        drop(first);

        // The second sends a GET and a POST in 0-RTT data, before the handshake completes.
        let mut c = client.connect(on.web, "localhost").await.unwrap();
        let accepted = c.zero_rtt.take().expect("0-RTT tried with the ticket");
        let (mut a, mut b) = (c.send.clone(), c.send.clone());
        let post = http::Request::post("https://localhost/sink")
            .body(())
            .unwrap();
        let (get, post) = tokio::join!(
            h3_send(&mut a, h3_get("localhost", "/echo"), None),
            h3_send(&mut b, post, Some(Bytes::from_static(b"replayable?"))),
        );
        assert!(accepted.await, "the server accepted the early data");
        let get = get.unwrap();
        assert_eq!(get.status, 200);
        // RFC 8470: the upstream is told the request came in early data.
        let seen = get.body_str().to_ascii_lowercase();
        assert!(seen.contains("early-data: 1"), "{seen}");
        // Not replay-safe: 425 Too Early, and the client retries after the handshake.
        assert_eq!(post.unwrap().status, 425);
        let post = http::Request::post("https://localhost/sink")
            .body(())
            .unwrap();
        let again = h3_send(&mut c.send, post, Some(Bytes::from_static(b"now")))
            .await
            .unwrap();
        assert_eq!(
            (again.status, again.body_str().as_str()),
            (200, "{\"bytes\":3,\"sum\":340}")
        );
    });
    // Off by default: the server refuses early data (the client falls back to 1-RTT).
    let ca = off.pki.ca_pem.clone();
    runtime().block_on(async {
        let client = H3Client::new(&ca).unwrap();
        let mut first = client.connect(off.web, "localhost").await.unwrap();
        let r = h3_send(&mut first.send, h3_get("localhost", "/echo"), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        drop(first);
        let mut c = client.connect(off.web, "localhost").await.unwrap();
        if let Some(accepted) = c.zero_rtt.take() {
            let mut s = c.send.clone();
            let _ = h3_send(&mut s, h3_get("localhost", "/echo"), None).await;
            assert!(!accepted.await, "0-RTT accepted without quic_0rtt");
        }
    });
}

/// A UDP relay to `to` that passes the client's first datagram and every answer, and drops
/// the client's later datagrams: the server's side of the handshake starts and never ends.
/// The receiver hears once the server has answered (its handshake state exists).
fn stalling_relay(to: SocketAddr) -> (SocketAddr, std::sync::mpsc::Receiver<()>) {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let (answered, rx) = std::sync::mpsc::channel();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    std::thread::spawn(move || {
        let mut client = None;
        let mut passed = 0;
        let mut buf = [0u8; 65536];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            if from == to {
                let _ = answered.send(());
                if let Some(c) = client {
                    let _ = sock.send_to(&buf[..n], c);
                }
            } else {
                client = Some(from);
                if passed < 1 {
                    passed += 1;
                    let _ = sock.send_to(&buf[..n], to);
                }
            }
        }
    });
    (addr, rx)
}

/// Issue 31, item 6: a QUIC handshake that never completes holds its connection slot for at
/// most `header_timeout`, not the idle timeout: with room for one connection, a real client is
/// served again soon after a stalled handshake took the slot.
#[test]
fn a_stalled_handshake_frees_its_slot_after_the_header_timeout() {
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\nheader_timeout = \"1s\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\nquic_max_connections = 1\n\
         quic_idle_timeout = \"60s\"\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nrespond = {{ body = \"ok\" }}\n",
        cert.display(),
        key.display()
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let (relay, answered) = stalling_relay(web);
    let ca = pki.ca_pem.clone();
    runtime().block_on(async {
        // The stalled client: its handshake reaches veloxy and goes no further.
        let stalled = tokio::spawn({
            let ca = ca.clone();
            async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(20),
                    h3_connect(relay, "localhost", &ca),
                )
                .await;
            }
        });
        tokio::task::spawn_blocking(move || answered.recv_timeout(Duration::from_secs(10)))
            .await
            .unwrap()
            .expect("veloxy answered the stalled client's first flight");
        let started = std::time::Instant::now();
        let mut served = false;
        while started.elapsed() < Duration::from_secs(10) {
            let attempt = tokio::time::timeout(Duration::from_secs(2), async {
                let mut c = h3_connect(web, "localhost", &ca).await?;
                h3_send(&mut c, h3_get("localhost", "/"), None).await
            })
            .await;
            if let Ok(Ok(r)) = attempt {
                assert_eq!(r.body_str(), "ok");
                served = true;
                break;
            }
        }
        assert!(served, "the slot was never freed: {}", v.proc.log_text());
        stalled.abort();
    });
}
