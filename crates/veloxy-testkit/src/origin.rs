//! A scripted in-process HTTP/1.1 origin, for behaviour `veloxy-upstream` does not offer.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What a scripted origin does with one request (given its request line).
pub enum Reply {
    /// Answer with this status after this delay.
    Status(u16, Duration),
    /// Never answer (keep the connection open).
    Hang,
}

/// A threaded HTTP/1.1 origin whose behaviour a test scripts per request, with a hit counter.
/// Responses carry `x-upstream: NAME`.
pub struct Origin {
    pub addr: SocketAddr,
    pub hits: Arc<std::sync::atomic::AtomicUsize>,
}

pub fn origin(
    name: &'static str,
    behaviour: impl Fn(&str) -> Reply + Send + Sync + 'static,
) -> Origin {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let behaviour = Arc::new(behaviour);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let counter = counter.clone();
            let behaviour = behaviour.clone();
            std::thread::spawn(move || loop {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let line = text.lines().next().unwrap_or("").to_string();
                if !line.contains("/health") {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                match behaviour(&line) {
                    Reply::Hang => {
                        std::thread::sleep(Duration::from_secs(30));
                        return;
                    }
                    Reply::Status(status, delay) => {
                        std::thread::sleep(delay);
                        let body = format!("{name}\n");
                        let resp = format!(
                            "HTTP/1.1 {status} X\r\nx-upstream: {name}\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(resp.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Origin { addr, hits }
}

/// A raw TCP origin on 127.0.0.1: each accepted connection is handed to `serve` on a thread
/// of its own, for exact control over the bytes an upstream sends.
pub fn tcp_origin(serve: impl Fn(std::net::TcpStream) + Clone + Send + 'static) -> SocketAddr {
    tcp_origin_on("127.0.0.1", serve)
}

/// [`tcp_origin`] on address `ip` (a TEST-NET address inside a test's network namespace).
pub fn tcp_origin_on(
    ip: &str,
    serve: impl Fn(std::net::TcpStream) + Clone + Send + 'static,
) -> SocketAddr {
    let l = std::net::TcpListener::bind(format!("{ip}:0")).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { break };
            let serve = serve.clone();
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

/// A TCP echo server on address `ip`: every connection gets back the bytes it sends.
pub fn tcp_echo(ip: &str) -> SocketAddr {
    tcp_origin_on(ip, |mut s: std::net::TcpStream| {
        use std::io::{Read, Write};
        let mut buf = [0u8; 8192];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    })
}
