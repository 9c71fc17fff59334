//! A real `redis-server` (Debian's) on a loopback port, for the fleet tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running redis-server; killed on drop.
pub struct RedisServer {
    pub addr: SocketAddr,
    child: Option<Child>,
    /// With TLS only (`rediss://`): the certificate, its key, and the CA that signed it.
    tls: Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)>,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one on a free port; `None` (and a SKIPPED line) without the binary.
    pub fn start() -> Option<RedisServer> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            crate::skip("redis-server is not installed");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut s = RedisServer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child: None,
            tls: None,
            _dir: tempfile::tempdir().expect("tempdir"),
        };
        s.restart();
        Some(s)
    }

    /// Like [`Self::start`], serving TLS only, with a certificate for 127.0.0.1 from a fresh
    /// CA; [`Self::ca_pem`] is that CA.
    pub fn start_tls() -> Option<RedisServer> {
        let mut s = RedisServer::start()?;
        s.stop();
        let pki = crate::Pki::new(s._dir.path());
        let (cert, key) = pki.leaf("redis", &["127.0.0.1"], crate::KeyKind::Ecdsa);
        s.tls = Some((cert, key, pki.ca_pem.clone()));
        s.restart();
        Some(s)
    }

    /// The CA of a TLS server.
    pub fn ca_pem(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().map(|t| t.2.as_path())
    }

    /// Stops the server (connections refused from now on).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty), and waits until it answers PING.
    pub fn restart(&mut self) {
        self.stop();
        let port = self.addr.port().to_string();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1"]);
        match &self.tls {
            None => cmd.args(["--port", &port]),
            Some((cert, key, ca)) => cmd
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &port,
                    "--tls-auth-clients",
                    "no",
                ])
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key)
                .arg("--tls-ca-cert-file")
                .arg(ca),
        };
        let child = cmd
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(self._dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.ping() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not answer PING on {}", self.addr);
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)) else {
            return false;
        };
        if self.tls.is_some() {
            // Listening is enough: the TLS clients under test do the rest.
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// `redis://ADDR/0` (`rediss://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}/0", self.addr)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
