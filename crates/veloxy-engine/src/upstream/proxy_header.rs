//! The PROXY protocol header veloxy sends first on a new upstream connection
//! (`[upstreams.NAME] proxy_protocol = "v1" | "v2"`), so the backend learns the client's
//! address. Reading one on a listener is [`crate::listener::proxy_protocol`].

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The v2 signature.
pub(crate) const V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// Who a PROXY header names: the client, and the address it connected to. An upstream
/// connection opened with one carries it for life, so it is reused only for the same
/// downstream connection (see [`crate::upstream::pool::Pool::take`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    pub client: SocketAddr,
    pub local: SocketAddr,
}

/// The PROXY header (version 1 or 2) telling a backend that `client` connected to `local`.
pub(crate) fn header(version: u8, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let (client, local) = match (client.ip().to_canonical(), local.ip().to_canonical()) {
        (c @ IpAddr::V4(_), l @ IpAddr::V4(_)) | (c @ IpAddr::V6(_), l @ IpAddr::V6(_)) => (
            SocketAddr::new(c, client.port()),
            SocketAddr::new(l, local.port()),
        ),
        // Mixed families: both as IPv6.
        (c, l) => (
            SocketAddr::new(IpAddr::V6(to_v6(c)), client.port()),
            SocketAddr::new(IpAddr::V6(to_v6(l)), local.port()),
        ),
    };
    if version == 1 {
        let family = if client.is_ipv4() { "TCP4" } else { "TCP6" };
        return format!(
            "PROXY {family} {} {} {} {}\r\n",
            client.ip(),
            local.ip(),
            client.port(),
            local.port()
        )
        .into_bytes();
    }
    let mut h = V2_SIG.to_vec();
    match (client.ip(), local.ip()) {
        (IpAddr::V4(c), IpAddr::V4(l)) => {
            h.extend_from_slice(&[0x21, 0x11, 0, 12]);
            h.extend_from_slice(&c.octets());
            h.extend_from_slice(&l.octets());
        }
        (c, l) => {
            h.extend_from_slice(&[0x21, 0x21, 0, 36]);
            h.extend_from_slice(&to_v6(c).octets());
            h.extend_from_slice(&to_v6(l).octets());
        }
    }
    h.extend_from_slice(&client.port().to_be_bytes());
    h.extend_from_slice(&local.port().to_be_bytes());
    h
}

fn to_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
