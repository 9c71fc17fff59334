//! The access log: lines parsed back in both formats, and reopening for logrotate.

use veloxy_testkit::*;

use std::time::Duration;

fn config(up: std::net::SocketAddr, path: &std::path::Path, format: &str) -> String {
    format!(
        "[server]\nworkers = 1\n[server.access_log]\npath = {:?}\nformat = \"{format}\"\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nhost = \"app.test\"\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{up}\"]\n",
        path.to_str().unwrap()
    )
}

fn lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            got = std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect();
            got.len() >= n
        }),
        "expected {n} lines, got {got:?}"
    );
    got
}

#[test]
fn json_lines_parse_back_with_the_request_details() {
    let up = upstream(&["--name", "a"]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let v = veloxy(&config(up.addr, &log, "json"));
    let mut c = Client::connect(v.addr);
    c.send(b"GET /size/10?x=1 HTTP/1.1\r\nHost: app.test\r\nUser-Agent: test-agent\r\nReferer: http://r/\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
    c.send(b"GET /missing HTTP/1.1\r\nHost: other.test\r\n\r\n");
    assert_eq!(c.read_response(false).status, 404);
    c.send(b"HEAD /size/5 HTTP/1.1\r\nHost: app.test\r\n\r\n");
    assert_eq!(c.read_response(true).status, 200);
    let got = lines(&log, 3);
    let parsed: Vec<serde_json::Value> = got
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(parsed[0]["method"], "GET");
    assert_eq!(parsed[0]["target"], "/size/10?x=1");
    assert_eq!(parsed[0]["status"], 200);
    assert_eq!(parsed[0]["user_agent"], "test-agent");
    assert_eq!(parsed[0]["referer"], "http://r/");
    assert_eq!(parsed[0]["upstream"], "app");
    assert_eq!(parsed[0]["backend"], up.addr.to_string());
    assert_eq!(parsed[0]["client"], "127.0.0.1");
    let sent = parsed[0]["bytes_sent"].as_u64().unwrap();
    assert!(sent > 10 && sent < 400, "head + 10-byte body: {sent}");
    assert!(parsed[0]["duration_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(parsed[1]["status"], 404);
    assert_eq!(parsed[1]["backend"], serde_json::Value::Null);
    assert_eq!(parsed[2]["method"], "HEAD");
}

#[test]
fn combined_format_and_reopen_on_sigusr1() {
    let up = upstream(&[]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let v = veloxy(&config(up.addr, &log, "combined"));
    let r = request(
        v.addr,
        "GET /a?b HTTP/1.1\r\nHost: app.test\r\nUser-Agent: ua/1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let got = lines(&log, 1);
    let line = &got[0];
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(line.contains("] \"GET /a?b HTTP/1.1\" 200 "), "{line}");
    assert!(line.ends_with(" \"-\" \"ua/1\""), "{line}");

    // logrotate: move the file away, signal, and the next line goes to a new file.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-USR1", &v.proc.pid().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(eventually(Duration::from_secs(5), || v
        .proc
        .log_text()
        .contains("access log reopened")));
    // The writer reopens before its next write.
    assert_eq!(get(v.addr, "/").status, 404, "Host test.local has no route");
    let fresh = lines(&log, 1);
    assert!(fresh[0].contains("\" 404 "), "{fresh:?}");
    assert_eq!(
        std::fs::read_to_string(&rotated).unwrap().lines().count(),
        1
    );
}

#[test]
fn http2_streams_are_logged_too() {
    let up = upstream(&["--name", "a"]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let v = veloxy(&config(up.addr, &log, "json").replace(
        "addr = \"127.0.0.1:0\"",
        "addr = \"127.0.0.1:0\"\nhttp2 = true",
    ));
    veloxy_testkit::runtime().block_on(async {
        let mut c = veloxy_testkit::h2_connect(v.addr, None).await;
        let req = http::Request::builder()
            .uri("http://app.test/size/10?h=2")
            .header("user-agent", "h2-agent")
            .body(())
            .unwrap();
        let r = veloxy_testkit::h2_send(&mut c, req, None).await.unwrap();
        assert_eq!(r.status, 200);
    });
    let got = lines(&log, 1);
    let line: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
    assert_eq!(line["protocol"], "HTTP/2.0");
    assert_eq!(line["target"], "/size/10?h=2");
    assert_eq!(line["user_agent"], "h2-agent");
    assert_eq!(line["status"], 200);
    assert_eq!(line["bytes_sent"], 10);
    assert_eq!(line["backend"], up.addr.to_string());
}
