//! SNI passthrough: on a TLS listener with `[[streams]] sni = [...]` entries, the ClientHello
//! is read with `MSG_PEEK` to find the server name; a matching connection is relayed to its
//! group untouched (the backend terminates TLS, its certificate is what the client sees),
//! the others are terminated here as usual. Peeking leaves the ClientHello in the socket, so
//! nothing needs replaying.
//!
//! The ClientHello is parsed by hand (rustls only parses what it consumes): record header,
//! handshake header, and the extensions up to `server_name`; anything malformed is simply
//! "no name", and the connection is terminated by veloxy.

use std::time::Duration;

use tokio::net::TcpStream;

/// The largest ClientHello looked at (a record is at most 16 KiB).
const MAX_HELLO: usize = 16 * 1024 + 5;

/// The server name the client asks for, read without consuming anything; `None` when there
/// is none (or no ClientHello within `limit`).
pub(crate) async fn peek_server_name(stream: &TcpStream, limit: Duration) -> Option<String> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = vec![0u8; MAX_HELLO];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .ok()?
            .ok()?;
        match parse(&buf[..n]) {
            Parse::Name(name) => return Some(name),
            Parse::NoName => return None,
            Parse::Partial if n < MAX_HELLO => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if tokio::time::Instant::now() >= deadline {
                    return None;
                }
            }
            Parse::Partial => return None,
        }
    }
}

enum Parse {
    Name(String),
    NoName,
    Partial,
}

fn parse(b: &[u8]) -> Parse {
    // Record: type 22 (handshake), version, length.
    if b.len() < 5 {
        return Parse::Partial;
    }
    if b[0] != 22 {
        return Parse::NoName;
    }
    let len = usize::from(u16::from_be_bytes([b[3], b[4]]));
    if b.len() < 5 + len {
        return Parse::Partial;
    }
    server_name(&b[5..5 + len]).map_or(Parse::NoName, Parse::Name)
}

/// The host name in a ClientHello handshake message.
fn server_name(h: &[u8]) -> Option<String> {
    let mut r = Reader(h);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    r.skip(3)?; // handshake length
    r.skip(2 + 32)?; // version, random
    let sid = usize::from(r.u8()?);
    r.skip(sid)?;
    let suites = usize::from(r.u16()?);
    r.skip(suites)?;
    let comp = usize::from(r.u8()?);
    r.skip(comp)?;
    let ext_len = usize::from(r.u16()?);
    let mut ext = Reader(r.take(ext_len)?);
    while !ext.0.is_empty() {
        let (kind, len) = (ext.u16()?, usize::from(ext.u16()?));
        let body = ext.take(len)?;
        if kind != 0 {
            continue;
        }
        let mut names = Reader(body);
        let list = usize::from(names.u16()?);
        let mut list = Reader(names.take(list)?);
        while !list.0.is_empty() {
            let (t, n) = (list.u8()?, usize::from(list.u16()?));
            let name = list.take(n)?;
            if t == 0 {
                return std::str::from_utf8(name)
                    .ok()
                    .map(|s| s.to_ascii_lowercase());
            }
        }
    }
    None
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}
