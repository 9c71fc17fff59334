//! The admin endpoint: metrics checked against a known number of requests, health, upstream
//! state, and reload through POST /reload.

use veloxy_testkit::*;

use std::net::SocketAddr;
use std::time::Duration;

fn admin(addr: SocketAddr, method: &str, path: &str) -> Response {
    request(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"),
    )
}

/// The value of the first metric line starting with `prefix` (name plus labels).
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {prefix} in:\n{text}"))
}

fn config_with_admin(servers: &[SocketAddr], extra: &str) -> String {
    group_config(servers, extra, "").replace("workers = 1", "workers = 2\nadmin = \"127.0.0.1:0\"")
}

#[test]
fn metrics_count_requests_statuses_bytes_and_latency() {
    let up = upstream(&["--name", "a"]);
    let v = veloxy(&config_with_admin(&[up.addr], ""));
    let a = admin_addr(&v);
    let before = admin(a, "GET", "/metrics").body_str();
    assert_eq!(
        metric(
            &before,
            "veloxy_requests_total{listener=\"web\",route=\"0\",upstream=\"app\",status=\"2xx\"}"
        ),
        0.0
    );

    let mut c = Client::connect(v.addr);
    for _ in 0..7 {
        c.send(b"GET /size/1000 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).status, 200);
    }
    for _ in 0..3 {
        c.send(b"GET /status/503 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).status, 503);
    }
    drop(c);
    // Two workers, one client connection: all on one worker; the scrape sums both anyway.
    // A request is counted just after its response is written, so the client can see the last
    // response a moment before the counter moves: wait for the count, then check the rest.
    let route = "veloxy_requests_total{listener=\"web\",route=\"0\",upstream=\"app\",status=";
    let mut text = String::new();
    assert!(eventually(std::time::Duration::from_secs(5), || {
        text = admin(a, "GET", "/metrics").body_str();
        metric(&text, "veloxy_request_duration_seconds_count") == 10.0
    }));
    assert_eq!(metric(&text, &format!("{route}\"2xx\"}}")), 7.0);
    assert_eq!(metric(&text, &format!("{route}\"5xx\"}}")), 3.0);
    assert_eq!(metric(&text, "veloxy_request_duration_seconds_count"), 10.0);
    assert_eq!(
        metric(&text, "veloxy_upstream_duration_seconds_count"),
        10.0
    );
    // Under a second each, at loopback speed.
    assert_eq!(
        metric(&text, "veloxy_request_duration_seconds_bucket{le=\"1\"}"),
        10.0
    );
    assert!(metric(&text, "veloxy_downstream_bytes_sent_total") >= 7000.0);
    assert!(metric(&text, "veloxy_downstream_bytes_received_total") >= 10.0 * 30.0);
    assert_eq!(metric(&text, "veloxy_requests_in_flight"), 0.0);
    assert_eq!(
        metric(&text, "veloxy_pool_hits_total") + metric(&text, "veloxy_upstream_connects_total"),
        10.0,
        "every request used a pooled or a new upstream connection"
    );
    // One backend: a 503 has nowhere else to go, so it is passed through, not retried.
    assert_eq!(metric(&text, "veloxy_retries_total"), 0.0);
    assert!(text.contains(&format!(
        "veloxy_backend_up{{upstream=\"app\",backend=\"{}\"}} 1",
        up.addr
    )));
}

#[test]
fn metrics_count_shed_and_rate_limited_requests() {
    let up = upstream(&[]);
    let config = config_with_admin(&[up.addr], "").replace(
        "upstream = \"app\"\n",
        "upstream = \"app\"\nrate_limit = { rate = \"1/s\", burst = 2, key = \"route\" }\n",
    );
    let v = veloxy(&config);
    let a = admin_addr(&v);
    let statuses: Vec<u16> = (0..5).map(|_| get(v.addr, "/").status).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    // An exchange is recorded once its answer is written, so the last one may still be on its
    // way into the counters when the client has its answer.
    let unrouted =
        "veloxy_requests_total{listener=\"\",route=\"none\",upstream=\"\",status=\"4xx\"}";
    let mut text = String::new();
    eventually(Duration::from_secs(5), || {
        text = admin(a, "GET", "/metrics").body_str();
        text.lines().any(|l| l == format!("{unrouted} 3"))
    });
    assert_eq!(metric(&text, "veloxy_rate_limited_total"), 3.0);
    assert_eq!(metric(&text, unrouted), 3.0);
}

#[test]
fn healthz_upstreams_and_unknown_paths() {
    let up = upstream(&[]);
    let v = veloxy(&config_with_admin(&[up.addr], ""));
    let a = admin_addr(&v);
    let r = admin(a, "GET", "/healthz");
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok\n"));
    let r = admin(a, "GET", "/upstreams");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.body_str();
    assert!(body.contains("\"name\":\"app\""), "{body}");
    assert!(
        body.contains(&format!("\"addr\":\"{}\"", up.addr)),
        "{body}"
    );
    assert!(body.contains("\"usable\":true"), "{body}");

    // Per-worker figures: a pooled connection and a latency EWMA after some traffic, and a
    // request in flight while a slow one is pending.
    for _ in 0..5 {
        assert_eq!(get(v.addr, "/delay/2").status, 200);
    }
    let backend = |a| -> serde_json::Value {
        let r = admin(a, "GET", "/upstreams");
        let v: serde_json::Value = serde_json::from_str(&r.body_str()).unwrap();
        v["upstreams"][0]["backends"][0].clone()
    };
    assert!(
        eventually(Duration::from_secs(5), || {
            let b = backend(a);
            b["idle_connections"].as_u64() >= Some(1)
                && b["ewma_latency_ms"].as_f64().is_some_and(|e| e >= 1.0)
                && b["in_flight"] == 0
        }),
        "{}",
        backend(a)
    );
    let mut slow = Client::connect(v.addr);
    slow.send(b"GET /delay/3000 HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(
        eventually(Duration::from_secs(2), || backend(a)["in_flight"] == 1),
        "{}",
        backend(a)
    );
    assert_eq!(backend(a)["workers"].as_array().map(Vec::len), Some(2));
    drop(slow);
    assert_eq!(admin(a, "GET", "/nope").status, 404);
    assert_eq!(admin(a, "GET", "/reload").status, 405);
}

#[test]
fn post_reload_swaps_a_good_config_and_refuses_a_bad_one() {
    let a_up = upstream(&["--name", "a"]);
    let b_up = upstream(&["--name", "b"]);
    let v = veloxy(&config_with_admin(&[a_up.addr], ""));
    let admin_at = admin_addr(&v);
    let path = v.dir.path().join("veloxy.toml");
    assert_eq!(get(v.addr, "/").header("x-upstream"), Some("a"));

    std::fs::write(
        &path,
        "[listeners.web]\naddr = \"127.0.0.1:0\"\nnot_a_key = 1\n",
    )
    .unwrap();
    let r = admin(admin_at, "POST", "/reload");
    assert_eq!(r.status, 400);
    assert!(
        r.body_str().contains("not_a_key"),
        "the error names the key: {}",
        r.body_str()
    );
    assert_eq!(
        get(v.addr, "/").header("x-upstream"),
        Some("a"),
        "the old config keeps serving"
    );

    let good = config_with_admin(&[b_up.addr], "")
        .replace(
            "addr = \"127.0.0.1:0\"\n[[routes]]",
            &format!("addr = \"{}\"\n[[routes]]", v.addr),
        )
        .replace(
            "admin = \"127.0.0.1:0\"",
            &format!("admin = \"{admin_at}\""),
        );
    std::fs::write(&path, good).unwrap();
    let r = admin(admin_at, "POST", "/reload");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(get(v.addr, "/").header("x-upstream"), Some("b"));
}

/// `GET /memory`: the loaded config's routes, hosts and backends with their bytes, each kind
/// bounded per object (issue 36), and the process's resident size.
#[test]
fn memory_reports_bytes_per_route_host_and_backend() {
    let up = upstream(&[]);
    let mut routes = String::new();
    for h in 0..50 {
        for p in 0..4 {
            routes.push_str(&format!(
                "[[routes]]\nhost = \"h{h}.example.test\"\npath = \"/p{p}/\"\nupstream = \"app\"\n"
            ));
        }
    }
    let servers: Vec<String> = (0..30)
        .map(|i| format!("\"127.0.0.1:{}\"", 20000 + i))
        .collect();
    let config = format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n{routes}\
         [upstreams.app]\nservers = [\"{}\", {}]\n",
        up.addr,
        servers.join(", ")
    );
    let v = veloxy(&config);
    let r = admin(admin_addr(&v), "GET", "/memory");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let j: serde_json::Value = serde_json::from_str(&r.body_str()).unwrap();
    let kind = |k: &str| {
        let o = &j[k];
        let n = |f: &str| o[f].as_u64().unwrap_or_else(|| panic!("{k}.{f} in {j}"));
        (n("count"), n("bytes"), n("bytes_each"))
    };
    let (routes_n, route_bytes, per_route) = kind("routes");
    assert_eq!(routes_n, 200, "{j}");
    assert_eq!(per_route, route_bytes / 200, "{j}");
    assert!(
        (64..=1024).contains(&per_route),
        "a route takes {per_route} bytes: {j}"
    );
    let (hosts_n, _, per_host) = kind("hosts");
    assert_eq!(hosts_n, 50, "{j}");
    assert!(
        (16..=256).contains(&per_host),
        "a host takes {per_host} bytes: {j}"
    );
    let (backends_n, _, per_backend) = kind("backends");
    assert_eq!(backends_n, 31, "{j}");
    assert!(
        (32..=1024).contains(&per_backend),
        "a backend takes {per_backend} bytes: {j}"
    );
    let resident = j["resident_bytes"].as_u64().unwrap();
    assert!(resident > 1 << 20, "{j}");
    assert_eq!(admin(admin_addr(&v), "POST", "/memory").status, 405);
}
