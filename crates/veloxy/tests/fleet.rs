//! Running as a fleet: a global rate limit shared by two veloxy processes through a real
//! `redis-server`, its fallback while Redis is down, and its return when Redis is back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use veloxy_testkit::*;

/// Sends GETs alternately to `addrs` for `for_` (at most 20000); returns (200s, 429s, others,
/// seconds taken, the slowest answer).
fn load(addrs: &[SocketAddr], for_: Duration) -> (u64, u64, u64, f64, Duration) {
    let start = Instant::now();
    let (mut ok, mut limited, mut other, mut slowest) = (0, 0, 0, Duration::ZERO);
    let mut n = 0usize;
    while start.elapsed() < for_ && n < 20_000 {
        let t = Instant::now();
        match get(addrs[n % addrs.len()], "/").status {
            200 => ok += 1,
            429 => limited += 1,
            _ => other += 1,
        }
        slowest = slowest.max(t.elapsed());
        n += 1;
    }
    (ok, limited, other, start.elapsed().as_secs_f64(), slowest)
}

fn metric(v: &Veloxy, name: &str) -> f64 {
    let r = request(
        admin_addr(v),
        "GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    r.body_str()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_global_limit_holds_across_instances_and_falls_back_while_redis_is_down() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let up = upstream(&["--name", "app"]);
    let config = format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [server.redis]\nurl = \"{}\"\ntimeout = \"100ms\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         rate_limit = {{ rate = \"20/s\", burst = 20, key = \"route\", scope = \"global\" }}\n\
         [upstreams.app]\nservers = [\"{}\"]\n",
        redis.url(),
        up.addr
    );
    let (a, b) = (veloxy(&config), veloxy(&config));
    let addrs = [
        logged_addr(&a, "listening listener=web addr="),
        logged_addr(&b, "listening listener=web addr="),
    ];

    // Global: both instances together get the burst plus the rate, within the overshoot the
    // README allows (one request per key per worker per instance), never twice the limit.
    let (ok, limited, other, secs, _) = load(&addrs, Duration::from_secs(2));
    let budget = 20.0 + 20.0 * secs;
    assert_eq!(other, 0);
    assert!(limited > 0, "the limit was reached");
    assert!(
        ok as f64 <= budget + 2.0,
        "{ok} allowed, budget {budget:.0}"
    );
    assert!(
        ok as f64 >= budget * 0.6,
        "{ok} allowed, budget {budget:.0}"
    );

    // Redis down: requests keep flowing under per-instance limits, with no wait beyond the
    // store timeout, and the fallback is counted.
    redis.stop();
    let (ok, _, other, _, slowest) = load(&addrs, Duration::from_secs(1));
    assert_eq!(other, 0);
    assert!(ok > 0, "requests still pass while Redis is down");
    assert!(
        slowest < Duration::from_millis(500),
        "slowest answer {slowest:?}"
    );
    let fallbacks = metric(&a, "veloxy_ratelimit_store_fallbacks_total")
        + metric(&b, "veloxy_ratelimit_store_fallbacks_total");
    assert!(fallbacks > 0.0, "fallbacks counted");

    // Redis back (empty): global again once the instances' probes succeed.
    redis.restart();
    // Ready once neither instance falls back any more for half a second of requests.
    let fallbacks = || {
        metric(&a, "veloxy_ratelimit_store_fallbacks_total")
            + metric(&b, "veloxy_ratelimit_store_fallbacks_total")
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let before = fallbacks();
        load(&addrs, Duration::from_millis(500));
        if fallbacks() == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still falling back after Redis came back"
        );
    }
    // A fresh second for the buckets (the shared one refills to its burst).
    std::thread::sleep(Duration::from_secs(1));
    let before = metric(&a, "veloxy_ratelimit_store_fallbacks_total");
    let (ok, limited, other, secs, _) = load(&addrs, Duration::from_secs(2));
    let budget = 20.0 + 20.0 * secs;
    assert_eq!(other, 0);
    assert!(limited > 0);
    assert!(
        ok as f64 <= budget + 2.0,
        "{ok} allowed after Redis came back, budget {budget:.0}"
    );
    assert_eq!(
        metric(&a, "veloxy_ratelimit_store_fallbacks_total"),
        before,
        "global again"
    );
}

fn admin_call(v: &Veloxy, method: &str, path: &str, token: Option<&str>) -> Response {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    request(
        admin_addr(v),
        &format!("{method} {path} HTTP/1.1\r\nHost: a\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"),
    )
}

#[test]
fn the_runtime_api_drains_and_enables_a_backend_under_load_with_a_token() {
    let (a, b) = (upstream(&["--name", "a"]), upstream(&["--name", "b"]));
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let token = "fleet-token-0123456789abcdef";
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let v = veloxy(&format!(
        "[server]\nworkers = 2\nadmin = \"127.0.0.1:0\"\nadmin_token_file = \"{}\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"{}\", \"{}\"]\n",
        token_file.display(),
        a.addr,
        b.addr
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    // The token is required on every admin request.
    assert_eq!(admin_call(&v, "GET", "/upstreams", None).status, 401);
    assert_eq!(
        admin_call(&v, "GET", "/upstreams", Some("wrong")).status,
        401
    );
    assert_eq!(admin_call(&v, "GET", "/upstreams", Some(token)).status, 200);
    assert_eq!(admin_call(&v, "GET", "/metrics", None).status, 401);
    // The scheme is case-insensitive (RFC 9110 section 11.1; issue 31, item 14).
    let lower = request(
        admin_addr(&v),
        &format!("GET /upstreams HTTP/1.1\r\nHost: a\r\nAuthorization: bearer {token}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(lower.status, 200);

    // Load in the background for the whole test: not one request may fail.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Instant, String)>::new()));
    let (s2, seen2) = (stop.clone(), seen.clone());
    let load = std::thread::spawn(move || {
        let mut failures = 0;
        let started = Instant::now();
        while !s2.load(std::sync::atomic::Ordering::Relaxed)
            && started.elapsed() < Duration::from_secs(20)
        {
            let r = get(web, "/");
            if r.status != 200 {
                failures += 1;
            }
            let name = r.header("x-upstream").unwrap_or("").to_owned();
            seen2.lock().unwrap().push((Instant::now(), name));
        }
        failures
    });
    let names_since = |t: Instant| -> Vec<String> {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at > t)
            .map(|(_, n)| n.clone())
            .collect()
    };
    std::thread::sleep(Duration::from_millis(300));
    let b_addr = b.addr.to_string();
    let r = admin_call(
        &v,
        "POST",
        &format!("/upstreams/app/servers/{b_addr}/drain"),
        Some(token),
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert!(r.body_str().contains("drained"));
    // Applied to every worker within 100 ms.
    let drained_at = Instant::now() + Duration::from_millis(100);
    std::thread::sleep(Duration::from_millis(600));
    let after = names_since(drained_at);
    assert!(after.len() > 20, "load kept flowing: {}", after.len());
    assert!(
        after.iter().all(|n| n == "a"),
        "only a after the drain: {after:?}"
    );
    let ups = admin_call(&v, "GET", "/upstreams", Some(token)).body_str();
    assert!(ups.contains("\"state\":\"drained\""), "{ups}");

    let r = admin_call(
        &v,
        "POST",
        &format!("/upstreams/app/servers/{b_addr}/enable"),
        Some(token),
    );
    assert_eq!(r.status, 200);
    let enabled_at = Instant::now() + Duration::from_millis(100);
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        names_since(enabled_at).iter().any(|n| n == "b"),
        "b serves again"
    );

    // DELETE takes it out too; a reload brings back the file's set.
    let r = admin_call(
        &v,
        "DELETE",
        &format!("/upstreams/app/servers/{b_addr}"),
        Some(token),
    );
    assert_eq!(r.status, 200);
    assert!(admin_call(&v, "GET", "/upstreams", Some(token))
        .body_str()
        .contains("\"state\":\"removed\""));
    assert_eq!(admin_call(&v, "POST", "/reload", Some(token)).status, 200);
    assert!(admin_call(&v, "GET", "/upstreams", Some(token))
        .body_str()
        .contains("\"state\":\"in service\""));
    assert_eq!(
        admin_call(
            &v,
            "POST",
            "/upstreams/app/servers/10.9.9.9:1/drain",
            Some(token)
        )
        .status,
        404
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(load.join().unwrap(), 0, "no request failed");
}

#[test]
fn requests_under_a_global_limit_are_not_refused_while_a_lease_is_on_the_way() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let up = upstream(&["--name", "app"]);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[server.redis]\nurl = \"{}\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         rate_limit = {{ rate = \"1000/s\", burst = 1000, key = \"header:x-key\", scope = \"global\" }}\n\
         [upstreams.app]\nservers = [\"{}\"]\n",
        redis.url(),
        up.addr
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    // Back-to-back requests on new keys, far under their limit: the first lease of each is
    // still on its way for the first few, which borrow from it instead of getting 429.
    let mut conn = Client::connect(web);
    for k in 0..5 {
        for i in 0..8 {
            conn.send(format!("GET / HTTP/1.1\r\nHost: a\r\nx-key: k{k}\r\n\r\n").as_bytes());
            let r = conn.read_response(false);
            assert_eq!(r.status, 200, "key k{k}, request {i}");
        }
    }
}

#[test]
fn a_global_limit_works_over_rediss_and_an_unverified_server_is_refused() {
    let Some(redis) = RedisServer::start_tls() else {
        return;
    };
    let up = upstream(&["--name", "app"]);
    let config = |ca: &str| {
        format!(
            "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
             [server.redis]\nurl = \"{}\"\ntimeout = \"500ms\"\npool = 1\n{ca}\n\
             [listeners.web]\naddr = \"127.0.0.1:0\"\n\
             [[routes]]\nupstream = \"app\"\n\
             rate_limit = {{ rate = \"10/s\", burst = 10, key = \"route\", scope = \"global\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            redis.url(),
            up.addr
        )
    };
    // pool = 1: the rest of a pool connects in the background on the client thread, and
    // debug-build TLS handshakes there would delay the first leases past the test's window.
    let ca = format!("ca_file = \"{}\"", redis.ca_pem().unwrap().display());
    let trusted = veloxy(&config(&ca));
    let web = logged_addr(&trusted, "listening listener=web addr=");
    let (ok, limited, other, _, _) = load(&[web], Duration::from_millis(300));
    assert_eq!(other, 0);
    assert!(
        (10..=14).contains(&ok) && limited > 0,
        "{ok} ok, {limited} limited: {}",
        trusted.proc.log_text()
    );
    assert_eq!(
        metric(&trusted, "veloxy_ratelimit_store_fallbacks_total"),
        0.0,
        "the limit was decided in Redis over TLS: {}",
        trusted.proc.log_text()
    );

    // Without the CA the server's certificate is not trusted: no connection, and after the
    // 500 ms timeout the per-instance fallback decides (10 at once, then 10 a second).
    let untrusted = veloxy(&config(""));
    let web = logged_addr(&untrusted, "listening listener=web addr=");
    let (ok, _, other, _, _) = load(&[web], Duration::from_millis(1200));
    assert_eq!(other, 0);
    assert!(ok >= 10, "{ok} ok");
    assert!(
        metric(&untrusted, "veloxy_ratelimit_store_fallbacks_total") > 0.0,
        "{ok} ok: {}",
        untrusted.proc.log_text()
    );
}
