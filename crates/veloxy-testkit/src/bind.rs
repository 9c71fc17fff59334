//! A real authoritative DNS server for the ACME DNS-01 RFC 2136 tests: Debian's BIND 9
//! (`named`, package `bind9`), primary for one zone on a loopback port, accepting dynamic
//! updates (RFC 2136) signed with a TSIG key made by `tsig-keygen`. Records are read back
//! with `dig` (package `bind9-dnsutils`). `.ci/run` installs both.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Proc;

/// A running `named`; killed on drop.
pub struct Bind {
    /// Where it answers (UDP and TCP).
    pub addr: SocketAddr,
    /// The zone it is primary for.
    pub zone: String,
    /// The TSIG key's name.
    pub key_name: String,
    /// The key as `tsig-keygen` wrote it (BIND's `key "NAME" { ... };` format).
    pub key_file: PathBuf,
    proc: Proc,
    _dir: tempfile::TempDir,
}

const NAMED: &str = "/usr/sbin/named";

impl Bind {
    /// Starts `named` for `zone` with a fresh `algorithm` key allowed to update it; `None`
    /// (and a SKIPPED line) when BIND or dig is not installed.
    pub fn start(zone: &str, algorithm: &str) -> Option<Bind> {
        if !Path::new(NAMED).exists() {
            crate::skip("named is not installed (Debian package `bind9`)");
            return None;
        }
        if !crate::require("tsig-keygen", "-h", "tsig-keygen is not installed (bind9)")
            || !crate::require("dig", "-v", "dig is not installed (bind9-dnsutils)")
        {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let key_name = "veloxy-acme".to_owned();
        let key = Command::new("tsig-keygen")
            .args(["-a", algorithm, &key_name])
            .output()
            .expect("tsig-keygen");
        assert!(key.status.success(), "tsig-keygen: {key:?}");
        let key_file = d.join("tsig.key");
        std::fs::write(&key_file, &key.stdout).unwrap();
        std::fs::write(
            d.join("zone.db"),
            format!(
                "$TTL 60\n@ IN SOA ns.{zone}. admin.{zone}. 1 60 60 600 60\n\
                 @ IN NS ns.{zone}.\nns IN A 127.0.0.1\n"
            ),
        )
        .unwrap();
        let port = crate::dns::free_dns_port();
        let p = d.display();
        let conf = d.join("named.conf");
        std::fs::write(
            &conf,
            format!(
                "include \"{p}/tsig.key\";\n\
                 options {{ directory \"{p}\"; pid-file \"{p}/named.pid\";\n\
                 session-keyfile \"{p}/session.key\"; listen-on port {port} {{ 127.0.0.1; }};\n\
                 listen-on-v6 {{ none; }}; recursion no; dnssec-validation no; }};\n\
                 zone \"{zone}\" {{ type primary; file \"{p}/zone.db\";\n\
                 allow-update {{ key \"{key_name}\"; }}; }};\n"
            ),
        )
        .unwrap();
        let mut child = Command::new(NAMED)
            .args(["-g", "-c"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn named");
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let err = child.stderr.take().unwrap();
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        let bind = Bind {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            zone: zone.to_owned(),
            key_name,
            key_file,
            proc: Proc { child, log },
            _dir: dir,
        };
        // Ready when it answers the zone's SOA over UDP and accepts TCP (the updates' way).
        let up = crate::eventually(Duration::from_secs(20), || {
            !bind.dig(zone, "SOA").is_empty() && crate::listening(bind.addr)
        });
        assert!(up, "named did not start: {}", bind.log_text());
        Some(bind)
    }

    /// The records of `name` and `kind` it answers, as `dig +short` prints them (TXT values
    /// without their quotes).
    pub fn dig(&self, name: &str, kind: &str) -> Vec<String> {
        let out = Command::new("dig")
            .arg(format!("@{}", self.addr.ip()))
            .args(["-p", &self.addr.port().to_string()])
            .args(["+short", "+time=1", "+tries=1", name, kind])
            .output()
            .expect("dig");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with(';'))
            .map(|l| l.trim_matches('"').to_owned())
            .collect()
    }

    /// Everything named logged.
    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }
}
