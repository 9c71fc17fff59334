//! L4 streams (issue 13, part): a `protocol = "tcp"` listener relays bytes both ways to its
//! `[[streams]]` group, moving past a dead backend.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use veloxy_testkit::*;

#[test]
fn tcp_streams_relay_bytes_and_skip_a_dead_backend() {
    let echo = tcp_echo("127.0.0.1");
    let up = upstream(&[]);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n\
         [listeners.db]\naddr = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         [listeners.http]\naddr = \"127.0.0.1:0\"\n\
         [[streams]]\nlistener = \"db\"\nupstream = \"echo\"\n\
         [[streams]]\nlistener = \"web\"\nupstream = \"app\"\n\
         [[routes]]\nrespond = {{ body = \"http\" }}\n\
         [upstreams.echo]\nservers = [\"127.0.0.1:9\", \"{echo}\"]\nretries = 1\npolicy = \"round_robin\"\n\
         [upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    ));
    let db = logged_addr(&v, "listening listener=db addr=");
    // Several connections: whichever backend round robin offers first, the dead one is
    // skipped; bytes come back intact both ways, larger than one read.
    for i in 0..4u8 {
        let mut c = TcpStream::connect(db).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|x| (x as u8) ^ i).collect();
        let writer = {
            let mut c = c.try_clone().unwrap();
            let data = data.clone();
            std::thread::spawn(move || c.write_all(&data).unwrap())
        };
        let mut got = vec![0u8; data.len()];
        c.read_exact(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got, data, "connection {i}");
    }
    // HTTP through a TCP listener is just bytes: the upstream answers it.
    let web = logged_addr(&v, "listening listener=web addr=");
    let r = get(web, "/echo");
    assert_eq!(r.status, 200);
    assert!(r.header("x-upstream").is_some());
    // The HTTP listener beside them still routes.
    let http = logged_addr(&v, "listening listener=http addr=");
    assert_eq!(get(http, "/").body_str(), "http");
}

#[test]
fn sni_passthrough_relays_matching_names_and_terminates_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (front_cert, front_key) = pki.leaf("front", &["localhost"], KeyKind::Ecdsa);
    let (git_cert, git_key) = pki.leaf("git", &["git.example.com"], KeyKind::Ecdsa);
    // The backend: a real TLS server holding git.example.com's certificate.
    let backend = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.tls]\naddr = \"127.0.0.1:0\"\n\
         [listeners.tls.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nrespond = {{ body = \"backend\" }}\n",
        git_cert.display(),
        git_key.display()
    ));
    let front = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[streams]]\nlistener = \"web\"\nsni = [\"git.example.com\", \"*.db.example.com\"]\nupstream = \"git\"\n\
         [[routes]]\nrespond = {{ body = \"front\" }}\n\
         [upstreams.git]\nservers = [\"{}\"]\n",
        front_cert.display(),
        front_key.display(),
        backend.addr
    ));
    let ask = |sni: &str| {
        let client = default_client(&pki.ca_pem, &[b"http/1.1"]);
        let (mut s, _) = tls_connect(front.addr, sni, client).unwrap();
        let (status, raw) = https1(&mut s, sni, "/");
        (status, raw_body(&raw).to_owned())
    };
    // The client verified git.example.com's certificate, which only the backend holds.
    assert_eq!(ask("git.example.com"), (200, "backend".to_owned()));
    // Other names are terminated by veloxy itself.
    assert_eq!(ask("localhost"), (200, "front".to_owned()));
}

#[test]
fn proxy_protocol_out_of_a_stream_and_into_a_listener() {
    // The back: an HTTP listener that takes PROXY headers from 127.0.0.1 and shows the client.
    let back = veloxy(
        "[server]\nworkers = 1\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nproxy_protocol = true\n\
         [[routes]]\nrespond = { body = \"ok\" }\n\
         response_headers = { add = { \"X-Client\" = \"{client_ip}\" } }\n",
    );
    for version in ["v1", "v2"] {
        // The front: a TCP relay sending a PROXY header of this version.
        let front = veloxy(&format!(
            "[server]\nworkers = 1\n\
             [listeners.l4]\naddr = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
             [[streams]]\nlistener = \"l4\"\nupstream = \"back\"\n\
             [upstreams.back]\nservers = [\"{}\"]\nproxy_protocol = \"{version}\"\n",
            back.addr
        ));
        let req = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let (status, raw) = request_from("127.0.0.3", front.addr, req.as_bytes());
        assert_eq!(status, 200, "{version}: {raw}");
        assert_eq!(raw_header(&raw, "x-client"), Some("127.0.0.3"), "{version}");
    }
}

#[test]
fn stream_connections_are_logged_with_bytes_each_way() {
    let echo = tcp_echo("127.0.0.1");
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("access.log");
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[server.access_log]\npath = \"{}\"\nformat = \"json\"\n\
         [listeners.db]\naddr = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         [[streams]]\nlistener = \"db\"\nupstream = \"echo\"\n\
         [upstreams.echo]\nservers = [\"{echo}\"]\n",
        log.display()
    ));
    let mut c = TcpStream::connect(v.addr).unwrap();
    c.write_all(&[7u8; 1000]).unwrap();
    let mut got = [0u8; 1000];
    c.read_exact(&mut got).unwrap();
    drop(c);
    let logged = eventually(std::time::Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|t| {
            t.contains("\"method\":\"TCP\"")
                && t.contains("\"protocol\":\"TCP\"")
                && t.contains("\"bytes_sent\":1000")
                && t.contains("\"bytes_received\":1000")
                && t.contains(&format!("\"backend\":\"{echo}\""))
        })
    });
    assert!(
        logged,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// A real ClientHello for `sni` (rustls), split into TLS records of at most `first` bytes of
/// handshake data for the first record and the rest in a second.
fn split_client_hello(pki: &Pki, sni: &str, first: usize) -> Vec<u8> {
    let config = default_client(&pki.ca_pem, &[b"http/1.1"]);
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut wire = Vec::new();
    conn.write_tls(&mut wire).unwrap();
    assert_eq!(wire[0], 22, "a handshake record");
    let len = usize::from(u16::from_be_bytes([wire[3], wire[4]]));
    let msg = &wire[5..5 + len];
    let (a, b) = msg.split_at(first);
    let mut out = Vec::new();
    for part in [a, b] {
        out.extend_from_slice(&[22, wire[1], wire[2]]);
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// A plain TCP server that records the first bytes of each connection it gets.
fn recorder() -> (std::net::SocketAddr, std::sync::mpsc::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
                    .unwrap();
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let _ = tx.send(got);
            });
        }
    });
    (addr, rx)
}

fn sni_front(pki: &Pki, backend: std::net::SocketAddr, header_timeout: &str) -> Veloxy {
    let (cert, key) = pki.leaf("front", &["localhost"], KeyKind::Ecdsa);
    veloxy(&format!(
        "[server]\nworkers = 1\nheader_timeout = \"{header_timeout}\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[streams]]\nlistener = \"web\"\nsni = [\"git.example.com\"]\nupstream = \"git\"\n\
         [[routes]]\nrespond = {{ body = \"front\" }}\n\
         [upstreams.git]\nservers = [\"{backend}\"]\n",
        cert.display(),
        key.display(),
    ))
}

/// Issue 31, item 12: a ClientHello split over two TLS records (and two segments) is
/// reassembled and relayed to the passthrough backend untouched; one that does not arrive
/// whole within the header timeout is closed, not answered with veloxy's own certificate.
#[test]
fn sni_passthrough_reassembles_split_hellos_and_closes_slow_ones() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (backend, seen) = recorder();
    let front = sni_front(&pki, backend, "1s");
    let hello = split_client_hello(&pki, "git.example.com", 40);
    let mut c = TcpStream::connect(front.addr).unwrap();
    c.set_nodelay(true).unwrap();
    c.write_all(&hello[..30]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    c.write_all(&hello[30..]).unwrap();
    let relayed = seen
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("relayed to the backend");
    assert_eq!(relayed, hello, "the backend got the ClientHello as sent");
    drop(c);

    // Half a ClientHello, then nothing past the header timeout: closed with no answer.
    let mut c = TcpStream::connect(front.addr).unwrap();
    c.write_all(&hello[..hello.len() / 2]).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = c.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without a handshake answer: {:?}", &buf[..n]);
    assert!(
        seen.try_recv().is_err(),
        "nothing relayed for an incomplete ClientHello"
    );
}

/// A `protocol = "tcp"` listener routes by SNI without a certificate of its own (nginx's
/// `stream { ssl_preread on; }`): named groups by the ClientHello, the entry without `sni`
/// for other names; without such an entry, other names are closed.
#[test]
fn tcp_listener_routes_by_sni_without_terminating() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (git, git_seen) = recorder();
    let (other, other_seen) = recorder();
    let config = |default: &str| {
        format!(
            "[server]\nworkers = 1\n\
             [listeners.edge]\naddr = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
             [[streams]]\nlistener = \"edge\"\nsni = [\"git.example.com\"]\nupstream = \"git\"\n\
             {default}\
             [upstreams.git]\nservers = [\"{git}\"]\n\
             [upstreams.other]\nservers = [\"{other}\"]\n"
        )
    };
    let front = veloxy(&config(
        "[[streams]]\nlistener = \"edge\"\nupstream = \"other\"\n",
    ));
    let send = |addr, sni: &str| {
        let hello = split_client_hello(&pki, sni, 40);
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(&hello).unwrap();
        hello
    };
    let wait = |rx: &std::sync::mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(std::time::Duration::from_secs(10)).ok()
    };
    let hello = send(front.addr, "git.example.com");
    assert_eq!(
        wait(&git_seen).as_deref(),
        Some(&hello[..]),
        "named: its group, untouched"
    );
    let hello = send(front.addr, "www.example.org");
    assert_eq!(
        wait(&other_seen).as_deref(),
        Some(&hello[..]),
        "other names: the default"
    );
    drop(front);
    // No default entry: other names are closed; the named one still passes.
    let front = veloxy(&config(""));
    let mut c = TcpStream::connect(front.addr).unwrap();
    c.write_all(&split_client_hello(&pki, "www.example.org", 40))
        .unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "closed");
    let hello = send(front.addr, "git.example.com");
    assert_eq!(wait(&git_seen).as_deref(), Some(&hello[..]));
    assert!(other_seen.try_recv().is_err());
}

/// CPU time (user + system) of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Issue 31, item 8: connections holding a partial ClientHello (SNI listener) or a partial
/// PROXY header wait for their next bytes by readiness: 400 of each cost next to no CPU (a
/// 5 ms poll each used most of a core for 2,000).
#[test]
fn partial_hellos_and_proxy_headers_are_not_busy_polled() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (backend, _seen) = recorder();
    let front = sni_front(&pki, backend, "30s");
    let proxied = veloxy(
        "[server]\nworkers = 1\nheader_timeout = \"30s\"\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nproxy_protocol = true\n\
         [[routes]]\nrespond = { body = \"ok\" }\n",
    );
    let hello = split_client_hello(&pki, "git.example.com", 40);
    let mut held = Vec::new();
    for _ in 0..400 {
        let mut c = TcpStream::connect(front.addr).unwrap();
        c.write_all(&hello[..20]).unwrap();
        held.push(c);
        let mut c = TcpStream::connect(proxied.addr).unwrap();
        c.write_all(b"PROXY TCP4 192.0.2.7 ").unwrap();
        held.push(c);
    }
    // A moment for both to read what they were sent, then a second of waiting is measured.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = (cpu_ticks(front.proc.pid()), cpu_ticks(proxied.proc.pid()));
    std::thread::sleep(std::time::Duration::from_secs(1));
    let after = (cpu_ticks(front.proc.pid()), cpu_ticks(proxied.proc.pid()));
    let ticks = (after.0 - before.0, after.1 - before.1);
    // 100 ticks a second: at most 5% of a core each.
    eprintln!("CPU ticks in 1 s while waiting: {ticks:?}");
    assert!(
        ticks.0 <= 5 && ticks.1 <= 5,
        "CPU ticks in 1 s while waiting: {ticks:?}"
    );
    drop(held);
}
