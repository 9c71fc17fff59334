//! Backends that change at run time: `dns` and `srv` servers resolved through a real DNS
//! server (dnsmasq) whose records the tests change under load, and the runtime API's
//! `PUT /upstreams/NAME/servers`. Not one request may fail while the set moves.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use veloxy_testkit::*;

/// GETs in a loop (at most 60 s) recording which upstream answered; counts failures.
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
    thread: Option<JoinHandle<Vec<String>>>,
}

impl Load {
    fn start(web: SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let mut failures = Vec::new();
            let started = Instant::now();
            while !s2.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                let r = get(web, "/");
                if r.status != 200 {
                    failures.push(format!("{} {}", r.status, r.body_str()));
                }
                let name = r.header("x-upstream").unwrap_or("").to_owned();
                seen2.lock().unwrap().push((Instant::now(), name));
            }
            failures
        });
        Load {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// The upstreams that answered after `t`.
    fn since(&self, t: Instant) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at > t)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// Waits (10 s at most) until, over 300 ms, answers came only from `names`, each of them
    /// at least once; returns that window's answers.
    fn settles_on(&self, names: &[&str]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(300));
            let got = self.since(t);
            let only = got.iter().all(|n| names.contains(&n.as_str()));
            let each = names.iter().all(|n| got.iter().any(|g| g == n));
            if only && each && !got.is_empty() {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "traffic never settled on {names:?}: last window {got:?}"
            );
        }
    }

    /// Stops the load; the failed requests.
    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A port free on both 127.0.0.2 and 127.0.0.3, and an upstream named `name` on `ip`.
fn free_port_on_two() -> u16 {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.3", port)).is_ok() {
            return port;
        }
    }
}

fn named_upstream(name: &str, ip: &str, port: u16) -> Upstream {
    upstream(&["--name", name, "--listen", &format!("{ip}:{port}")])
}

/// `workers` workers, an admin endpoint, DNS through `dns`, and every request to group `app`
/// whose one server is `entry` (`dns = ...` or `srv = ...`), resolved every 200 ms.
fn discovery_config(workers: usize, dns: SocketAddr, entry: &str) -> String {
    format!(
        "[server]\nworkers = {workers}\nadmin = \"127.0.0.1:0\"\nresolvers = [\"{dns}\"]\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [{{ {entry}, resolve = \"200ms\" }}]\n"
    )
}

fn upstreams_json(v: &Veloxy) -> String {
    admin_call(v, "GET", "/upstreams", "").body_str()
}

#[test]
fn dns_servers_follow_a_records_with_no_failed_request() {
    let Some(mut dns) = Dns::start(&[("127.0.0.2", "app.internal")], &[]) else {
        return;
    };
    let port = free_port_on_two();
    let (_a, _b) = (
        named_upstream("a", "127.0.0.2", port),
        named_upstream("b", "127.0.0.3", port),
    );
    let v = veloxy(&discovery_config(
        2,
        dns.addr,
        &format!("dns = \"app.internal:{port}\""),
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    // The first lookup is done before the listener serves.
    assert_eq!(get(web, "/").header("x-upstream"), Some("a"));
    let load = Load::start(web);
    load.settles_on(&["a"]);

    dns.set_hosts(&[("127.0.0.2", "app.internal"), ("127.0.0.3", "app.internal")]);
    load.settles_on(&["a", "b"]);
    dns.set_hosts(&[("127.0.0.3", "app.internal")]);
    load.settles_on(&["b"]);
    let ups = upstreams_json(&v);
    assert!(ups.contains(&format!("127.0.0.3:{port}")), "{ups}");
    assert!(!ups.contains(&format!("127.0.0.2:{port}")), "{ups}");

    // The DNS server goes away: the last good set keeps serving.
    dns.stop();
    assert!(
        eventually(Duration::from_secs(15), || v
            .proc
            .log_text()
            .contains("keeping the last good set")),
        "{}",
        v.proc.log_text()
    );
    load.settles_on(&["b"]);
    let failures = load.finish();
    assert!(failures.is_empty(), "failed requests: {failures:?}");
}

#[test]
fn srv_servers_follow_targets_ports_and_weights() {
    let hosts = [("127.0.0.2", "a.internal"), ("127.0.0.3", "b.internal")];
    let (pa, pb) = (free_port_on_two(), free_port_on_two());
    let Some(mut dns) = Dns::start(
        &hosts,
        &[("_http._tcp.app.internal", "a.internal", pa, 0, 1)],
    ) else {
        return;
    };
    let (_a, _b) = (
        named_upstream("a", "127.0.0.2", pa),
        named_upstream("b", "127.0.0.3", pb),
    );
    let v = veloxy(&discovery_config(
        2,
        dns.addr,
        "srv = \"_http._tcp.app.internal\"",
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let load = Load::start(web);
    load.settles_on(&["a"]);

    // b joins with three times a's weight (the restart is a short DNS outage).
    dns.set_srv(&[
        ("_http._tcp.app.internal", "a.internal", pa, 0, 1),
        ("_http._tcp.app.internal", "b.internal", pb, 0, 3),
    ]);
    load.settles_on(&["a", "b"]);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let window = load.since(t);
    let b = window.iter().filter(|n| *n == "b").count() as f64;
    let a = window.iter().filter(|n| *n == "a").count().max(1) as f64;
    assert!((2.0..=4.0).contains(&(b / a)), "b/a = {b}/{a}, weights 3/1");

    // A higher-priority record set: only priority 0 serves, so b alone.
    dns.set_srv(&[
        ("_http._tcp.app.internal", "b.internal", pb, 0, 1),
        ("_http._tcp.app.internal", "a.internal", pa, 10, 1),
    ]);
    load.settles_on(&["b"]);
    let failures = load.finish();
    assert!(failures.is_empty(), "failed requests: {failures:?}");
}

#[test]
fn a_group_waiting_for_dns_answers_503_fast_then_serves() {
    let port = free_port_on_two();
    let _a = named_upstream("a", "127.0.0.2", port);
    // The resolver's port is reserved now; dnsmasq starts on it later.
    let Some(mut dns) = Dns::start(&[("127.0.0.2", "app.internal")], &[]) else {
        return;
    };
    dns.stop();
    let v = veloxy(&discovery_config(
        1,
        dns.addr,
        &format!("dns = \"app.internal:{port}\""),
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let t = Instant::now();
    let r = get(web, "/");
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    dns.restart();
    assert!(
        eventually(Duration::from_secs(10), || get(web, "/").status == 200),
        "{} {} {}",
        v.proc.log_text(),
        upstreams_json(&v),
        get(web, "/").body_str()
    );
    assert_eq!(get(web, "/").header("x-upstream"), Some("a"));
}

#[test]
fn put_replaces_the_set_under_load_and_a_reload_restores_the_file() {
    let (a, b, c) = (
        upstream(&["--name", "a"]),
        upstream(&["--name", "b"]),
        upstream(&["--name", "c"]),
    );
    let config = format!(
        "[server]\nworkers = 2\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"{}\", \"{}\"]\n",
        a.addr, b.addr
    );
    let v = veloxy(&config);
    let web = logged_addr(&v, "listening listener=web addr=");
    let load = Load::start(web);
    load.settles_on(&["a", "b"]);

    for (body, why) in [
        ("not json", "not JSON"),
        ("[]", "1 to 65535"),
        ("[\"https://127.0.0.1:1\"]", "plain"),
        ("[{\"addr\": \"127.0.0.1:1\", \"weight\": 0}]", "weight"),
    ] {
        let r = admin_call(&v, "PUT", "/upstreams/app/servers", body);
        assert_eq!(r.status, 400, "{body}: {}", r.body_str());
        assert!(r.body_str().contains(why), "{body}: {}", r.body_str());
    }
    assert_eq!(
        admin_call(&v, "PUT", "/upstreams/nope/servers", "[]").status,
        404
    );

    let r = admin_call(
        &v,
        "PUT",
        "/upstreams/app/servers",
        &format!(
            "{{\"servers\": [\"{}\", {{\"addr\": \"{}\", \"weight\": 2}}]}}",
            b.addr, c.addr
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    // Every worker within 100 ms.
    let applied = Instant::now() + Duration::from_millis(100);
    load.settles_on(&["b", "c"]);
    assert!(load.since(applied).iter().all(|n| n != "a"));
    let ups = upstreams_json(&v);
    assert!(
        ups.contains(&c.addr.to_string()) && !ups.contains(&a.addr.to_string()),
        "{ups}"
    );

    // A reload puts the file's set back (runtime_overrides defaults to "reset").
    reload_with(&v, &config, "reloaded ");
    load.settles_on(&["a", "b"]);
    let failures = load.finish();
    assert!(failures.is_empty(), "failed requests: {failures:?}");
}

#[test]
fn put_sets_survive_a_reload_with_runtime_overrides_keep() {
    let (a, c) = (upstream(&["--name", "a"]), upstream(&["--name", "c"]));
    let config = format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"{}\"]\nruntime_overrides = \"keep\"\n",
        a.addr
    );
    let v = veloxy(&config);
    let web = logged_addr(&v, "listening listener=web addr=");
    let r = admin_call(
        &v,
        "PUT",
        "/upstreams/app/servers",
        &format!("[\"{}\"]", c.addr),
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert!(eventually(Duration::from_secs(2), || {
        get(web, "/").header("x-upstream") == Some("c")
    }));
    reload_with(&v, &config, "reloaded ");
    for _ in 0..10 {
        assert_eq!(get(web, "/").header("x-upstream"), Some("c"));
    }
}
