//! [`Site`]: a veloxy with a TLS listener `web` (HTTP/2 and HTTP/1.1 by ALPN) and a plain
//! listener `plain`, for tests that check one behaviour over HTTP/1.1 and over HTTP/2 with TLS;
//! and [`Nginx`], a real nginx on a loopback port as an upstream.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;

use crate::{
    default_client, h2_connect, h2_send, logged_addr, runtime, tls_connect, veloxy, H2Reply,
    KeyKind, Pki, Proc, Veloxy,
};

/// A running veloxy with listeners `web` (TLS) and `plain`.
pub struct Site {
    pub v: Veloxy,
    pub pki: Pki,
    _certs: tempfile::TempDir,
}

impl Site {
    /// `server`: extra `[server]` keys; `plain_keys`: extra keys of the plain listener;
    /// `rest`: routes and upstream groups.
    pub fn start(server: &str, plain_keys: &str, rest: &str) -> Site {
        Site::start_with(server, "", plain_keys, rest)
    }

    /// [`Site::start`] with extra keys of the TLS listener `web` (`"http3 = true\n"` for
    /// [`Site::h3`]).
    pub fn start_with(server: &str, web_keys: &str, plain_keys: &str, rest: &str) -> Site {
        let certs = tempfile::tempdir().unwrap();
        let pki = Pki::new(certs.path());
        let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
        let p = |p: &Path| p.display().to_string();
        let config = format!(
            "[server]\nworkers = 1\n{server}\n\
             [listeners.web]\naddr = \"127.0.0.1:0\"\n{web_keys}\n\
             [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
             [listeners.plain]\naddr = \"127.0.0.1:0\"\n{plain_keys}\n{rest}\n",
            p(&cert),
            p(&key)
        );
        Site {
            v: veloxy(&config),
            pki,
            _certs: certs,
        }
    }

    /// The address of listener `name`.
    pub fn addr(&self, listener: &str) -> SocketAddr {
        logged_addr(&self.v, &format!("listening listener={listener} addr="))
    }

    /// Sends `raw` (a whole HTTP/1.1 request; add `Connection: close`) over TLS with ALPN
    /// http/1.1 and reads to the end: (status, raw response).
    pub fn h1_raw(&self, raw: &str) -> (u16, String) {
        let client = default_client(&self.pki.ca_pem, &[b"http/1.1"]);
        let (mut s, _) = tls_connect(self.addr("web"), "localhost", client).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        crate::read_to_close(&mut s)
    }

    /// GET `path` over HTTPS + HTTP/1.1 with `headers` ("Name: value\r\n" lines).
    pub fn h1(&self, path: &str, headers: &str) -> (u16, String) {
        self.h1_raw(&format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n"
        ))
    }

    /// Sends `req` (build it with [`crate::h2_get`] and add headers) over HTTPS + HTTP/2.
    pub fn h2_req(&self, req: http::Request<()>, body: Option<Bytes>) -> H2Reply {
        let addr = self.addr("web");
        let config = default_client(&self.pki.ca_pem, &[b"h2"]);
        runtime().block_on(async {
            let mut c = h2_connect(addr, Some((config, "localhost"))).await;
            h2_send(&mut c, req, body).await.unwrap()
        })
    }

    /// GET `path` over HTTP/3 with `headers` (the site must have started with `http3 = true`
    /// on `web`); `Err` when the request fails at the transport.
    pub fn h3(&self, path: &str, headers: &[(&str, &str)]) -> Result<H2Reply, String> {
        let mut req = crate::h3_get("localhost", path);
        for (n, v) in headers {
            req.headers_mut().append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        self.h3_req(req)
    }

    /// Sends `req` (build it with [`crate::h3_get`]) over HTTP/3.
    pub fn h3_req(&self, req: http::Request<()>) -> Result<H2Reply, String> {
        let addr = self.addr("web");
        let ca = self.pki.ca_pem.clone();
        runtime().block_on(async {
            let mut c = crate::h3_connect(addr, "localhost", &ca).await?;
            crate::h3_send(&mut c, req, None).await
        })
    }

    /// GET `path` over HTTPS + HTTP/2 with `headers`.
    pub fn h2(&self, path: &str, headers: &[(&str, &str)]) -> H2Reply {
        let mut req = crate::h2_get("localhost", path, true);
        for (n, v) in headers {
            req.headers_mut().append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        self.h2_req(req, None)
    }
}

/// Sends `raw` over plain TCP from the source address `src` (another loopback address, such
/// as 127.0.0.2) to `to`, and reads to the end: (status, raw response; 0 without one).
pub fn request_from(src: &str, to: SocketAddr, raw: &[u8]) -> (u16, String) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let bind: SocketAddr = format!("{src}:0").parse().unwrap();
    s.bind(&bind.into()).unwrap();
    s.connect(&to.into()).unwrap();
    let mut s: std::net::TcpStream = s.into();
    s.write_all(raw).unwrap();
    crate::read_to_close(&mut s)
}

/// The value of header `name` in a raw HTTP/1 response.
pub fn raw_header<'a>(raw: &'a str, name: &str) -> Option<&'a str> {
    raw.split("\r\n\r\n").next()?.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The body of a raw HTTP/1 response.
pub fn raw_body(raw: &str) -> &str {
    raw.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// A real nginx on 127.0.0.1, running `server_body` inside its one `server { }` block.
pub struct Nginx {
    _proc: Proc,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts nginx, or `None` (after reporting the test as skipped) when it is not
    /// installed. `.ci/run` installs it.
    pub fn start(server_body: &str) -> Option<Nginx> {
        let bin = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists());
        let Some(bin) = bin else {
            crate::skip("nginx is not installed");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        // nginx cannot report a port it chose: take a free one and hand it over.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.path().display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log stderr warn;\nevents {{ worker_connections 256; }}\n\
             http {{\n access_log off;\n client_body_temp_path {d};\n proxy_temp_path {d};\n\
             fastcgi_temp_path {d};\n uwsgi_temp_path {d};\n scgi_temp_path {d};\n\
             server {{\n  listen 127.0.0.1:{port};\n{server_body}\n }}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(bin)
            .args(["-p", &d.to_string(), "-c", path.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn nginx");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let up = crate::eventually(Duration::from_secs(10), || crate::listening(addr));
        assert!(up, "nginx did not start listening on {addr}");
        Some(Nginx {
            _proc: Proc {
                child,
                log: Default::default(),
            },
            addr,
            _dir: dir,
        })
    }
}
