//! The search gateway: veloxy in front of an OpenSearch (or Elasticsearch 7+) cluster.
//!
//! # Layout
//!
//! - An upstream group with `search = { kind = "opensearch", ... }` treats its servers as
//!   seeds. The discovery thread ([`crate::upstream::discovery`]) reads `_nodes/http` from
//!   them and makes the cluster's nodes the group's backends, and reads the cluster state
//!   into a [`ClusterView`] (indices, their sharding and where each primary lives).
//! - A route with `search = { ... }` classifies each request ([`admit`]): denied APIs get 403
//!   here, searches get their `size` clamped and a `timeout` added to the query string, and
//!   with `bulk = "route_to_shards"` a `_bulk` request becomes a [`bulk::Job`]: the codec reads
//!   the body and [`bulk::run`] splits it by the primary's node of each document
//!   ([`routing`]), sends the parts in parallel and merges the per-item results in order.
//!
//! Everything else on such a route is forwarded as on any proxied route.

pub(crate) mod bulk;
pub(crate) mod qcache;
pub(crate) mod query;
pub(crate) mod routing;

use std::sync::Arc;
use std::time::Duration;

use crate::message::Head;
use crate::upstream::search_cluster::ClusterView;

/// A route's `search` settings, compiled.
#[derive(Debug)]
pub(crate) struct SearchRoute {
    /// `bulk = "route_to_shards"`.
    pub route_to_shards: bool,
    /// `max_size`: the largest `size` and `from + size` a search may ask for.
    pub max_size: Option<u32>,
    /// `deny`: API names (path segments starting with `_`) refused with 403.
    pub deny: Vec<String>,
    /// `timeout`: added to searches without one.
    pub timeout: Option<Duration>,
    /// `max_bulk_body`: larger bulk bodies are forwarded as they are.
    pub max_bulk_body: u64,
    /// The cluster the route's group discovered (shared with the discovery thread).
    pub cluster: crate::late::Late<ClusterView>,
    /// `query_cache` (with `ttl`).
    pub query_cache: Option<Arc<qcache::QueryCache>>,
}

/// What a search route does with a request.
pub(crate) enum Step {
    /// Forward it as it is.
    Pass,
    /// Refuse it: the denied API's name.
    Deny(String),
    /// Forward it with this request target (path and query).
    Target(String),
    /// A `_bulk` to split by shard: the default index of the URL (if any).
    Bulk(Option<String>),
    /// A search whose body the codec reads and [`query::clamp`]s, sent to this target.
    Query(String),
}

/// The largest search body read to clamp its `size` (larger ones are forwarded as they are).
pub(crate) const MAX_QUERY_BODY: u64 = 1 << 20;

/// The API a request path calls: its first segment that starts with `_`, and the index part
/// before it (if any).
fn api_of(path: &str) -> (Option<&str>, Option<&str>) {
    let mut index = None;
    for (i, seg) in path.split('/').filter(|s| !s.is_empty()).enumerate() {
        if seg.starts_with('_') {
            return (Some(seg), index);
        }
        if i == 0 {
            index = Some(seg);
        }
    }
    (None, index)
}

/// Classifies a request on a route with `s`: `target` is what would go upstream (the
/// client's, or the route's rewrite of it).
pub(crate) fn admit(s: &SearchRoute, head: &Head, target: &str) -> Step {
    let content_length = head
        .fields
        .get("content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    let path = target.split('?').next().unwrap_or("");
    let (api, index) = api_of(path);
    if let Some(qc) = &s.query_cache {
        // A write through veloxy drops the answers that read what it writes (a routed bulk
        // knows its indices once its body is read: see [`Job::run`]).
        let routed_bulk = api == Some("_bulk") && s.route_to_shards;
        if !matches!(head.method, "GET" | "HEAD") && !api.is_some_and(is_read) && !routed_bulk {
            qc.written(&qcache::indices(path, &s.cluster.get().load()));
        }
    }
    let Some(api) = api else {
        return Step::Pass;
    };
    if let Some(d) = s
        .deny
        .iter()
        .find(|d| d.as_str() == api || path.split('/').any(|seg| seg == d.as_str()))
    {
        return Step::Deny(d.clone());
    }
    match api {
        "_bulk" if head.method == "POST" || head.method == "PUT" => {
            // Only a declared length within the bound is buffered; the rest streams.
            // A bulk-wide ingest pipeline may change any document's routing.
            if s.route_to_shards
                && content_length.is_some_and(|n| n > 0 && n <= s.max_bulk_body)
                && query_param(target, "pipeline").is_none()
            {
                Step::Bulk(index.map(percent_decode))
            } else {
                Step::Pass
            }
        }
        "_search" | "_msearch" | "_count" => {
            // `_msearch` takes its timeout in each search, `_count` none at all.
            let rewritten = query_target(s, target, api == "_search");
            let body = content_length.is_some_and(|n| n > 0 && n <= MAX_QUERY_BODY);
            let in_body = s.max_size.is_some() || (api == "_msearch" && s.timeout.is_some());
            // The query cache keys on the body too: it reads bodies (or none) of every size
            // it takes.
            let cached = s.query_cache.is_some()
                && content_length.is_none_or(|n| n <= MAX_QUERY_BODY)
                && query_param(target, "request_cache").as_deref() != Some("false");
            match ((in_body && body && api != "_count") || cached, rewritten) {
                // `size` may be in the body: the codec reads it for [`query::clamp`].
                (true, t) => Step::Query(t.unwrap_or_else(|| target.to_owned())),
                (false, Some(t)) => Step::Target(t),
                (false, None) => Step::Pass,
            }
        }
        _ => Step::Pass,
    }
}

/// APIs that only read: a request to them is no write, whatever its method.
fn is_read(api: &str) -> bool {
    matches!(
        api,
        "_search"
            | "_msearch"
            | "_count"
            | "_mget"
            | "_field_caps"
            | "_validate"
            | "_explain"
            | "_search_shards"
            | "_termvectors"
            | "_mtermvectors"
            | "_refresh"
            | "_flush"
            | "_cat"
            | "_cluster"
            | "_nodes"
            | "_stats"
            | "_rank_eval"
            | "_render"
    )
}

/// The target with `size` clamped and `timeout` added, when either changes it.
fn query_target(s: &SearchRoute, target: &str, add_timeout: bool) -> Option<String> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut changed = false;
    let mut out: Vec<String> = Vec::new();
    let mut has_timeout = false;
    let mut from = 0u64;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "from" {
            from = v.parse().unwrap_or(0);
        }
        if k == "timeout" {
            has_timeout = true;
        }
        out.push(pair.to_owned());
    }
    if let Some(max) = s.max_size {
        let max = u64::from(max);
        for pair in &mut out {
            let Some(v) = pair.strip_prefix("size=") else {
                continue;
            };
            let size: u64 = v.parse().unwrap_or(0);
            let allowed = max.saturating_sub(from.min(max));
            if size > allowed {
                *pair = format!("size={allowed}");
                changed = true;
            }
        }
        if from > max {
            for pair in &mut out {
                if pair.starts_with("from=") {
                    *pair = format!("from={max}");
                    changed = true;
                }
            }
        }
    }
    if let (Some(t), false, true) = (s.timeout, has_timeout, add_timeout) {
        out.push(format!("timeout={}ms", t.as_millis()));
        changed = true;
    }
    changed.then(|| {
        if out.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", out.join("&"))
        }
    })
}

/// `%XX` escapes of an index name decoded (names are ASCII in practice; anything odd is kept).
fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_owned();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

/// A route's `search` as `veloxy check --print` writes it.
pub(crate) fn describe_route(s: &SearchRoute) -> String {
    let mut out = format!(
        "{{ bulk = {:?}, deny = {:?}, max_bulk_body = {}",
        if s.route_to_shards {
            "route_to_shards"
        } else {
            "forward"
        },
        s.deny,
        s.max_bulk_body
    );
    if let Some(m) = s.max_size {
        out.push_str(&format!(", max_size = {m}"));
    }
    if let Some(t) = s.timeout {
        out.push_str(&format!(", timeout = \"{}ms\"", t.as_millis()));
    }
    if let Some(qc) = &s.query_cache {
        out.push_str(&format!(
            ", query_cache = {:?}, ttl = \"{}ms\"",
            &*qc.store_name,
            qc.ttl.as_millis()
        ));
    }
    out.push_str(" }");
    out
}

/// A group's `search` as `veloxy check --print` writes it.
pub(crate) fn describe_group(g: &crate::upstream::search_cluster::SearchGroup) -> String {
    format!(
        "{{ kind = \"opensearch\", discover = \"{}ms\", roles = {:?} }}",
        g.discover.as_millis(),
        g.roles
    )
}

/// An error body shaped like the cluster's own.
pub(crate) fn error_body(status: u16, kind: &str, reason: &str) -> bytes::Bytes {
    bytes::Bytes::from(
        serde_json::json!({
            "error": {"root_cause": [{"type": kind, "reason": reason}],
                      "type": kind, "reason": reason},
            "status": status
        })
        .to_string(),
    )
}

/// The 403 of a denied API.
pub(crate) fn denied(api: &str) -> crate::message::Answer {
    let reason = format!("{api} is denied on this route by veloxy");
    json_answer(403, error_body(403, "veloxy_denied", &reason))
}

/// The media type of the cluster's answers, and of veloxy's own on search routes.
const JSON: &str = "application/json; charset=UTF-8";

/// A JSON answer.
fn json_answer(status: u16, body: bytes::Bytes) -> crate::message::Answer {
    crate::message::Answer::fixed(status, &body, JSON)
}

/// What a codec runs instead of forwarding, once it has read the request body whole.
#[derive(Clone)]
pub(crate) struct Job {
    kind: JobKind,
    route: Arc<SearchRoute>,
    /// Path and query sent to the nodes.
    target: String,
    /// Client fields the nodes get too (credentials, opaque ID, content type).
    fields: Vec<(&'static str, bytes::Bytes)>,
    /// The group's balancer's pick: where what veloxy does not place goes.
    node: std::net::SocketAddr,
    /// The group's `read_timeout`.
    timeout: Duration,
}

#[derive(Clone)]
enum JobKind {
    Bulk(bulk::Bulk),
    /// A search body to clamp (`_msearch`: NDJSON).
    Query {
        /// `Cache-Control: no-cache`: the cache is not read (the fresh answer is stored).
        refresh: bool,
        max_size: Option<u32>,
        timeout: Option<String>,
        multi: bool,
    },
}

/// Fields copied from the client's request to the nodes.
const COPIED: [&str; 3] = ["authorization", "x-opaque-id", "content-type"];

impl Job {
    /// The job of a [`Step::Bulk`] or [`Step::Query`]; `None` for other steps, or when the
    /// chosen backend is not a TCP address.
    pub(crate) fn new(
        step: Step,
        route: &Arc<SearchRoute>,
        (head, target): (&Head, &str),
        node: &crate::upstream::addr::BackendAddr,
        timeout: Duration,
    ) -> Option<Box<Job>> {
        let crate::upstream::addr::BackendAddr::Tcp(node) = node else {
            return None;
        };
        let (kind, target) = match step {
            Step::Bulk(default_index) => {
                let routing = query_param(target, "routing").filter(|r| !r.is_empty());
                (
                    JobKind::Bulk(bulk::Bulk {
                        default_index,
                        routing,
                    }),
                    target.to_owned(),
                )
            }
            Step::Query(target) => {
                let multi = target.split('?').next().unwrap_or("").ends_with("_msearch");
                let no_cache = head
                    .fields
                    .get("cache-control")
                    .is_some_and(|v| v.windows(8).any(|w| w.eq_ignore_ascii_case(b"no-cache")));
                let kind = JobKind::Query {
                    refresh: no_cache,
                    max_size: route.max_size,
                    // `_search` got its timeout in the URL.
                    timeout: route
                        .timeout
                        .filter(|_| multi)
                        .map(|t| format!("{}ms", t.as_millis())),
                    multi,
                };
                (kind, target)
            }
            _ => return None,
        };
        let fields = COPIED
            .iter()
            .filter_map(|n| Some((*n, bytes::Bytes::copy_from_slice(head.fields.get(n)?))))
            .collect();
        Some(Box::new(Job {
            kind,
            route: route.clone(),
            target,
            fields,
            node: *node,
            timeout,
        }))
    }

    /// The most body bytes the job takes (the declared length was checked against it).
    pub(crate) fn body_limit(&self) -> u64 {
        match self.kind {
            JobKind::Bulk(_) => self.route.max_bulk_body,
            JobKind::Query { .. } => MAX_QUERY_BODY,
        }
    }

    /// Runs the job on the request's `body`; the answer for the client.
    pub(crate) async fn run(self: Box<Self>, body: bytes::Bytes) -> crate::message::Answer {
        let fields: Vec<(&str, &[u8])> = self.fields.iter().map(|(k, v)| (*k, &v[..])).collect();
        match &self.kind {
            JobKind::Bulk(b) => {
                let map = self.route.cluster.get().load();
                let mut unknown = false;
                let items = bulk::split(&body, b, &map, &mut unknown);
                if unknown {
                    self.route.cluster.get().mark_stale();
                }
                // Dropped before (no stale answer is served while it runs) and after (none
                // stored from a search that raced it).
                let written = self.route.query_cache.as_ref().map(|qc| {
                    let w = qcache::written_indices(bulk::written(items.as_deref()), &map);
                    qc.written(&w);
                    (qc, w)
                });
                let answer =
                    bulk::run(items, &self.target, &fields, body, self.node, self.timeout).await;
                if let Some((qc, w)) = written {
                    qc.written(&w);
                }
                answer
            }
            JobKind::Query {
                refresh,
                max_size,
                timeout,
                multi,
            } => {
                let body =
                    query::clamp(&body, *max_size, timeout.as_deref(), *multi).unwrap_or(body);
                let cache = self.route.query_cache.as_ref().and_then(|qc| {
                    let key = qcache::key(&self.target, &body, *multi)?;
                    Some((qc, key))
                });
                if let Some((qc, key)) = &cache {
                    if let Some(hit) = (!refresh).then(|| qc.get(key)).flatten() {
                        return with_status(json_answer(200, hit), "HIT");
                    }
                }
                let r = crate::upstream::search_client::call(
                    "POST",
                    self.node,
                    &self.target,
                    &fields,
                    body,
                    self.timeout,
                    256 << 20,
                )
                .await;
                let Some((qc, key)) = cache else {
                    return bulk::passthrough(r);
                };
                if let Ok(reply) = &r {
                    if reply.status == 200 {
                        let path = self.target.split('?').next().unwrap_or("");
                        let read = qcache::indices(path, &self.route.cluster.get().load());
                        qc.put(key, &read, reply.body.clone());
                    }
                }
                with_status(bulk::passthrough(r), "MISS")
            }
        }
    }
}

/// `X-Cache` on the answers of a query-cached route.
fn with_status(mut a: crate::message::Answer, status: &'static str) -> crate::message::Answer {
    a.headers
        .push(("x-cache", bytes::Bytes::from_static(status.as_bytes())));
    a
}

/// The first value of `name` in `target`'s query string (undecoded).
fn query_param(target: &str, name: &str) -> Option<String> {
    let (_, q) = target.split_once('?')?;
    q.split('&').find_map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (k == name).then(|| percent_decode(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> SearchRoute {
        SearchRoute {
            route_to_shards: true,
            max_size: Some(100),
            deny: vec!["_delete_by_query".into()],
            timeout: Some(Duration::from_millis(1500)),
            max_bulk_body: 1 << 20,
            cluster: crate::late::Late::bound(Arc::default()),
            query_cache: None,
        }
    }

    #[test]
    fn apis_and_indices_are_found() {
        assert_eq!(api_of("/logs/_search"), (Some("_search"), Some("logs")));
        assert_eq!(api_of("/_bulk"), (Some("_bulk"), None));
        assert_eq!(api_of("/logs/_doc/1"), (Some("_doc"), Some("logs")));
        assert_eq!(api_of("/"), (None, None));
    }

    #[test]
    fn sizes_are_clamped_and_a_timeout_added() {
        let s = route();
        assert_eq!(
            query_target(&s, "/i/_search?size=500&q=x", true).as_deref(),
            Some("/i/_search?size=100&q=x&timeout=1500ms")
        );
        assert_eq!(
            query_target(&s, "/i/_search?from=80&size=50&timeout=1s", true).as_deref(),
            Some("/i/_search?from=80&size=20&timeout=1s")
        );
        assert_eq!(query_target(&s, "/i/_search?size=5&timeout=1s", true), None);
        assert_eq!(query_target(&s, "/_msearch", false), None);
        assert_eq!(percent_decode("my%2Dindex"), "my-index");
    }
}
