//! Process lifecycle: graceful shutdown, reload on SIGHUP, and the built-in default.

use veloxy_testkit::*;

use std::process::Command;
use std::time::{Duration, Instant};

fn wait_exit(v: &mut Veloxy, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(s) = v.proc.child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// An upstream that reports (on the channel) when a request head arrived, then answers it
/// after `delay`: the request is provably in flight while the test acts.
fn slow_upstream(delay: Duration) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<()>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let _ = tx.send(());
                std::thread::sleep(delay);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow");
            });
        }
    });
    (addr, rx)
}

#[test]
fn sigterm_lets_in_flight_requests_finish_then_exits_zero() {
    let (addr, arrived) = slow_upstream(Duration::from_millis(300));
    let mut v = veloxy(&simple_config(&[addr], ""));
    let mut c = Client::connect(v.addr);
    c.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n");
    arrived
        .recv_timeout(Duration::from_secs(5))
        .expect("request reached the upstream");
    signal(v.proc.pid(), "-TERM");
    let r = c.read_response(false);
    assert_eq!(r.status, 200, "the in-flight request completes");
    assert_eq!(r.body, b"slow");
    let status = wait_exit(&mut v, Duration::from_secs(5)).expect("veloxy exits after draining");
    assert!(status.success(), "{status:?}");
    // And it stopped accepting.
    assert!(std::net::TcpStream::connect(v.addr).is_err());
}

#[test]
fn sigterm_lets_http2_streams_finish_then_exits_zero() {
    let (addr, arrived) = slow_upstream(Duration::from_millis(300));
    let mut v = veloxy(&simple_config(&[addr], "").replace(
        "addr = \"127.0.0.1:0\"",
        "addr = \"127.0.0.1:0\"\nhttp2 = true",
    ));
    let authority = v.addr.to_string();
    let pid = v.proc.pid();
    let reply = veloxy_testkit::runtime().block_on(async move {
        let mut c = veloxy_testkit::h2_connect(v.addr, None).await;
        let req = veloxy_testkit::h2_get(&authority, "/slow", false);
        let pending = tokio::spawn(async move { veloxy_testkit::h2_send(&mut c, req, None).await });
        tokio::task::spawn_blocking(move || {
            arrived
                .recv_timeout(Duration::from_secs(5))
                .expect("request reached the upstream");
            signal(pid, "-TERM");
        })
        .await
        .unwrap();
        pending.await.unwrap()
    });
    let r = reply.expect("the in-flight stream completes");
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"slow");
    let status = wait_exit(&mut v, Duration::from_secs(5)).expect("veloxy exits after draining");
    assert!(status.success(), "{status:?}");
}

#[test]
fn sighup_reloads_a_good_config_and_refuses_a_bad_one() {
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let v = veloxy(&simple_config(&[a.addr], ""));
    assert_eq!(get(v.addr, "/").header("x-upstream"), Some("a"));

    // A bad file: refused, the old config keeps serving.
    reload_with(
        &v,
        "[listeners.web]\naddr = \"127.0.0.1:0\"\nbogus = 1\n",
        "reload refused",
    );
    assert!(
        v.proc.log_text().contains("bogus"),
        "the error names the key: {}",
        v.proc.log_text()
    );
    assert_eq!(get(v.addr, "/").header("x-upstream"), Some("a"));

    // A good file (same listener): new requests go to the new upstream. A keep-alive
    // connection opened before the reload stays usable.
    let mut kept = Client::connect(v.addr);
    kept.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(kept.read_response(false).header("x-upstream"), Some("a"));
    let config = simple_config(&[b.addr], "").replace("127.0.0.1:0", &v.addr.to_string());
    reload_with(&v, &config, "reloaded");
    assert_eq!(get(v.addr, "/").header("x-upstream"), Some("b"));
    kept.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(kept.read_response(false).header("x-upstream"), Some("b"));
}

#[test]
fn builtin_default_balances_over_demo_backends() {
    if std::net::TcpListener::bind("127.0.0.1:8080").is_err() {
        return skip("port 8080 is busy here; the built-in default needs it");
    }
    let dir = tempfile::tempdir().unwrap();
    let v = veloxy_cmd(Command::new(VELOXY), &["run"], dir);
    assert_eq!(v.addr.port(), 8080);
    let mut c = Client::connect(v.addr);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        c.send(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let r = c.read_response(false);
        assert_eq!(r.status, 200);
        assert!(
            r.body_str().contains("\"x_forwarded_for\":\"127.0.0.1\""),
            "{}",
            r.body_str()
        );
        seen.insert(r.header("x-upstream").unwrap().to_string());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn reload_adds_and_removes_listeners() {
    let up = upstream(&["--name", "a"]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    let mut kept = Client::connect(v.addr);
    kept.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(kept.read_response(false).status, 200);

    let extra = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let base = simple_config(&[up.addr], "").replace("127.0.0.1:0", &v.addr.to_string());
    let with_extra = base.replace(
        "[[routes]]",
        &format!("[listeners.extra]\naddr = \"{extra}\"\n[[routes]]"),
    );
    reload_with(&v, &with_extra, "reloaded");
    assert!(
        v.proc.log_text().contains("listener=extra"),
        "{}",
        v.proc.log_text()
    );
    assert_eq!(
        get(extra, "/").header("x-upstream"),
        Some("a"),
        "the new listener serves"
    );

    reload_with(&v, &base, "reloaded");
    assert!(
        eventually(Duration::from_secs(5), || std::net::TcpStream::connect(
            extra
        )
        .is_err()),
        "the removed listener stops accepting"
    );
    // The original listener, and a keep-alive connection on it, were never interrupted.
    assert_eq!(get(v.addr, "/").status, 200);
    kept.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(kept.read_response(false).status, 200);
}

#[test]
fn reloads_under_steady_load_fail_no_request() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let v = veloxy(&simple_config(&[a.addr], "").replace("workers = 1", "workers = 2"));
    let path = v.dir.path().join("veloxy.toml");
    let configs = [a.addr, b.addr].map(|u| {
        simple_config(&[u], "")
            .replace("workers = 1", "workers = 2")
            .replace("127.0.0.1:0", &v.addr.to_string())
    });
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    // Keep-alive clients and one that opens a connection per request, bounded in count.
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (stop, ok, failed, addr) = (stop.clone(), ok.clone(), failed.clone(), v.addr);
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for _ in 0..50_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if i == 0 {
                        c = Client::connect(addr);
                    }
                    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
                    match c.try_read_response(false) {
                        Some(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        _ => {
                            c = Client::connect(addr);
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    for round in 0..6 {
        let before = ok.load(Ordering::Relaxed);
        assert!(eventually(Duration::from_secs(5), || ok
            .load(Ordering::Relaxed)
            > before + 100));
        std::fs::write(&path, &configs[(round + 1) % 2]).unwrap();
        signal(v.proc.pid(), "-HUP");
        assert!(eventually(Duration::from_secs(5), || v
            .proc
            .log_text()
            .matches("reloaded")
            .count()
            == round + 1));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "{} ok",
        ok.load(Ordering::Relaxed)
    );
    // Six reloads alternate a -> b -> a ...: the last one wrote configs[0] (upstream a).
    assert_eq!(get(v.addr, "/").header("x-upstream"), Some("a"));
}

#[test]
fn reload_keeps_idle_upstream_connections_of_unchanged_backends() {
    let up = upstream(&["--name", "a"]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    let before = get(v.addr, "/").header("x-conn-id").unwrap().to_string();
    // Same upstream group and backend, one more route: the pooled connection carries over.
    let config = simple_config(&[up.addr], "")
        .replace("127.0.0.1:0", &v.addr.to_string())
        .replace(
            "[[routes]]",
            "[[routes]]\npath = \"/other/\"\nupstream = \"app\"\n[[routes]]",
        );
    reload_with(&v, &config, "reloaded");
    let after = get(v.addr, "/").header("x-conn-id").unwrap().to_string();
    assert_eq!(
        before, after,
        "the idle upstream connection was reused across the reload"
    );
}

/// A reload that leaves a route unchanged leaves its live state too: the rate-limit buckets
/// (and the concurrency limit, and file caches) carry over, so a reload cannot be used to
/// reset a limit.
#[test]
fn reload_keeps_the_rate_limit_state_of_unchanged_routes() {
    let up = upstream(&[]);
    let config = simple_config(&[up.addr], "").replace(
        "upstream = \"app\"\n",
        "upstream = \"app\"\nrate_limit = { rate = \"1/m\", burst = 2, key = \"route\" }\n",
    );
    let v = veloxy(&config);
    assert_eq!(get(v.addr, "/").status, 200);
    assert_eq!(get(v.addr, "/").status, 200);
    assert_eq!(get(v.addr, "/").status, 429);
    // The same file again, with an unrelated change.
    reload_with(
        &v,
        &config.replace("workers = 1", "workers = 1\nshutdown_timeout = \"5s\""),
        "reloaded",
    );
    assert_eq!(get(v.addr, "/").status, 429, "the reload reset the bucket");
    // A changed limit starts fresh.
    reload_with(&v, &config.replace("burst = 2", "burst = 3"), "reloaded");
    assert_eq!(get(v.addr, "/").status, 200);
}
