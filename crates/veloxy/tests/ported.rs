//! Ported setups (issue 12): each `tests/ported/NAME.toml` is the veloxy equivalent of a
//! typical real nginx, Caddy or Traefik config (quoted at its top), and each test here runs it
//! end to end against real upstreams. Placeholders: `$APP` (the test upstream), `$WS` (a
//! WebSocket echo server), `$DEAD` (a port nothing listens on), `$CERT` / `$KEY`, `$DIR` (this
//! directory).

use std::path::{Path, PathBuf};

use veloxy_testkit::*;

fn ported_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ported")
}

/// Starts `NAME.toml` with its placeholders filled in.
fn start(name: &str, vars: &[(&str, String)]) -> Veloxy {
    let mut text = std::fs::read_to_string(ported_dir().join(format!("{name}.toml"))).unwrap();
    text = text.replace("$DIR", &ported_dir().display().to_string());
    text = text.replace("$DEAD", "127.0.0.1:9");
    for (k, v) in vars {
        text = text.replace(k, v);
    }
    veloxy(&text)
}

fn addr(v: &Veloxy, listener: &str) -> std::net::SocketAddr {
    logged_addr(v, &format!("listening listener={listener} addr="))
}

fn get(v: &Veloxy, listener: &str, host: &str, target: &str, extra: &str) -> Response {
    request(
        addr(v, listener),
        &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
    )
}

/// The first line of the echo upstream's body: the request line it saw.
fn seen_line(r: &Response) -> String {
    r.body_str().lines().next().unwrap_or("").to_owned()
}

fn seen_header(r: &Response, name: &str) -> Option<String> {
    r.body_str().lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

#[test]
fn nextcloud_vhost() {
    let up = upstream(&[]);
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("cloud", &["cloud.example.com"], KeyKind::Ecdsa);
    let v = start(
        "nextcloud_vhost",
        &[
            ("$APP", up.addr.to_string()),
            ("$CERT", cert.display().to_string()),
            ("$KEY", key.display().to_string()),
        ],
    );
    let r = get(&v, "http", "cloud.example.com", "/index.php?x=1", "");
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some("https://cloud.example.com/index.php?x=1")
    );
    let client = default_client(&pki.ca_pem, &[b"http/1.1"]);
    let (mut s, _) = tls_connect(addr(&v, "https"), "cloud.example.com", client).unwrap();
    let (status, raw) = https1(&mut s, "cloud.example.com", "/echo");
    assert_eq!(status, 200, "{raw}");
    assert_eq!(
        raw_header(&raw, "strict-transport-security"),
        Some("max-age=15768000; includeSubDomains")
    );
    assert_eq!(raw_header(&raw, "x-content-type-options"), Some("nosniff"));
    assert_eq!(raw_header(&raw, "referrer-policy"), Some("no-referrer"));
    let seen = raw_body(&raw);
    assert!(seen.contains("X-Real-IP: 127.0.0.1"), "{seen}");
    assert!(seen.contains("X-Forwarded-Proto: https"), "{seen}");
}

#[test]
fn gitea_behind_caddy() {
    let up = upstream(&[]);
    let v = start("gitea_caddy", &[("$APP", up.addr.to_string())]);
    let r = get(&v, "web", "git.example.com", "/user/login", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-robots-tag"), Some("noindex"));
    assert!(r.header("server").is_none(), "{}", r.head);
    assert_eq!(get(&v, "web", "other.example.com", "/", "").status, 404);
}

#[test]
fn spa_and_api() {
    let up = upstream(&[]);
    let v = start("spa_and_api", &[("$APP", up.addr.to_string())]);
    let r = get(&v, "web", "app", "/app.js", "");
    assert_eq!(
        (r.status, r.body_str().trim()),
        (200, "console.log(\"app\")")
    );
    // A client-side route falls back to the app's index.
    let r = get(&v, "web", "app", "/settings/profile", "");
    assert_eq!(r.status, 200);
    assert!(r.body_str().contains("<div id=\"root\">"));
    let r = get(&v, "web", "app", "/api/echo?page=2", "");
    assert_eq!(seen_line(&r), "GET /echo?page=2 HTTP/1.1");
}

#[test]
fn websocket_app() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let up = upstream(&[]);
    let ws = ws_echo_server();
    let v = start(
        "websocket_app",
        &[("$APP", up.addr.to_string()), ("$WS", ws.to_string())],
    );
    let a = addr(&v, "web");
    runtime().block_on(async {
        let (mut c, resp) = tokio_tungstenite::connect_async(format!("ws://{a}/ws/chat"))
            .await
            .unwrap();
        assert_eq!(resp.status(), 101);
        c.send(Message::text("hi")).await.unwrap();
        assert_eq!(c.next().await.unwrap().unwrap(), Message::text("hi"));
    });
    assert_eq!(get(&v, "web", "chat", "/", "").status, 200);
}

#[test]
fn www_to_apex() {
    let up = upstream(&[]);
    let v = start("www_to_apex", &[("$APP", up.addr.to_string())]);
    let r = get(&v, "web", "www.example.com", "/a/b?c=1", "");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("https://example.com/a/b?c=1"));
    assert_eq!(get(&v, "web", "example.com", "/", "").status, 200);
}

#[test]
fn maintenance_page() {
    let v = start("maintenance_page", &[]);
    let r = get(&v, "web", "app", "/anything", "");
    assert_eq!(r.status, 502);
    assert_eq!(r.body_str(), "<h1>Down for maintenance</h1>\n");
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
}

#[test]
fn health_endpoint() {
    let up = upstream(&[]);
    let v = start("health_endpoint", &[("$APP", up.addr.to_string())]);
    let r = get(&v, "web", "lb", "/healthz", "");
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok"));
    assert!(
        r.header("x-upstream").is_none(),
        "answered without the upstream"
    );
    assert!(get(&v, "web", "lb", "/healthz/deep", "")
        .header("x-upstream")
        .is_some());
}

#[test]
fn legacy_rewrite() {
    let up = upstream(&[]);
    let v = start("legacy_rewrite", &[("$APP", up.addr.to_string())]);
    let r = get(&v, "web", "app", "/api/v1/users/42", "");
    assert_eq!(seen_line(&r), "GET /echo?user=42 HTTP/1.1");
    let r = get(&v, "web", "app", "/blog/2020/post", "");
    assert_eq!((r.status, r.header("location")), (301, Some("/articles/")));
    let r = get(&v, "web", "app", "/api/v1/users/me", "");
    assert_eq!(r.status, 200);
    assert!(r.header("x-upstream").is_some());
}

#[test]
fn traefik_security_headers() {
    let up = upstream(&[]);
    let v = start("traefik_security_headers", &[("$APP", up.addr.to_string())]);
    let r = get(&v, "web", "app.example.com", "/", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(
        r.header("strict-transport-security"),
        Some("max-age=31536000")
    );
    assert!(r.header("server").is_none());
    // No route for another host: veloxy's own 404.
    assert_eq!(get(&v, "web", "other", "/", "").status, 404);
}

#[test]
fn canary_by_header() {
    let up = upstream(&[]);
    let v = start("canary_by_header", &[("$APP", up.addr.to_string())]);
    let r = get(&v, "web", "app", "/echo", "X-Canary: 1\r\n");
    assert_eq!(seen_header(&r, "x-release").as_deref(), Some("canary"));
    let r = get(&v, "web", "app", "/echo", "");
    assert_eq!(seen_header(&r, "x-release").as_deref(), Some("stable"));
}

#[test]
fn upload_cap_and_request_id() {
    let up = upstream(&[]);
    let v = start("upload_cap_request_id", &[("$APP", up.addr.to_string())]);
    let a = addr(&v, "web");
    let post = |len: usize| {
        request(
            a,
            &format!(
                "POST /upload HTTP/1.1\r\nHost: app\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{}",
                "u".repeat(len)
            ),
        )
    };
    let r = post(1000);
    assert_eq!(r.status, 200);
    let id = r.header("x-request-id").unwrap().to_owned();
    assert_eq!(
        seen_header(&r, "x-request-id").as_deref(),
        Some(id.as_str())
    );
    let r = post((1 << 20) + 1);
    assert_eq!(r.status, 413);
    assert_eq!(r.header("x-request-id").map(str::len), Some(32));
    assert_eq!(get(&v, "web", "app", "/upload", "").status, 405);
}
