//! The process's live state, beside the immutable config: what every worker shares (the
//! current snapshot and its generation number, shutdown, hooks, listener connection counts,
//! the metrics registry, the access log) and the live objects snapshots name ([`live`]:
//! cache stores, the Redis client, search cluster views, the ACME certificate store), made
//! here rather than by compiling.
//! Per-backend health, limiters and file caches live with the config objects they belong to
//! and are carried over reloads by name.

pub(crate) mod live;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::config::Snapshot;
use crate::hooks::Hooks;

/// State shared by all workers: read-mostly.
pub(crate) struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    /// Bumped after each snapshot swap; workers compare it to their cached generation.
    pub generation: AtomicU64,
    pub shutdown: AtomicBool,
    pub hooks: Option<Arc<dyn Hooks>>,
    /// Every bound listener's state (name, open connections), for the admin endpoint.
    pub listeners: std::sync::Mutex<Vec<Arc<ListenerState>>>,
    /// Feeds the health thread the snapshot to check.
    pub health_tx: watch::Sender<Arc<[Arc<crate::config::UpstreamGroup>]>>,
    /// Tells the ACME thread which names to keep.
    pub acme_tx: watch::Sender<crate::acme::manager::Plan>,
    /// Every worker's counters, summed by the admin endpoint.
    pub metrics: crate::metrics::Metrics,
    pub access_log: Option<crate::access_log::AccessLog>,
    /// The cache stores, Redis client and search views of the installed snapshot, and the ACME
    /// certificate store.
    pub live: live::Live,
    /// Backends found by DNS discovery and set through the runtime API.
    pub found: Arc<crate::upstream::discovery::Found>,
    /// Held while a snapshot is derived from the current one and swapped in (reload,
    /// discovery, runtime API), so two swaps never lose each other's change.
    pub swap: std::sync::Mutex<()>,
}

impl Shared {
    /// Swaps in a snapshot where group `name` has its live set of backends (see
    /// [`crate::upstream::discovery`]); nothing happens if the set is unchanged.
    pub fn republish(&self, name: &str) {
        self.republish_many(&[name]);
    }

    /// [`Shared::republish`] for several groups, in one swap.
    pub fn republish_many(&self, names: &[&str]) {
        use crate::upstream::discovery::{regroup, same};
        let _swap = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot.load_full();
        let mut next: Option<Snapshot> = None;
        for name in names {
            let Some(i) = current.upstream_index(name) else {
                continue;
            };
            let set = self.found.live_set(&current.upstreams[i]);
            if same(&set, &current.upstreams[i].backends) {
                continue;
            }
            let next = next.get_or_insert_with(|| (*current).clone());
            let workers = next.settings.workers;
            regroup(Arc::make_mut(&mut next.upstreams[i]), set, workers);
        }
        let Some(next) = next else { return };
        let next = Arc::new(next);
        self.snapshot.store(next.clone());
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let _ = self.health_tx.send(next.upstreams.clone().into());
    }
}

/// One listener as the workers see it: its name (routes and limits are looked up by name in
/// the current config) and its open connections across workers.
#[derive(Debug)]
pub(crate) struct ListenerState {
    pub name: Arc<str>,
    pub open: AtomicUsize,
    /// The port it is bound to.
    pub port: u16,
}

/// Carries the live state of unchanged routes over a reload: a route with the same listener,
/// host and path keeps its rate-limit buckets, its concurrency limit (so requests still in
/// flight on the old config count against the same limit) and its file cache, as long as
/// their settings did not change. Anything changed starts fresh.
pub(crate) fn carry_over(old: &Snapshot, new: &mut Snapshot) {
    use crate::router::RouteTarget;
    for listener in &mut new.listeners {
        let Some(prev) = old.listeners.iter().find(|l| l.name == listener.name) else {
            continue;
        };
        for route in Arc::make_mut(&mut listener.router).routes_mut() {
            // Most routes hold no state to carry: no twin to look for.
            let stateful = route.limits.rate.is_some()
                || route.limits.concurrency.is_some()
                || matches!(route.target, RouteTarget::Files(_));
            if !stateful {
                continue;
            }
            let Some(was) = prev.router.twin(route) else {
                continue;
            };
            if let (Some(a), Some(b)) = (&mut route.limits.rate, &was.limits.rate) {
                if a.same_settings(b) {
                    *a = b.clone();
                }
            }
            if let (Some(a), Some(b)) = (&mut route.limits.concurrency, &was.limits.concurrency) {
                if (a.max, a.queue, a.queue_timeout) == (b.max, b.queue, b.queue_timeout) {
                    *a = b.clone();
                }
            }
            if let (RouteTarget::Files(a), RouteTarget::Files(b)) = (&mut route.target, &was.target)
            {
                if a.same_settings(b) {
                    *a = b.clone();
                }
            }
        }
    }
}

/// Starts the DNS discovery thread and waits (at most 5 s) for its first round of lookups,
/// so the workers start with the discovered backends in place.
pub(crate) fn start_discovery(
    shared: &Arc<Shared>,
    found: Arc<crate::upstream::discovery::Found>,
) -> std::io::Result<()> {
    use crate::upstream::discovery::{spawn_thread, Hooks};
    let weak = Arc::downgrade(shared);
    let for_resolvers = weak.clone();
    let hooks = Hooks {
        resolvers: Box::new(move || {
            for_resolvers
                .upgrade()
                .map(|s| s.snapshot.load().settings.resolvers.clone())
                .unwrap_or_default()
        }),
        publish: Arc::new(move |name: &str| match weak.upgrade() {
            Some(s) => {
                s.republish(name);
                true
            }
            None => false,
        }),
    };
    let ready = spawn_thread(found, shared.health_tx.subscribe(), hooks)?;
    let _ = ready.recv_timeout(std::time::Duration::from_secs(5));
    // The first round stored its answers; put them in the snapshot the workers start with.
    for g in shared.snapshot.load().upstreams.iter() {
        if !g.discovery.is_empty() {
            shared.republish(&g.name);
        }
    }
    Ok(())
}
