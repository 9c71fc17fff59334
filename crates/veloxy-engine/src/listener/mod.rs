//! Listener sockets: one SO_REUSEPORT socket per listener per worker, so the kernel spreads
//! connections across workers and no accept lock is shared between threads.
//!
//! SO_REUSEPORT also lets any other process of the same user join a port, which is how a
//! zero-downtime binary upgrade works, and how a second veloxy started by mistake would
//! silently take half of the first one's traffic. [`probe_free`] tells the two apart before
//! binding: it is skipped only when an upgrade is meant.
//!
//! What a listener learns from a connection's first bytes, before any codec has it, is here
//! too: [`proxy_protocol`] (the PROXY header a trusted L4 balancer sends first) and [`sni`]
//! (the server name of a TLS ClientHello, for SNI passthrough), both looking at the bytes
//! without taking them ([`peek`]).

pub(crate) mod peek;
pub(crate) mod proxy_protocol;
pub(crate) mod sni;

use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// Accept backlog per socket.
const BACKLOG: i32 = 4096;

/// Fails with [`std::io::ErrorKind::AddrInUse`] when another socket holds `addr`'s port on an
/// overlapping address. The probe binds without SO_REUSEPORT, which no holder can share,
/// whether or not it set SO_REUSEPORT itself; the socket is closed again at once.
pub fn probe_free(addr: SocketAddr) -> std::io::Result<()> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As on the real sockets: connections an earlier process left in TIME_WAIT do not count.
    socket.set_reuse_address(true)?;
    v6_only(&socket, addr)?;
    socket.bind(&addr.into())
}

/// Binds `count` UDP sockets on `addr` (HTTP/3), SO_REUSEPORT like the TCP ones: the kernel
/// hashes each client's address and port to one socket, so all of a connection's packets
/// reach the worker that owns it while the set of sockets stays the same (see the README).
pub fn bind_udp_reuseport(
    addr: SocketAddr,
    count: usize,
) -> std::io::Result<Vec<std::net::UdpSocket>> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_reuse_address(true)?;
        v6_only(&socket, addr)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        sockets.push(socket.into());
    }
    Ok(sockets)
}

/// Binds `count` sockets on `addr`. With port 0 the first socket picks the port and the others
/// join it, so every worker listens on the same ephemeral port.
pub fn bind_reuseport(addr: SocketAddr, count: usize) -> std::io::Result<Vec<TcpListener>> {
    let mut sockets = Vec::with_capacity(count);
    let mut addr = addr;
    for _ in 0..count {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        v6_only(&socket, addr)?;
        socket.set_reuse_port(true)?;
        socket.set_nodelay(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(BACKLOG)?;
        let listener: TcpListener = socket.into();
        if addr.port() == 0 {
            addr = listener.local_addr()?;
        }
        sockets.push(listener);
    }
    Ok(sockets)
}

/// An IPv6 listener serves IPv6 only (`IPV6_V6ONLY`, as nginx sets it): `[::]:80` beside
/// `0.0.0.0:80` is the usual pair, and a dual-stack `[::]` would collide with the IPv4 one.
fn v6_only(socket: &Socket, addr: SocketAddr) -> std::io::Result<()> {
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    Ok(())
}
