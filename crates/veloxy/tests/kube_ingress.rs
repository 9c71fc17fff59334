//! The Kubernetes provider against a real kube-apiserver and etcd (issue 37): Ingress objects
//! created through the API become routes of a running veloxy, and changes apply without a
//! restart.
//!
//! The API server refuses loopback addresses in EndpointSlices, so the test runs in a network
//! namespace of its own (`veloxy_testkit::kube::in_netns`), where `lo` gets TEST-NET
//! addresses: 192.0.2.1 for the API server and veloxy, 192.0.2.10-12 for the backends.
//! Nothing leaves the namespace. Without `unshare` rights or the binaries (`bash .ci/kube.sh`
//! builds them), the test is skipped.
//!
//! Objects are created with curl (the API server's REST API, the admin token of
//! `dev/kube/start.sh`); veloxy reads them with its own client from the kubeconfig.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use veloxy_testkit::kube::{gateway_crds_cached, in_netns, ip, within, Cluster, DumpLogOnPanic};
use veloxy_testkit::*;

/// The API server's address (and veloxy's).
const API_ADDR: &str = "192.0.2.1";
/// The backends' addresses: a, b, c.
const BACKENDS: [&str; 3] = ["192.0.2.10", "192.0.2.11", "192.0.2.12"];
const NS: &str = "shop";

const NET: &str = "/apis/networking.k8s.io/v1";
const DISCOVERY: &str = "/apis/discovery.k8s.io/v1";

fn ingress(name: &str, class: &str, annotations: Value, spec: Value) -> Value {
    let mut spec = spec;
    spec["ingressClassName"] = class.into();
    json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec})
}

fn rule(host: &str, paths: &[(&str, &str, Value)]) -> Value {
    let paths: Vec<Value> = paths
        .iter()
        .map(|(p, kind, port)| {
            json!({"path": p, "pathType": kind,
                   "backend": {"service": {"name": "web", "port": port}}})
        })
        .collect();
    json!({"host": host, "http": {"paths": paths}})
}

fn slice(port: u16, addrs: &[&str]) -> Value {
    let eps: Vec<Value> = addrs
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    json!({"metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
           "endpoints": eps})
}

/// `GET path` with `Host: host` (status, x-upstream, body).
fn hit(addr: SocketAddr, host: &str, path: &str) -> (u16, String, String) {
    let Ok(mut c) = Client::try_connect(addr) else {
        return (0, String::new(), String::new());
    };
    c.send(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes());
    match c.try_read_response(false) {
        Some(r) => (
            r.status,
            r.header("x-upstream").unwrap_or_default().to_string(),
            r.body_str(),
        ),
        None => (0, String::new(), String::new()),
    }
}

/// The backend names answering `host` `path` over `n` requests.
fn names(addr: SocketAddr, host: &str, path: &str, n: usize) -> Vec<String> {
    let mut seen: Vec<String> = (0..n).map(|_| hit(addr, host, path).1).collect();
    seen.sort();
    seen.dedup();
    seen
}

/// Backend `name` on `addr:port` (port 0: any).
fn backend(name: &str, addr: &str, port: u16) -> Upstream {
    upstream(&["--name", name, "--listen", &format!("{addr}:{port}")])
}

/// What the steps share.
struct Scene {
    k: Cluster,
    pki: Pki,
    _tls_dir: tempfile::TempDir,
    /// The backends' common port.
    port: u16,
    _backends: Vec<Upstream>,
}

const NSP: &str = "/namespaces/shop";

impl Scene {
    /// The API server and three backends a, b, c on one port (an EndpointSlice port is the
    /// same for all its endpoints).
    fn start() -> Scene {
        ip(&["link", "set", "lo", "up"]);
        for a in [API_ADDR].iter().chain(BACKENDS.iter()) {
            ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        let started = Instant::now();
        let k = Cluster::start(API_ADDR);
        eprintln!(
            "api server ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let a = backend("a", BACKENDS[0], 0);
        let port = a.addr.port();
        let b = backend("b", BACKENDS[1], port);
        let c = backend("c", BACKENDS[2], port);
        let tls_dir = tempfile::tempdir().unwrap();
        Scene {
            k,
            pki: Pki::new(tls_dir.path()),
            _tls_dir: tls_dir,
            port,
            _backends: vec![a, b, c],
        }
    }

    fn ingresses(&self) -> String {
        format!("{NET}{NSP}/ingresses")
    }

    /// The namespace, Service, EndpointSlice (a and b), TLS Secret, IngressClass and the
    /// Ingresses: shop (Prefix and Exact), rewrite (regex + rewrite-target), secure (TLS),
    /// other (class traefik).
    fn create_objects(&self) {
        let k = &self.k;
        k.create("/api/v1/namespaces", json!({"metadata": {"name": NS}}));
        k.create(
            &format!("/api/v1{NSP}/services"),
            json!({"metadata": {"name": "web"},
                   "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
        );
        k.create(
            &format!("{DISCOVERY}{NSP}/endpointslices"),
            slice(self.port, &BACKENDS[..2]),
        );
        let (cert, key) = self.pki.leaf("secure", &["secure.example"], KeyKind::Ecdsa);
        let b64 =
            |p: &Path| base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap());
        k.create(
            &format!("/api/v1{NSP}/secrets"),
            json!({"metadata": {"name": "secure-tls"}, "type": "kubernetes.io/tls",
                   "data": {"tls.crt": b64(&cert), "tls.key": b64(&key)}}),
        );
        // ingress-nginx's basic auth: an Opaque Secret whose `auth` is an htpasswd file.
        let users = self._tls_dir.path().join("users");
        assert!(htpasswd(
            &users,
            "alice",
            "s3cret",
            &["-c", "-B", "-C", "5"]
        ));
        k.create(
            &format!("/api/v1{NSP}/secrets"),
            json!({"metadata": {"name": "basic-users"}, "type": "Opaque",
                   "data": {"auth": b64(&users)}}),
        );
        k.create(
            &format!("{NET}/ingressclasses"),
            json!({"metadata": {"name": "veloxy"},
                   "spec": {"controller": "veloxy.dev/ingress-controller"}}),
        );
        let ings = self.ingresses();
        let port80 = || json!({"number": 80});
        k.create(
            &ings,
            ingress(
                "shop",
                "veloxy",
                json!({}),
                json!({"rules": [rule("shop.example", &[
                    ("/app", "Prefix", port80()),
                    ("/exact", "Exact", json!({"name": "http"})),
                ])]}),
            ),
        );
        k.create(
            &ings,
            ingress(
                "rewrite",
                "veloxy",
                json!({
                    "nginx.ingress.kubernetes.io/use-regex": "true",
                    "nginx.ingress.kubernetes.io/rewrite-target": "/$2",
                }),
                json!({"rules": [rule("rw.example", &[
                    ("/api(/|$)(.*)", "ImplementationSpecific", port80()),
                ])]}),
            ),
        );
        k.create(
            &ings,
            ingress(
                "secure",
                "veloxy",
                json!({}),
                json!({
                    "tls": [{"hosts": ["secure.example"], "secretName": "secure-tls"}],
                    "rules": [rule("secure.example", &[("/", "Prefix", port80())])],
                }),
            ),
        );
        k.create(
            &ings,
            ingress(
                "private",
                "veloxy",
                json!({
                    "nginx.ingress.kubernetes.io/auth-type": "basic",
                    "nginx.ingress.kubernetes.io/auth-secret": "basic-users",
                    "nginx.ingress.kubernetes.io/auth-realm": "staff",
                }),
                json!({"rules": [rule("private.example", &[("/", "Prefix", port80())])]}),
            ),
        );
        k.create(
            &ings,
            ingress(
                "other",
                "traefik",
                json!({}),
                json!({"rules": [
                    rule("other.example", &[("/", "Prefix", port80())]),
                ]}),
            ),
        );
    }

    /// veloxy with a file route of its own and [providers.kubernetes].
    fn veloxy(&self) -> Veloxy {
        veloxy(&self.config("from the file"))
    }

    /// The config file: the file's own route answers `body`.
    fn config(&self, body: &str) -> String {
        let (cert, key) = self
            .pki
            .leaf("default", &["default.example"], KeyKind::Ecdsa);
        format!(
            r#"
[listeners.web]
addr = "{API_ADDR}:0"

[listeners.websecure]
addr = "{API_ADDR}:0"
[listeners.websecure.tls]
cert = "{}"
key = "{}"

[[routes]]
listener = "web"
host = "file.example"
respond = {{ status = 200, body = "{body}\n" }}

[providers.kubernetes]
kubeconfig = "{}"
namespaces = ["{NS}"]
ingress_class = "veloxy"
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

    fn set_endpoints(&self, addrs: &[&str]) {
        let path = format!("{DISCOVERY}{NSP}/endpointslices/web-1");
        self.k.patch(&path, slice(self.port, addrs));
    }
}

/// (a) Prefix and Exact paths of one host, over both endpoints of the Service; the file's
/// own route stays.
fn check_paths(web: SocketAddr) {
    let first = within(Duration::from_secs(20), "the Ingress routes served", || {
        hit(web, "shop.example", "/app/x").0 == 200
    });
    eprintln!(
        "(a) Ingress routes served {:.2} s after veloxy started",
        first.as_secs_f64()
    );
    within(Duration::from_secs(5), "both endpoints used", || {
        names(web, "shop.example", "/app/x", 10) == ["a", "b"]
    });
    assert_eq!(hit(web, "shop.example", "/exact").0, 200, "Exact path");
    assert_eq!(
        hit(web, "shop.example", "/exact/more").0,
        404,
        "Exact does not match below"
    );
    assert_eq!(hit(web, "shop.example", "/other").0, 404, "no path matches");
    assert_eq!(
        hit(web, "file.example", "/").2,
        "from the file\n",
        "the file's route stays"
    );
}

/// (c) ingress-nginx's rewrite-target with a regex path; (d) another class is ignored.
fn check_rewrite_and_class(web: SocketAddr) {
    let (status, _, body) = hit(web, "rw.example", "/api/echo");
    assert_eq!(status, 200, "rewrite: {body}");
    assert!(body.starts_with("GET /echo "), "rewritten path: {body}");
    assert_eq!(
        hit(web, "other.example", "/").0,
        404,
        "class traefik is ignored"
    );
}

/// (e) TLS from the Secret on the https listener; plain HTTP redirects (ssl-redirect).
fn check_tls(scene: &Scene, web: SocketAddr, websecure: SocketAddr) {
    let client = default_client(&scene.pki.ca_pem, &[b"http/1.1"]);
    let (mut s, session) = tls_connect(websecure, "secure.example", client.clone()).unwrap();
    assert_eq!(
        session.peer_cn, "secure.example",
        "the Secret's certificate"
    );
    let (status, raw) = https1(&mut s, "secure.example", "/");
    assert_eq!(status, 200, "{raw}");
    let (_, session) = tls_connect(websecure, "default.example", client).unwrap();
    assert_eq!(
        session.peer_cn, "default.example",
        "the file's default certificate stays"
    );
    assert_eq!(
        hit(web, "secure.example", "/").0,
        308,
        "HTTP to HTTPS for a TLS host"
    );
}

/// (f) status.loadBalancer of the served Ingresses, not of the other class's.
fn check_status(scene: &Scene) {
    let ings = scene.ingresses();
    within(Duration::from_secs(10), "Ingress status written", || {
        let (_, ing) = scene.k.call("GET", &format!("{ings}/shop"), None);
        ing["status"]["loadBalancer"]["ingress"][0]["ip"] == "203.0.113.10"
    });
    let (_, other) = scene.k.call("GET", &format!("{ings}/other"), None);
    assert!(
        other["status"]["loadBalancer"]["ingress"].is_null(),
        "{other}"
    );
    // An Ingress moved to another class has veloxy's address cleared; moved back, it is
    // written again.
    let published = |name: &str| {
        let (_, ing) = scene.k.call("GET", &format!("{ings}/{name}"), None);
        ing["status"]["loadBalancer"]["ingress"][0]["ip"] == "203.0.113.10"
    };
    within(Duration::from_secs(10), "rewrite's status written", || {
        published("rewrite")
    });
    let class = |c: &str| json!({"spec": {"ingressClassName": c}});
    scene.k.patch(&format!("{ings}/rewrite"), class("traefik"));
    within(Duration::from_secs(10), "rewrite's status cleared", || {
        !published("rewrite")
    });
    scene.k.patch(&format!("{ings}/rewrite"), class("veloxy"));
    within(
        Duration::from_secs(10),
        "rewrite's status written again",
        || published("rewrite"),
    );
}

/// (h) ingress-nginx's basic auth from an Opaque Secret: 401 with the realm without
/// credentials or with a wrong password, the backend with the right ones.
fn check_basic_auth(web: SocketAddr) {
    let ask = |auth: Option<&str>| {
        let Ok(mut c) = Client::try_connect(web) else {
            return (0, String::new());
        };
        let auth = auth
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        c.send(
            format!("GET / HTTP/1.1\r\nHost: private.example\r\n{auth}Connection: close\r\n\r\n")
                .as_bytes(),
        );
        c.try_read_response(false).map_or((0, String::new()), |r| {
            let realm = r.header("www-authenticate").unwrap_or_default().to_owned();
            (r.status, realm)
        })
    };
    within(
        Duration::from_secs(10),
        "the private Ingress served",
        || ask(None).0 == 401,
    );
    assert!(ask(None).1.contains("staff"), "{:?}", ask(None));
    assert_eq!(ask(Some(&basic_credentials("alice", "wrong"))).0, 401);
    assert_eq!(ask(Some(&basic_credentials("alice", "s3cret"))).0, 200);
    eprintln!("(h) basic auth from an Opaque Secret");
}

/// The Lease's holder.
fn lease_holder(scene: &Scene) -> String {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/veloxy-status");
    let (_, lease) = scene.k.call("GET", &path, None);
    lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The Ingress `shop`'s published address.
fn status_ip(scene: &Scene) -> String {
    let (_, ing) = scene
        .k
        .call("GET", &format!("{}/shop", scene.ingresses()), None);
    ing["status"]["loadBalancer"]["ingress"][0]["ip"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// (f) A second replica, which would publish another address: it serves the Ingress routes
/// but leaves status to the first, the Lease's holder.
fn check_one_status_writer(scene: &Scene, first: &Veloxy) -> Veloxy {
    within(
        Duration::from_secs(10),
        "the first replica holds the lease",
        || lease_holder(scene).ends_with(&format!("_{}", first.proc.pid())),
    );
    assert!(first
        .proc
        .log_text()
        .contains("this replica holds the lease"));
    let config = scene
        .config("from the file")
        .replace("203.0.113.10", "203.0.113.20");
    let second = veloxy(&config);
    let web = logged_addr(&second, "listener=web ");
    within(Duration::from_secs(20), "the second replica serves", || {
        hit(web, "shop.example", "/app/x").0 == 200
    });
    within(
        Duration::from_secs(10),
        "the second replica follows",
        || {
            second
                .proc
                .log_text()
                .contains("another replica holds the lease")
        },
    );
    // It has built its routes: a writer would have published its address by now.
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        assert_eq!(
            status_ip(scene),
            "203.0.113.10",
            "{}",
            second.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("(f) one status writer of two replicas");
    second
}

/// (g) The first replica stopped (and gave the Lease up): the second takes it and writes its
/// address.
fn check_status_handed_over(scene: &Scene, second: &Veloxy) {
    let took = within(
        Duration::from_secs(10),
        "the second replica writes status",
        || status_ip(scene) == "203.0.113.20",
    );
    assert!(lease_holder(scene).ends_with(&format!("_{}", second.proc.pid())));
    eprintln!(
        "(g) status handed over {:.2} s after the holder stopped",
        took.as_secs_f64()
    );
}

/// Bad Ingresses beside the good ones: one the translation refuses (an invalid regex) and
/// one that makes the config fail to compile (`limit-rps: "0"`), each reported by name and
/// left out; then (b) an endpoint change moves traffic within 1 s, without a restart.
fn check_bad_objects_and_endpoint_change(scene: &Scene, v: &Veloxy, web: SocketAddr) {
    let ings = scene.ingresses();
    let port80 = || json!({"number": 80});
    let regex = json!({"nginx.ingress.kubernetes.io/use-regex": "true"});
    let bad =
        json!({"rules": [rule("bad.example", &[("/x(", "ImplementationSpecific", port80())])]});
    scene.k.create(&ings, ingress("bad", "veloxy", regex, bad));
    let zero = json!({"nginx.ingress.kubernetes.io/limit-rps": "0"});
    let broken = json!({"rules": [rule("broken.example", &[("/", "Prefix", port80())])]});
    scene
        .k
        .create(&ings, ingress("broken", "veloxy", zero, broken));
    within(Duration::from_secs(5), "the bad Ingresses reported", || {
        let log = v.proc.log_text();
        log.contains("Ingress shop/bad") && log.contains("ingress=shop/broken")
    });
    // Each is reported as a Warning Event on the Ingress: the refused regex, the Ingress
    // left out.
    let event = |name: &str, reason: &str| {
        let path = format!("/apis/events.k8s.io/v1/namespaces/{NS}/events");
        let (_, list) = scene.k.call("GET", &path, None);
        list["items"].as_array().into_iter().flatten().any(|e| {
            e["regarding"]["kind"] == "Ingress"
                && e["regarding"]["name"] == name
                && e["reason"] == reason
                && e["type"] == "Warning"
        })
    };
    within(
        Duration::from_secs(10),
        "Events for the bad Ingresses",
        || event("bad", "Refused") && event("broken", "Invalid"),
    );
    assert_eq!(
        hit(web, "broken.example", "/").0,
        404,
        "the broken Ingress is left out"
    );
    let pid = v.proc.pid();
    scene.set_endpoints(&BACKENDS[2..]);
    let moved = within(
        Duration::from_secs(5),
        "traffic on the new endpoint",
        || hit(web, "shop.example", "/app/x").1 == "c",
    );
    eprintln!(
        "(b) endpoint change applied in {:.0} ms",
        moved.as_secs_f64() * 1000.0
    );
    assert!(
        moved <= Duration::from_secs(1),
        "endpoint change took {moved:?}"
    );
    assert_eq!(names(web, "shop.example", "/app/x", 10), ["c"]);
    assert_eq!(v.proc.pid(), pid);
    // Only EndpointSlices changed: the new servers applied to the running group, with no
    // translation nor compile. A status write's event (the bad Ingresses') can fall in the
    // same rebuild, which is then a full one: the endpoints flip away and back (4 times at
    // most) until a change is seen alone.
    let untranslated = || {
        v.proc.log_text().lines().any(|l| {
            l.contains("kubernetes: servers changed in place") && l.contains("translated=false")
        })
    };
    for _ in 0..4 {
        if untranslated() {
            break;
        }
        for (addrs, name) in [(&BACKENDS[..1], "a"), (&BACKENDS[2..], "c")] {
            scene.set_endpoints(addrs);
            within(Duration::from_secs(5), "the endpoint flip", || {
                hit(web, "shop.example", "/app/x").1 == name
            });
        }
    }
    within(
        Duration::from_secs(2),
        "the change applied in place without a translation",
        untranslated,
    );
    assert_eq!(
        hit(web, "rw.example", "/api/echo").0,
        200,
        "the others still served"
    );
}

/// A route change (a path added to an Ingress) applies within 1 s; SIGHUP re-reads the file
/// and keeps the Ingress routes.
fn check_route_change_and_sighup(scene: &Scene, v: &Veloxy, web: SocketAddr) {
    let rules = json!({"spec": {"rules": [rule("shop.example", &[
        ("/app", "Prefix", json!({"number": 80})),
        ("/exact", "Exact", json!({"name": "http"})),
        ("/new", "Prefix", json!({"number": 80})),
    ])]}});
    assert_eq!(hit(web, "shop.example", "/new").0, 404);
    scene.k.patch(&format!("{}/shop", scene.ingresses()), rules);
    let added = within(Duration::from_secs(5), "the new path served", || {
        hit(web, "shop.example", "/new").0 == 200
    });
    eprintln!(
        "route change applied in {:.0} ms",
        added.as_secs_f64() * 1000.0
    );
    assert!(
        added <= Duration::from_secs(1),
        "route change took {added:?}"
    );
    reload_with(v, &scene.config("changed"), "reloaded");
    assert_eq!(
        hit(web, "file.example", "/").2,
        "changed\n",
        "the file was re-read"
    );
    assert_eq!(
        hit(web, "shop.example", "/new").0,
        200,
        "the Ingress routes stay"
    );
}

/// The API server restarted: veloxy keeps serving, then picks up a change made after.
fn check_api_server_restart(scene: &Scene, v: &Veloxy, web: SocketAddr) {
    scene.k.stop(Some("kube-apiserver"));
    assert_eq!(
        hit(web, "shop.example", "/app/x").1,
        "c",
        "served while the API is down"
    );
    within(Duration::from_secs(5), "the watch failure logged", || {
        v.proc.log_text().contains("watch failed")
    });
    let t = Instant::now();
    scene.k.up();
    eprintln!("api server restarted in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(hit(web, "shop.example", "/app/x").1, "c");
    scene.set_endpoints(&BACKENDS[..1]);
    let resumed = within(
        Duration::from_secs(40),
        "a change after the restart applied",
        || hit(web, "shop.example", "/app/x").1 == "a",
    );
    eprintln!(
        "change after the restart applied in {:.1} s",
        resumed.as_secs_f64()
    );
}

#[test]
fn ingress_objects_become_routes_and_follow_changes() {
    if !in_netns("ingress_objects_become_routes_and_follow_changes") {
        return;
    }
    let started = Instant::now();
    let scene = Scene::start();
    scene.create_objects();
    let v = scene.veloxy();
    let _dump = DumpLogOnPanic(&v);
    let web = logged_addr(&v, "listener=web ");
    let websecure = logged_addr(&v, "listener=websecure");
    check_paths(web);
    // This API server has no Gateway API CRDs: Ingresses are served, and the log says why
    // Gateway objects are not watched.
    assert!(
        v.proc
            .log_text()
            .contains("serves no Gateway API CRDs: serving Ingresses only"),
        "{}",
        v.proc.log_text()
    );
    // The provider translates at a lower priority than the workers.
    assert_eq!(thread_nice(v.proc.pid(), "kubernetes"), Some(10));
    check_rewrite_and_class(web);
    check_tls(&scene, web, websecure);
    check_basic_auth(web);
    check_status(&scene);
    check_bad_objects_and_endpoint_change(&scene, &v, web);
    check_route_change_and_sighup(&scene, &v, web);
    check_api_server_restart(&scene, &v, web);
    let second = check_one_status_writer(&scene, &v);
    let _dump_second = DumpLogOnPanic(&second);
    // SIGTERM: the private directory of the Secrets' keys goes with the process.
    let private = std::env::temp_dir().join(format!("veloxy-kubernetes-{}", v.proc.pid()));
    assert!(private.is_dir(), "{}", private.display());
    signal(v.proc.pid(), "-TERM");
    within(Duration::from_secs(10), "veloxy stopped", || {
        v.proc.log_text().contains("stopped")
    });
    assert!(!private.exists(), "{} left behind", private.display());
    check_status_handed_over(&scene, &second);
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}

/// The nice value of the thread of `pid` named `name` (`/proc/PID/task/TID/stat`, field 19).
fn thread_nice(pid: u32, name: &str) -> Option<i64> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // Fields after the command's closing parenthesis: state is field 3, nice field 19.
        let rest = &stat[stat.rfind(')')? + 2..];
        return rest.split(' ').nth(16)?.parse().ok();
    }
    None
}

/// The kind's collection on the API server, for the manifests of `deploy/`.
fn collection(kind: &str) -> &'static str {
    match kind {
        "Namespace" => "/api/v1/namespaces",
        "ServiceAccount" => "/api/v1/namespaces/veloxy/serviceaccounts",
        "ConfigMap" => "/api/v1/namespaces/veloxy/configmaps",
        "Service" => "/api/v1/namespaces/veloxy/services",
        "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding" => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "Role" => "/apis/rbac.authorization.k8s.io/v1/namespaces/veloxy/roles",
        "RoleBinding" => "/apis/rbac.authorization.k8s.io/v1/namespaces/veloxy/rolebindings",
        "IngressClass" => "/apis/networking.k8s.io/v1/ingressclasses",
        "GatewayClass" => "/apis/gateway.networking.k8s.io/v1/gatewayclasses",
        "Deployment" => "/apis/apps/v1/namespaces/veloxy/deployments",
        other => panic!("deploy/veloxy.yaml: no collection known for {other}"),
    }
}

/// `deploy/veloxy.yaml` is accepted by a real API server with the Gateway API CRDs, with
/// strict field validation (a dry run, but for the Namespace the others go in), and its
/// embedded config passes check.
#[test]
fn the_deploy_manifests_are_accepted() {
    if !gateway_crds_cached() || !in_netns("the_deploy_manifests_are_accepted") {
        return;
    }
    ip(&["link", "set", "lo", "up"]);
    ip(&["addr", "add", "192.0.2.1/32", "dev", "lo"]);
    let cluster = Cluster::start("192.0.2.1");
    cluster.gateway_crds();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/veloxy.yaml"),
    )
    .unwrap();
    let mut kinds = Vec::new();
    for doc in text.split("\n---\n") {
        let kind = doc
            .lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .expect("a kind")
            .trim();
        let query = if kind == "Namespace" {
            ""
        } else {
            "?dryRun=All&fieldValidation=Strict"
        };
        let (code, answer) = cluster.post_yaml(&format!("{}{query}", collection(kind)), doc);
        assert_eq!(code, 201, "{kind}: {answer}");
        kinds.push(kind.to_owned());
    }
    assert_eq!(kinds.len(), 11, "{kinds:?}");
    // The config the ConfigMap carries is a valid veloxy config.
    let config: String = text
        .split("veloxy.toml: |\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let out = check(&config);
    assert!(
        out.status.success(),
        "{config}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
