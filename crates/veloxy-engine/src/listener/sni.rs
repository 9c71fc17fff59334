//! SNI passthrough: on a TLS listener with `[[streams]] sni = [...]` entries, the ClientHello
//! is read with `MSG_PEEK` to find the server name; a matching connection is relayed to its
//! group untouched (the backend terminates TLS, its certificate is what the client sees),
//! the others are terminated here as usual. Peeking leaves the ClientHello in the socket, so
//! nothing needs replaying.
//!
//! The ClientHello is parsed by hand (rustls only parses what it consumes): records are
//! reassembled up to the handshake message's length (a ClientHello may be split over several
//! records), then the extensions up to `server_name`; anything malformed is simply "no name",
//! and the connection is terminated by veloxy. One that does not arrive whole within the
//! header timeout is closed: neither relayed nor answered with veloxy's certificate.

use std::time::Duration;

use tokio::net::TcpStream;

use super::peek::{peek_more, PeekError};

/// The largest ClientHello looked at (handshake message, across as many records as it
/// takes; real ones are 0.5 to 2 KiB, post-quantum key shares included).
const MAX_HELLO: usize = 32 * 1024;
/// The first look's buffer; it grows to what the records declare, up to [`MAX_HELLO`].
const FIRST_LOOK: usize = 2 * 1024;

/// What the first bytes of a TLS connection say.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// A ClientHello naming this server.
    Name(String),
    /// Something veloxy terminates itself: a ClientHello without a name, or not one at all.
    NoName,
    /// No whole ClientHello within the header timeout, or the client left: close, neither
    /// relay nor terminate (veloxy's own certificate would be the wrong answer).
    Close,
}

/// The server name the client asks for, read without consuming anything. The ClientHello
/// may span several TLS records and several segments; each wait is for new bytes (see
/// [`super::peek`]), all of them within `limit`.
pub(crate) async fn peek_server_name(stream: &TcpStream, limit: Duration) -> Hello {
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = vec![0u8; FIRST_LOOK];
    let mut seen = 0;
    loop {
        let n = match peek_more(stream, &mut buf, seen, deadline).await {
            Ok(n) => n,
            Err(PeekError::TimedOut | PeekError::Closed) => return Hello::Close,
        };
        seen = n;
        match parse(&buf[..n]) {
            Parse::Name(name) => return Hello::Name(name),
            Parse::NoName => return Hello::NoName,
            Parse::Partial(need) if need > MAX_HELLO + 5 * 64 => return Hello::NoName,
            Parse::Partial(need) => {
                if need > buf.len() {
                    buf.resize(need, 0);
                }
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Parse {
    Name(String),
    NoName,
    /// More bytes are needed: at least this many in all.
    Partial(usize),
}

/// Reassembles the handshake message from the records in `b` and reads its server name.
fn parse(b: &[u8]) -> Parse {
    let mut hello = Vec::new();
    let mut at = 0;
    loop {
        // Record: type 22 (handshake), version, length.
        if b.len() < at + 5 {
            return Parse::Partial(at + 5);
        }
        if b[at] != 22 {
            return Parse::NoName;
        }
        let len = usize::from(u16::from_be_bytes([b[at + 3], b[at + 4]]));
        if len == 0 {
            return Parse::NoName;
        }
        if b.len() < at + 5 + len {
            return Parse::Partial(at + 5 + len);
        }
        hello.extend_from_slice(&b[at + 5..at + 5 + len]);
        at += 5 + len;
        if hello.len() >= 4 {
            let need = 4
                + (usize::from(hello[1]) << 16
                    | usize::from(hello[2]) << 8
                    | usize::from(hello[3]));
            if need > MAX_HELLO {
                return Parse::NoName;
            }
            if hello.len() >= need {
                return server_name(&hello[..need]).map_or(Parse::NoName, Parse::Name);
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello naming `name`, as one handshake message.
    fn hello(name: &str) -> Vec<u8> {
        let mut sni = Vec::new();
        sni.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name.as_bytes());
        let mut ext = vec![0, 0];
        ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        ext.extend_from_slice(&sni);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut msg = vec![1];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        msg
    }

    fn records(msg: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = msg;
        for &n in sizes.iter().chain(std::iter::repeat(&usize::MAX)) {
            if rest.is_empty() {
                break;
            }
            let (a, b) = rest.split_at(n.min(rest.len()));
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(a.len() as u16).to_be_bytes());
            out.extend_from_slice(a);
            rest = b;
        }
        out
    }

    #[test]
    fn a_client_hello_split_over_records_is_reassembled() {
        let msg = hello("app.example.com");
        let one = records(&msg, &[]);
        assert_eq!(parse(&one), Parse::Name("app.example.com".into()));
        let split = records(&msg, &[10, 7]);
        assert_eq!(parse(&split), Parse::Name("app.example.com".into()));
        // Any prefix is partial, never "no name".
        for cut in 0..split.len() {
            assert!(
                matches!(parse(&split[..cut]), Parse::Partial(n) if n > cut),
                "{cut}"
            );
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Parse::NoName);
    }
}
