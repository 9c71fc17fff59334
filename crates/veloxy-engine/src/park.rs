//! Idle keep-alive connections parked off the runtime.
//!
//! A plain HTTP/1 client that stays idle between requests for `[server] park_idle_after`
//! leaves the runtime: its task ends, and what its connection needs to go on (the socket, its
//! addresses, its listener) waits here as one slab entry, its socket registered with the
//! worker's second epoll instance. In the runtime an idle connection costs its task (384
//! bytes: tokio rounds a task to 128), the reactor's readiness slot for its socket (256) and
//! its `Downstream` (240), about 1.5 KB of RSS with the allocator's share; parked it is one
//! slab entry of about 100 bytes and a deadline (`bench/idle_memory.py` measures 389-499
//! bytes of RSS per idle client with the allocator's share, nginx 787-826). nginx keeps every
//! idle connection this way: a small record and an epoll registration.
//!
//! The worker's parking task (`downstream::setup::serve_parked`) waits on that epoll instance
//! (registered in the runtime as one descriptor) and on the earliest keep-alive deadline:
//! a parked client that sends its next request (or closes) is taken out and its connection
//! task started again with its socket back in the runtime; one that idles out is closed
//! here. Parking and waking cost four `epoll_ctl` calls, once per idle period of at least
//! `park_idle_after`: busy connections never park.
//!
//! Written on mio (tokio's own epoll layer) because no crate parks sockets off a tokio
//! runtime: tokio has no way to keep a socket registered without its readiness slot.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

/// What a parked connection keeps: enough to build its `Downstream` again.
pub(crate) struct Parked {
    pub tcp: std::net::TcpStream,
    pub peer: SocketAddr,
    pub local: Option<SocketAddr>,
    pub listener: Arc<crate::runtime::ListenerState>,
    pub http2: bool,
}

struct Slot {
    conn: Parked,
    /// Tells this entry's deadline from an earlier occupant's of the same slab key.
    stamp: u32,
}

/// A worker's parked connections (see the module doc). Plain data behind a `RefCell`: only
/// the worker's own thread touches it, and no borrow is held across an await.
#[derive(Default)]
pub(crate) struct Parking {
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    /// The epoll instance's registry: `None` until the first connection parks.
    registry: Option<mio::Registry>,
    slots: slab::Slab<Slot>,
    /// Keep-alive deadlines, earliest first; entries whose slot is gone are skipped.
    deadlines: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    stamp: u32,
}

/// The epoll instance the parked sockets are registered with, owned by the parking task.
pub(crate) struct Lot {
    poll: AsyncFd<mio::Poll>,
    events: mio::Events,
}

/// Longest the parking task sleeps without looking at the deadlines (a deadline made earlier
/// than the one it sleeps for, after a reload shortened the keep-alive timeout, waits this).
const DEADLINE_CHECK: Duration = Duration::from_secs(1);

impl Parking {
    /// Parks `conn` until its client sends something or `deadline` passes. On the first park
    /// the epoll instance is made and returned, for the caller to start the parking task
    /// with. `Err` gives the connection back when it cannot be parked (the epoll instance or
    /// the registration failed): it then waits in its task as before.
    pub fn park(&self, conn: Parked, deadline: Instant) -> Result<Option<Lot>, Parked> {
        let mut s = self.state.borrow_mut();
        let mut lot = None;
        if s.registry.is_none() {
            match new_lot() {
                Ok((l, registry)) => {
                    s.registry = Some(registry);
                    lot = Some(l);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot park idle connections");
                    return Err(conn);
                }
            }
        }
        let State {
            registry,
            slots,
            deadlines,
            stamp,
        } = &mut *s;
        let registry = registry.as_ref().expect("made above");
        let entry = slots.vacant_entry();
        let key = entry.key();
        let fd = conn.tcp.as_raw_fd();
        let mut source = mio::unix::SourceFd(&fd);
        if let Err(e) = registry.register(&mut source, mio::Token(key), mio::Interest::READABLE) {
            tracing::debug!(error = %e, "cannot park an idle connection");
            return Err(conn);
        }
        *stamp = stamp.wrapping_add(1);
        entry.insert(Slot {
            conn,
            stamp: *stamp,
        });
        deadlines.push(Reverse((deadline, key, *stamp)));
        Ok(lot)
    }

    /// Takes a parked connection out, its socket no longer registered here.
    fn take(s: &mut State, key: usize) -> Option<Parked> {
        let slot = s.slots.try_remove(key)?;
        if let Some(registry) = &s.registry {
            let fd = slot.conn.tcp.as_raw_fd();
            let _ = registry.deregister(&mut mio::unix::SourceFd(&fd));
        }
        Some(slot.conn)
    }

    /// Takes out the connections whose keep-alive deadline has passed.
    fn expired(&self, now: Instant, out: &mut Vec<Parked>) {
        let mut s = self.state.borrow_mut();
        while let Some(&Reverse((at, key, stamp))) = s.deadlines.peek() {
            if at > now {
                break;
            }
            s.deadlines.pop();
            if s.slots.get(key).is_some_and(|slot| slot.stamp == stamp) {
                out.extend(Self::take(&mut s, key));
            }
        }
        if s.slots.is_empty() && s.deadlines.capacity() > 1024 {
            s.deadlines.shrink_to_fit();
        }
    }

    /// When the parking task must next look at the deadlines.
    fn next_check(&self, now: Instant) -> Instant {
        let s = self.state.borrow();
        let soon = now + DEADLINE_CHECK;
        s.deadlines
            .peek()
            .map_or(soon, |Reverse((at, ..))| (*at).min(soon))
    }
}

fn new_lot() -> io::Result<(Lot, mio::Registry)> {
    let poll = mio::Poll::new()?;
    let registry = poll.registry().try_clone()?;
    let lot = Lot {
        // SAFETY: the Poll owns its epoll descriptor and neither closes nor replaces it while
        // the AsyncFd holds it.
        poll: unsafe { AsyncFd::register_with_interest(poll, tokio::io::Interest::READABLE)? },
        events: mio::Events::with_capacity(256),
    };
    Ok((lot, registry))
}

impl Lot {
    /// Waits until some parked client sends something or closes (`woken`), or some parked
    /// connection's deadline passes (`expired`); both lists are filled, never both empty
    /// unless an error was returned.
    pub async fn next(
        &mut self,
        parking: &Parking,
        woken: &mut Vec<Parked>,
        expired: &mut Vec<Parked>,
    ) -> io::Result<()> {
        loop {
            let check = parking.next_check(Instant::now());
            tokio::select! {
                ready = self.poll.readable_mut() => {
                    let mut guard = ready?;
                    loop {
                        let poll = guard.get_inner_mut();
                        match poll.poll(&mut self.events, Some(Duration::ZERO)) {
                            Ok(()) => {}
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(e),
                        }
                        if self.events.is_empty() {
                            // Nothing more ready: the runtime's readiness may be cleared.
                            guard.clear_ready();
                            break;
                        }
                        let mut s = parking.state.borrow_mut();
                        for event in self.events.iter() {
                            woken.extend(Parking::take(&mut s, event.token().0));
                        }
                    }
                }
                _ = tokio::time::sleep_until(check) => {}
            }
            parking.expired(Instant::now(), expired);
            if !woken.is_empty() || !expired.is_empty() {
                return Ok(());
            }
        }
    }
}
