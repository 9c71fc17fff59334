//! `search = { ... }` on an upstream group (a search cluster whose nodes are discovered) and
//! on a route to such a group (bulk routing and guards).

use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::dur;
use crate::config::error::{ConfigError, Source};
use crate::config::file::{RouteSearchSection, UpstreamSearchSection};
use crate::config::{Backend, UpstreamGroup};
use crate::search::qcache::QueryCache;
use crate::search::SearchRoute;
use crate::upstream::addr::BackendAddr;
use crate::upstream::group::{Discovery, DiscoveryName};
use crate::upstream::search_cluster::SearchGroup;

const DEFAULT_DISCOVER: Duration = Duration::from_secs(30);
const DEFAULT_MAX_BULK_BODY: u64 = 64 << 20;
const DEFAULT_TTL: Duration = Duration::from_secs(60);

/// The group's search settings and, unless `discover = "0s"`, the discovery entry that reads
/// the cluster through `backends` (the seeds).
pub(super) fn upstream_search(
    src: &Source,
    key: &str,
    s: &Spanned<UpstreamSearchSection>,
    backends: &[Backend],
    discovered: bool,
) -> Result<(SearchGroup, Option<Discovery>), ConfigError> {
    let key = format!("{key}.search");
    let u = s.get_ref();
    if u.kind.get_ref() != "opensearch" {
        return Err(src.error(
            u.kind.span(),
            format!("{key}.kind"),
            format!(
                "{:?}: use \"opensearch\" (Elasticsearch 7+ clusters speak the same APIs)",
                u.kind.get_ref()
            ),
        ));
    }
    if discovered {
        return Err(src.error(
            s.span(),
            &key,
            "a search group finds its nodes itself: list seed addresses, not dns/srv entries",
        ));
    }
    let mut seeds = Vec::new();
    for b in backends {
        match (&b.addr, &b.tls_name) {
            (BackendAddr::Tcp(a), None) => seeds.push(*a),
            _ => {
                return Err(src.error(
                    s.span(),
                    &key,
                    format!(
                        "seed {} : search clusters are reached over plain HTTP on TCP so far",
                        b.server
                    ),
                ))
            }
        }
    }
    let every = dur(&u.discover, DEFAULT_DISCOVER);
    if !every.is_zero() && every < Duration::from_millis(100) {
        return Err(src.error(
            s.span(),
            format!("{key}.discover"),
            "at least 100ms (or \"0s\": off)",
        ));
    }
    let roles: Vec<String> = u
        .roles
        .as_ref()
        .map(|r| r.get_ref().clone())
        .unwrap_or_default();
    let entry = (!every.is_zero()).then(|| Discovery {
        name: DiscoveryName::Search {
            seeds: seeds.clone(),
            roles: roles.clone(),
        },
        every,
        weight: 1,
        tls_name: None,
        backup: false,
    });
    Ok((
        SearchGroup {
            discover: every,
            roles,
            cluster: crate::late::Late::empty(),
        },
        entry,
    ))
}

/// A route's `search`, for a route to `group`.
pub(super) fn route_search(
    src: &Source,
    key: &str,
    s: &Spanned<RouteSearchSection>,
    group: Option<&UpstreamGroup>,
    caches: &std::collections::HashMap<String, super::cache::CacheSpec>,
) -> Result<Arc<SearchRoute>, ConfigError> {
    let key = format!("{key}.search");
    let r = s.get_ref();
    let Some(search) = group.and_then(|g| g.search.as_ref()) else {
        return Err(src.error(
            s.span(),
            &key,
            "is for routes to a search group (an upstream with search = { kind = \"opensearch\" })",
        ));
    };
    if group.is_some_and(|g| g.protocol != crate::config::UpstreamProtocol::Http1) {
        return Err(src.error(
            s.span(),
            &key,
            "search groups speak HTTP/1.1 to their nodes (protocol = \"http1\")",
        ));
    }
    let route_to_shards = match r.bulk.as_ref() {
        None => false,
        Some(b) => match b.get_ref().as_str() {
            "forward" => false,
            "route_to_shards" => true,
            other => {
                return Err(src.error(
                    b.span(),
                    format!("{key}.bulk"),
                    format!("{other:?}: use \"forward\" (the default) or \"route_to_shards\""),
                ))
            }
        },
    };
    if let (Some(_), None) = (&r.ttl, &r.query_cache) {
        return Err(src.error(
            s.span(),
            format!("{key}.ttl"),
            "is the query cache's: set query_cache too",
        ));
    }
    let query_cache = match &r.query_cache {
        None => None,
        Some(c) => {
            let name = c.get_ref();
            let spec = caches.get(name).ok_or_else(|| {
                src.error(
                    c.span(),
                    format!("{key}.query_cache"),
                    format!("cache {name:?} is not defined (add [caches.{name}])"),
                )
            })?;
            let (store_name, store, max_object) = spec.store();
            let ttl = r.ttl.as_ref().map_or(DEFAULT_TTL, |t| t.0);
            if ttl.is_zero() {
                return Err(src.error(s.span(), format!("{key}.ttl"), "must be greater than zero"));
            }
            Some(Arc::new(QueryCache {
                slot: store,
                store_name,
                ttl,
                max_object,
            }))
        }
    };
    let deny = r
        .deny
        .as_ref()
        .map(|d| d.get_ref().clone())
        .unwrap_or_default();
    if let Some((d, bad)) = r.deny.as_ref().and_then(|d| {
        d.get_ref()
            .iter()
            .find(|a| !a.starts_with('_') || a.contains('/'))
            .map(|a| (d, a))
    }) {
        return Err(src.error(
            d.span(),
            format!("{key}.deny"),
            format!("{bad:?}: name APIs by their path segment, such as \"_delete_by_query\""),
        ));
    }
    let max_size = r.max_size.as_ref().map(|m| *m.get_ref());
    if max_size == Some(0) {
        let span = r.max_size.as_ref().map_or(0..0, |m| m.span());
        return Err(src.error(span, format!("{key}.max_size"), "must be at least 1"));
    }
    let max_bulk_body = match &r.max_bulk_body {
        None => DEFAULT_MAX_BULK_BODY,
        Some(v) => super::rules::size(src, &format!("{key}.max_bulk_body"), v)?,
    };
    Ok(Arc::new(SearchRoute {
        route_to_shards,
        max_size,
        deny,
        timeout: r.timeout.as_ref().map(|t| t.0).filter(|t| !t.is_zero()),
        max_bulk_body,
        cluster: search.cluster.clone(),
        query_cache,
    }))
}
