//! A real ACME server for tests: Debian's `pebble` (an RFC 8555 test CA) with
//! `pebble-challtestsrv` as its DNS server, answering every name with 127.0.0.1, so names
//! like `a.example.test` validate against veloxy's listeners on loopback. `.ci/run` installs
//! the `pebble` package.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{default_client, https1, tls_connect, KeyKind, Pki, Proc};

/// A running pebble and its DNS server.
pub struct Pebble {
    /// The directory URL (`https://127.0.0.1:PORT/dir`).
    pub directory: String,
    /// The CA that signed pebble's own HTTPS certificate (veloxy's `ca_file`).
    pub ca_pem: PathBuf,
    /// Everything pebble printed.
    pub log: Arc<Mutex<Vec<u8>>>,
    management: SocketAddr,
    /// pebble-challtestsrv's DNS server (UDP and TCP), which pebble's validator asks.
    pub dns: SocketAddr,
    /// Its management API (`POST /set-txt {"host", "value"}`, `/clear-txt {"host"}`).
    pub dns_management: SocketAddr,
    _pebble: Proc,
    _dns: Proc,
    _dir: tempfile::TempDir,
}

/// A port that was free a moment ago (pebble must be told its ports; it cannot report them).
///
/// Never the same port twice in one test process: the kernel may hand a just-released port
/// out again at once, and two of pebble's listeners once got the same one.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<std::collections::HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(Default::default);
    // Hold every candidate until one is new, so the kernel cannot offer the same one again.
    let mut held = Vec::new();
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if given.insert(port) {
            return port;
        }
        held.push(l);
        assert!(held.len() < 1000, "no fresh port after 1000 tries");
    }
}

/// How to run pebble.
#[derive(Default)]
pub struct PebbleSetup<'a> {
    /// The ACME API's port (choose it before veloxy starts, with [`free_port`]).
    pub port: u16,
    /// Where the validation authority connects for http-01 and tls-alpn-01.
    pub http_port: u16,
    pub tls_port: u16,
    /// Lifetime of issued certificates in seconds (`None`: pebble's default, 5 years).
    pub validity_s: Option<u64>,
    /// Names pebble refuses to issue for.
    pub blocklist: &'a [&'a str],
    /// The OCSP responder URL written into issued certificates (pebble runs none itself).
    pub ocsp_url: Option<String>,
    /// The DNS server pebble's validator asks (`None`: its pebble-challtestsrv).
    pub dns_server: Option<SocketAddr>,
}

fn spawn_logged(cmd: &mut Command, log: Arc<Mutex<Vec<u8>>>) -> std::process::Child {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.extend_from_slice(line.as_bytes());
                l.push(b'\n');
            }
        });
    }
    child
}

impl Pebble {
    /// Starts pebble, or returns `None` after reporting the test as skipped when the `pebble`
    /// package is not installed.
    pub fn start(setup: &PebbleSetup<'_>) -> Option<Pebble> {
        let (pebble, dns) = ("/usr/bin/pebble", "/usr/bin/pebble-challtestsrv");
        if !Path::new(pebble).exists() || !Path::new(dns).exists() {
            crate::skip("pebble is not installed (Debian package `pebble`)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path());
        let (cert, key) = pki.leaf("pebble", &["localhost", "127.0.0.1"], KeyKind::Ecdsa);
        let (dns_port, dns_mgmt, mgmt) = (free_port(), free_port(), free_port());
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{}", setup.port),
            "managementListenAddress": format!("127.0.0.1:{mgmt}"),
            "certificate": cert,
            "privateKey": key,
            "httpPort": setup.http_port,
            "tlsPort": setup.tls_port,
            "ocspResponderURL": setup.ocsp_url.clone().unwrap_or_default(),
            "externalAccountBindingRequired": false,
            "domainBlocklist": setup.blocklist,
            "certificateValidityPeriod": setup.validity_s.unwrap_or(157_766_400),
        }});
        let config_path = dir.path().join("pebble.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let log: Arc<Mutex<Vec<u8>>> = Arc::default();
        // Every name resolves to 127.0.0.1 only (no AAAA: the validator would try ::1 first).
        let dns_child = spawn_logged(
            Command::new(dns)
                .args(["-dns01", &format!("127.0.0.1:{dns_port}")])
                .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
                .args(["-management", &format!("127.0.0.1:{dns_mgmt}")])
                .args(["-defaultIPv6", "", "-defaultIPv4", "127.0.0.1"]),
            log.clone(),
        );
        let pebble_child = spawn_logged(
            Command::new(pebble)
                .env("PEBBLE_VA_NOSLEEP", "1")
                // Every order validates afresh (no reuse of earlier authorizations).
                .env("PEBBLE_AUTHZREUSE", "0")
                .args(["-config", config_path.to_str().unwrap()])
                .args([
                    "-dnsserver",
                    &setup
                        .dns_server
                        .map_or(format!("127.0.0.1:{dns_port}"), |a| a.to_string()),
                ]),
            log.clone(),
        );
        let api: SocketAddr = format!("127.0.0.1:{}", setup.port).parse().unwrap();
        let up = crate::eventually(Duration::from_secs(20), || {
            crate::listening(api)
                && crate::listening(("127.0.0.1", mgmt))
                && crate::listening(("127.0.0.1", dns_mgmt))
        });
        assert!(
            up,
            "pebble did not start: {}",
            String::from_utf8_lossy(&log.lock().unwrap())
        );
        Some(Pebble {
            directory: format!("https://127.0.0.1:{}/dir", setup.port),
            ca_pem: pki.ca_pem.clone(),
            log,
            management: format!("127.0.0.1:{mgmt}").parse().unwrap(),
            dns: format!("127.0.0.1:{dns_port}").parse().unwrap(),
            dns_management: format!("127.0.0.1:{dns_mgmt}").parse().unwrap(),
            _pebble: Proc {
                child: pebble_child,
                log: Default::default(),
            },
            _dns: Proc {
                child: dns_child,
                log: Default::default(),
            },
            _dir: dir,
        })
    }

    /// The root that pebble's issued chains lead to (new on every start), as PEM.
    pub fn root_pem(&self) -> String {
        self.management_get("/roots/0")
    }

    /// A PEM from pebble's management API (`/roots/0`, `/intermediates/0`,
    /// `/intermediate-keys/0`).
    pub fn management_get(&self, path: &str) -> String {
        let client = default_client(&self.ca_pem, &[b"http/1.1"]);
        let (mut s, _) = tls_connect(self.management, "localhost", client).unwrap();
        let (status, body) = https1(&mut s, "localhost", path);
        assert_eq!(status, 200, "{body}");
        body.split_once("\r\n\r\n")
            .map_or(body.clone(), |(_, b)| b.to_owned())
    }

    /// Writes [`Self::root_pem`] to `path` (for `ca_file`-style clients and curl).
    pub fn write_root(&self, path: &Path) {
        std::fs::write(path, self.root_pem()).unwrap();
    }

    /// Everything pebble and its DNS server printed so far.
    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }
}
