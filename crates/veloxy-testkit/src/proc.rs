//! Real `veloxy` and `veloxy-upstream` processes on 127.0.0.1 ephemeral ports, with readiness
//! taken from the `listening` line they print.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{eventually, UPSTREAM, VELOXY};

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
    // An explicit `--listen` (a restart on the same address) replaces the ephemeral one.
    let listen: &[&str] = if args.contains(&"--listen") {
        &[]
    } else {
        &["--listen", "127.0.0.1:0"]
    };
    let mut child = Command::new(UPSTREAM)
        .args(listen)
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

/// Sends signal `sig` (`-HUP`, `-TERM`, ...) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Writes `config` over the running veloxy's config file, sends SIGHUP, and waits until the
/// log shows one more line containing `outcome` ("reloaded" or "reload refused").
pub fn reload_with(v: &Veloxy, config: &str, outcome: &str) {
    let before = v.proc.log_text().matches(outcome).count();
    std::fs::write(v.dir.path().join("veloxy.toml"), config).unwrap();
    signal(v.proc.pid(), "-HUP");
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

/// The `addr=` of the first log line containing `marker`, waiting (5 s at most) for it: how
/// tests find the ports veloxy bound (`"admin endpoint ready"`, `"listener=web"`).
pub fn logged_addr(v: &Veloxy, marker: &str) -> SocketAddr {
    assert!(
        eventually(Duration::from_secs(5), || v
            .proc
            .log_text()
            .contains(marker)),
        "no log line with {marker:?}: {}",
        v.proc.log_text()
    );
    let log = v.proc.log_text();
    let line = log.lines().find(|l| l.contains(marker)).unwrap();
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr= in {line:?}"))
        .parse()
        .unwrap()
}

/// The admin endpoint's address, from its readiness line.
pub fn admin_addr(v: &Veloxy) -> SocketAddr {
    logged_addr(v, "admin endpoint ready")
}

/// `veloxy check` of `config` (written to a temporary `veloxy.toml`), run by `cmd` (a
/// [`VELOXY`] command, with whatever environment the test gives it).
pub fn check_with(mut cmd: Command, config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("veloxy.toml");
    std::fs::write(&path, config).unwrap();
    cmd.args(["check", "--config"]).arg(&path).output().unwrap()
}

/// [`check_with`] a plain [`VELOXY`] command.
pub fn check(config: &str) -> std::process::Output {
    check_with(Command::new(VELOXY), config)
}

/// `METHOD PATH` on `v`'s admin endpoint with `body` (may be empty), connection closed after.
pub fn admin_call(v: &Veloxy, method: &str, path: &str, body: &str) -> crate::Response {
    crate::request(
        admin_addr(v),
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}
