//! WebSocket over HTTP/3 (RFC 9220) is not offered, and says so: h3 0.0.8 (the newest
//! release) cannot parse `:protocol = websocket`, so veloxy's HTTP/3 SETTINGS must not
//! announce SETTINGS_ENABLE_CONNECT_PROTOCOL (an RFC 9220 client then uses HTTP/2 or
//! HTTP/1.1 for its WebSocket), and an extended CONNECT sent anyway opens no tunnel.
//! Checked by an independent HTTP/3 stack, aioquic (tests/support/ws_h3.py).

use veloxy_testkit::*;

/// A Python with aioquic: VELOXY_AIOQUIC_PYTHON, the venv `.ci/run` prepares
/// (target/py-aioquic), or the system's python3.
fn aioquic_python() -> Option<String> {
    python_with("VELOXY_AIOQUIC_PYTHON", "py-aioquic", "aioquic")
}

#[test]
fn http3_does_not_offer_websockets_and_opens_no_tunnel() {
    let Some(python) = aioquic_python() else {
        return skip("aioquic is not installed (.ci/run prepares target/py-aioquic)");
    };
    let backend = ws_echo_server();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listeners.web.tls]\ncert = {:?}\nkey = {:?}\n\
         [[routes]]\nupstream = \"echo\"\n[upstreams.echo]\nservers = [\"{backend}\"]\n",
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/ws_h3.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(["127.0.0.1", &web.port().to_string(), "localhost"])
        .arg(&pki.ca_pem)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    // The connection works (the echo server answers a plain GET with an HTTP/1.1 error).
    assert!(r["get"].is_u64(), "{r}");
    assert!(
        r["enable_connect_protocol"].is_null() || r["enable_connect_protocol"] == 0,
        "{r}"
    );
    assert_ne!(r["connect"], 200, "{r}");
}
