//! PROXY protocol v1 and v2 on a listener (`proxy_protocol = true`): the client's address as
//! an L4 balancer in front of veloxy saw it, sent before anything else (before TLS too).
//!
//! Only peers in `[server] trusted_proxies` may send one; a connection from any other peer,
//! or with a missing or malformed header, is closed. The header is read with `MSG_PEEK` first
//! and then consumed to its exact length, so what follows it (a TLS ClientHello, a request)
//! stays in the socket for the codec.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::upstream::proxy_header::V2_SIG;
/// The longest header read: v1 is at most 107 bytes; v2 with IPv6 addresses is 52, and TLVs
/// past what is needed here are consumed but not kept.
const MAX_HEADER: usize = 536;

/// What a complete header says.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// The header's length and the client's address (`None`: LOCAL / UNKNOWN, keep the peer's).
    Done(usize, Option<SocketAddr>),
    /// More bytes are needed.
    Partial,
    /// Not a PROXY header.
    Bad,
}

/// Reads the header from a trusted `peer` within `limit`; returns the client's address, or
/// `None` when the connection must close.
pub(crate) async fn accept(
    stream: &mut TcpStream,
    peer: SocketAddr,
    trusted: Option<&crate::access::RealIp>,
    limit: Duration,
) -> Option<SocketAddr> {
    if !trusted.is_some_and(|t| t.trusted.contains(peer.ip())) {
        tracing::debug!(client = %peer, "PROXY protocol listener: untrusted peer; closed");
        return None;
    }
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; MAX_HEADER];
    let mut seen = 0;
    loop {
        // A header split across segments: each wait is for new bytes, by readiness.
        let n = super::peek::peek_more(stream, &mut buf, seen, deadline)
            .await
            .ok()?;
        seen = n;
        match parse(&buf[..n]) {
            Parsed::Done(len, addr) => {
                stream.read_exact(&mut buf[..len]).await.ok()?;
                return Some(addr.unwrap_or(peer));
            }
            Parsed::Bad => {
                tracing::debug!(client = %peer, "malformed PROXY protocol header; closed");
                return None;
            }
            Parsed::Partial if n < MAX_HEADER => {}
            Parsed::Partial => return None,
        }
    }
}

fn parse(b: &[u8]) -> Parsed {
    if b.len() >= 12 && &b[..12] == V2_SIG {
        return parse_v2(b);
    }
    if V2_SIG.starts_with(b) && !b.is_empty() && b[0] == b'\r' {
        return Parsed::Partial;
    }
    parse_v1(b)
}

/// `PROXY TCP4 1.2.3.4 5.6.7.8 1111 2222\r\n` (or TCP6, or UNKNOWN).
fn parse_v1(b: &[u8]) -> Parsed {
    let prefix = b"PROXY ";
    let n = b.len().min(prefix.len());
    if b[..n] != prefix[..n] {
        return Parsed::Bad;
    }
    let Some(end) = memchr::memmem::find(&b[..b.len().min(107)], b"\r\n") else {
        return if b.len() >= 107 {
            Parsed::Bad
        } else {
            Parsed::Partial
        };
    };
    let Ok(line) = std::str::from_utf8(&b[prefix.len()..end]) else {
        return Parsed::Bad;
    };
    let parts: Vec<&str> = line.split(' ').collect();
    match parts.as_slice() {
        ["UNKNOWN", ..] => Parsed::Done(end + 2, None),
        [proto @ ("TCP4" | "TCP6"), src, _dst, sport, _dport] => {
            let (Ok(ip), Ok(port)) = (src.parse::<IpAddr>(), sport.parse::<u16>()) else {
                return Parsed::Bad;
            };
            if (*proto == "TCP4") != ip.is_ipv4() {
                return Parsed::Bad;
            }
            Parsed::Done(end + 2, Some(SocketAddr::new(ip, port)))
        }
        _ => Parsed::Bad,
    }
}

/// The binary header: signature, version and command, family, length, addresses.
fn parse_v2(b: &[u8]) -> Parsed {
    if b.len() < 16 {
        return Parsed::Partial;
    }
    let (ver_cmd, family) = (b[12], b[13]);
    let len = 16 + usize::from(u16::from_be_bytes([b[14], b[15]]));
    if ver_cmd >> 4 != 2 || len > MAX_HEADER {
        return Parsed::Bad;
    }
    if b.len() < len {
        return Parsed::Partial;
    }
    let a = &b[16..len];
    match (ver_cmd & 0x0f, family) {
        (0, _) => Parsed::Done(len, None), // LOCAL: the proxy's own connection
        (1, 0x11) if a.len() >= 12 => {
            let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            let port = u16::from_be_bytes([a[8], a[9]]);
            Parsed::Done(len, Some(SocketAddr::new(ip.into(), port)))
        }
        (1, 0x21) if a.len() >= 36 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&a[..16]);
            let port = u16::from_be_bytes([a[32], a[33]]);
            Parsed::Done(len, Some(SocketAddr::new(Ipv6Addr::from(o).into(), port)))
        }
        (1, _) => Parsed::Done(len, None), // UNSPEC or a unix socket: keep the peer
        _ => Parsed::Bad,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1() {
        let h = b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 443\r\nGET /";
        assert_eq!(
            parse(h),
            Parsed::Done(41, Some("192.0.2.7:56324".parse().unwrap()))
        );
        assert_eq!(
            parse(b"PROXY TCP6 2001:db8::1 ::1 1 2\r\n"),
            Parsed::Done(32, Some("[2001:db8::1]:1".parse().unwrap()))
        );
        assert_eq!(parse(b"PROXY UNKNOWN\r\n"), Parsed::Done(15, None));
        assert_eq!(parse(b"PROXY TCP4 1.2.3.4"), Parsed::Partial);
        assert_eq!(parse(b"PROXY TCP4 ::1 ::1 1 2\r\n"), Parsed::Bad);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Parsed::Bad);
    }

    #[test]
    fn headers_parse_back() {
        let c: SocketAddr = "192.0.2.7:56324".parse().unwrap();
        let l: SocketAddr = "10.0.0.1:443".parse().unwrap();
        for v in [1, 2] {
            let h = crate::upstream::proxy_header::header(v, c, l);
            assert_eq!(parse(&h), Parsed::Done(h.len(), Some(c)), "v{v}");
        }
    }

    #[test]
    fn v2() {
        let mut h = V2_SIG.to_vec();
        h.extend_from_slice(&[
            0x21, 0x11, 0, 12, 192, 0, 2, 7, 10, 0, 0, 1, 0xdc, 0x04, 1, 187,
        ]);
        h.extend_from_slice(b"\x16\x03\x01");
        assert_eq!(
            parse(&h),
            Parsed::Done(28, Some("192.0.2.7:56324".parse().unwrap()))
        );
        assert_eq!(parse(&h[..20]), Parsed::Partial);
        assert_eq!(parse(&h[..5]), Parsed::Partial);
        let mut local = V2_SIG.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(parse(&local), Parsed::Done(16, None));
        let mut bad = V2_SIG.to_vec();
        bad.extend_from_slice(&[0x31, 0x11, 0, 0]);
        assert_eq!(parse(&bad), Parsed::Bad);
    }
}
