//! WebSocket over HTTP/2 (RFC 8441) through veloxy, spoken by an independent client (Python
//! `h2` and `wsproto`, tests/support/ws_h2.py) over h2c and TLS h2 to the testkit's
//! WebSocket echo upstream (HTTP/1.1): echoes both ways, the close handshake, the access
//! rules, a dead upstream, an upstream that refuses, and CONNECTs veloxy does not serve.
//! The browser's side (headless Chromium) is in websocket_chromium.rs.

use veloxy_testkit::*;

use std::net::SocketAddr;

/// A Python with `h2` and `wsproto`: VELOXY_WS_PYTHON, the venv `.ci/run` prepares
/// (target/py-aioquic), or the system's python3.
fn python() -> Option<String> {
    python_with("VELOXY_WS_PYTHON", "py-aioquic", "h2, wsproto")
}

/// Runs the client against `addr`; returns its JSON answer.
fn client(
    python: &str,
    addr: SocketAddr,
    target: (&str, &str),
    extra: &[&str],
) -> serde_json::Value {
    let (authority, path) = target;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/ws_h2.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args([
            &addr.ip().to_string(),
            &addr.port().to_string(),
            authority,
            path,
        ])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn h2c_config(backend: SocketAddr, route_keys: &str) -> String {
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"app\"\n{route_keys}\n[upstreams.app]\nservers = [\"{backend}\"]\n"
    )
}

fn assert_echoed(r: &serde_json::Value) {
    assert_eq!(r["enable_connect_protocol"], true, "{r}");
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(r["text_echo"], true, "{r}");
    assert_eq!(r["binary_echo"], true, "{r}");
    assert_eq!(r["close_code"], 1000, "{r}");
}

#[test]
fn websocket_over_h2c_echoes_and_closes() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let backend = ws_echo_server();
    let v = veloxy(&h2c_config(backend, ""));
    let r = client(&py, v.addr, ("app.test", "/ws"), &["--big", "300000"]);
    assert_echoed(&r);
    // A second WebSocket on a fresh connection, then an ordinary request: the proxy is fine.
    assert_echoed(&client(&py, v.addr, ("app.test", "/ws"), &[]));
}

#[test]
fn websocket_over_tls_h2_echoes_and_is_logged_as_http2() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let backend = ws_echo_server();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let log = certs.path().join("access.log");
    let config = format!(
        "[server]\nworkers = 1\n[server.access_log]\npath = {:?}\nformat = \"json\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n[listeners.web.tls]\ncert = {:?}\nkey = {:?}\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{backend}\"]\n",
        log.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap()
    );
    let v = veloxy(&config);
    let ca = pki.ca_pem.to_str().unwrap().to_owned();
    let r = client(&py, v.addr, ("localhost", "/ws"), &["--tls", &ca]);
    assert_echoed(&r);
    let mut line = String::new();
    assert!(
        eventually(std::time::Duration::from_secs(5), || {
            line = std::fs::read_to_string(&log).unwrap_or_default();
            !line.is_empty()
        }),
        "no access log line"
    );
    let entry: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(entry["status"], 200, "{line}");
    assert!(line.contains("HTTP/2"), "{line}");
    assert!(line.contains("CONNECT"), "{line}");
}

#[test]
fn access_rules_apply_to_websockets() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let backend = ws_echo_server();
    let v = veloxy(&h2c_config(backend, "deny = [\"127.0.0.0/8\"]"));
    let r = client(&py, v.addr, ("app.test", "/ws"), &[]);
    assert_eq!(r["status"], 403, "{r}");
}

#[test]
fn dead_and_refusing_upstreams() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let v = veloxy(&h2c_config(dead, ""));
    assert_eq!(client(&py, v.addr, ("app.test", "/ws"), &[])["status"], 502);
    // An HTTP server that knows no WebSocket: its 404 comes back; a 200 that does not
    // switch protocols is no open WebSocket (502).
    let up = upstream(&["--name", "plain"]);
    let v = veloxy(&h2c_config(up.addr, ""));
    let r = client(&py, v.addr, ("app.test", "/ws"), &[]);
    assert_eq!(r["status"], 502, "{r}");
    let r = client(&py, v.addr, ("app.test", "/status/403"), &[]);
    assert_eq!(r["status"], 403, "{r}");
}

#[test]
fn other_connects_are_refused() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let backend = ws_echo_server();
    let v = veloxy(&h2c_config(backend, ""));
    let r = client(
        &py,
        v.addr,
        ("app.test", "/ws"),
        &["--protocol", "webtransport"],
    );
    assert_eq!(r["status"], 501, "{r}");
    // RFC 8441 has no key over HTTP/2: a client's would go upstream beside veloxy's own.
    let key = "sec-websocket-key:dGhlIHNhbXBsZSBub25jZQ==";
    let r = client(&py, v.addr, ("app.test", "/ws"), &["--header", key]);
    assert_eq!(r["status"], 400, "{r}");
    // An h2c group whose backend speaks no HTTP/2 (the echo server): 502.
    let v = veloxy(
        &h2c_config(backend, "")
            .replace("[upstreams.app]\n", "[upstreams.app]\nprotocol = \"h2c\"\n"),
    );
    let r = client(&py, v.addr, ("app.test", "/ws"), &[]);
    assert_eq!(r["status"], 502, "{r}");
    // A route that answers by itself opens no WebSocket.
    let v = veloxy(
        &h2c_config(backend, "").replace("upstream = \"app\"\n", "respond = { body = \"hi\" }\n"),
    );
    let r = client(&py, v.addr, ("app.test", "/ws"), &[]);
    assert_eq!(r["status"], 501, "{r}");
}

#[test]
fn websocket_to_an_h2c_group_is_forwarded_as_extended_connect() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    // veloxy in front of veloxy: the inner one (an h2c listener that offers RFC 8441 and
    // bridges to the echo upstream) is the outer one's h2c group.
    let backend = ws_echo_server();
    let inner = veloxy(&h2c_config(backend, ""));
    let outer = veloxy(
        &h2c_config(inner.addr, "")
            .replace("[upstreams.app]\n", "[upstreams.app]\nprotocol = \"h2c\"\n"),
    );
    assert_echoed(&client(
        &py,
        outer.addr,
        ("app.test", "/ws"),
        &["--big", "300000"],
    ));
    // An inner one's refusal (its access rules) comes back as it is.
    let inner = veloxy(&h2c_config(backend, "deny = [\"127.0.0.0/8\"]"));
    let outer = veloxy(
        &h2c_config(inner.addr, "")
            .replace("[upstreams.app]\n", "[upstreams.app]\nprotocol = \"h2c\"\n"),
    );
    let r = client(&py, outer.addr, ("app.test", "/ws"), &[]);
    assert_eq!(r["status"], 403, "{r}");
}

#[test]
fn traffic_keeps_a_websocket_open_and_silence_closes_it() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let backend = ws_echo_server();
    // The connection's own idle limit is shorter than the tunnel's: an open WebSocket is a
    // live stream, so only the tunnel's limit applies.
    let config = h2c_config(backend, "")
        .replace("workers = 1\n", "workers = 1\nkeepalive_timeout = \"1s\"\n")
        .replace(
            "http2 = true\n",
            "http2 = true\nupgrade_idle_timeout = \"2s\"\n",
        );
    let v = veloxy(&config);
    let r = client(&py, v.addr, ("app.test", "/ws"), &["--hold", "3"]);
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(
        r["held"], true,
        "traffic past both limits keeps it open: {r}"
    );
    let after = r["ended_after"]
        .as_f64()
        .unwrap_or_else(|| panic!("left open: {r}"));
    assert!(
        (1.8..6.0).contains(&after),
        "closed by the 2 s idle limit: {r}"
    );
}

/// A WebSocket upstream that records each upgrade request's head and answers it with the
/// subprotocol `chat` (then echoes), or with a wrong Sec-WebSocket-Accept when `honest` is
/// false.
fn recording_upstream(honest: bool) -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::{handshake::derive_accept_key, protocol::Role};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            while let Ok((mut s, _)) = l.accept().await {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                    let mut b = [0u8; 1];
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        break;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let key = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                let _ = tx.send(head);
                let accept = match honest {
                    true => derive_accept_key(key.as_bytes()),
                    false => derive_accept_key(b"another key"),
                };
                let answer = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                     Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: chat\r\n\r\n"
                );
                if s.write_all(answer.as_bytes()).await.is_err() {
                    continue;
                }
                let mut ws =
                    tokio_tungstenite::WebSocketStream::from_raw_socket(s, Role::Server, None)
                        .await;
                tokio::spawn(async move {
                    while let Some(Ok(m)) = ws.next().await {
                        if m.is_close() {
                            let _ = ws.flush().await;
                            break;
                        }
                        if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    });
    (addr, rx)
}

#[test]
fn the_upgrade_request_and_the_chosen_subprotocol() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let (up, heads) = recording_upstream(true);
    let v = veloxy(&h2c_config(up, ""));
    let fields = [
        "--header",
        "sec-websocket-protocol:chat, superchat",
        "--header",
        "sec-websocket-extensions:x-test",
    ];
    let r = client(&py, v.addr, ("app.test", "/ws?room=1"), &fields);
    assert_echoed(&r);
    assert_eq!(r["headers"]["sec-websocket-protocol"], "chat", "{r}");
    let head = heads
        .recv_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    assert!(head.starts_with("GET /ws?room=1 HTTP/1.1\r\n"), "{head}");
    for field in [
        "Host: app.test\r\n",
        "Connection: Upgrade\r\n",
        "Upgrade: websocket\r\n",
        "sec-websocket-version: 13\r\n",
        "sec-websocket-protocol: chat, superchat\r\n",
        "sec-websocket-extensions: x-test\r\n",
        "X-Forwarded-For: 127.0.0.1\r\n",
    ] {
        assert!(head.contains(field), "{field:?} missing from {head}");
    }
    let key = head
        .lines()
        .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
        .unwrap_or_else(|| panic!("no key: {head}"));
    assert_eq!(base64_len(key), 16, "a 16-byte nonce: {head}");
    assert!(!head.contains("CONNECT"), "{head}");
}

#[test]
fn a_wrong_accept_value_is_a_502() {
    let Some(py) = python() else {
        return skip("python3 with h2 and wsproto is not installed (.ci/run installs them)");
    };
    let (up, _heads) = recording_upstream(false);
    let v = veloxy(&h2c_config(up, ""));
    let r = client(&py, v.addr, ("app.test", "/ws"), &[]);
    assert_eq!(r["status"], 502, "{r}");
}

/// The length of what `b64` decodes to.
fn base64_len(b64: &str) -> usize {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_or(0, |b| b.len())
}
