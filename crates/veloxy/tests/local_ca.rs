//! `[listeners.NAME.tls] local_ca = true` (issue 38): certificates from the local CA for the
//! listener's `names`, issued when the config runs (never by `check`), served by SNI and to
//! clients without SNI, trusted by a client that trusts the CA `veloxy trust` prints; a reload
//! keeps the CA.

use std::path::Path;
use std::process::Command;

use veloxy_testkit::*;

fn config(up: std::net::SocketAddr, names: &str) -> String {
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [listeners.web.tls]\nlocal_ca = true\n{names}\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{up}\"]\n"
    )
}

/// veloxy with its data directory (where the local CA lives) in `data`.
fn veloxy_in(data: &Path, config: &str) -> Veloxy {
    let mut cmd = Command::new(VELOXY.path());
    cmd.env("XDG_DATA_HOME", data);
    veloxy_with(cmd, config, &[])
}

fn get_over_tls(v: &Veloxy, ca: &Path, sni: &str, host: &str) -> (u16, String) {
    let (mut s, session) = tls_connect(v.addr, sni, default_client(ca, &[b"http/1.1"]))
        .unwrap_or_else(|e| panic!("handshake for {sni}: {e}"));
    assert!(!session.peer_cn.is_empty());
    https1(&mut s, host, "/echo")
}

#[test]
fn a_local_ca_listener_serves_its_names_and_trust_prints_the_ca() {
    let up = upstream(&["--name", "u1"]);
    let data = tempfile::tempdir().unwrap();
    let ca = data.path().join("veloxy/pki/ca.pem");

    // `check` makes no CA.
    let text = config(
        up.addr,
        "names = [\"localhost\", \"app.test\", \"127.0.0.1\"]",
    );
    let mut cmd = Command::new(VELOXY.path());
    cmd.env("XDG_DATA_HOME", data.path());
    let out = check_with(cmd, &text);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !data.path().join("veloxy").exists(),
        "check made the local CA"
    );

    let v = veloxy_in(data.path(), &text);
    assert!(ca.exists(), "no CA at {}", ca.display());
    for sni in ["app.test", "localhost", "127.0.0.1"] {
        let (status, text) = get_over_tls(&v, &ca, sni, "app.test");
        assert_eq!(status, 200, "{sni}: {text}");
        assert!(text.contains("X-Forwarded-Proto: https"), "{text}");
    }
    // A name the certificate does not cover fails verification.
    assert!(tls_connect(v.addr, "other.test", default_client(&ca, &[])).is_err());
    // HTTP/2 by ALPN on the same certificate.
    runtime().block_on(async {
        let config = default_client(&ca, &[b"h2"]);
        let mut c = h2_connect(v.addr, Some((config, "app.test"))).await;
        let r = h2_send(&mut c, h2_get("app.test", "/echo", true), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    });

    // `veloxy trust` prints that CA.
    let out = Command::new(VELOXY.path())
        .env("XDG_DATA_HOME", data.path())
        .arg("trust")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        std::fs::read_to_string(&ca).unwrap()
    );

    // A reload with another name: the same CA, a new leaf.
    let before = std::fs::read(&ca).unwrap();
    reload_with(&v, &config(up.addr, "names = [\"new.test\"]"), "reloaded ");
    assert_eq!(
        std::fs::read(&ca).unwrap(),
        before,
        "the CA changed on reload"
    );
    assert_eq!(get_over_tls(&v, &ca, "new.test", "new.test").0, 200);
}
