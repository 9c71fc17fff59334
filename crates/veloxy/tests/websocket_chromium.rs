//! A browser's WebSocket over HTTP/2 (RFC 8441) through veloxy: headless Chromium (Debian's
//! `chromium`) loads a page from veloxy over HTTPS (ALPN h2) and opens a WebSocket to the
//! same origin, which veloxy bridges to the testkit's echo upstream (HTTP/1.1). The page
//! writes what came back into its DOM (read with `--dump-dom`); Chromium's net log must show
//! the WebSocket went as an HTTP/2 extended CONNECT (`:protocol: websocket` on the page's
//! HTTP/2 session), and veloxy's access log records it as HTTP/2.
//!
//! With VELOXY_WS_EVIDENCE=FILE, excerpts of both logs are written there.

use veloxy_testkit::*;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PAGE: &str = r#"<!doctype html>
<html><body><pre id="out">waiting</pre>
<script>
const out = document.getElementById("out");
const ws = new WebSocket("wss://" + location.host + "/ws");
const got = [];
ws.onopen = () => { ws.send("hello over h2"); ws.send("second message"); };
ws.onmessage = (e) => {
  got.push(e.data);
  if (got.length == 2) { out.textContent = "echo:" + got.join("|"); ws.close(1000); }
};
ws.onerror = () => { out.textContent = "error"; };
</script></body></html>
"#;

/// Runs Chromium on `url` until it exits or `limit` passes (then it is killed); returns
/// its standard output (the DOM).
fn chromium(url: &str, netlog: &Path, profile: &Path, limit: Duration) -> String {
    let mut child = Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--ignore-certificate-errors",
            "--no-first-run",
            "--disable-extensions",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--log-net-log={}", netlog.display()))
        .arg("--net-log-capture-mode=Everything")
        .arg("--dump-dom")
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first HTTP2_SESSION_SEND_HEADERS event of the net log whose headers carry
/// `:protocol: websocket`, as pretty JSON. Event types are numbers, named in the log's
/// constants.
fn extended_connect(net: &str) -> Option<String> {
    // A net log cut short (Chromium killed) lacks its closing brackets.
    let v: serde_json::Value = serde_json::from_str(net)
        .or_else(|_| serde_json::from_str(&format!("{}]}}", net.trim_end().trim_end_matches(','))))
        .ok()?;
    let kind = v["constants"]["logEventTypes"]["HTTP2_SESSION_SEND_HEADERS"].as_u64()?;
    v["events"].as_array()?.iter().find_map(|e| {
        let headers = e["params"]["headers"].as_array()?;
        let ws = headers
            .iter()
            .any(|h| h.as_str() == Some(":protocol: websocket"));
        (e["type"].as_u64() == Some(kind) && ws).then(|| serde_json::to_string_pretty(e).unwrap())
    })
}

#[test]
fn chromium_opens_a_websocket_over_http2_extended_connect() {
    if !require(
        "chromium",
        "--version",
        "chromium is not installed (.ci/run installs it)",
    ) {
        return;
    }
    let backend = ws_echo_server();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("site");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("index.html"), PAGE).unwrap();
    let pki = Pki::new(dir.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let log = dir.path().join("access.log");
    let config = format!(
        "[server]\nworkers = 1\n[server.access_log]\npath = {:?}\nformat = \"json\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n[listeners.web.tls]\ncert = {:?}\nkey = {:?}\n\
         [[routes]]\npath = \"/ws\"\nupstream = \"echo\"\n\
         [[routes]]\nroot = {:?}\n\
         [upstreams.echo]\nservers = [\"{backend}\"]\n",
        log.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        root.to_str().unwrap(),
    );
    let v = veloxy(&config);
    let netlog = dir.path().join("netlog.json");
    let url = format!("https://localhost:{}/index.html", v.addr.port());
    let dom = chromium(
        &url,
        &netlog,
        &dir.path().join("profile"),
        Duration::from_secs(60),
    );
    assert!(
        dom.contains("echo:hello over h2|second message"),
        "the page did not get its echoes: {dom}"
    );
    let net = std::fs::read_to_string(&netlog).unwrap_or_default();
    // The extended CONNECT as Chromium's HTTP/2 session sent it.
    let connect = extended_connect(&net).unwrap_or_else(|| {
        let _ = std::fs::copy(&netlog, std::env::temp_dir().join("veloxy-ws-netlog.json"));
        panic!(
            "no HTTP/2 extended CONNECT in the net log ({} bytes)",
            net.len()
        )
    });
    assert!(connect.contains(":method: CONNECT"), "{connect}");
    let mut lines = String::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            lines = std::fs::read_to_string(&log).unwrap_or_default();
            lines.lines().any(|l| l.contains("\"CONNECT\""))
        }),
        "no CONNECT in the access log: {lines}"
    );
    let ws_line = lines.lines().find(|l| l.contains("\"CONNECT\"")).unwrap();
    assert!(ws_line.contains("HTTP/2"), "{ws_line}");
    assert!(ws_line.contains("\"status\":200"), "{ws_line}");
    if let Ok(path) = std::env::var("VELOXY_WS_EVIDENCE") {
        let evidence = format!(
            "Chromium: {}\npage DOM after the echo: {}\n\nnet log, the HTTP/2 session's extended CONNECT (HTTP2_SESSION_SEND_HEADERS):\n{}\n\nveloxy's access log:\n{}\n",
            Command::new("chromium").arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default(),
            dom.lines().find(|l| l.contains("echo:")).unwrap_or("").trim(),
            connect,
            lines
        );
        std::fs::write(path, evidence).unwrap();
    }
}
