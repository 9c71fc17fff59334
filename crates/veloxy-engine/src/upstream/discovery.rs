//! Backends that change at run time: the `dns` and `srv` entries of a group's `servers`,
//! resolved on their interval by one process-wide thread, and the runtime API's
//! `PUT /upstreams/NAME/servers`.
//!
//! Both end the same way: [`Found::live_set`] recomputes the group's backends and the server
//! swaps in a snapshot that differs from the current one in that group only, as a reload
//! would. Backends that stay keep their health state (carried by address) and their pooled
//! connections (each worker moves them on its next request); new ones start fresh; requests
//! on a removed one finish on the old generation. A failed or empty resolution keeps the last
//! good set, so a DNS outage never empties a group.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;

use crate::upstream::addr::BackendAddr;
use crate::upstream::group::{index_by_name, Backend, Discovery, DiscoveryName, UpstreamGroup};
use crate::upstream::health::MAX_BACKENDS;
use crate::upstream::search_cluster::ClusterView;

/// Longest the first lookup of an entry may take before the server starts without its answer
/// (it keeps trying on the entry's interval).
const FIRST_ROUND: Duration = Duration::from_secs(3);

/// What discovery and the runtime API found, kept across reloads by group name.
#[derive(Default)]
pub(crate) struct Found {
    /// The last good answer of each (group, entry).
    sets: Mutex<HashMap<(String, Discovery), Vec<Backend>>>,
    /// `PUT` sets by group: they replace the file's servers and discovery's.
    overrides: Mutex<HashMap<String, Vec<Backend>>>,
}

impl Found {
    /// The backends `group` should have now: a `PUT` set if there is one, else the file's
    /// fixed servers followed by each entry's last answer (first address wins, at most
    /// [`MAX_BACKENDS`]).
    pub fn live_set(&self, group: &UpstreamGroup) -> Vec<Backend> {
        if let Some(set) = lock(&self.overrides).get(&group.name) {
            return set.clone();
        }
        let sets = lock(&self.sets);
        // A search cluster's nodes replace its seeds once they are known.
        if let Some(d) = group
            .discovery
            .iter()
            .find(|d| matches!(d.name, DiscoveryName::Search { .. }))
        {
            return match sets.get(&(group.name.clone(), d.clone())) {
                Some(nodes) => nodes.iter().take(MAX_BACKENDS).cloned().collect(),
                None => group.file_backends.to_vec(),
            };
        }
        let mut out: Vec<Backend> = group.file_backends.to_vec();
        let mut seen: HashSet<crate::upstream::addr::BackendAddr> =
            out.iter().map(|b| b.addr.clone()).collect();
        for d in &group.discovery {
            let Some(found) = sets.get(&(group.name.clone(), d.clone())) else {
                continue;
            };
            for b in found {
                if out.len() < MAX_BACKENDS && seen.insert(b.addr.clone()) {
                    out.push(b.clone());
                }
            }
        }
        out
    }

    /// `PUT /upstreams/NAME/servers`: `group`'s set from now on.
    pub fn set_override(&self, group: &str, backends: Vec<Backend>) {
        lock(&self.overrides).insert(group.to_owned(), backends);
    }

    /// On reload: `PUT` sets survive only for groups that keep runtime overrides. `groups`
    /// are a snapshot's (found by name as in `group::index_by_name`: with the Kubernetes
    /// provider's sets for 1,000 groups, a scan per set was a million comparisons a reload).
    pub fn reset_overrides(&self, groups: &[Arc<UpstreamGroup>]) {
        lock(&self.overrides).retain(|name, _| {
            index_by_name(groups, name).is_some_and(|i| groups[i].keep_runtime_overrides)
        });
    }

    /// Records an answer; says whether it differs from the last.
    fn store(&self, key: &(String, Discovery), set: Vec<Backend>) -> bool {
        let mut sets = lock(&self.sets);
        if sets.get(key).is_some_and(|old| same(old, &set)) {
            return false;
        }
        sets.insert(key.clone(), set);
        true
    }

    /// Forgets answers of entries no config has any more.
    fn retain(&self, wanted: &HashSet<(String, Discovery)>) {
        lock(&self.sets).retain(|k, _| wanted.contains(k));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Two sets with the same addresses and weights in the same order.
pub(crate) fn same(a: &[Backend], b: &[Backend]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.addr == y.addr && x.weight == y.weight)
}

/// Gives `group` the set `backends`: sticky tokens follow, health is carried by address.
pub(crate) fn regroup(group: &mut UpstreamGroup, backends: Vec<Backend>, workers: usize) {
    group.health = crate::upstream::health::carry(&group.health, &backends, workers);
    set_backends(group, backends);
}

/// Gives `group` the set `backends` with their sticky tokens (health is the caller's).
pub(crate) fn set_backends(group: &mut UpstreamGroup, backends: Vec<Backend>) {
    if let Some(s) = &mut group.sticky {
        s.set_backends(&group.name, &backends);
    }
    group.backends = backends;
}

/// What the discovery thread needs from the server.
pub(crate) struct Hooks {
    /// The DNS servers to ask (empty: the system's), read again on each config change.
    pub resolvers: Box<dyn Fn() -> Vec<SocketAddr> + Send>,
    /// Called with a group's name when one of its entries resolved to a new set; `false`
    /// once the server is gone (the thread then ends).
    pub publish: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

/// Starts the discovery thread. It follows config changes through `groups`; the returned
/// receiver gets one message when the first round of lookups is done (or failed), so the
/// server can start serving with discovered backends in place.
pub(crate) fn spawn_thread(
    found: Arc<Found>,
    mut groups: tokio::sync::watch::Receiver<Arc<[Arc<UpstreamGroup>]>>,
    hooks: Hooks,
) -> std::io::Result<std::sync::mpsc::Receiver<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    crate::background::spawn("veloxy-dns", move || async move {
        let mut tasks: HashMap<(String, Discovery), tokio::task::AbortHandle> = HashMap::new();
        let mut set = tokio::task::JoinSet::new();
        let mut resolvers = None;
        let mut ready = Some(ready_tx);
        loop {
            let snapshot = groups.borrow_and_update().clone();
            let wanted: HashSet<(String, Discovery)> = snapshot
                .iter()
                .flat_map(|g| g.discovery.iter().map(|d| (g.name.clone(), d.clone())))
                .collect();
            let now = (hooks.resolvers)();
            if resolvers.as_ref() != Some(&now) {
                // New DNS servers: every entry starts over with a new resolver.
                for (_, t) in tasks.drain() {
                    t.abort();
                }
                resolvers = Some(now.clone());
            }
            tasks.retain(|k, t| {
                let keep = wanted.contains(k);
                if !keep {
                    t.abort();
                }
                keep
            });
            found.retain(&wanted);
            if !wanted.is_empty() {
                let resolver = match build_resolver(&now) {
                    Ok(r) => Arc::new(r),
                    Err(e) => {
                        tracing::error!(error = %e, "DNS discovery: no resolver");
                        ready.take().map(|r| r.send(()));
                        if groups.changed().await.is_err() {
                            return;
                        }
                        continue;
                    }
                };
                // The first round runs before the server serves: answers are in place.
                let first: Vec<_> = wanted
                    .iter()
                    .filter(|k| !tasks.contains_key(*k))
                    .cloned()
                    .collect();
                let resolved = ready.is_some();
                if resolved {
                    let mut round1 = tokio::task::JoinSet::new();
                    for k in first.iter().cloned() {
                        let (r, f) = (resolver.clone(), found.clone());
                        let view = view_of(&snapshot, &k.0);
                        let publish = hooks.publish.clone();
                        round1.spawn(async move {
                            // Bounded: the server waits for this round to start.
                            let answer = tokio::time::timeout(
                                FIRST_ROUND,
                                round(&r, &f, &k, view.as_deref(), None),
                            );
                            if let Ok(Some(true)) = answer.await {
                                publish(&k.0);
                            }
                        });
                    }
                    round1.join_all().await;
                }
                for key in first {
                    let view = view_of(&snapshot, &key.0);
                    let t = set.spawn(follow(
                        resolver.clone(),
                        found.clone(),
                        (key.clone(), view),
                        hooks.publish.clone(),
                        resolved,
                    ));
                    tasks.insert(key, t);
                }
            }
            ready.take().map(|r| r.send(()));
            tokio::select! {
                changed = groups.changed() => if changed.is_err() { return },
                Some(ended) = set.join_next() => {
                    // A task ends only when the server is gone, or when aborted.
                    match ended {
                        Err(e) if e.is_cancelled() => {}
                        Err(e) => tracing::error!(error = %e, "DNS discovery task failed"),
                        Ok(()) => return,
                    }
                }
            }
        }
    })?;
    Ok(ready_rx)
}

/// One entry, for ever: resolve, publish a change, wait `every` (first, when the first
/// round just resolved it).
async fn follow(
    resolver: Arc<TokioResolver>,
    found: Arc<Found>,
    (key, view): ((String, Discovery), Option<Arc<ClusterView>>),
    publish: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    resolved: bool,
) {
    let view = view.as_deref();
    let mut failing = false;
    if resolved {
        pause(&key, view).await;
    }
    loop {
        match round(&resolver, &found, &key, view, Some(&mut failing)).await {
            Some(true) if !publish(&key.0) => return,
            _ => {}
        }
        pause(&key, view).await;
    }
}

/// The cluster view of a search group (bound by the runtime before the groups are sent).
fn view_of(groups: &[Arc<UpstreamGroup>], name: &str) -> Option<Arc<ClusterView>> {
    let g = &groups[index_by_name(groups, name)?];
    g.search.as_ref()?.cluster.try_get().cloned()
}

/// The wait between two rounds of an entry: its interval (a search cluster's comes early
/// when a bulk met an index its map lacks).
async fn pause(key: &(String, Discovery), view: Option<&ClusterView>) {
    match (&key.1.name, view) {
        (DiscoveryName::Search { .. }, Some(view)) => view.wait(key.1.every).await,
        _ => tokio::time::sleep(key.1.every).await,
    }
}

/// One lookup of `key`: `Some(changed)` on an answer, `None` on a failure (logged once per
/// outage when `failing` tracks it).
async fn round(
    resolver: &TokioResolver,
    found: &Found,
    key: &(String, Discovery),
    view: Option<&ClusterView>,
    failing: Option<&mut bool>,
) -> Option<bool> {
    let (group, d) = key;
    let answer = lookup(resolver, d, view).await;
    let mut quiet = false;
    let failing = failing.unwrap_or(&mut quiet);
    match answer {
        Ok(set) => {
            if std::mem::take(failing) {
                tracing::info!(upstream = %group, name = %d.name, "discovery answers again");
            }
            let changed = found.store(key, set);
            if changed {
                tracing::info!(upstream = %group, name = %d.name, "discovery: new set of servers");
            }
            Some(changed)
        }
        Err(e) => {
            if !std::mem::replace(failing, true) {
                tracing::warn!(upstream = %group, name = %d.name, error = %e,
                    "discovery failed: keeping the last good set");
            }
            None
        }
    }
}

pub(crate) fn build_resolver(servers: &[SocketAddr]) -> Result<TokioResolver, String> {
    let mut builder = if servers.is_empty() {
        TokioResolver::builder_tokio().map_err(|e| e.to_string())?
    } else {
        let ns = servers
            .iter()
            .map(|s| {
                let mut udp = ConnectionConfig::udp();
                udp.port = s.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = s.port();
                NameServerConfig::new(s.ip(), true, vec![udp, tcp])
            })
            .collect();
        TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(ns),
            TokioRuntimeProvider::default(),
        )
    };
    let opts = builder.options_mut();
    // `resolve` says how often to ask: no cache in between.
    opts.cache_size = 0;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
    builder.build().map_err(|e| e.to_string())
}

/// Resolves an entry (for a search group: reads its cluster) into backends, sorted by
/// address (so an unchanged answer in another order is no change). An empty answer is a
/// failure.
async fn lookup(
    resolver: &TokioResolver,
    d: &Discovery,
    view: Option<&ClusterView>,
) -> Result<Vec<Backend>, String> {
    let mut out = Vec::new();
    match &d.name {
        DiscoveryName::Search { seeds, roles } => {
            let view = view.ok_or("the cluster view is not bound")?;
            let nodes = crate::upstream::search_cluster::refresh(seeds, roles, view).await?;
            if nodes.is_empty() {
                return Err("no node has one of the roles".to_owned());
            }
            for n in nodes {
                out.push(backend(d, &n.http.ip().to_string(), n.http, 1));
            }
        }
        DiscoveryName::Dns { host, port } => {
            let ips = resolver
                .lookup_ip(host.as_str())
                .await
                .map_err(|e| e.to_string())?;
            for ip in ips.iter() {
                out.push(backend(d, host, SocketAddr::new(ip, *port), d.weight));
            }
        }
        DiscoveryName::Srv(name) => {
            let srv = resolver
                .srv_lookup(name.as_str())
                .await
                .map_err(|e| e.to_string())?;
            let records: Vec<_> = srv
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::SRV(s) => Some(s.clone()),
                    _ => None,
                })
                .collect();
            // RFC 2782: only the lowest priority is used while it answers.
            let best = records.iter().map(|s| s.priority).min();
            for s in records.iter().filter(|s| Some(s.priority) == best) {
                let target = s.target.to_ascii();
                let ips = addresses_of(resolver, &srv, &target).await?;
                for ip in ips {
                    let weight = u32::from(s.weight).max(1);
                    out.push(backend(d, &target, SocketAddr::new(ip, s.port), weight));
                }
            }
        }
    }
    if out.is_empty() {
        return Err("no addresses in the answer".into());
    }
    out.sort_by_key(|b| b.addr.to_string());
    out.dedup_by(|a, b| a.addr == b.addr);
    Ok(out)
}

/// A SRV target's addresses: from the answer's additional section when the server put them
/// there, else looked up.
async fn addresses_of(
    resolver: &TokioResolver,
    srv: &hickory_resolver::lookup::Lookup,
    target: &str,
) -> Result<Vec<IpAddr>, String> {
    let glued: Vec<IpAddr> = srv
        .additionals()
        .iter()
        .filter(|r| r.name.to_ascii().eq_ignore_ascii_case(target))
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    if !glued.is_empty() {
        return Ok(glued);
    }
    let ips = resolver
        .lookup_ip(target)
        .await
        .map_err(|e| format!("{target}: {e}"))?;
    Ok(ips.iter().collect())
}

fn backend(d: &Discovery, host: &str, addr: SocketAddr, weight: u32) -> Backend {
    let host = host.trim_end_matches('.');
    Backend {
        addr: BackendAddr::Tcp(addr),
        server: format!("{host}:{}", addr.port()),
        // Checked when the config was compiled.
        tls_name: d
            .tls_name
            .as_ref()
            .and_then(|n| rustls::pki_types::ServerName::try_from(n.clone()).ok()),
        weight,
        backup: d.backup,
    }
}
