//! The open-file and content cache of one file route.
//!
//! An entry remembers what a request path resolved to (after index files, symlink and hidden
//! checks), the file's validators, and, for files up to [`MAX_FILE`] bytes, the content and
//! its compressed variants in memory; larger files keep their open descriptor for `sendfile`.
//! An entry younger than [`REVALIDATE_MS`] is used without touching the filesystem; an older
//! one is revalidated by resolving and `fstat`ing again, and replaced if size, mtime or inode
//! changed. So a hot file costs one resolution per second, not per request.
//!
//! Placement: one cache per route, shared by all workers, split into [`SHARDS`] shards each
//! behind its own mutex. Shared rather than per worker because the expensive part of an entry
//! is its compressed variants (brotli 5 of a 300 KB bundle is milliseconds): per-worker caches
//! would compress and store every variant once per worker. A shard lock is held only for a
//! hash lookup and an `Arc` clone (tens of nanoseconds, never across I/O or compression), and
//! with 16 shards two workers rarely meet on one. The budget is split evenly between shards.
//!
//! Eviction: approximate LRU. Each hit stores a tick in the entry (a relaxed atomic store);
//! a shard over its byte or entry budget drops its least recently used entries down to 7/8 of
//! the budget, so eviction work is batched.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fs::File;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;

/// Files up to this size are kept in memory (and compressed on the fly); larger ones are sent
/// from their descriptor with `sendfile` and compressed only through sidecar files.
pub const MAX_FILE: u64 = 1024 * 1024;
/// An entry is trusted this long before it is checked against the filesystem again.
pub const REVALIDATE_MS: u64 = 1000;
/// Number of independently locked shards.
pub const SHARDS: usize = 16;
/// Entries (and so open descriptors of large files) kept per route at most.
pub const MAX_ENTRIES: usize = 4096;

/// A compressed variant computed from the cached content.
#[derive(Debug, Clone)]
pub enum Variant {
    /// Not computed yet.
    Unknown,
    /// Compressed output was not smaller: serve identity.
    Useless,
    Ready(Bytes),
}

/// Where a body's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    Memory(Bytes),
    File(Arc<File>),
}

/// A precompressed sidecar file (`app.js.br`).
#[derive(Debug, Clone)]
pub struct Sidecar {
    pub source: Source,
    pub len: u64,
}

/// One cached resolution.
#[derive(Debug)]
pub struct Entry {
    pub source: Source,
    pub len: u64,
    pub mtime: SystemTime,
    /// Identity of the file version: (device, inode, size, mtime).
    pub version: (u64, u64, u64, SystemTime),
    pub content_type: &'static str,
    /// Eligible for on-the-fly compression (type, size, route setting, content in memory).
    pub compressible: bool,
    pub etag: Bytes,
    /// Per coding (indexed by `Encoding::index`).
    pub variant_etags: [Bytes; 3],
    pub last_modified: Bytes,
    pub sidecars: [Option<Sidecar>; 3],
    pub variants: [Variant; 3],
    /// `clock::now_ms()` of the last check against the filesystem.
    pub checked_ms: u64,
    last_used: AtomicU64,
}

impl Entry {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        source: Source,
        len: u64,
        mtime: SystemTime,
        version: (u64, u64, u64, SystemTime),
        content_type: &'static str,
        compressible: bool,
        sidecars: [Option<Sidecar>; 3],
        checked_ms: u64,
    ) -> Entry {
        let etag = super::conditional::etag(len, mtime);
        let variant_etags = crate::compress::Encoding::ALL
            .map(|e| Bytes::from(super::conditional::variant_etag(&etag, e.extension())));
        Entry {
            source,
            len,
            mtime,
            version,
            content_type,
            compressible,
            etag: Bytes::from(etag),
            variant_etags,
            last_modified: Bytes::from(httpdate::fmt_http_date(mtime)),
            sidecars,
            variants: [Variant::Unknown, Variant::Unknown, Variant::Unknown],
            checked_ms,
            last_used: AtomicU64::new(0),
        }
    }

    /// A copy with some fields replaced (entries are immutable once shared).
    pub fn with(
        &self,
        sidecars: [Option<Sidecar>; 3],
        variants: [Variant; 3],
        checked_ms: u64,
    ) -> Entry {
        Entry {
            source: self.source.clone(),
            len: self.len,
            mtime: self.mtime,
            version: self.version,
            content_type: self.content_type,
            compressible: self.compressible,
            etag: self.etag.clone(),
            variant_etags: self.variant_etags.clone(),
            last_modified: self.last_modified.clone(),
            sidecars,
            variants,
            checked_ms,
            last_used: AtomicU64::new(self.last_used.load(Ordering::Relaxed)),
        }
    }

    /// Memory held by this entry's content (the fixed per-entry cost is bounded by
    /// [`MAX_ENTRIES`] instead).
    fn weight(&self) -> usize {
        let mem = |s: &Source| match s {
            Source::Memory(b) => b.len(),
            Source::File(_) => 0,
        };
        let variants: usize = self
            .variants
            .iter()
            .map(|v| match v {
                Variant::Ready(b) => b.len(),
                _ => 0,
            })
            .sum();
        let sidecars: usize = self.sidecars.iter().flatten().map(|s| mem(&s.source)).sum();
        mem(&self.source) + variants + sidecars
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<Box<str>, Arc<Entry>>,
    bytes: usize,
}

/// A route's file cache (see the module docs).
pub struct FileCache {
    shards: Box<[Mutex<Shard>]>,
    /// Bytes of content per shard; 0 disables keeping content in memory.
    shard_bytes: usize,
    /// The configured budget (`cache_bytes`), which `shard_bytes` rounds down.
    max_bytes: usize,
    hasher: RandomState,
    tick: AtomicU64,
}

impl std::fmt::Debug for FileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCache")
            .field("bytes", &(self.shard_bytes * SHARDS))
            .finish()
    }
}

impl FileCache {
    /// A cache that keeps at most `max_bytes` of file content and variants in memory (0: only
    /// resolutions and descriptors are cached).
    pub fn new(max_bytes: usize) -> FileCache {
        FileCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_bytes: max_bytes / SHARDS,
            max_bytes,
            hasher: RandomState::new(),
            tick: AtomicU64::new(1),
        }
    }

    /// The memory budget it was made with (`cache_bytes`).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The largest file whose content may be kept in memory.
    pub fn max_file(&self) -> u64 {
        if self.shard_bytes == 0 {
            0
        } else {
            MAX_FILE.min(self.shard_bytes as u64 / 2)
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    fn lock<'a>(m: &'a Mutex<Shard>) -> std::sync::MutexGuard<'a, Shard> {
        // A panic while holding the lock leaves a consistent map (no multi-step updates).
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        let e = Self::lock(self.shard(key)).map.get(key).cloned()?;
        e.last_used
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        Some(e)
    }

    /// Inserts or replaces the entry for `key`, evicting old entries if over budget.
    pub fn insert(&self, key: &str, entry: Entry) -> Arc<Entry> {
        entry
            .last_used
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        let entry = Arc::new(entry);
        let weight = entry.weight();
        let mut shard = Self::lock(self.shard(key));
        if let Some(old) = shard.map.insert(key.into(), entry.clone()) {
            shard.bytes -= old.weight();
        }
        shard.bytes += weight;
        let max_entries = MAX_ENTRIES / SHARDS;
        if shard.bytes > self.shard_bytes || shard.map.len() > max_entries {
            Self::evict(&mut shard, self.shard_bytes / 8 * 7, max_entries / 8 * 7);
        }
        entry
    }

    pub fn remove(&self, key: &str) {
        let mut shard = Self::lock(self.shard(key));
        if let Some(old) = shard.map.remove(key) {
            shard.bytes -= old.weight();
        }
    }

    fn evict(shard: &mut Shard, bytes: usize, entries: usize) {
        let mut by_age: Vec<(u64, Box<str>)> = shard
            .map
            .iter()
            .map(|(k, e)| (e.last_used.load(Ordering::Relaxed), k.clone()))
            .collect();
        by_age.sort_unstable();
        for (_, key) in by_age {
            if shard.bytes <= bytes && shard.map.len() <= entries {
                break;
            }
            if let Some(old) = shard.map.remove(&key) {
                shard.bytes -= old.weight();
            }
        }
    }

    /// Content bytes currently held (tests and metrics).
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| Self::lock(s).bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(size: usize) -> Entry {
        let t = SystemTime::UNIX_EPOCH;
        Entry::new(
            Source::Memory(Bytes::from(vec![0u8; size])),
            size as u64,
            t,
            (0, 0, size as u64, t),
            "text/plain",
            false,
            [None, None, None],
            1,
        )
    }

    #[test]
    fn bounded_and_lru() {
        let c = FileCache::new(SHARDS * 10_000);
        for i in 0..2000 {
            c.insert(&format!("/f{i}"), entry(1000));
            // Keep /f0 hot.
            assert!(c.get("/f0").is_some());
        }
        assert!(c.bytes() <= SHARDS * 10_000, "{}", c.bytes());
        assert!(c.get("/f0").is_some(), "the hot entry survives");
        assert!(c.get("/f1").is_none(), "a cold early entry is gone");
        c.remove("/f0");
        assert!(c.get("/f0").is_none());
    }

    #[test]
    fn replace_keeps_accounting() {
        let c = FileCache::new(1 << 20);
        c.insert("/a", entry(1000));
        c.insert("/a", entry(3000));
        assert_eq!(c.bytes(), 3000);
        assert_eq!(c.max_file(), (1 << 20) / SHARDS as u64 / 2);
    }
}
