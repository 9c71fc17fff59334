//! Upstream keep-alive pool edge cases, against hand-driven upstream sockets.

use veloxy_testkit::*;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Sends our FIN and waits (2 s at most) until the peer's kernel has acknowledged it (TCP
/// state FIN_WAIT2 or later): from then on the peer's socket reads as closed. Under load,
/// loopback delivery of a FIN can lag behind packets other threads send later, so "we
/// closed" alone does not mean "the peer can see it".
fn close_and_wait_for_ack(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let _ = s.shutdown(std::net::Shutdown::Write);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: a valid socket and a buffer of the advertised size.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        // FIN_WAIT1 (4) means our FIN is not acknowledged yet; ESTABLISHED (1) not sent.
        if rc != 0 || !matches!(info.tcpi_state, 1 | 4) {
            return;
        }
        std::thread::yield_now();
    }
}

/// Reads one request head (and a Content-Length body) from `s`; false on EOF.
fn read_request(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => buf.push(b[0]),
            _ => return false,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    if let Some(len) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
    }
    true
}

/// An upstream that answers the first request on each connection, then closes the connection
/// when a second request arrives on it, without answering: the race where a pooled connection
/// dies just as it is reused.
fn closing_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counter = conns.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            counter.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                if read_request(&mut s) {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                }
                // Second request: read it, then close without a response.
                let _ = read_request(&mut s);
            });
        }
    });
    (addr, conns)
}

#[test]
fn stale_pooled_connection_is_retried_for_idempotent_requests() {
    let (addr, conns) = closing_upstream();
    let v = veloxy(&simple_config(&[addr], ""));
    assert_eq!(get(v.addr, "/one").status, 200);
    // Reuses the pooled connection, which the upstream closes on this request: veloxy must
    // retry once on a fresh connection rather than fail.
    let r = get(v.addr, "/two");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(conns.load(Ordering::SeqCst), 2);
}

#[test]
fn stale_pooled_connection_is_not_retried_for_post() {
    let (addr, conns) = closing_upstream();
    let v = veloxy(&simple_config(&[addr], ""));
    assert_eq!(get(v.addr, "/one").status, 200);
    let r = request(
        v.addr,
        "POST /pay HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    );
    assert_eq!(r.status, 502, "a non-idempotent request is never replayed");
    assert_eq!(conns.load(Ordering::SeqCst), 1);
}

#[test]
fn upstream_closing_after_response_is_detected_before_reuse() {
    // An upstream that answers once per connection and closes silently (no Connection: close),
    // then tells the test it has closed, once veloxy's kernel has acknowledged the FIN. Waiting
    // for that signal before the next request makes the test deterministic: the FIN is already
    // queued at veloxy when the request arrives, so a proxy that checks pooled connections
    // before reuse never sends on a dead one (a POST would then be a 502, since it must not be
    // replayed). Without the wait this is the unavoidable keep-alive race every proxy has.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (closed_tx, closed_rx) = std::sync::mpsc::channel::<usize>();
    std::thread::spawn(move || {
        for (n, s) in l.incoming().enumerate() {
            let Ok(mut s) = s else { break };
            if read_request(&mut s) {
                let body = format!("{}", n + 1);
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes());
            }
            close_and_wait_for_ack(&s);
            drop(s);
            let _ = closed_tx.send(n + 1);
        }
    });
    let v = veloxy(&simple_config(&[addr], ""));
    let mut c = Client::connect(v.addr);
    for i in 1..=5 {
        c.send(b"POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx");
        let r = c.read_response(false);
        assert_eq!(r.status, 200, "request {i}: {}", r.body_str());
        assert_eq!(
            r.body_str(),
            i.to_string(),
            "one upstream connection per request"
        );
        let closed = closed_rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("upstream closed its connection");
        assert_eq!(closed, i);
    }
}
