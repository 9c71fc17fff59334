//! The Kubernetes provider's Gateway API v1 against a real kube-apiserver and etcd with the
//! Gateway API CRDs (issue 37): a GatewayClass, a Gateway, HTTPRoutes and a ReferenceGrant
//! created through the API become routes of a running veloxy, changes apply within 1 s, and
//! status is written as the spec defines it.
//!
//! As in `kube_ingress.rs`, the test runs in a network namespace of its own with TEST-NET
//! addresses on `lo` (192.0.2.1 for the API server and veloxy, which binds ports 80 and 443
//! there, so the Gateway's listeners map onto the file's by port; 192.0.2.10-12 for the
//! backends a, b, c). Skipped without `unshare` rights, the binaries or the cached CRDs
//! (`bash .ci/kube.sh` provides both).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use veloxy_testkit::kube::{gateway_crds_cached, in_netns, ip, within, Cluster, DumpLogOnPanic};
use veloxy_testkit::*;

const API_ADDR: &str = "192.0.2.1";
const BACKENDS: [&str; 3] = ["192.0.2.10", "192.0.2.11", "192.0.2.12"];
const NS: &str = "shop";
const OTHER: &str = "other";
const GW: &str = "/apis/gateway.networking.k8s.io/v1";
const DISCOVERY: &str = "/apis/discovery.k8s.io/v1";

/// `GET path` with `Host: host` and `extra` header lines.
fn get_with(addr: SocketAddr, host: &str, path: &str, extra: &str) -> Option<Response> {
    let mut c = Client::try_connect(addr).ok()?;
    c.send(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    );
    c.try_read_response(false)
}

/// (status, x-upstream) of `GET path`.
fn hit(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    get_with(addr, host, path, "").map_or((0, String::new()), |r| {
        (r.status, r.header("x-upstream").unwrap_or_default().into())
    })
}

fn slice(name: &str, service: &str, port: u16, addrs: &[&str]) -> Value {
    let eps: Vec<Value> = addrs
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    json!({"metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
           "endpoints": eps})
}

fn service(name: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
}

fn http_route(name: &str, hosts: &[&str], parent: Value, rules: Value) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"parentRefs": [parent], "hostnames": hosts, "rules": rules}})
}

/// An h2c server (the GRPCRoute's backend) on `addr`: every request is answered 200 with
/// `x-grpc-path` naming the path it asked for.
fn h2c_server(addr: &str) -> SocketAddr {
    let l = std::net::TcpListener::bind(format!("{addr}:0")).unwrap();
    l.set_nonblocking(true).unwrap();
    let local = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        let resp = http::Response::builder()
                            .status(200)
                            .header("x-grpc-path", req.uri().path())
                            .header("content-type", "application/grpc")
                            .body(())
                            .unwrap();
                        let _ = respond.send_response(resp, true);
                    }
                });
            }
        });
    });
    local
}

struct Scene {
    k: Cluster,
    pki: Pki,
    dir: tempfile::TempDir,
    port: u16,
    /// The h2c backend's port (on c's address).
    grpc_port: u16,
    _backends: Vec<Upstream>,
}

impl Scene {
    fn start() -> Scene {
        ip(&["link", "set", "lo", "up"]);
        for a in [API_ADDR].iter().chain(BACKENDS.iter()) {
            ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        let k = Cluster::start(API_ADDR);
        let t = Instant::now();
        k.gateway_crds();
        eprintln!("CRDs served in {:.1} s", t.elapsed().as_secs_f64());
        let a = upstream(&["--name", "a", "--listen", &format!("{}:0", BACKENDS[0])]);
        let port = a.addr.port();
        let bc: Vec<Upstream> = ["b", "c"]
            .iter()
            .zip(&BACKENDS[1..])
            .map(|(n, addr)| upstream(&["--name", n, "--listen", &format!("{addr}:{port}")]))
            .collect();
        let grpc_port = h2c_server(BACKENDS[2]).port();
        let dir = tempfile::tempdir().unwrap();
        let mut backends = vec![a];
        backends.extend(bc);
        Scene {
            k,
            pki: Pki::new(dir.path()),
            dir,
            port,
            grpc_port,
            _backends: backends,
        }
    }

    fn path(&self, ns: &str, kind: &str) -> String {
        match kind {
            "services" | "secrets" => format!("/api/v1/namespaces/{ns}/{kind}"),
            "endpointslices" => format!("{DISCOVERY}/namespaces/{ns}/{kind}"),
            _ => format!("{GW}/namespaces/{ns}/{kind}"),
        }
    }

    /// Namespaces, Services web (a), api (b) and far (c, in `other`), the TLS Secret, the
    /// GatewayClass, the Gateway (HTTP on 80, HTTPS on 443 for secure.example) and routes.
    fn create_objects(&self) {
        let k = &self.k;
        for ns in [NS, OTHER] {
            k.create("/api/v1/namespaces", json!({"metadata": {"name": ns}}));
        }
        for (ns, svc, addr) in [(NS, "web", 0), (NS, "api", 1), (OTHER, "far", 2)] {
            k.create(&self.path(ns, "services"), service(svc));
            let s = slice(&format!("{svc}-1"), svc, self.port, &[BACKENDS[addr]]);
            k.create(&self.path(ns, "endpointslices"), s);
        }
        k.create(&self.path(NS, "services"), service("grpc"));
        let s = slice("grpc-1", "grpc", self.grpc_port, &[BACKENDS[2]]);
        k.create(&self.path(NS, "endpointslices"), s);
        let (cert, key) = self.pki.leaf("secure", &["secure.example"], KeyKind::Ecdsa);
        let b64 =
            |p: &Path| base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap());
        k.create(
            &self.path(NS, "secrets"),
            json!({"metadata": {"name": "secure-tls"}, "type": "kubernetes.io/tls",
                   "data": {"tls.crt": b64(&cert), "tls.key": b64(&key)}}),
        );
        self.create_gw(
            &format!("{GW}/gatewayclasses"),
            "GatewayClass",
            json!({"metadata": {"name": "veloxy"},
                   "spec": {"controllerName": "veloxy.dev/gateway-controller"}}),
        );
        self.create_gw(
            &self.path(NS, "gateways"),
            "Gateway",
            json!({"metadata": {"name": "gw"}, "spec": {"gatewayClassName": "veloxy",
              "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "secure.example",
                 "tls": {"certificateRefs": [{"name": "secure-tls"}]}},
                {"name": "udp", "port": 9000, "protocol": "UDP"}]}}),
        );
        let gw = json!({"name": "gw"});
        let routes = self.path(NS, "httproutes");
        let backend = |name: &str, weight: i64| json!({"name": name, "port": 80, "weight": weight});
        self.create_gw(
            &routes,
            "HTTPRoute",
            http_route(
                "split",
                &["split.example"],
                gw.clone(),
                json!([
                {"matches": [{"headers": [{"name": "X-Canary", "value": "1"}]}],
                 "backendRefs": [backend("api", 1)]},
                {"backendRefs": [backend("web", 3), backend("api", 1)]}]),
            ),
        );
        let rewrite = json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/echo"});
        let redirect = json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"});
        self.create_gw(
            &routes,
            "HTTPRoute",
            http_route(
                "filters",
                &["filters.example"],
                gw.clone(),
                json!([
                {"matches": [{"path": {"type": "PathPrefix", "value": "/rw"}}],
                 "filters": [{"type": "URLRewrite", "urlRewrite": {"path": rewrite}},
                   {"type": "RequestHeaderModifier",
                    "requestHeaderModifier": {"set": [{"name": "X-Added", "value": "yes"}]}},
                   {"type": "ResponseHeaderModifier",
                    "responseHeaderModifier": {"add": [{"name": "X-Resp", "value": "1"}]}}],
                 "backendRefs": [backend("web", 1)]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
                 "filters": [{"type": "RequestRedirect",
                   "requestRedirect": {"path": redirect, "statusCode": 301}}]}]),
            ),
        );
        self.create_gw(
            &routes,
            "HTTPRoute",
            http_route(
                "secure",
                &[],
                json!({"name": "gw", "sectionName": "https"}),
                json!([{"backendRefs": [backend("web", 1)]}]),
            ),
        );
        self.create_gw(
            &routes,
            "HTTPRoute",
            http_route(
                "far",
                &["far.example"],
                gw.clone(),
                json!([{"backendRefs": [{"name": "far", "namespace": OTHER, "port": 80}]}]),
            ),
        );
        self.create_gw(
            &routes,
            "HTTPRoute",
            http_route(
                "refused",
                &["refused.example"],
                gw,
                json!([{"filters": [{"type": "ExtensionRef",
                          "extensionRef": {"group": "example.com", "kind": "Thing", "name": "x"}}],
                        "backendRefs": [backend("web", 1)]}]),
            ),
        );
    }

    /// A GRPCRoute for one method of `hello.Greeter`, to the h2c backend.
    fn create_grpc_route(&self) {
        self.create_gw(
            &self.path(NS, "grpcroutes"),
            "GRPCRoute",
            json!({"metadata": {"name": "greeter"}, "spec": {
                "parentRefs": [{"name": "gw", "sectionName": "http"}],
                "hostnames": ["grpc.example"],
                "rules": [{"matches": [{"method": {"service": "hello.Greeter", "method": "SayHello"}}],
                           "backendRefs": [{"name": "grpc", "port": 80}]}]}}),
        );
    }

    fn config(&self) -> String {
        let (cert, key) = self
            .pki
            .leaf("default", &["default.example"], KeyKind::Ecdsa);
        format!(
            r#"
[listeners.web]
addr = "{API_ADDR}:80"

[listeners.websecure]
addr = "{API_ADDR}:443"
[listeners.websecure.tls]
cert = "{}"
key = "{}"

[providers.kubernetes]
kubeconfig = "{}"
namespaces = ["{NS}", "{OTHER}"]
gateway_class = "veloxy"
http_listener = "web"
https_listener = "websecure"
status_address = "203.0.113.10"
lease = "{NS}/veloxy-status"
lease_duration = "3s"
"#,
            cert.display(),
            key.display(),
            self.k.kubeconfig.display()
        )
    }

    /// Creates a Gateway API object (custom resources need their apiVersion and kind).
    fn create_gw(&self, path: &str, kind: &str, mut body: Value) {
        body["apiVersion"] = "gateway.networking.k8s.io/v1".into();
        body["kind"] = kind.into();
        self.k.create(path, body);
    }

    fn get(&self, ns: &str, kind: &str, name: &str) -> Value {
        self.k
            .call("GET", &format!("{}/{name}", self.path(ns, kind)), None)
            .1
    }
}

/// Weighted backends (3:1) and a header match that wins over the rule without one.
fn check_split(web: SocketAddr) {
    let first = within(Duration::from_secs(20), "the HTTPRoutes served", || {
        hit(web, "split.example", "/").0 == 200
    });
    eprintln!(
        "routes served {:.2} s after veloxy started",
        first.as_secs_f64()
    );
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..80 {
        *counts.entry(hit(web, "split.example", "/x").1).or_insert(0) += 1;
    }
    let (a, b) = (
        counts.get("a").copied().unwrap_or(0),
        counts.get("b").copied().unwrap_or(0),
    );
    assert_eq!(a + b, 80, "{counts:?}");
    assert!(
        (50..=70).contains(&a),
        "weights 3:1 over 80 requests: {counts:?}"
    );
    for _ in 0..5 {
        let r = get_with(web, "split.example", "/x", "X-Canary: 1\r\n").unwrap();
        assert_eq!(r.header("x-upstream"), Some("b"), "the header match");
    }
}

/// URLRewrite (prefix) with header modifiers; RequestRedirect with a prefix replacement.
fn check_filters(web: SocketAddr) {
    let r = get_with(web, "filters.example", "/rw", "").unwrap();
    assert_eq!(r.status, 200, "{}", r.head);
    let body = r.body_str();
    assert!(
        body.starts_with("GET /echo HTTP/1.1\r\n"),
        "rewritten: {body}"
    );
    assert!(
        body.to_ascii_lowercase().contains("x-added: yes"),
        "request header set: {body}"
    );
    assert_eq!(r.header("x-resp"), Some("1"), "response header added");
    let r = get_with(web, "filters.example", "/old/x?q=1", "").unwrap();
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("location"),
        Some("http://filters.example/new/x?q=1")
    );
    let r = get_with(web, "filters.example", "/oldish", "").unwrap();
    assert_eq!(r.status, 404, "a prefix matches whole segments");
}

/// The GRPCRoute's method match, to the h2c backend.
fn check_grpc(web: SocketAddr) {
    let path = "/hello.Greeter/SayHello";
    let r = get_with(web, "grpc.example", path, "").unwrap();
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(
        r.header("x-grpc-path"),
        Some(path),
        "over h2c to the backend"
    );
    let other = get_with(web, "grpc.example", "/hello.Greeter/SayMany", "").unwrap();
    assert_eq!(other.status, 404, "another method does not match");
}

/// The HTTPS listener's certificate from its Secret, its route through it.
fn check_tls(scene: &Scene, websecure: SocketAddr) {
    let client = default_client(&scene.pki.ca_pem, &[b"http/1.1"]);
    let (mut s, session) = tls_connect(websecure, "secure.example", client).unwrap();
    assert_eq!(
        session.peer_cn, "secure.example",
        "the Secret's certificate"
    );
    let (status, raw) = https1(&mut s, "secure.example", "/");
    assert_eq!(status, 200, "{raw}");
}

/// A backendRef to another namespace: 500 and RefNotPermitted until a ReferenceGrant.
fn check_reference_grant(scene: &Scene, web: SocketAddr) {
    assert_eq!(hit(web, "far.example", "/").0, 500, "refused backend");
    let resolved = |want: &str| {
        let r = scene.get(NS, "httproutes", "far");
        let conds = r["status"]["parents"][0]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conds
            .iter()
            .any(|c| c["type"] == "ResolvedRefs" && c["reason"] == want)
    };
    within(Duration::from_secs(10), "RefNotPermitted in status", || {
        resolved("RefNotPermitted")
    });
    scene.create_gw(
        &scene.path(OTHER, "referencegrants"),
        "ReferenceGrant",
        json!({"metadata": {"name": "from-shop"}, "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": NS}],
            "to": [{"group": "", "kind": "Service"}]}}),
    );
    within(
        Duration::from_secs(5),
        "served after the ReferenceGrant",
        || hit(web, "far.example", "/") == (200, "c".into()),
    );
    within(Duration::from_secs(10), "ResolvedRefs in status", || {
        resolved("ResolvedRefs")
    });
}

/// Status: GatewayClass Accepted; Gateway Accepted and Programmed with its generation,
/// listeners with attached routes, the address; a refused rule's route not Accepted.
fn check_status(scene: &Scene) {
    let cond = |obj: &Value, t: &str| -> Value {
        obj["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == t)
            .cloned()
            .unwrap_or(Value::Null)
    };
    within(Duration::from_secs(10), "GatewayClass Accepted", || {
        let c = scene
            .k
            .call("GET", &format!("{GW}/gatewayclasses/veloxy"), None)
            .1;
        cond(&c["status"], "Accepted")["status"] == "True"
    });
    within(Duration::from_secs(10), "Gateway status", || {
        let g = scene.get(NS, "gateways", "gw");
        let gen = g["metadata"]["generation"].clone();
        let s = &g["status"];
        ["Accepted", "Programmed"]
            .iter()
            .all(|t| cond(s, t)["status"] == "True" && cond(s, t)["observedGeneration"] == gen)
            && s["addresses"][0]["value"] == "203.0.113.10"
            && s["listeners"][0]["attachedRoutes"] == 5
            && s["listeners"][1]["attachedRoutes"] == 1
            && cond(&s["listeners"][1], "ResolvedRefs")["status"] == "True"
            && cond(s, "Accepted")["reason"] == "ListenersNotValid"
            && cond(&s["listeners"][2], "Accepted")["reason"] == "UnsupportedProtocol"
    });
    within(
        Duration::from_secs(10),
        "an Event for the refused listener",
        || {
            events_about(scene, "gw").iter().any(|e| {
                e["regarding"]["kind"] == "Gateway" && e["reason"] == "UnsupportedProtocol"
            })
        },
    );
    within(
        Duration::from_secs(10),
        "the refused route's status",
        || {
            let r = scene.get(NS, "httproutes", "refused");
            let p = &r["status"]["parents"][0];
            let a = cond(p, "Accepted");
            p["controllerName"] == "veloxy.dev/gateway-controller"
                && a["status"] == "False"
                && a["reason"] == "UnsupportedValue"
                && a["observedGeneration"] == r["metadata"]["generation"]
        },
    );
    let split = scene.get(NS, "httproutes", "split");
    assert_eq!(
        cond(&split["status"]["parents"][0], "Accepted")["status"],
        "True",
        "{split}"
    );
}

/// The Events in `shop` about `name`.
fn events_about(scene: &Scene, name: &str) -> Vec<Value> {
    let (_, list) = scene.k.call(
        "GET",
        &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
        None,
    );
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name)
        .collect()
}

/// A Warning Event for the refused route, written once (the rebuilds after it, for status
/// writes and the other objects, add none).
fn check_event(scene: &Scene) {
    within(
        Duration::from_secs(10),
        "an Event for the refused route",
        || {
            events_about(scene, "refused").iter().any(|e| {
                e["type"] == "Warning"
                    && e["reason"] == "UnsupportedValue"
                    && e["regarding"]["kind"] == "HTTPRoute"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("ExtensionRef"))
            })
        },
    );
    let events = events_about(scene, "refused");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0]["series"].is_null(), "reported once: {events:?}");
}

/// A route that breaks the compiled config (a header veloxy manages) is left out and
/// reported (an Event, Invalid); the other routes stay served.
fn check_breaking_route(scene: &Scene, web: SocketAddr) {
    let framing = json!([{"name": "Transfer-Encoding", "value": "chunked"}]);
    scene.create_gw(
        &scene.path(NS, "httproutes"),
        "HTTPRoute",
        http_route(
            "breaks",
            &["breaks.example"],
            json!({"name": "gw"}),
            json!([
            {"filters": [{"type": "RequestHeaderModifier",
                          "requestHeaderModifier": {"set": framing}}],
             "backendRefs": [{"name": "web", "port": 80}]}]),
        ),
    );
    within(
        Duration::from_secs(10),
        "the breaking route reported",
        || {
            events_about(scene, "breaks").iter().any(|e| {
                e["reason"] == "Invalid"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("managed by veloxy"))
            })
        },
    );
    assert_eq!(hit(web, "breaks.example", "/").0, 404, "left out");
    assert_eq!(
        hit(web, "split.example", "/new").0,
        200,
        "the others served"
    );
    // Fixed, it is served.
    let fixed = json!({"spec": {"rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}});
    scene
        .k
        .patch(&format!("{}/breaks", scene.path(NS, "httproutes")), fixed);
    within(Duration::from_secs(5), "the fixed route served", || {
        hit(web, "breaks.example", "/").0 == 200
    });
}

/// A route that moves to another controller's Gateway loses veloxy's `parents[]` entry.
fn check_parent_cleared(scene: &Scene) {
    let path = format!("{}/refused", scene.path(NS, "httproutes"));
    scene.k.patch(
        &path,
        json!({"spec": {"parentRefs": [{"name": "not-ours"}]}}),
    );
    within(
        Duration::from_secs(10),
        "veloxy's parent entry removed",
        || {
            let r = scene.get(NS, "httproutes", "refused");
            r["status"]["parents"].as_array().is_some_and(|p| {
                !p.iter()
                    .any(|e| e["controllerName"] == "veloxy.dev/gateway-controller")
            })
        },
    );
}

/// After the changes (several rebuilds), the refused route's Event is still the one.
fn check_event_not_repeated(scene: &Scene) {
    let events = events_about(scene, "refused");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0]["series"].is_null(),
        "not reported again: {events:?}"
    );
}

/// A route change and an endpoint change, each applied within 1 s; endpoint changes go
/// without a translation.
fn check_changes(scene: &Scene, v: &Veloxy, web: SocketAddr) {
    let rules = json!({"spec": {"rules": [
        {"matches": [{"path": {"type": "Exact", "value": "/new"}}],
         "backendRefs": [{"name": "web", "port": 80}]},
        {"backendRefs": [{"name": "api", "port": 80}]}]}});
    scene
        .k
        .patch(&format!("{}/split", scene.path(NS, "httproutes")), rules);
    let t = within(Duration::from_secs(5), "the route change", || {
        hit(web, "split.example", "/new").1 == "a" && hit(web, "split.example", "/other").1 == "b"
    });
    eprintln!("route change applied in {:.0} ms", t.as_secs_f64() * 1000.0);
    assert!(t <= Duration::from_secs(1), "route change took {t:?}");
    let path = format!("{}/web-1", scene.path(NS, "endpointslices"));
    scene
        .k
        .patch(&path, slice("web-1", "web", scene.port, &[BACKENDS[2]]));
    let t = within(Duration::from_secs(5), "the endpoint change", || {
        hit(web, "split.example", "/new").1 == "c"
    });
    eprintln!(
        "endpoint change applied in {:.0} ms",
        t.as_secs_f64() * 1000.0
    );
    assert!(t <= Duration::from_secs(1), "endpoint change took {t:?}");
    // An endpoint-only change goes without a translation. The route change's status write
    // (an HTTPRoute event) may fall in the same rebuild as a slice change, which is then a
    // full one: the endpoint flips back and forth until one is seen alone (5 at most).
    let untranslated = || {
        v.proc.log_text().lines().any(|l| {
            l.contains("kubernetes: servers changed in place") && l.contains("translated=false")
        })
    };
    for flip in 0..5 {
        if untranslated() {
            break;
        }
        let (addr, name) = if flip % 2 == 0 {
            (BACKENDS[0], "a")
        } else {
            (BACKENDS[2], "c")
        };
        scene
            .k
            .patch(&path, slice("web-1", "web", scene.port, &[addr]));
        within(Duration::from_secs(5), "the endpoint flip", || {
            hit(web, "split.example", "/new").1 == name
        });
    }
    within(
        Duration::from_secs(2),
        "an endpoint change applied in place without a translation",
        untranslated,
    );
}

#[test]
fn gateway_api_objects_become_routes_with_status() {
    if !gateway_crds_cached() || !in_netns("gateway_api_objects_become_routes_with_status") {
        return;
    }
    let started = Instant::now();
    let scene = Scene::start();
    scene.create_objects();
    scene.create_grpc_route();
    let v = veloxy(&scene.config());
    let _dump = DumpLogOnPanic(&v);
    let web = logged_addr(&v, "listener=web ");
    let websecure = logged_addr(&v, "listener=websecure");
    check_split(web);
    assert!(v
        .proc
        .log_text()
        .contains("Gateway API v1 served: watching its objects"));
    check_filters(web);
    check_grpc(web);
    check_tls(&scene, websecure);
    check_reference_grant(&scene, web);
    check_status(&scene);
    check_event(&scene);
    // Status is written only when it changes: the rebuilds of the changes below (none of
    // which changes the Gateway's or the refused route's status) do not write them again.
    let version =
        |kind: &str, name: &str| scene.get(NS, kind, name)["metadata"]["resourceVersion"].clone();
    let before = (version("gateways", "gw"), version("httproutes", "refused"));
    check_changes(&scene, &v, web);
    let after = (version("gateways", "gw"), version("httproutes", "refused"));
    assert_eq!(before, after, "status rewritten without a change");
    check_event_not_repeated(&scene);
    check_breaking_route(&scene, web);
    check_parent_cleared(&scene);
    let _ = &scene.dir;
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}
