//! A real DNS server (Debian's `dnsmasq`) on a loopback port, for the DNS discovery tests.
//!
//! A records come from a hosts file, re-read on SIGHUP; SRV records are command-line options,
//! so changing them restarts the server on the same port (a short outage the tests rely on:
//! veloxy must keep its last good set through it).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A SRV record: (service name, target, port, priority, weight).
pub type Srv = (&'static str, &'static str, u16, u16, u16);

/// A running dnsmasq answering only from what the test gives it; killed on drop.
pub struct Dns {
    pub addr: SocketAddr,
    child: Option<Child>,
    lines: Option<mpsc::Receiver<String>>,
    hosts: PathBuf,
    srv: Vec<Srv>,
    _dir: tempfile::TempDir,
}

impl Dns {
    /// Starts one with these A records (`(ip, name)`) and SRV records; `None` (and a SKIPPED
    /// line) without dnsmasq.
    pub fn start(hosts: &[(&str, &str)], srv: &[Srv]) -> Option<Dns> {
        if !crate::require("dnsmasq", "--version", "dnsmasq is not installed") {
            return None;
        }
        let port = free_dns_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut d = Dns {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child: None,
            lines: None,
            hosts: dir.path().join("hosts"),
            srv: srv.to_vec(),
            _dir: dir,
        };
        d.write_hosts(hosts);
        d.restart();
        Some(d)
    }

    fn write_hosts(&self, hosts: &[(&str, &str)]) {
        let text: String = hosts.iter().map(|(ip, n)| format!("{ip} {n}\n")).collect();
        std::fs::write(&self.hosts, text).expect("write hosts");
    }

    /// New A records: the hosts file is rewritten and re-read (SIGHUP), no restart.
    pub fn set_hosts(&mut self, hosts: &[(&str, &str)]) {
        self.write_hosts(hosts);
        let pid = self.child.as_ref().expect("running").id();
        crate::signal(pid, "-HUP");
        self.wait_line("read ");
    }

    /// New SRV records: restarts the server on the same port.
    pub fn set_srv(&mut self, srv: &[Srv]) {
        self.srv = srv.to_vec();
        self.restart();
    }

    /// Stops the server: lookups time out from now on.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// (Re)starts it on its port and waits until it says it is serving.
    pub fn restart(&mut self) {
        self.stop();
        // dnsmasq drops to `nobody` unless told otherwise, and `nobody` cannot read the hosts
        // file in our private temporary directory on SIGHUP.
        let user = Command::new("id")
            .arg("-un")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "root".into());
        let mut cmd = Command::new("dnsmasq");
        cmd.args([
            "--keep-in-foreground",
            "--log-facility=-",
            "--conf-file=/dev/null",
        ])
        .args([
            "--no-resolv",
            "--no-hosts",
            "--no-poll",
            "--bind-interfaces",
        ])
        .args([
            "--listen-address=127.0.0.1",
            "--cache-size=0",
            "--pid-file=",
        ])
        .arg(format!("--user={user}"))
        .arg(format!("--port={}", self.addr.port()))
        .arg(format!("--addn-hosts={}", self.hosts.display()));
        for (name, target, port, prio, weight) in &self.srv {
            cmd.arg(format!("--srv-host={name},{target},{port},{prio},{weight}"));
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("dnsmasq starts");
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        self.child = Some(child);
        self.lines = Some(rx);
        self.wait_line("read ");
    }

    /// Waits (10 s at most) for a log line containing `marker`.
    fn wait_line(&mut self, marker: &str) {
        let rx = self.lines.as_ref().expect("running");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(marker) => return,
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        panic!("dnsmasq never logged {marker:?}: {seen:?}");
    }
}

/// A port free for both UDP and TCP (dnsmasq takes both), below the kernel's ephemeral range
/// (32768 and up): the tests' own outgoing connections take ports there, and one holding the
/// number made dnsmasq fail with "Address already in use", at start or at a restart.
pub(crate) fn free_dns_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    for attempt in 0u64..1000 {
        let port = 20_000 + (RandomState::new().hash_one(attempt) % 12_000) as u16;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free port for dnsmasq");
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop();
    }
}
