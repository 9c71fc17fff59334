//! Backend health shared by all workers: active checks, passive outlier ejection, and the
//! set of down backends workers read with one relaxed load per 64 backends per request.
//!
//! Writers are rare (a check flips, a backend gets ejected or comes back); readers are every
//! request. So the state is a handful of atomics per backend plus one bitmask per group, and
//! one `veloxy-health` thread for the whole process runs the active checks and ends ejections.

use crate::upstream::addr::BackendAddr;
use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::clock;
use crate::upstream::balancer::BackendSet;
use crate::upstream::group::UpstreamGroup;

/// At most this many backends per group: a bound on a config or a discovery answer (the
/// consistent-hash table names backends in 16 bits, one value kept as its empty mark), not
/// a limit of the other data structures (sets of backends have one bit each, any number of
/// words).
pub const MAX_BACKENDS: usize = 65_535;

#[cfg(test)]
thread_local! {
    /// Words of a group's down set read by [`GroupHealth::down_set`] on this thread.
    static WORDS_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `[upstreams.NAME.health]`, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    /// HTTP path to GET; `None` = TCP connect check.
    pub path: Option<String>,
    /// Host header for HTTP checks; default the backend address.
    pub host: Option<String>,
    /// Time between two checks of a backend.
    pub interval: Duration,
    /// Time a check may take; longer is a failure.
    pub timeout: Duration,
    /// Consecutive passes to mark a down backend up.
    pub healthy: u32,
    /// Consecutive failures to mark an up backend down.
    pub unhealthy: u32,
    /// Statuses that pass an HTTP check.
    pub expect_status: RangeInclusive<u16>,
}

/// `[upstreams.NAME.outlier]`, compiled.
#[derive(Debug, Clone)]
pub struct Outlier {
    /// Consecutive failures (connect errors, resets, timeouts, and 5xx if `on_5xx`) that eject
    /// a backend. Default 5; 0 disables ejection.
    pub consecutive_failures: u32,
    /// First ejection length; each further ejection in a row doubles it. Default 10s.
    pub base_ejection: Duration,
    /// Cap on the ejection length. Default 300s.
    pub max_ejection: Duration,
    /// Never eject more than this share of the group (at least one backend can always be
    /// ejected when there are two or more). Default 50.
    pub max_ejected_percent: u32,
    /// Count 5xx responses as failures. Default true.
    pub on_5xx: bool,
}

impl Default for Outlier {
    fn default() -> Self {
        Outlier {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
            on_5xx: true,
        }
    }
}

/// One backend's shared state.
#[derive(Debug)]
pub struct BackendHealth {
    /// The backend's address.
    pub addr: BackendAddr,
    /// Result of active checks (true until a check says otherwise).
    pub active_up: AtomicBool,
    /// Consecutive active-check results against the current state.
    check_streak: AtomicU32,
    /// Passive: ms timestamp (the process's coarse clock) the ejection ends; 0 = not ejected.
    pub ejected_until_ms: AtomicU64,
    /// Failures in a row (passive checks).
    pub consecutive_failures: AtomicU32,
    /// Ejections in a row without a success in between (drives the back-off).
    ejections: AtomicU32,
    /// Open upstream connections to this backend, across workers.
    pub open_connections: AtomicUsize,
    /// Active checks passed.
    pub checks_passed: AtomicU64,
    /// Active checks failed.
    pub checks_failed: AtomicU64,
    /// What each worker last published about this backend (index = worker id); each slot has
    /// one writer, its worker's heartbeat, so the request path touches none of it.
    pub workers: Box<[WorkerView]>,
    /// Runtime API: 1 drained (`POST .../drain`: no new requests, in-flight ones finish),
    /// 2 removed (`DELETE`), 0 in service. Kept over a reload only with
    /// `runtime_overrides = "keep"`.
    pub drained: std::sync::atomic::AtomicU8,
}

/// One worker's view of a backend, published every heartbeat tick (50 ms) for `/upstreams`.
#[derive(Debug, Default)]
pub struct WorkerView {
    /// Requests this worker has in flight to the backend.
    pub in_flight: AtomicU32,
    /// Idle connections in this worker's pool.
    pub idle: AtomicU32,
    /// EWMA of this worker's upstream latency to the backend, in microseconds; 0 = no sample.
    pub ewma_us: AtomicU64,
}

impl BackendHealth {
    /// Health state for a backend served by one worker.
    pub fn new(addr: BackendAddr) -> Self {
        Self::with_workers(addr, 1)
    }

    /// A backend's record with a published-view slot for each of `workers` workers.
    pub fn with_workers(addr: BackendAddr, workers: usize) -> Self {
        BackendHealth {
            addr,
            active_up: AtomicBool::new(true),
            check_streak: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            open_connections: AtomicUsize::new(0),
            checks_passed: AtomicU64::new(0),
            checks_failed: AtomicU64::new(0),
            workers: (0..workers.max(1)).map(|_| WorkerView::default()).collect(),
            drained: std::sync::atomic::AtomicU8::new(0),
        }
    }

    fn is_down(&self) -> bool {
        !self.active_up.load(Ordering::Relaxed)
            || self.ejected_until_ms.load(Ordering::Relaxed) != 0
            || self.drained.load(Ordering::Relaxed) != 0
    }
}

/// A group's backends and the set of those down (backend i must not get new requests).
#[derive(Debug)]
pub struct GroupHealth {
    /// Each backend's state, by index in the group.
    pub backends: Vec<Arc<BackendHealth>>,
    /// Bit i of word i / 64 set: backend i is down, ejected or drained.
    down: Box<[AtomicU64]>,
    /// For groups of more than 64 backends: bit j set when a word of `down` in chunk j (words
    /// `j * chunk` to `j * chunk + chunk - 1`) may have a bit set, so that a pick reads one
    /// word while the whole group is up, not one per 64 backends.
    summary: AtomicU64,
    /// Words of `down` a bit of `summary` stands for (at most 16 for the largest groups).
    chunk: usize,
    /// Bit i of word i / 64 set: backend i may have failures or ejections to forget on its
    /// next success. A success reads this dense word (1.25 KiB for 10,000 backends, warm in
    /// cache) rather than the backend's own record, a cache miss in a large group where each
    /// request goes to another backend.
    failing: Box<[AtomicU64]>,
    /// Held by [`GroupHealth::recompute`] (health thread, admin drains) and by an ejection's
    /// marking (a worker, rarely): a recompute's stores of `down` and `summary` would
    /// otherwise overwrite a mark made between its read of the backends and its store, and
    /// the ejected backend stay picked until the next recompute. Never taken by a pick.
    marking: std::sync::Mutex<()>,
}

impl GroupHealth {
    /// A group of these backends, all usable.
    pub fn new(backends: Vec<Arc<BackendHealth>>) -> Self {
        let words = backends.len().div_ceil(64).max(1);
        let g = GroupHealth {
            backends,
            down: (0..words).map(|_| AtomicU64::new(0)).collect(),
            summary: AtomicU64::new(0),
            chunk: words.div_ceil(64),
            failing: (0..words).map(|_| AtomicU64::new(0)).collect(),
            marking: std::sync::Mutex::new(()),
        };
        // Backends carried over from the group before with a failure streak keep it.
        for (i, b) in g.backends.iter().enumerate() {
            if b.consecutive_failures.load(Ordering::Relaxed) != 0
                || b.ejections.load(Ordering::Relaxed) != 0
            {
                g.mark_failing(i);
            }
        }
        g.recompute();
        g
    }

    /// Runtime API: sets backend `i`'s state (0 in service, 1 drained, 2 removed); every
    /// worker sees it at its next pick.
    pub fn set_drained(&self, i: usize, state: u8) {
        if let Some(b) = self.backends.get(i) {
            b.drained.store(state, Ordering::Relaxed);
            self.recompute();
        }
    }

    /// Backends that must not be picked now: one relaxed load while the group is up, plus
    /// at most 16 for each chunk of the group that has a backend down (see `summary`), so
    /// the cost does not grow with the group.
    #[inline]
    pub fn down_set(&self) -> BackendSet {
        if let [one] = &*self.down {
            return BackendSet::from_word(one.load(Ordering::Relaxed));
        }
        let mut set = BackendSet::default();
        let mut marks = self.summary.load(Ordering::Relaxed);
        while marks != 0 {
            let j = marks.trailing_zeros() as usize;
            marks &= marks - 1;
            let from = j * self.chunk;
            let words = self.down.iter().enumerate().skip(from).take(self.chunk);
            for (w, word) in words {
                #[cfg(test)]
                WORDS_READ.with(|r| r.set(r.get() + 1));
                set.push_word(w, word.load(Ordering::Relaxed));
            }
        }
        set
    }

    /// Marks word `w` of `down` as possibly non-empty in `summary`.
    fn mark(&self, w: usize) {
        if self.down.len() > 1 {
            self.summary
                .fetch_or(1 << (w / self.chunk), Ordering::Relaxed);
        }
    }

    fn recompute(&self) {
        let _held = self.marking.lock().unwrap_or_else(|e| e.into_inner());
        let mut marks = 0u64;
        for (w, word) in self.down.iter().enumerate() {
            let bits = self
                .backends
                .iter()
                .enumerate()
                .skip(64 * w)
                .take(64)
                .filter(|(_, b)| b.is_down())
                .fold(0u64, |m, (i, _)| m | (1 << (i % 64)));
            word.store(bits, Ordering::Relaxed);
            if bits != 0 {
                marks |= 1 << (w / self.chunk);
            }
        }
        self.summary.store(marks, Ordering::Relaxed);
    }

    /// Backend `i`'s word of `failing` and its bit there.
    fn failing_bit(&self, i: usize) -> (&AtomicU64, u64) {
        (&self.failing[i / 64], 1u64 << (i % 64))
    }

    /// Sets backend `i`'s bit of `failing`, reading first: a bit already set writes nothing.
    fn mark_failing(&self, i: usize) {
        let (word, bit) = self.failing_bit(i);
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// A request to backend `i` succeeded (for outlier purposes).
    #[inline]
    pub fn record_success(&self, i: usize) {
        let (word, bit) = self.failing_bit(i);
        // Read first: the common case writes nothing, so the line stays shared between cores.
        if word.load(Ordering::Relaxed) & bit == 0 {
            return;
        }
        word.fetch_and(!bit, Ordering::Relaxed);
        let b = &self.backends[i];
        b.consecutive_failures.store(0, Ordering::Relaxed);
        b.ejections.store(0, Ordering::Relaxed);
    }

    /// A request to backend `i` failed; ejects it when the streak reaches the threshold and
    /// the group can spare it. Returns true if this call ejected it.
    pub fn record_failure(&self, i: usize, outlier: &Outlier) -> bool {
        if outlier.consecutive_failures == 0 {
            return false;
        }
        let b = &self.backends[i];
        let n = b.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        // After the count: a success between the two stores clears the bit or finds it set,
        // and either leaves the streak as if it came before or after this failure.
        self.mark_failing(i);
        if n < outlier.consecutive_failures || b.ejected_until_ms.load(Ordering::Relaxed) != 0 {
            return false;
        }
        let total = self.backends.len();
        let ejected = self
            .backends
            .iter()
            .filter(|x| x.ejected_until_ms.load(Ordering::Relaxed) != 0)
            .count();
        let allowed =
            ((total * outlier.max_ejected_percent as usize) / 100).max(usize::from(total > 1));
        if ejected >= allowed {
            return false;
        }
        let k = b.ejections.fetch_add(1, Ordering::Relaxed).min(16);
        let length = outlier
            .base_ejection
            .saturating_mul(1u32 << k.min(16))
            .min(outlier.max_ejection);
        let until = clock::now_ms() + length.as_millis() as u64;
        if b.ejected_until_ms
            .compare_exchange(0, until, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        EJECTIONS_STARTED.fetch_add(1, Ordering::Release);
        b.consecutive_failures.store(0, Ordering::Relaxed);
        let held = self.marking.lock().unwrap_or_else(|e| e.into_inner());
        self.down[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
        self.mark(i / 64);
        drop(held);
        tracing::warn!(backend = %b.addr, failures = n, ejection = ?length, "backend ejected (outlier)");
        true
    }

    /// Ends ejections whose time is up; returns whether a backend is still ejected. Called
    /// by the health thread. Only the backends down are looked at (an ejected one is), so a
    /// tick costs a group of 10,000 a summary word while all are up.
    fn expire_ejections(&self, now_ms: u64) -> bool {
        let (mut changed, mut left) = (false, false);
        let down = self.down_set();
        for b in down.members().filter_map(|i| self.backends.get(i)) {
            let until = b.ejected_until_ms.load(Ordering::Relaxed);
            if until != 0 && until <= now_ms {
                b.ejected_until_ms.store(0, Ordering::Relaxed);
                tracing::info!(backend = %b.addr, "ejection ended");
                changed = true;
            } else if until != 0 {
                left = true;
            }
        }
        if changed {
            self.recompute();
        }
        left
    }

    /// Applies one active-check result for backend `i`.
    fn apply_check(&self, i: usize, passed: bool, check: &HealthCheck) {
        let b = &self.backends[i];
        let counter = if passed {
            &b.checks_passed
        } else {
            &b.checks_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // Like Envoy's `successful_active_health_check_uneject_host`: a passing active check
        // ends an outlier ejection, so a restarted backend is back as soon as it answers.
        if passed && b.ejected_until_ms.swap(0, Ordering::Relaxed) != 0 {
            b.consecutive_failures.store(0, Ordering::Relaxed);
            tracing::info!(backend = %b.addr, "health check passed: ejection ended");
            self.recompute();
        }
        let up = b.active_up.load(Ordering::Relaxed);
        if passed == up {
            b.check_streak.store(0, Ordering::Relaxed);
            return;
        }
        let streak = b.check_streak.fetch_add(1, Ordering::Relaxed) + 1;
        let needed = if up { check.unhealthy } else { check.healthy };
        if streak >= needed {
            b.check_streak.store(0, Ordering::Relaxed);
            b.active_up.store(passed, Ordering::Relaxed);
            if passed {
                tracing::info!(backend = %b.addr, "health check: backend up");
            } else {
                tracing::warn!(backend = %b.addr, "health check: backend down");
            }
            self.recompute();
        }
    }
}

/// Carries health state over a reload: backends of the same group and address keep theirs.
/// `workers`: the new config's worker count.
pub fn adopt(old: &[Arc<UpstreamGroup>], new: &mut [Arc<UpstreamGroup>], workers: usize) {
    let by_name: std::collections::HashMap<&str, &UpstreamGroup> =
        old.iter().map(|g| (g.name.as_str(), &**g)).collect();
    for g in new {
        let Some(prev) = by_name.get(g.name.as_str()) else {
            continue;
        };
        let g = Arc::make_mut(g);
        if !g.keep_runtime_overrides {
            // The file's set wins: backends drained or removed at run time serve again.
            for b in &prev.health.backends {
                b.drained.store(0, Ordering::Relaxed);
            }
        }
        g.health = carry(&prev.health, &g.backends, workers);
    }
}

/// The health of a group that now has `backends`: those at an address `prev` knows keep their
/// state, others start usable.
pub(crate) fn carry(
    prev: &GroupHealth,
    backends: &[super::group::Backend],
    workers: usize,
) -> Arc<GroupHealth> {
    // By address through a map: a group of 10,000 changes in linear time.
    let known: HashMap<&BackendAddr, &Arc<BackendHealth>> =
        prev.backends.iter().map(|h| (&h.addr, h)).collect();
    let backends = backends
        .iter()
        .map(|b| match known.get(&b.addr) {
            Some(h) => Arc::clone(h),
            None => Arc::new(BackendHealth::with_workers(b.addr.clone(), workers)),
        })
        .collect();
    Arc::new(GroupHealth::new(backends))
}

/// TLS settings for probing `https://` backends: the group's client config and the name.
pub type ProbeTls = (
    Arc<rustls::ClientConfig>,
    rustls::pki_types::ServerName<'static>,
);

/// Runs one probe: TCP connect (plus the TLS handshake for `https://` backends), or an HTTP GET
/// whose status must fall in `expect_status`. `None` when the probe could not even open its
/// socket because this process is out of descriptors, ports or memory: that says nothing
/// about the backend, so it is no result at all.
pub async fn probe(
    addr: &BackendAddr,
    check: &HealthCheck,
    tls: Option<&ProbeTls>,
) -> Option<bool> {
    let attempt = async {
        let tcp_addr = match addr {
            BackendAddr::Tcp(a) => *a,
            BackendAddr::Unix(path) => {
                return match tokio::net::UnixStream::connect(path).await {
                    Ok(s) => Ok(http_probe(s, addr, check).await == Some(true)),
                    Err(e) if crate::error::is_local_resource_error(&e) => Err(e),
                    Err(_) => Ok(false),
                };
            }
        };
        let tcp = match tokio::net::TcpStream::connect(tcp_addr).await {
            Ok(tcp) => tcp,
            Err(e) if crate::error::is_local_resource_error(&e) => return Err(e),
            Err(_) => return Ok(false),
        };
        let passed = match tls {
            None => http_probe(tcp, addr, check).await,
            Some((config, name)) => {
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                match connector.connect(name.clone(), tcp).await {
                    Ok(s) => http_probe(s, addr, check).await,
                    Err(_) => None,
                }
            }
        };
        Ok(passed == Some(true))
    };
    match tokio::time::timeout(check.timeout, attempt).await {
        Err(_) => Some(false),
        Ok(Ok(passed)) => Some(passed),
        Ok(Err(e)) => {
            tracing::debug!(backend = %addr, error = %e, "health check skipped: out of local resources");
            None
        }
    }
}

async fn http_probe<S>(mut s: S, addr: &BackendAddr, check: &HealthCheck) -> Option<bool>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    {
        let Some(path) = &check.path else {
            return Some(true);
        };
        let host = match (&check.host, addr) {
            (Some(h), _) => h.clone(),
            (None, BackendAddr::Tcp(a)) => a.to_string(),
            (None, BackendAddr::Unix(_)) => "localhost".to_owned(),
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: veloxy-health\r\nConnection: close\r\n\r\n");
        crate::tls::send_all(&mut s, req.as_bytes()).await.ok()?;
        let mut buf = Vec::with_capacity(1024);
        loop {
            if s.read_buf(&mut buf).await.ok()? == 0 || buf.len() > 64 * 1024 {
                return Some(false);
            }
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut res = httparse::Response::new(&mut headers);
            match res.parse(&buf) {
                Ok(httparse::Status::Complete(_)) => {
                    return Some(check.expect_status.contains(&res.code.unwrap_or(0)))
                }
                Ok(httparse::Status::Partial) => {}
                Err(_) => return Some(false),
            }
        }
    }
}

/// Starts the process-wide health thread. It follows config changes through `snapshots`
/// (the upstream groups of each new config): one task expires ejections in every group, and
/// one task per checked backend probes it. A change keeps the probes of every group it left
/// alone (the same health state and check); a changed group's probes restart, those of the
/// backends it kept at a random point of their interval (no burst of probes at each change,
/// as there would be at 1,000 changes a second), new backends at once.
pub(crate) fn spawn_thread(
    mut snapshots: tokio::sync::watch::Receiver<Arc<[Arc<UpstreamGroup>]>>,
) -> std::io::Result<()> {
    crate::background::spawn("veloxy-health", move || async move {
        let groups = snapshots.clone();
        let expiry = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut clean_at = None;
            loop {
                tick.tick().await;
                let started = EJECTIONS_STARTED.load(Ordering::Acquire);
                if should_scan(clean_at, started) {
                    let now = clock::now_ms();
                    let mut left = false;
                    for g in groups.borrow().iter() {
                        left |= g.health.expire_ejections(now);
                    }
                    clean_at = (!left).then_some(started);
                }
            }
        });
        let mut probes: HashMap<String, Probes> = HashMap::new();
        let mut rng = crate::upstream::policies::Rng::seeded();
        loop {
            let snapshot = snapshots.borrow_and_update().clone();
            let mut next = HashMap::with_capacity(probes.len());
            for group in snapshot.iter() {
                let Some(check) = &group.health_check else {
                    continue;
                };
                let kept = match probes.remove(&group.name) {
                    Some(p) if Arc::ptr_eq(&p.health, &group.health) && p.check == *check => p,
                    prev => Probes::start(group, check, prev, &mut rng),
                };
                next.insert(group.name.clone(), kept);
            }
            // Groups gone or unchecked: their probes stop as they drop.
            probes = next;
            if snapshots.changed().await.is_err() {
                expiry.abort();
                return;
            }
        }
    })?;
    Ok(())
}

/// Ejections started in this process (an outlier's `compare_exchange` that won). The health
/// thread's expiry tick scans every group only when this moved since a scan that found no
/// backend ejected: with 1,000 groups and none ejected, the scan was 0.6 ms of the core every
/// 100 ms (each group's health a few cold cache lines), beside the workers (`perf`, issue
/// 37's churn benchmark). An ejection counted after a scan read the count makes the next
/// tick scan; carried over a reload, one was already there when the last scan looked.
static EJECTIONS_STARTED: AtomicU64 = AtomicU64::new(0);

/// Whether the expiry tick scans the groups: not when no ejection started since the scan
/// that found none left (`clean_at`: the count that scan read).
fn should_scan(clean_at: Option<u64>, started: u64) -> bool {
    clean_at != Some(started)
}

/// The probe tasks of one group, stopped when dropped.
struct Probes {
    health: Arc<GroupHealth>,
    check: HealthCheck,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

impl Probes {
    /// One probe task per backend of `group`; `prev` (stopped here) tells which backends
    /// were already probed, so they resume at a random point of the interval.
    fn start(
        group: &UpstreamGroup,
        check: &HealthCheck,
        prev: Option<Probes>,
        rng: &mut crate::upstream::policies::Rng,
    ) -> Probes {
        let known: std::collections::HashSet<BackendAddr> = prev
            .iter()
            .flat_map(|p| p.health.backends.iter().map(|b| b.addr.clone()))
            .collect();
        drop(prev);
        let interval_ms = check.interval.as_millis().max(1) as usize;
        let tasks = (0..group.backends.len())
            .map(|i| {
                let health = group.health.clone();
                let check = check.clone();
                let tls: Option<ProbeTls> =
                    group.tls.clone().zip(group.backends[i].tls_name.clone());
                let phase = if known.contains(&health.backends[i].addr) {
                    Duration::from_millis(rng.below(interval_ms) as u64)
                } else {
                    Duration::ZERO
                };
                tokio::spawn(async move {
                    let addr = health.backends[i].addr.clone();
                    let start = tokio::time::Instant::now() + phase;
                    let mut tick = tokio::time::interval_at(start, check.interval);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        if let Some(passed) = probe(&addr, &check, tls.as_ref()).await {
                            health.apply_check(i, passed, &check);
                        }
                    }
                })
            })
            .collect();
        Probes {
            health: group.health.clone(),
            check: check.clone(),
            tasks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: usize) -> GroupHealth {
        GroupHealth::new(
            (0..n)
                .map(|i| {
                    Arc::new(BackendHealth::new(
                        format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
                    ))
                })
                .collect(),
        )
    }

    /// A TCP check needing two results in a row either way.
    fn tcp_check() -> HealthCheck {
        HealthCheck {
            path: None,
            host: None,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            healthy: 2,
            unhealthy: 2,
            expect_status: 200..=399,
        }
    }

    /// Words `down_set` reads for `g`, and the set.
    fn read_down(g: &GroupHealth) -> (usize, BackendSet) {
        WORDS_READ.with(|r| r.set(0));
        let set = g.down_set();
        (WORDS_READ.with(|r| r.get()), set)
    }

    #[test]
    fn down_set_of_a_large_group_reads_only_chunks_with_a_backend_down() {
        let g = group(10_000);
        let (words, set) = read_down(&g);
        assert_eq!(
            (words, set.is_empty()),
            (0, true),
            "all up: the summary word alone"
        );
        // Drained (recompute) and ejected (record_failure) backends far apart.
        g.set_drained(9_999, 1);
        let outlier = Outlier {
            consecutive_failures: 1,
            ..Outlier::default()
        };
        assert!(g.record_failure(70, &outlier));
        let (words, set) = read_down(&g);
        assert!(
            words <= 2 * g.chunk,
            "read {words} words of {}",
            g.down.len()
        );
        assert!(set.contains(9_999) && set.contains(70) && !set.contains(71));
        assert_eq!(
            set.extra_words(),
            2,
            "the set holds the two non-empty words"
        );
        g.set_drained(9_999, 0);
        g.expire_ejections(u64::MAX);
        assert_eq!(read_down(&g), (0, BackendSet::default()));
    }

    #[test]
    fn the_expiry_tick_scans_again_only_after_an_ejection_started() {
        assert!(should_scan(None, 0), "the first tick scans");
        assert!(
            !should_scan(Some(7), 7),
            "nothing ejected since a clean scan"
        );
        assert!(should_scan(Some(7), 8), "an ejection started since");
        let g = group(4);
        let o = Outlier {
            consecutive_failures: 1,
            ..Outlier::default()
        };
        let before = EJECTIONS_STARTED.load(Ordering::Acquire);
        assert!(g.record_failure(2, &o));
        assert!(EJECTIONS_STARTED.load(Ordering::Acquire) > before);
        assert!(g.expire_ejections(0), "still ejected: a scan is not clean");
        assert!(!g.expire_ejections(u64::MAX), "expired: nothing left");
        assert_eq!(g.down_set(), BackendSet::default());
    }

    #[test]
    fn ejection_threshold_backoff_and_cap() {
        let g = group(4);
        let o = Outlier {
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(3),
            max_ejected_percent: 50,
            on_5xx: true,
        };
        assert!(!g.record_failure(0, &o));
        assert!(!g.record_failure(0, &o));
        assert!(g.record_failure(0, &o));
        assert_eq!(g.down_set(), BackendSet::from_word(0b1));
        // 50% of 4: a second backend may go, a third may not.
        for _ in 0..3 {
            g.record_failure(1, &o);
        }
        for _ in 0..3 {
            g.record_failure(2, &o);
        }
        assert_eq!(g.down_set(), BackendSet::from_word(0b11));
        // Expiry brings them back; the back-off doubles for a repeat offender, up to the cap.
        g.expire_ejections(u64::MAX);
        assert_eq!(g.down_set(), BackendSet::from_word(0));
        for _ in 0..3 {
            g.record_failure(0, &o);
        }
        let until = g.backends[0].ejected_until_ms.load(Ordering::Relaxed);
        let len = until - clock::now_ms();
        assert!((1900..=2100).contains(&len), "second ejection is 2s: {len}");
        g.expire_ejections(u64::MAX);
        for _ in 0..3 {
            g.record_failure(0, &o);
        }
        g.expire_ejections(u64::MAX);
        for _ in 0..3 {
            g.record_failure(0, &o);
        }
        let len = g.backends[0].ejected_until_ms.load(Ordering::Relaxed) - clock::now_ms();
        assert!(len <= 3000, "capped at max_ejection: {len}");
        // A success resets the streak and the back-off.
        g.expire_ejections(u64::MAX);
        g.record_success(0);
        assert_eq!(g.backends[0].ejections.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn single_backend_is_never_ejected() {
        let g = group(1);
        let o = Outlier {
            consecutive_failures: 1,
            ..Outlier::default()
        };
        assert!(!g.record_failure(0, &o));
        assert_eq!(g.down_set(), BackendSet::from_word(0));
    }

    #[test]
    fn a_passing_active_check_ends_an_ejection() {
        let g = group(2);
        let o = Outlier {
            consecutive_failures: 1,
            ..Outlier::default()
        };
        assert!(g.record_failure(0, &o));
        assert_eq!(g.down_set(), BackendSet::from_word(0b01));
        let c = tcp_check();
        g.apply_check(0, false, &c);
        assert_eq!(
            g.down_set(),
            BackendSet::from_word(0b01),
            "a failing check does not end it"
        );
        g.apply_check(0, true, &c);
        assert_eq!(g.down_set(), BackendSet::from_word(0), "a passing one does");
    }

    #[test]
    fn active_checks_need_consecutive_results() {
        let g = group(2);
        let c = tcp_check();
        g.apply_check(1, false, &c);
        assert_eq!(g.down_set(), BackendSet::from_word(0));
        g.apply_check(1, true, &c);
        g.apply_check(1, false, &c);
        assert_eq!(
            g.down_set(),
            BackendSet::from_word(0),
            "streak broken by a pass"
        );
        g.apply_check(1, false, &c);
        assert_eq!(g.down_set(), BackendSet::from_word(0b10));
        g.apply_check(1, true, &c);
        g.apply_check(1, true, &c);
        assert_eq!(g.down_set(), BackendSet::from_word(0));
    }

    #[test]
    fn down_sets_cover_groups_of_any_size() {
        let backends: Vec<_> = (0..10_000)
            .map(|i| {
                let addr = format!("10.0.{}.{}:80", i / 256, i % 256);
                Arc::new(BackendHealth::new(addr.parse().unwrap()))
            })
            .collect();
        let g = GroupHealth::new(backends);
        assert!(g.down_set().is_empty());
        g.set_drained(9_000, 1);
        g.set_drained(3, 1);
        let down = g.down_set();
        assert!(down.contains(9_000) && down.contains(3) && !down.contains(8_999));
        g.set_drained(9_000, 0);
        assert!(!g.down_set().contains(9_000));
    }

    #[test]
    fn a_success_ends_a_failure_streak_in_a_large_group() {
        let g = group(10_000);
        let o = Outlier {
            consecutive_failures: 3,
            ..Outlier::default()
        };
        for i in [5, 9_000] {
            assert!(!g.record_failure(i, &o));
            assert!(!g.record_failure(i, &o));
            g.record_success(i);
            assert_eq!(
                g.backends[i].consecutive_failures.load(Ordering::Relaxed),
                0
            );
            assert!(!g.record_failure(i, &o) && !g.record_failure(i, &o));
            assert!(g.record_failure(i, &o), "{i}: three in a row eject it");
        }
        // Expiry finds the ejected backends through the down set, far ones too.
        g.expire_ejections(u64::MAX);
        assert!(g.down_set().is_empty());
        // A streak carried into a new group (a change kept the backend) is still forgotten
        // on a success.
        g.backends[9_000]
            .consecutive_failures
            .store(2, Ordering::Relaxed);
        let carried = GroupHealth::new(g.backends.clone());
        carried.record_success(9_000);
        assert_eq!(
            carried.backends[9_000]
                .consecutive_failures
                .load(Ordering::Relaxed),
            0
        );
        assert_eq!(carried.backends[9_000].ejections.load(Ordering::Relaxed), 0);
    }
}
