//! Bodies stream through bounded buffers: 1 GiB each way without the proxy's RSS growing.

use veloxy_testkit::*;

use std::io::{Read, Write};

const GIB: u64 = 1 << 30;

#[test]
fn one_gib_download_streams_with_bounded_memory() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    // Warm up so the baseline includes the buffers every request uses.
    assert_eq!(get(v.addr, "/size/100000").body.len(), 100000);
    let before = v.proc.rss_kib();
    let mut c = Client::connect(v.addr);
    c.send(format!("GET /size/{GIB} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes());
    // Read the head, then count the body without keeping it.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        c.stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains(&format!("Content-Length: {GIB}"))
            || head.contains(&format!("content-length: {GIB}"))
    );
    let mut buf = vec![0u8; 1 << 20];
    let mut total: u64 = 0;
    let mut peak = before;
    let mut first_ok = false;
    loop {
        let n = c.stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        if total == 0 {
            first_ok = buf[0] == b'a';
        }
        total += n as u64;
        if total % (64 << 20) < n as u64 {
            peak = peak.max(v.proc.rss_kib());
        }
    }
    assert!(first_ok);
    assert_eq!(total, GIB);
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 8 * 1024,
        "RSS grew by {grew} KiB during a 1 GiB download"
    );
}

#[test]
fn one_gib_upload_streams_with_bounded_memory() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    assert_eq!(get(v.addr, "/").status, 200);
    let before = v.proc.rss_kib();
    let mut c = Client::connect(v.addr);
    c.send(format!("POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: {GIB}\r\n\r\n").as_bytes());
    let chunk: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    let mut sum: u64 = 0;
    let chunk_sum: u64 = chunk.iter().map(|&b| b as u64).sum();
    let mut peak = before;
    for i in 0..1024 {
        c.stream.write_all(&chunk).unwrap();
        sum = sum.wrapping_add(chunk_sum);
        if i % 64 == 0 {
            peak = peak.max(v.proc.rss_kib());
        }
    }
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    let body = r.body_str();
    assert!(body.contains(&format!("\"bytes\":{GIB}")), "{body}");
    assert!(body.contains(&format!("\"sum\":{sum}")), "{body}");
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 8 * 1024,
        "RSS grew by {grew} KiB during a 1 GiB upload"
    );
}

#[test]
fn chunked_upload_is_forwarded_intact() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    let mut c = Client::connect(v.addr);
    c.send(b"POST /sink HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    let mut expected_sum: u64 = 0;
    let mut total = 0u64;
    for i in 0..200u64 {
        let size = 1 + (i * 7919) % 20000;
        let data: Vec<u8> = (0..size).map(|j| (j % 200) as u8 + 1).collect();
        expected_sum = data
            .iter()
            .fold(expected_sum, |s, &b| s.wrapping_add(b as u64));
        total += size;
        c.send(format!("{size:x}\r\n").as_bytes());
        c.send(&data);
        c.send(b"\r\n");
    }
    c.send(b"0\r\n\r\n");
    let r = c.read_response(false);
    assert!(
        r.body_str().contains(&format!("\"bytes\":{total}")),
        "{}",
        r.body_str()
    );
    assert!(
        r.body_str().contains(&format!("\"sum\":{expected_sum}")),
        "{}",
        r.body_str()
    );
}
