//! `plain_http` on a TLS listener (issue 38): a client that speaks plain HTTP to the HTTPS
//! port is redirected, served or refused with a clear 400, instead of getting a failed
//! handshake; TLS clients (HTTP/1.1 and HTTP/2) on the same port are served as before.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use veloxy_testkit::*;

/// A TLS listener with `plain_http = MODE` (none when `mode` is empty) in front of `up`.
fn config(up: SocketAddr, cert: &Path, key: &Path, mode: &str) -> String {
    let plain = if mode.is_empty() {
        String::new()
    } else {
        format!("plain_http = \"{mode}\"\n")
    };
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n{plain}\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{up}\"]\n",
        cert.display(),
        key.display()
    )
}

/// Sends a plain HTTP/1.1 request and reads until the server closes (or 5 s pass).
fn plain(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\n\r\n",
        addr.port()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// TLS on the same port still works: HTTP/1.1, and HTTP/2 by ALPN.
fn tls_still_served(v: &Veloxy, ca: &Path) {
    let (mut s, _) = tls_connect(v.addr, "localhost", default_client(ca, &[b"http/1.1"])).unwrap();
    let (status, text) = https1(&mut s, "localhost", "/echo");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("X-Forwarded-Proto: https"), "{text}");
    runtime().block_on(async {
        let config = default_client(ca, &[b"h2"]);
        let mut c = h2_connect(v.addr, Some((config, "localhost"))).await;
        let r = h2_send(&mut c, h2_get("localhost", "/echo", true), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    });
}

#[test]
fn plain_http_on_a_tls_port_is_redirected_served_or_refused() {
    let up = upstream(&["--name", "u1"]);
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);

    let v = veloxy(&config(up.addr, &cert, &key, "redirect"));
    let answer = plain(v.addr, "/a/b?c=1");
    assert!(answer.starts_with("HTTP/1.1 308"), "{answer}");
    let location = format!("location: https://localhost:{}/a/b?c=1", v.addr.port());
    assert!(answer.to_ascii_lowercase().contains(&location), "{answer}");
    tls_still_served(&v, &pki.ca_pem);
    drop(v);

    let v = veloxy(&config(up.addr, &cert, &key, "serve"));
    let answer = plain(v.addr, "/echo");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("X-Forwarded-Proto: http\r\n"), "{answer}");
    tls_still_served(&v, &pki.ca_pem);
    drop(v);

    let v = veloxy(&config(up.addr, &cert, &key, "reject"));
    let answer = plain(v.addr, "/echo");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("HTTPS port"), "{answer}");
    assert!(!answer.contains("x-upstream"), "{answer}");
    tls_still_served(&v, &pki.ca_pem);
    drop(v);

    // Unset: no HTTP answer to a plain client (the handshake fails), as before.
    let v = veloxy(&config(up.addr, &cert, &key, ""));
    let answer = plain(v.addr, "/echo");
    assert!(!answer.starts_with("HTTP/1.1"), "{answer}");
    tls_still_served(&v, &pki.ca_pem);
}

#[test]
fn plain_http_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let tls = format!(
        "[listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let cases = [
        (
            "[listeners.web]\naddr = \"127.0.0.1:0\"\nplain_http = \"redirect\"\n".to_owned(),
            "listeners.web.plain_http: is for TLS listeners",
        ),
        (
            format!("[listeners.web]\naddr = \"127.0.0.1:0\"\nplain_http = \"upgrade\"\n{tls}"),
            "listeners.web.plain_http: \"upgrade\": use \"redirect\", \"serve\" or \"reject\"",
        ),
    ];
    for (text, want) in cases {
        let out = check(&text);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(err.contains(want), "{text}\n{err}");
        assert!(err.contains("veloxy.toml:3:"), "names the line: {err}");
    }
}
