//! Two Gateways on a real kube-apiserver and etcd (issue 37; the conformance suite's
//! HTTPRouteMultipleGateways and HTTPRouteHTTPSListener as tests of their own): with
//! `gateway_addresses`, each Gateway gets an address of the pool, publishes it, and its
//! routes answer on that address only; an HTTPS listener without hostname serves its
//! certificate for a name no route has (and a 404), not the file listener's.
//!
//! As in `kube_gateway.rs`, the test runs in a network namespace of its own with TEST-NET
//! addresses on `lo`: 192.0.2.1 the API server, 192.0.2.10 the backend, 192.0.2.20 the
//! file's listeners (80, 443), 192.0.2.21-22 the pool. Skipped without `unshare` rights,
//! the binaries or the cached CRDs (`bash .ci/kube.sh` provides both).

use std::net::SocketAddr;

use base64::Engine as _;
use serde_json::{json, Value};
use std::time::Duration;
use veloxy_testkit::kube::{gateway_crds_cached, in_netns, ip, within, Cluster, DumpLogOnPanic};
use veloxy_testkit::*;

const API_ADDR: &str = "192.0.2.1";
const BACKEND: &str = "192.0.2.10";
const FILE_ADDR: &str = "192.0.2.20";
const POOL: [&str; 2] = ["192.0.2.21", "192.0.2.22"];
const NS: &str = "shop";
const GW: &str = "/apis/gateway.networking.k8s.io/v1";

/// The status of `GET /` with `Host: host` on `addr` (0: no answer).
fn hit(addr: SocketAddr, host: &str) -> u16 {
    let Ok(mut c) = Client::try_connect(addr) else {
        return 0;
    };
    c.send(format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes());
    c.try_read_response(false).map_or(0, |r| r.status)
}

fn create_gw(k: &Cluster, path: &str, kind: &str, mut body: Value) {
    body["apiVersion"] = "gateway.networking.k8s.io/v1".into();
    body["kind"] = kind.into();
    k.create(path, body);
}

/// The Service `web` on the backend, the Gateway's Secret, the GatewayClass, Gateways `one`
/// (HTTP, and HTTPS without hostname) and `two` (HTTP), a route of each and a shared one.
fn create_objects(k: &Cluster, pki: &Pki, port: u16) {
    k.create("/api/v1/namespaces", json!({"metadata": {"name": NS}}));
    k.create(
        &format!("/api/v1/namespaces/{NS}/services"),
        json!({"metadata": {"name": "web"},
               "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    );
    k.create(
        &format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"),
        json!({"metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4",
               "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
               "endpoints": [{"addresses": [BACKEND], "conditions": {"ready": true}}]}),
    );
    let (cert, key) = pki.leaf(
        "gateway",
        &["gateway.example", "a.example", "other.example"],
        KeyKind::Ecdsa,
    );
    let b64 = |p: &std::path::Path| {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap())
    };
    k.create(
        &format!("/api/v1/namespaces/{NS}/secrets"),
        json!({"metadata": {"name": "gw-tls"}, "type": "kubernetes.io/tls",
               "data": {"tls.crt": b64(&cert), "tls.key": b64(&key)}}),
    );
    create_gw(
        k,
        &format!("{GW}/gatewayclasses"),
        "GatewayClass",
        json!({"metadata": {"name": "veloxy"},
               "spec": {"controllerName": "veloxy.dev/gateway-controller"}}),
    );
    let http = json!({"name": "http", "port": 80, "protocol": "HTTP"});
    let https = json!({"name": "https", "port": 443, "protocol": "HTTPS",
                       "tls": {"certificateRefs": [{"name": "gw-tls"}]}});
    for (name, listeners) in [("one", json!([http, https])), ("two", json!([http]))] {
        create_gw(
            k,
            &format!("{GW}/namespaces/{NS}/gateways"),
            "Gateway",
            json!({"metadata": {"name": name},
                   "spec": {"gatewayClassName": "veloxy", "listeners": listeners}}),
        );
    }
    for (name, host, parents) in [
        ("r-one", "a.example", &["one"][..]),
        ("r-two", "b.example", &["two"][..]),
        ("shared", "s.example", &["one", "two"][..]),
    ] {
        let parents: Vec<Value> = parents.iter().map(|p| json!({"name": p})).collect();
        create_gw(
            k,
            &format!("{GW}/namespaces/{NS}/httproutes"),
            "HTTPRoute",
            json!({"metadata": {"name": name},
                   "spec": {"parentRefs": parents, "hostnames": [host],
                            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}),
        );
    }
}

/// The address Gateway `name` publishes, once it is one of the pool.
fn published(k: &Cluster, name: &str) -> String {
    let path = format!("{GW}/namespaces/{NS}/gateways/{name}");
    let mut addr = String::new();
    within(Duration::from_secs(20), "a pool address published", || {
        let g = k.call("GET", &path, None).1;
        addr = g["status"]["addresses"][0]["value"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        POOL.contains(&addr.as_str())
    });
    addr
}

#[test]
fn each_gateway_is_served_on_its_own_address() {
    if !gateway_crds_cached() || !in_netns("each_gateway_is_served_on_its_own_address") {
        return;
    }
    ip(&["link", "set", "lo", "up"]);
    for a in [API_ADDR, BACKEND, FILE_ADDR].iter().chain(POOL.iter()) {
        ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
    }
    let k = Cluster::start(API_ADDR);
    k.gateway_crds();
    let backend = upstream(&["--name", "a", "--listen", &format!("{BACKEND}:0")]);
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    create_objects(&k, &pki, backend.addr.port());
    let (cert, key) = pki.leaf("default", &["default.example"], KeyKind::Ecdsa);
    let v = veloxy(&format!(
        r#"
[listeners.web]
addr = "{FILE_ADDR}:80"

[listeners.websecure]
addr = "{FILE_ADDR}:443"
[listeners.websecure.tls]
cert = "{}"
key = "{}"

[providers.kubernetes]
kubeconfig = "{}"
namespaces = ["{NS}"]
http_listener = "web"
https_listener = "websecure"
status_address = "{FILE_ADDR}"
gateway_addresses = ["{}", "{}"]
"#,
        cert.display(),
        key.display(),
        k.kubeconfig.display(),
        POOL[0],
        POOL[1],
    ));
    let _dump = DumpLogOnPanic(&v);
    let (one, two) = (published(&k, "one"), published(&k, "two"));
    assert_ne!(one, two, "each Gateway its own address");
    let at = |a: &str, port: u16| -> SocketAddr { format!("{a}:{port}").parse().unwrap() };
    let (one80, two80) = (at(&one, 80), at(&two, 80));
    within(Duration::from_secs(20), "the routes served", || {
        hit(one80, "a.example") == 200 && hit(two80, "b.example") == 200
    });
    // A route answers on its Gateway's address only; the shared one on both.
    assert_eq!(hit(one80, "b.example"), 404, "two's route through one");
    assert_eq!(hit(two80, "a.example"), 404, "one's route through two");
    assert_eq!(
        hit(at(FILE_ADDR, 80), "a.example"),
        404,
        "the file's address"
    );
    assert_eq!(hit(one80, "s.example"), 200);
    assert_eq!(hit(two80, "s.example"), 200);
    // HTTPS without hostname: the Gateway's certificate for its route's name and for a name
    // no route has (then a 404), not the file listener's default.
    let client = default_client(&pki.ca_pem, &[b"http/1.1"]);
    for (sni, status) in [("a.example", 200), ("other.example", 404)] {
        let (mut s, session) = tls_connect(at(&one, 443), sni, client.clone())
            .unwrap_or_else(|e| panic!("handshake for {sni}: {e}"));
        assert_eq!(session.peer_cn, "gateway.example", "{sni}");
        let (got, raw) = https1(&mut s, sni, "/");
        assert_eq!(got, status, "{sni}: {raw}");
    }
}
