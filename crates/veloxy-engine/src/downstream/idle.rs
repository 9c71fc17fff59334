//! The waits of an HTTP/1 connection between requests, plain ([`IdleRead`]) and over TLS
//! ([`IdleTls`]): hand-written futures, because every idle client's task holds one, and
//! neither holds a read buffer or any request state (see [`super::connection`]).

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::connection::HEAD_BUF;
use crate::worker::Worker;

/// How an idle wait ended.
pub(super) enum Waited {
    /// The next request's first bytes were read (this many).
    Read(usize),
    /// Closed, failed or idled out.
    Gone,
    /// Idle for `park_idle_after`: park it; its keep-alive time ends at this deadline.
    Park(Instant),
}

pin_project_lite::pin_project! {
    /// Waits up to a keep-alive timeout for the next request's first bytes on a plain
    /// connection and reads them; or, with `park`, only that long, and then it should park.
    ///
    /// A connection waiting between requests holds no read buffer: it gives its buffer to
    /// the worker's pool and takes one when its bytes arrive, the one given back last. So
    /// thousands of keep-alive clients cost no buffers, and a busy worker reads each request
    /// into a buffer still in the CPU's cache rather than into one of thousands of cold ones
    /// (nginx frees its header buffer between requests the same way). The syscalls are the
    /// readiness wait and the read: a short read clears the readiness (see [`drained`]).
    ///
    /// Written by hand rather than as `timeout(readable())` in an `async fn`: every idle
    /// client's future holds this one, and it is the socket's own read-readiness slot and
    /// one timer (144 bytes), where the combinators took 200 with a waiter node.
    pub(super) struct IdleRead<'a> {
        worker: &'a Worker,
        tcp: &'a TcpStream,
        rbuf: &'a mut BytesMut,
        // When parking: the keep-alive time left after the park timer.
        rest: Option<Duration>,
        #[pin]
        timer: tokio::time::Sleep,
    }
}
impl<'a> IdleRead<'a> {
    pub(super) fn new(
        worker: &'a Worker,
        tcp: &'a TcpStream,
        rbuf: &'a mut BytesMut,
        keepalive: Duration,
        park: Option<Duration>,
    ) -> Self {
        if rbuf.capacity() > 0 {
            worker.give_head_buf(std::mem::take(rbuf));
        }
        IdleRead {
            worker,
            tcp,
            rbuf,
            rest: park.map(|p| keepalive - p),
            timer: tokio::time::sleep(park.unwrap_or(keepalive)),
        }
    }
}
impl Future for IdleRead<'_> {
    type Output = Waited;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Waited> {
        let mut this = self.project();
        loop {
            let mut buf = this.worker.take_head_buf(HEAD_BUF);
            let space = buf.capacity() - buf.len();
            match this.tcp.try_read_buf(&mut buf) {
                Ok(n) if n > 0 => {
                    if n < space {
                        drained(this.tcp);
                    }
                    **this.rbuf = buf;
                    return Poll::Ready(Waited::Read(n));
                }
                // WouldBlock cleared the socket's readiness: the poll below registers the wait.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    this.worker.give_head_buf(buf)
                }
                _ => {
                    this.worker.give_head_buf(buf);
                    return Poll::Ready(Waited::Gone);
                }
            }
            match this.tcp.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => return Poll::Ready(Waited::Gone),
                Poll::Pending if this.timer.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(match this.rest {
                        Some(rest) => Waited::Park(this.timer.deadline() + *rest),
                        None => Waited::Gone,
                    });
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A read that returned less than it had room for emptied the socket's receive queue: clears
/// the socket's read readiness, so the next wait for a request goes straight to epoll instead
/// of first making a `recv` that returns EAGAIN (one syscall of five per keep-alive request).
///
/// Safe because the runtime's epoll is edge-triggered and Linux raises an edge for every
/// arrival, so bytes that come after this read wake the task; and because the clear is
/// tokio's own (`try_io` with `WouldBlock`), which skips it when an event came in since the
/// readiness was observed, and never clears a seen close. tokio's `poll_read` does the same
/// after a short read; `try_read_buf` (used here to read into a pooled buffer) does not.
fn drained(tcp: &TcpStream) {
    let _ = tcp.try_io(tokio::io::Interest::READABLE, || {
        Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
    });
}

pin_project_lite::pin_project! {
    /// Waits up to a keep-alive timeout, holding no buffer, until a TLS connection has
    /// decrypted bytes (or its peer's close) to read; resolves to whether it has (false:
    /// closed, failed or idled out). The TLS records are read into rustls' own buffer, as the
    /// TLS stream would read them: one `recv` per request, as before, and the request's
    /// plaintext then waits in rustls for the request's buffer.
    pub(super) struct IdleTls<'a> {
        tls: &'a mut tokio_rustls::server::TlsStream<TcpStream>,
        #[pin]
        timer: tokio::time::Sleep,
    }
}
impl<'a> IdleTls<'a> {
    pub(super) fn new(
        tls: &'a mut tokio_rustls::server::TlsStream<TcpStream>,
        keepalive: Duration,
    ) -> Self {
        IdleTls {
            tls,
            timer: tokio::time::sleep(keepalive),
        }
    }
}
impl Future for IdleTls<'_> {
    type Output = bool;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<bool> {
        let this = self.project();
        let (tcp, conn) = this.tls.get_mut();
        loop {
            let read = conn.read_tls(&mut PollRead { tcp, cx });
            match read {
                Ok(0) => return Poll::Ready(false),
                Ok(_) => match conn.process_new_packets() {
                    Ok(s) if s.plaintext_bytes_to_read() > 0 || s.peer_has_closed() => {
                        return Poll::Ready(true)
                    }
                    // A partial record, or one with no data (a key update): read on.
                    Ok(_) => continue,
                    Err(_) => return Poll::Ready(false),
                },
                // The socket's read readiness is cleared and this task waits for it.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if this.timer.poll(cx).is_ready() {
                        return Poll::Ready(false);
                    }
                    return Poll::Pending;
                }
                Err(_) => return Poll::Ready(false),
            }
        }
    }
}

/// `std::io::Read` over a tokio socket's `poll_read` (`WouldBlock` when it is pending, the
/// task then waiting for it), for rustls' `read_tls`: the socket's own read path, which also
/// clears its readiness after a short read, so the next read costs no `recv` that would block.
struct PollRead<'a, 'b> {
    tcp: &'a mut TcpStream,
    cx: &'a mut std::task::Context<'b>,
}

impl std::io::Read for PollRead<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut buf = tokio::io::ReadBuf::new(buf);
        match tokio::io::AsyncRead::poll_read(std::pin::Pin::new(self.tcp), self.cx, &mut buf) {
            Poll::Ready(Ok(())) => Ok(buf.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
        }
    }
}
