//! gRPC-Web through veloxy (a route's `grpc_web`): gRPC-Web frames built here, sent over
//! HTTP/1.1 and HTTP/2 (h2c prior knowledge), in binary and `-text` (base64) modes, to a real
//! gRPC server (Python grpcio, `tests/support/grpc_server.py`) behind an `h2c` group. The
//! answers' data frames and their final trailer frame (status, message, custom trailing
//! metadata) are checked, as are the CORS preflight, a native gRPC client on the same route,
//! and what the upstream receives (a plain HTTP/2 server records the request: grpcio hides
//! `content-type` from its handlers).
//!
//! The grpcio tests report themselves skipped without grpcio (`.ci/run` installs it into
//! `target/py-grpcio`; `VELOXY_GRPCIO_PYTHON` names another Python).

use veloxy_testkit::*;

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;

/// The Python with grpcio that `.ci/run` prepares.
fn grpcio_python() -> Option<String> {
    veloxy_testkit::python_with("VELOXY_GRPCIO_PYTHON", "py-grpcio", "grpc")
}

/// The grpcio server, stopped (its stdin closed, then killed) when dropped.
struct GrpcServer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the grpcio server; `None` (the test reports itself skipped) without grpcio.
fn grpc_server() -> Option<GrpcServer> {
    let python = grpcio_python()?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/grpc_server.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Ready when it prints its port; the wait is bounded.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the gRPC server reports its port");
    let port: u16 = line.trim().parse().expect("a port");
    Some(GrpcServer {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    })
}

fn config(server: SocketAddr, grpc_web: &str) -> String {
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"grpc\"\ngrpc_web = {grpc_web}\n\
         [upstreams.grpc]\nservers = [\"{server}\"]\nprotocol = \"h2c\"\n"
    )
}

/// One gRPC message as a length-prefixed frame (uncompressed).
fn frame(msg: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// A gRPC-Web answer's body, split: the messages, then the one trailer frame's fields.
#[derive(Debug)]
struct WebReply {
    messages: Vec<Vec<u8>>,
    trailers: Vec<(String, String)>,
}

impl WebReply {
    fn trailer(&self, name: &str) -> Option<&str> {
        self.trailers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Decodes base64 that may be several padded chunks one after another (as the protocol lets
/// a server send), one 4-character group at a time.
fn decode_text(text: &[u8]) -> Vec<u8> {
    assert_eq!(text.len() % 4, 0, "whole base64 groups: {text:?}");
    text.chunks(4)
        .flat_map(|g| STANDARD.decode(g).expect("base64"))
        .collect()
}

/// Parses a gRPC-Web body: data frames (flag 0), then exactly one trailer frame (flag 0x80),
/// last, whose lines are `name:value\r\n` with lowercase names.
fn parse_web(body: &[u8], text: bool) -> WebReply {
    let bytes = if text {
        decode_text(body)
    } else {
        body.to_vec()
    };
    let mut rest = &bytes[..];
    let mut reply = WebReply {
        messages: Vec::new(),
        trailers: Vec::new(),
    };
    let mut trailer_seen = false;
    while !rest.is_empty() {
        assert!(!trailer_seen, "nothing after the trailer frame: {bytes:?}");
        assert!(rest.len() >= 5, "a whole frame header: {bytes:?}");
        let flag = rest[0];
        let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
        let payload = &rest[5..5 + len];
        rest = &rest[5 + len..];
        match flag {
            0 => reply.messages.push(payload.to_vec()),
            0x80 => {
                trailer_seen = true;
                let block = std::str::from_utf8(payload).unwrap();
                assert!(block.is_empty() || block.ends_with("\r\n"), "{block:?}");
                for line in block.split("\r\n").filter(|l| !l.is_empty()) {
                    let (n, v) = line.split_once(':').expect("name:value");
                    assert_eq!(n, n.to_ascii_lowercase(), "lowercase names");
                    reply.trailers.push((n.to_owned(), v.trim().to_owned()));
                }
            }
            other => panic!("unexpected frame flag {other:#x}"),
        }
    }
    assert!(trailer_seen, "a trailer frame ends the answer: {bytes:?}");
    reply
}

/// A gRPC-Web request body: `msg` framed, base64 for `-text`.
fn web_body(msg: &[u8], text: bool) -> Vec<u8> {
    let f = frame(msg);
    if text {
        STANDARD.encode(f).into_bytes()
    } else {
        f
    }
}

fn content_type(text: bool) -> &'static str {
    if text {
        "application/grpc-web-text"
    } else {
        "application/grpc-web+proto"
    }
}

/// A gRPC-Web call over HTTP/1.1, as a browser's library sends it.
fn h1_call(addr: SocketAddr, method: &str, msg: &[u8], text: bool, extra: &str) -> Response {
    let body = web_body(msg, text);
    let mut c = Client::connect(addr);
    let mut raw = format!(
        "POST /test.Web/{method} HTTP/1.1\r\nHost: grpc.test\r\ncontent-type: {}\r\n\
         x-grpc-web: 1\r\nx-user-agent: grpc-web-javascript/0.1\r\n{extra}\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        content_type(text),
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    c.send(&raw);
    c.read_response(false)
}

/// A gRPC-Web call over HTTP/2.
async fn h2_call(
    c: &mut h2::client::SendRequest<Bytes>,
    method: &str,
    msg: &[u8],
    text: bool,
) -> H2Reply {
    let req = http::Request::post(format!("http://grpc.test/test.Web/{method}"))
        .header("content-type", content_type(text))
        .header("x-grpc-web", "1")
        .header("x-user-agent", "grpc-web-javascript/0.1")
        .body(())
        .unwrap();
    let call = h2_send(c, req, Some(web_body(msg, text).into()));
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("answered in time")
        .unwrap()
}

#[test]
fn grpc_web_over_http1_binary_and_text() {
    let Some(server) = grpc_server() else {
        return skip("grpcio is not installed (.ci/run prepares target/py-grpcio)");
    };
    let v = veloxy(&config(server.addr, "true"));

    // Unary, binary: the message back, status 0 in the trailer frame.
    let r = h1_call(v.addr, "Echo", b"hello web", false, "");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/grpc-web+proto"));
    assert_eq!(
        r.header("x-seen-grpc-web"),
        Some("absent"),
        "x-grpc-web removed"
    );
    let w = parse_web(&r.body, false);
    assert_eq!(w.messages, [b"hello web".to_vec()]);
    assert_eq!(w.trailer("grpc-status"), Some("0"));

    // Unary, text: base64 both ways.
    let r = h1_call(v.addr, "Echo", b"hello text", true, "");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/grpc-web-text"));
    let w = parse_web(&r.body, true);
    assert_eq!(w.messages, [b"hello text".to_vec()]);
    assert_eq!(w.trailer("grpc-status"), Some("0"));

    // Server streaming, text: every message, then the status.
    let r = h1_call(v.addr, "Many", b"5", true, "");
    let w = parse_web(&r.body, true);
    let want: Vec<Vec<u8>> = (0..5)
        .map(|i| format!("message {i}").into_bytes())
        .collect();
    assert_eq!(w.messages, want);
    assert_eq!(w.trailer("grpc-status"), Some("0"));

    // An error after one streamed message, with custom trailing metadata.
    let r = h1_call(v.addr, "Fail", b"", false, "");
    assert_eq!(r.status, 200);
    let w = parse_web(&r.body, false);
    assert_eq!(w.messages, [b"first".to_vec()]);
    assert_eq!(w.trailer("grpc-status"), Some("8"), "{w:?}");
    assert_eq!(w.trailer("grpc-message"), Some("ran dry"));
    assert_eq!(w.trailer("x-custom-trailer"), Some("custom-value"));

    // A trailers-only answer (the status in the response head) ends with a trailer frame too.
    for text in [false, true] {
        let r = h1_call(v.addr, "Deny", b"", text, "");
        assert_eq!(r.status, 200);
        let w = parse_web(&r.body, text);
        assert!(w.messages.is_empty());
        assert_eq!(w.trailer("grpc-status"), Some("7"), "{w:?}");
        assert_eq!(w.trailer("grpc-message"), Some("not you"));
    }
}

#[test]
fn grpc_web_over_http2_binary_and_text() {
    let Some(server) = grpc_server() else {
        return skip("grpcio is not installed (.ci/run prepares target/py-grpcio)");
    };
    let v = veloxy(&config(server.addr, "true"));
    runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        for text in [false, true] {
            let r = h2_call(&mut c, "Echo", b"over h2", text).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.header("content-type"), Some(content_type(text)));
            assert_eq!(r.header("x-seen-grpc-web"), Some("absent"));
            assert!(r.trailers.is_none(), "the trailers went into the body");
            let w = parse_web(&r.body, text);
            assert_eq!(w.messages, [b"over h2".to_vec()]);
            assert_eq!(w.trailer("grpc-status"), Some("0"));

            let r = h2_call(&mut c, "Many", b"20", text).await;
            let w = parse_web(&r.body, text);
            assert_eq!(w.messages.len(), 20);
            assert_eq!(w.messages[19], b"message 19");
            assert_eq!(w.trailer("grpc-status"), Some("0"));

            let r = h2_call(&mut c, "Fail", b"", text).await;
            let w = parse_web(&r.body, text);
            assert_eq!(w.messages, [b"first".to_vec()]);
            assert_eq!(w.trailer("grpc-status"), Some("8"));
            assert_eq!(w.trailer("grpc-message"), Some("ran dry"));
            assert_eq!(w.trailer("x-custom-trailer"), Some("custom-value"));

            let r = h2_call(&mut c, "Deny", b"", text).await;
            let w = parse_web(&r.body, text);
            assert_eq!(w.trailer("grpc-status"), Some("7"));
        }
    });
}

#[test]
fn grpc_web_cors_preflight_and_origins() {
    let Some(server) = grpc_server() else {
        return skip("grpcio is not installed (.ci/run prepares target/py-grpcio)");
    };
    let preflight = |addr: SocketAddr, origin: &str| {
        request(
            addr,
            &format!(
                "OPTIONS /test.Web/Echo HTTP/1.1\r\nHost: grpc.test\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type,x-grpc-web,x-user-agent\r\n\
                 Connection: close\r\n\r\n"
            ),
        )
    };
    // `true`: any origin, echoed back.
    let v = veloxy(&config(server.addr, "true"));
    let r = preflight(v.addr, "https://app.example");
    assert_eq!(r.status, 204, "{}", r.head);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("POST"));
    let allowed = r.header("access-control-allow-headers").unwrap();
    for h in [
        "x-grpc-web",
        "x-user-agent",
        "grpc-timeout",
        "content-type",
        "authorization",
    ] {
        assert!(allowed.contains(h), "{h} in {allowed}");
    }
    // The call itself: the page may read the status fields.
    let r = h1_call(
        v.addr,
        "Echo",
        b"x",
        false,
        "Origin: https://app.example\r\n",
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let exposed = r.header("access-control-expose-headers").unwrap();
    assert!(
        exposed.contains("grpc-status") && exposed.contains("grpc-message"),
        "{exposed}"
    );
    assert_eq!(parse_web(&r.body, false).messages, [b"x".to_vec()]);

    // `cors_origins`: only those.
    let v = veloxy(&config(
        server.addr,
        "{ cors_origins = [\"https://app.example\"] }",
    ));
    let r = preflight(v.addr, "https://app.example");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let r = preflight(v.addr, "https://evil.example");
    assert_eq!(r.header("access-control-allow-origin"), None, "{}", r.head);
}

/// A protobuf message with one bytes field: the echo sends its encoding back unchanged.
#[derive(Clone, PartialEq, prost::Message)]
struct Blob {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
}

#[test]
fn native_grpc_still_works_on_a_grpc_web_route() {
    let Some(server) = grpc_server() else {
        return skip("grpcio is not installed (.ci/run prepares target/py-grpcio)");
    };
    let v = veloxy(&config(server.addr, "true"));
    runtime().block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", v.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(20))
            .connect()
            .await
            .unwrap();
        let mut c = tonic::client::Grpc::new(channel);
        let call = async |c: &mut tonic::client::Grpc<tonic::transport::Channel>, path| {
            c.ready().await.unwrap();
            let codec = tonic_prost::ProstCodec::<Blob, Blob>::default();
            let req = Blob {
                data: b"native".to_vec(),
            };
            let path = http::uri::PathAndQuery::from_static(path);
            c.unary(tonic::Request::new(req), path, codec).await
        };
        let r = call(&mut c, "/test.Web/Echo").await.unwrap();
        assert_eq!(r.get_ref().data, b"native");
        // Native gRPC answers keep their content-type and their HTTP/2 trailers.
        let err = call(&mut c, "/test.Web/Deny").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert_eq!(err.message(), "not you");
    });
}

/// What a recording upstream received.
#[derive(Debug, Clone)]
struct Seen {
    headers: http::HeaderMap,
    body: Vec<u8>,
}

/// A plain HTTP/2 (h2c) server that records each request's fields and body and answers like
/// a gRPC server: the body back, then trailers with a status and custom metadata.
fn recording_server() -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let (tcp, _) = l.accept().await.unwrap();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut conn = h2::server::handshake(tcp).await.unwrap();
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        let log = log.clone();
                        tokio::spawn(async move {
                            let (parts, mut body) = req.into_parts();
                            let mut got = Vec::new();
                            while let Some(Ok(d)) = body.data().await {
                                let _ = body.flow_control().release_capacity(d.len());
                                got.extend_from_slice(&d);
                            }
                            log.lock().unwrap().push(Seen {
                                headers: parts.headers,
                                body: got.clone(),
                            });
                            let resp = http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(())
                                .unwrap();
                            let mut s = respond.send_response(resp, false).unwrap();
                            s.send_data(got.into(), false).unwrap();
                            let mut t = http::HeaderMap::new();
                            t.insert("grpc-status", "0".parse().unwrap());
                            t.insert("x-recorded", "yes".parse().unwrap());
                            s.send_trailers(t).unwrap();
                        });
                    }
                });
            }
        });
    });
    (addr, seen)
}

#[test]
fn the_upstream_sees_a_grpc_request() {
    let (addr, seen) = recording_server();
    let v = veloxy(&config(addr, "true"));
    let check = |s: &Seen, proto: bool| {
        let ct = if proto {
            "application/grpc+proto"
        } else {
            "application/grpc"
        };
        assert_eq!(s.headers["content-type"], ct, "{s:?}");
        assert_eq!(s.headers["te"], "trailers");
        assert!(s.headers.get("x-grpc-web").is_none(), "{s:?}");
        assert_eq!(s.headers["x-user-agent"], "grpc-web-javascript/0.1");
    };
    let two = [frame(b"one"), frame(b"two")].concat();

    // HTTP/1.1, -text: the body arrives decoded.
    let r = h1_call(v.addr, "Echo", b"one", true, "");
    assert_eq!(r.status, 200, "{}", r.head);
    let s = seen.lock().unwrap().pop().unwrap();
    check(&s, false);
    assert_eq!(s.body, frame(b"one"));
    // The text's length is dropped (the HTTP/2 client may state the decoded body's).
    if let Some(n) = s.headers.get("content-length") {
        assert_eq!(n.to_str().unwrap(), s.body.len().to_string());
    }
    let w = parse_web(&r.body, true);
    assert_eq!(w.messages, [b"one".to_vec()]);
    assert_eq!(w.trailer("x-recorded"), Some("yes"));

    runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        // HTTP/2, binary.
        let r = h2_call(&mut c, "Echo", b"bin", false).await;
        let s = seen.lock().unwrap().pop().unwrap();
        check(&s, true);
        assert_eq!(s.body, frame(b"bin"));
        assert_eq!(parse_web(&r.body, false).messages, [b"bin".to_vec()]);

        // HTTP/2, -text in odd pieces: two frames encoded as two padded chunks, sent three
        // characters at a time, are decoded as they stream.
        let text = [
            STANDARD.encode(frame(b"one")),
            STANDARD.encode(frame(b"two")),
        ]
        .concat();
        let req = http::Request::post("http://grpc.test/test.Web/Echo")
            .header("content-type", "application/grpc-web-text")
            .header("x-grpc-web", "1")
            .header("x-user-agent", "grpc-web-javascript/0.1")
            .body(())
            .unwrap();
        let mut send = c.clone().ready().await.unwrap();
        let (resp, mut stream) = send.send_request(req, false).unwrap();
        let pieces: Vec<&[u8]> = text.as_bytes().chunks(3).collect();
        for (i, p) in pieces.iter().enumerate() {
            stream
                .send_data(Bytes::copy_from_slice(p), i + 1 == pieces.len())
                .unwrap();
        }
        let resp = tokio::time::timeout(Duration::from_secs(20), resp)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.headers()["content-type"], "application/grpc-web-text");
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(d) = tokio::time::timeout(Duration::from_secs(20), body.data())
            .await
            .unwrap()
        {
            let d = d.unwrap();
            let _ = body.flow_control().release_capacity(d.len());
            got.extend_from_slice(&d);
        }
        let s = seen.lock().unwrap().pop().unwrap();
        check(&s, false);
        assert_eq!(s.body, two);
        let w = parse_web(&got, true);
        assert_eq!(w.messages, [b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(w.trailer("grpc-status"), Some("0"));
    });
}

#[test]
fn grpc_web_over_http3() {
    let Some(server) = grpc_server() else {
        return skip("grpcio is not installed (.ci/run prepares target/py-grpcio)");
    };
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"grpc\"\ngrpc_web = true\n\
         [upstreams.grpc]\nservers = [\"{}\"]\nprotocol = \"h2c\"\n",
        cert.display(),
        key.display(),
        server.addr
    ));
    runtime().block_on(async {
        let mut c = h3_connect(v.addr, "localhost", &pki.ca_pem).await.unwrap();
        for text in [false, true] {
            let req = http::Request::post("https://localhost/test.Web/Fail")
                .header("content-type", content_type(text))
                .header("x-grpc-web", "1")
                .body(())
                .unwrap();
            let call = h3_send(&mut c, req, Some(web_body(b"", text).into()));
            let r = tokio::time::timeout(Duration::from_secs(20), call)
                .await
                .expect("answered in time")
                .unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.header("content-type"), Some(content_type(text)));
            assert!(r.trailers.is_none(), "the trailers went into the body");
            let w = parse_web(&r.body, text);
            assert_eq!(w.messages, [b"first".to_vec()]);
            assert_eq!(w.trailer("grpc-status"), Some("8"));
            assert_eq!(w.trailer("x-custom-trailer"), Some("custom-value"));
        }
    });
}

/// veloxy's own answer to a gRPC-Web request it cannot forward (the backend is down) is a
/// gRPC-Web trailers-only answer: the status in the head and in a trailer frame.
#[test]
fn grpc_web_clients_get_veloxy_errors_as_grpc_web() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let v = veloxy(&config(dead, "true"));
    runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        for text in [false, true] {
            let r = h2_call(&mut c, "Echo", b"x", text).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.header("content-type"), Some(content_type(text)));
            assert_eq!(r.header("grpc-status"), Some("14"));
            let w = parse_web(&r.body, text);
            assert!(w.messages.is_empty());
            assert_eq!(w.trailer("grpc-status"), Some("14"), "{w:?}");
        }
    });
}
