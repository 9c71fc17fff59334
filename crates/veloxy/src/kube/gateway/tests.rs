//! Unit tests of the Gateway API translation as a whole.

use super::*;

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
    Arc::new(serde_json::from_value(v).unwrap())
}

fn route(name: &str, created: &str) -> Arc<types::HttpRoute> {
    obj(
        serde_json::json!({"metadata": {"name": name, "namespace": "ns",
        "creationTimestamp": created},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["a.example"],
                 "rules": [{"matches": [{"path": {"type": "Exact", "value": "/x"}}]}]}}),
    )
}

fn spec() -> KubernetesSpec {
    KubernetesSpec {
        kubeconfig: None,
        namespaces: Vec::new(),
        ingress_class: "veloxy".into(),
        ingress_nginx: false,
        gateway_class: None,
        http_listener: "web".into(),
        https_listener: None,
        status: None,
        lease: None,
        lease_duration: std::time::Duration::from_secs(15),
    }
}

#[test]
fn the_older_of_two_routes_with_one_match_is_served_once() {
    let spec = spec();
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        // Two HTTP listeners, both served on `web`: the route is emitted once.
        gateways: vec![obj(
            serde_json::json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP"},
                {"name": "b", "port": 8080, "protocol": "HTTP"}]}}),
        )],
        http_routes: vec![
            route("new", "2026-01-02T00:00:00Z"),
            route("old", "2026-01-01T00:00:00Z"),
        ],
        ..Default::default()
    };
    let t = translate(&world, &spec, &Table::new(), Path::new("/x"));
    assert_eq!(t.routes.len(), 1, "{:?}", t.routes);
    assert_eq!(t.origins[0].2, "old");
    let conflicts: Vec<&Problem> = t
        .problems
        .iter()
        .filter(|p| p.reason == "RouteConflict")
        .collect();
    assert_eq!(conflicts.len(), 1, "{:?}", t.problems);
    assert_eq!(conflicts[0].name, "new");
    // No backendRefs: the rule answers 500, as the spec says.
    assert_eq!(t.routes[0]["respond"]["status"].as_integer(), Some(500));
    assert_eq!(t.report.gateways[0].listeners[0].attached, 2);
}

#[test]
fn listener_and_route_hostnames_intersect() {
    let r = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(hosts(None, &[]), Some(vec![]));
    assert_eq!(hosts(Some("a.example"), &[]), Some(r(&["a.example"])));
    assert_eq!(
        hosts(Some("*.example"), &r(&["a.example", "b.other"])),
        Some(r(&["a.example"]))
    );
    assert_eq!(
        hosts(Some("a.example"), &r(&["*.example"])),
        Some(r(&["a.example"]))
    );
    assert_eq!(hosts(Some("a.example"), &r(&["b.example"])), None);
}

/// The conformance suite's HTTPRoutePathMatchOrder: an Exact `/match` and a PathPrefix
/// `/match/` (its `path_exact = "/match"` part is the Exact rule's) in one route. The prefix
/// keeps `/match/`; before, the merged config was refused as a duplicate route and every
/// Gateway API object was left out.
#[test]
fn a_prefix_keeps_its_prefix_when_an_exact_match_has_its_path() {
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![obj(
            serde_json::json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP"}]}}),
        )],
        http_routes: vec![obj(
            serde_json::json!({"metadata": {"name": "order", "namespace": "ns",
            "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"parentRefs": [{"name": "gw"}], "rules": [
                {"matches": [{"path": {"type": "Exact", "value": "/match"}}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/match/"}}]}]}}),
        )],
        ..Default::default()
    };
    let t = translate(&world, &spec(), &Table::new(), Path::new("/x"));
    assert_eq!(t.routes.len(), 2, "{:?}", t.routes);
    assert_eq!(
        t.routes[0].get("path_exact").and_then(Value::as_str),
        Some("/match")
    );
    assert_eq!(
        t.routes[1].get("path").and_then(Value::as_str),
        Some("/match/")
    );
    assert!(t.routes[1].get("path_exact").is_none(), "{:?}", t.routes[1]);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
}
