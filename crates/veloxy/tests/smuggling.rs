//! Request smuggling, checked from outside: the request classes of HTTP Garden and of
//! defparam's `smuggler` mutation list (which is not on PyPI, so its cases are written out
//! here), sent as raw bytes to veloxy in front of (a) the testkit's scripted origin and (b) a
//! real nginx (skipped when nginx is not installed).
//!
//! Every case is a first request built so that any other reading of its framing would turn
//! a hidden `GET /smuggled` into a request of its own, followed on the same connection by a
//! pipelined `GET /follow` (with `Connection: close`). For each case the test asserts:
//! * the upstream never receives a request for `/smuggled`;
//! * the upstream receives exactly as many requests as the client got upstream answers
//!   (200s): nothing is forwarded that the client was not answered for;
//! * a 4xx answer ends the connection (nothing is read after it);
//! * a marker request on a fresh connection afterwards gets its own answer (no bytes left
//!   behind on a pooled upstream connection shift the answers).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use veloxy_testkit::*;

/// The request a desync would expose.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
const FOLLOW: &str = "GET /follow HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
const WAIT: Duration = Duration::from_secs(10);

/// A CL.TE request: `Content-Length` covers the whole body, `te_line` (some spelling of
/// `Transfer-Encoding`) ends it after the empty last chunk, before [`SMUGGLED`].
fn cl_te(version: &str, te_line: &str) -> Vec<u8> {
    let body = format!("0\r\n\r\n{SMUGGLED}");
    format!(
        "POST /case {version}\r\nHost: a\r\nContent-Length: {}\r\n{te_line}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A TE.CL request: chunked, [`SMUGGLED`] is one chunk's data; `Content-Length: 4` ends the
/// body inside the chunk-size line.
fn te_cl(te_line: &str) -> Vec<u8> {
    format!(
        "POST /case HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n{te_line}\r\n\r\n{:x}\r\n{SMUGGLED}\r\n0\r\n\r\n",
        SMUGGLED.len()
    )
    .into_bytes()
}

/// A chunked request (no `Content-Length`) whose one chunk has size line `size` over 5 bytes
/// of data.
fn chunk_size(size: &str) -> Vec<u8> {
    format!(
        "POST /case HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nhello\r\n0\r\n\r\n"
    )
    .into_bytes()
}

/// A request with these header lines and `hello` + [`SMUGGLED`] after the head (40 bytes):
/// a reading of the lines as 5 exposes [`SMUGGLED`], one as 40 does not.
fn with_lines(lines: &str) -> Vec<u8> {
    format!("POST /case HTTP/1.1\r\nHost: a\r\n{lines}\r\n\r\nhello{SMUGGLED}").into_bytes()
}

fn cases() -> Vec<(String, Vec<u8>)> {
    let te_spellings = [
        "Transfer-Encoding: chunked",
        "Transfer-Encoding : chunked",
        "Transfer-Encoding\t: chunked",
        "Transfer-Encoding: xchunked",
        "Transfer-Encoding: chunked, identity",
        "Transfer-Encoding: identity, chunked",
        "Transfer-Encoding:\tchunked",
        "Transfer-Encoding:\x0bchunked",
        "Transfer-Encoding: \x0bchunked",
        "Transfer-Encoding:\x0cchunked",
        "Transfer-Encoding: chunked\x0b",
        "Transfer-Encoding: CHUNKED",
        "Transfer-Encoding: \"chunked\"",
        "Transfer-Encoding: chunk",
        "Transfer-Encoding:\r\n chunked",
        "Transfer-Encoding: x\r\n chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity",
        "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
        " Transfer-Encoding: chunked",
        "X: y\r\n Transfer-Encoding: chunked",
        "Transfer_Encoding: chunked",
        "Transfer-Encoding: \x00chunked",
        "Transfer-Encoding: chu\x00nked",
        "Transfer-\x00Encoding: chunked",
    ];
    let mut out = Vec::new();
    for te in te_spellings {
        out.push((format!("CL.TE {te:?}"), cl_te("HTTP/1.1", te)));
        // `Transfer_Encoding` is another field (dropped by default): the request's only
        // framing is `Content-Length: 4`, so what follows is a pipelined request of the
        // client's own; the CL.TE shape covers it.
        if !te.starts_with("Transfer_") {
            out.push((format!("TE.CL {te:?}"), te_cl(te)));
        }
    }
    out.push((
        "HTTP/1.0 CL.TE".into(),
        cl_te("HTTP/1.0", "Transfer-Encoding: chunked"),
    ));
    for size in [
        "+5",
        "0x5",
        "5 ",
        "5  ",
        "5\t",
        "-5",
        "5;ext",
        "5 ;ext",
        "0000000000000000000000000000000000000005",
        "10000000000000005",
        "ffffffffffffffffff5",
    ] {
        out.push((format!("chunk size {size:?}"), chunk_size(size)));
    }
    for lines in [
        "Content-Length: 5\r\nContent-Length: 40",
        "Content-Length: 40\r\nContent-Length: 5",
        "Content-Length: 5, 40",
        "Content-Length: 40, 5",
        "Content-Length: +5",
        "Content-Length: 0x5",
        "Content-Length: 5.0",
        "Content-Length: -5",
        "Content-Length : 5",
        "Content-Length:\x0b5",
        "Content-Length: 5\x00",
        "X-A: a\x00b\r\nContent-Length: 5",
        "Content-Length: 5\r\n folded",
    ] {
        out.push((format!("lines {lines:?}"), with_lines(lines)));
    }
    // Lengths a server may accept as 5 (RFC 9110 8.6, RFC 9112 6.3): the body is `hello`, and
    // nothing follows it but the pipelined request.
    for lines in [
        "Content-Length: 5, 5",
        "Content-Length: 5\r\nContent-Length: 5",
        "Content-Length: 5 ",
        "Content-Length: 05",
    ] {
        out.push((
            format!("valid {lines:?}"),
            format!("POST /case HTTP/1.1\r\nHost: a\r\n{lines}\r\n\r\nhello").into_bytes(),
        ));
    }
    out.push((
        "GET with a body".into(),
        format!(
            "GET /case HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{SMUGGLED}",
            SMUGGLED.len()
        )
        .into_bytes(),
    ));
    let line_cases: [(&str, &[u8]); 9] = [
        ("bare LF", b"GET /case HTTP/1.1\nHost: a\n\n"),
        (
            "bare LF in a chunked body",
            b"POST /case HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n",
        ),
        (
            "absolute-form, another host",
            b"GET http://other.example/case HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        ("two spaces", b"GET  /case HTTP/1.1\r\nHost: a\r\n\r\n"),
        ("trailing space", b"GET /case HTTP/1.1 \r\nHost: a\r\n\r\n"),
        ("space in target", b"GET /ca se HTTP/1.1\r\nHost: a\r\n\r\n"),
        ("tab separator", b"GET\t/case HTTP/1.1\r\nHost: a\r\n\r\n"),
        (
            "NUL in target",
            b"GET /ca\x00se HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        ("HTTP/1.2", b"GET /case HTTP/1.2\r\nHost: a\r\n\r\n"),
    ];
    for (name, raw) in line_cases {
        out.push((name.into(), raw.to_vec()));
    }
    out
}

/// The statuses of the responses on `raw` (a whole connection's worth), in order.
fn statuses(raw: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).to_ascii_lowercase();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        out.push(status);
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        rest = &rest[(end + 4 + len).min(rest.len())..];
    }
    out
}

/// Sends `raw` then [`FOLLOW`] and reads until veloxy closes (bounded).
fn exchange(addr: SocketAddr, name: &str, raw: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut msg = raw.to_vec();
    msg.extend_from_slice(FOLLOW.as_bytes());
    let _ = s.write_all(&msg);
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "{name}: veloxy neither answered both nor closed: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
}

/// What an upstream reports of the requests it received.
trait Seen {
    /// The targets of every request received so far.
    fn targets(&self) -> Vec<String>;
}

impl Seen for ScriptOrigin {
    fn targets(&self) -> Vec<String> {
        self.requests().into_iter().map(|r| r.target).collect()
    }
}

struct NginxLog(std::path::PathBuf);

impl Seen for NginxLog {
    fn targets(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split('"').nth(1))
            .map(|r| r.split(' ').nth(1).unwrap_or("").to_string())
            .collect()
    }
}

/// Runs every case through veloxy at `addr` in front of `up`; returns the findings.
fn run(addr: SocketAddr, up: &dyn Seen, label: &str) -> Vec<String> {
    let mut findings = Vec::new();
    for (i, (name, raw)) in cases().into_iter().enumerate() {
        let before = up.targets().len();
        let got = exchange(addr, &name, &raw);
        let answers = statuses(&got);
        // The marker: once the upstream logged it, everything before it has arrived.
        let marker = format!("/marker-{i}");
        let (status, body) = site_get(addr, &marker);
        if status != 200 || !body.contains(&marker) {
            findings.push(format!("{label} {name}: the marker got {status} {body:?}"));
        }
        let arrived = eventually(WAIT, || up.targets().iter().any(|t| t == &marker));
        assert!(
            arrived,
            "{label} {name}: the marker never reached the upstream"
        );
        let seen: Vec<String> = up.targets()[before..]
            .iter()
            .filter(|t| **t != marker)
            .cloned()
            .collect();
        let ok_answers = answers.iter().filter(|s| **s == 200).count();
        let what = format!("answers {answers:?}, upstream saw {seen:?}");
        if seen.iter().any(|t| t.contains("smuggled")) {
            findings.push(format!("{label} {name}: smuggled: {what}"));
        }
        if seen.len() != ok_answers {
            findings.push(format!(
                "{label} {name}: not one request per answer: {what}"
            ));
        }
        // The upstreams answer 200 only: anything else is veloxy's refusal, which must end
        // the connection.
        if let Some(p) = answers.iter().position(|s| *s != 200) {
            if p + 1 != answers.len() {
                findings.push(format!("{label} {name}: answered after a refusal: {what}"));
            }
        }
        if answers.is_empty() {
            findings.push(format!("{label} {name}: closed without an answer: {what}"));
        }
        eprintln!("{label} {name}: {what}");
    }
    findings
}

/// One GET on a fresh connection: status and body.
fn site_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let r = request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
    );
    (r.status, r.body_str())
}

#[test]
fn no_smuggling_to_the_test_origin() {
    let o = script_origin(|r| Scripted::ok(format!("{} {}\n", r.method, r.target)));
    let v = veloxy(&simple_config(&[o.addr], ""));
    let findings = run(v.addr, &o, "origin");
    assert!(findings.is_empty(), "{}", findings.join("\n"));
    // No framing field reached the origin under another spelling.
    for r in o.requests() {
        for (name, value) in &r.headers {
            let n = name.replace(['_', ' ', '\t'], "-");
            assert!(
                n != "transfer-encoding" || (name == "transfer-encoding" && value == "chunked"),
                "{} carried {name:?}: {value:?}",
                r.target
            );
        }
    }
}

#[test]
fn no_smuggling_to_nginx() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let Some(nginx) = Nginx::start(&format!(
        "  access_log {};\n  location / {{ return 200 \"$request_method $request_uri\\n\"; }}\n",
        log.display()
    )) else {
        return;
    };
    let v = veloxy(&simple_config(&[nginx.addr], ""));
    let findings = run(v.addr, &NginxLog(log), "nginx");
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}
