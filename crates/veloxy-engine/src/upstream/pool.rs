//! Per-worker keep-alive pool of idle upstream connections.
//!
//! Hand-written rather than taken from a crate: each worker owns its pool outright (no lock, no
//! atomic), and checking a connection out costs no syscall. A connection the backend closed
//! while idle is spotted from the readiness tokio already recorded from epoll: only when the
//! socket reports readable do we pay for a `read` to tell a FIN (drop it) from a spurious wake.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::tls::UpstreamIo;

use super::health::BackendHealth;
use super::proxy_header::Origin;

/// An open upstream connection, counted in its backend's `open_connections` while it lives.
pub(crate) struct UpstreamConn {
    pub stream: UpstreamIo,
    backend: Arc<BackendHealth>,
    /// The client its PROXY header named, if it sent one: it serves that client only.
    origin: Option<Origin>,
    /// When a TLS connection's TCP connect completed (its handshake began): traces show the
    /// connect and the handshake apart. `None` for plain ones.
    pub tcp_connected: Option<tokio::time::Instant>,
}

impl UpstreamConn {
    /// Wraps a connection whose slot [`reserve_slot`] already counted.
    pub fn with_reserved_slot(stream: UpstreamIo, backend: Arc<BackendHealth>) -> Self {
        UpstreamConn {
            stream,
            backend,
            origin: None,
            tcp_connected: None,
        }
    }

    /// Marks a connection whose PROXY header named `origin`.
    pub fn for_origin(mut self, origin: Option<Origin>) -> Self {
        self.origin = origin;
        self
    }
}

// An upstream connection is a byte stream (the HTTP/2 client runs over it, slot and all).
impl tokio::io::AsyncRead for UpstreamConn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for UpstreamConn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Counts a connection about to be opened, before the connect: checking after would let
/// concurrent connects all pass the limit. `max` 0 = unlimited. Release with
/// [`release_slot`] if the connect fails.
pub(crate) fn reserve_slot(backend: &BackendHealth, max: usize) -> bool {
    let before = backend.open_connections.fetch_add(1, Ordering::AcqRel);
    if max > 0 && before >= max {
        backend.open_connections.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    true
}

pub(crate) fn release_slot(backend: &BackendHealth) {
    backend.open_connections.fetch_sub(1, Ordering::AcqRel);
}

impl Drop for UpstreamConn {
    fn drop(&mut self) {
        self.backend
            .open_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) struct Idle {
    stream: UpstreamConn,
    /// [`crate::clock::now_ms`] when it was returned: the coarse clock, read once per take
    /// or put (idle times are compared with timeouts of a second or more).
    since_ms: u64,
}

impl Idle {
    fn idle_for(&self, now_ms: u64) -> Duration {
        crate::clock::since_ms(self.since_ms, now_ms)
    }
}

pub(crate) struct Pool {
    /// Per backend, most recently used last (LIFO keeps the warmest connections busy).
    idle: Vec<Vec<Idle>>,
    max_per_backend: usize,
    idle_timeout: Duration,
    /// How long connections beyond `max_per_backend` may stay idle (the group's
    /// `pool_purge_delay`; zero: they are closed when returned).
    purge_delay: Duration,
}

impl Pool {
    pub fn new(
        backends: usize,
        max_per_backend: usize,
        idle_timeout: Duration,
        purge_delay: Duration,
    ) -> Self {
        Pool {
            idle: (0..backends).map(|_| Vec::new()).collect(),
            max_per_backend,
            idle_timeout,
            purge_delay: if max_per_backend == 0 {
                Duration::ZERO
            } else {
                purge_delay
            },
        }
    }

    /// An idle connection to `backend` that still looks usable and was opened for `origin`
    /// (`None`: the usual shared connections; `Some`: a connection whose PROXY header named
    /// that client, so it is reused only for the same downstream connection).
    pub fn take(&mut self, backend: usize, origin: Option<Origin>) -> Option<UpstreamConn> {
        let list = self.idle.get_mut(backend)?;
        let now = crate::clock::now_ms();
        if origin.is_some() {
            let i = list.iter().rposition(|c| c.stream.origin == origin)?;
            let mut idle = list.remove(i);
            let usable =
                idle.idle_for(now) < self.idle_timeout && still_open(&mut idle.stream.stream);
            return usable.then_some(idle.stream);
        }
        while let Some(mut idle) = list.pop() {
            if idle.stream.origin.is_none()
                && idle.idle_for(now) < self.idle_timeout
                && still_open(&mut idle.stream.stream)
            {
                return Some(idle.stream);
            }
        }
        None
    }

    /// Returns a connection after a complete exchange. Beyond the limit it is closed, unless
    /// surplus connections may wait out the purge delay (see [`Pool::sweep`]).
    pub fn put(&mut self, backend: usize, stream: UpstreamConn) {
        let timeout = self.idle_timeout;
        let Some(list) = self.idle.get_mut(backend) else {
            return;
        };
        let now = crate::clock::now_ms();
        if list
            .first()
            .is_some_and(|oldest| oldest.idle_for(now) >= timeout)
        {
            list.remove(0);
        }
        if list.len() >= self.max_per_backend && stream.origin.is_some() && !list.is_empty() {
            // Connections tied to clients go stale when their client leaves: the oldest
            // makes room rather than the newest being closed.
            list.remove(0);
        }
        let surplus_ok = !self.purge_delay.is_zero() && stream.origin.is_none();
        if list.len() < self.max_per_backend || surplus_ok {
            list.push(Idle {
                stream,
                since_ms: now,
            });
        }
    }

    /// Takes every idle connection of `backend` out (to carry them into a reloaded config).
    pub fn take_all(&mut self, backend: usize) -> Vec<Idle> {
        self.idle
            .get_mut(backend)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Every idle connection left, of all backends.
    pub fn take_rest(&mut self) -> Vec<Idle> {
        self.idle.iter_mut().flat_map(std::mem::take).collect()
    }

    /// Adds idle connections carried over from a previous config, up to the limit.
    pub fn adopt(&mut self, backend: usize, conns: Vec<Idle>) {
        if let Some(list) = self.idle.get_mut(backend) {
            let room = self.max_per_backend.saturating_sub(list.len());
            list.extend(conns.into_iter().take(room));
        }
    }

    /// Closes idle connections past `idle_timeout` (run periodically, so they do not linger
    /// and hold backend connection slots when traffic stops), and those beyond the limit
    /// that have been idle for the purge delay: the least recently used, at the front.
    /// Returns how many it closed.
    pub fn sweep(&mut self) -> usize {
        let (timeout, delay, max) = (self.idle_timeout, self.purge_delay, self.max_per_backend);
        let mut closed = 0;
        let now = crate::clock::now_ms();
        for list in &mut self.idle {
            let before = list.len();
            list.retain(|i| i.idle_for(now) < timeout);
            let surplus = list.len().saturating_sub(max);
            let stale = list[..surplus]
                .iter()
                .take_while(|i| i.idle_for(now) >= delay)
                .count();
            list.drain(..stale);
            closed += before - list.len();
        }
        closed
    }

    /// Idle connections kept for `backend`.
    pub fn idle_count(&self, backend: usize) -> usize {
        self.idle.get(backend).map_or(0, Vec::len)
    }
}

/// False when the peer closed (or sent unexpected bytes on) an idle connection.
fn still_open(io: &mut UpstreamIo) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    if let UpstreamIo::Tls(tls) = io {
        // Read through TLS: a late session ticket (TLS 1.3 sends them after the handshake) is
        // consumed by rustls and yields no data (Pending); close_notify or a FIN reads as end
        // of stream; any application byte on an idle connection means it is out of step.
        use tokio::io::AsyncRead;
        let mut probe = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut probe);
        return match std::pin::Pin::new(&mut **tls).poll_read(&mut cx, &mut buf) {
            Poll::Pending => true,
            Poll::Ready(Ok(())) => false,
            Poll::Ready(Err(_)) => false,
        };
    }
    // A plain socket: ready to read means a FIN, a reset or a stray byte.
    let mut probe = [0u8; 1];
    let read = match io {
        UpstreamIo::Plain(s) => match s.poll_read_ready(&mut cx) {
            Poll::Ready(Ok(())) => s.try_read(&mut probe),
            other => return other.is_pending(),
        },
        UpstreamIo::Unix(s) => match s.poll_read_ready(&mut cx) {
            Poll::Ready(Ok(())) => s.try_read(&mut probe),
            other => return other.is_pending(),
        },
        UpstreamIo::Tls(_) => unreachable!("handled above"),
    };
    matches!(read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    #[tokio::test]
    async fn closed_idle_connections_are_not_reused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut pool = Pool::new(1, 2, Duration::from_secs(60), Duration::ZERO);
        let health = Arc::new(BackendHealth::new(addr.into()));
        let conn = |s| {
            assert!(reserve_slot(&health, 0));
            UpstreamConn::with_reserved_slot(UpstreamIo::Plain(s), health.clone())
        };
        let a = TcpStream::connect(addr).await.unwrap();
        let (mut server_a, _) = listener.accept().await.unwrap();
        let b = TcpStream::connect(addr).await.unwrap();
        let (_server_b, _) = listener.accept().await.unwrap();
        pool.put(0, conn(a));
        pool.put(0, conn(b));
        let c = TcpStream::connect(addr).await.unwrap();
        pool.put(0, conn(c));
        assert_eq!(pool.idle_count(0), 2, "limit respected");
        assert_eq!(
            health.open_connections.load(Ordering::Relaxed),
            2,
            "the third was closed"
        );
        // Close the peer of `a` (the oldest); `b` (newest) is taken first and is fine.
        server_a.shutdown().await.unwrap();
        drop(server_a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(pool.take(0, None).is_some());
        assert!(
            pool.take(0, None).is_none(),
            "the closed connection must be discarded"
        );
    }

    #[tokio::test]
    async fn surplus_connections_wait_out_the_purge_delay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let delay = Duration::from_millis(200);
        let mut pool = Pool::new(1, 1, Duration::from_secs(60), delay);
        let health = Arc::new(BackendHealth::new(addr.into()));
        let mut peers = Vec::new();
        for _ in 0..3 {
            let s = TcpStream::connect(addr).await.unwrap();
            peers.push(listener.accept().await.unwrap().0);
            assert!(reserve_slot(&health, 0));
            pool.put(
                0,
                UpstreamConn::with_reserved_slot(UpstreamIo::Plain(s), health.clone()),
            );
        }
        // A burst returned three with room for one: the other two stay for the delay.
        assert_eq!(pool.idle_count(0), 3);
        pool.sweep();
        assert_eq!(pool.idle_count(0), 3, "not idle for the purge delay yet");
        tokio::time::sleep(delay + Duration::from_millis(20)).await;
        pool.sweep();
        assert_eq!(
            pool.idle_count(0),
            1,
            "the surplus is closed, the limit kept"
        );
        assert_eq!(health.open_connections.load(Ordering::Relaxed), 1);
        assert!(pool.take(0, None).is_some());
    }
}
