//! WebSocket (HTTP/1.1 Upgrade) through veloxy: echo both ways, plain and over TLS, the idle
//! limit, a refused upgrade, and reloads that keep open WebSocket and HTTP/2 connections.

use veloxy_testkit::*;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

async fn echo_roundtrip<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    match ws.next().await.unwrap().unwrap() {
        Message::Binary(b) => assert_eq!(&b[..], &big[..], "1 MB binary message intact"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn websocket_echo_through_the_proxy() {
    let backend = ws_echo_server();
    let v = veloxy(&simple_config(&[backend], ""));
    runtime().block_on(async {
        let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{}/ws", v.addr))
            .await
            .unwrap();
        assert_eq!(resp.status(), 101);
        echo_roundtrip(&mut ws).await;
        ws.close(None).await.unwrap();
    });
}

#[test]
fn websocket_over_tls() {
    let backend = ws_echo_server();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let config = simple_config(&[backend], "").replace(
        "[[routes]]",
        &format!(
            "[listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n[[routes]]",
            cert.display(),
            key.display()
        ),
    );
    let v = veloxy(&config);
    runtime().block_on(async {
        let tcp = tokio::net::TcpStream::connect(v.addr).await.unwrap();
        let connector =
            tokio_rustls::TlsConnector::from(default_client(&pki.ca_pem, &[b"http/1.1"]));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = connector.connect(name, tcp).await.unwrap();
        let (mut ws, resp) = tokio_tungstenite::client_async("wss://localhost/ws", tls)
            .await
            .unwrap();
        assert_eq!(resp.status(), 101);
        echo_roundtrip(&mut ws).await;
    });
}

#[test]
fn idle_websockets_are_closed_after_the_limit() {
    let backend = ws_echo_server();
    let config = simple_config(&[backend], "")
        .replace("[[routes]]", "upgrade_idle_timeout = \"1s\"\n[[routes]]");
    let v = veloxy(&config);
    runtime().block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", v.addr))
            .await
            .unwrap();
        // Traffic keeps it open past the limit...
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            ws.send(Message::text("ping")).await.unwrap();
            assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("ping"));
        }
        // ...silence closes it.
        let t0 = Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
        assert!(end.is_ok(), "closed by the idle limit, not left open");
        assert!(!matches!(end, Ok(Some(Ok(Message::Text(_))))));
        assert!(t0.elapsed() >= Duration::from_millis(900));
    });
}

#[test]
fn upgrade_headers_reach_the_upstream_and_a_refusal_is_a_normal_response() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    let mut c = Client::connect(v.addr);
    c.send(b"GET /echo HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    let r = c.read_response(false);
    // The test upstream does not speak WebSocket: it answers 200, which goes back as is.
    assert_eq!(r.status, 200);
    let body = r.body_str();
    assert!(body.contains("Upgrade: websocket"), "{body}");
    assert!(body.contains("Connection: Upgrade"), "{body}");
    assert!(body.contains("Sec-WebSocket-Key:"), "{body}");
    // The connection is still a normal keep-alive connection.
    c.send(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
}

#[test]
fn reload_under_load_keeps_open_websocket_and_http2_connections() {
    let backend = ws_echo_server();
    let up = upstream(&["--name", "first"]);
    let up2 = upstream(&["--name", "second"]);
    let config = |h1: SocketAddr| {
        format!(
            "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
             [[routes]]\npath = \"/ws\"\nupstream = \"ws\"\n[[routes]]\nupstream = \"app\"\n\
             [upstreams.ws]\nservers = [\"{backend}\"]\n[upstreams.app]\nservers = [\"{h1}\"]\n"
        )
    };
    let v = veloxy(&config(up.addr));
    let authority = v.addr.to_string();
    // Steady HTTP/1.1 load through the reload, bounded in count and time; every request must
    // succeed.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, addr) = (stop.clone(), v.addr);
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u32, 0u32);
            let t0 = Instant::now();
            let mut c = Client::connect(addr);
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && ok + failed < 20_000
                && t0.elapsed() < Duration::from_secs(20)
            {
                c.send(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
                match c.try_read_response(false) {
                    Some(r) if r.status == 200 => ok += 1,
                    _ => {
                        failed += 1;
                        c = Client::connect(addr);
                    }
                }
            }
            (ok, failed)
        })
    };
    runtime().block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", v.addr))
            .await
            .unwrap();
        let mut h2 = h2_connect(v.addr, None).await;
        let r = h2_send(&mut h2, h2_get(&authority, "/echo", false), None)
            .await
            .unwrap();
        assert_eq!(r.header("x-upstream"), Some("first"));

        let cfg = config(up2.addr);
        let v_ref = &v;
        tokio::task::spawn_blocking({
            let cfg = cfg.clone();
            let dir = v_ref.dir.path().to_path_buf();
            let pid = v_ref.proc.pid();
            move || {
                std::fs::write(dir.join("veloxy.toml"), cfg).unwrap();
                std::process::Command::new("kill")
                    .args(["-HUP", &pid.to_string()])
                    .status()
                    .unwrap();
            }
        })
        .await
        .unwrap();
        // The same HTTP/2 connection soon routes by the new config.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = h2_send(&mut h2, h2_get(&authority, "/echo", false), None)
                .await
                .expect("HTTP/2 connection survives the reload");
            if r.header("x-upstream") == Some("second") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "reload never reached the connection"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The WebSocket opened before the reload still echoes.
        echo_roundtrip(&mut ws).await;
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.join().unwrap();
    assert!(ok > 0);
    assert_eq!(
        failed, 0,
        "requests failed during the reload ({ok} succeeded)"
    );
    assert!(v.proc.log_text().contains("reloaded"));
}
