//! One keep-alive connection: at most one request in flight (no pipelining, as wrk and oha),
//! its response read and framed by Content-Length or chunked encoding.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What a readable connection produced.
pub enum Event {
    /// Not a whole response yet.
    Nothing,
    /// The in-flight request's response is complete; the connection is idle again.
    Done {
        due: Instant,
        sent: Instant,
        status: u16,
    },
    /// Closed, reset, or an answer pacer cannot frame: the connection must be reopened.
    Failed,
}

struct Flight {
    due: Instant,
    sent: Instant,
}

pub struct Conn {
    sock: Option<TcpStream>,
    buf: Vec<u8>,
    filled: usize,
    flight: Option<Flight>,
    /// The request's bytes a short write left behind (rare: requests are tiny).
    unsent: Vec<u8>,
}

impl Conn {
    pub fn new(sock: Option<TcpStream>) -> Self {
        Self {
            sock,
            buf: vec![0; 16 * 1024],
            filled: 0,
            flight: None,
            unsent: Vec::new(),
        }
    }

    pub fn close(&mut self) {
        self.sock = None;
        self.flight = None;
    }

    /// Open and with no request in flight.
    pub fn ready(&self) -> bool {
        self.sock.is_some() && self.flight.is_none()
    }

    pub fn in_flight(&self) -> Option<Instant> {
        self.flight.as_ref().map(|f| f.due)
    }

    pub fn overdue(&self, now: Instant, timeout: Duration) -> bool {
        self.sock.is_some()
            && self
                .flight
                .as_ref()
                .is_some_and(|f| now - f.sent >= timeout)
    }

    pub fn send(&mut self, request: &[u8], due: Instant, now: Instant) -> io::Result<()> {
        let sock = self.sock.as_mut().ok_or(io::ErrorKind::NotConnected)?;
        self.flight = Some(Flight { due, sent: now });
        match sock.write(request) {
            Ok(n) if n == request.len() => Ok(()),
            Ok(n) => {
                self.unsent.extend_from_slice(&request[n..]);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.unsent.extend_from_slice(request);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Writes what a short write left (on EPOLLOUT).
    pub fn flush(&mut self) -> io::Result<()> {
        let Some(sock) = self.sock.as_mut() else {
            return Ok(());
        };
        while !self.unsent.is_empty() {
            match sock.write(&self.unsent) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => drop(self.unsent.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads what arrived (edge-triggered: until EAGAIN, or until the one expected response
    /// is whole) and frames it.
    pub fn on_readable(&mut self) -> Event {
        let Some(sock) = self.sock.as_mut() else {
            return Event::Nothing;
        };
        loop {
            if self.filled == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            match sock.read(&mut self.buf[self.filled..]) {
                Ok(0) => return Event::Failed,
                Ok(n) => {
                    self.filled += n;
                    match frame(&self.buf[..self.filled]) {
                        Framed::Partial => continue,
                        Framed::Bad => return Event::Failed,
                        Framed::Whole { len, status } => {
                            // No pipelining: bytes past the response, or a response nobody
                            // asked for, mean the peers disagree on framing.
                            let Some(f) = self.flight.take() else {
                                return Event::Failed;
                            };
                            if len != self.filled {
                                return Event::Failed;
                            }
                            self.filled = 0;
                            return Event::Done {
                                due: f.due,
                                sent: f.sent,
                                status,
                            };
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Event::Nothing,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Event::Failed,
            }
        }
    }
}

enum Framed {
    Partial,
    Bad,
    Whole { len: usize, status: u16 },
}

fn frame(data: &[u8]) -> Framed {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(data) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Framed::Partial,
        Err(_) => return Framed::Bad,
    };
    let status = resp.code.unwrap_or(0);
    let mut length = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        }
    }
    let body = if status == 204 || status == 304 || (100..200).contains(&status) {
        Some(0)
    } else if chunked {
        match chunked_len(&data[head..]) {
            Ok(Some(n)) => Some(n),
            Ok(None) => return Framed::Partial,
            Err(()) => return Framed::Bad,
        }
    } else {
        length
    };
    match body {
        // Neither framing: the body runs to the close, which a keep-alive generator refuses.
        None => Framed::Bad,
        Some(n) if data.len() < head + n => Framed::Partial,
        Some(n) => Framed::Whole {
            len: head + n,
            status,
        },
    }
}

/// The length of a whole chunked body at the start of `b` (trailers allowed), `Ok(None)`
/// while it is incomplete.
fn chunked_len(b: &[u8]) -> Result<Option<usize>, ()> {
    let mut at = 0;
    loop {
        let Some(eol) = find_crlf(&b[at..]) else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&b[at..at + eol]).map_err(|_| ())?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| ())?;
        at += eol + 2;
        if size == 0 {
            // Trailer lines, then an empty line.
            loop {
                let Some(eol) = find_crlf(&b[at..]) else {
                    return Ok(None);
                };
                at += eol + 2;
                if eol == 0 {
                    return Ok(Some(at));
                }
            }
        }
        if b.len() < at + size + 2 {
            return Ok(None);
        }
        at += size + 2;
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_by_length_and_by_chunks() {
        let cl = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc";
        assert!(matches!(
            frame(cl),
            Framed::Whole {
                len: 41,
                status: 200
            }
        ));
        assert!(matches!(frame(&cl[..40]), Framed::Partial));
        let ch =
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert!(matches!(frame(ch), Framed::Whole { status: 404, .. }));
        assert!(matches!(frame(&ch[..ch.len() - 1]), Framed::Partial));
        assert!(matches!(frame(b"HTTP/1.1 200 OK\r\n\r\n"), Framed::Bad));
    }
}
