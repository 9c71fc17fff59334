//! The response cache (`[caches.NAME]`, a route's `cache = {...}`): RFC 9111 caching of
//! upstream responses in memory.
//!
//! # Layout
//! * [`policy`]: what may be stored and for how long (pure RFC 9111 rules).
//! * this module: the stores. One per `[caches.NAME]`, shared by every worker, made by the
//!   runtime (`runtime::live`, not by compiling) and kept across reloads by name: a concurrent map with TinyLFU admission and LRU eviction by bytes (moka),
//!   whose reads take no lock, so a hit costs no lock shared across workers.
//! * [`lookup`]: at admission (synchronous), a fresh object becomes the answer at once;
//!   anything else becomes a [`fill::Fill`] the codec runs.
//! * [`fill`]: misses, revalidation and stale serving: one upstream request per key at a time
//!   (collapsing across workers), `stale-while-revalidate` refreshes in the background,
//!   `stale-if-error` answers when the upstream fails. Its upstream is a [`fetch::Upstream`]
//!   the codec passes in (`downstream::cached::FillUpstream`).
//! * [`query`]: QUERY answers, keyed by the request body's digest, looked up once the
//!   exchange has read the body.
//! * [`object`]: a fetched answer as a stored object (freshness, `Vary`, kept fields), and
//!   a stale one refreshed by a 304.
//! * [`invalidate`]: what a non-error response to an unsafe request removes (RFC 9111 4.4).
//! * [`serve`]: an object as an answer: `Age`, the status header, client conditionals
//!   (304), ranges (206), HEAD.

pub(crate) mod date;
pub(crate) mod disk;
pub(crate) mod fetch;
pub(crate) mod fill;
pub(crate) mod invalidate;
pub(crate) mod lookup;
pub(crate) mod object;
pub(crate) mod policy;
pub(crate) mod query;
pub(crate) mod serve;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

/// A stored response.
pub(crate) struct Object {
    pub status: u16,
    /// The stored header fields as `name: value\r\n` lines: the upstream's, without framing,
    /// hop-by-hop fields, `Age` (veloxy computes it) and `Set-Cookie`; the origin's `Date`
    /// and `Server` stay, and the codecs write them instead of their own.
    pub lines: Bytes,
    pub body: Bytes,
    pub etag: Option<Bytes>,
    pub last_modified: Option<(Bytes, u64)>,
    /// `Surrogate-Key` / `Cache-Tag` values, for purges by tag.
    pub tags: Box<[Box<str>]>,
    /// When the response was generated (wall clock, ms): stored time minus its initial age.
    pub born_ms: u64,
    pub life: policy::Lifetime,
    /// The route may compress it (see [`Object::encoded`]).
    pub compressible: bool,
    /// Compressed copies of the body, made on the first request that wants each coding.
    pub encoded: [OnceLock<Option<Bytes>>; 3],
}

impl Object {
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.born_ms)
    }

    /// Fresh: may be served without asking the upstream.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        !self.life.always_revalidate && self.age_ms(now_ms) < self.life.fresh.as_millis() as u64
    }

    /// How long past freshness it is (0 while fresh).
    pub fn staleness_ms(&self, now_ms: u64) -> u64 {
        let fresh = if self.life.always_revalidate {
            0
        } else {
            self.life.fresh.as_millis() as u64
        };
        self.age_ms(now_ms).saturating_sub(fresh)
    }

    fn weight(&self, key: &str) -> u32 {
        // Room for the compressed copies too (typically well under half the body each).
        let copies = if self.compressible {
            self.body.len() / 2
        } else {
            0
        };
        (key.len() + self.lines.len() + self.body.len() + copies + 256).min(u32::MAX as usize)
            as u32
    }

    /// Whether a stored response may be compressed by veloxy: a 200 not already encoded,
    /// of a compressible type, big enough, and without `no-transform`.
    pub fn may_compress(status: u16, headers: &http::HeaderMap, len: usize) -> bool {
        status == 200
            && len as u64 >= crate::compress::MIN_SIZE
            && !headers.contains_key(http::header::CONTENT_ENCODING)
            && headers
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|v| crate::compress::is_compressible(v.as_bytes()))
            && !headers
                .get_all(http::header::CACHE_CONTROL)
                .iter()
                .any(|v| crate::http1::has_token(v.as_bytes(), "no-transform"))
    }

    /// The body in coding `e`, compressed once and kept with the object.
    pub fn encoded(&self, e: crate::compress::Encoding) -> Option<Bytes> {
        self.encoded[e.index()]
            .get_or_init(|| {
                crate::compress::compress(e, &self.body)
                    .ok()
                    .map(Bytes::from)
            })
            .clone()
    }
}

/// What a key holds.
#[derive(Clone)]
pub(crate) enum Entry {
    Object(Arc<Object>),
    /// The response varies on these request fields: each variant is stored under the key
    /// extended with their values ([`lookup::variant_key`]).
    Vary(Arc<[Box<str>]>),
    /// Not storable, or larger than `max_object` (wall-clock ms until which requests go
    /// straight upstream): a hit-for-pass, as Varnish calls it, so that only the first
    /// request of such a URL pays for a fill attempt.
    Pass(u64),
}

/// The counters of one cache (exported on `/metrics`).
#[derive(Default)]
pub(crate) struct Stats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub stale: AtomicU64,
    pub revalidated: AtomicU64,
    pub collapsed: AtomicU64,
    pub bypass: AtomicU64,
    pub evictions: Arc<AtomicU64>,
}

impl Stats {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// One `[caches.NAME]` store.
pub(crate) struct Store {
    pub name: Box<str>,
    pub memory: u64,
    pub entries: moka::sync::Cache<Arc<str>, Entry>,
    /// Fills in progress, by key: later misses wait for them (see [`fill`]).
    pub flights: Mutex<HashMap<Arc<str>, fill::Flight>>,
    pub stats: Stats,
    /// The disk tier, with its directory and size as configured.
    pub disk: Option<(Arc<disk::Disk>, DiskSpec)>,
}

/// `disk = { path, size }` of a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiskSpec {
    pub path: std::path::PathBuf,
    pub size: u64,
}

impl Store {
    fn new(name: &str, memory: u64, disk: Option<(Arc<disk::Disk>, DiskSpec)>) -> Store {
        let evictions = Arc::new(AtomicU64::new(0));
        let counter = evictions.clone();
        let entries = moka::sync::Cache::builder()
            .max_capacity(memory)
            .weigher(|k: &Arc<str>, e: &Entry| match e {
                Entry::Object(o) => o.weight(k),
                _ => (k.len() + 64) as u32,
            })
            .eviction_listener(move |_k, _v, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
            .support_invalidation_closures()
            .build();
        Store {
            name: name.into(),
            memory,
            entries,
            flights: Mutex::new(HashMap::new()),
            stats: Stats {
                evictions,
                ..Stats::default()
            },
            disk,
        }
    }

    /// Removes what `selector` picks; returns how many keys were removed.
    pub fn purge(&self, selector: &Purge) -> usize {
        let on_disk = self.disk.as_ref().map_or(0, |(d, _)| d.purge(selector));
        self.purge_memory(selector).max(on_disk)
    }

    fn purge_memory(&self, selector: &Purge) -> usize {
        if let Purge::Key(k) = selector {
            // The key and its variants (keyed by the key plus their Vary values).
            let variants =
                self.purge_memory(&Purge::Prefix(format!("{k}{}", lookup::VARIANT_MARK)));
            let had = self.entries.remove(k.as_str()).is_some();
            return variants + usize::from(had);
        }
        let matches = |k: &str, e: &Entry| match selector {
            Purge::Key(_) => false,
            Purge::Prefix(p) => k.starts_with(p.as_str()),
            Purge::Tag(t) => {
                matches!(e, Entry::Object(o) if o.tags.iter().any(|x| **x == **t))
            }
        };
        let keys: Vec<Arc<str>> = self
            .entries
            .iter()
            .filter(|(k, e)| matches(k, e))
            .map(|(k, _)| (*k).clone())
            .collect();
        for k in &keys {
            self.entries.invalidate(k);
        }
        keys.len()
    }

    /// Bytes held (weighted size).
    pub fn bytes(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.weighted_size()
    }
}

/// What a purge removes.
pub(crate) enum Purge {
    Key(String),
    Prefix(String),
    Tag(String),
}

/// A `[caches.NAME]` as compiled: what its store is made of, and the slot the runtime binds
/// the live store to (`runtime::Live`, which keeps the stores by name across reloads).
#[derive(Debug, Clone)]
pub(crate) struct StoreSpec {
    pub name: String,
    pub memory: u64,
    pub disk: Option<DiskSpec>,
    pub store: crate::late::Late<Store>,
    /// `targeted_cache_control` then `CDN-Cache-Control`, lowercase (what the routes using
    /// the store obey, see [`lookup::RouteCache`]; not part of the store itself).
    pub targeted: Arc<[Box<str>]>,
}

impl StoreSpec {
    /// Whether `store` was made with these settings (then a reload keeps it and its objects).
    pub fn fits(&self, store: &Store) -> bool {
        store.memory == self.memory && store.disk.as_ref().map(|(_, d)| d) == self.disk.as_ref()
    }

    /// A new, empty store; its disk directory is created now.
    pub fn open(&self) -> std::io::Result<Arc<Store>> {
        let disk = match &self.disk {
            Some(spec) => Some((disk::Disk::open(&spec.path, spec.size)?, spec.clone())),
            None => None,
        };
        Ok(Arc::new(Store::new(&self.name, self.memory, disk)))
    }
}

/// Wall-clock milliseconds (cache ages are wall-clock, as `Date` and `Age` are).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long a hit-for-pass lasts.
pub(crate) const PASS_FOR: Duration = Duration::from_secs(60);

/// `/metrics` lines for every cache.
pub(crate) fn metrics(out: &mut String, stores: &[Arc<Store>]) {
    use std::fmt::Write;
    if stores.is_empty() {
        return;
    }
    type Counter = (&'static str, &'static str, fn(&Stats) -> u64);
    let counters: [Counter; 7] = [
        ("hits", "Requests answered from the cache.", |s| {
            s.hits.load(Ordering::Relaxed)
        }),
        (
            "misses",
            "Requests that went upstream to fill the cache.",
            |s| s.misses.load(Ordering::Relaxed),
        ),
        (
            "stale_total",
            "Stale answers (stale-while-revalidate, stale-if-error).",
            |s| s.stale.load(Ordering::Relaxed),
        ),
        (
            "revalidated",
            "Stored responses revalidated with a 304.",
            |s| s.revalidated.load(Ordering::Relaxed),
        ),
        (
            "collapsed",
            "Misses that waited for another request's fill.",
            |s| s.collapsed.load(Ordering::Relaxed),
        ),
        (
            "bypass",
            "Cacheable-route requests that bypassed the cache.",
            |s| s.bypass.load(Ordering::Relaxed),
        ),
        ("evictions", "Objects evicted for space.", |s| {
            s.evictions.load(Ordering::Relaxed)
        }),
    ];
    for (name, help, get) in counters {
        let metric = if name.ends_with("_total") {
            format!("veloxy_cache_{name}")
        } else {
            format!("veloxy_cache_{name}_total")
        };
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} counter");
        for s in stores {
            let _ = writeln!(out, "{metric}{{cache=\"{}\"}} {}", s.name, get(&s.stats));
        }
    }
    let _ = writeln!(
        out,
        "# HELP veloxy_cache_bytes Bytes stored.\n# TYPE veloxy_cache_bytes gauge"
    );
    for s in stores {
        let _ = writeln!(
            out,
            "veloxy_cache_bytes{{cache=\"{}\"}} {}",
            s.name,
            s.bytes()
        );
    }
    let disks: Vec<_> = stores
        .iter()
        .filter_map(|s| Some((&s.name, &s.disk.as_ref()?.0)))
        .collect();
    if disks.is_empty() {
        return;
    }
    type Gauge = (&'static str, &'static str, fn(&disk::Disk) -> u64);
    let gauges: [Gauge; 2] = [
        ("veloxy_cache_disk_bytes", "gauge", |d| {
            d.bytes.load(Ordering::Relaxed)
        }),
        ("veloxy_cache_disk_errors_total", "counter", |d| {
            d.errors.load(Ordering::Relaxed)
        }),
    ];
    for (metric, kind, get) in gauges {
        let _ = writeln!(out, "# HELP {metric} Disk tier: bytes held; entries found corrupt (deleted) or not written.\n# TYPE {metric} {kind}");
        for (n, d) in &disks {
            let _ = writeln!(out, "{metric}{{cache=\"{n}\"}} {}", get(d));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coded_copy_is_made_once_per_object_and_coding() {
        let obj = Object {
            status: 200,
            lines: Bytes::new(),
            body: Bytes::from(vec![b'a'; 10_000]),
            etag: None,
            last_modified: None,
            tags: Box::default(),
            born_ms: 0,
            life: policy::Lifetime {
                fresh: Duration::from_secs(1),
                stale_while_revalidate: Duration::ZERO,
                stale_if_error: Duration::ZERO,
                always_revalidate: false,
            },
            compressible: true,
            encoded: Default::default(),
        };
        let e = crate::compress::Encoding::Gzip;
        let (a, b) = (obj.encoded(e).unwrap(), obj.encoded(e).unwrap());
        assert!(a.len() < 200);
        assert_eq!(
            a.as_ptr(),
            b.as_ptr(),
            "the same bytes, not a second compression"
        );
    }
}
