//! Idle keep-alive connections parked off the runtime (`[server] park_idle_after`): they stay
//! open and counted, serve their next request (even one whose head arrives in pieces), are
//! closed when their client closes, and idle out at the keep-alive timeout.

use veloxy_testkit::*;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn admin(addr: SocketAddr, path: &str) -> String {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    request(addr, &raw).body_str()
}

/// The value of the metric line starting with `prefix` (0 when absent).
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

const PARKED: &str = "veloxy_downstream_parked_connections ";
const OPEN: &str = "veloxy_downstream_connections{listener=\"web\"}";

/// Waits (bounded) until the parked and open gauges read `parked` and `open`.
fn gauges_reach(a: SocketAddr, parked: f64, open: f64) -> bool {
    let mut text = String::new();
    let ok = eventually(Duration::from_secs(5), || {
        text = admin(a, "/metrics");
        metric(&text, PARKED) == parked && metric(&text, OPEN) == open
    });
    if !ok {
        eprintln!("wanted parked {parked}, open {open}; metrics:\n{text}");
    }
    ok
}

fn veloxy_parking(up: SocketAddr, park_idle_after: &str, keepalive: &str) -> Veloxy {
    let server = format!(
        "workers = 1\nadmin = \"127.0.0.1:0\"\npark_idle_after = \"{park_idle_after}\"\nkeepalive_timeout = \"{keepalive}\""
    );
    veloxy(&simple_config(&[up], "").replace("workers = 1", &server))
}

#[test]
fn parked_connections_serve_their_next_request_and_close_with_their_client() {
    let up = upstream(&["--name", "a"]);
    let v = veloxy_parking(up.addr, "50ms", "30s");
    let a = admin_addr(&v);
    let mut clients: Vec<Client> = (0..20).map(|_| Client::connect(v.addr)).collect();
    for c in &mut clients {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).status, 200);
    }
    // Idle for 50 ms, every one parks, and each is still an open connection.
    assert!(gauges_reach(a, 20.0, 20.0));

    // The next request wakes its connection; the other 19 stay parked meanwhile.
    for (i, c) in clients.iter_mut().enumerate() {
        if i % 2 == 0 {
            c.send(b"GET /size/5000 HTTP/1.1\r\nHost: a\r\n\r\n");
        } else {
            // A head in two pieces: the first wakes it, the rest follows.
            c.send(b"GET /size/5000 HTTP/1.1\r\n");
            std::thread::sleep(Duration::from_millis(5));
            c.send(b"Host: a\r\n\r\n");
        }
        let r = c.read_response(false);
        assert_eq!((r.status, r.body.len()), (200, 5000), "client {i}");
    }
    assert!(gauges_reach(a, 20.0, 20.0), "they park again");

    // Clients that close while parked are closed on veloxy's side too (no descriptor kept).
    clients.truncate(5);
    assert!(gauges_reach(a, 5.0, 5.0));
    for c in &mut clients {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        assert_eq!(c.read_response(false).status, 200);
        assert!(c.is_closed());
    }
    assert!(gauges_reach(a, 0.0, 0.0));
}

#[test]
fn parked_connections_idle_out_at_the_keepalive_timeout() {
    let up = upstream(&[]);
    let v = veloxy_parking(up.addr, "50ms", "600ms");
    let a = admin_addr(&v);
    let mut c = Client::connect(v.addr);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
    let idle = Instant::now();
    assert!(gauges_reach(a, 1.0, 1.0));
    assert!(c.is_closed(), "the parked connection was never closed");
    let waited = idle.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_millis(1800),
        "closed after {waited:?}, keep-alive timeout 600ms"
    );
    assert!(gauges_reach(a, 0.0, 0.0));
}

#[test]
fn a_zero_park_idle_after_never_parks() {
    let up = upstream(&[]);
    let v = veloxy_parking(up.addr, "0s", "500ms");
    let a = admin_addr(&v);
    let mut c = Client::connect(v.addr);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
    // It idles out in its task: closed at the keep-alive timeout, never counted as parked.
    assert!(c.is_closed());
    let text = admin(a, "/metrics");
    assert_eq!(metric(&text, PARKED), 0.0, "{text}");
    assert!(gauges_reach(a, 0.0, 0.0));
}

#[test]
fn memory_is_trimmed_only_once_no_request_is_in_flight() {
    // 600 clients that park count as memory freed (a trim is due from 512), while one slow
    // request is in flight: the trim (a pause of the whole worker) waits for it to finish.
    let up = upstream(&[]);
    let v = veloxy_parking(up.addr, "50ms", "30s");
    let a = admin_addr(&v);
    const TRIMS: &str = "veloxy_memory_trims_total ";
    let slow = std::thread::spawn({
        let addr = v.addr;
        move || get(addr, "/delay/3000").status
    });
    assert!(eventually(Duration::from_secs(5), || metric(
        &admin(a, "/metrics"),
        "veloxy_requests_in_flight "
    ) == 1.0));
    let mut clients: Vec<Client> = (0..600).map(|_| Client::connect(v.addr)).collect();
    for c in &mut clients {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).status, 200);
    }
    assert!(gauges_reach(a, 600.0, 601.0));
    // The heartbeat looks once a second: give it two looks while the request is in flight.
    let until = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < until {
        let text = admin(a, "/metrics");
        if metric(&text, "veloxy_requests_in_flight ") != 1.0 {
            break;
        }
        assert_eq!(
            metric(&text, TRIMS),
            0.0,
            "trimmed with a request in flight"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(slow.join().unwrap(), 200);
    assert!(
        eventually(Duration::from_secs(5), || metric(
            &admin(a, "/metrics"),
            TRIMS
        ) == 1.0),
        "no trim once the worker was idle"
    );
}
