//! Differential test of `veloxy import --from traefik` (issue 33): the real Traefik runs the
//! original static and dynamic files, then veloxy runs what `veloxy import` made of the same
//! files, on the same ports and in front of the same scripted upstreams; the same requests go
//! to both and every answer (status, Location, the fields the config touches, the body) and
//! every request the upstreams saw (method, target, Host, each field) are compared. Each
//! difference must be one the import report names ("translated with a difference"); the
//! full comparison is printed.
//!
//! Traefik is not in Debian: the test takes `VELOXY_TRAEFIK_BIN`, else
//! `~/.cache/veloxy/bin/traefik` (built by the bench harness), else `traefik` on PATH, and is
//! reported skipped when there is none.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use veloxy_testkit::*;

/// `test` / `secret`, an `$apr1$` hash both tools verify (`openssl passwd -apr1`).
const USER: &str = "test:$apr1$H6uskkkW$NNBs2U5LAblMB3OM9KekS/";

fn traefik_bin() -> Option<PathBuf> {
    veloxy_testkit::peer_binary("VELOXY_TRAEFIK_BIN", "traefik", "version")
}

/// One request of the comparison.
struct Req {
    what: &'static str,
    port: &'static str,
    raw: String,
}

fn req(
    what: &'static str,
    port: &'static str,
    method: &str,
    host: &str,
    target: &str,
    extra: &str,
    body: &str,
) -> Req {
    let len = if body.is_empty() && method != "POST" {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    Req {
        what,
        port,
        raw: format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}{len}Connection: close\r\n\r\n{body}"),
    }
}

fn requests() -> Vec<Req> {
    let auth = format!("Authorization: {}\r\n", basic_credentials("test", "secret"));
    let wrong = format!("Authorization: {}\r\n", basic_credentials("test", "nope"));
    vec![
        req("plain host", "PLAIN", "GET", "app.test", "/page?q=1", "X-Forwarded-For: 1.2.3.4\r\nX-Real-Ip: 6.6.6.6\r\n", ""),
        req("other listener", "SECURE", "GET", "app.test", "/x", "", ""),
        req("strip prefix", "PLAIN", "GET", "app.test", "/api/users?id=7", "X-Remove-Me: 1\r\n", ""),
        req("strip prefix root", "PLAIN", "GET", "app.test", "/api", "", ""),
        req("method route", "PLAIN", "DELETE", "app.test", "/item/3", "", ""),
        req("post", "PLAIN", "POST", "app.test", "/form", "Content-Type: text/plain\r\n", "hello"),
        req("redirect regex", "PLAIN", "GET", "www.app.test", "/a/b?c=d", "", ""),
        req("entry point redirect GET", "WEB", "GET", "app.test", "/login?next=/", "", ""),
        req("entry point redirect POST", "WEB", "POST", "app.test", "/login", "", "x=1"),
        req("scheme redirect", "PLAIN", "GET", "tls.test", "/s?x=1", "", ""),
        req("scheme redirect POST", "PLAIN", "POST", "tls.test", "/s", "", "x=1"),
        req("redirect regex POST", "PLAIN", "POST", "www.app.test", "/a", "", "x=1"),
        req("forward auth refused", "PLAIN", "GET", "guard.test", "/doc?id=1", "Cookie: s=1\r\n", ""),
        req("forward auth passed", "PLAIN", "GET", "guard.test", "/doc?id=2", "Authorization: Bearer ok\r\nX-User: forged\r\n", ""),
        req("forward auth by custom field", "PLAIN", "GET", "guard.test", "/doc?id=3", "X-Token: ok\r\n", ""),
        req("compress", "PLAIN", "GET", "zip.test", "/big", "Accept-Encoding: gzip\r\n", ""),
        req("compress small", "PLAIN", "GET", "zip.test", "/mid", "Accept-Encoding: gzip\r\n", ""),
        req("auth missing", "PLAIN", "GET", "admin.test", "/", "", ""),
        req("auth wrong", "PLAIN", "GET", "admin.test", "/", &wrong, ""),
        req("auth ok", "PLAIN", "GET", "admin.test", "/panel", &auth, ""),
        req("cors preflight", "PLAIN", "OPTIONS", "cors.test", "/r", "Origin: https://ui.test\r\nAccess-Control-Request-Method: PUT\r\n", ""),
        req("cors simple", "PLAIN", "GET", "cors.test", "/r", "Origin: https://ui.test\r\n", ""),
        req("cors other origin", "PLAIN", "GET", "cors.test", "/r", "Origin: https://evil.test\r\n", ""),
        req("security headers", "PLAIN", "GET", "sec.test", "/", "", ""),
        req("replace path regex", "PLAIN", "GET", "rw.test", "/old/p?k=v", "", ""),
        req("regex not matching", "PLAIN", "GET", "rw.test", "/older", "", ""),
        req("add prefix", "PLAIN", "GET", "add.test", "/items?x=1", "", ""),
        req("replace path", "PLAIN", "GET", "add.test", "/healthz", "", ""),
        req("body under limit", "PLAIN", "POST", "big.test", "/up", "", &"a".repeat(100)),
        req("body over limit", "PLAIN", "POST", "big.test", "/up", "", &"a".repeat(2000)),
        req("ip not allowed", "PLAIN", "GET", "deny.test", "/", "", ""),
        req("websocket", "PLAIN", "GET", "ws.test", "/socket", "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n", ""),
        req("pass host header off", "PLAIN", "GET", "nohost.test", "/", "", ""),
        req("unknown host", "PLAIN", "GET", "nothing.test", "/", "", ""),
    ]
}

/// A forwardAuth service: 200 with `X-User: alice` for `Authorization: Bearer ok` (or a
/// custom `X-Token: ok`), else 401 with a
/// challenge and a body.
fn auth_service() -> ScriptOrigin {
    script_origin(|r: &SeenRequest| {
        if r.header("authorization") == Some("Bearer ok") || r.header("x-token") == Some("ok") {
            Scripted::ok("").header("X-User", "alice")
        } else {
            Scripted::new(401)
                .header("WWW-Authenticate", "Bearer realm=\"sso\"")
                .with_body("login first\n")
        }
    })
}

/// The origin's answer: an echo of what it saw, plus fields the config acts on.
fn origin(name: &'static str) -> ScriptOrigin {
    script_origin(move |r: &SeenRequest| {
        if r.header("upgrade").is_some() {
            return Scripted::new(101)
                .header("Upgrade", "websocket")
                .header("Connection", "Upgrade")
                .header("Sec-WebSocket-Accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        }
        let mut body = format!("{name} {} {}\n", r.method, r.target);
        for (k, v) in &r.headers {
            body.push_str(&format!("{k}: {v}\n"));
        }
        // Bodies to compress: /big passes both tools' thresholds, /mid only veloxy's.
        let pad: usize = match r.path() {
            "/big" => 3000,
            "/mid" => 600,
            _ => 0,
        };
        body.push_str(&"z".repeat(pad.saturating_sub(body.len())));
        Scripted::ok(body)
            .header("Content-Type", "text/plain")
            .header("X-Powered-By", "origin")
            .header("Server", "origin")
    })
}

/// What one side did with one request.
#[derive(Debug, Default)]
struct Seen {
    status: u16,
    fields: BTreeMap<String, String>,
    body: String,
    /// What the upstream received: method, target and fields (none when it got nothing).
    upstream: Option<BTreeMap<String, String>>,
    /// What the forwardAuth service received.
    auth: Option<BTreeMap<String, String>>,
}

/// Response fields the configs touch.
const FIELDS: &[&str] = &[
    "location",
    "www-authenticate",
    "access-control-allow-origin",
    "access-control-allow-methods",
    "access-control-allow-headers",
    "access-control-allow-credentials",
    "access-control-max-age",
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
    "x-powered-by",
    "cache-control",
    "content-encoding",
    "upgrade",
    "sec-websocket-accept",
];

fn run_requests(
    ports: &BTreeMap<&str, u16>,
    origins: &[&ScriptOrigin],
    auth: &ScriptOrigin,
) -> Vec<Seen> {
    let mut out = Vec::new();
    for (i, r) in requests().iter().enumerate() {
        let before: Vec<usize> = origins.iter().map(|o| o.requests().len()).collect();
        let auth_before = auth.requests().len();
        let addr: SocketAddr = format!("127.0.0.1:{}", ports[r.port]).parse().unwrap();
        let raw = r.raw.replacen("\r\n", &format!("\r\nX-Test: {i}\r\n"), 1);
        let resp = request_raw(addr, &raw);
        let mut seen = Seen {
            status: resp.status,
            body: if resp.status < 300 {
                resp.body_str()
            } else {
                String::new()
            },
            ..Default::default()
        };
        for f in FIELDS {
            if let Some(v) = resp.header(f) {
                seen.fields.insert(f.to_string(), v.to_string());
            }
        }
        // The request the upstreams got, if any (the echo is in the body too).
        for (o, b) in origins.iter().zip(&before) {
            let all = o.requests();
            if let Some(got) = all[*b..]
                .iter()
                .find(|s| s.header("x-test") == Some(&i.to_string()))
            {
                let mut m = BTreeMap::new();
                m.insert(
                    ":request".to_string(),
                    format!("{} {}", got.method, got.target),
                );
                for (k, v) in &got.headers {
                    m.entry(k.clone())
                        .and_modify(|x: &mut String| x.push_str(&format!(", {v}")))
                        .or_insert_with(|| v.clone());
                }
                seen.upstream = Some(m);
            }
        }
        if let Some(got) = auth.requests().get(auth_before) {
            let mut m = BTreeMap::new();
            m.insert(
                ":request".to_string(),
                format!("{} {}", got.method, got.target),
            );
            for (k, v) in &got.headers {
                m.insert(k.clone(), v.clone());
            }
            seen.auth = Some(m);
        }
        out.push(seen);
    }
    out
}

/// One request on a fresh connection (a 101 answer is read as its head).
fn request_raw(addr: SocketAddr, raw: &str) -> Response {
    let mut c = Client::connect(addr);
    c.send(raw.as_bytes());
    c.read_response(false)
}

/// Fields that cannot be equal: the test's own marker, Traefik's host name.
fn volatile(field: &str) -> bool {
    matches!(field, "x-test" | "x-forwarded-server")
}

/// A field value as HTTP reads it: list members compared without the spaces around commas.
fn norm(v: Option<&String>) -> Option<String> {
    v.map(|v| v.split(',').map(str::trim).collect::<Vec<_>>().join(","))
}

fn compare(what: &str, t: &Seen, v: &Seen, out: &mut Vec<String>) {
    if t.status != v.status {
        out.push(format!(
            "{what}: status: traefik {} veloxy {}",
            t.status, v.status
        ));
    }
    // The proxies' own error answers (no upstream reached, such as the 404 of an unknown
    // host) differ in body and fields by nature: only their status is compared.
    let own_error = t.upstream.is_none() && v.upstream.is_none() && t.status == 404;
    let keys: std::collections::BTreeSet<&String> =
        t.fields.keys().chain(v.fields.keys()).collect();
    for k in keys.into_iter().filter(|_| !own_error) {
        let (a, b) = (t.fields.get(k), v.fields.get(k));
        if norm(a) != norm(b) {
            out.push(format!("{what}: response {k}: traefik {a:?} veloxy {b:?}"));
        }
    }
    match (&t.upstream, &v.upstream) {
        (Some(a), Some(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                if volatile(k) {
                    continue;
                }
                let (x, y) = (a.get(k), b.get(k));
                if x != y {
                    out.push(format!("{what}: upstream {k}: traefik {x:?} veloxy {y:?}"));
                }
            }
        }
        (None, None) => {}
        (a, b) => out.push(format!(
            "{what}: upstream reached: traefik {} veloxy {}",
            a.is_some(),
            b.is_some()
        )),
    }
    if let (Some(a), Some(b)) = (&t.auth, &v.auth) {
        for k in [
            "x-forwarded-method",
            "x-forwarded-uri",
            "x-forwarded-host",
            "x-forwarded-proto",
            "x-forwarded-for",
            "cookie",
            "x-token",
        ] {
            if a.get(k) != b.get(k) {
                out.push(format!(
                    "{what}: auth service {k}: traefik {:?} veloxy {:?}",
                    a.get(k),
                    b.get(k)
                ));
            }
        }
        if a.get(":request").map(|r| r.split(' ').next())
            != b.get(":request").map(|r| r.split(' ').next())
        {
            out.push(format!(
                "{what}: auth service method: traefik {:?} veloxy {:?}",
                a.get(":request"),
                b.get(":request")
            ));
        }
    } else if t.auth.is_some() != v.auth.is_some() {
        out.push(format!(
            "{what}: auth service asked: traefik {} veloxy {}",
            t.auth.is_some(),
            v.auth.is_some()
        ));
    }
    // Compressed bodies are compared by their Content-Encoding above (the gzip bytes of two
    // encoders differ).
    let coded =
        t.fields.contains_key("content-encoding") || v.fields.contains_key("content-encoding");
    if t.status == 200
        && t.upstream.is_some()
        && !coded
        && t.body.lines().next() != v.body.lines().next()
    {
        out.push(format!(
            "{what}: body: traefik {:?} veloxy {:?}",
            t.body.lines().next(),
            v.body.lines().next()
        ));
    }
}

/// Differences the import report names (each is a "translated with a difference" line):
/// (what the comparison says, what the report must say).
const KNOWN: &[(&str, &str)] = &[
    (
        "entry point redirect GET: status: traefik 301 veloxy 308",
        "GET requests get 308 (Traefik: 301",
    ),
    (
        "cors preflight: status: traefik 200 veloxy 204",
        "with 204 (Traefik: 200)",
    ),
    (
        "upstream x-forwarded-port:",
        "X-Forwarded-Port to the listener's port",
    ),
    (
        "upstream x-forwarded-proto: traefik Some(\"ws\") veloxy Some(\"http\")",
        "on WebSocket upgrades (Traefik: ws/wss)",
    ),
    (
        "upstream accept-encoding: traefik Some(\"gzip\") veloxy None",
        "Accept-Encoding: gzip",
    ),
    ("response www-authenticate:", "adds charset=\"UTF-8\""),
    (
        "scheme redirect POST: status: traefik 308 veloxy 301",
        "requests other than GET get 301 (Traefik: 308",
    ),
    (
        "redirect regex POST: status: traefik 308 veloxy 301",
        "requests other than GET get 301 (Traefik: 308",
    ),
    (
        "compress small: response content-encoding: traefik None veloxy Some(\"gzip\")",
        "from 256 bytes (Traefik: from 1024 bytes",
    ),
    (
        "forward auth by custom field:",
        "Cookie and Authorization fields and X-Forwarded-* (Traefik: every request field)",
    ),
];

#[test]
fn traefik_and_its_import_answer_alike() {
    let Some(bin) = traefik_bin() else {
        return skip("no traefik binary (VELOXY_TRAEFIK_BIN, ~/.cache/veloxy/bin/traefik or PATH)");
    };
    let a = origin("a");
    let b = origin("b");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ports: BTreeMap<&str, u16> = [
        ("WEB", free_port()),
        ("SECURE", free_port()),
        ("PLAIN", free_port()),
    ]
    .into();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/import_traefik");
    let read = |f: &str| std::fs::read_to_string(data.join(f)).unwrap();
    let mut st = read("traefik.yml").replace("$DIR", &d.display().to_string());
    for (k, p) in &ports {
        st = st.replace(&format!("${k}"), &p.to_string());
    }
    let auth = auth_service();
    let dy = read("dynamic.yml")
        .replace("$AUTH", &auth.addr.to_string())
        .replace("$A", &a.addr.to_string())
        .replace("$B", &b.addr.to_string())
        .replace("$USER", USER);
    std::fs::write(d.join("traefik.yml"), st).unwrap();
    std::fs::write(d.join("dynamic.yml"), dy).unwrap();

    // Traefik on the original files.
    let child = Command::new(&bin)
        .arg(format!("--configFile={}", d.join("traefik.yml").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn traefik");
    let traefik = Proc {
        child,
        log: Default::default(),
    };
    let plain: SocketAddr = format!("127.0.0.1:{}", ports["PLAIN"]).parse().unwrap();
    let ready = |addr: SocketAddr| {
        eventually(Duration::from_secs(20), || {
            Client::try_connect(addr).is_ok()
                && request(
                    addr,
                    "GET /ready HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
                )
                .status
                    == 200
        })
    };
    assert!(ready(plain), "traefik did not answer on {plain}");
    let t = run_requests(&ports, &[&a, &b], &auth);
    drop(traefik);

    // veloxy on the import of the same files, on the same ports.
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let import = Command::new(VELOXY)
        .args(["import", "--from", "traefik"])
        .arg(d.join("traefik.yml"))
        .arg(d.join("dynamic.yml"))
        .arg("-o")
        .arg(out.join("veloxy.toml"))
        .arg("--report")
        .arg(out.join("report.txt"))
        .output()
        .expect("veloxy import");
    let report = std::fs::read_to_string(out.join("report.txt")).unwrap_or_default();
    let config = std::fs::read_to_string(out.join("veloxy.toml")).unwrap_or_default();
    assert!(
        import.status.success(),
        "import failed: {}\n{report}",
        String::from_utf8_lossy(&import.stderr)
    );
    println!("--- imported config\n{config}\n--- report\n{report}");
    let free = eventually(Duration::from_secs(10), || {
        ports
            .values()
            .all(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
    });
    assert!(free, "traefik's ports were not released");
    let v = veloxy_cmd(
        Command::new(VELOXY),
        &["run", "--config", out.join("veloxy.toml").to_str().unwrap()],
        tempfile::tempdir().unwrap(),
    );
    assert!(
        ready(plain),
        "veloxy did not answer on {plain}: {}",
        v.proc.log_text()
    );
    let x = run_requests(&ports, &[&a, &b], &auth);

    if let Some(u) = &t[0].upstream {
        println!(
            "--- what the upstream saw from traefik for {:?}: {u:?}",
            requests()[0].what
        );
    }
    if let Some(u) = &x[0].upstream {
        println!("--- and from veloxy: {u:?}");
    }
    let mut diffs = Vec::new();
    for ((r, t), x) in requests().iter().zip(&t).zip(&x) {
        compare(r.what, t, x, &mut diffs);
    }
    println!("--- {} differences", diffs.len());
    let mut unexplained = Vec::new();
    for d in &diffs {
        match KNOWN.iter().find(|(k, _)| d.contains(k)) {
            Some((_, line)) => {
                assert!(
                    report.contains(line),
                    "the report does not name {d:?} (expected {line:?})"
                );
                println!("named: {d}");
            }
            None => {
                println!("UNEXPLAINED: {d}");
                unexplained.push(d.clone());
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "differences the report does not name:\n{}",
        unexplained.join("\n")
    );
}
