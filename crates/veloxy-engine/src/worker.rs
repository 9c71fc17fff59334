//! A worker: one OS thread, one single-threaded tokio runtime, its own listener sockets,
//! upstream pools and pickers. Nothing on the request path is shared with other workers except
//! the read-only config snapshot and a few counters read with relaxed loads.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;

use crate::config::Snapshot;
use crate::error::{ErrorKind, ProxyError};
use crate::metrics::WorkerMetrics;
use crate::runtime::Shared;
use crate::upstream::group::UpstreamGroup;
use crate::upstream::pool::UpstreamConn;
use crate::upstream::GroupState;

/// The config generation a worker is running: the snapshot plus the worker's state built for
/// it. Requests hold an `Rc` to it, so a reload never pulls state from under them.
pub(crate) struct Generation {
    pub number: u64,
    pub snapshot: Arc<Snapshot>,
    /// This worker's state for each group, by index. A group a change left as it was (the
    /// same shared group, or one whose backends and pool settings compare equal) shares its
    /// state with the generation before: picker, idle connections, in-flight counts, latency
    /// figures and retry budget go on, and requests of either generation count in one place.
    groups: Vec<Rc<RefCell<GroupState>>>,
    /// One bit per group: an attempt started or ended on it since the heartbeat's last tick,
    /// whose figures that tick publishes (see [`Generation::publish`]).
    touched: Vec<Cell<u64>>,
    /// `early_hints` routes' remembered Link fields (empty, unallocated, without them).
    pub hints: RefCell<crate::hints::Memory>,
}

impl Generation {
    /// The generation for `snapshot`, taking over what it can of `old` (see `groups`); a
    /// group whose backends changed gets fresh state, with the idle connections and figures
    /// of the backends it kept (by address). Linear in the number of groups and backends.
    /// Also returns what the worker has left to do off the request path (see [`Handover`]).
    fn new(number: u64, snapshot: Arc<Snapshot>, old: Option<&Generation>) -> (Self, Handover) {
        let workers = snapshot.settings.workers;
        let mut by_name: Option<HashMap<&str, usize>> = None;
        let mut handover = Handover::default();
        let groups: Vec<_> = snapshot
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, group)| {
                let Some(old) = old else {
                    return Rc::new(RefCell::new(GroupState::new(group, workers)));
                };
                let was = &old.snapshot.upstreams;
                let j = match was.get(i) {
                    Some(g) if g.name == group.name => Some(i),
                    _ => by_name
                        .get_or_insert_with(|| {
                            was.iter()
                                .enumerate()
                                .map(|(j, g)| (g.name.as_str(), j))
                                .collect()
                        })
                        .get(group.name.as_str())
                        .copied(),
                };
                let Some(j) = j else {
                    return Rc::new(RefCell::new(GroupState::new(group, workers)));
                };
                let same = Arc::ptr_eq(&was[j], group)
                    || (old.snapshot.settings.workers == workers
                        && crate::upstream::same_state(&was[j], group));
                if same {
                    return old.groups[j].clone();
                }
                let mut state = GroupState::new(group, workers);
                let (added, retired) = state.adopt(&mut old.groups[j].borrow_mut(), &was[j], group);
                handover.warm.extend(added.into_iter().map(|b| (i, b)));
                handover.retired.extend(retired);
                Rc::new(RefCell::new(state))
            })
            .collect();
        let touched = (0..groups.len().div_ceil(64))
            .map(|_| Cell::new(0))
            .collect();
        let generation = Generation {
            number,
            snapshot,
            groups,
            touched,
            hints: RefCell::default(),
        };
        (generation, handover)
    }

    /// This worker's state for group `i` (a short borrow: never held across an await).
    pub fn group(&self, i: usize) -> RefMut<'_, GroupState> {
        self.groups[i].borrow_mut()
    }

    /// An attempt on backend `b` of group `i` starts (see [`GroupState::start`]).
    pub fn start(&self, i: usize, b: usize) {
        self.touch(i);
        self.group(i).start(b);
    }

    /// An attempt on backend `b` of group `i` ended (see [`GroupState::end`]).
    pub fn end(&self, i: usize, b: usize, latency: std::time::Duration, ok: bool) {
        self.touch(i);
        self.group(i).end(b, latency, ok);
    }

    fn touch(&self, i: usize) {
        let word = &self.touched[i / 64];
        word.set(word.get() | 1 << (i % 64));
    }

    /// Publishes worker `worker`'s per-backend figures (in flight, idle pool, latency EWMA)
    /// for `/upstreams` on heartbeat tick `tick`: a few relaxed stores per backend, off the
    /// request path. The groups of this tick's turn (see [`on_turn`]) are published in full;
    /// of the others, those an attempt touched since the last tick, for what it touched (see
    /// [`GroupState::publish`]), and nothing else is visited. Spread so: with 1,000 groups,
    /// publishing all of them on one tick kept the worker off its clients for about 3 ms once
    /// a second (`perf sched`), and visiting each one on every tick was 1.4% of its time.
    /// (An attempt of an older generation, still in flight, touches that generation's bits:
    /// what it changed waits for the group's turn.)
    fn publish(&self, worker: usize, tick: u64) {
        let ups = &self.snapshot.upstreams;
        for i in on_turn(ups.len(), tick) {
            self.group(i).publish(&ups[i], worker, true);
        }
        let turn = turn(tick);
        for (w, word) in self.touched.iter().enumerate() {
            let mut bits = word.replace(0);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if turn_of(i) != turn {
                    self.group(i).publish(&ups[i], worker, false);
                }
            }
        }
    }
}

/// What a worker has left to do when it takes a new generation, off the request path.
#[derive(Default)]
struct Handover {
    /// Backends to open a warm connection to, as (group, backend) indices (see
    /// [`Worker::warm`]).
    warm: Vec<(usize, usize)>,
    /// Idle connections to backends the change removed from their groups (see [`retire`]).
    retired: Vec<crate::upstream::pool::Idle>,
}

/// Closes idle upstream connections a change left without a backend, [`RETIRE_BATCH`] every
/// [`PACE`], so that requests run between the closes. A close is 10-20 us of the worker's
/// time (on loopback it runs the peer's side of the FIN exchange too); under endpoint churn
/// a change closed dozens at once on the request that took the new generation, a run of a
/// few ms. (A change of a 10,000-backend group's transport closes its pool in a few seconds.)
async fn retire(conns: Vec<crate::upstream::pool::Idle>) {
    let mut conns = conns.into_iter().peekable();
    loop {
        // Dropping an idle connection closes it.
        conns.by_ref().take(RETIRE_BATCH).for_each(drop);
        if conns.peek().is_none() {
            return;
        }
        tokio::time::sleep(PACE).await;
    }
}

/// Retired idle connections closed at once (see [`retire`]).
const RETIRE_BATCH: usize = 4;

/// The spacing of a worker's housekeeping connects and closes (see [`Worker::warm`] and
/// [`retire`]): one at a time, so none holds a request up for longer than its own syscall.
const PACE: std::time::Duration = std::time::Duration::from_millis(1);

/// Most new backends one config change has a worker open warm connections to (see
/// [`Worker::warm`]); any beyond are connected by their first request.
const WARM_MAX: usize = 64;
/// Warm connections opened at once by a worker.
const WARM_LANES: usize = 4;

/// Heartbeat ticks a second (one each 50 ms): see [`Worker::publish`].
pub(crate) const TICKS_PER_SECOND: u64 = 20;

/// The groups (of `n`) whose once-a-second heartbeat work (full publish, sweep) falls on
/// `tick`: group `i` on ticks `i % TICKS_PER_SECOND`.
fn on_turn(n: usize, tick: u64) -> impl Iterator<Item = usize> {
    (turn(tick)..n).step_by(TICKS_PER_SECOND as usize)
}

/// The turn of heartbeat tick `tick`: the groups `i` with [`turn_of`]`(i)` equal to it.
fn turn(tick: u64) -> usize {
    (tick % TICKS_PER_SECOND) as usize
}

/// The turn of group `i` (see [`on_turn`]).
fn turn_of(i: usize) -> usize {
    i % TICKS_PER_SECOND as usize
}

/// Size of scratch buffers handed to requests (head building, upstream reads, body pumps).
pub(crate) const SCRATCH: usize = 32 * 1024;
/// Scratch buffers kept for reuse; more are freed.
const SCRATCH_KEPT: usize = 256;
/// Head buffers kept for reuse (8 KiB each): as many as connections a worker serves at once
/// in practice; connections waiting for a request hold none.
const HEAD_BUFS_KEPT: usize = 256;
/// Connections closed since the peak that make the heartbeat return memory to the OS.
const TRIM_AFTER: usize = 512;
/// Heartbeat seconds after a burst's trim in which what is freed next is trimmed as well.
const TRIM_FOLLOW_UPS: u8 = 3;

pub(crate) struct Worker {
    pub id: usize,
    /// This worker itself, for the tasks it starts on its own (see [`Worker::warm`]).
    me: Weak<Worker>,
    pub shared: Arc<Shared>,
    generation: RefCell<Rc<Generation>>,
    bytes: RefCell<Vec<BytesMut>>,
    /// Request-head read buffers of connections waiting between requests (see
    /// [`Worker::take_head_buf`]).
    head_bufs: RefCell<Vec<BytesMut>>,
    vecs: RefCell<Vec<Vec<u8>>>,
    /// Accepted connections whose first request head has not arrived yet: shutdown waits for
    /// them too, so a connection accepted just before SIGTERM still gets its answer.
    pub fresh: Cell<usize>,
    /// Open HTTP/2 and HTTP/3 connections: shutdown waits for them to finish their GOAWAY, so
    /// the last frames of a response are written before the worker exits.
    pub h2_connections: Cell<usize>,
    /// Mirror copies in flight on this worker (see `exchange::mirror`).
    pub mirrors: Cell<usize>,
    /// This worker's counters (it is their only writer).
    pub metrics: Arc<WorkerMetrics>,
    /// Open downstream connections on this worker, and their peak since memory was last
    /// trimmed (see [`Worker::trim_memory`]).
    pub connections: Cell<usize>,
    peak_connections: Cell<usize>,
    /// Memory freed since the last trim by idle clients (read buffers given back, parked
    /// connections) and by closed surplus upstream connections.
    idle_buffers_freed: Cell<usize>,
    /// Heartbeat seconds left after a burst's trim in which a smaller one may follow.
    trim_follow_ups: Cell<u8>,
    /// Shared by the worker's accept loops: out of descriptors, every listener fails at once,
    /// and one line a second per worker says so.
    pub accept_log: RefCell<crate::accept::LogLimiter>,
    /// Idle keep-alive connections parked off the runtime (see [`crate::park`]).
    pub parking: crate::park::Parking,
}

impl Worker {
    /// A worker; `me` is the `Rc` it is built into (`Rc::new_cyclic`).
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        metrics: Arc<WorkerMetrics>,
        me: Weak<Worker>,
    ) -> Self {
        let number = shared.generation.load(Ordering::Acquire);
        let snapshot = shared.snapshot.load_full();
        Worker {
            id,
            me,
            shared,
            generation: RefCell::new(Rc::new(Generation::new(number, snapshot, None).0)),
            bytes: RefCell::new(Vec::new()),
            head_bufs: RefCell::new(Vec::new()),
            vecs: RefCell::new(Vec::new()),
            fresh: Cell::new(0),
            h2_connections: Cell::new(0),
            mirrors: Cell::new(0),
            metrics,
            connections: Cell::new(0),
            peak_connections: Cell::new(0),
            idle_buffers_freed: Cell::new(0),
            trim_follow_ups: Cell::new(0),
            accept_log: RefCell::new(crate::accept::LogLimiter::new(crate::accept::LOG_INTERVAL)),
            parking: crate::park::Parking::default(),
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
        let old = self.generation.borrow().clone();
        let (fresh, handover) =
            Generation::new(number, self.shared.snapshot.load_full(), Some(&old));
        let fresh = Rc::new(fresh);
        *self.generation.borrow_mut() = fresh.clone();
        if !handover.warm.is_empty() {
            self.warm(&fresh, handover.warm);
        }
        if !handover.retired.is_empty() {
            tokio::task::spawn_local(retire(handover.retired));
        }
        fresh
    }

    /// Opens one connection to each backend in `added` ((group, backend) indices of `gen`:
    /// backends a change added to groups this worker pools connections for), within the
    /// group's `max_connections` and connect timeout, and pools it in the generation current
    /// once it is open (see [`Worker::pool_warm`]). The first request a new backend gets then
    /// finds a connection waiting rather than connecting first: under endpoint churn (100
    /// changes a second) that was about one request in thirty. At most [`WARM_MAX`] per
    /// change, in [`WARM_LANES`] tasks so that one slow backend does not hold up the rest,
    /// started about one per [`PACE`]: a connect is about 50 us of the worker's time (on
    /// loopback the whole handshake, the backend's side too, runs inside it), and 64 back to
    /// back were a 4 ms stall for the requests arriving meanwhile (`perf`, issue 37's churn
    /// benchmark: a p99 rise twice a second). A failed connect
    /// is dropped, counting against no backend's health (the first request finds out as it
    /// did before).
    fn warm(&self, gen: &Generation, mut added: Vec<(usize, usize)>) {
        let Some(me) = self.me.upgrade() else { return };
        added.truncate(WARM_MAX);
        let lanes = WARM_LANES.min(added.len());
        for lane in 0..lanes {
            let todo: Vec<_> = added
                .iter()
                .skip(lane)
                .step_by(lanes)
                .map(|&(g, b)| (g, gen.snapshot.upstreams[g].clone(), b))
                .collect();
            let me = me.clone();
            tokio::task::spawn_local(async move {
                tokio::time::sleep(PACE * lane as u32).await;
                for (g, group, b) in todo {
                    let connect =
                        crate::upstream::connect::connect_backend(&*me.metrics, &group, b, None);
                    if let Ok(conn) = connect.await {
                        me.pool_warm(g, &group, b, conn);
                    }
                    tokio::time::sleep(PACE * lanes as u32).await;
                }
            });
        }
    }

    /// Pools a warm connection to backend `b` of `was` (group `g` when it was opened) in the
    /// current generation's group of that name, at that address, if the group's connections
    /// are still made the same way and no request has pooled one there meanwhile; else it
    /// closes.
    fn pool_warm(&self, g: usize, was: &UpstreamGroup, b: usize, conn: UpstreamConn) {
        if self.shutting_down() {
            return;
        }
        let gen = self.current();
        let ups = &gen.snapshot.upstreams;
        let found = match ups.get(g) {
            Some(now) if now.name == was.name => Some(g),
            _ => ups.iter().position(|now| now.name == was.name),
        };
        let Some(g) = found.filter(|&g| crate::upstream::same_transport(was, &ups[g])) else {
            return;
        };
        let addr = &was.backends[b].addr;
        let Some(nb) = ups[g].backends.iter().position(|x| x.addr == *addr) else {
            return;
        };
        let mut state = gen.group(g);
        if state.pool.idle_count(nb) == 0 {
            state.pool.put(nb, conn);
        }
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

    /// A buffer for a request head: the one given back last (still in the CPU's cache), or a
    /// new one of `capacity`.
    pub fn take_head_buf(&self, capacity: usize) -> BytesMut {
        self.head_bufs
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| BytesMut::with_capacity(capacity))
    }

    /// Takes back an empty head buffer; beyond [`HEAD_BUFS_KEPT`] it is freed (and counted
    /// for [`Worker::trim_memory`]).
    pub fn give_head_buf(&self, mut b: BytesMut) {
        b.clear();
        let mut list = self.head_bufs.borrow_mut();
        if list.len() < HEAD_BUFS_KEPT && b.capacity() > 0 {
            list.push(b);
        } else if b.capacity() > 0 {
            drop(list);
            self.idle_memory_freed(1);
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

    /// Counts a downstream connection opened (`+1`) or closed (`-1`).
    pub fn connection_opened(&self) {
        let n = self.connections.get() + 1;
        self.connections.set(n);
        if n > self.peak_connections.get() {
            self.peak_connections.set(n);
        }
    }

    pub fn connection_closed(&self) {
        self.connections.set(self.connections.get() - 1);
    }

    /// Counts `n` pieces of idle memory freed toward a trim: read buffers given back, parked
    /// connections, closed surplus upstream connections.
    pub fn idle_memory_freed(&self, n: usize) {
        self.idle_buffers_freed
            .set(self.idle_buffers_freed.get() + n);
    }

    /// Gives memory back to the OS after a burst: when at least [`TRIM_AFTER`] connections
    /// have closed since the peak, or as many idle connections freed their read buffers,
    /// freed heap pages are returned (glibc keeps them in its arenas otherwise: 20k closed
    /// connections left 240 MB resident). Called from the heartbeat once a second; costs
    /// nothing while connection counts are steady.
    ///
    /// Only once no request is in flight: under load the freed memory is taken again at once,
    /// and `malloc_trim` walks every free chunk with the worker stopped (at 10,000 busy
    /// clients it ran every few seconds, a pause for all of them and page faults after).
    ///
    /// A burst's tail comes after its trim: clients still closing, and the upstream pool's
    /// surplus, closed a purge delay later. So for [`TRIM_FOLLOW_UPS`] seconds after a burst's
    /// trim, anything freed since is trimmed too (it failed a test 1 run in 4 on a loaded
    /// machine, where 400 late closes stayed below the threshold and kept 5 MB).
    pub fn trim_memory(&self) {
        let now = self.connections.get();
        let closed = self.peak_connections.get().saturating_sub(now);
        let freed = self.idle_buffers_freed.get();
        let burst = closed >= TRIM_AFTER || freed >= TRIM_AFTER;
        if !burst {
            let follow_ups = self.trim_follow_ups.get();
            if follow_ups == 0 {
                return;
            }
            self.trim_follow_ups.set(follow_ups - 1);
            if closed + freed == 0 {
                return;
            }
        }
        if self.in_flight() > 0 {
            return;
        }
        if burst {
            self.trim_follow_ups.set(TRIM_FOLLOW_UPS);
        }
        self.peak_connections.set(now);
        self.idle_buffers_freed.set(0);
        self.shrink_pools();
        crate::heap::trim();
        self.metrics.memory_trims.inc();
    }

    /// Frees the scratch buffers kept for reuse beyond what a quiet worker needs.
    fn shrink_pools(&self) {
        let keep = 16;
        self.bytes.borrow_mut().truncate(keep);
        self.bytes.borrow_mut().shrink_to_fit();
        self.vecs.borrow_mut().truncate(keep);
        self.vecs.borrow_mut().shrink_to_fit();
    }

    /// Publishes this worker's per-backend figures for `/upstreams` on heartbeat tick `tick`
    /// (see [`Generation::publish`]).
    pub fn publish(&self, tick: u64) {
        self.current().publish(self.id, tick);
    }

    /// Closes expired idle upstream connections and a burst's surplus, on heartbeat tick
    /// `tick`: each group once a second, on the same tick as its full publish (spread for the
    /// same reason). Each one closed counts toward a trim like a freed idle buffer: after a
    /// burst the surplus closes a second or two after its clients did, when the trim they
    /// caused has already run.
    pub fn sweep(&self, tick: u64) {
        let gen = self.current();
        let mut closed = 0;
        for i in on_turn(gen.groups.len(), tick) {
            closed += gen.group(i).pool.sweep();
        }
        self.idle_memory_freed(closed);
    }

    /// Requests being served by this worker (shutdown waits for zero): started minus finished.
    pub fn in_flight(&self) -> u64 {
        self.metrics.in_flight.get() - self.metrics.in_flight_done.get()
    }

    pub fn shutting_down(&self) -> bool {
        self.shared.shutdown.load(Ordering::Relaxed)
    }

    /// Returns an HTTP/1 upstream connection to `gen`'s pool after a clean exchange (the
    /// caller says it is clean: reusable, nothing unread); while the worker shuts down it is
    /// closed instead, so idle connections do not outlive their last request.
    pub fn pool_upstream(
        &self,
        gen: &Generation,
        (upstream, backend): (usize, usize),
        conn: crate::upstream::pool::UpstreamConn,
    ) {
        if !self.shutting_down() {
            gen.group(upstream).pool.put(backend, conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each group gets its full publish and sweep on exactly one tick of every second, and no
    /// tick takes more than its share of the groups (all at once was a 3 ms stall a second).
    #[test]
    fn heartbeat_work_is_spread_over_the_second() {
        let groups = 1000;
        for second in 0..3u64 {
            let mut seen = vec![0; groups];
            for tick in second * TICKS_PER_SECOND..(second + 1) * TICKS_PER_SECOND {
                let on: Vec<usize> = on_turn(groups, tick).collect();
                assert!(
                    on.len() <= groups.div_ceil(TICKS_PER_SECOND as usize),
                    "tick {tick}"
                );
                on.into_iter().for_each(|i| seen[i] += 1);
            }
            assert!(seen.iter().all(|&n| n == 1), "second {second}: {seen:?}");
        }
    }

    /// A group an attempt touched is published on the next tick, turn or not; one nobody
    /// touched waits for its turn, and its figures are then written in full.
    #[test]
    fn a_tick_publishes_the_touched_groups_and_its_turn() {
        use std::sync::atomic::Ordering::Relaxed;
        let mut text = String::from("[listeners.web]\naddr = \"127.0.0.1:0\"\n");
        for g in 0..100 {
            text += &format!(
                "[[routes]]\nhost = \"g{g}.test\"\nupstream = \"g{g:03}\"\n\
                 [upstreams.g{g:03}]\nservers = [\"10.0.0.1:80\", \"10.0.0.2:80\"]\n"
            );
        }
        let registry = crate::upstream::balancer::PolicyRegistry::with_builtins();
        let path = std::path::Path::new("t.toml");
        let snapshot = crate::config::compile::compile_str(path, &text, &registry).unwrap();
        let (gen, _) = Generation::new(1, Arc::new(snapshot), None);
        let in_flight = |g: usize, b: usize| {
            let health = &gen.snapshot.upstreams[g].health;
            health.backends[b].workers[0].in_flight.load(Relaxed)
        };
        // Tick 1's turn is groups 1, 21, 41, ...: 37 and 50 are not in it.
        gen.start(37, 1);
        gen.group(50).local[0].in_flight = 4;
        gen.publish(0, 1);
        assert_eq!(in_flight(37, 1), 1, "a touched group is published at once");
        assert_eq!(in_flight(50, 0), 0, "an untouched group waits for its turn");
        gen.end(37, 1, std::time::Duration::from_millis(1), true);
        gen.publish(0, 2);
        assert_eq!(in_flight(37, 1), 0, "and again after its attempt ended");
        gen.publish(0, 10);
        assert_eq!(in_flight(50, 0), 4, "its turn writes it in full");
    }
}
