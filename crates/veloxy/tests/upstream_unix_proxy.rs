//! Issue 13, last parts: unix-socket backends (a real nginx on a unix socket: pooled
//! connections, health checks, HTTP/1.1 and HTTP/2 clients) and PROXY headers sent to HTTP
//! upstream groups (each client's own connections; never another client's).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use veloxy_testkit::*;

#[test]
fn unix_socket_backend_is_pooled_and_health_checked() {
    let socks = tempfile::tempdir().unwrap();
    let sock = socks.path().join("app.sock");
    let missing = socks.path().join("gone.sock");
    // `$connection` is nginx's serial number of the connection a request came on.
    let Some(_nginx) = Nginx::start(&format!(
        "  listen unix:{};\n  location /health {{ return 204; }}\n  \
         location / {{ return 200 \"conn=$connection\\n\"; }}",
        sock.display()
    )) else {
        return;
    };
    let s = Site::start(
        "",
        "",
        &format!(
            "[upstreams.app]\nservers = [\"unix:{}\", \"unix:{}\"]\n\
             [upstreams.app.health]\npath = \"/health\"\ninterval = \"50ms\"\nunhealthy = 1\n\
             [[routes]]\nupstream = \"app\"\n",
            sock.display(),
            missing.display()
        ),
    );
    // The missing socket fails its checks and leaves the rotation.
    assert!(
        eventually(Duration::from_secs(5), || {
            let log = s.v.proc.log_text();
            log.contains("health check: backend down") && log.contains("gone.sock")
        }),
        "{}",
        s.v.proc.log_text()
    );
    // HTTP/1.1 and HTTP/2 clients reach nginx over its unix socket, through one pooled
    // upstream connection (the same nginx connection serial each time).
    let mut conns = Vec::new();
    for _ in 0..3 {
        let (status, raw) = s.h1("/", "");
        assert_eq!(status, 200, "{raw}");
        conns.push(raw_body(&raw).trim().to_owned());
        let r = s.h2("/", &[]);
        assert_eq!(r.status, 200);
        conns.push(r.body_str().trim().to_owned());
    }
    assert!(conns[0].starts_with("conn="), "{conns:?}");
    assert!(
        conns.iter().all(|c| *c == conns[0]),
        "one pooled unix connection: {conns:?}"
    );
}

/// A back end veloxy that takes PROXY headers from 127.0.0.1 and answers with the client's
/// address and port as it learned them.
fn proxy_aware_back() -> Veloxy {
    veloxy(
        "[server]\nworkers = 1\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nproxy_protocol = true\n\
         [[routes]]\nrespond = { body = \"ok\" }\n\
         response_headers = { add = { \"X-Client\" = \"{client_ip}:{client_port}\" } }\n",
    )
}

/// A keep-alive client from loopback address `src`.
fn client_from(src: &str, to: SocketAddr) -> (std::net::TcpStream, SocketAddr) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let bind: SocketAddr = format!("{src}:0").parse().unwrap();
    s.bind(&bind.into()).unwrap();
    s.connect(&to.into()).unwrap();
    let s: std::net::TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let local = s.local_addr().unwrap();
    (s, local)
}

/// One GET on a keep-alive connection: the client the back saw (its answer is short and
/// has a Content-Length).
fn seen_as(s: &mut std::net::TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let head = format!("{head}\r\n\r\n");
            let len: usize = raw_header(&head, "content-length")
                .expect("content-length")
                .parse()
                .unwrap();
            if body.len() >= len {
                return raw_header(&head, "x-client").unwrap_or("").to_owned();
            }
        }
    }
}

#[test]
fn proxy_protocol_to_an_http_group_names_each_client_on_its_own_connections() {
    let back = proxy_aware_back();
    for version in ["v1", "v2"] {
        let front = veloxy(&format!(
            "[server]\nworkers = 1\n\
             [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
             [upstreams.back]\nservers = [\"{}\"]\nproxy_protocol = \"{version}\"\n\
             [[routes]]\nupstream = \"back\"\n",
            back.addr
        ));
        // Client A: two requests on one connection, both named A (its upstream connection is
        // reused; the back would see the front's port on a connection without a header).
        let (mut a, a_addr) = client_from("127.0.0.3", front.addr);
        assert_eq!(seen_as(&mut a), a_addr.to_string(), "{version}");
        assert_eq!(seen_as(&mut a), a_addr.to_string(), "{version}");
        // Client B, while A's upstream connection sits idle in the pool: B must not get it.
        let (mut b, b_addr) = client_from("127.0.0.4", front.addr);
        assert_eq!(seen_as(&mut b), b_addr.to_string(), "{version}");
        drop(a);
        drop(b);
        // An HTTP/2 client (h2c prior knowledge) is named too.
        let reply = h2c_get(front.addr);
        let (ip, port) = reply.rsplit_once(':').expect("ip:port");
        assert_eq!(ip, "127.0.0.1", "{version}");
        assert_ne!(port, "0", "{version}");
    }
}

fn h2c_get(addr: SocketAddr) -> String {
    runtime().block_on(async {
        let mut c = h2_connect(addr, None).await;
        let r = h2_send(&mut c, h2_get("x", "/", false), None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        r.header("x-client").unwrap_or("").to_owned()
    })
}
