//! Zero-downtime binary upgrade: start the new process with `--upgrade` on the same addresses
//! (SO_REUSEPORT), then SIGTERM the old one. No connection may be refused or reset, no request
//! may fail. The admin endpoint is set too: its port is shared the same way.
//!
//! Needs `net.ipv4.tcp_migrate_req = 1` so connections still in the old socket's handshake
//! queue move to the new process when the old socket closes. The test sets it when it can
//! (CI runs as root) and skips with a message when it cannot.

use veloxy_testkit::*;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn migrate_req_enabled() -> bool {
    const KNOB: &str = "/proc/sys/net/ipv4/tcp_migrate_req";
    if std::fs::read_to_string(KNOB).is_ok_and(|v| v.trim() == "1") {
        return true;
    }
    std::fs::write(KNOB, "1").is_ok()
        && std::fs::read_to_string(KNOB).is_ok_and(|v| v.trim() == "1")
}

#[test]
fn reuseport_handover_refuses_no_connection() {
    if !migrate_req_enabled() {
        return skip("net.ipv4.tcp_migrate_req is not 1 and cannot be set here");
    }
    let up = upstream(&[]);
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (port, admin_port) = (free_port(), free_port());
    let config = simple_config(&[up.addr], "")
        .replace(
            "workers = 1",
            &format!("workers = 2\nadmin = \"127.0.0.1:{admin_port}\""),
        )
        .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let mut old = veloxy(&config);
    let addr = old.addr;
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (stop, served, failures) = (stop.clone(), served.clone(), failures.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(20) {
                    // A fresh connection each time: the handover is about new connections.
                    let mut c = match Client::try_connect(addr) {
                        Ok(c) => c,
                        Err(e) => {
                            failures.lock().unwrap().push(format!("connect: {e}"));
                            continue;
                        }
                    };
                    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
                    match c.try_read_response(false) {
                        Some(r) if r.status == 200 => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(r) => failures
                            .lock()
                            .unwrap()
                            .push(format!("status {}", r.status)),
                        None => failures
                            .lock()
                            .unwrap()
                            .push("closed without a response".into()),
                    }
                }
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(10), || served
        .load(Ordering::Relaxed)
        > 200));

    // The new process binds the same ports while the old one still serves.
    let new = veloxy_with(std::process::Command::new(VELOXY), &config, &["--upgrade"]);
    assert_eq!(new.addr, addr);
    assert!(
        eventually(Duration::from_secs(5), || new.proc.log_text().lines().any(
            |l| l.contains("admin endpoint ready") && l.contains(&format!("addr={admin}"))
        )),
        "the new process shares the admin port: {}",
        new.proc.log_text()
    );
    let before = served.load(Ordering::Relaxed);
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &old.proc.pid().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(
        eventually(Duration::from_secs(10), || old
            .proc
            .child
            .try_wait()
            .unwrap()
            .is_some()),
        "old process drains and exits"
    );
    assert!(old.proc.child.try_wait().unwrap().unwrap().success());
    assert!(eventually(Duration::from_secs(10), || served
        .load(Ordering::Relaxed)
        > before + 300));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let health = get(admin, "/healthz");
    assert_eq!(
        health.status, 200,
        "the new process answers on the admin port"
    );
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failures during the handover: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}
