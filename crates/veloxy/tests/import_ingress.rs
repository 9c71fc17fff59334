//! End-to-end test of `veloxy import --from ingress` (issue 33).
//!
//! Not a peer comparison: ingress-nginx is nginx plus OpenResty's Lua modules plus the
//! controller that renders its template from the Kubernetes API, and none of it can run here
//! (no cluster, no OpenResty). So this test checks veloxy, running what `veloxy import` made
//! of realistic Ingress YAML, against the behaviour ingress-nginx documents and its template
//! and Lua code implement: the 308 of ssl-redirect, rewrite-target with captures on a
//! case-insensitive regex, Prefix paths element-wise, the 1m-style body limit (413),
//! basic auth (401, then 200 without Authorization upstream), allowlists (403),
//! canary-by-header, the CORS preflight with ingress-nginx's default fields, the affinity
//! cookie, and the fields ingress-nginx sets on every proxied request (X-Real-IP,
//! X-Forwarded-For replaced by the client address, X-Original-Forwarded-For, X-Scheme,
//! X-Forwarded-Port, X-Request-ID, no Proxy field).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use veloxy_testkit::*;

/// bcrypt (cost 4) of "secret".
const ALICE: &str = "$2b$04$Oq2MwvQZc5Mr8mbGSSD2buBt/GCGoJey0ZySMBys6SvEvQxpbRHz6";

/// The objects: `{CRT}` / `{KEY}` are the TLS pair (base64), `{AUTH}` the htpasswd (base64).
const YAML: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: web
spec:
  ingressClassName: nginx
  tls:
    - hosts: [shop.example.com]
      secretName: shop-tls
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: app, port: {number: 80}}
---
apiVersion: v1
kind: Secret
metadata: {name: shop-tls, namespace: web}
type: kubernetes.io/tls
data:
  tls.crt: {CRT}
  tls.key: {KEY}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: api
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/use-regex: "true"
    nginx.ingress.kubernetes.io/rewrite-target: /$2
    nginx.ingress.kubernetes.io/proxy-body-size: 1k
    nginx.ingress.kubernetes.io/enable-cors: "true"
spec:
  ingressClassName: nginx
  rules:
    - host: api.example.com
      http:
        paths:
          - path: /users(/|$)(.*)
            pathType: ImplementationSpecific
            backend:
              service: {name: app, port: {number: 80}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: docs
  namespace: web
spec:
  ingressClassName: nginx
  rules:
    - host: docs.example.com
      http:
        paths:
          - path: /guide
            pathType: Prefix
            backend:
              service: {name: app, port: {number: 80}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: admin
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/auth-type: basic
    nginx.ingress.kubernetes.io/auth-secret: admin-users
    nginx.ingress.kubernetes.io/auth-realm: Admins
spec:
  ingressClassName: nginx
  rules:
    - host: admin.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: app, port: {number: 80}}
---
apiVersion: v1
kind: Secret
metadata: {name: admin-users, namespace: web}
type: Opaque
data:
  auth: {AUTH}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: internal
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/whitelist-source-range: 10.0.0.0/8
spec:
  ingressClassName: nginx
  rules:
    - host: internal.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: app, port: {number: 80}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: checkout
  namespace: web
spec:
  ingressClassName: nginx
  rules:
    - host: checkout.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: app, port: {number: 80}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: checkout-canary
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/canary: "true"
    nginx.ingress.kubernetes.io/canary-by-header: X-Canary
spec:
  ingressClassName: nginx
  rules:
    - host: checkout.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: next, port: {number: 80}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: legacy
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/affinity: cookie
    nginx.ingress.kubernetes.io/session-cookie-name: route
spec:
  ingressClassName: nginx
  rules:
    - host: legacy.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: pool, port: {number: 80}}
"#;

/// Imports `yaml` into `dir` (the TOML, its generated files), the listeners moved to
/// `http` / `https` on 127.0.0.1; returns the config path and the report.
fn import(dir: &Path, yaml: &str, services: &[String], http: u16, https: u16) -> (String, String) {
    let src = dir.join("ingress.yaml");
    std::fs::write(&src, yaml).unwrap();
    let out = dir.join("veloxy.toml");
    let mut cmd = Command::new(VELOXY.path());
    cmd.args(["import", "--from", "ingress", "-o"])
        .arg(&out)
        .arg(&src);
    for s in services {
        cmd.args(["--service", s]);
    }
    let run = cmd
        .stdin(Stdio::null())
        .output()
        .expect("run veloxy import");
    let report = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "import failed: {report}");
    let toml = std::fs::read_to_string(&out)
        .unwrap()
        .replace("addr = \":80\"", &format!("addr = \"127.0.0.1:{http}\""))
        .replace("addr = \":443\"", &format!("addr = \"127.0.0.1:{https}\""));
    let toml = format!(
        "[server]\nworkers = 1\n{}",
        toml.replacen("[server]\n", "", 1)
    );
    std::fs::write(&out, &toml).unwrap();
    (toml, report)
}

fn get(addr: SocketAddr, host: &str, target: &str, extra: &str) -> client::Response {
    request(
        addr,
        &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
    )
}

#[test]
fn ingress_nginx_semantics_hold_after_import() {
    // Two origins: "app" (every Service but the canary and the pool's second member) and
    // "next"; each answers with its name, the target and the fields it saw.
    let echo = |name: &'static str| {
        move |r: &SeenRequest| {
            let fields: Vec<String> = r.headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
            Scripted::ok(format!(
                "{name} {} {}\n{}\n",
                r.method,
                r.target,
                fields.join("\n")
            ))
        }
    };
    let app = script_origin(echo("app"));
    let next = script_origin(echo("next"));
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (crt, key) = pki.leaf("shop", &["shop.example.com"], KeyKind::Ecdsa);
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let yaml = YAML
        .replace("{CRT}", &b64(&std::fs::read(crt).unwrap()))
        .replace("{KEY}", &b64(&std::fs::read(key).unwrap()))
        .replace("{AUTH}", &b64(format!("alice:{ALICE}\n").as_bytes()));
    let services = [
        format!("app.web:80={}", app.addr),
        format!("next.web:80={}", next.addr),
        format!("pool.web:80={},{}", app.addr, next.addr),
    ];
    let (hp, sp) = (free_port(), free_port());
    let (toml, report) = import(dir.path(), &yaml, &services, hp, sp);
    let config = dir.path().join("veloxy.toml");
    let run_dir = tempfile::tempdir().unwrap();
    let v = veloxy_cmd(
        Command::new(VELOXY.path()),
        &["run", "--config", config.to_str().unwrap()],
        run_dir,
    );
    let h: SocketAddr = format!("127.0.0.1:{hp}").parse().unwrap();
    assert!(eventually(Duration::from_secs(10), || { listening(h) }));
    let ctx = format!("config:\n{toml}\nreport:\n{report}");

    // ssl-redirect: a host with a certificate answers plain HTTP with 308 to https.
    let r = get(h, "shop.example.com", "/cart?id=7", "");
    assert_eq!(r.status, 308, "{ctx}");
    assert_eq!(
        r.header("location"),
        Some("https://shop.example.com/cart?id=7")
    );

    // The fields ingress-nginx sets upstream; X-Forwarded-For is replaced, not appended.
    let r = get(
        h,
        "docs.example.com",
        "/guide/intro",
        "X-Forwarded-For: 6.6.6.6\r\nProxy: http://evil\r\n",
    );
    assert_eq!(r.status, 200, "{ctx}");
    let seen = app.requests().pop().unwrap();
    assert_eq!(seen.target, "/guide/intro");
    assert_eq!(seen.header("host"), Some("docs.example.com"));
    assert_eq!(seen.header("x-real-ip"), Some("127.0.0.1"));
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(seen.header("x-original-forwarded-for"), Some("6.6.6.6"));
    assert_eq!(seen.header("x-scheme"), Some("http"));
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    assert_eq!(
        seen.header("x-forwarded-port"),
        Some(hp.to_string().as_str())
    );
    assert!(seen.header("x-request-id").is_some_and(|id| id.len() == 32));
    assert_eq!(seen.header("proxy"), None);

    // Prefix is element-wise: /guide and /guide/... match, /guidebook does not.
    assert_eq!(get(h, "docs.example.com", "/guide", "").status, 200);
    assert_eq!(get(h, "docs.example.com", "/guidebook", "").status, 404);

    // rewrite-target /$2 on the case-insensitive regex ^/users(/|$)(.*), query kept.
    for (target, upstream) in [
        ("/users/42/orders?x=1", "/42/orders?x=1"),
        ("/USERS/7", "/7"),
        ("/users", "/"),
    ] {
        let r = get(h, "api.example.com", target, "");
        assert_eq!(r.status, 200, "{target}: {ctx}");
        assert_eq!(app.requests().pop().unwrap().target, upstream, "{target}");
    }
    assert_eq!(get(h, "api.example.com", "/usersx", "").status, 404);

    // proxy-body-size 1k: a larger declared body is 413 before anything is forwarded.
    let hits = app.hits();
    let big = "x".repeat(2048);
    let r = request(
        h,
        &format!(
            "POST /users/1 HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{big}",
            big.len()
        ),
    );
    assert_eq!(r.status, 413);
    assert_eq!(app.hits(), hits);

    // enable-cors with ingress-nginx's defaults: the preflight is 204 with its fields.
    let r = request(
        h,
        "OPTIONS /users/1 HTTP/1.1\r\nHost: api.example.com\r\nOrigin: https://web.example\r\n\
         Access-Control-Request-Method: PUT\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 204, "{ctx}");
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, PUT, POST, DELETE, PATCH, OPTIONS")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("DNT, Keep-Alive, User-Agent, X-Requested-With, If-Modified-Since, Cache-Control, Content-Type, Range, Authorization")
    );
    assert_eq!(r.header("access-control-max-age"), Some("1728000"));
    let r = get(
        h,
        "api.example.com",
        "/users/1",
        "Origin: https://web.example\r\n",
    );
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));

    // Basic auth: 401 with the realm, 200 with the credentials, which stay at the edge.
    let r = get(h, "admin.example.com", "/", "");
    assert_eq!(r.status, 401);
    assert!(r
        .header("www-authenticate")
        .is_some_and(|w| w.contains("Admins")));
    let creds = basic_credentials("alice", "secret");
    let r = get(
        h,
        "admin.example.com",
        "/",
        &format!("Authorization: {creds}\r\n"),
    );
    assert_eq!(r.status, 200, "{ctx}");
    assert_eq!(app.requests().pop().unwrap().header("authorization"), None);

    // whitelist-source-range 10.0.0.0/8: 127.0.0.1 is refused.
    assert_eq!(get(h, "internal.example.com", "/", "").status, 403);

    // canary-by-header: "always" goes to the canary, anything else to the main Service.
    assert!(get(h, "checkout.example.com", "/", "X-Canary: always\r\n")
        .body_str()
        .starts_with("next "));
    assert!(get(h, "checkout.example.com", "/", "X-Canary: no\r\n")
        .body_str()
        .starts_with("app "));
    assert!(get(h, "checkout.example.com", "/", "")
        .body_str()
        .starts_with("app "));

    // affinity: cookie: the first answer sets `route`; with it, every request stays put.
    let r = get(h, "legacy.example.com", "/", "");
    let cookie = r
        .header("set-cookie")
        .expect("an affinity cookie")
        .to_string();
    assert!(cookie.starts_with("route="), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    let first = r.body_str().split(' ').next().unwrap().to_string();
    for _ in 0..6 {
        let r = get(h, "legacy.example.com", "/", &format!("Cookie: {pair}\r\n"));
        assert_eq!(r.body_str().split(' ').next().unwrap(), first);
    }
    drop(v);
}

/// Ingresses whose Secrets live in the cluster, not in the YAML at hand, and a host left as
/// the docs' placeholder.
const CLUSTER_YAML: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/auth-type: basic
    nginx.ingress.kubernetes.io/auth-secret: shop-users
    nginx.ingress.kubernetes.io/auth-realm: Shop
spec:
  ingressClassName: nginx
  tls:
    - hosts: [shop.example.com]
      secretName: shop-tls
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: app, port: {number: 80}}
    - host: registry.<your domain>
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: app, port: {number: 80}}
"#;

/// A stand-in for `kubectl get secret -n NS NAME -o jsonpath='{.data.KEY}'`: prints the
/// base64 text stored as `$STASH/NS-NAME-KEY`.
const FAKE_KUBECTL: &str = r#"#!/bin/sh
[ "$1 $2 $3" = "get secret -n" ] && [ "$6" = "-o" ] || { echo "unexpected: $*" >&2; exit 2; }
key=${7#"jsonpath={.data."}
key=$(printf '%s' "${key%\}}" | sed 's/\\\././g')
cat "$STASH/$4-$5-$key"
"#;

#[test]
fn secrets_missing_from_the_input_are_fetched_by_the_commands_the_report_gives() {
    let app = script_origin(|r: &SeenRequest| {
        let auth = r.header("authorization").unwrap_or("-").to_string();
        Scripted::ok(format!("app {} {auth}\n", r.target))
    });
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (crt, key) = pki.leaf("shop", &["shop.example.com"], KeyKind::Ecdsa);
    let (hp, sp) = (free_port(), free_port());
    let services = [format!("app.web:80={}", app.addr)];
    let (toml, report) = import(dir.path(), CLUSTER_YAML, &services, hp, sp);
    let ctx = format!("config:\n{toml}\nreport:\n{report}");
    assert!(!toml.contains("your domain"), "{ctx}");
    assert!(
        report.contains("refused: not a DNS name: \"registry.<your domain>\""),
        "{ctx}"
    );
    assert!(toml.contains("secrets/web-shop-tls.crt"), "{ctx}");
    assert!(toml.contains("htpasswd/web-shop-users"), "{ctx}");

    // Until the files are written, `veloxy check` names the missing one.
    let config = dir.path().join("veloxy.toml");
    let check = || {
        Command::new(VELOXY.path())
            .args(["check", "--config", config.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = check();
    assert!(!out.status.success(), "{ctx}");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("secrets/web-shop-tls.crt"), "{said}");

    // The commands of the report, run beside the output with a kubectl that has the Secrets.
    let stash = dir.path().join("stash");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&stash).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    std::fs::write(
        stash.join("web-shop-tls-tls.crt"),
        b64(&std::fs::read(crt).unwrap()),
    )
    .unwrap();
    std::fs::write(
        stash.join("web-shop-tls-tls.key"),
        b64(&std::fs::read(key).unwrap()),
    )
    .unwrap();
    std::fs::write(
        stash.join("web-shop-users-auth"),
        b64(format!("alice:{ALICE}\n").as_bytes()),
    )
    .unwrap();
    let kubectl = bin.join("kubectl");
    std::fs::write(&kubectl, FAKE_KUBECTL).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(dir.path().join("secrets")).unwrap();
    std::fs::create_dir_all(dir.path().join("htpasswd")).unwrap();
    let mut ran = 0;
    for line in report.lines().filter(|l| l.contains("is not in the input")) {
        let start = line.find("(kubectl ").expect("a kubectl command") + 1;
        let end = start + line[start..].find(')').unwrap();
        for cmd in line[start..end].split("; ") {
            let path = format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            let st = Command::new("sh")
                .args(["-c", cmd])
                .current_dir(dir.path())
                .env("PATH", path)
                .env("STASH", &stash)
                .status()
                .unwrap();
            assert!(st.success(), "{cmd}");
            ran += 1;
        }
    }
    assert_eq!(ran, 3, "{ctx}");
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Then veloxy serves the host with its certificate (plain HTTP redirects) behind the
    // users of the Secret.
    let run_dir = tempfile::tempdir().unwrap();
    let v = veloxy_cmd(
        Command::new(VELOXY.path()),
        &["run", "--config", config.to_str().unwrap()],
        run_dir,
    );
    let h: SocketAddr = format!("127.0.0.1:{hp}").parse().unwrap();
    assert!(eventually(Duration::from_secs(10), || { listening(h) }));
    let r = get(h, "shop.example.com", "/cart", "");
    assert_eq!(r.status, 308, "{ctx}");
    assert_eq!(r.header("location"), Some("https://shop.example.com/cart"));
    let s: SocketAddr = format!("127.0.0.1:{sp}").parse().unwrap();
    assert!(eventually(Duration::from_secs(10), || { listening(s) }));
    let creds = basic_credentials("alice", "secret");
    let tls = |extra: &str| {
        let client = default_client(&pki.ca_pem, &[b"http/1.1"]);
        let (mut stream, _) = tls_connect(s, "shop.example.com", client).unwrap();
        let req = format!(
            "GET /cart HTTP/1.1\r\nHost: shop.example.com\r\n{extra}Connection: close\r\n\r\n"
        );
        std::io::Write::write_all(&mut stream, req.as_bytes()).unwrap();
        read_to_close(&mut stream)
    };
    assert_eq!(tls("").0, 401, "{ctx}");
    let (status, raw) = tls(&format!("Authorization: {creds}\r\n"));
    assert_eq!(status, 200, "{ctx}");
    assert!(raw.ends_with("app /cart -\n"), "{raw}");
    drop(v);
}
