//! Unit tests of the Gateway API translation as a whole.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::attach::hosts;
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
    crate::kube::test_spec()
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

/// A service `name` in `ns` with one ready endpoint `addr` on port 7000.
fn service_with(name: &str, addr: &str) -> (Arc<Service>, Arc<EndpointSlice>) {
    let svc = obj(
        serde_json::json!({"metadata": {"name": name, "namespace": "ns"},
        "spec": {"ports": [{"port": 80}]}}),
    );
    let slice = obj(serde_json::json!({"metadata": {"name": format!("{name}-1"),
        "namespace": "ns", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4", "ports": [{"port": 7000}],
        "endpoints": [{"addresses": [addr], "conditions": {"ready": true}}]}));
    (svc, slice)
}

#[test]
fn tcp_and_tls_routes_become_streams_on_the_file_listeners() {
    let (s1, e1) = service_with("db", "192.0.2.10");
    let (s2, e2) = service_with("git", "192.0.2.11");
    let l4 = |kind: &str, name: &str, section: &str, hosts: &[&str], svc: &str| {
        serde_json::json!({"metadata": {"name": name, "namespace": "ns"}, "kind": kind,
            "spec": {"parentRefs": [{"name": "gw", "sectionName": section}], "hostnames": hosts,
                     "rules": [{"backendRefs": [{"name": svc, "port": 80}]}]}})
    };
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![obj(
            serde_json::json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "db", "port": 5432, "protocol": "TCP"},
                {"name": "tls", "port": 443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
                {"name": "term", "port": 443, "protocol": "TLS"},
                {"name": "nodb", "port": 5433, "protocol": "TCP"}]}}),
        )],
        services: vec![s1, s2],
        slices: vec![e1, e2],
        tcp_routes: vec![
            obj(l4("TCPRoute", "db", "db", &[], "db")),
            // Created later (same time, name after "db"): the listener is db's.
            obj(l4("TCPRoute", "db2", "db", &[], "git")),
        ],
        tls_routes: vec![obj(l4("TLSRoute", "git", "tls", &["git.example"], "git"))],
        ..Default::default()
    };
    let file: Table = toml::from_str(
        "[listeners.db]\naddr = \":5432\"\nprotocol = \"tcp\"\n\
         [listeners.tls]\naddr = \":443\"\nprotocol = \"tcp\"\n",
    )
    .unwrap();
    let t = translate(&world, &spec(), &file, Path::new("/x"));
    let kinds: Vec<&str> = t.origins.iter().map(|o| o.0).collect();
    assert_eq!(kinds, ["TCPRoute", "TLSRoute"], "{:?}", t.routes);
    assert!(kinds.iter().all(|k| is_stream(k)));
    let tcp = &t.routes[0];
    assert_eq!(tcp["listener"].as_str(), Some("db"));
    assert!(tcp.get("sni").is_none(), "{tcp}");
    let group = tcp["upstream"].as_str().unwrap();
    assert_eq!(
        t.upstreams[group]["servers"],
        Value::Array(vec!["192.0.2.10:7000".into()])
    );
    let tls = &t.routes[1];
    assert_eq!(tls["listener"].as_str(), Some("tls"));
    assert_eq!(tls["sni"], Value::Array(vec!["git.example".into()]));
    let ls = &t.report.gateways[0].listeners;
    assert_eq!(ls[0].kinds, ["TCPRoute"]);
    assert_eq!(ls[1].kinds, ["TLSRoute"]);
    assert_eq!((ls[0].attached, ls[1].attached), (2, 1));
    // TLS in Terminate mode is not served; a TCP port without a tcp listener neither.
    assert_eq!(
        ls[2].accepted.as_ref().unwrap_err().0,
        "UnsupportedProtocol"
    );
    assert_eq!(ls[3].accepted.as_ref().unwrap_err().0, "PortUnavailable");
    let conflicts: Vec<&str> = t
        .problems
        .iter()
        .filter(|p| p.reason == "RouteConflict")
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(conflicts, ["db2"], "{:?}", t.problems);
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

/// `allowedRoutes.namespaces.from: Selector`: a route is admitted when its Namespace's labels
/// match the listener's selector (matchLabels and matchExpressions), else NotAllowedByListeners.
#[test]
fn a_namespace_selector_admits_routes_by_their_namespace_labels() {
    let ns = |name: &str, labels: serde_json::Value| {
        obj(serde_json::json!({"metadata": {"name": name, "labels": labels}}))
    };
    let route = |name: &str, namespace: &str| {
        obj(
            serde_json::json!({"metadata": {"name": name, "namespace": namespace},
            "spec": {"parentRefs": [{"name": "gw", "namespace": "ns"}],
                     "hostnames": [format!("{name}.example")],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]}}),
        )
    };
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![obj(
            serde_json::json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {
                    "from": "Selector", "selector": {
                        "matchLabels": {"team": "web"},
                        "matchExpressions": [{"key": "env", "operator": "NotIn",
                                              "values": ["test"]}]}}}}]}}),
        )],
        namespaces: vec![
            ns("web", serde_json::json!({"team": "web", "env": "prod"})),
            ns("webtest", serde_json::json!({"team": "web", "env": "test"})),
            ns("other", serde_json::json!({"team": "other"})),
        ],
        http_routes: vec![
            route("yes", "web"),
            route("test", "webtest"),
            route("no", "other"),
            route("unknown", "nowhere"),
        ],
        ..Default::default()
    };
    let t = translate(&world, &spec(), &Table::new(), Path::new("/x"));
    let hosts: Vec<&str> = t
        .routes
        .iter()
        .filter_map(|r| r.get("host").and_then(Value::as_str))
        .collect();
    assert_eq!(hosts, ["yes.example"], "{:?}", t.routes);
    for r in &t.report.routes {
        let name = r.meta.name.as_deref().unwrap_or_default();
        let accepted = &r.parents[0].accepted;
        match name {
            "yes" => assert!(accepted.is_ok(), "{name}: {accepted:?}"),
            _ => assert_eq!(
                accepted.as_ref().unwrap_err().0,
                "NotAllowedByListeners",
                "{name}"
            ),
        }
    }
}

/// The conformance suite's HTTPRouteHTTPSListener: an HTTPS listener without hostname
/// serves its certificate for any name (`*`) besides its routes' hostnames, so that a name
/// no route has gets the Gateway's certificate (and a 404), not the file listener's; a
/// listener with a hostname serves its certificate for that name only.
#[test]
fn an_https_listener_without_hostname_serves_its_certificate_for_any_name() {
    let c = rcgen::generate_simple_self_signed(vec!["*.org".to_string()]).unwrap();
    let b64 = |s: String| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let secret = obj(
        serde_json::json!({"metadata": {"name": "cert", "namespace": "ns"},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(c.cert.pem()), "tls.key": b64(c.signing_key.serialize_pem())}}),
    );
    let tls = serde_json::json!({"certificateRefs": [{"name": "cert"}]});
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![obj(
            serde_json::json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "any", "port": 443, "protocol": "HTTPS", "tls": tls},
                {"name": "one", "port": 443, "protocol": "HTTPS", "tls": tls,
                 "hostname": "second.example"}]}}),
        )],
        http_routes: vec![route("r", "2026-01-01T00:00:00Z")],
        secrets: vec![secret],
        ..Default::default()
    };
    let mut spec = spec();
    spec.https_listener = Some("websecure".into());
    let hosts = |t: &Translation| -> Vec<(String, Vec<String>)> {
        t.certs
            .iter()
            .map(|(on, e)| {
                let h = e["hosts"].as_array().unwrap();
                let h = h.iter().map(|v| v.as_str().unwrap().to_string());
                (on.clone(), h.collect())
            })
            .collect()
    };
    let s = |v: &[&str]| v.iter().map(|h| h.to_string()).collect::<Vec<_>>();
    // On the file's listener, shared with the file's own names: no `*`, which would take
    // every name the file's default certificate serves.
    let t = translate(&world, &spec, &Table::new(), Path::new("/x"));
    assert_eq!(
        hosts(&t),
        [
            ("websecure".to_string(), s(&["a.example"])),
            ("websecure".to_string(), s(&["second.example"]))
        ]
    );
    // On the Gateway's own copy of it (`gateway_addresses`): `*` too.
    spec.gateway_addresses = vec!["192.0.2.11".parse().unwrap()];
    let file: Table = toml::from_str("[listeners.websecure]\naddr = \"192.0.2.10:443\"\n").unwrap();
    let t = translate(&world, &spec, &file, Path::new("/x"));
    let copy = "k8s-gw-192.0.2.11-websecure".to_string();
    assert_eq!(
        hosts(&t),
        [
            (copy.clone(), s(&["a.example", "*"])),
            (copy, s(&["second.example"]))
        ]
    );
}

/// The conformance suite's HTTPRouteMultipleGateways: with `gateway_addresses`, each
/// Gateway gets an address (the one its `spec.addresses` asks for first, then the oldest
/// Gateway the first free one) and its routes go on a copy of the file's listener bound to
/// it, so a route of one Gateway is not served on another's address; a listener bound to
/// every address cannot be split, and its Gateways share it.
#[test]
fn each_gateway_is_served_on_its_own_address() {
    let gw = |name: &str, created: &str, asks: &[&str]| {
        let addresses: Vec<serde_json::Value> = asks
            .iter()
            .map(|a| serde_json::json!({"type": "IPAddress", "value": a}))
            .collect();
        obj(
            serde_json::json!({"metadata": {"name": name, "namespace": "ns",
            "creationTimestamp": created},
            "spec": {"gatewayClassName": "c", "addresses": addresses,
                     "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}),
        )
    };
    let on = |name: &str, parents: &[&str], path: &str| {
        let parents: Vec<serde_json::Value> = parents
            .iter()
            .map(|p| serde_json::json!({"name": p}))
            .collect();
        obj(
            serde_json::json!({"metadata": {"name": name, "namespace": "ns",
            "creationTimestamp": "2026-01-03T00:00:00Z"},
            "spec": {"parentRefs": parents,
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}]}]}}),
        )
    };
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![
            gw("a", "2026-01-01T00:00:00Z", &[]),
            gw("b", "2026-01-02T00:00:00Z", &["192.0.2.11"]),
            gw("c", "2026-01-02T00:00:00Z", &[]),
        ],
        http_routes: vec![
            on("shared", &["a", "b"], "/shared"),
            on("only-a", &["a"], "/"),
        ],
        ..Default::default()
    };
    let mut spec = spec();
    spec.gateway_addresses = vec!["192.0.2.11".parse().unwrap(), "192.0.2.12".parse().unwrap()];
    let file: Table = toml::from_str("[listeners.web]\naddr = \"192.0.2.10:80\"\n").unwrap();
    let t = translate(&world, &spec, &file, Path::new("/x"));
    let addrs: Vec<Option<String>> = t
        .report
        .gateways
        .iter()
        .map(|g| g.address.map(|a| a.to_string()))
        .collect();
    // b asked for .11; a, the oldest of the others, gets .12; c none (it shares `web`).
    assert_eq!(
        addrs,
        [Some("192.0.2.12".into()), Some("192.0.2.11".into()), None]
    );
    let (on_a, on_b) = ("k8s-gw-192.0.2.12-web", "k8s-gw-192.0.2.11-web");
    assert_eq!(t.listeners[on_a]["addr"].as_str(), Some("192.0.2.12:80"));
    assert_eq!(t.listeners[on_b]["addr"].as_str(), Some("192.0.2.11:80"));
    let mut served: Vec<(String, &str)> = t
        .routes
        .iter()
        .zip(&t.origins)
        .map(|(r, o)| (r["listener"].as_str().unwrap().to_owned(), o.2.as_str()))
        .collect();
    served.sort();
    let want = |l: &str| l.to_owned();
    let mut expected = vec![
        (want(on_a), "only-a"),
        (want(on_a), "shared"),
        (want(on_b), "shared"),
    ];
    expected.sort();
    assert_eq!(served, expected, "{:?}", t.routes);
    // A listener bound to every address: no copies, a note.
    let any: Table = toml::from_str("[listeners.web]\naddr = \"0.0.0.0:80\"\n").unwrap();
    let t = translate(&world, &spec, &any, Path::new("/x"));
    assert!(t.listeners.is_empty());
    assert!(
        t.notes.iter().any(|n| n.contains("binds every address")),
        "{:?}",
        t.notes
    );
}

/// The RequestMirror filter: each becomes a table of the route's `mirror`, its Service's
/// ready endpoints a group of their own, its `percent` or `fraction` the share copied; a
/// mirror Service that does not exist makes the rule's ResolvedRefs false.
#[test]
fn request_mirror_filters_become_the_route_mirror() {
    let (s1, e1) = service_with("api", "192.0.2.10");
    let (s2, e2) = service_with("shadow", "192.0.2.11");
    let (s3, e3) = service_with("canary", "192.0.2.12");
    let mirror = |svc: &str, share: serde_json::Value| {
        let mut m = serde_json::json!({"backendRef": {"name": svc, "port": 80}});
        m.as_object_mut()
            .unwrap()
            .extend(share.as_object().unwrap().clone());
        serde_json::json!({"type": "RequestMirror", "requestMirror": m})
    };
    let route = |name: &str, filters: serde_json::Value| {
        obj(
            serde_json::json!({"metadata": {"name": name, "namespace": "ns"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [format!("{name}.example")],
                     "rules": [{"filters": filters,
                                "backendRefs": [{"name": "api", "port": 80}]}]}}),
        )
    };
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![obj(
            serde_json::json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP"}]}}),
        )],
        services: vec![s1, s2, s3],
        slices: vec![e1, e2, e3],
        http_routes: vec![
            route(
                "two",
                serde_json::json!([
                    mirror("shadow", serde_json::json!({"percent": 25})),
                    mirror(
                        "canary",
                        serde_json::json!({"fraction": {"numerator": 1, "denominator": 8}})
                    ),
                ]),
            ),
            route(
                "all",
                serde_json::json!([mirror("shadow", serde_json::json!({}))]),
            ),
            route(
                "gone",
                serde_json::json!([mirror("nowhere", serde_json::json!({}))]),
            ),
        ],
        ..Default::default()
    };
    let t = translate(&world, &spec(), &Table::new(), Path::new("/x"));
    let by_host = |h: &str| {
        t.routes
            .iter()
            .find(|r| r["host"].as_str() == Some(h))
            .unwrap_or_else(|| panic!("{h} in {:?}", t.routes))
    };
    let two = by_host("two.example");
    let m = two["mirror"].as_array().unwrap();
    assert_eq!(m.len(), 2, "{two}");
    assert_eq!(m[0]["percent"].as_float(), Some(25.0));
    assert_eq!(m[1]["percent"].as_float(), Some(12.5));
    let servers = |g: &Value| t.upstreams[g.as_str().unwrap()]["servers"].clone();
    assert_eq!(
        servers(&m[0]["upstream"]),
        Value::Array(vec!["192.0.2.11:7000".into()])
    );
    assert_eq!(
        servers(&m[1]["upstream"]),
        Value::Array(vec!["192.0.2.12:7000".into()])
    );
    assert_eq!(
        servers(&two["upstream"]),
        Value::Array(vec!["192.0.2.10:7000".into()])
    );
    let all = by_host("all.example");
    assert_eq!(all["mirror"][0]["percent"].as_float(), Some(100.0));
    // A missing mirror Service: served without the copy, ResolvedRefs false.
    let gone = by_host("gone.example");
    assert!(gone.get("mirror").is_none(), "{gone}");
    let report = t
        .report
        .routes
        .iter()
        .find(|r| r.meta.name.as_deref() == Some("gone"))
        .unwrap();
    assert_eq!(
        report.parents[0].resolved.as_ref().unwrap_err().0,
        "BackendNotFound"
    );
}

/// Group names cannot be forged: route `web-0-mirror` (no parent at all) named its rule's
/// group as route `web`'s mirror group was named (`...-ns-web-0-mirror-0`), and the later
/// insert took over the servers the copies (cookies, Authorization) went to.
#[test]
fn another_route_cannot_take_over_a_group_by_its_name() {
    let (s1, e1) = service_with("api", "192.0.2.10");
    let (s2, e2) = service_with("shadow", "192.0.2.11");
    let (s3, e3) = service_with("evil", "192.0.2.66");
    let web = obj(
        serde_json::json!({"metadata": {"name": "web", "namespace": "ns",
        "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["web.example"],
                 "rules": [{"filters": [{"type": "RequestMirror",
                     "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}}],
                            "backendRefs": [{"name": "api", "port": 80}]}]}}),
    );
    let forger = obj(
        serde_json::json!({"metadata": {"name": "web-0-mirror", "namespace": "ns",
        "creationTimestamp": "2026-01-02T00:00:00Z"},
        "spec": {"rules": [{"backendRefs": [{"name": "evil", "port": 80}]}]}}),
    );
    let world = World {
        gateway_classes: vec![obj(serde_json::json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![obj(
            serde_json::json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP"}]}}),
        )],
        http_routes: vec![web, forger],
        services: vec![s1, s2, s3],
        slices: vec![e1, e2, e3],
        ..Default::default()
    };
    let t = translate(&world, &spec(), &Table::new(), Path::new("/x"));
    let route = t.routes.iter().find(|r| r.get("mirror").is_some()).unwrap();
    let group = route["mirror"][0]["upstream"].as_str().unwrap();
    let servers = t.upstreams[group]["servers"].to_string();
    assert!(servers.contains("192.0.2.11:7000"), "{group}: {servers}");
    assert!(!servers.contains("192.0.2.66"), "{group}: {servers}");
}

/// An address a Gateway's status holds stays its own: a newer Gateway asking for it in
/// `spec.addresses` gets another (before, the request was served first and moved the older
/// Gateway, and its clients, to another address).
#[test]
fn a_held_address_is_not_taken_by_a_newer_request() {
    let gw = |name: &str, created: &str, asks: &[&str], has: Option<&str>| {
        let asks: Vec<serde_json::Value> = asks
            .iter()
            .map(|a| serde_json::json!({"type": "IPAddress", "value": a}))
            .collect();
        let mut v = serde_json::json!({"metadata": {"name": name, "namespace": "ns",
            "creationTimestamp": created},
            "spec": {"gatewayClassName": "c", "addresses": asks, "listeners": []}});
        if let Some(a) = has {
            v["status"] = serde_json::json!({"addresses": [{"type": "IPAddress", "value": a}]});
        }
        obj::<types::Gateway>(v)
    };
    let pool: Vec<std::net::IpAddr> =
        vec!["192.0.2.11".parse().unwrap(), "192.0.2.12".parse().unwrap()];
    let got = |gws: &[Arc<types::Gateway>]| -> Vec<String> {
        let a = addresses::assign(gws, &pool);
        a.iter().map(|a| a.unwrap().to_string()).collect()
    };
    let held = gw("a", "2026-01-01T00:00:00Z", &[], Some("192.0.2.12"));
    let asks = gw("b", "2026-01-02T00:00:00Z", &["192.0.2.12"], None);
    assert_eq!(got(&[held, asks]), ["192.0.2.12", "192.0.2.11"]);
    // A Gateway whose request changed moves to what it asks for.
    let moved = gw(
        "a",
        "2026-01-01T00:00:00Z",
        &["192.0.2.11"],
        Some("192.0.2.12"),
    );
    let other = gw("b", "2026-01-02T00:00:00Z", &[], None);
    assert_eq!(got(&[moved, other]), ["192.0.2.11", "192.0.2.12"]);
}
