//! `bulk = "route_to_shards"`: a `_bulk` request split by the node that holds each document's
//! primary shard, so the cluster's coordinating node does no fan-out.
//!
//! The NDJSON body is read whole (its declared length is within `max_bulk_body`). Each action
//! line is parsed (its source line is kept as bytes, never parsed), its shard computed as the
//! cluster does ([`super::routing`]), and the items sent as one sub-request per node, in
//! parallel, each keeping the original order of its items. The answers' items are put back in
//! the original order, with the cluster's own per-item results and errors untouched.
//!
//! Items veloxy cannot place go to any node, which routes them itself: auto-generated IDs,
//! indices missing from the cluster map (the map is then refreshed early), indices with an
//! ingest pipeline, items with a `pipeline`. A body that is not valid NDJSON goes to one node
//! as it is, so the client gets the cluster's own error. When a node does not answer, each
//! of its items is reported failed (status 503, `veloxy_node_unavailable`); none is dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::json_answer;
use super::routing::Sharding;
use crate::message::Answer;
use crate::upstream::search_client::{call, CallError, Reply};
use crate::upstream::search_cluster::ClusterMap;

/// The largest answer read from one node.
const MAX_ANSWER: usize = 256 << 20;

/// A bulk request admitted for routing.
#[derive(Clone)]
pub(crate) struct Bulk {
    /// The index of a `/{index}/_bulk` URL.
    pub default_index: Option<String>,
    /// The URL's `routing` parameter: the default routing of every item.
    pub routing: Option<String>,
}

/// An item's action line, as much of it as routing needs.
#[derive(Deserialize)]
struct Meta {
    #[serde(rename = "_index")]
    index: Option<String>,
    #[serde(rename = "_id")]
    id: Option<IdValue>,
    routing: Option<String>,
    #[serde(rename = "_routing")]
    old_routing: Option<String>,
    pipeline: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum IdValue {
    Text(String),
    Number(serde_json::Number),
}

/// One item: its bytes in the body and where it goes.
pub(super) struct Item {
    range: std::ops::Range<usize>,
    op: String,
    index: Option<String>,
    id: Option<String>,
    dest: Option<SocketAddr>,
}

/// Splits `body` into items placed by `map`; `None` when it is not valid bulk NDJSON.
/// `unknown`: an item named an index the map lacks.
pub(super) fn split(
    body: &[u8],
    bulk: &Bulk,
    map: &ClusterMap,
    unknown: &mut bool,
) -> Option<Vec<Item>> {
    let mut items = Vec::new();
    let mut pos = 0;
    let next_line =
        |from: usize| memchr::memchr(b'\n', &body[from..]).map_or(body.len(), |i| from + i + 1);
    while pos < body.len() {
        let end = next_line(pos);
        let line = body[pos..end].trim_ascii();
        if line.is_empty() {
            pos = end;
            continue;
        }
        let action: HashMap<String, Meta> = serde_json::from_slice(line).ok()?;
        let (op, meta) = action.into_iter().next()?;
        let item_end = match op.as_str() {
            "delete" => end,
            "index" | "create" | "update" => {
                if end >= body.len() {
                    return None;
                }
                next_line(end)
            }
            _ => return None,
        };
        let index = meta.index.clone().or_else(|| bulk.default_index.clone());
        let id = meta.id.as_ref().map(|v| match v {
            IdValue::Text(s) => s.clone(),
            IdValue::Number(n) => n.to_string(),
        });
        let dest = place(&meta, index.as_deref(), id.as_deref(), bulk, map, unknown);
        items.push(Item {
            range: pos..item_end,
            op,
            index,
            id,
            dest,
        });
        pos = item_end;
    }
    (!items.is_empty()).then_some(items)
}

/// The node of an item's primary, when veloxy can tell.
fn place(
    meta: &Meta,
    index: Option<&str>,
    id: Option<&str>,
    bulk: &Bulk,
    map: &ClusterMap,
    unknown: &mut bool,
) -> Option<SocketAddr> {
    if meta.pipeline.is_some() {
        return None;
    }
    let (index, id) = (index?, id?);
    let Some(info) = map.index(index) else {
        *unknown = true;
        return None;
    };
    if info.has_pipeline {
        return None;
    }
    let routing = meta
        .routing
        .as_deref()
        .or(meta.old_routing.as_deref())
        .or(bulk.routing.as_deref());
    let s: Sharding = info.sharding;
    *info.primaries.get(s.shard(id, routing) as usize)?
}

/// What a sub-request's answer said, per item.
#[derive(Deserialize)]
struct Part<'a> {
    took: Option<u64>,
    #[serde(borrow)]
    items: Vec<&'a RawValue>,
}

/// The index each item writes (`None`: none named; `items` is `None` for a body that is not
/// bulk NDJSON, which may write anything).
pub(super) fn written(items: Option<&[Item]>) -> Vec<Option<&str>> {
    match items {
        None => vec![None],
        Some(items) => items.iter().map(|i| i.index.as_deref()).collect(),
    }
}

/// Runs a bulk split by [`split`] (`None`: sent as it is): `fallback` takes the items no node
/// was found for (the group's balancer's pick). Answers with the merged results, or the
/// single node's answer as it is.
pub(super) async fn run(
    items: Option<Vec<Item>>,
    target: &str,
    fields: &[(&str, &[u8])],
    body: Bytes,
    fallback: SocketAddr,
    timeout: Duration,
) -> Answer {
    let Some(items) = items else {
        let r = call("POST", fallback, target, fields, body, timeout, MAX_ANSWER).await;
        return passthrough(r);
    };
    // Unplaced items join a node that gets some anyway (fewer sub-requests), else `fallback`.
    let spare = items.iter().find_map(|i| i.dest).unwrap_or(fallback);
    let mut parts: Vec<(SocketAddr, Vec<usize>)> = Vec::new();
    for (n, item) in items.iter().enumerate() {
        let node = item.dest.unwrap_or(spare);
        match parts.iter_mut().find(|(a, _)| *a == node) {
            Some((_, list)) => list.push(n),
            None => parts.push((node, vec![n])),
        }
    }
    if let [(node, _)] = parts.as_slice() {
        let r = call("POST", *node, target, fields, body, timeout, MAX_ANSWER).await;
        return with_nodes(passthrough(r), 1);
    }
    let mut set = tokio::task::JoinSet::new();
    for (p, (node, list)) in parts.iter().enumerate() {
        let mut part = Vec::with_capacity(list.iter().map(|&n| items[n].range.len() + 1).sum());
        for &n in list {
            part.extend_from_slice(&body[items[n].range.clone()]);
            if part.last() != Some(&b'\n') {
                part.push(b'\n');
            }
        }
        let (node, target) = (*node, target.to_owned());
        let fields: Vec<(String, Vec<u8>)> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
            .collect();
        set.spawn(async move {
            let f: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (k.as_str(), &v[..])).collect();
            (
                p,
                call("POST", node, &target, &f, part.into(), timeout, MAX_ANSWER).await,
            )
        });
    }
    let mut answers: Vec<Option<Result<Reply, CallError>>> =
        (0..parts.len()).map(|_| None).collect();
    while let Some(done) = set.join_next().await {
        if let Ok((p, r)) = done {
            answers[p] = Some(r);
        }
    }
    with_nodes(merge(&items, &parts, answers), parts.len())
}

/// Says how many nodes a routed bulk went to (`X-Veloxy-Bulk-Nodes`), for operators and tests.
fn with_nodes(mut a: Answer, n: usize) -> Answer {
    a.headers
        .push(("x-veloxy-bulk-nodes", Bytes::from(n.to_string())));
    a
}

/// A single node's answer as it is (its status, type and body).
pub(super) fn passthrough(r: Result<Reply, CallError>) -> Answer {
    match r {
        Ok(r) => {
            let ct = r
                .content_type
                .as_deref()
                .and_then(|c| std::str::from_utf8(c).ok())
                .unwrap_or(super::JSON)
                .to_owned();
            Answer::fixed(r.status, &r.body, &ct)
        }
        Err(e) => {
            tracing::warn!(error = %e, "search: bulk to a node failed");
            let body = super::error_body(503, "veloxy_node_unavailable", &e.to_string());
            json_answer(503, body)
        }
    }
}

/// The items of every part back in the original order.
fn merge(
    items: &[Item],
    parts: &[(SocketAddr, Vec<usize>)],
    answers: Vec<Option<Result<Reply, CallError>>>,
) -> Answer {
    let mut out: Vec<Option<String>> = vec![None; items.len()];
    let mut took = 0;
    let mut errors = false;
    for ((_, list), answer) in parts.iter().zip(&answers) {
        let failure = match answer {
            None => Some((503, "the sub-request was lost".to_owned())),
            Some(Err(e)) => Some((503, e.to_string())),
            Some(Ok(r)) => match serde_json::from_slice::<Part>(&r.body) {
                Ok(p) if (200..300).contains(&r.status) && p.items.len() == list.len() => {
                    took = took.max(p.took.unwrap_or(0));
                    for (&n, raw) in list.iter().zip(&p.items) {
                        let text = raw.get();
                        errors |= text.contains("\"error\"");
                        out[n] = Some(text.to_owned());
                    }
                    None
                }
                _ => Some((
                    if r.status >= 400 { r.status } else { 502 },
                    format!(
                        "the node answered status {}: {}",
                        r.status,
                        String::from_utf8_lossy(&r.body[..r.body.len().min(300)])
                    ),
                )),
            },
        };
        if let Some((status, reason)) = failure {
            tracing::warn!(%reason, items = list.len(), "search: part of a bulk failed");
            errors = true;
            for &n in list {
                out[n] = Some(failed_item(&items[n], status, &reason));
            }
        }
    }
    let mut body = format!("{{\"took\":{took},\"errors\":{errors},\"items\":[");
    for (n, item) in out.iter().enumerate() {
        if n > 0 {
            body.push(',');
        }
        body.push_str(item.as_deref().unwrap_or("null"));
    }
    body.push_str("]}");
    json_answer(200, Bytes::from(body))
}

/// The result of an item whose node did not answer, shaped like the cluster's item errors.
fn failed_item(item: &Item, status: u16, reason: &str) -> String {
    let reason = format!("veloxy: {reason}; the item may not have been applied (retry it)");
    serde_json::json!({ item.op.as_str(): {
        "_index": item.index, "_id": item.id, "status": status,
        "error": {"type": "veloxy_node_unavailable", "reason": reason}
    }})
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::search_cluster::IndexInfo;

    fn map() -> ClusterMap {
        let mut m = ClusterMap::default();
        m.indices.insert(
            "logs".into(),
            IndexInfo {
                sharding: Sharding {
                    shards: 2,
                    routing_shards: 512,
                    partition: 1,
                },
                primaries: vec![
                    Some("127.0.0.1:1".parse().unwrap()),
                    Some("127.0.0.1:2".parse().unwrap()),
                ],
                has_pipeline: false,
            },
        );
        m
    }

    #[test]
    fn items_are_split_with_their_source_lines() {
        let body = b"{\"index\":{\"_index\":\"logs\",\"_id\":\"1\"}}\n{\"a\":1}\n\
            {\"delete\":{\"_id\":\"2\"}}\n\
            {\"create\":{\"_index\":\"logs\"}}\n{\"b\":2}\n\
            {\"update\":{\"_index\":\"other\",\"_id\":\"3\"}}\n{\"doc\":{}}";
        let bulk = Bulk {
            default_index: Some("logs".into()),
            routing: None,
        };
        let mut unknown = false;
        let items = split(body, &bulk, &map(), &mut unknown).expect("valid");
        assert_eq!(items.len(), 4);
        assert_eq!(items[1].op, "delete");
        assert!(items[0].dest.is_some() && items[1].dest.is_some());
        // Auto-generated ID and an unknown index: the cluster places them.
        assert_eq!(items[2].dest, None);
        assert_eq!(items[3].dest, None);
        assert!(unknown);
        assert!(body[items[3].range.clone()].ends_with(b"{\"doc\":{}}"));
        // A source line missing, or garbage: not routable.
        assert!(split(
            b"{\"index\":{\"_id\":\"1\"}}\n",
            &bulk,
            &map(),
            &mut unknown
        )
        .is_none());
        assert!(split(b"not json\n", &bulk, &map(), &mut unknown).is_none());
    }
}
