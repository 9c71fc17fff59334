//! Differential test of `veloxy import --from caddyfile`: the real Caddy runs a Caddyfile, then
//! veloxy runs what `veloxy import` made of the same file, on the same loopback port and in
//! front of the same scripted origin; the same requests go to both and the answers (status,
//! Location, the fields the config touches, the body) and what the origin saw (method,
//! target, Host, X-Forwarded-*, added and removed fields) must match, but for the differences
//! the import report names (listed in `KNOWN`).

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use veloxy_testkit::{
    eventually, free_port, request, script_origin, skip, veloxy_cmd, Response, Scripted,
    SeenRequest, VELOXY,
};

const CADDY: &str = "/usr/bin/caddy";

/// alice:secret, bcrypt (Caddy's `hash-password` output).
const HASH: &str = "$2a$14$9I6z7AoNvhET8ebtMdza/.4dbQiOKAq56mFKG6MCG.i/YgEYlFgmm";

/// The Caddyfile under test: `PORT` is the site's port, `UP` the origin's.
const CADDYFILE: &str = r#"{
	auto_https off
	admin off
}

http://127.0.0.1:PORT {
	bind 127.0.0.1
	header X-Frame-Options DENY
	header -Server
	request_header X-From-Proxy yes
	encode gzip
	request_body {
		max_size 4KB
	}
	basicauth /private/* {
		alice HASH
	}
	redir /old /new
	redir /moved /elsewhere permanent
	handle_path /strip/* {
		reverse_proxy 127.0.0.1:UP
	}
	handle /api/* {
		reverse_proxy 127.0.0.1:UP {
			header_up X-Real-IP {remote_host}
			header_down X-Down added
		}
	}
	respond /health "ok" 200
	reverse_proxy 127.0.0.1:UP
}
"#;

/// Fields of what the origin saw that differ for a reason the report names.
/// `accept-encoding`: Go's transport adds `gzip` when the client sent none (reverse_proxy's
/// "translated with a difference" line).
const KNOWN_UPSTREAM: &[&str] = &["accept-encoding"];

/// Answer differences the import report names: (request, field, the report's words).
const KNOWN: &[(&str, &str, &str)] = &[
    // Caddy signs its own answers (`Server: Caddy`; `header -Server` removes it from proxied
    // ones only); veloxy sends no Server field of its own.
    ("basic auth without credentials", "server", ""),
    ("basic auth with a wrong password", "server", ""),
    ("oversized body", "server", ""),
    (
        "basic auth without credentials",
        "www-authenticate",
        "charset=\"UTF-8\"",
    ),
    (
        "basic auth with a wrong password",
        "www-authenticate",
        "charset=\"UTF-8\"",
    ),
    ("oversized body", "status", "answers 413 before forwarding"),
    ("oversized body", "x-down", "every answer of the route"),
];

/// Fields the comparison skips: per-connection or per-answer values.
const VOLATILE: &[&str] = &[
    "date",
    "x-origin-seq",
    "content-length",
    "connection",
    "keep-alive",
];

/// The requests, raw (`Host` is added).
fn requests() -> Vec<(&'static str, String)> {
    let big = "x".repeat(10_000);
    vec![
        ("plain GET", "GET /page?a=1 HTTP/1.1\r\n".into()),
        (
            "spoofed forwarding fields",
            "GET /api/users?x=1 HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-Host: evil\r\nX-Forwarded-Proto: https\r\n".into(),
        ),
        ("handle_path strips", "GET /strip/a/b?q=2 HTTP/1.1\r\n".into()),
        ("redir default 302", "GET /old HTTP/1.1\r\n".into()),
        ("redir permanent 301", "GET /moved HTTP/1.1\r\n".into()),
        ("respond", "GET /health HTTP/1.1\r\n".into()),
        ("basic auth without credentials", "GET /private/x HTTP/1.1\r\n".into()),
        (
            "basic auth with credentials",
            "GET /private/x HTTP/1.1\r\nAuthorization: Basic YWxpY2U6c2VjcmV0\r\n".into(),
        ),
        (
            "basic auth with a wrong password",
            "GET /private/x HTTP/1.1\r\nAuthorization: Basic YWxpY2U6d3Jvbmc=\r\n".into(),
        ),
        (
            "POST with a body",
            "POST /api/items HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\":\"b\"}\r\n".into(),
        ),
        (
            "oversized body",
            format!("POST /api/upload HTTP/1.1\r\nContent-Length: {}\r\n\r\n{big}", big.len()),
        ),
        (
            "WebSocket upgrade request",
            "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n".into(),
        ),
        (
            "compression",
            "GET /big HTTP/1.1\r\nAccept-Encoding: gzip\r\n".into(),
        ),
    ]
}

/// What one request produced: the answer and what the origin saw (if it was reached).
#[derive(Debug)]
struct Outcome {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    seen: Option<SeenRequest>,
}

fn send_all(addr: SocketAddr, origin: &veloxy_testkit::ScriptOrigin) -> Vec<Outcome> {
    let mut out = Vec::new();
    for (_, raw) in requests() {
        let before = origin.hits();
        let (head, body) = match raw.split_once("\r\n\r\n") {
            Some((h, b)) => (format!("{h}\r\n"), b.to_string()),
            None => (raw.clone(), String::new()),
        };
        let full = format!("{head}Host: {addr}\r\nConnection: close\r\n\r\n{body}");
        let r: Response = request(addr, &full);
        let seen = (origin.hits() > before).then(|| origin.request(origin.hits()).unwrap());
        out.push(Outcome {
            status: r.status,
            headers: r
                .headers
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
                .filter(|(n, _)| !VOLATILE.contains(&n.as_str()))
                .collect(),
            body: if r.header("content-encoding").is_some() {
                "(compressed)".into()
            } else {
                r.body_str()
            },
            seen,
        });
    }
    out
}

fn run_caddy(file: &Path, dir: &Path, addr: SocketAddr) -> Child {
    let child = Command::new(CADDY)
        .args([
            "run",
            "--config",
            file.to_str().unwrap(),
            "--adapter",
            "caddyfile",
        ])
        .env("HOME", dir)
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn caddy");
    let up = eventually(Duration::from_secs(15), || veloxy_testkit::listening(addr));
    assert!(up, "caddy did not start listening on {addr}");
    child
}

fn describe_seen(s: &Option<SeenRequest>) -> String {
    match s {
        None => "(origin not reached)".into(),
        Some(s) => {
            let mut h: Vec<String> = s
                .headers
                .iter()
                .filter(|(n, _)| {
                    !KNOWN_UPSTREAM.contains(&n.as_str()) && !VOLATILE.contains(&n.as_str())
                })
                .map(|(n, v)| format!("{n}: {v}"))
                .collect();
            h.sort();
            format!(
                "{} {}\n{}\nbody {} bytes",
                s.method,
                s.target,
                h.join("\n"),
                s.body.len()
            )
        }
    }
}

#[test]
fn caddy_and_its_import_answer_alike() {
    if !Path::new(CADDY).exists() {
        skip("caddy is not installed (/usr/bin/caddy; Debian's caddy package)");
        return;
    }
    let origin = script_origin(|r| {
        let body = if r.path() == "/big" {
            "compressible text ".repeat(200)
        } else {
            "hello from the origin\n".to_string()
        };
        Scripted::ok(body)
            .header("Content-Type", "text/plain; charset=utf-8")
            .header("Server", "origin")
            .header("X-Up", "1")
    });
    let up = origin.addr;
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let caddyfile = dir.path().join("Caddyfile");
    let text = CADDYFILE
        .replace("PORT", &port.to_string())
        .replace("UP", &up.port().to_string())
        .replace("HASH", HASH);
    std::fs::write(&caddyfile, &text).unwrap();

    // Caddy first.
    let mut caddy = run_caddy(&caddyfile, dir.path(), addr);
    let from_caddy = send_all(addr, &origin);
    let _ = caddy.kill();
    let _ = caddy.wait();
    let freed = eventually(Duration::from_secs(10), || TcpListener::bind(addr).is_ok());
    assert!(freed, "caddy did not release {addr}");

    // Then veloxy on the import of the same file.
    let out = dir.path().join("veloxy.toml");
    let report = dir.path().join("report.txt");
    let st = Command::new(VELOXY)
        .args([
            "import",
            caddyfile.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args(["--report", report.to_str().unwrap(), "--strict"])
        .status()
        .unwrap();
    let report_text = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(
        st.success(),
        "veloxy import --strict failed:\n{report_text}"
    );
    let run_dir = tempfile::tempdir().unwrap();
    let v = veloxy_cmd(
        Command::new(VELOXY),
        &["run", "--config", out.to_str().unwrap()],
        run_dir,
    );
    assert_eq!(v.addr, addr);
    let from_veloxy = send_all(addr, &origin);
    drop(v);

    for (_, _, words) in KNOWN {
        assert!(
            report_text.contains(words),
            "the report does not name {words:?}:\n{report_text}"
        );
    }
    let known = |what: &str, field: &str| KNOWN.iter().any(|(w, f, _)| *w == what && *f == field);
    let mut problems = Vec::new();
    for (((what, _), c), v) in requests().iter().zip(&from_caddy).zip(&from_veloxy) {
        if c.status != v.status && !known(what, "status") {
            problems.push(format!(
                "{what}: status caddy {} veloxy {}",
                c.status, v.status
            ));
        }
        for name in [
            "location",
            "x-frame-options",
            "server",
            "x-down",
            "x-up",
            "content-encoding",
            "www-authenticate",
        ] {
            let get = |o: &Outcome| {
                o.headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            if get(c) != get(v) && !known(what, name) {
                problems.push(format!(
                    "{what}: {name}: caddy {:?} veloxy {:?}",
                    get(c),
                    get(v)
                ));
            }
        }
        if c.status == 200 && c.body != v.body {
            problems.push(format!(
                "{what}: body: caddy {:?} veloxy {:?}",
                c.body, v.body
            ));
        }
        let (sc, sv) = (describe_seen(&c.seen), describe_seen(&v.seen));
        if sc != sv {
            problems.push(format!(
                "{what}: the origin saw\n--- caddy\n{sc}\n--- veloxy\n{sv}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} differences:\n{}\n\nimported config:\n{}",
        problems.len(),
        problems.join("\n\n"),
        std::fs::read_to_string(&out).unwrap()
    );
}
