//! Differential test of `veloxy import --from haproxy` (issue 33): the real HAProxy runs an
//! original haproxy.cfg, veloxy runs what `veloxy import` made of the same file, both in front
//! of one echo upstream; the same requests go to both and the answers (status, Location,
//! WWW-Authenticate, the fields the config adds, the body) and what the upstream saw (method,
//! target, Host and the other fields) must be the same. The differences the report names
//! (veloxy's X-Forwarded-Proto/-Host, connection management fields, veloxy's own 401 body)
//! are left out of the comparison; everything else is compared.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use veloxy_testkit::*;

/// The original config: `{PORT}` is the frontend's port, `{UP}` the echo upstream.
const CONFIG: &str = r#"
global
    log stdout format raw local0 err

userlist admins
    user alice password $2b$04$ib2xgnKNa/GO841kvWP2KeImaTPs4OrrGCjQLnLCtqVl7JAmLvLY.

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend www
    bind 127.0.0.1:{PORT}
    monitor-uri /haproxy-health
    acl host_api hdr(host),field(1,:) -i api.example.com
    acl is_old path_beg /old/
    acl blocked path_beg /private
    acl is_health path /healthz
    acl admin path_beg /admin
    acl auth_ok http_auth(admins)
    http-request deny if blocked
    http-request return status 200 content-type text/plain string "ok" if is_health
    http-request auth realm Admin if admin !auth_ok
    http-request redirect location /new code 301 if is_old
    http-request redirect prefix https://www.example.com code 302 if { hdr(host),field(1,:) -i example.com }
    http-request set-header X-Real-IP %[src]
    http-request del-header X-Debug
    http-response set-header X-Frame-Options DENY
    use_backend api if host_api
    use_backend legacy if { path_beg /v1/ }
    default_backend app

backend api
    option forwardfor
    http-request set-path %[path,regsub(^/api/,/)] if { path_beg /api/ }
    http-request add-header X-Via haproxy
    server a1 {UP}

backend legacy
    http-request replace-path ^/v1/(.*) /legacy/\1
    server l1 {UP}

backend app
    http-response del-header X-Upstream-Secret
    server w1 {UP}
"#;

/// Kills the HAProxy process when the test ends (also when it fails).
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn render(port: u16, up: SocketAddr) -> String {
    CONFIG
        .replace("{PORT}", &port.to_string())
        .replace("{UP}", &up.to_string())
}

/// Runs `veloxy import` on `conf` in `dir`: the TOML (written there, with its htpasswd
/// files) and the report.
fn import(dir: &Path, conf: &str) -> (String, String) {
    let src = dir.join("haproxy.cfg");
    std::fs::write(&src, conf).unwrap();
    let out_toml = dir.join("veloxy.toml");
    let out = Command::new(VELOXY.path())
        .args(["import", "--from", "haproxy", "-o"])
        .arg(&out_toml)
        .arg(&src)
        .stdin(Stdio::null())
        .output()
        .expect("run veloxy import");
    assert!(
        out.status.success(),
        "import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        std::fs::read_to_string(&out_toml).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// What a request's answer and the upstream's view of it come to, for comparison.
fn outcome(addr: SocketAddr, raw: &str, origin: &ScriptOrigin) -> String {
    let before = origin.hits();
    let r = request(addr, raw);
    if r.status == 401 {
        // veloxy's own 401 (body, charset, the route's response headers) differs as the
        // report says: the status and the realm are compared.
        let realm = r
            .header("www-authenticate")
            .map(|v| v.replace(", charset=\"UTF-8\"", ""));
        return format!(
            "status 401\nrealm {realm:?}\nupstream hit {}",
            origin.hits() > before
        );
    }
    let mut out = format!(
        "status {}\nlocation {:?}\nwww-authenticate {:?}\nx-frame-options {:?}\nx-upstream-secret {:?}\nx-edge {:?}\n",
        r.status,
        r.header("location"),
        r.header("www-authenticate"),
        r.header("x-frame-options"),
        r.header("x-upstream-secret"),
        r.header("x-edge"),
    );
    // Redirect bodies differ (veloxy's carry a short text; the report names it).
    if !(300..400).contains(&r.status) {
        out.push_str(&format!("body {:?}\n", r.body_str()));
    }
    if origin.hits() > before {
        let seen = origin.requests().pop().unwrap();
        out.push_str(&format!("upstream {} {}\n", seen.method, seen.target));
        // HAProxy adds its X-Forwarded-For as a separate field, veloxy appends to the one the
        // client sent: the same list (the report names the difference in form).
        let xff: Vec<&str> = seen
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("x-forwarded-for"))
            .map(|(_, v)| v.as_str())
            .collect();
        let mut headers: Vec<(String, String)> = seen
            .headers
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case("x-forwarded-for"))
            .cloned()
            .collect();
        if !xff.is_empty() {
            headers.push(("x-forwarded-for".into(), xff.join(", ")));
        }
        let mut fields: Vec<String> = headers
            .iter()
            .filter(|(n, _)| {
                let n = n.to_ascii_lowercase();
                // Named in the report (veloxy's X-Forwarded-* where HAProxy sends none) or
                // connection management.
                !(n == "x-forwarded-proto"
                    || n == "x-forwarded-host"
                    || n == "x-forwarded-for" && !seen.target.starts_with("/items")
                    || n == "connection"
                    || n == "content-length" && seen.body.is_empty())
            })
            .map(|(n, v)| format!("{}: {v}", n.to_ascii_lowercase()))
            .collect();
        fields.sort();
        out.push_str(&fields.join("\n"));
    }
    out
}

#[test]
fn haproxy_and_its_import_answer_alike() {
    let bin = "/usr/sbin/haproxy";
    if !Path::new(bin).exists() {
        skip("haproxy is not installed (/usr/sbin/haproxy)");
        return;
    }
    let origin = script_origin(|r| {
        Scripted::ok(format!("{} {}", r.method, r.target)).header("X-Upstream-Secret", "s3")
    });
    let dir = tempfile::tempdir().unwrap();
    let (hp, vp) = (free_port(), free_port());
    let hconf = dir.path().join("haproxy-run.cfg");
    std::fs::write(&hconf, render(hp, origin.addr)).unwrap();
    let haproxy = Peer(
        Command::new(bin)
            .args(["-db", "-f"])
            .arg(&hconf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy"),
    );
    let haddr: SocketAddr = format!("127.0.0.1:{hp}").parse().unwrap();
    let up = eventually(Duration::from_secs(10), || listening(haddr));
    assert!(up, "haproxy did not start");

    let (toml, report) = import(dir.path(), &render(vp, origin.addr));
    assert!(!report.contains("refused:"), "{report}");
    let v = veloxy_with(
        {
            let mut c = Command::new(VELOXY.path());
            c.current_dir(dir.path());
            c
        },
        &toml.replace(
            "users_file = \"",
            &format!("users_file = \"{}/", dir.path().display()),
        ),
        &[],
    );
    let vaddr: SocketAddr = format!("127.0.0.1:{vp}").parse().unwrap();
    assert!(eventually(Duration::from_secs(10), || { listening(vaddr) }));

    let alice = basic_credentials("alice", "secret");
    let requests: Vec<String> = [
        ("GET", "app.example.net", "/", ""),
        ("GET", "app.example.net", "/page?a=1&b=2", "X-Custom: yes\r\nX-Debug: 1\r\n"),
        ("POST", "app.example.net", "/form", "Content-Type: text/plain\r\n"),
        ("GET", "api.example.com", "/api/items?q=1", ""),
        ("GET", "api.example.com", "/items", "X-Forwarded-For: 6.6.6.6\r\n"),
        ("GET", "app.example.net", "/v1/users/7?x=1", ""),
        ("GET", "app.example.net", "/healthz", ""),
        ("GET", "app.example.net", "/haproxy-health", ""),
        ("GET", "app.example.net", "/private/x", ""),
        ("GET", "app.example.net", "/old/page?x=1", ""),
        ("GET", "example.com", "/some/where?y=2", ""),
        ("GET", "app.example.net", "/admin/panel", ""),
        ("GET", "app.example.net", "/admin/panel", &format!("Authorization: {alice}\r\n")),
        ("GET", "app.example.net", "/admin/panel", "Authorization: Basic YWxpY2U6d3Jvbmc=\r\n"),
        ("DELETE", "api.example.com", "/api/thing", "Authorization: Bearer t\r\n"),
    ]
    .iter()
    .map(|(m, h, p, extra)| {
        let body = if *m == "POST" { "hello" } else { "" };
        format!(
            "{m} {p} HTTP/1.1\r\nHost: {h}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    })
    .collect();
    let mut differences = Vec::new();
    for raw in &requests {
        let h = outcome(haddr, raw, &origin);
        let x = outcome(vaddr, raw, &origin);
        if h != x {
            differences.push(format!(
                "{}\n--- haproxy\n{h}\n--- veloxy\n{x}\n",
                raw.lines().next().unwrap()
            ));
        }
    }
    drop(haproxy);
    drop(v);
    assert!(
        differences.is_empty(),
        "{} of {} requests differ:\n{}\nconfig:\n{toml}\nreport:\n{report}",
        differences.len(),
        requests.len(),
        differences.join("\n")
    );
}

/// The shapes the survey of public configs found most: a plain-HTTP frontend that only sends
/// clients to HTTPS (with an `http-after-response` header on that redirect), and a Host ACL
/// naming the frontend's port. `{PORT}`/`{PORT2}` are the frontends' ports, `{UP}` the upstream.
const SHAPES: &str = r#"
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend http-in
    bind 127.0.0.1:{PORT}
    redirect scheme https code 301 if !{ ssl_fc }
    http-after-response set-header X-Edge front-1

frontend app
    bind 127.0.0.1:{PORT2}
    acl h_login hdr(host) -i login.example.com:{PORT2}
    http-after-response set-header X-Edge front-2
    use_backend login if h_login
    default_backend web

backend login
    http-request set-header X-Backend login
    server l1 {UP}

backend web
    server w1 {UP}
"#;

#[test]
fn redirect_only_frontend_and_host_ports_answer_alike() {
    let bin = "/usr/sbin/haproxy";
    if !Path::new(bin).exists() {
        skip("haproxy is not installed (/usr/sbin/haproxy)");
        return;
    }
    let origin = script_origin(|r| Scripted::ok(format!("{} {}", r.method, r.target)));
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let render = |a: u16, b: u16| {
        SHAPES
            .replace("{PORT2}", &b.to_string())
            .replace("{PORT}", &a.to_string())
            .replace("{UP}", &origin.addr.to_string())
    };
    let hconf = dir.path().join("haproxy-run.cfg");
    std::fs::write(&hconf, render(ports[0], ports[1])).unwrap();
    let haproxy = Peer(
        Command::new(bin)
            .args(["-db", "-f"])
            .arg(&hconf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy"),
    );
    let addr = |p: u16| -> SocketAddr { format!("127.0.0.1:{p}").parse().unwrap() };
    let up = |a: SocketAddr| eventually(Duration::from_secs(10), || listening(a));
    assert!(
        up(addr(ports[0])) && up(addr(ports[1])),
        "haproxy did not start"
    );
    let (toml, report) = import(dir.path(), &render(ports[2], ports[3]));
    assert!(!report.contains("refused:"), "{report}");
    let v = veloxy_with(Command::new(VELOXY.path()), &toml, &[]);
    assert!(
        up(addr(ports[2])) && up(addr(ports[3])),
        "veloxy did not start"
    );

    let mut differences = Vec::new();
    let mut count = 0;
    for (front, host, path) in [
        (0, "www.example.com", "/"),
        (0, "www.example.com", "/a/b?x=1"),
        (1, "login.example.com:{P}", "/signin?next=/"),
        (1, "www.example.com:{P}", "/page"),
    ] {
        let (h, x) = (ports[front], ports[front + 2]);
        let raw = |p: u16| {
            format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                host.replace("{P}", &p.to_string())
            )
        };
        count += 1;
        let ho = outcome(addr(h), &raw(h), &origin);
        let vo = outcome(addr(x), &raw(x), &origin);
        // The Host carries each peer's own port: compare without it.
        let (ho, vo) = (
            ho.replace(&h.to_string(), "P"),
            vo.replace(&x.to_string(), "P"),
        );
        if ho != vo {
            differences.push(format!(
                "{}\n--- haproxy\n{ho}\n--- veloxy\n{vo}\n",
                raw(h).lines().next().unwrap()
            ));
        }
    }
    drop(haproxy);
    drop(v);
    assert!(
        differences.is_empty(),
        "{} of {count} requests differ:\n{}\nconfig:\n{toml}\nreport:\n{report}",
        differences.len(),
        differences.join("\n")
    );
}

/// The stick-table rate-limit idiom (per client address and per API key) and HAProxy's object
/// cache. `{P1}`..`{P3}` are the frontends' ports, `{UP}` the upstream.
const LIMITS: &str = r#"
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

cache pages
    total-max-size 16
    max-age 60

frontend limited
    bind 127.0.0.1:{P1}
    stick-table type ip size 100k expire 30s store http_req_rate(10s)
    http-request track-sc0 src
    http-request deny deny_status 429 if { sc_http_req_rate(0) gt 5 }
    default_backend app

frontend keyed
    bind 127.0.0.1:{P2}
    tcp-request content track-sc1 req.hdr(x-api-key) table api_keys
    http-request deny deny_status 429 if { sc1_http_req_rate gt 3 }
    default_backend app

frontend cached
    bind 127.0.0.1:{P3}
    http-request cache-use pages
    http-response cache-store pages
    default_backend app

backend api_keys
    stick-table type string len 64 size 10k expire 2m store http_req_rate(1m)

backend app
    server w1 {UP}
"#;

#[test]
fn rate_limits_and_cache_answer_alike() {
    let bin = "/usr/sbin/haproxy";
    if !Path::new(bin).exists() {
        skip("haproxy is not installed (/usr/sbin/haproxy)");
        return;
    }
    // /c states a lifetime; /n states none and carries no validator.
    let origin = script_origin(|r| {
        let s = Scripted::ok(format!("{} {}", r.method, r.target));
        if r.target.starts_with("/c") {
            s.header("Cache-Control", "max-age=60")
        } else {
            s
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
    let render = |p: &[u16]| {
        LIMITS
            .replace("{P1}", &p[0].to_string())
            .replace("{P2}", &p[1].to_string())
            .replace("{P3}", &p[2].to_string())
            .replace("{UP}", &origin.addr.to_string())
    };
    let hconf = dir.path().join("haproxy-run.cfg");
    std::fs::write(&hconf, render(&ports[..3])).unwrap();
    let haproxy = Peer(
        Command::new(bin)
            .args(["-db", "-f"])
            .arg(&hconf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy"),
    );
    let addr = |p: u16| -> SocketAddr { format!("127.0.0.1:{p}").parse().unwrap() };
    let up = |ps: &[u16]| {
        ps.iter()
            .all(|p| eventually(Duration::from_secs(10), || listening(addr(*p))))
    };
    assert!(up(&ports[..3]), "haproxy did not start");
    let (toml, report) = import(dir.path(), &render(&ports[3..]));
    assert!(!report.contains("refused:"), "{report}");
    let v = veloxy_with(Command::new(VELOXY.path()), &toml, &[]);
    assert!(up(&ports[3..]), "veloxy did not start");

    let get = |port: u16, path: &str, extra: &str| {
        let r = request(
            addr(port),
            &format!(
                "GET {path} HTTP/1.1\r\nHost: app.example.com\r\n{extra}Connection: close\r\n\r\n"
            ),
        );
        (
            r.status,
            r.header("x-cache").map(str::to_string),
            r.body_str().to_string(),
        )
    };
    // Statuses of a quick sequence (veloxy's 429 body differs, as the report says).
    let statuses = |port: u16, n: usize, extra: &str| -> Vec<u16> {
        (0..n).map(|_| get(port, "/r", extra).0).collect()
    };
    let mut differences = Vec::new();
    let mut compare = |what: &str, h: String, x: String| {
        if h != x {
            differences.push(format!("{what}\n--- haproxy\n{h}\n--- veloxy\n{x}\n"));
        }
    };
    // Per client address: 5 in the window, then 429.
    let (h, x) = (statuses(ports[0], 8, ""), statuses(ports[3], 8, ""));
    assert_eq!(
        h,
        [200, 200, 200, 200, 200, 429, 429, 429],
        "haproxy's own count"
    );
    compare(
        "8 requests from one address",
        format!("{h:?}"),
        format!("{x:?}"),
    );
    // Per API key: 3 per key, each key its own count.
    for key in ["X-Api-Key: k1\r\n", "X-Api-Key: k2\r\n"] {
        let (h, x) = (statuses(ports[1], 5, key), statuses(ports[4], 5, key));
        compare(key.trim(), format!("{h:?}"), format!("{x:?}"));
    }
    // The named difference: HAProxy tracks no request without the key (no limit); veloxy's
    // header-less requests share one bucket.
    let (h, x) = (statuses(ports[1], 5, ""), statuses(ports[4], 5, ""));
    assert_eq!(h, [200; 5]);
    assert_eq!(
        x,
        [200, 200, 200, 429, 429],
        "the report names this difference"
    );
    // The cache: an answer stating a lifetime is fetched once, with no cache status field.
    for (hp, xp) in [(ports[2], ports[5])] {
        let mut seen = Vec::new();
        for port in [hp, xp] {
            let before = origin.hits();
            let a = get(port, "/c/page", "");
            let b = get(port, "/c/page", "");
            seen.push(format!(
                "{a:?}\n{b:?}\nupstream hits {}",
                origin.hits() - before
            ));
        }
        compare("GET /c/page twice", seen[0].clone(), seen[1].clone());
        // The named difference: an answer with no lifetime and no validator is not stored by
        // HAProxy; veloxy stores it for default_ttl (the cache's max-age).
        let mut hits = Vec::new();
        for port in [hp, xp] {
            let before = origin.hits();
            get(port, "/n/page", "");
            get(port, "/n/page", "");
            hits.push(origin.hits() - before);
        }
        assert_eq!(hits, [2, 1], "the report names this difference");
    }
    drop(haproxy);
    drop(v);
    assert!(
        differences.is_empty(),
        "{} sequences differ:\n{}\nconfig:\n{toml}\nreport:\n{report}",
        differences.len(),
        differences.join("\n")
    );
}
