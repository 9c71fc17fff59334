//! [`auth_server`]: a small real forward-auth service (in the manner of Authelia's verify
//! endpoint) for `forward_auth` tests; [`htpasswd`] and [`basic_credentials`] for the
//! `basic_auth` tests.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

/// A running auth service: its address and the request heads it received.
pub struct AuthServer {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<String>>>,
}

/// Starts the service on 127.0.0.1. A request with `Cookie: ...session=good...` or
/// `Authorization: Bearer ok` passes (200 with `Remote-User: alice`, `Remote-Groups: admins`,
/// `Remote-Email: alice@example.com`, `X-Other: no`); anything else gets a 302 to
/// `https://auth.example.com/?rd=<X-Forwarded-Uri>` with a `Set-Cookie` and a body `login`.
pub fn auth_server() -> AuthServer {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut head = String::new();
                let mut r = BufReader::new(s.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                let lower = head.to_ascii_lowercase();
                let pass =
                    lower.contains("session=good") || lower.contains("authorization: bearer ok");
                let uri = head
                    .lines()
                    .find_map(|l| l.strip_prefix("X-Forwarded-Uri: "))
                    .unwrap_or("")
                    .to_owned();
                log.lock().unwrap().push(head);
                let answer = if pass {
                    "HTTP/1.1 200 OK\r\nRemote-User: alice\r\nRemote-Groups: admins\r\n\
                     Remote-Email: alice@example.com\r\nX-Other: no\r\nContent-Length: 0\r\n\r\n"
                        .to_owned()
                } else {
                    format!(
                        "HTTP/1.1 302 Found\r\nLocation: https://auth.example.com/?rd={uri}\r\n\
                         Set-Cookie: auth_flow=1\r\nX-Internal: secret\r\nContent-Length: 5\r\n\r\nlogin"
                    )
                };
                let _ = s.write_all(answer.as_bytes());
            });
        }
    });
    AuthServer { addr, seen }
}

/// Makes or extends a users file with Apache's `htpasswd -b`, with `options` before the path
/// (`["-c", "-B", "-C", "5"]`: create, bcrypt at cost 5; `["-m"]`: add an apr1 user). False
/// when htpasswd is not installed or fails (the caller reports the test skipped).
pub fn htpasswd(path: &std::path::Path, user: &str, password: &str, options: &[&str]) -> bool {
    std::process::Command::new("htpasswd")
        .arg("-b")
        .args(options)
        .arg(path)
        .args([user, password])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The `Authorization` value of HTTP Basic credentials.
pub fn basic_credentials(user: &str, password: &str) -> String {
    use base64::Engine;
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}
