//! Test harness: real `veloxy` and `veloxy-upstream` processes on 127.0.0.1 ephemeral ports,
//! readiness taken from the lines they print, and a raw HTTP/1.1 client for exact wire control.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const VELOXY: &str = env!("CARGO_BIN_EXE_veloxy");
pub const UPSTREAM: &str = env!("CARGO_BIN_EXE_veloxy-upstream");

/// Kills the child when dropped, so a failing test leaves no process behind.
pub struct Proc {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }
}

/// Reads lines from `r` on a thread until one contains `marker`; returns it. Lines keep being
/// collected into `log` afterwards so the pipe never fills up.
fn wait_for_line(
    r: impl Read + Send + 'static,
    marker: &'static str,
    log: Arc<Mutex<Vec<String>>>,
) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if line.contains(marker) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(line.clone());
                }
            }
            log.lock().unwrap().push(line);
        }
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("process never printed {marker:?}"))
}

pub struct Upstream {
    pub proc: Proc,
    pub addr: SocketAddr,
}

/// Starts a test upstream with extra args (`--name`, `--close-after`, ...).
pub fn upstream(args: &[&str]) -> Upstream {
    let mut child = Command::new(UPSTREAM)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn veloxy-upstream");
    let log = Arc::new(Mutex::new(Vec::new()));
    let line = wait_for_line(child.stdout.take().unwrap(), "listening", log.clone());
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .expect("upstream address");
    Upstream {
        proc: Proc { child, log },
        addr,
    }
}

pub struct Veloxy {
    pub proc: Proc,
    /// Address of the first listener (or the only one).
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
}

/// Writes `config` to a temp file and runs `veloxy run --config` on it. Listener addresses in
/// the config should use port 0; the bound port is read from the "listening" log line.
pub fn veloxy(config: &str) -> Veloxy {
    veloxy_with(Command::new(VELOXY), config, &[])
}

/// Like [`veloxy`], from a prepared command (e.g. with a lowered descriptor limit) and with
/// extra `run` arguments (e.g. `--upgrade`).
pub fn veloxy_with(cmd: Command, config: &str, extra: &[&str]) -> Veloxy {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("veloxy.toml");
    std::fs::write(&path, config).unwrap();
    let mut args = vec!["run", "--config", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    veloxy_cmd(cmd, &args, dir)
}

pub fn veloxy_cmd(mut cmd: Command, args: &[&str], dir: tempfile::TempDir) -> Veloxy {
    let mut child = cmd
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("VELOXY_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn veloxy");
    let log = Arc::new(Mutex::new(Vec::new()));
    let line = wait_for_line(child.stderr.take().unwrap(), "listening", log.clone());
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .expect("addr= in listening line")
        .parse()
        .expect("listener address");
    Veloxy {
        proc: Proc { child, log },
        addr,
        dir,
    }
}

/// A config with one listener on an ephemeral port and one upstream group.
pub fn simple_config(servers: &[SocketAddr], extra_upstream: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [{}]\n{extra_upstream}\n",
        list.join(", ")
    )
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Raw head bytes.
    pub head: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A raw client connection.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Like [`Client::connect`], but reports a refused or failed connect instead of panicking.
    pub fn try_connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: Vec::new(),
        })
    }

    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.stream.write_all(raw).expect("write request");
    }

    fn fill(&mut self) -> usize {
        let mut tmp = [0u8; 65536];
        match self.stream.read(&mut tmp) {
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                n
            }
            Err(_) => 0,
        }
    }

    /// Reads one response; `head_request` for responses to HEAD. Panics on EOF mid-message.
    pub fn read_response(&mut self, head_request: bool) -> Response {
        self.try_read_response(head_request)
            .expect("connection closed before a response")
    }

    /// `None` if the connection closed before a full head arrived.
    pub fn try_read_response(&mut self, head_request: bool) -> Option<Response> {
        let (status, headers, head_len) = loop {
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut hs);
            if let httparse::Status::Complete(n) = r.parse(&self.buf).expect("valid response head")
            {
                let headers: Vec<(String, String)> = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                break (r.code.unwrap(), headers, n);
            }
            if self.fill() == 0 {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_len]).into_owned();
        self.buf.drain(..head_len);
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let mut resp = Response {
            status,
            headers: headers.clone(),
            body: Vec::new(),
            head,
        };
        if (100..200).contains(&status) {
            return Some(resp);
        }
        if head_request || status == 204 || status == 304 {
            return Some(resp);
        }
        if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            resp.body = self.read_chunked();
        } else if let Some(len) = get("content-length") {
            let len: usize = len.trim().parse().unwrap();
            while self.buf.len() < len {
                assert!(self.fill() > 0, "EOF inside body");
            }
            resp.body = self.buf.drain(..len).collect();
        } else {
            while self.fill() > 0 {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Some(resp)
    }

    fn read_chunked(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(self.fill() > 0, "EOF in chunk size");
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap();
            self.buf.drain(..line_end + 2);
            if size == 0 {
                // Trailers until the empty line.
                loop {
                    let e = loop {
                        if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                            break i;
                        }
                        assert!(self.fill() > 0, "EOF in trailers");
                    };
                    self.buf.drain(..e + 2);
                    if e == 0 {
                        return body;
                    }
                }
            }
            while self.buf.len() < size + 2 {
                assert!(self.fill() > 0, "EOF in chunk");
            }
            body.extend_from_slice(&self.buf[..size]);
            assert_eq!(&self.buf[size..size + 2], b"\r\n");
            self.buf.drain(..size + 2);
        }
    }

    /// True when the server closed the connection (EOF) within the timeout.
    pub fn is_closed(&mut self) -> bool {
        self.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        if !self.buf.is_empty() {
            return false;
        }
        let mut tmp = [0u8; 1024];
        matches!(self.stream.read(&mut tmp), Ok(0) | Err(_))
    }
}

/// One request on a fresh connection.
pub fn request(addr: SocketAddr, raw: &str) -> Response {
    let mut c = Client::connect(addr);
    c.send(raw.as_bytes());
    c.read_response(raw.starts_with("HEAD "))
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: test.local\r\nConnection: close\r\n\r\n"),
    )
}

/// Reports the running test as skipped; the caller returns right after (`return skip(...)`).
///
/// libtest has no runtime skip, so a test that cannot run here still shows as `ok`. The line
/// `SKIPPED: <test>: <reason>` is written through `std::io::stderr()` rather than `eprintln!`
/// because libtest captures only the print macros: this way it shows in `cargo test` output
/// even though the test passes, and `.ci/run` lists every such line at the end of its run.
pub fn skip(reason: &str) {
    use std::io::Write;
    let current = std::thread::current();
    let test = current.name().unwrap_or("(unnamed test)");
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {reason}");
}

/// Polls `f` until it returns true or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

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

/// A config with one listener and one upstream group over `servers`, with extra group keys.
pub fn group_config(servers: &[SocketAddr], group_keys: &str, route_keys: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n{route_keys}\n[upstreams.app]\nservers = [{}]\n{group_keys}\n",
        list.join(", ")
    )
}

/// Writes `config` over the running veloxy's config file, sends SIGHUP, and waits until the
/// log shows one more line containing `outcome` ("reloaded" or "reload refused").
pub fn reload_with(v: &Veloxy, config: &str, outcome: &str) {
    let before = v.proc.log_text().matches(outcome).count();
    std::fs::write(v.dir.path().join("veloxy.toml"), config).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &v.proc.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        eventually(Duration::from_secs(5), || v
            .proc
            .log_text()
            .matches(outcome)
            .count()
            > before),
        "no {outcome:?} after SIGHUP: {}",
        v.proc.log_text()
    );
}
pub mod tls;
