//! A raw HTTP/1.1 client for exact control of the bytes on the wire.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Raw head bytes.
    pub head: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A raw client connection.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Like [`Client::connect`], but reports a refused or failed connect instead of panicking.
    pub fn try_connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: Vec::new(),
        })
    }

    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.stream.write_all(raw).expect("write request");
    }

    fn fill(&mut self) -> usize {
        let mut tmp = [0u8; 65536];
        match self.stream.read(&mut tmp) {
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                n
            }
            Err(_) => 0,
        }
    }

    /// Reads one response; `head_request` for responses to HEAD. Panics on EOF mid-message.
    pub fn read_response(&mut self, head_request: bool) -> Response {
        self.try_read_response(head_request)
            .expect("connection closed before a response")
    }

    /// `None` if the connection closed before a full head arrived.
    pub fn try_read_response(&mut self, head_request: bool) -> Option<Response> {
        let (status, headers, head_len) = loop {
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut hs);
            if let httparse::Status::Complete(n) = r.parse(&self.buf).expect("valid response head")
            {
                let headers: Vec<(String, String)> = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                break (r.code.unwrap(), headers, n);
            }
            if self.fill() == 0 {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_len]).into_owned();
        self.buf.drain(..head_len);
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let mut resp = Response {
            status,
            headers: headers.clone(),
            body: Vec::new(),
            head,
        };
        if (100..200).contains(&status) {
            return Some(resp);
        }
        if head_request || status == 204 || status == 304 {
            return Some(resp);
        }
        if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            resp.body = self.read_chunked();
        } else if let Some(len) = get("content-length") {
            let len: usize = len.trim().parse().unwrap();
            while self.buf.len() < len {
                assert!(self.fill() > 0, "EOF inside body");
            }
            resp.body = self.buf.drain(..len).collect();
        } else {
            while self.fill() > 0 {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Some(resp)
    }

    fn read_chunked(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(self.fill() > 0, "EOF in chunk size");
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap();
            self.buf.drain(..line_end + 2);
            if size == 0 {
                // Trailers until the empty line.
                loop {
                    let e = loop {
                        if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                            break i;
                        }
                        assert!(self.fill() > 0, "EOF in trailers");
                    };
                    self.buf.drain(..e + 2);
                    if e == 0 {
                        return body;
                    }
                }
            }
            while self.buf.len() < size + 2 {
                assert!(self.fill() > 0, "EOF in chunk");
            }
            body.extend_from_slice(&self.buf[..size]);
            assert_eq!(&self.buf[size..size + 2], b"\r\n");
            self.buf.drain(..size + 2);
        }
    }

    /// True when the server closed the connection (EOF) within the timeout.
    pub fn is_closed(&mut self) -> bool {
        self.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        if !self.buf.is_empty() {
            return false;
        }
        let mut tmp = [0u8; 1024];
        matches!(self.stream.read(&mut tmp), Ok(0) | Err(_))
    }
}

/// One request on a fresh connection.
pub fn request(addr: SocketAddr, raw: &str) -> Response {
    let mut c = Client::connect(addr);
    c.send(raw.as_bytes());
    c.read_response(raw.starts_with("HEAD "))
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: test.local\r\nConnection: close\r\n\r\n"),
    )
}
