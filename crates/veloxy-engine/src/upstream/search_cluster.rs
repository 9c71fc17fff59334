//! What veloxy knows of a search cluster behind an upstream group with `search = { ... }`:
//! its nodes (from `_nodes/http`, which become the group's backends) and, from the cluster
//! state, each index's sharding and the node of each primary shard (for bulk routing).
//!
//! The discovery thread refreshes it on the group's `discover` interval, and sooner when a
//! bulk met an index it did not know. Workers read it through one atomic load per bulk; the
//! view is made by the runtime (`runtime::live`) and kept by group name across reloads (a
//! reload never forgets the cluster).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde_json::Value;

use super::search_client::get_json;

/// How long one read of the cluster may take.
const READ_LIMIT: Duration = Duration::from_secs(5);

/// How long a node whose circuit breakers tripped is left out of the backends (and longer
/// while they keep tripping).
pub(crate) const SHED_FOR: Duration = Duration::from_secs(3);

/// What the shard computation needs of an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sharding {
    /// `number_of_shards`.
    pub shards: u32,
    /// `routing_num_shards` (a multiple of `shards`).
    pub routing_shards: u32,
    /// `routing_partition_size` (1: not partitioned).
    pub partition: u32,
}

/// An index as the cluster state shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexInfo {
    pub sharding: Sharding,
    /// The HTTP address of each shard's started primary (`None`: unassigned or on a node
    /// without HTTP).
    pub primaries: Vec<Option<SocketAddr>>,
    /// A `default_pipeline` or `final_pipeline` may change a document's routing: its
    /// documents are not routed by veloxy.
    pub has_pipeline: bool,
}

/// One reading of the cluster.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ClusterMap {
    pub indices: HashMap<String, IndexInfo>,
    /// Aliases that name exactly one index (or one write index).
    pub aliases: HashMap<String, String>,
}

impl ClusterMap {
    /// The index `name` resolves to (itself, or the one index of an alias).
    pub(crate) fn index(&self, name: &str) -> Option<&IndexInfo> {
        self.indices
            .get(name)
            .or_else(|| self.indices.get(self.aliases.get(name)?))
    }
}

/// `search = { ... }` of an upstream group, compiled.
#[derive(Debug, Clone)]
pub(crate) struct SearchGroup {
    /// `discover`: how often the nodes and the cluster state are read (zero: never).
    pub discover: Duration,
    /// `roles`: the node roles that become backends (empty: all).
    pub roles: Vec<String>,
    /// What was read of the cluster (bound by the runtime, which keeps it by group name
    /// across reloads).
    pub cluster: crate::late::Late<ClusterView>,
}

/// What the last round read of the cluster's health.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ClusterHealth {
    /// `_cluster/health`'s status (`green`, `yellow`, `red`), or `unknown` when it could not
    /// be read.
    pub status: String,
    /// `_cluster/health`'s `number_of_nodes`.
    pub nodes: u32,
    /// Nodes left out of the backends: their circuit breakers tripped within [`SHED_FOR`].
    pub shedding: Vec<SocketAddr>,
}

/// Node id -> (breaker trips summed over its breakers, when a trip was last seen).
type Trips = HashMap<String, (u64, Option<std::time::Instant>)>;

/// The current [`ClusterMap`] of a group, shared by the discovery thread and the workers.
#[derive(Debug, Default)]
pub(crate) struct ClusterView {
    map: ArcSwap<ClusterMap>,
    /// Read by the admin endpoint only (not on any request's path).
    health: Mutex<ClusterHealth>,
    /// The discovery thread's memory of each node's breaker trips.
    trips: Mutex<Trips>,
    /// A bulk met an index missing from the map: the next discovery round comes early.
    stale: AtomicBool,
    wake: tokio::sync::Notify,
}

impl ClusterView {
    /// The current map (one atomic load).
    pub(crate) fn load(&self) -> arc_swap::Guard<Arc<ClusterMap>> {
        self.map.load()
    }

    /// Asks for an early refresh (once until it happens).
    pub(crate) fn mark_stale(&self) {
        if !self.stale.swap(true, Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// Waits `every`, or less when a refresh was asked for.
    pub(crate) async fn wait(&self, every: Duration) {
        if self.stale.load(Ordering::Relaxed) {
            return;
        }
        let _ = tokio::time::timeout(every, self.wake.notified()).await;
    }

    /// The cluster's health as last read.
    pub(crate) fn health(&self) -> ClusterHealth {
        lock(&self.health).clone()
    }

    fn store(&self, map: ClusterMap) {
        self.stale.store(false, Ordering::Relaxed);
        if **self.map.load() != map {
            self.map.store(Arc::new(map));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A node of the cluster with an HTTP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub name: String,
    pub http: SocketAddr,
    pub roles: Vec<String>,
}

/// Reads the cluster through the first seed that answers: its nodes (those with one of
/// `roles`, or all when `roles` is empty, less those shedding load while others remain) and
/// its map, which is stored in `view` with its health.
pub(crate) async fn refresh(
    seeds: &[SocketAddr],
    roles: &[String],
    view: &ClusterView,
) -> Result<Vec<Node>, String> {
    let mut last = String::from("no seeds");
    for seed in seeds {
        match read(*seed).await {
            Ok(reading) => return Ok(take(reading, roles, view, std::time::Instant::now())),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// One round's answers from a seed.
struct Reading {
    nodes: HashMap<String, Node>,
    map: ClusterMap,
    /// `(status, number_of_nodes)`, when `_cluster/health` answered.
    health: Option<(String, u32)>,
    /// Node id -> trips summed over its breakers, when node stats answered.
    trips: HashMap<String, u64>,
}

/// Stores a reading in `view` and returns the nodes to use as backends.
fn take(r: Reading, roles: &[String], view: &ClusterView, now: std::time::Instant) -> Vec<Node> {
    view.store(r.map);
    let shedding = shedding(&mut lock(&view.trips), &r.trips, now);
    let mut nodes: Vec<(bool, Node)> = r
        .nodes
        .into_iter()
        .filter(|(_, n)| roles.is_empty() || n.roles.iter().any(|x| roles.contains(x)))
        .map(|(id, n)| (shedding.contains(&id), n))
        .collect();
    if nodes.iter().all(|(shed, _)| *shed) {
        // A cluster short of memory everywhere is still better asked than refused by veloxy.
        nodes.iter_mut().for_each(|n| n.0 = false);
    }
    let mut shed: Vec<SocketAddr> = nodes.iter().filter(|n| n.0).map(|n| n.1.http).collect();
    shed.sort();
    let mut out: Vec<Node> = nodes
        .into_iter()
        .filter_map(|(s, n)| (!s).then_some(n))
        .collect();
    out.sort_by_key(|n| n.http);
    let (status, nodes) = r.health.unwrap_or_else(|| ("unknown".to_owned(), 0));
    *lock(&view.health) = ClusterHealth {
        status,
        nodes,
        shedding: shed,
    };
    out
}

/// Updates each node's remembered trips and returns the ids of the nodes that tripped within
/// [`SHED_FOR`]. A node seen for the first time has its count taken as the baseline.
fn shedding(
    memory: &mut Trips,
    now_trips: &HashMap<String, u64>,
    now: std::time::Instant,
) -> Vec<String> {
    memory.retain(|id, _| now_trips.contains_key(id));
    let mut out = Vec::new();
    for (id, &count) in now_trips {
        let entry = memory.entry(id.clone()).or_insert((count, None));
        if count > entry.0 {
            entry.1 = Some(now);
        }
        entry.0 = count;
        if entry.1.is_some_and(|t| now.duration_since(t) < SHED_FOR) {
            out.push(id.clone());
        }
    }
    out
}

async fn read(seed: SocketAddr) -> Result<Reading, String> {
    let nodes = get_json(seed, "/_nodes/http", READ_LIMIT).await?;
    let nodes = parse_nodes(&nodes);
    if nodes.is_empty() {
        return Err(format!(
            "{seed}: _nodes/http lists no node with an HTTP address"
        ));
    }
    let state = get_json(
        seed,
        "/_cluster/state/metadata,routing_table?flat_settings=true&filter_path=\
         metadata.indices.*.routing_num_shards,metadata.indices.*.settings,\
         metadata.indices.*.aliases,routing_table.indices.*.shards.*.primary,\
         routing_table.indices.*.shards.*.node,routing_table.indices.*.shards.*.state,\
         routing_table.indices.*.shards.*.shard",
        READ_LIMIT,
    )
    .await?;
    let map = parse_state(&state, &nodes);
    // Health and stats are extras: a cluster (or a user's permissions) without them still
    // gives its nodes and map.
    let health = get_json(
        seed,
        "/_cluster/health?filter_path=status,number_of_nodes",
        READ_LIMIT,
    )
    .await
    .ok()
    .and_then(|h| parse_health(&h));
    let trips = get_json(
        seed,
        "/_nodes/stats/breaker?filter_path=nodes.*.breakers.*.tripped",
        READ_LIMIT,
    )
    .await
    .map(|s| parse_trips(&s))
    .unwrap_or_default();
    Ok(Reading {
        nodes,
        map,
        health,
        trips,
    })
}

/// `_cluster/health`: its status and node count.
fn parse_health(v: &Value) -> Option<(String, u32)> {
    let status = v.get("status")?.as_str()?.to_owned();
    Some((status, number(v.get("number_of_nodes")).unwrap_or(0)))
}

/// `_nodes/stats/breaker`: node id -> trips summed over its breakers.
fn parse_trips(v: &Value) -> HashMap<String, u64> {
    let Some(nodes) = v.get("nodes").and_then(Value::as_object) else {
        return HashMap::new();
    };
    nodes
        .iter()
        .map(|(id, n)| {
            let sum = n.get("breakers").and_then(Value::as_object).map_or(0, |b| {
                b.values()
                    .filter_map(|x| x.get("tripped").and_then(Value::as_u64))
                    .sum()
            });
            (id.clone(), sum)
        })
        .collect()
}

/// `_nodes/http`: node id -> node.
pub(crate) fn parse_nodes(v: &Value) -> HashMap<String, Node> {
    let mut out = HashMap::new();
    let Some(nodes) = v.get("nodes").and_then(Value::as_object) else {
        return out;
    };
    for (id, n) in nodes {
        // "publish_address" is "ip:port", or "host/ip:port" when the node has a name.
        let Some(addr) = n
            .pointer("/http/publish_address")
            .and_then(Value::as_str)
            .map(|a| a.rsplit('/').next().unwrap_or(a))
            .and_then(|a| a.parse::<SocketAddr>().ok())
        else {
            continue;
        };
        let roles = n
            .get("roles")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let name = n
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(id)
            .to_owned();
        out.insert(
            id.clone(),
            Node {
                name,
                http: addr,
                roles,
            },
        );
    }
    out
}

fn number(v: Option<&Value>) -> Option<u32> {
    match v? {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// `_cluster/state/metadata,routing_table` (flat settings) into a map.
pub(crate) fn parse_state(v: &Value, nodes: &HashMap<String, Node>) -> ClusterMap {
    let mut map = ClusterMap::default();
    let empty = serde_json::Map::new();
    let meta = v
        .pointer("/metadata/indices")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let table = v
        .pointer("/routing_table/indices")
        .and_then(Value::as_object);
    let mut alias_targets: HashMap<String, Vec<String>> = HashMap::new();
    for (name, m) in meta {
        let settings = m.get("settings");
        let setting = |k: &str| settings.and_then(|s| s.get(k));
        let Some(shards) = number(setting("index.number_of_shards")).filter(|n| *n > 0) else {
            continue;
        };
        let routing_shards = number(m.get("routing_num_shards")).unwrap_or(shards);
        let partition = number(setting("index.routing_partition_size")).unwrap_or(1);
        let pipeline = |k: &str| {
            setting(k)
                .and_then(Value::as_str)
                .is_some_and(|p| !p.is_empty() && p != "_none")
        };
        let mut primaries = vec![None; shards as usize];
        let copies = table
            .and_then(|t| t.get(name))
            .and_then(|i| i.get("shards"))
            .and_then(Value::as_object);
        for (shard, list) in copies.into_iter().flatten() {
            let Some(i) = shard.parse::<usize>().ok().filter(|i| *i < primaries.len()) else {
                continue;
            };
            let primary = list.as_array().into_iter().flatten().find(|c| {
                c.get("primary").and_then(Value::as_bool) == Some(true)
                    && c.get("state").and_then(Value::as_str) == Some("STARTED")
            });
            primaries[i] = primary
                .and_then(|c| c.get("node").and_then(Value::as_str))
                .and_then(|id| nodes.get(id))
                .map(|n| n.http);
        }
        for a in m
            .get("aliases")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(a) = a.as_str() {
                alias_targets
                    .entry(a.to_owned())
                    .or_default()
                    .push(name.clone());
            }
        }
        map.indices.insert(
            name.clone(),
            IndexInfo {
                sharding: Sharding {
                    shards,
                    routing_shards,
                    partition,
                },
                primaries,
                has_pipeline: pipeline("index.default_pipeline")
                    || pipeline("index.final_pipeline"),
            },
        );
    }
    // An alias over several indices writes to its write index, which the state does not
    // show here: such aliases are left to the cluster.
    for (alias, targets) in alias_targets {
        if let [one] = targets.as_slice() {
            map.aliases.insert(alias, one.clone());
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_whose_breakers_trip_is_shed_for_a_while() {
        let stats = serde_json::json!({"nodes": {
            "a1": {"breakers": {"request": {"tripped": 0}, "parent": {"tripped": 2}}},
            "b2": {"breakers": {"request": {"tripped": 5}}}
        }});
        let mut memory = Trips::new();
        let t0 = std::time::Instant::now();
        let trips = parse_trips(&stats);
        assert_eq!(trips["a1"], 2);
        assert!(shedding(&mut memory, &trips, t0).is_empty(), "a baseline");
        let mut more = trips.clone();
        more.insert("b2".to_owned(), 6);
        assert_eq!(shedding(&mut memory, &more, t0), vec!["b2".to_owned()]);
        let later = t0 + SHED_FOR / 2;
        assert_eq!(shedding(&mut memory, &more, later), vec!["b2".to_owned()]);
        assert!(shedding(&mut memory, &more, t0 + SHED_FOR).is_empty());
        // Shed while others remain; never all of them.
        let node = |id: &str, port: u16| {
            (
                id.to_owned(),
                Node {
                    name: id.to_owned(),
                    http: SocketAddr::from(([127, 0, 0, 1], port)),
                    roles: vec!["data".to_owned()],
                },
            )
        };
        let view = ClusterView::default();
        let reading = |b2: u64| Reading {
            nodes: [node("a1", 9201), node("b2", 9202)].into_iter().collect(),
            map: ClusterMap::default(),
            health: Some(("yellow".to_owned(), 2)),
            trips: [("a1".to_owned(), 0), ("b2".to_owned(), b2)]
                .into_iter()
                .collect(),
        };
        assert_eq!(take(reading(0), &[], &view, t0).len(), 2);
        let kept = take(reading(1), &[], &view, t0);
        assert_eq!(
            kept.iter().map(|n| n.http.port()).collect::<Vec<_>>(),
            vec![9201]
        );
        let h = view.health();
        assert_eq!((h.status.as_str(), h.nodes), ("yellow", 2));
        assert_eq!(h.shedding, vec![SocketAddr::from(([127, 0, 0, 1], 9202))]);
        let both = Reading {
            trips: [("a1".to_owned(), 1), ("b2".to_owned(), 2)]
                .into_iter()
                .collect(),
            ..reading(2)
        };
        assert_eq!(take(both, &[], &view, t0).len(), 2, "never all shed");
        assert!(view.health().shedding.is_empty());
    }

    #[test]
    fn nodes_and_state_are_read() {
        let nodes = serde_json::json!({"nodes": {
            "a1": {"name": "n1", "roles": ["data", "cluster_manager"],
                   "http": {"publish_address": "127.0.0.1:9201"}},
            "b2": {"name": "n2", "roles": ["data"],
                   "http": {"publish_address": "localhost/127.0.0.1:9202"}},
            "c3": {"name": "n3", "roles": ["ingest"]}
        }});
        let nodes = parse_nodes(&nodes);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes["b2"].http, "127.0.0.1:9202".parse().unwrap());
        let state = serde_json::json!({
            "metadata": {"indices": {"logs": {
                "routing_num_shards": 768,
                "settings": {"index.number_of_shards": "3", "index.final_pipeline": "_none"},
                "aliases": ["current"]}}},
            "routing_table": {"indices": {"logs": {"shards": {
                "0": [{"state": "STARTED", "primary": true, "node": "a1", "shard": 0}],
                "1": [{"state": "STARTED", "primary": false, "node": "a1", "shard": 1},
                      {"state": "STARTED", "primary": true, "node": "b2", "shard": 1}],
                "2": [{"state": "UNASSIGNED", "primary": true, "node": null, "shard": 2}]
            }}}}
        });
        let map = parse_state(&state, &nodes);
        let logs = map.index("current").expect("the alias resolves");
        assert_eq!(
            logs.sharding,
            Sharding {
                shards: 3,
                routing_shards: 768,
                partition: 1
            }
        );
        assert!(!logs.has_pipeline);
        assert_eq!(
            logs.primaries,
            vec![
                Some("127.0.0.1:9201".parse().unwrap()),
                Some("127.0.0.1:9202".parse().unwrap()),
                None
            ]
        );
    }
}
