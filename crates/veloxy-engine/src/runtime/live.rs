//! The live objects snapshots name (cache stores, the Redis client, search cluster views, the
//! ACME certificate store): one home, in the runtime, keyed by name and carried over reloads.
//!
//! Compiling a config makes none of them (see [`crate::late::Late`]); before a snapshot
//! is installed (at start and on each reload), [`Live::bind`] fills its slots: a store of the
//! same name and settings keeps its entries, a Redis client with the same settings is reused,
//! a search group's view is kept by group name, and the one ACME certificate store (made with
//! the runtime) goes into every snapshot. Everything else is made anew, and what the new
//! snapshot no longer names is let go (in-flight requests on the old one keep theirs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::acme::CertStore;
use crate::cache::Store;
use crate::config::Snapshot;
use crate::fleet::redis::RedisClient;
use crate::otel::Exporter;
use crate::upstream::search_cluster::ClusterView;

/// The objects the installed snapshot uses.
#[derive(Default)]
pub(crate) struct Live {
    held: Mutex<Held>,
    /// The ACME certificates, challenges and OCSP staples: one for the runtime's life, kept
    /// by the ACME thread and the OCSP tasks, read by every snapshot's TLS listeners.
    certs: Arc<CertStore>,
}

#[derive(Default)]
struct Held {
    /// In name order.
    stores: Vec<Arc<Store>>,
    redis: Option<Arc<RedisClient>>,
    views: HashMap<String, Arc<ClusterView>>,
    /// The span exporter (`[server.tracing]`): kept while its endpoint, service name and
    /// resource stay the same; dropping the last handle ends its thread.
    tracer: Option<Arc<Exporter>>,
}

/// A live object that could not be made: a cache store (its disk directory) or the local CA
/// (its directory).
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", path.display())]
pub struct BindError {
    /// What failed, e.g. `cache "pages": cannot use the disk directory`.
    what: String,
    path: std::path::PathBuf,
    #[source]
    source: std::io::Error,
}

impl Live {
    /// Fills every slot of `snapshot`, reusing what the installed one holds by name. On an
    /// error nothing changes (the slots stay empty: the snapshot must not be installed).
    pub(crate) fn bind(&self, snapshot: &Snapshot) -> Result<(), BindError> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut stores = Vec::with_capacity(snapshot.live.caches.len());
        for spec in &snapshot.live.caches {
            let kept = spec.store.try_get().cloned().or_else(|| {
                held.stores
                    .iter()
                    .find(|s| *s.name == *spec.name && spec.fits(s))
                    .cloned()
            });
            let store = match kept {
                Some(s) => s,
                None => spec.open().map_err(|source| BindError {
                    what: format!("cache {:?}: cannot use the disk directory", spec.name),
                    path: spec
                        .disk
                        .as_ref()
                        .map(|d| d.path.clone())
                        .unwrap_or_default(),
                    source,
                })?,
            };
            stores.push(store);
        }
        let tracer = tracer(&held, snapshot)?;
        let local = local_leaves(snapshot)?;
        // Nothing fails from here on.
        for (spec, store) in snapshot.live.caches.iter().zip(&stores) {
            spec.store.set(store.clone());
        }
        if let Some(leaves) = local {
            self.certs.set_local(leaves);
        }
        snapshot
            .live
            .certs
            .set(self.certs.clone() as Arc<dyn crate::tls::LiveCerts>);
        let redis = match (&snapshot.live.redis, &snapshot.settings.redis) {
            (Some(slot), Some(spec)) => {
                let kept = slot
                    .try_get()
                    .or(held.redis.as_ref().filter(|c| c.spec() == spec))
                    .cloned();
                Some(
                    slot.set(kept.unwrap_or_else(|| RedisClient::new(spec)))
                        .clone(),
                )
            }
            _ => None,
        };
        let mut views = HashMap::new();
        for g in &snapshot.upstreams {
            let Some(search) = &g.search else { continue };
            let kept = search
                .cluster
                .try_get()
                .or(held.views.get(&g.name))
                .cloned();
            let view = search.cluster.set(kept.unwrap_or_default()).clone();
            views.insert(g.name.clone(), view);
        }
        if let (Some(slot), Some(t)) = (&snapshot.live.tracer, &tracer) {
            slot.set(t.clone());
        }
        *held = Held {
            stores,
            redis,
            views,
            tracer,
        };
        Ok(())
    }

    /// The ACME certificate store (the ACME thread, OCSP, http-01 answers, the reports).
    #[inline]
    pub(crate) fn certs(&self) -> &Arc<CertStore> {
        &self.certs
    }

    /// Every cache store, in name order (purges, metrics).
    pub(crate) fn stores(&self) -> Vec<Arc<Store>> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.stores.clone()
    }

    /// Failed Redis requests of the current client.
    pub(crate) fn redis_errors(&self) -> u64 {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.redis
            .as_ref()
            .map_or(0, |c| c.errors.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// The span exporter `snapshot` needs: the held one when made from the same settings, else
/// a new one (its thread started).
fn tracer(held: &Held, snapshot: &Snapshot) -> Result<Option<Arc<Exporter>>, BindError> {
    let (Some(slot), Some(settings)) = (&snapshot.live.tracer, &snapshot.settings.tracing) else {
        return Ok(None);
    };
    if let Some(t) = slot.try_get() {
        return Ok(Some(t.clone()));
    }
    let same = |e: &&Arc<Exporter>| e.settings.exporter_key() == settings.exporter_key();
    if let Some(t) = held.tracer.as_ref().filter(same) {
        return Ok(Some(t.clone()));
    }
    match Exporter::start(settings) {
        Ok(e) => Ok(Some(Arc::new(e))),
        Err(e) => Err(BindError {
            what: "tracing: the exporter".to_owned(),
            path: std::path::PathBuf::from(&settings.otlp_endpoint),
            source: std::io::Error::other(e.to_string()),
        }),
    }
}

/// The local CA's leaves for the `local_ca` listeners of `snapshot`, by name (`None` when
/// there are none: the store keeps what it has). The CA is made on first use.
fn local_leaves(
    snapshot: &Snapshot,
) -> Result<Option<std::collections::HashMap<String, Arc<rustls::sign::CertifiedKey>>>, BindError> {
    let wanted: Vec<&crate::config::ListenerSpec> = snapshot
        .listeners
        .iter()
        .filter(|l| !l.local_ca.is_empty())
        .collect();
    if wanted.is_empty() {
        return Ok(None);
    }
    let dir = crate::acme::local::default_dir();
    let failed = |name: &str, e: crate::acme::local::LocalCaError| BindError {
        what: format!("listener {name:?}: local_ca: cannot use the local CA in"),
        path: dir.clone(),
        source: std::io::Error::other(e.to_string()),
    };
    let ca = crate::acme::local::LocalCa::open(&dir).map_err(|e| failed(&wanted[0].name, e))?;
    let mut leaves = std::collections::HashMap::new();
    for l in wanted {
        let key = ca.issue(&l.local_ca).map_err(|e| failed(&l.name, e))?;
        for name in &l.local_ca {
            leaves.insert(name.clone(), key.clone());
        }
    }
    Ok(Some(leaves))
}
