//! The endpoint-only path against the full build: after each change of EndpointSlices, the
//! plan's servers and fingerprint are those a full translation of the same objects gives.

use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value as Json};
use veloxy_engine::config::compile::compile_str;
use veloxy_engine::Server;

use super::*;
use crate::kube::gateway::CONTROLLER;

fn obj<T: serde::de::DeserializeOwned>(v: Json) -> Arc<T> {
    Arc::new(serde_json::from_value(v).unwrap())
}

fn spec() -> KubernetesSpec {
    crate::kube::test_spec()
}

/// The slice of Service `svc` (port `http` on 7000): `(address, ready)` endpoints; `version`
/// is its resourceVersion.
fn slice(svc: &str, version: u32, endpoints: &[(&str, bool)]) -> Arc<EndpointSlice> {
    let eps: Vec<Json> = endpoints
        .iter()
        .map(|(a, ready)| json!({"addresses": [a], "conditions": {"ready": ready}}))
        .collect();
    obj(
        json!({"metadata": {"name": format!("{svc}-1"), "namespace": "ns",
        "resourceVersion": version.to_string(),
        "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 7000}], "endpoints": eps}),
    )
}

/// Ingresses to `web` (by port name) and `api` (by number, a canary `api2` beside it with
/// weight 20) and one with an auth service (`auth`); an HTTPRoute to `a` (weight 3) and `b`
/// (weight 1); each Service with one ready endpoint.
fn world() -> World {
    let svc = |name: &str| {
        obj(
            json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 7000}]}}),
        )
    };
    let ing = |name: &str, host: &str, svc: &str, port: Json, ann: Json| {
        obj(
            json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
            "annotations": ann},
            "spec": {"ingressClassName": "veloxy", "rules": [{"host": host, "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": svc, "port": port}}}]}}]}}),
        )
    };
    let canary = json!({"nginx.ingress.kubernetes.io/canary": "true",
        "nginx.ingress.kubernetes.io/canary-weight": "20"});
    let auth = json!({"nginx.ingress.kubernetes.io/auth-url":
        "http://auth.ns.svc.cluster.local:80/check"});
    let names = ["web", "api", "api2", "auth", "a", "b"];
    World {
        ingresses: vec![
            ing(
                "web",
                "web.example",
                "web",
                json!({"name": "http"}),
                json!({}),
            ),
            ing(
                "api",
                "api.example",
                "api",
                json!({"number": 80}),
                json!({}),
            ),
            ing("api2", "api.example", "api2", json!({"number": 80}), canary),
            ing(
                "guarded",
                "guarded.example",
                "web",
                json!({"number": 80}),
                auth,
            ),
        ],
        services: names.iter().map(|n| svc(n)).collect(),
        slices: (names.iter().enumerate())
            .map(|(i, n)| slice(n, 1, &[(&format!("192.0.2.{}", 10 + i), true)]))
            .collect(),
        gateway_classes: vec![obj(json!({"metadata": {"name": "c"},
            "spec": {"controllerName": CONTROLLER}}))],
        gateways: vec![obj(json!({"metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "c", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"}]}}))],
        http_routes: vec![obj(json!({"metadata": {"name": "r", "namespace": "ns"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["gw.example"],
                "rules": [{"backendRefs": [{"name": "a", "port": 80, "weight": 3},
                                           {"name": "b", "port": 80, "weight": 1}]}]}}))],
        ..Default::default()
    }
}

/// `world` with the slice of `svc` replaced (as resourceVersion `version`).
fn with_slice(world: &World, svc: &str, version: u32, endpoints: &[(&str, bool)]) -> World {
    let label = |s: &EndpointSlice| {
        let l = s.metadata.labels.as_ref();
        l.and_then(|l| l.get(SERVICE_NAME)).cloned()
    };
    let mut slices: Vec<Arc<EndpointSlice>> = (world.slices.iter())
        .filter(|s| label(s).as_deref() != Some(svc))
        .cloned()
        .collect();
    slices.push(slice(svc, version, endpoints));
    World {
        slices,
        ..copy(world)
    }
}

/// A change: the Service, its new endpoints, whether the endpoint-only path takes it.
type Step<'a> = (&'a str, &'a [(&'a str, bool)], bool);

const SERVICE_NAME: &str = "kubernetes.io/service-name";

fn copy(w: &World) -> World {
    World {
        ingresses: w.ingresses.clone(),
        services: w.services.clone(),
        slices: w.slices.clone(),
        gateway_classes: w.gateway_classes.clone(),
        gateways: w.gateways.clone(),
        http_routes: w.http_routes.clone(),
        ..Default::default()
    }
}

#[test]
fn an_endpoint_only_change_gives_what_the_full_build_gives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("veloxy.toml");
    let text = "[listeners.web]\naddr = \"127.0.0.1:0\"\n";
    let policies = PolicyRegistry::with_builtins();
    let snapshot = compile_str(&path, text, &policies).unwrap();
    let running = Server::new(snapshot).start().unwrap();
    let file: toml::Table = toml::from_str(text).unwrap();
    let out = dir.path().join("out");
    let mut b = Builder::new(spec(), &path, file, out, &running);
    b.spec.gateway_class = Some("c".into());
    let full = |b: &Builder, w: &World| b.merged(w, &w.ingresses, Gw::On).unwrap();

    let start = world();
    let m = full(&b, &start);
    for g in ["k8s-web", "k8s-api-canary", "k8s-gw-httproute_ns_r_0"] {
        assert!(
            m.servers.plain.contains_key(g),
            "{g}: {:?}",
            m.servers.plain
        );
    }
    let mut plan = Plan::new(&start, m.origins, m.servers);

    // (service, its new endpoints, whether the endpoint-only path takes it)
    let a = ("192.0.2.14", true);
    let steps: &[Step] = &[
        ("web", &[("192.0.2.10", true), ("192.0.2.20", true)], true),
        ("api", &[("192.0.2.21", true), ("192.0.2.22", true)], true),
        ("api2", &[("192.0.2.12", false), ("192.0.2.23", true)], true),
        ("a", &[a, ("192.0.2.24", true), ("192.0.2.25", true)], true),
        ("b", &[("192.0.2.15", false), ("192.0.2.26", true)], true),
        ("a", &[a, ("192.0.2.24", false)], true),
        // No ready endpoint left: the route answers 503, a change of structure.
        ("web", &[("192.0.2.10", false)], false),
        // The auth service's endpoints are read for more than a group's servers.
        ("auth", &[("192.0.2.27", true)], false),
    ];
    let mut now = start;
    for (i, (svc, endpoints, fast)) in steps.iter().enumerate() {
        let next = with_slice(&now, svc, i as u32 + 2, endpoints);
        let want = full(&b, &next);
        let slices = World {
            slices: next.slices.clone(),
            ..Default::default()
        };
        match plan.changes(&slices) {
            Some(update) => {
                assert!(fast, "step {i} ({svc}) took the endpoint-only path");
                assert!(!update.sets.is_empty(), "step {i} ({svc}) changed nothing");
                let sets = in_place::changes(&plan.servers.plain, &want.servers.plain);
                assert_eq!(Some(&update.sets), sets.as_ref(), "step {i} ({svc})");
                let fingerprint = plan.commit(update);
                assert_eq!(plan.servers.plain, want.servers.plain, "step {i} ({svc})");
                assert_eq!(fingerprint, want.fingerprint, "step {i} ({svc})");
                now = next;
            }
            None => {
                assert!(!fast, "step {i} ({svc}) needed a full build");
                plan = Plan::new(&next, want.origins, want.servers);
                now = next;
            }
        }
    }
    // Anything but slices changed: a full build.
    let other = World {
        others: 1,
        ..with_slice(&now, "web", 100, &[("192.0.2.10", true)])
    };
    assert!(plan.changes(&other).is_none());
    running.shutdown();
}
