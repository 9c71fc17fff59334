//! A worker: one OS thread, one single-threaded tokio runtime, its own listener sockets,
//! upstream pools and pickers. Nothing on the request path is shared with other workers except
//! the read-only config snapshot and a few counters read with relaxed loads.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;

use crate::config::Snapshot;
use crate::error::{ErrorKind, ProxyError};
use crate::metrics::WorkerMetrics;
use crate::server::Shared;
use crate::upstream::GroupState;

/// The config generation a worker is running: the snapshot plus the worker's state built for
/// it. Requests hold an `Rc` to it, so a reload never pulls state from under them.
pub(crate) struct Generation {
    pub number: u64,
    pub snapshot: Arc<Snapshot>,
    pub groups: RefCell<Vec<GroupState>>,
}

impl Generation {
    fn new(number: u64, snapshot: Arc<Snapshot>) -> Self {
        let workers = snapshot.settings.workers;
        let groups = snapshot
            .upstreams
            .iter()
            .map(|g| GroupState::new(g, workers))
            .collect();
        Generation {
            number,
            snapshot,
            groups: RefCell::new(groups),
        }
    }
}

/// Moves idle upstream connections of backends that survive a reload (same group name, same
/// address) into the new generation's pools, so a reload costs no reconnects.
fn carry_idle_connections(old: &Generation, new: &Generation) {
    let (mut from, mut to) = (old.groups.borrow_mut(), new.groups.borrow_mut());
    for (ni, group) in new.snapshot.upstreams.iter().enumerate() {
        let Some(oi) = old
            .snapshot
            .upstreams
            .iter()
            .position(|g| g.name == group.name)
        else {
            continue;
        };
        for (nb, backend) in group.backends.iter().enumerate() {
            let old_backends = &old.snapshot.upstreams[oi].backends;
            if let Some(ob) = old_backends.iter().position(|b| b.addr == backend.addr) {
                let conns = from[oi].pool.take_all(ob);
                to[ni].pool.adopt(nb, conns);
            }
        }
    }
}

/// Size of scratch buffers handed to requests (head building, upstream reads, body pumps).
pub(crate) const SCRATCH: usize = 32 * 1024;
/// Scratch buffers kept for reuse; more are freed.
const SCRATCH_KEPT: usize = 256;

pub(crate) struct Worker {
    pub id: usize,
    pub shared: Arc<Shared>,
    generation: RefCell<Rc<Generation>>,
    bytes: RefCell<Vec<BytesMut>>,
    vecs: RefCell<Vec<Vec<u8>>>,
    /// Accepted connections whose first request head has not arrived yet: shutdown waits for
    /// them too, so a connection accepted just before SIGTERM still gets its answer.
    pub fresh: Cell<usize>,
    /// Open HTTP/2 connections: shutdown waits for them to finish their GOAWAY, so the last
    /// frames of a response are written before the worker exits.
    pub h2_connections: Cell<usize>,
    /// This worker's counters (it is their only writer).
    pub metrics: Arc<WorkerMetrics>,
    /// Shared by the worker's accept loops: out of descriptors, every listener fails at once,
    /// and one line a second per worker says so.
    pub accept_log: RefCell<crate::accept::LogLimiter>,
}

impl Worker {
    pub fn new(id: usize, shared: Arc<Shared>, metrics: Arc<WorkerMetrics>) -> Self {
        let number = shared.generation.load(Ordering::Acquire);
        let snapshot = shared.snapshot.load_full();
        Worker {
            id,
            shared,
            generation: RefCell::new(Rc::new(Generation::new(number, snapshot))),
            bytes: RefCell::new(Vec::new()),
            vecs: RefCell::new(Vec::new()),
            fresh: Cell::new(0),
            h2_connections: Cell::new(0),
            metrics,
            accept_log: RefCell::new(crate::accept::LogLimiter::new(crate::accept::LOG_INTERVAL)),
        }
    }

    /// Counts an error answered to a client under its kind of refusal.
    pub fn count_error(&self, e: &ProxyError) {
        if e.is_shed() {
            self.metrics.shed_503.inc();
        } else if matches!(e.kind, ErrorKind::RateLimited) {
            self.metrics.rate_limited_429.inc();
        }
    }

    /// The current generation, rebuilt if a reload published a new snapshot. The check is one
    /// relaxed-cost atomic load of a rarely written counter.
    pub fn current(&self) -> Rc<Generation> {
        let number = self.shared.generation.load(Ordering::Acquire);
        {
            let g = self.generation.borrow();
            if g.number == number {
                return g.clone();
            }
        }
        let fresh = Rc::new(Generation::new(number, self.shared.snapshot.load_full()));
        let old = std::mem::replace(&mut *self.generation.borrow_mut(), fresh.clone());
        carry_idle_connections(&old, &fresh);
        fresh
    }

    pub fn take_bytes(&self) -> BytesMut {
        self.bytes
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| BytesMut::with_capacity(SCRATCH))
    }

    pub fn give_bytes(&self, mut b: BytesMut) {
        b.clear();
        let mut list = self.bytes.borrow_mut();
        if list.len() < SCRATCH_KEPT && b.capacity() >= SCRATCH / 2 && b.capacity() <= SCRATCH * 4 {
            list.push(b);
        }
    }

    pub fn take_vec(&self) -> Vec<u8> {
        self.vecs
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(4096))
    }

    pub fn give_vec(&self, mut v: Vec<u8>) {
        v.clear();
        let mut list = self.vecs.borrow_mut();
        if list.len() < SCRATCH_KEPT && v.capacity() <= SCRATCH * 4 {
            list.push(v);
        }
    }

    /// Periodic housekeeping: closes expired idle upstream connections.
    /// Publishes this worker's per-backend figures (in flight, idle pool, latency EWMA) for
    /// `/upstreams`: a few relaxed stores per backend, off the request path.
    pub fn publish(&self) {
        let gen = self.current();
        let groups = gen.groups.borrow();
        for (group, state) in gen.snapshot.upstreams.iter().zip(groups.iter()) {
            state.publish(group, self.id);
        }
    }

    pub fn sweep(&self) {
        let gen = self.current();
        for g in gen.groups.borrow_mut().iter_mut() {
            g.pool.sweep();
        }
    }

    /// Requests being served by this worker (shutdown waits for zero): started minus finished.
    pub fn in_flight(&self) -> u64 {
        self.metrics.in_flight.get() - self.metrics.in_flight_done.get()
    }

    pub fn shutting_down(&self) -> bool {
        self.shared.shutdown.load(Ordering::Relaxed)
    }
}
