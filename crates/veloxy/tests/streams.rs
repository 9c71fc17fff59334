//! L4 streams (issue 13, part): a `protocol = "tcp"` listener relays bytes both ways to its
//! `[[streams]]` group, moving past a dead backend.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use veloxy_testkit::*;

/// A TCP echo server on its own thread.
fn echo_server() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn tcp_streams_relay_bytes_and_skip_a_dead_backend() {
    let echo = echo_server();
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
    let echo = echo_server();
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
