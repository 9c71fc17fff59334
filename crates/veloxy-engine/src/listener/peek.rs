//! Peeking at what a client sent first (a PROXY header, a TLS ClientHello) without consuming
//! it, and waiting for more by readiness, never by a timer.
//!
//! A `MSG_PEEK` read leaves the bytes in the socket, so it does not clear the socket's read
//! readiness: a loop of `peek` then `readable()` would spin. Here the peek runs inside
//! tokio's `try_io`, and when it shows nothing new the closure reports `WouldBlock`, which
//! clears the readiness seen before the peek (tokio compares its tick, so a segment that
//! arrives after the peek is not lost); the next wait then lasts until the kernel reports new
//! bytes. Hand-written because tokio's `TcpStream::peek` has no such form.

use std::io;
use std::os::fd::AsRawFd;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Why a peek gave up.
#[derive(Debug)]
pub(crate) enum PeekError {
    /// `deadline` passed with no new bytes.
    TimedOut,
    /// The client closed, or the socket failed.
    Closed,
}

/// Peeks into `buf` once more bytes than `seen` are in the socket (or its whole length is
/// full); returns how many bytes it now holds.
pub(crate) async fn peek_more(
    stream: &TcpStream,
    buf: &mut [u8],
    seen: usize,
    deadline: Instant,
) -> Result<usize, PeekError> {
    loop {
        tokio::time::timeout_at(deadline, stream.readable())
            .await
            .map_err(|_| PeekError::TimedOut)?
            .map_err(|_| PeekError::Closed)?;
        let fd = stream.as_raw_fd();
        let peeked = stream.try_io(Interest::READABLE, || {
            // SAFETY: `buf` is valid for writes of its length for the call's duration.
            let n = unsafe {
                libc::recv(
                    fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            match n {
                n if n < 0 => Err(io::Error::last_os_error()),
                0 => Ok(0),
                n if (n as usize) > seen || n as usize == buf.len() => Ok(n as usize),
                // Nothing new since the last look: wait for the next segment.
                _ => Err(io::ErrorKind::WouldBlock.into()),
            }
        });
        match peeked {
            Ok(0) => return Err(PeekError::Closed),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(PeekError::Closed),
        }
    }
}
