//! Resilience under real faults: killed, hanging and failing backends, overload, rate limits,
//! and balancing policies steering traffic.

use veloxy_testkit::*;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const OK: fn(&str) -> Reply = |_| Reply::Status(200, Duration::ZERO);

#[test]
fn killing_a_backend_under_load_loses_no_get_and_health_checks_track_it() {
    let mut ups: Vec<Upstream> = (0..4)
        .map(|i| upstream(&["--name", ["a", "b", "c", "d"][i]]))
        .collect();
    let addrs: Vec<_> = ups.iter().map(|u| u.addr).collect();
    let v = veloxy(&group_config(
        &addrs,
        "[upstreams.app.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nhealthy = 2\nunhealthy = 2",
        "",
    ));
    let victim = ups[3].addr;
    // Steady load: 4 client threads, bounded count, keep-alive.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (stop, errors, served, addr) =
                (stop.clone(), errors.clone(), served.clone(), v.addr);
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for _ in 0..20_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
                    match c.try_read_response(false) {
                        Some(r) if r.status == 200 => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            c = Client::connect(addr);
                        }
                    }
                }
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(10), || served
        .load(Ordering::Relaxed)
        > 500));
    let killed_at = Instant::now();
    ups.pop(); // drop = SIGKILL of backend d
    assert!(
        eventually(Duration::from_secs(5), || v
            .proc
            .log_text()
            .contains("health check: backend down")),
        "{}",
        v.proc.log_text()
    );
    let marked_down = killed_at.elapsed();
    let before = served.load(Ordering::Relaxed);
    assert!(eventually(Duration::from_secs(10), || served
        .load(Ordering::Relaxed)
        > before + 500));
    // Bring it back on the same port: the checks see it and traffic returns.
    let back = {
        let mut child = std::process::Command::new(UPSTREAM)
            .args(["--listen", &victim.to_string(), "--name", "d"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert!(line.starts_with("listening"), "{line}");
        Proc {
            child,
            log: Default::default(),
        }
    };
    assert!(eventually(Duration::from_secs(5), || v
        .proc
        .log_text()
        .contains("health check: backend up")));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0, "client-visible errors");
    assert!(
        marked_down < Duration::from_millis(1500),
        "marked down after {marked_down:?}"
    );
    // A passing active check also ends its outlier ejection, so it is back at once.
    let mut c = Client::connect(v.addr);
    let seen_d = eventually(Duration::from_secs(1), || {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        c.read_response(false).header("x-upstream") == Some("d")
    });
    assert!(seen_d, "traffic returns to the restarted backend");
    drop(back);
}

#[test]
fn hanging_backend_times_out_retries_elsewhere_and_is_ejected() {
    let hang = origin("hang", |_| Reply::Hang);
    let good = origin("good", OK);
    let v = veloxy(&group_config(
        &[hang.addr, good.addr],
        "read_timeout = \"200ms\"\n[upstreams.app.outlier]\nconsecutive_failures = 2\nbase_ejection = \"30s\"",
        "",
    ));
    let mut slow = 0;
    for _ in 0..10 {
        let start = Instant::now();
        let r = get(v.addr, "/");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-upstream"), Some("good"));
        if start.elapsed() > Duration::from_millis(150) {
            slow += 1;
        }
    }
    assert_eq!(
        slow, 2,
        "two timeouts eject the hanging backend; later requests are fast"
    );
    assert!(v.proc.log_text().contains("backend ejected"));
    assert_eq!(hang.hits.load(Ordering::SeqCst), 2);
}

/// The health thread's expiry tick ends an ejection once its time is up, though it skips its
/// scan of the groups while no ejection has started since a scan that found none left.
#[test]
fn an_ejection_ends_when_its_time_is_up() {
    let bad = origin("bad", |_| Reply::Status(503, Duration::ZERO));
    let good = origin("good", OK);
    let v = veloxy(&group_config(
        &[bad.addr, good.addr],
        "[upstreams.app.outlier]\nconsecutive_failures = 3\nbase_ejection = \"300ms\"",
        "",
    ));
    // Past the expiry tick's first (clean) scans: the ejection starts after them.
    std::thread::sleep(Duration::from_millis(250));
    for _ in 0..10 {
        assert_eq!(get(v.addr, "/").status, 200);
    }
    assert_eq!(bad.hits.load(Ordering::SeqCst), 3, "ejected after 3 503s");
    let back = eventually(Duration::from_secs(5), || {
        assert_eq!(get(v.addr, "/").status, 200);
        bad.hits.load(Ordering::SeqCst) > 3
    });
    assert!(back, "the ejected backend got no request again within 5 s");
    assert!(v.proc.log_text().contains("ejection ended"));
}

#[test]
fn failing_backend_is_ejected_and_the_retry_budget_caps_retries() {
    let bad = origin("bad", |_| Reply::Status(503, Duration::ZERO));
    let good = origin("good", OK);
    let v = veloxy(&group_config(
        &[bad.addr, good.addr],
        "[upstreams.app.outlier]\nconsecutive_failures = 3",
        "",
    ));
    for _ in 0..20 {
        let r = get(v.addr, "/");
        assert_eq!(r.status, 200, "503s are retried on the other backend");
    }
    assert_eq!(
        bad.hits.load(Ordering::SeqCst),
        3,
        "ejected after 3 consecutive 503s"
    );

    // Budget: two always-failing backends, no ejection, 10% budget. 200 requests may cause at
    // most 10% retries per one-second window, and at least 10 per window are always allowed;
    // the clients see the upstream's own 503.
    let b1 = origin("b1", |_| Reply::Status(503, Duration::ZERO));
    let b2 = origin("b2", |_| Reply::Status(503, Duration::ZERO));
    let v = veloxy(&group_config(
        &[b1.addr, b2.addr],
        "retry_budget = 0.1\n[upstreams.app.outlier]\nconsecutive_failures = 0",
        "",
    ));
    let mut c = Client::connect(v.addr);
    let start = Instant::now();
    for _ in 0..200 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).status, 503);
    }
    let attempts = b1.hits.load(Ordering::SeqCst) + b2.hits.load(Ordering::SeqCst);
    let took_windows = (start.elapsed().as_secs() + 1) as usize;
    assert!(attempts >= 210, "some retries happen: {attempts}");
    assert!(
        attempts <= 200 + 20 + 10 * took_windows,
        "{attempts} attempts for 200 requests"
    );
}

#[test]
fn post_is_not_retried_after_the_backend_got_it_but_is_after_connect_failure() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let bad = origin("bad", |_| Reply::Status(503, Duration::ZERO));
    let good = origin("good", OK);
    // Connect failure: nothing was sent, so even a POST moves on.
    let v = veloxy(&group_config(
        &[dead, good.addr],
        "[upstreams.app.outlier]\nconsecutive_failures = 0",
        "",
    ));
    for _ in 0..4 {
        let r = request(
            v.addr,
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        );
        assert_eq!(r.status, 200, "{}", v.proc.log_text());
    }
    // A 503 to a POST is passed through, not replayed.
    let v = veloxy(&group_config(
        &[bad.addr, good.addr],
        "[upstreams.app.outlier]\nconsecutive_failures = 0",
        "",
    ));
    let statuses: Vec<u16> = (0..4)
        .map(|_| {
            request(
                v.addr,
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
            )
            .status
        })
        .collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 503).count(),
        2,
        "{statuses:?}"
    );
}

#[test]
fn all_backends_down_is_an_immediate_503_with_retry_after() {
    let d1 = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let d2 = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let v = veloxy(&group_config(
        &[d1, d2],
        "[upstreams.app.health]\ninterval = \"50ms\"\nunhealthy = 1",
        "",
    ));
    assert!(eventually(Duration::from_secs(5), || v
        .proc
        .log_text()
        .matches("health check: backend down")
        .count()
        == 2));
    let start = Instant::now();
    let r = get(v.addr, "/");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn http_health_check_uses_expected_status() {
    let sick = origin("sick", |line| {
        if line.contains("/health") {
            Reply::Status(500, Duration::ZERO)
        } else {
            Reply::Status(200, Duration::ZERO)
        }
    });
    let good = origin("good", OK);
    let v = veloxy(&group_config(
        &[sick.addr, good.addr],
        "[upstreams.app.health]\npath = \"/health\"\ninterval = \"50ms\"\nunhealthy = 2\nexpect_status = \"200-299\"",
        "",
    ));
    assert!(eventually(Duration::from_secs(5), || v
        .proc
        .log_text()
        .contains("health check: backend down")));
    let before = sick.hits.load(Ordering::SeqCst);
    for _ in 0..10 {
        assert_eq!(get(v.addr, "/").header("x-upstream"), Some("good"));
    }
    assert_eq!(sick.hits.load(Ordering::SeqCst), before);
}

fn concurrent_gets(addr: std::net::SocketAddr, n: usize) -> Vec<(u16, Duration, Option<String>)> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let start = Instant::now();
                let r = get(addr, "/");
                (
                    r.status,
                    start.elapsed(),
                    r.header("retry-after").map(str::to_owned),
                )
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn overload_beyond_max_concurrency_is_refused_fast() {
    let slow = origin("slow", |_| Reply::Status(200, Duration::from_millis(400)));
    let v = veloxy(&group_config(&[slow.addr], "", "max_concurrency = 2"));
    let results = concurrent_gets(v.addr, 10);
    let ok: Vec<_> = results.iter().filter(|r| r.0 == 200).collect();
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    assert_eq!(ok.len(), 2, "{results:?}");
    assert_eq!(refused.len(), 8, "{results:?}");
    assert!(refused
        .iter()
        .all(|r| r.1 < Duration::from_millis(200) && r.2.as_deref() == Some("1")));
    assert!(
        ok.iter().all(|r| r.1 < Duration::from_millis(1000)),
        "admitted requests stay fast"
    );

    // With a queue: two wait their turn, the rest are refused once the queue is full.
    let v = veloxy(&group_config(
        &[slow.addr],
        "",
        "max_concurrency = 2\nqueue = 2\nqueue_timeout = \"2s\"",
    ));
    let results = concurrent_gets(v.addr, 8);
    assert_eq!(
        results.iter().filter(|r| r.0 == 200).count(),
        4,
        "{results:?}"
    );
    assert_eq!(
        results.iter().filter(|r| r.0 == 503).count(),
        4,
        "{results:?}"
    );
    // A queue wait is bounded by queue_timeout.
    let v = veloxy(&group_config(
        &[slow.addr],
        "",
        "max_concurrency = 1\nqueue = 5\nqueue_timeout = \"100ms\"",
    ));
    let results = concurrent_gets(v.addr, 3);
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    assert_eq!(refused.len(), 2, "{results:?}");
    assert!(
        refused
            .iter()
            .all(|r| r.1 >= Duration::from_millis(90) && r.1 < Duration::from_millis(350)),
        "{results:?}"
    );
}

#[test]
fn rate_limit_boundaries_and_keys() {
    let good = origin("good", OK);
    let v = veloxy(&group_config(
        &[good.addr],
        "",
        "rate_limit = { rate = \"1/s\", burst = 5, key = \"header:x-user\" }",
    ));
    let mut c = Client::connect(v.addr);
    let mut statuses = Vec::new();
    for _ in 0..8 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-User: alice\r\n\r\n");
        let r = c.read_response(false);
        if r.status == 429 {
            assert_eq!(r.header("retry-after"), Some("1"));
        }
        statuses.push(r.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-User: bob\r\n\r\n");
    assert_eq!(
        c.read_response(false).status,
        200,
        "another key has its own bucket"
    );
    assert_eq!(
        good.hits.load(Ordering::SeqCst),
        6,
        "refused requests never reach the upstream"
    );
}

#[test]
fn consistent_hash_moves_about_a_quarter_of_keys_when_one_of_four_goes() {
    let ups: Vec<Upstream> = (0..4)
        .map(|i| upstream(&["--name", ["a", "b", "c", "d"][i]]))
        .collect();
    let addrs: Vec<_> = ups.iter().map(|u| u.addr).collect();
    let keys = "policy = \"consistent_hash\"\nhash_key = \"header:x-user\"";
    let v = veloxy(&group_config(&addrs, keys, ""));
    let map = |v: &Veloxy| -> HashMap<u32, String> {
        let mut c = Client::connect(v.addr);
        (0..400)
            .map(|u| {
                c.send(format!("GET / HTTP/1.1\r\nHost: a\r\nX-User: user{u}\r\n\r\n").as_bytes());
                (
                    u,
                    c.read_response(false)
                        .header("x-upstream")
                        .unwrap()
                        .to_string(),
                )
            })
            .collect()
    };
    let before = map(&v);
    assert_eq!(before, map(&v), "stable while the set is stable");
    let path = v.dir.path().join("veloxy.toml");
    let config = group_config(&addrs[..3], keys, "").replace("127.0.0.1:0", &v.addr.to_string());
    std::fs::write(&path, config).unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &v.proc.pid().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(eventually(Duration::from_secs(5), || v
        .proc
        .log_text()
        .contains("reloaded")));
    let after = map(&v);
    let moved = before.iter().filter(|(k, b)| after[k] != **b).count();
    let from_d = before.values().filter(|b| *b == "d").count();
    assert!(moved >= from_d, "every key of the removed backend moves");
    assert!(
        moved <= from_d + 12,
        "few others move: {moved} moved, {from_d} were on d"
    );
    assert!(
        (60..=140).contains(&from_d),
        "d had about a quarter: {from_d}"
    );
}

fn share_to_fast(policy: &str, concurrency: usize) -> f64 {
    let slow = origin("slow", |_| Reply::Status(200, Duration::from_millis(40)));
    let fast = origin("fast", OK);
    let v = veloxy(&group_config(
        &[slow.addr, fast.addr],
        &format!("policy = \"{policy}\""),
        "",
    ));
    let threads: Vec<_> = (0..concurrency)
        .map(|_| {
            let addr = v.addr;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut fast = 0;
                for _ in 0..50 {
                    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
                    fast +=
                        usize::from(c.read_response(false).header("x-upstream") == Some("fast"));
                }
                fast
            })
        })
        .collect();
    let fast: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    fast as f64 / (50 * concurrency) as f64
}

#[test]
fn least_conn_and_p2c_ewma_steer_away_from_a_slow_backend() {
    let lc = share_to_fast("least_conn", 4);
    assert!(lc > 0.8, "least_conn sent {lc} to the fast backend");
    let p2c = share_to_fast("p2c_ewma", 1);
    assert!(p2c > 0.8, "p2c_ewma sent {p2c} to the fast backend");
    let rr = share_to_fast("round_robin", 1);
    assert!(
        (0.45..0.55).contains(&rr),
        "round robin is the control: {rr}"
    );
}

#[test]
fn listener_max_connections_answers_503() {
    let good = origin("good", OK);
    let config = group_config(&[good.addr], "", "").replace(
        "addr = \"127.0.0.1:0\"",
        "addr = \"127.0.0.1:0\"\nmax_connections = 2",
    );
    let v = veloxy(&config);
    let mut held: Vec<Client> = (0..2).map(|_| Client::connect(v.addr)).collect();
    for c in &mut held {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).status, 200);
    }
    let r = get(v.addr, "/");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(held);
    assert!(eventually(Duration::from_secs(2), || get(v.addr, "/")
        .status
        == 200));
}

#[test]
fn backend_max_connections_spills_over_or_refuses() {
    let slow = origin("slow", |_| Reply::Status(200, Duration::from_millis(300)));
    let v = veloxy(&group_config(&[slow.addr], "max_connections = 1", ""));
    let results = concurrent_gets(v.addr, 2);
    let mut statuses: Vec<u16> = results.iter().map(|r| r.0).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 503], "{results:?}");
    let refused = results.iter().find(|r| r.0 == 503).unwrap();
    assert!(
        refused.1 < Duration::from_millis(200),
        "refused at once: {results:?}"
    );

    // With a second backend the overflow goes there instead: hold the slow backend's one
    // connection, then round robin comes back to it and the request spills over.
    let slow = origin("slow", |_| Reply::Status(200, Duration::from_millis(500)));
    let other = origin("other", OK);
    let v = veloxy(&group_config(
        &[slow.addr, other.addr],
        "max_connections = 1",
        "",
    ));
    let addr = v.addr;
    let held = std::thread::spawn(move || get(addr, "/").status);
    assert!(eventually(Duration::from_secs(2), || slow
        .hits
        .load(Ordering::SeqCst)
        == 1));
    for _ in 0..2 {
        let r = get(v.addr, "/");
        assert_eq!((r.status, r.header("x-upstream")), (200, Some("other")));
    }
    assert_eq!(held.join().unwrap(), 200);
    assert_eq!(slow.hits.load(Ordering::SeqCst), 1);
}
