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
    std::thread::sleep(Duration::from_millis(2500));
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
