//! `query_cache = "CACHE"`: answers of `_search`, `_count` and `_msearch` kept in a
//! `[caches.NAME]` store for `ttl`, and dropped when an index they read is written through
//! veloxy.
//!
//! The key is the path, the query parameters in sorted order and the body re-serialized with
//! sorted keys (so `{"a":1,"b":2}` and `{"b":2, "a":1}` share an entry). Each entry is tagged
//! with the indices it read (aliases resolved through the cluster map; a wildcard, an alias
//! veloxy does not know or no index at all is tagged `*`). A write to an index removes the
//! entries tagged with it and with `*`, and for 2 s afterwards answers reading it are not
//! stored: the cluster shows a write to searches only after its next refresh (1 s by default),
//! and a search that started before the write may still be on its way.
//!
//! Bypass: `request_cache=false` in the URL (the cluster's own switch) neither reads nor
//! stores; a request `Cache-Control: no-cache` fetches a fresh answer and stores it.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use crate::cache::{now_ms, Entry, Object, Stats, Store};
use crate::upstream::search_cluster::ClusterMap;

const PREFIX: &str = "search:";
const WRITTEN: &str = "search-written:";
const SETTLE_MS: u64 = 2000;
const ANY: &str = "*";
/// The marker of a write to any index (no index is named so).
const ANY_WRITE: &str = "#any";

/// A route's query cache.
pub(crate) struct QueryCache {
    /// The `[caches.NAME]` store, bound by the runtime.
    pub slot: crate::late::Late<Store>,
    /// The store's name (`veloxy check --print` writes it; the slot is empty there).
    pub store_name: Box<str>,
    pub ttl: Duration,
    pub max_object: u64,
}

impl std::fmt::Debug for QueryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryCache")
            .field("store", &self.store_name)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// The cache key of a search: `None` when the body is not JSON (NDJSON for `_msearch`).
pub(crate) fn key(target: &str, body: &[u8], multi: bool) -> Option<String> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    params.sort_unstable();
    let mut k = format!("{PREFIX}{path}?{}\n", params.join("&"));
    let canon = |text: &[u8], k: &mut String| -> Option<()> {
        // serde_json's maps are sorted by key: parsing and writing back is the normal form.
        let v: Value = serde_json::from_slice(text).ok()?;
        k.push_str(&v.to_string());
        k.push('\n');
        Some(())
    };
    if multi {
        for line in body
            .split(|b| *b == b'\n')
            .filter(|l| !l.trim_ascii().is_empty())
        {
            canon(line, &mut k)?;
        }
    } else if !body.trim_ascii().is_empty() {
        canon(body, &mut k)?;
    }
    Some(k)
}

/// The indices a path reads or writes (its first segment, when it is not an API), resolved
/// through aliases; `*` for wildcards, unknown names and the whole cluster.
pub(crate) fn indices(path: &str, map: &ClusterMap) -> Vec<String> {
    let first = path.split('/').find(|s| !s.is_empty()).unwrap_or("");
    if first.is_empty() || first.starts_with('_') {
        return vec![ANY.to_owned()];
    }
    let mut out: Vec<String> = first
        .split(',')
        .map(|i| {
            let i = super::percent_decode(i);
            if map.indices.contains_key(&i) {
                i
            } else if let Some(real) = map.aliases.get(&i) {
                real.clone()
            } else {
                ANY.to_owned()
            }
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn tag(index: &str) -> String {
    format!("search-index:{index}")
}

impl QueryCache {
    /// The store (one atomic load).
    #[inline]
    pub(crate) fn store(&self) -> &Arc<Store> {
        self.slot.get()
    }

    /// A fresh answer for `key`.
    pub fn get(&self, key: &str) -> Option<Bytes> {
        match self.store().entries.get(key) {
            Some(Entry::Object(o)) if o.is_fresh(now_ms()) => {
                Stats::inc(&self.store().stats.hits);
                Some(o.body.clone())
            }
            _ => {
                Stats::inc(&self.store().stats.misses);
                None
            }
        }
    }

    /// Keeps a 200 answer of a search that read `read`.
    pub fn put(&self, key: String, read: &[String], body: Bytes) {
        if body.len() as u64 > self.max_object || self.recently_written(read) {
            return;
        }
        // Writes drop the entries tagged with their index and those tagged `*`.
        let tags: Vec<Box<str>> = read.iter().map(|i| tag(i).into()).collect();
        let object = Object {
            status: 200,
            lines: Bytes::from_static(b"content-type: application/json; charset=UTF-8\r\n"),
            body,
            etag: None,
            last_modified: None,
            tags: tags.into_boxed_slice(),
            born_ms: now_ms(),
            life: crate::cache::policy::Lifetime {
                fresh: self.ttl,
                stale_while_revalidate: Duration::ZERO,
                stale_if_error: Duration::ZERO,
                always_revalidate: false,
            },
            compressible: false,
            encoded: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        };
        self.store()
            .entries
            .insert(Arc::from(key.as_str()), Entry::Object(Arc::new(object)));
    }

    /// `written` (indices, or `*` for the whole cluster) changed: their answers go.
    pub fn written(&self, written: &[String]) {
        let until = now_ms() + SETTLE_MS;
        let all = written.iter().any(|i| i == ANY);
        if all {
            self.store()
                .purge(&crate::cache::Purge::Prefix(PREFIX.to_owned()));
        } else {
            for i in written.iter().map(String::as_str).chain([ANY]) {
                self.store().purge(&crate::cache::Purge::Tag(tag(i)));
            }
        }
        // One marker per index written, and one for "some index": what a search over
        // everything checks (one lookup, not a scan of the markers).
        for i in written.iter().map(String::as_str).chain([ANY_WRITE]) {
            self.store()
                .entries
                .insert(Arc::from(format!("{WRITTEN}{i}")), Entry::Pass(until));
        }
    }

    fn recently_written(&self, read: &[String]) -> bool {
        let now = now_ms();
        let marked = |i: &str| {
            matches!(self.store().entries.get(format!("{WRITTEN}{i}").as_str()),
                Some(Entry::Pass(until)) if until > now)
        };
        // A search over everything: any recent write counts.
        marked(ANY)
            || read.iter().any(|i| marked(i))
            || (read.iter().any(|i| i == ANY) && marked(ANY_WRITE))
    }
}

/// The indices a bulk's items write (`None`: an item naming none, which counts as `*`),
/// resolved as [`indices`] resolves a path's.
pub(crate) fn written_indices<'a>(
    names: impl IntoIterator<Item = Option<&'a str>>,
    map: &ClusterMap,
) -> Vec<String> {
    let mut out = BTreeMap::new();
    for name in names {
        for i in indices(&format!("/{}", name.unwrap_or("")), map) {
            out.insert(i, ());
        }
    }
    if out.is_empty() {
        out.insert(ANY.to_owned(), ());
    }
    out.into_keys().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_field_and_parameter_order() {
        let a = key(
            "/i/_search?b=2&a=1",
            br#"{"size":1,"query":{"term":{"x":1}}}"#,
            false,
        );
        let b = key(
            "/i/_search?a=1&b=2",
            br#"{ "query":{"term":{"x":1}}, "size":1 }"#,
            false,
        );
        assert_eq!(a, b);
        assert_ne!(a, key("/i/_search?a=1&b=2", br#"{"size":2}"#, false));
        assert!(key("/i/_search", b"not json", false).is_none());
        let m1 = key("/_msearch", b"{\"index\":\"i\"}\n{\"size\":1}\n", true);
        let m2 = key("/_msearch", b"{\"index\": \"i\"}\n\n{\"size\": 1}", true);
        assert_eq!(m1, m2);
    }

    #[test]
    fn indices_resolve_aliases_and_wildcards() {
        let mut map = ClusterMap::default();
        map.indices.insert(
            "logs-1".into(),
            crate::upstream::search_cluster::IndexInfo {
                sharding: crate::upstream::search_cluster::Sharding {
                    shards: 1,
                    routing_shards: 1,
                    partition: 1,
                },
                primaries: vec![None],
                has_pipeline: false,
            },
        );
        map.aliases.insert("logs".into(), "logs-1".into());
        assert_eq!(indices("/logs/_search", &map), vec!["logs-1"]);
        assert_eq!(indices("/logs-*/_search", &map), vec!["*"]);
        assert_eq!(indices("/_search", &map), vec!["*"]);
        assert_eq!(indices("/logs-1,logs/_count", &map), vec!["logs-1"]);
        // An item to the alias, one to an index the map lacks.
        assert_eq!(
            written_indices([Some("logs"), Some("x")], &map),
            vec!["*", "logs-1"]
        );
        assert_eq!(written_indices([None], &map), vec!["*"]);
    }
}
