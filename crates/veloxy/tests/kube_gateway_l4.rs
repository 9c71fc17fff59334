//! The Kubernetes provider's TCPRoutes, TLSRoutes and the HTTPRoute CORS filter (issue 37)
//! against a real kube-apiserver and etcd with the Gateway API v1.6.3 CRDs (standard
//! channel, where TCPRoute and TLSRoute are v1).
//!
//! As in `kube_gateway.rs`, the test runs in a network namespace of its own with TEST-NET
//! addresses on `lo`: 192.0.2.1 for the API server and veloxy (HTTP on 80, HTTPS on 443, a
//! `protocol = "tcp"` listener on 5432 with no `[[streams]]` of its own: the TCPRoute brings
//! it), 192.0.2.10 for a TCP echo server, .11 and .12 for two TLS servers (veloxy
//! processes holding the certificates of git.example and mail.example), .13 for the HTTP
//! backend. Skipped without `unshare` rights, the binaries or the cached CRDs (`bash
//! .ci/kube.sh` provides both).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};
use veloxy_testkit::kube::{gateway_crds_cached, in_netns, ip, within, Cluster, DumpLogOnPanic};
use veloxy_testkit::*;

const API_ADDR: &str = "192.0.2.1";
const ECHO: &str = "192.0.2.10";
const GIT: &str = "192.0.2.11";
const MAIL: &str = "192.0.2.12";
const WEB: &str = "192.0.2.13";
const NS: &str = "shop";
const GW: &str = "/apis/gateway.networking.k8s.io/v1";
const DISCOVERY: &str = "/apis/discovery.k8s.io/v1";

/// A TLS server on `addr` with the certificate of `name`, answering its name.
fn tls_server(pki: &Pki, addr: &str, name: &str) -> Veloxy {
    let (cert, key) = pki.leaf(name, &[name], KeyKind::Ecdsa);
    veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.tls]\naddr = \"{addr}:0\"\n\
         [listeners.tls.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nrespond = {{ body = \"{name}\" }}\n",
        cert.display(),
        key.display()
    ))
}

fn slice(name: &str, service: &str, addr: SocketAddr) -> Value {
    json!({"metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "ports": [{"name": "main", "port": addr.port(), "protocol": "TCP"}],
           "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}]})
}

fn service(name: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"ports": [{"name": "main", "port": 80, "targetPort": "main"}]}})
}

struct Scene {
    k: Cluster,
    pki: Pki,
    _dir: tempfile::TempDir,
    echo: SocketAddr,
    _tls: Vec<Veloxy>,
    web: Upstream,
}

impl Scene {
    fn start() -> Scene {
        ip(&["link", "set", "lo", "up"]);
        for a in [API_ADDR, ECHO, GIT, MAIL, WEB] {
            ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        let k = Cluster::start(API_ADDR);
        k.gateway_crds();
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path());
        let tls = vec![
            tls_server(&pki, GIT, "git.example"),
            tls_server(&pki, MAIL, "mail.example"),
        ];
        Scene {
            k,
            echo: tcp_echo(ECHO),
            web: upstream(&["--name", "web", "--listen", &format!("{WEB}:0")]),
            pki,
            _dir: dir,
            _tls: tls,
        }
    }

    fn path(&self, kind: &str) -> String {
        match kind {
            "services" => format!("/api/v1/namespaces/{NS}/{kind}"),
            "endpointslices" => format!("{DISCOVERY}/namespaces/{NS}/{kind}"),
            _ => format!("{GW}/namespaces/{NS}/{kind}"),
        }
    }

    /// Creates a Gateway API object (custom resources need their apiVersion and kind).
    fn create_gw(&self, path: &str, kind: &str, mut body: Value) {
        body["apiVersion"] = "gateway.networking.k8s.io/v1".into();
        body["kind"] = kind.into();
        self.k.create(path, body);
    }

    fn get(&self, kind: &str, name: &str) -> Value {
        self.k
            .call("GET", &format!("{}/{name}", self.path(kind)), None)
            .1
    }

    /// The Services and their endpoints, the GatewayClass, the Gateway (HTTP on 80, TCP on
    /// 5432, TLS passthrough on 443), a TCPRoute, two TLSRoutes (and one whose Service does
    /// not exist) and an HTTPRoute with a CORS filter.
    fn create_objects(&self) {
        let k = &self.k;
        k.create("/api/v1/namespaces", json!({"metadata": {"name": NS}}));
        let backends = [
            ("echo", self.echo),
            ("git", self._tls[0].addr),
            ("mail", self._tls[1].addr),
            ("web", self.web.addr),
        ];
        for (svc, addr) in backends {
            k.create(&self.path("services"), service(svc));
            let s = slice(&format!("{svc}-1"), svc, addr);
            k.create(&self.path("endpointslices"), s);
        }
        self.create_gw(
            &format!("{GW}/gatewayclasses"),
            "GatewayClass",
            json!({"metadata": {"name": "veloxy"},
                   "spec": {"controllerName": "veloxy.dev/gateway-controller"}}),
        );
        self.create_gw(
            &self.path("gateways"),
            "Gateway",
            json!({"metadata": {"name": "gw"}, "spec": {"gatewayClassName": "veloxy",
              "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {"name": "db", "port": 5432, "protocol": "TCP"},
                {"name": "tls", "port": 443, "protocol": "TLS",
                 "tls": {"mode": "Passthrough"}}]}}),
        );
        let backend = |name: &str| json!([{"backendRefs": [{"name": name, "port": 80}]}]);
        self.create_gw(
            &self.path("tcproutes"),
            "TCPRoute",
            json!({"metadata": {"name": "db"}, "spec": {
                "parentRefs": [{"name": "gw", "sectionName": "db"}], "rules": backend("echo")}}),
        );
        for (name, host, svc) in [
            ("git", "git.example", "git"),
            ("mail", "mail.example", "mail"),
            ("ghost", "ghost.example", "nothere"),
        ] {
            self.create_gw(
                &self.path("tlsroutes"),
                "TLSRoute",
                json!({"metadata": {"name": name}, "spec": {
                    "parentRefs": [{"name": "gw", "sectionName": "tls"}],
                    "hostnames": [host], "rules": backend(svc)}}),
            );
        }
        let cors = json!({"allowOrigins": ["https://app.example", "https://*.site.example"], "allowCredentials": true,
            "allowMethods": ["GET", "PUT"], "allowHeaders": ["X-Token"],
            "exposeHeaders": ["X-Trace"], "maxAge": 60});
        self.create_gw(
            &self.path("httproutes"),
            "HTTPRoute",
            json!({"metadata": {"name": "cors"}, "spec": {
                "parentRefs": [{"name": "gw", "sectionName": "http"}],
                "hostnames": ["cors.example"],
                "rules": [{"filters": [{"type": "CORS", "cors": cors}],
                           "backendRefs": [{"name": "web", "port": 80}]}]}}),
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

[listeners.db]
addr = "{API_ADDR}:5432"
protocol = "tcp"

[[routes]]
listener = "websecure"
respond = {{ body = "front" }}

[providers.kubernetes]
kubeconfig = "{}"
namespaces = ["{NS}"]
gateway_class = "veloxy"
http_listener = "web"
https_listener = "websecure"
"#,
            cert.display(),
            key.display(),
            self.k.kubeconfig.display()
        )
    }
}

/// The condition `t` of a status object (`Null` when absent).
fn cond(obj: &Value, t: &str) -> Value {
    obj["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == t)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The TCPRoute: bytes written to the tcp listener come back from the echo backend.
fn check_tcp(db: SocketAddr) {
    let echoed = |data: &[u8]| -> Option<Vec<u8>> {
        let mut c = TcpStream::connect(db).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        c.write_all(data).ok()?;
        let mut got = vec![0u8; data.len()];
        c.read_exact(&mut got).ok()?;
        Some(got)
    };
    let t = within(Duration::from_secs(20), "the TCPRoute served", || {
        echoed(b"ping").as_deref() == Some(b"ping")
    });
    eprintln!("TCPRoute served {:.2} s in", t.as_secs_f64());
    let data: Vec<u8> = (0..100_000u32).map(|x| x as u8).collect();
    assert_eq!(echoed(&data), Some(data), "100 kB both ways");
}

/// The TLSRoutes: each SNI name reaches the backend holding its certificate (the client
/// verifies it: only that backend has it); another name is veloxy's own HTTPS.
fn check_tls(scene: &Scene, websecure: SocketAddr) {
    let ca = &scene.pki.ca_pem;
    within(Duration::from_secs(10), "the TLSRoutes served", || {
        get_verified(websecure, "git.example", ca).is_ok()
    });
    assert_eq!(
        get_verified(websecure, "git.example", ca),
        Ok("git.example".into())
    );
    assert_eq!(
        get_verified(websecure, "mail.example", ca),
        Ok("mail.example".into())
    );
    assert_eq!(
        get_verified(websecure, "default.example", ca),
        Ok("front".into()),
        "other names are terminated by veloxy"
    );
}

/// The CORS filter: a preflight answered by veloxy as the filter says, the actual answer's
/// fields, nothing for another origin.
fn check_cors(web: SocketAddr) {
    let ask = |method: &str, origin: &str| -> Option<Response> {
        let mut c = Client::try_connect(web).ok()?;
        c.send(
            format!(
                "{method} /x HTTP/1.1\r\nHost: cors.example\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: PUT\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        );
        c.try_read_response(false)
    };
    within(Duration::from_secs(10), "the CORS route served", || {
        ask("GET", "https://app.example").is_some_and(|r| r.status == 200)
    });
    let r = ask("OPTIONS", "https://app.example").unwrap();
    assert_eq!(r.status, 204, "{}", r.head);
    assert_eq!(r.header("x-upstream"), None, "answered by veloxy");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, PUT"));
    assert_eq!(r.header("access-control-allow-headers"), Some("X-Token"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("60"));
    let r = ask("GET", "https://app.example").unwrap();
    assert_eq!(r.header("x-upstream"), Some("web"));
    assert_eq!(r.header("access-control-expose-headers"), Some("X-Trace"));
    let wild = ask("OPTIONS", "https://a.b.site.example").unwrap();
    assert_eq!(
        wild.header("access-control-allow-origin"),
        Some("https://a.b.site.example"),
        "a wildcard host"
    );
    for evil in [
        "https://evil.example",
        "https://site.example",
        "http://a.site.example",
    ] {
        let other = ask("OPTIONS", evil).unwrap();
        assert_eq!(other.header("access-control-allow-origin"), None, "{evil}");
    }
}

/// Status: the Gateway's listeners with their kinds and routes, each route's parent entry
/// with `observedGeneration`, BackendNotFound for the missing Service.
fn check_status(scene: &Scene) {
    within(Duration::from_secs(10), "the Gateway's listeners", || {
        let g = scene.get("gateways", "gw");
        let ls = &g["status"]["listeners"];
        let kinds = |i: usize| ls[i]["supportedKinds"][0]["kind"].clone();
        let gen = &g["metadata"]["generation"];
        kinds(1) == "TCPRoute"
            && kinds(2) == "TLSRoute"
            && ls[0]["attachedRoutes"] == 1
            && ls[1]["attachedRoutes"] == 1
            && ls[2]["attachedRoutes"] == 3
            && (0..3).all(|i| {
                let c = cond(&ls[i], "Accepted");
                c["status"] == "True" && c["observedGeneration"] == *gen
            })
    });
    let parent_ok = |kind: &str, name: &str| {
        let r = scene.get(kind, name);
        let p = &r["status"]["parents"][0];
        let gen = &r["metadata"]["generation"];
        ["Accepted", "ResolvedRefs"].iter().all(|t| {
            let c = cond(p, t);
            c["status"] == "True" && c["observedGeneration"] == *gen
        }) && p["parentRef"]["sectionName"].is_string()
    };
    within(Duration::from_secs(10), "the routes' status", || {
        parent_ok("tcproutes", "db")
            && parent_ok("tlsroutes", "git")
            && parent_ok("tlsroutes", "mail")
            && parent_ok("httproutes", "cors")
    });
    within(Duration::from_secs(10), "BackendNotFound", || {
        let r = scene.get("tlsroutes", "ghost");
        let p = &r["status"]["parents"][0];
        cond(p, "Accepted")["status"] == "True"
            && cond(p, "ResolvedRefs")["reason"] == "BackendNotFound"
    });
}

/// A TCPRoute moved to another backend applies within 1 s.
fn check_change(scene: &Scene, db: SocketAddr) {
    let rules = json!({"spec": {"rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}});
    scene
        .k
        .patch(&format!("{}/db", scene.path("tcproutes")), rules);
    let t = within(Duration::from_secs(5), "the TCPRoute change", || {
        let Ok(mut c) = TcpStream::connect(db) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        // The echo backend sends the request back and keeps the connection: not yet.
        let mut first = [0u8; 3];
        if c.read_exact(&mut first).is_err() || &first == b"GET" {
            return false;
        }
        let mut out = first.to_vec();
        let _ = c.read_to_end(&mut out);
        String::from_utf8_lossy(&out)
            .to_ascii_lowercase()
            .contains("x-upstream: web")
    });
    eprintln!(
        "TCPRoute change applied in {:.0} ms",
        t.as_secs_f64() * 1000.0
    );
    assert!(t <= Duration::from_secs(1), "the change took {t:?}");
}

#[test]
fn tcp_and_tls_routes_and_cors_over_a_real_api_server() {
    if !gateway_crds_cached() || !in_netns("tcp_and_tls_routes_and_cors_over_a_real_api_server") {
        return;
    }
    let scene = Scene::start();
    scene.create_objects();
    let v = veloxy(&scene.config());
    let _dump = DumpLogOnPanic(&v);
    let web = logged_addr(&v, "listener=web ");
    let websecure = logged_addr(&v, "listener=websecure");
    let db = logged_addr(&v, "listener=db ");
    check_tcp(db);
    check_tls(&scene, websecure);
    check_cors(web);
    check_status(&scene);
    check_change(&scene, db);
}
