//! Upstream side: balancing policies, per-worker group state and connection pools.

pub mod addr;
pub mod balancer;
pub(crate) mod connect;
pub(crate) mod discovery;
pub mod group;
pub mod health;
pub mod policies;
pub(crate) mod pool;
pub(crate) mod proxy_header;
pub(crate) mod search_client;
pub(crate) mod search_cluster;

use balancer::{BackendInfo, Picker};
use pool::Pool;

use crate::upstream::group::UpstreamGroup;

/// One worker's state for one upstream group: its picker and its idle connections.
pub(crate) struct GroupState {
    pub picker: Box<dyn Picker>,
    pub pool: Pool,
    pub budget: RetryBudget,
    /// For `h2`/`h2c` groups: one multiplexed connection per backend.
    pub h2: Vec<Option<H2Sender>>,
    /// This worker's in-flight count and latency EWMA per backend (published by the
    /// heartbeat for `/upstreams`; the policies keep their own state).
    pub local: Vec<LocalBackend>,
    /// The backup servers (`backup = true`), picked only while no other backend may be.
    /// Empty for most groups, which then pay one comparison.
    pub backups: balancer::BackendSet,
    /// Backends whose figures changed since the last publish (see [`GroupState::publish`]).
    dirty: Vec<u32>,
}

/// A worker's own running figures for one backend.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LocalBackend {
    pub in_flight: u32,
    pub ewma_us: f64,
    /// Listed in [`GroupState::dirty`].
    dirty: bool,
}

/// Weight of a new sample in the latency EWMA.
const EWMA_ALPHA: f64 = 0.1;

/// Groups up to this size publish every backend on a heartbeat tick when a request started or
/// ended on any of them since the last; larger ones only the backends it did; every group all
/// of them on a full publish (every second). A group nothing used since the last tick costs
/// nothing: with 1,000 groups, publishing each one's every backend on every tick took 3% of
/// a worker's time at 3,000 requests a second, and 5% once endpoint churn had spread the
/// groups' figures over the heap.
const PUBLISH_ALL_UP_TO: usize = 64;

impl GroupState {
    /// Picks a backend for `ctx`: the primaries first, the backups when every primary is
    /// excluded (down, ejected, at its limit or already tried).
    pub fn pick(&mut self, ctx: &balancer::PickContext) -> Option<usize> {
        if !self.backups.is_empty() {
            let mut primaries = ctx.clone();
            primaries.excluded.union_with(&self.backups);
            if let Some(i) = self.picker.pick(&primaries) {
                return Some(i);
            }
        }
        self.picker.pick(ctx)
    }

    /// An attempt on `backend` starts: tells the picker and counts it.
    pub fn start(&mut self, backend: usize) {
        self.picker.on_start(backend);
        if let Some(l) = self.local.get_mut(backend) {
            l.in_flight += 1;
            if !l.dirty {
                l.dirty = true;
                self.dirty.push(backend as u32);
            }
        }
    }

    /// An attempt on `backend` ended after `latency`.
    pub fn end(&mut self, backend: usize, latency: std::time::Duration, ok: bool) {
        self.picker.on_end(backend, latency, ok);
        if let Some(l) = self.local.get_mut(backend) {
            if !l.dirty {
                l.dirty = true;
                self.dirty.push(backend as u32);
            }
            l.in_flight = l.in_flight.saturating_sub(1);
            let x = latency.as_secs_f64() * 1e6;
            l.ewma_us = if l.ewma_us == 0.0 {
                x.max(1.0)
            } else {
                l.ewma_us + EWMA_ALPHA * (x - l.ewma_us)
            };
        }
    }

    /// Copies this worker's figures for `group` into the shared per-worker slots: every
    /// backend's when `all` (or the group is small and a request started or ended on it
    /// since the last publish), else only those of the backends a request started or ended
    /// on since, so that a tick costs a group of 10,000 what its traffic touched, not 10,000
    /// backends' worth of stores, and a group without traffic nothing. (A pool change alone,
    /// a connection returned after its request ended or swept, waits for the next full
    /// publish.)
    pub fn publish(&mut self, group: &UpstreamGroup, worker: usize, all: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let backends = &group.health.backends;
        let one = |this: &Self, b: usize| {
            let Some(slot) = backends.get(b).and_then(|h| h.workers.get(worker)) else {
                return;
            };
            let local = this.local.get(b).copied().unwrap_or_default();
            slot.in_flight.store(local.in_flight, Relaxed);
            slot.ewma_us.store(local.ewma_us as u64, Relaxed);
            slot.idle.store(this.pool.idle_count(b) as u32, Relaxed);
        };
        let dirty = std::mem::take(&mut self.dirty);
        if all || (backends.len() <= PUBLISH_ALL_UP_TO && !dirty.is_empty()) {
            (0..backends.len()).for_each(|b| one(self, b));
        } else {
            dirty.iter().for_each(|&b| one(self, b as usize));
        }
        for &b in &dirty {
            if let Some(l) = self.local.get_mut(b as usize) {
                l.dirty = false;
            }
        }
        self.dirty = dirty;
        self.dirty.clear();
    }
}

/// Runs hyper's tasks (streams, connection drivers) on the worker's own thread.
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: std::future::Future + 'static,
    F::Output: 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// The request body type sent to HTTP/2 upstreams.
pub(crate) type H2Body = http_body_util::combinators::UnsyncBoxBody<
    bytes::Bytes,
    Box<dyn std::error::Error + Send + Sync>,
>;

/// The sending half of an HTTP/2 upstream connection (its driver runs as a task).
pub(crate) type H2Sender = hyper::client::conn::http2::SendRequest<H2Body>;

/// Retry budget, per worker and group, over one-second windows: retries may add at most
/// `ratio` of the window's requests (Envoy's `retry_budget`), but at least
/// [`MIN_RETRIES_PER_WINDOW`] so a quiet service can still retry its occasional failure. Under
/// a full outage retries therefore add at most `ratio` extra load (plus that small floor).
pub(crate) struct RetryBudget {
    ratio: f64,
    window_start_ms: u64,
    requests: u32,
    retries: u32,
}

/// Retries always allowed per second, whatever the traffic.
pub(crate) const MIN_RETRIES_PER_WINDOW: u32 = 10;

impl RetryBudget {
    fn new(ratio: f64) -> Self {
        RetryBudget {
            ratio,
            window_start_ms: crate::clock::now_ms(),
            requests: 0,
            retries: 0,
        }
    }

    fn roll(&mut self) {
        let now = crate::clock::now_ms();
        if now.saturating_sub(self.window_start_ms) >= 1000 {
            self.window_start_ms = now;
            self.requests = 0;
            self.retries = 0;
        }
    }

    /// Called once per request routed to the group.
    #[inline]
    pub fn earn(&mut self) {
        self.roll();
        self.requests = self.requests.saturating_add(1);
    }

    /// Whether a retry would be allowed now (without spending it).
    pub fn available(&self) -> bool {
        let fresh = crate::clock::now_ms().saturating_sub(self.window_start_ms) >= 1000;
        fresh
            || self.retries
                < ((f64::from(self.requests) * self.ratio) as u32).max(MIN_RETRIES_PER_WINDOW)
    }

    pub fn try_spend(&mut self) -> bool {
        self.roll();
        let allowed = ((f64::from(self.requests) * self.ratio) as u32).max(MIN_RETRIES_PER_WINDOW);
        if self.retries < allowed {
            self.retries += 1;
            true
        } else {
            false
        }
    }
}

impl GroupState {
    /// `workers` shares a backend's `max_connections` out: each worker keeps at most its share
    /// idle, so one worker's idle pool cannot lock the others out of the backend.
    pub fn new(group: &UpstreamGroup, workers: usize) -> Self {
        let infos: Vec<BackendInfo> = group
            .backends
            .iter()
            .map(|b| BackendInfo {
                addr: b.addr.clone(),
                weight: b.weight,
            })
            .collect();
        GroupState {
            // A group whose servers are all discovered has none until DNS answers.
            picker: if infos.is_empty() {
                Box::new(NoBackends)
            } else {
                group.policy.new_picker(&infos)
            },
            pool: Pool::new(
                group.backends.len(),
                idle_cap(group, workers),
                group.idle_timeout,
                if group.max_connections == 0 {
                    group.pool_purge_delay
                } else {
                    std::time::Duration::ZERO
                },
            ),
            budget: RetryBudget::new(group.retry_budget),
            h2: (0..group.backends.len()).map(|_| None).collect(),
            local: vec![LocalBackend::default(); group.backends.len()],
            dirty: Vec::new(),
            backups: {
                let mut set = balancer::BackendSet::default();
                let backups = group.backends.iter().enumerate().filter(|(_, b)| b.backup);
                backups.for_each(|(i, _)| set.insert(i));
                set
            },
        }
    }
}

impl GroupState {
    /// Takes over from `old` (this worker's state for the group as it was, `was`) what stays
    /// true for `now`: the idle connections and running figures of the backends it kept (by
    /// address), and the retry budget. The picker starts afresh: its state is by index.
    /// Idle connections are kept only if they were made the same way (protocol, TLS
    /// settings, PROXY header).
    ///
    /// Returns the backends of `now` worth a warm connection (see `worker::warm`): the new
    /// ones, when this worker held idle connections to the backends the group kept (so its
    /// traffic reuses pooled HTTP/1 connections, which a new backend has none of yet).
    /// Empty for a stream group, an idle one, one without pooling or with PROXY headers.
    /// Also returns the idle connections it did not take (to backends the group no longer
    /// has, or made another way), for the caller to close off the request path (see
    /// `worker::retire`).
    pub(crate) fn adopt(
        &mut self,
        old: &mut GroupState,
        was: &UpstreamGroup,
        now: &UpstreamGroup,
    ) -> (Vec<usize>, Vec<pool::Idle>) {
        self.budget = RetryBudget {
            ratio: self.budget.ratio,
            ..old.budget
        };
        let index: std::collections::HashMap<&addr::BackendAddr, usize> = was
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| (&b.addr, i))
            .collect();
        let conns = same_transport(was, now);
        let (mut added, mut pooled) = (Vec::new(), 0);
        for (nb, b) in now.backends.iter().enumerate() {
            let Some(&ob) = index.get(&b.addr) else {
                added.push(nb);
                continue;
            };
            if let (Some(l), Some(o)) = (self.local.get_mut(nb), old.local.get(ob)) {
                *l = LocalBackend { dirty: false, ..*o };
            }
            if conns {
                let idle = old.pool.take_all(ob);
                pooled += idle.len();
                self.pool.adopt(nb, idle);
            }
        }
        if pooled == 0 || !warmable(now) {
            added.clear();
        }
        (added, old.pool.take_rest())
    }
}

/// Whether a new backend of `group` may be given a connection before a request needs one:
/// HTTP/1 (an `h2` group opens its one connection per backend itself), pooled, without
/// PROXY headers (those connections belong to one client each), not a search cluster.
fn warmable(group: &UpstreamGroup) -> bool {
    group.protocol == group::UpstreamProtocol::Http1
        && group.keepalive > 0
        && group.proxy_protocol == 0
        && group.search.is_none()
}

/// Whether connections made for group `a` serve group `b` as well.
pub(crate) fn same_transport(a: &UpstreamGroup, b: &UpstreamGroup) -> bool {
    a.protocol == b.protocol
        && a.proxy_protocol == b.proxy_protocol
        && a.tls.is_some() == b.tls.is_some()
        && a.ca_file == b.ca_file
        && a.tls_verify == b.tls_verify
        && a.tls_server_name == b.tls_server_name
}

/// Whether a worker's state for group `a` serves `b` unchanged: the same backends in the same
/// order (address, weight, backup), policy, pool and retry settings, and transport. A reload
/// that leaves a group alone, or a change to another group, keeps its state (see
/// `worker::Generation`). Linear in the group's size.
pub(crate) fn same_state(a: &UpstreamGroup, b: &UpstreamGroup) -> bool {
    let same_backends = a.backends.len() == b.backends.len()
        && a.backends
            .iter()
            .zip(&b.backends)
            .all(|(x, y)| x.addr == y.addr && x.weight == y.weight && x.backup == y.backup);
    same_backends
        && a.name == b.name
        && a.policy.name() == b.policy.name()
        && a.keepalive == b.keepalive
        && a.max_connections == b.max_connections
        && a.idle_timeout == b.idle_timeout
        && a.pool_purge_delay == b.pool_purge_delay
        && a.retry_budget == b.retry_budget
        && same_transport(a, b)
}

/// The picker of a group with no backends (yet): every request is a 503.
struct NoBackends;

impl balancer::Picker for NoBackends {
    fn pick(&mut self, _: &balancer::PickContext) -> Option<usize> {
        None
    }
}

fn idle_cap(group: &UpstreamGroup, workers: usize) -> usize {
    if group.max_connections == 0 {
        group.keepalive
    } else {
        group
            .keepalive
            .min((group.max_connections / workers.max(1)).max(1))
    }
}

/// What a request offers for hashing and rate-limit keys, whatever its HTTP version.
pub(crate) struct RequestKeys<'a, H, C> {
    pub client_ip: &'a str,
    /// The path without the query.
    pub path: &'a str,
    /// First value of a header (lowercase name).
    pub header: H,
    /// The values of every Cookie header.
    pub cookies: C,
}

impl<'a, H, C> RequestKeys<'a, H, C>
where
    H: Fn(&str) -> Option<&'a [u8]>,
    C: Iterator<Item = &'a [u8]>,
{
    /// Hash of the part of the request named by a group's `hash_key`.
    pub fn hash(self, key: &crate::upstream::group::HashKey) -> u64 {
        use crate::upstream::group::HashKey;
        use policies::hash_bytes;
        match key {
            HashKey::ClientIp => hash_bytes(self.client_ip.as_bytes(), 0),
            HashKey::Path => hash_bytes(self.path.as_bytes(), 0),
            HashKey::Header(h) => hash_bytes((self.header)(h).unwrap_or(b""), 0),
            HashKey::Cookie(name) => {
                let value = crate::http1::cookie_value(self.cookies, name).unwrap_or(b"");
                hash_bytes(value, 0)
            }
        }
    }

    /// The bucket key of a route's rate limit.
    pub fn rate_key(&self, key: &crate::limits::RateKey) -> u64 {
        use crate::limits::RateKey;
        use policies::hash_bytes;
        match key {
            RateKey::ClientIp => hash_bytes(self.client_ip.as_bytes(), 0),
            RateKey::Route => 0,
            RateKey::Header(h) => hash_bytes((self.header)(h).unwrap_or(b""), 0),
            RateKey::Index => {
                let first = self.path.split('/').find(|s| !s.is_empty()).unwrap_or("");
                let index = if first.starts_with('_') { "" } else { first };
                hash_bytes(index.as_bytes(), 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_group_publishes_the_backends_used_and_all_of_them_when_asked() {
        use std::sync::atomic::Ordering::Relaxed;
        let servers: Vec<String> = (0..1_000)
            .map(|i| format!("\"10.0.{}.{}:80\"", i / 250, i % 250 + 1))
            .collect();
        let text = format!(
            "[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n\
             [upstreams.app]\nservers = [{}]\n",
            servers.join(", ")
        );
        let registry = balancer::PolicyRegistry::with_builtins();
        let snapshot =
            crate::config::compile::compile_str(std::path::Path::new("t.toml"), &text, &registry)
                .unwrap();
        let group = &snapshot.upstreams[0];
        let mut state = GroupState::new(group, 1);
        let in_flight = |b: usize| group.health.backends[b].workers[0].in_flight.load(Relaxed);
        state.start(7);
        state.start(900);
        state.start(900);
        state.end(900, std::time::Duration::from_millis(1), true);
        // A figure changed without a request (as a pool change would be): not published yet.
        state.local[500].in_flight = 5;
        state.publish(group, 0, false);
        assert_eq!((in_flight(7), in_flight(900), in_flight(500)), (1, 1, 0));
        assert!(state.dirty.is_empty() && !state.local[7].dirty);
        state.end(7, std::time::Duration::from_millis(1), true);
        state.publish(group, 0, false);
        assert_eq!(
            in_flight(7),
            0,
            "a backend is published again when used again"
        );
        state.publish(group, 0, true);
        assert_eq!(in_flight(500), 5, "a full publish writes every backend");
    }

    #[test]
    fn a_small_group_publishes_only_after_a_request_used_it() {
        use std::sync::atomic::Ordering::Relaxed;
        let text = "[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n\
                    [upstreams.app]\nservers = [\"10.0.0.1:80\", \"10.0.0.2:80\"]\n";
        let registry = balancer::PolicyRegistry::with_builtins();
        let snapshot =
            crate::config::compile::compile_str(std::path::Path::new("t.toml"), text, &registry)
                .unwrap();
        let group = &snapshot.upstreams[0];
        let mut state = GroupState::new(group, 1);
        let in_flight = |b: usize| group.health.backends[b].workers[0].in_flight.load(Relaxed);
        // A figure changed without a request: a tick leaves the group alone.
        state.local[1].in_flight = 5;
        state.publish(group, 0, false);
        assert_eq!(in_flight(1), 0, "an unused group is not published");
        // A request on one backend: the tick publishes the whole (small) group.
        state.start(0);
        state.publish(group, 0, false);
        assert_eq!((in_flight(0), in_flight(1)), (1, 5));
        state.local[1].in_flight = 2;
        state.publish(group, 0, true);
        assert_eq!(in_flight(1), 2, "a full publish writes every group");
    }

    /// A change that removes a backend hands its idle connections back for closing off the
    /// request path (`worker::retire`), rather than leaving them to close all at once with
    /// the old generation, and the kept backend's connection moves to the new state.
    #[tokio::test]
    async fn a_removed_backends_idle_connections_are_handed_back() {
        use pool::{reserve_slot, UpstreamConn};
        let (a, b) = (
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        );
        let (a, b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let compile = |servers: &str| {
            let text = format!(
                "[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n\
                 [upstreams.app]\nservers = [{servers}]\n"
            );
            let registry = balancer::PolicyRegistry::with_builtins();
            let path = std::path::Path::new("t.toml");
            crate::config::compile::compile_str(path, &text, &registry).unwrap()
        };
        let was = compile(&format!("\"{a}\", \"{b}\""));
        let now = compile(&format!("\"{a}\""));
        let (was, now) = (&was.upstreams[0], &now.upstreams[0]);
        let mut old = GroupState::new(was, 1);
        for (i, addr) in [a, b].into_iter().enumerate() {
            let health = was.health.backends[i].clone();
            assert!(reserve_slot(&health, 0));
            let io =
                crate::tls::UpstreamIo::Plain(tokio::net::TcpStream::connect(addr).await.unwrap());
            old.pool
                .put(i, UpstreamConn::with_reserved_slot(io, health));
        }
        let mut state = GroupState::new(now, 1);
        let (_, retired) = state.adopt(&mut old, was, now);
        assert_eq!(retired.len(), 1, "the removed backend's idle connection");
        assert_eq!(state.pool.idle_count(0), 1, "the kept backend's, adopted");
        assert_eq!((old.pool.idle_count(0), old.pool.idle_count(1)), (0, 0));
    }

    #[test]
    fn retry_budget_caps_retries_at_the_ratio() {
        let mut b = RetryBudget::new(0.2);
        let mut retries = 0;
        for _ in 0..1000 {
            b.earn();
            if b.try_spend() {
                retries += 1;
            }
        }
        // 20% of 1000 (all in one window on any sane machine).
        assert_eq!(retries, 200);
        let mut quiet = RetryBudget::new(0.2);
        quiet.earn();
        assert!(
            (0..MIN_RETRIES_PER_WINDOW).all(|_| quiet.try_spend()),
            "a quiet service may retry"
        );
        assert!(!quiet.try_spend());
    }
}
