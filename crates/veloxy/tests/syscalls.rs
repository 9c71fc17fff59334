//! The syscalls of keep-alive HTTP/1.1 requests through the proxy, counted by strace attached
//! to the running veloxy: a request whose head came in a short read leaves no `recv` that
//! returns EAGAIN before the next request's wait (that would be one syscall in five).

use veloxy_testkit::*;

use std::process::{Command, Stdio};
use std::time::Duration;

const REQUESTS: usize = 50;

/// Whether every thread of `pid` is traced (strace has attached to all of them).
fn all_traced(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("TracerPid:"))
                    .map(|v| v.trim() != "0")
            })
            .unwrap_or(false)
    })
}

/// Whether the worker thread of `pid` is blocked waiting for events (its next request's
/// wait has begun; a client that sends only then is one that paused between requests).
fn worker_waits(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        read("comm").trim() == "veloxy-w0" && read("wchan").trim() == "do_epoll_wait"
    })
}

#[test]
fn keepalive_requests_make_no_recv_that_would_block() {
    if !require("strace", "-V", "strace is not installed") {
        return;
    }
    let up = upstream(&["--name", "a"]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    let mut c = Client::connect(v.addr);
    let get = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    // The upstream connection is opened and pooled before counting starts.
    for _ in 0..3 {
        c.send(get);
        assert_eq!(c.read_response(false).status, 200);
    }

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("strace.txt");
    let mut strace = Command::new("strace")
        .args(["-f", "-e", "trace=recvfrom,recvmsg,read", "-o"])
        .arg(&out)
        .args(["-p", &v.proc.pid().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("strace");
    let pid = v.proc.pid();
    if !eventually(Duration::from_secs(5), || all_traced(pid)) {
        let _ = strace.kill();
        let _ = strace.wait();
        skip("strace cannot attach (ptrace refused)");
        return;
    }
    for _ in 0..REQUESTS {
        // Sent once the worker waits, as a client that pauses between requests (back to back,
        // the next head may be there before the wait, and no read would block either way).
        assert!(eventually(Duration::from_secs(2), || worker_waits(pid)));
        c.send(get);
        assert_eq!(c.read_response(false).status, 200);
    }
    // strace detaches and flushes on SIGINT.
    let _ = Command::new("kill")
        .args(["-INT", &strace.id().to_string()])
        .status();
    let _ = strace.wait();

    let text = std::fs::read_to_string(&out).unwrap();
    let recvs = text.lines().filter(|l| l.contains("recvfrom(")).count();
    let would_block = text
        .lines()
        .filter(|l| l.contains("recvfrom(") && l.contains("EAGAIN"))
        .count();
    // Each request: its head from the client and the response from the upstream.
    assert!(
        recvs >= 2 * REQUESTS,
        "strace saw {recvs} recvfrom calls for {REQUESTS} requests:\n{text}"
    );
    assert!(
        would_block <= REQUESTS / 10,
        "{would_block} of {recvs} recvfrom calls returned EAGAIN for {REQUESTS} requests:\n{}",
        text.lines().take(40).collect::<Vec<_>>().join("\n")
    );
}
