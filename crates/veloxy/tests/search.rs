//! The search gateway against a real OpenSearch cluster (2 nodes in one JVM, see the test
//! kit's `opensearch` module): bulk routing compared with the same bulk sent to the cluster
//! directly, the shard of every document compared with where the cluster put it, node
//! discovery while a node stops and starts, a node down mid-bulk, and the guards. Skipped
//! (and said so) where Java or Maven are missing.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use veloxy_testkit::*;

/// One cluster for the whole file: the tests take turns (one may stop a node).
fn cluster() -> Option<MutexGuard<'static, OpenSearch>> {
    static CLUSTER: OnceLock<Option<Mutex<OpenSearch>>> = OnceLock::new();
    let c = CLUSTER.get_or_init(|| OpenSearch::start(2, 1024).map(Mutex::new));
    Some(c.as_ref()?.lock().unwrap_or_else(|e| e.into_inner()))
}

struct Reply {
    status: u16,
    json: Value,
    nodes: Option<String>,
    cache: Option<String>,
}

/// One request, `body` sent as it is (NDJSON for bulks).
fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> Reply {
    call_with(addr, method, path, body, "")
}

/// [`call`] with more header lines (`extra`, each ending in CRLF).
fn call_with(addr: SocketAddr, method: &str, path: &str, body: &str, extra: &str) -> Reply {
    let ctype = if path.contains("_bulk") || path.contains("_msearch") {
        "application/x-ndjson"
    } else {
        "application/json"
    };
    let r = request(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: es\r\nContent-Type: {ctype}\r\n{extra}\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    Reply {
        status: r.status,
        json: serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        nodes: r.header("x-veloxy-bulk-nodes").map(str::to_owned),
        cache: r.header("x-cache").map(str::to_owned),
    }
}

/// One POST over HTTP/2 (h2c prior knowledge).
fn h2_post(addr: SocketAddr, path: &str, ctype: &str, body: &str) -> H2Reply {
    http2::runtime().block_on(async {
        let mut c = h2_connect(addr, None).await;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}{path}"))
            .header("content-type", ctype)
            .header("content-length", body.len())
            .body(())
            .unwrap();
        h2_send(&mut c, req, Some(body.to_owned().into()))
            .await
            .unwrap()
    })
}

fn ok(addr: SocketAddr, method: &str, path: &str, body: &str) -> Value {
    let r = call(addr, method, path, body);
    assert!(r.status < 300, "{method} {path}: {} {}", r.status, r.json);
    r.json
}

fn gateway(seed: SocketAddr, route: &str) -> Veloxy {
    gateway_every(seed, route, "300ms")
}

fn gateway_every(seed: SocketAddr, route: &str, discover: &str) -> Veloxy {
    veloxy(&format!(
        "[server]\nworkers = 2\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"es\"\nsearch = {{ {route} }}\n\
         [upstreams.es]\nservers = [\"{seed}\"]\n\
         search = {{ kind = \"opensearch\", discover = \"{discover}\" }}\n"
    ))
}

fn create_index(node: SocketAddr, name: &str, shards: u32) {
    let _ = call(node, "DELETE", &format!("/{name}"), "");
    ok(
        node,
        "PUT",
        &format!("/{name}?wait_for_active_shards=all"),
        &json!({"settings": {"number_of_shards": shards, "number_of_replicas": 0}}).to_string(),
    );
}

/// A bulk of every action kind on `index`, with item errors (a create of an existing ID, an
/// update of a missing one), custom routing and an auto-generated ID.
fn mixed_bulk(index: &str) -> String {
    let mut lines = Vec::new();
    for i in 0..60 {
        lines.push(json!({"index": {"_index": index, "_id": format!("doc-{i}-é")}}));
        lines.push(json!({"n": i}));
    }
    lines.push(json!({"index": {"_index": index, "_id": "routed", "routing": "user-7"}}));
    lines.push(json!({"n": "r"}));
    lines.push(json!({"delete": {"_index": index, "_id": "doc-3-é"}}));
    lines.push(json!({"create": {"_index": index, "_id": "doc-4-é"}}));
    lines.push(json!({"n": "dup"}));
    lines.push(json!({"update": {"_index": index, "_id": "doc-5-é"}}));
    lines.push(json!({"doc": {"updated": true}}));
    lines.push(json!({"update": {"_index": index, "_id": "missing"}}));
    lines.push(json!({"doc": {"n": 1}}));
    lines.push(json!({"create": {"_index": index}}));
    lines.push(json!({"auto": true}));
    let mut s: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    s.push('\n');
    s
}

/// An item's result without what differs between two indices or runs.
fn comparable(item: &Value) -> Value {
    let (op, r) = item.as_object().unwrap().iter().next().unwrap();
    let auto = r["_id"]
        .as_str()
        .is_some_and(|id| !id.starts_with("doc") && id != "routed" && id != "missing");
    json!({
        "op": op, "status": r["status"], "result": r["result"], "version": r["_version"],
        "id": if auto { json!("auto") } else { r["_id"].clone() },
        "error": r["error"]["type"],
    })
}

fn documents(node: SocketAddr, index: &str) -> Vec<(String, Value)> {
    ok(node, "POST", &format!("/{index}/_refresh"), "");
    let r = ok(
        node,
        "POST",
        &format!("/{index}/_search"),
        &json!({"size": 1000, "query": {"match_all": {}}, "sort": ["_doc"]}).to_string(),
    );
    let mut docs: Vec<(String, Value)> = r["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| !h["_source"]["auto"].as_bool().unwrap_or(false))
        .map(|h| (h["_id"].as_str().unwrap().to_owned(), h["_source"].clone()))
        .collect();
    docs.sort_by(|a, b| a.0.cmp(&b.0));
    docs
}

#[test]
fn a_routed_bulk_gives_exactly_what_a_direct_bulk_gives() {
    let Some(os) = cluster() else { return };
    let node = os.nodes[0];
    create_index(node, "direct", 4);
    create_index(node, "routed", 4);
    let v = gateway(node, "bulk = \"route_to_shards\"");
    let direct = ok(node, "POST", "/_bulk", &mixed_bulk("direct"));
    // Through veloxy, over HTTP/1.1: split over both nodes.
    let routed = call(v.addr, "POST", "/_bulk", &mixed_bulk("routed"));
    assert_eq!(routed.status, 200, "{}", routed.json);
    assert_eq!(
        routed.nodes.as_deref(),
        Some("2"),
        "the bulk went to both nodes"
    );
    assert_eq!(routed.json["errors"], true);
    let a: Vec<Value> = direct["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(comparable)
        .collect();
    let b: Vec<Value> = routed.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(comparable)
        .collect();
    assert_eq!(a, b, "the same results, item by item, in order");
    assert_eq!(documents(node, "direct"), documents(node, "routed"));
    assert_eq!(
        ok(node, "GET", "/routed/_count", "")["count"],
        ok(node, "GET", "/direct/_count", "")["count"]
    );
}

#[test]
fn a_routed_bulk_over_http2_and_with_a_url_index() {
    let Some(os) = cluster() else { return };
    let node = os.nodes[0];
    create_index(node, "h2bulk", 3);
    let v = gateway(node, "bulk = \"route_to_shards\"");
    // Discovery has seen the new index once the map refreshes (300 ms).
    std::thread::sleep(Duration::from_millis(700));
    let body: String = (0..40)
        .flat_map(|i| [json!({"index": {"_id": i.to_string()}}), json!({"i": i})])
        .map(|l| l.to_string() + "\n")
        .collect();
    let reply = h2_post(v.addr, "/h2bulk/_bulk", "application/x-ndjson", &body);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-veloxy-bulk-nodes"), Some("2"));
    let j: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(j["errors"], false, "{j}");
    let ids: Vec<&str> = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["index"]["_id"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..40).map(|i| i.to_string()).collect();
    assert_eq!(ids, want, "items in the original order");
    ok(node, "POST", "/h2bulk/_refresh", "");
    assert_eq!(ok(node, "GET", "/h2bulk/_count", "")["count"], 40);
}

#[test]
fn every_document_lands_on_the_shard_veloxy_computes() {
    // The documents go to the cluster directly; the cluster says where it put each one
    // (explain), and veloxy must send each to that shard's node: it splits a bulk of the same
    // IDs into exactly one part per node holding primaries, each doc on its primary's node.
    let Some(os) = cluster() else { return };
    let node = os.nodes[0];
    create_index(node, "placed", 5);
    let ids: Vec<String> = (0..200)
        .map(|i| match i % 4 {
            0 => format!("{i}"),
            1 => format!("user-{i}@example.com"),
            2 => format!("ünïcödé-{i}-日本"),
            _ => format!("{:x}", i * 7919),
        })
        .collect();
    let body: String = ids
        .iter()
        .flat_map(|id| {
            [
                json!({"index": {"_index": "placed", "_id": id}}),
                json!({"x": 1}),
            ]
        })
        .map(|l| l.to_string() + "\n")
        .collect();
    ok(node, "POST", "/_bulk?refresh=true", &body);
    let shards = ok(node, "GET", "/_cat/shards/placed?format=json", "");
    let node_of_shard: std::collections::HashMap<String, String> = shards
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard"].as_str().unwrap().to_owned(),
                s["node"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    // Where each document is, by the cluster's own account.
    let hits = ok(
        node,
        "POST",
        "/placed/_search",
        &json!({"size": 500, "explain": true, "query": {"match_all": {}}}).to_string(),
    );
    let mut per_node: std::collections::HashMap<String, Vec<String>> = Default::default();
    for h in hits["hits"]["hits"].as_array().unwrap() {
        let shard = h["_shard"].as_str().unwrap(); // "[placed][N]"
        let n = shard
            .trim_end_matches(']')
            .rsplit('[')
            .next()
            .unwrap()
            .to_owned();
        per_node
            .entry(node_of_shard[&n].clone())
            .or_default()
            .push(h["_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(per_node.values().map(Vec::len).sum::<usize>(), ids.len());
    // Each node's own IDs, overwritten through veloxy: a bulk of one node's documents goes
    // to that node alone; a mix of two nodes' goes to two.
    let v = gateway(node, "bulk = \"route_to_shards\"");
    std::thread::sleep(Duration::from_millis(700));
    for docs in per_node.values() {
        let body: String = docs
            .iter()
            .flat_map(|id| {
                [
                    json!({"index": {"_index": "placed", "_id": id}}),
                    json!({"x": 2}),
                ]
            })
            .map(|l| l.to_string() + "\n")
            .collect();
        let r = call(v.addr, "POST", "/_bulk", &body);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.nodes.as_deref(),
            Some("1"),
            "one node's documents: one part"
        );
        assert_eq!(r.json["errors"], false);
    }
    assert_eq!(per_node.len(), 2, "5 shards over 2 nodes");
    let r = call(v.addr, "POST", "/_bulk", &body);
    assert_eq!(r.nodes.as_deref(), Some("2"));
}

#[test]
fn guards_refuse_apis_and_clamp_sizes() {
    let Some(os) = cluster() else { return };
    let node = os.nodes[0];
    create_index(node, "guarded", 1);
    let body: String = (0..30)
        .flat_map(|i| [json!({"index": {"_id": i.to_string()}}), json!({"i": i})])
        .map(|l| l.to_string() + "\n")
        .collect();
    ok(node, "POST", "/guarded/_bulk?refresh=true", &body);
    let v = gateway(
        node,
        "max_size = 5, deny = [\"_delete_by_query\", \"_update_by_query\"], timeout = \"5s\"",
    );
    let r = call(
        v.addr,
        "POST",
        "/guarded/_delete_by_query",
        r#"{"query":{"match_all":{}}}"#,
    );
    assert_eq!(r.status, 403);
    assert_eq!(r.json["error"]["type"], "veloxy_denied");
    assert_eq!(
        ok(node, "GET", "/guarded/_count", "")["count"],
        30,
        "nothing deleted"
    );
    // size in the body, in the URL, and from + size.
    let hits = |r: &Value| r["hits"]["hits"].as_array().unwrap().len();
    let r = ok(v.addr, "POST", "/guarded/_search", r#"{"size": 25}"#);
    assert_eq!(hits(&r), 5);
    let r = ok(v.addr, "GET", "/guarded/_search?size=25", "");
    assert_eq!(hits(&r), 5);
    let r = ok(
        v.addr,
        "POST",
        "/guarded/_search",
        r#"{"from": 3, "size": 25}"#,
    );
    assert_eq!(hits(&r), 2);
    let r = ok(v.addr, "POST", "/guarded/_search", r#"{"size": 2}"#);
    assert_eq!(hits(&r), 2, "small sizes pass");
    let m = ok(
        v.addr,
        "POST",
        "/_msearch",
        "{\"index\":\"guarded\"}\n{\"size\":20}\n{\"index\":\"guarded\"}\n{\"size\":1}\n",
    );
    let sizes: Vec<usize> = m["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(hits)
        .collect();
    assert_eq!(sizes, vec![5, 1]);
    // The same guards over HTTP/2: the refusal, the clamp in a body and in an _msearch.
    let reply = h2_post(
        v.addr,
        "/guarded/_update_by_query",
        "application/json",
        r#"{"query":{"match_all":{}}}"#,
    );
    let json: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    assert_eq!(
        (reply.status, &json["error"]["type"]),
        (403, &json!("veloxy_denied"))
    );
    let reply = h2_post(
        v.addr,
        "/guarded/_search",
        "application/json",
        r#"{"size": 25}"#,
    );
    assert_eq!(reply.status, 200);
    assert_eq!(hits(&serde_json::from_slice(&reply.body).unwrap()), 5);
    let reply = h2_post(
        v.addr,
        "/_msearch",
        "application/x-ndjson",
        "{\"index\":\"guarded\"}\n{\"from\":1,\"size\":20}\n",
    );
    let m: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(hits(&m["responses"][0]), 4, "{m}");
}

#[test]
fn nodes_are_discovered_and_a_node_down_mid_bulk_loses_nothing() {
    let Some(mut os) = cluster() else { return };
    let (n1, n2) = (os.nodes[0], os.nodes[1]);
    create_index(n1, "fleet", 4);
    // Only node 1 is configured: node 2 is found through it. Rounds 2 s apart: the bulk
    // below most likely meets a map that still shows node 2.
    let v = gateway_every(n1, "bulk = \"route_to_shards\"", "2s");
    let node_names = || {
        (0..8)
            .map(|_| {
                ok(v.addr, "GET", "/_nodes/_local", "")["nodes"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .next()
                    .unwrap()
                    .clone()
            })
            .collect::<std::collections::HashSet<String>>()
    };
    assert!(
        eventually(Duration::from_secs(10), || node_names().len() == 2),
        "both nodes serve"
    );
    let body: String = (0..100)
        .flat_map(|i| {
            [
                json!({"index": {"_index": "fleet", "_id": format!("f{i}")}}),
                json!({"i": i}),
            ]
        })
        .map(|l| l.to_string() + "\n")
        .collect();
    // Node 2 stops: the map still says it holds primaries until the cluster notices, so
    // its items fail, each reported; node 1's succeed. Nothing is silently dropped.
    os.stop_node(2);
    let r = call(v.addr, "POST", "/_bulk", &body);
    assert_eq!(r.status, 200, "{}", r.json);
    let items = r.json["items"].as_array().unwrap();
    assert_eq!(items.len(), 100);
    let failed = items
        .iter()
        .filter(|i| i["index"]["error"].is_object())
        .count();
    let created = items.iter().filter(|i| i["index"]["status"] == 201).count();
    assert_eq!(failed + created, 100, "every item has an outcome");
    if r.nodes.as_deref() == Some("2") {
        assert!(
            failed > 0 && created > 0,
            "node 2's items failed, node 1's went in"
        );
    }
    // Discovery drops the stopped node: every request is answered by node 1.
    assert!(eventually(Duration::from_secs(20), || node_names().len() == 1));
    os.start_node(2);
    assert!(
        eventually(Duration::from_secs(30), || node_names().len() == 2),
        "node 2 is back"
    );
    // With node 2's shards back (a refresh waits for unassigned shards), the index holds
    // exactly the items reported created.
    ok(n2, "POST", "/fleet/_refresh", "");
    assert_eq!(ok(n1, "GET", "/fleet/_count", "")["count"], created as u64);
}

#[test]
fn the_query_cache_answers_repeats_and_forgets_what_veloxy_writes() {
    let Some(os) = cluster() else { return };
    let node = os.nodes[0];
    create_index(node, "cached", 2);
    create_index(node, "other", 1);
    let docs = |index: &str, from: usize, n: usize| -> String {
        (from..from + n)
            .flat_map(|i| {
                [
                    json!({"index": {"_index": index, "_id": i.to_string()}}),
                    json!({"i": i}),
                ]
            })
            .map(|l| l.to_string() + "\n")
            .collect()
    };
    ok(node, "POST", "/_bulk?refresh=true", &docs("cached", 0, 10));
    ok(node, "POST", "/_bulk?refresh=true", &docs("other", 0, 1));
    let v = veloxy(&format!(
        "[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [caches.q]\nmemory = \"64MiB\"\n\
         [[routes]]\nupstream = \"es\"\n\
         search = {{ bulk = \"route_to_shards\", query_cache = \"q\", ttl = \"1m\" }}\n\
         [upstreams.es]\nservers = [\"{node}\"]\n\
         search = {{ kind = \"opensearch\", discover = \"300ms\" }}\n"
    ));
    std::thread::sleep(Duration::from_millis(700));
    let total = |r: &Reply| r.json["hits"]["total"]["value"].as_u64().unwrap();
    let search = |body: &str| call(v.addr, "POST", "/cached/_search", body);
    let first = search(r#"{"query":{"match_all":{}},"size":50}"#);
    assert_eq!(
        (first.status, first.cache.as_deref(), total(&first)),
        (200, Some("MISS"), 10)
    );
    // The same search written otherwise: one entry.
    let again = search(r#"{ "size": 50, "query": { "match_all": {} } }"#);
    assert_eq!(again.cache.as_deref(), Some("HIT"));
    assert_eq!(again.json, first.json, "the stored answer");
    // A write veloxy does not see stays unseen until the TTL; one to another index through
    // veloxy leaves this entry alone.
    ok(node, "POST", "/_bulk?refresh=true", &docs("cached", 10, 1));
    ok(v.addr, "POST", "/_bulk?refresh=true", &docs("other", 1, 1));
    let r = search(r#"{"query":{"match_all":{}},"size":50}"#);
    assert_eq!((r.cache.as_deref(), total(&r)), (Some("HIT"), 10));
    // A write to it through veloxy drops it: the next answer is the cluster's, 12 documents.
    ok(
        v.addr,
        "POST",
        "/_bulk?refresh=true",
        &docs("cached", 11, 1),
    );
    let r = search(r#"{"query":{"match_all":{}},"size":50}"#);
    assert_eq!((r.cache.as_deref(), total(&r)), (Some("MISS"), 12));
    // Not stored while the write settles (2 s); stored again after.
    let r = search(r#"{"query":{"match_all":{}},"size":50}"#);
    assert_eq!(r.cache.as_deref(), Some("MISS"));
    std::thread::sleep(Duration::from_millis(2100));
    let _ = search(r#"{"query":{"match_all":{}},"size":50}"#);
    let r = search(r#"{"query":{"match_all":{}},"size":50}"#);
    assert_eq!((r.cache.as_deref(), total(&r)), (Some("HIT"), 12));
    // A search over every index is dropped by a write to any index.
    let everything = || call(v.addr, "POST", "/_count", r#"{"query":{"match_all":{}}}"#);
    std::thread::sleep(Duration::from_millis(2100));
    let _ = everything();
    assert_eq!(everything().cache.as_deref(), Some("HIT"));
    ok(v.addr, "POST", "/_bulk?refresh=true", &docs("other", 2, 1));
    assert_eq!(everything().cache.as_deref(), Some("MISS"));
    // A document write (not a bulk) through veloxy counts too.
    ok(v.addr, "PUT", "/cached/_doc/x?refresh=true", r#"{"i": 99}"#);
    let r = search(r#"{"query":{"match_all":{}},"size":50}"#);
    assert_eq!((r.cache.as_deref(), total(&r)), (Some("MISS"), 13));
    // Bypass: the cluster's request_cache=false skips the cache; no-cache refreshes it.
    let r = call(
        v.addr,
        "POST",
        "/cached/_search?request_cache=false",
        r#"{"size":1}"#,
    );
    assert_eq!((r.status, r.cache), (200, None));
    let r = call_with(
        v.addr,
        "POST",
        "/cached/_count",
        "{}",
        "Cache-Control: no-cache\r\n",
    );
    assert_eq!(
        (r.cache.as_deref(), r.json["count"].as_u64()),
        (Some("MISS"), Some(13))
    );
    // Over HTTP/2: the same entry.
    std::thread::sleep(Duration::from_millis(2100));
    let body = r#"{"query":{"match_all":{}},"size":5}"#;
    let _ = search(body);
    let reply = h2_post(v.addr, "/cached/_search", "application/json", body);
    assert_eq!((reply.status, reply.header("x-cache")), (200, Some("HIT")));
}

#[test]
fn rate_limits_can_be_per_index() {
    let Some(os) = cluster() else { return };
    let node = os.nodes[0];
    create_index(node, "limited-a", 1);
    create_index(node, "limited-b", 1);
    let v = veloxy(&format!(
        "[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"es\"\nsearch = {{}}\n\
         rate_limit = {{ rate = \"1/m\", burst = 2, key = \"index\" }}\n\
         [upstreams.es]\nservers = [\"{node}\"]\n\
         search = {{ kind = \"opensearch\", discover = \"300ms\" }}\n"
    ));
    let status = |path: &str| call(v.addr, "GET", path, "").status;
    assert_eq!(status("/limited-a/_search"), 200);
    assert_eq!(status("/limited-a/_count"), 200);
    assert_eq!(status("/limited-a/_search"), 429, "index a used its burst");
    assert_eq!(
        status("/limited-b/_search"),
        200,
        "index b has its own bucket"
    );
}

/// Puts the cluster's request circuit breaker back when the test ends, failed or not.
struct BreakerLimit(SocketAddr);

impl BreakerLimit {
    fn set(node: SocketAddr, limit: Value) -> Self {
        let body = json!({"transient": {"indices.breaker.request.limit": limit}});
        ok(node, "PUT", "/_cluster/settings", &body.to_string());
        BreakerLimit(node)
    }
}

impl Drop for BreakerLimit {
    fn drop(&mut self) {
        let body = json!({"transient": {"indices.breaker.request.limit": null}});
        call(self.0, "PUT", "/_cluster/settings", &body.to_string());
    }
}

#[test]
fn a_node_whose_breakers_trip_is_left_out_and_health_is_shown() {
    let Some(os) = cluster() else { return };
    let (n1, n2) = (os.nodes[0], os.nodes[1]);
    // One shard, held by node 2: an aggregation over it runs there.
    let local = ok(n2, "GET", "/_nodes/_local", "");
    let name = local["nodes"].as_object().unwrap().values().next().unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let settings = json!({"settings": {"number_of_shards": 1, "number_of_replicas": 0,
                          "index.routing.allocation.require._name": name}});
    ok(
        n1,
        "PUT",
        "/hot?wait_for_active_shards=all",
        &settings.to_string(),
    );
    ok(n1, "POST", "/hot/_doc/1?refresh=true", r#"{"k": "a"}"#);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"es\"\nsearch = {{ bulk = \"forward\" }}\n\
         [upstreams.es]\nservers = [\"{n1}\"]\n\
         search = {{ kind = \"opensearch\", discover = \"200ms\" }}\n"
    ));
    let admin = admin_addr(&v);
    let group = || -> Value {
        let r = get(admin, "/upstreams");
        serde_json::from_slice::<Value>(&r.body).unwrap()["upstreams"][0].clone()
    };
    let addrs = |g: &Value| -> Vec<String> {
        g["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["addr"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(10), || addrs(&group()).len() == 2),
        "both nodes found: {}",
        group()
    );
    let g = group();
    assert_eq!(g["cluster"]["status"], "green", "{g}");
    assert_eq!(g["cluster"]["nodes"], 2);
    assert_eq!(g["cluster"]["shedding"], json!([]));
    // Node 2 runs short of memory: its request breaker trips on an aggregation.
    let limit = BreakerLimit::set(n1, json!("1b"));
    let agg = r#"{"size": 0, "aggs": {"k": {"terms": {"field": "k.keyword"}}}}"#;
    // Sent to node 2 itself, so that no other node's breaker is involved.
    let r = call(n2, "POST", "/hot/_search", agg);
    let n2s = n2.to_string();
    assert!(
        eventually(Duration::from_secs(5), || {
            let g = group();
            g["cluster"]["shedding"] == json!([n2s]) && addrs(&g) == vec![n1.to_string()]
        }),
        "node 2 is left out: {} (the aggregation got {} {})",
        group(),
        r.status,
        r.json
    );
    // Requests keep working through node 1 meanwhile.
    assert_eq!(call(v.addr, "GET", "/hot/_count", "").status, 200);
    drop(limit);
    assert!(
        eventually(Duration::from_secs(10), || addrs(&group()).len() == 2),
        "node 2 is back once its breakers stay quiet: {}",
        group()
    );
    assert_eq!(group()["cluster"]["shedding"], json!([]));
}
