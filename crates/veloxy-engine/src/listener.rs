//! Listener sockets: one SO_REUSEPORT socket per listener per worker, so the kernel spreads
//! connections across workers and no accept lock is shared between threads.

use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// Accept backlog per socket.
const BACKLOG: i32 = 4096;

/// Binds `count` sockets on `addr`. With port 0 the first socket picks the port and the others
/// join it, so every worker listens on the same ephemeral port.
pub fn bind_reuseport(addr: SocketAddr, count: usize) -> std::io::Result<Vec<TcpListener>> {
    let mut sockets = Vec::with_capacity(count);
    let mut addr = addr;
    for _ in 0..count {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
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
