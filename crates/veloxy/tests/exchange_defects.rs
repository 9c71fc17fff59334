//! Defects of issue 34, each the same over every client protocol now: request bodies of
//! search-gateway routes are capped over HTTP/1 as over HTTP/2, ...

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use veloxy_testkit::*;

/// A search gateway in front of the test backend (it answers `/_search`), with the query
/// cache on: the route whose HTTP/1 chunked bodies were read with no limit.
fn search_gateway(node: std::net::SocketAddr) -> Veloxy {
    veloxy(&format!(
        "[server]\nworkers = 1\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [caches.q]\nmemory = \"16MiB\"\n\
         [[routes]]\nupstream = \"es\"\n\
         search = {{ query_cache = \"q\", ttl = \"1m\" }}\n\
         [upstreams.es]\nservers = [\"{node}\"]\n\
         search = {{ kind = \"opensearch\", discover = \"0s\" }}\n"
    ))
}

/// Sends a chunked POST of `total` bytes in 64 KiB chunks (stopping early if the proxy
/// closes) and returns the status line's code.
fn chunked_post(addr: std::net::SocketAddr, path: &str, total: usize) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: es\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0;
    while sent < total {
        let n = chunk.len().min(total - sent);
        let mut frame = format!("{n:x}\r\n").into_bytes();
        frame.extend_from_slice(&chunk[..n]);
        frame.extend_from_slice(b"\r\n");
        if s.write_all(&frame).is_err() {
            break;
        }
        sent += n;
    }
    let _ = s.write_all(b"0\r\n\r\n");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Defect 1: an HTTP/1 chunked `_search` body on a query-cached route is capped like a
/// declared one (1 MiB for queries): 413, not read whole into memory.
#[test]
fn http1_chunked_search_bodies_are_capped() {
    let node = upstream(&[]);
    let v = search_gateway(node.addr);
    assert_eq!(chunked_post(v.addr, "/idx/_search", 3 << 20), 413);
    // A small chunked query goes through.
    assert_ne!(chunked_post(v.addr, "/idx/_search", 100), 413);
    // HTTP/2 without a declared length: the same cap (this path had it already).
    let status = http2::runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{}/idx/_search", v.addr))
            .body(())
            .unwrap();
        h2_send(&mut c, req, Some(bytes::Bytes::from(vec![b' '; 3 << 20])))
            .await
            .map(|r| r.status)
            .unwrap_or(0)
    });
    assert_eq!(status, 413);
}
