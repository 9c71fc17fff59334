//! A browser's WebSocket over HTTP/2 (RFC 8441) through veloxy: headless Chromium (Debian's
//! `chromium`) loads a page from veloxy over HTTPS (ALPN h2) and opens a WebSocket to the
//! same origin, which veloxy bridges to the testkit's echo upstream (HTTP/1.1). The page
//! writes what came back into its DOM and reports that text with a request veloxy's access
//! log shows (`--dump-dom` would dump the page at its load event, before any echo can come
//! back: a WebSocket does not hold the load event); Chromium's net log must show
//! the WebSocket went as an HTTP/2 extended CONNECT (`:protocol: websocket` on the page's
//! HTTP/2 session), and veloxy's access log records it as HTTP/2.
//!
//! With VELOXY_WS_EVIDENCE=FILE, excerpts of both logs are written there.

use veloxy_testkit::*;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const PAGE: &str = r#"<!doctype html>
<html><body><pre id="out">waiting</pre>
<script>
const out = document.getElementById("out");
const ws = new WebSocket("wss://" + location.host + "/ws");
const got = [];
ws.onopen = () => { ws.send("hello over h2"); ws.send("second message"); };
ws.onmessage = (e) => {
  got.push(e.data);
  if (got.length == 2) {
    out.textContent = "echo:" + got.join("|");
    ws.close(1000);
    // What the page now shows, reported where the test can see it: veloxy's access log.
    fetch("/result?" + encodeURIComponent(out.textContent));
  }
};
ws.onerror = () => { out.textContent = "error"; fetch("/result?error"); };
</script></body></html>
"#;

/// Runs Chromium on `url` until `done` says so or `limit` passes, then stops it with SIGTERM
/// (it writes the end of its net log then), and SIGKILL if it is still there 10 s later.
fn chromium(url: &str, netlog: &Path, profile: &Path, limit: Duration, done: impl Fn() -> bool) {
    let mut child = Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--ignore-certificate-errors",
            "--no-first-run",
            "--disable-extensions",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--log-net-log={}", netlog.display()))
        .arg("--net-log-capture-mode=Everything")
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(limit, || done() || child.try_wait().unwrap().is_some());
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    if !eventually(Duration::from_secs(10), || {
        child.try_wait().unwrap().is_some()
    }) {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// The first HTTP2_SESSION_SEND_HEADERS event of the net log whose headers carry
/// `:protocol: websocket`, as pretty JSON. Event types are numbers, named in the log's
/// constants. Read line by line (one event a line), so a log Chromium is still writing, or
/// did not finish, can be read too.
fn extended_connect(net: &str) -> Option<String> {
    let at = net.find("\"events\": [")?;
    let head = net[..at].trim_end().trim_end_matches(',');
    let constants: serde_json::Value = serde_json::from_str(&format!("{head}}}")).ok()?;
    let kind = constants["constants"]["logEventTypes"]["HTTP2_SESSION_SEND_HEADERS"].as_u64()?;
    net[at..].lines().skip(1).find_map(|line| {
        let e: serde_json::Value =
            serde_json::from_str(line.trim_end().trim_end_matches(',')).ok()?;
        let headers = e["params"]["headers"].as_array()?;
        let ws = headers
            .iter()
            .any(|h| h.as_str() == Some(":protocol: websocket"));
        (e["type"].as_u64() == Some(kind) && ws).then(|| serde_json::to_string_pretty(&e).unwrap())
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
    let access = || std::fs::read_to_string(&log).unwrap_or_default();
    let on_disk = || extended_connect(&std::fs::read_to_string(&netlog).unwrap_or_default());
    // The page has reported, and the net log has what it shows on disk (it is written as
    // Chromium runs; what a stopped Chromium had not written yet would be lost).
    let reported = || access().contains("\"target\":\"/result?") && on_disk().is_some();
    let profile = dir.path().join("profile");
    chromium(&url, &netlog, &profile, Duration::from_secs(60), reported);
    let lines = access();
    let result = lines.lines().find(|l| l.contains("\"target\":\"/result?"));
    // The page's text, URI-encoded: "echo:hello over h2|second message".
    let echoed = "/result?echo%3Ahello%20over%20h2%7Csecond%20message";
    assert!(
        result.is_some_and(|l| l.contains(echoed)),
        "the page did not get its echoes: {result:?}\naccess log: {lines}"
    );
    let net = std::fs::read_to_string(&netlog).unwrap_or_default();
    // The extended CONNECT as Chromium's HTTP/2 session sent it.
    let connect = extended_connect(&net).unwrap_or_else(|| {
        let _ = std::fs::copy(&netlog, std::env::temp_dir().join("veloxy-ws-netlog.json"));
        panic!(
            "no HTTP/2 extended CONNECT in the net log ({} bytes); access log: {lines}",
            net.len()
        )
    });
    assert!(connect.contains(":method: CONNECT"), "{connect}");
    let ws_line = lines.lines().find(|l| l.contains("\"CONNECT\"")).unwrap();
    assert!(ws_line.contains("HTTP/2"), "{ws_line}");
    assert!(ws_line.contains("\"status\":200"), "{ws_line}");
    if let Ok(path) = std::env::var("VELOXY_WS_EVIDENCE") {
        let evidence = format!(
            "Chromium: {}\nthe page's report of its DOM after the echo (access log): {}\n\nnet log, the HTTP/2 session's extended CONNECT (HTTP2_SESSION_SEND_HEADERS):\n{}\n\nveloxy's access log:\n{}\n",
            Command::new("chromium").arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default(),
            result.unwrap_or(""),
            connect,
            lines
        );
        std::fs::write(path, evidence).unwrap();
    }
}
