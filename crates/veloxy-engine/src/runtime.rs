//! The process's live state, beside the immutable config: what every worker shares (the
//! current snapshot and its generation number, shutdown, hooks, listener connection counts,
//! the metrics registry, the access log). Per-backend health, limiters and file caches live
//! with the config objects they belong to and are carried over reloads by name.

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
    pub health_tx: watch::Sender<Arc<[crate::config::UpstreamGroup]>>,
    /// Every worker's counters, summed by the admin endpoint.
    pub metrics: crate::metrics::Metrics,
    pub access_log: Option<crate::access_log::AccessLog>,
}

/// One listener as the workers see it: its name (routes and limits are looked up by name in
/// the current config) and its open connections across workers.
#[derive(Debug)]
pub(crate) struct ListenerState {
    pub name: Arc<str>,
    pub open: AtomicUsize,
}
