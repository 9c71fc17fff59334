//! Differential test of `veloxy import --from nginx` (issue 33): the real nginx runs an
//! original config, veloxy runs what `veloxy import` made of the same config, both in front
//! of one echo upstream; the same requests go to both and the answers (status, Location, the
//! fields the config adds, the body) and what the upstream saw (method, target, Host and the
//! other fields) must be the same. The differences the report names (veloxy's X-Forwarded-*
//! fields, nginx's `Connection: close` upstream, error page bodies, nginx's Expires next to
//! the Cache-Control of `expires`) are left out of the comparison; everything else is
//! compared, including a cached answer's second request (served from the cache by both).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use veloxy_testkit::*;

/// The original config: `{PORT}` is the listener, `{UP}` the echo upstream, `{DIR}` a
/// directory for nginx's own files.
const CONFIG: &str = r#"
worker_processes 1;
daemon off;
master_process off;
pid {DIR}/nginx.pid;
error_log stderr error;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path {DIR};
    proxy_temp_path {DIR};
    fastcgi_temp_path {DIR};
    uwsgi_temp_path {DIR};
    scgi_temp_path {DIR};
    proxy_cache_path {DIR}/cache keys_zone=pages:1m max_size=10m;
    upstream app {
        server {UP};
    }
    server {
        listen 127.0.0.1:{PORT};
        server_name example.com;
        add_header X-Site example always;
        location / {
            proxy_pass http://app;
            proxy_set_header X-Method $request_method;
            proxy_set_header X-Server $server_name;
            if ($request_method = 'OPTIONS') {
                add_header X-Pre yes always;
                return 204;
            }
            if ($request_method = "POST") {
                add_header X-Write yes always;
            }
        }
        location /cached/ {
            proxy_pass http://app;
            proxy_cache pages;
            proxy_cache_valid 200 1m;
            add_header X-Cache-Status $upstream_cache_status always;
        }
        location ~* \.(css|txt)$ {
            root {DIR}/site;
            expires 30d;
        }
        location /api/ {
            proxy_pass http://app/v1/;
            proxy_set_header Host $host;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $host;
            client_max_body_size 1k;
        }
        location /strip/ {
            proxy_pass http://app/;
            proxy_set_header X-Id $arg_id;
        }
        location ~ ^/users/(\d+)$ {
            proxy_pass http://app/u?id=$1;
        }
        location = /health {
            return 200 "ok\n";
        }
        location /old/ {
            return 301 https://$host$request_uri;
        }
        location /moved {
            return 302 /new;
        }
        rewrite ^/legacy/(.*)$ /modern/$1 permanent;
        rewrite ^/bare/(.*)$ /clean/$1? redirect;
    }
    server {
        listen 127.0.0.1:{PORT};
        server_name other.example;
        location / {
            proxy_pass http://app;
            proxy_set_header Host $http_host;
            add_header X-Other 1 always;
        }
    }
}
"#;

fn nginx_bin() -> Option<&'static str> {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

fn render(port: u16, up: SocketAddr, dir: &Path) -> String {
    CONFIG
        .replace("{PORT}", &port.to_string())
        .replace("{UP}", &up.to_string())
        .replace("{DIR}", &dir.display().to_string())
}

/// Runs `veloxy import` on `conf` in `dir`: the TOML and the report.
fn import(dir: &Path, conf: &str) -> (String, String) {
    let src = dir.join("nginx.conf");
    std::fs::write(&src, conf).unwrap();
    let out = Command::new(VELOXY.path())
        .args(["import", "--from", "nginx"])
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
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// What a request's answer and the upstream's view of it come to, for comparison.
fn outcome(addr: SocketAddr, raw: &str, origin: &ScriptOrigin) -> String {
    let before = origin.hits();
    let r = request(addr, raw);
    let mut out = format!("status {}\n", r.status);
    for f in [
        "location",
        "x-site",
        "x-other",
        "x-pre",
        "x-write",
        "x-cache-status",
        "cache-control",
    ] {
        out.push_str(&format!("{f} {:?}\n", r.header(f)));
    }
    // Bodies of answers nginx and veloxy make themselves (redirects, errors) differ, as the
    // report says: compared only for the upstream's and the config's own answers.
    if r.status == 200 || origin.hits() > before {
        out.push_str(&format!("body {:?}\n", r.body_str()));
    }
    if origin.hits() > before {
        let seen = origin.requests().pop().unwrap();
        out.push_str(&format!("upstream {} {}\n", seen.method, seen.target));
        let mut fields: Vec<String> = seen
            .headers
            .iter()
            .filter(|(n, _)| {
                let n = n.to_ascii_lowercase();
                // Named in the report (X-Forwarded-*) or connection management.
                !(n.starts_with("x-forwarded-") && !n.ends_with("-prefix")
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
fn nginx_and_its_import_answer_alike() {
    let Some(bin) = nginx_bin() else {
        skip("nginx is not installed");
        return;
    };
    let origin = script_origin(|r| Scripted::ok(format!("{} {}", r.method, r.target)));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("site")).unwrap();
    std::fs::write(dir.path().join("site/a.css"), "body{}\n").unwrap();
    let (np, vp) = (free_port(), free_port());
    let nginx_conf = dir.path().join("nginx-run.conf");
    std::fs::write(&nginx_conf, render(np, origin.addr, dir.path())).unwrap();
    let mut nginx = Command::new(bin)
        .args(["-p", &dir.path().display().to_string(), "-c"])
        .arg(&nginx_conf)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn nginx");
    let naddr: SocketAddr = format!("127.0.0.1:{np}").parse().unwrap();
    let up = eventually(Duration::from_secs(10), || listening(naddr));
    assert!(up, "nginx did not start");

    let (toml, report) = import(dir.path(), &render(vp, origin.addr, dir.path()));
    assert!(!report.contains("refused:"), "{report}");
    let v = veloxy(&toml);
    let vaddr: SocketAddr = format!("127.0.0.1:{vp}").parse().unwrap();
    assert!(eventually(Duration::from_secs(10), || { listening(vaddr) }));

    let big = "x".repeat(2048);
    let requests: Vec<String> = [
        ("GET", "example.com", "/", ""),
        ("GET", "example.com", "/page?a=1&b=2", "X-Custom: yes\r\n"),
        ("POST", "example.com", "/form", "Content-Type: text/plain\r\n"),
        ("GET", "example.com", "/api/items?q=1", ""),
        ("GET", "EXAMPLE.com", "/api/", "X-Real-IP: 6.6.6.6\r\n"),
        ("GET", "example.com", "/strip/a/b?id=7", ""),
        ("GET", "example.com", "/users/42?x=1", ""),
        ("GET", "example.com", "/users/abc", ""),
        ("GET", "example.com", "/health", ""),
        ("GET", "example.com", "/old/page?x=1", ""),
        ("GET", "example.com", "/moved", ""),
        ("GET", "example.com", "/legacy/a?x=1&y=2", ""),
        ("GET", "example.com", "/legacy/b", ""),
        ("GET", "example.com", "/bare/c?drop=1", ""),
        ("GET", "other.example", "/x", ""),
        ("GET", "unknown.example", "/api/z", ""),
        ("DELETE", "example.com", "/api/thing", "Authorization: Bearer t\r\n"),
        ("OPTIONS", "example.com", "/opt", ""),
        ("POST", "example.com", "/write", ""),
        ("GET", "example.com", "/cached/p?v=1", ""),
        ("GET", "example.com", "/cached/p?v=1", ""),
        ("GET", "example.com", "/a.css", ""),
    ]
    .iter()
    .map(|(m, h, p, extra)| {
        let body = if *m == "POST" { "hello" } else { "" };
        format!(
            "{m} {p} HTTP/1.1\r\nHost: {h}:PORT\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    })
    .chain([format!(
        "POST /api/upload HTTP/1.1\r\nHost: example.com\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{big}",
        big.len()
    )])
    .collect();
    let mut differences = Vec::new();
    for raw in &requests {
        let n = outcome(naddr, &raw.replace("PORT", &np.to_string()), &origin)
            .replace(&np.to_string(), "PORT");
        let x = outcome(vaddr, &raw.replace("PORT", &vp.to_string()), &origin)
            .replace(&vp.to_string(), "PORT");
        if n != x {
            differences.push(format!(
                "{}\n--- nginx\n{n}\n--- veloxy\n{x}\n",
                raw.lines().next().unwrap()
            ));
        }
    }
    let _ = nginx.kill();
    let _ = nginx.wait();
    drop(v);
    assert!(
        differences.is_empty(),
        "{} of {} requests differ:\n{}\nconfig:\n{toml}\nreport:\n{report}",
        differences.len(),
        requests.len(),
        differences.join("\n")
    );
}

/// The auth_request idiom: an internal location proxying to the auth service, fields of its
/// answer copied onto the upstream request, `auth_request off`, `proxy_hide_header`.
const AUTH_CONFIG: &str = r#"
worker_processes 1;
daemon off;
master_process off;
pid {DIR}/nginx-auth.pid;
error_log stderr error;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path {DIR};
    proxy_temp_path {DIR};
    fastcgi_temp_path {DIR};
    uwsgi_temp_path {DIR};
    scgi_temp_path {DIR};
    upstream auth {
        server {UP};
    }
    server {
        listen 127.0.0.1:{PORT};
        location / {
            auth_request /authz;
            auth_request_set $user $upstream_http_remote_user;
            auth_request_set $groups $upstream_http_remote_groups;
            proxy_set_header Remote-User $user;
            proxy_set_header Remote-Groups $groups;
            proxy_hide_header X-Powered-By;
            proxy_pass http://{UP};
        }
        location /open/ {
            auth_request off;
            proxy_pass http://{UP};
        }
        location = /authz {
            internal;
            proxy_pass http://auth/verify;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
        }
    }
}
"#;

/// The auth service and the app on one origin: `/verify` passes `Cookie: session=ok` (with
/// Remote-User and Remote-Groups), answers 403 for URIs naming "forbid", else 401.
fn auth_origin(r: &SeenRequest) -> Scripted {
    if r.path() == "/verify" {
        let uri = r
            .header("x-original-uri")
            .or(r.header("x-forwarded-uri"))
            .unwrap_or("");
        if uri.contains("forbid") {
            return Scripted::new(403);
        }
        if r.header("cookie") != Some("session=ok") {
            return Scripted::new(401)
                .header("WWW-Authenticate", "Bearer")
                .header("Location", "https://login.example/");
        }
        return Scripted::new(200)
            .header("Remote-User", "alice")
            .header("Remote-Groups", "admins");
    }
    Scripted::ok(format!("{} {}", r.method, r.target)).header("X-Powered-By", "php")
}

/// One request's answer, what the auth service was asked and what the app saw.
fn auth_outcome(addr: SocketAddr, raw: &str, origin: &ScriptOrigin) -> String {
    let before = origin.hits();
    let r = request(addr, raw);
    let mut out = format!(
        "status {}\nwww-authenticate {:?}\nx-powered-by {:?}\n",
        r.status,
        r.header("www-authenticate"),
        r.header("x-powered-by")
    );
    if r.status == 200 {
        out.push_str(&format!("body {:?}\n", r.body_str()));
    }
    for seen in origin.requests().into_iter().skip(before) {
        if seen.path() == "/verify" {
            // What the auth service learns of the request (nginx: X-Original-URI as the
            // config sets it; veloxy: X-Forwarded-Uri, as the report says).
            out.push_str(&format!(
                "auth {} uri={:?} cookie={:?} body={}\n",
                seen.method,
                seen.header("x-original-uri")
                    .or(seen.header("x-forwarded-uri")),
                seen.header("cookie"),
                seen.body.len()
            ));
        } else {
            out.push_str(&format!(
                "app {} {} remote-user={:?} remote-groups={:?} cookie={:?} body={}\n",
                seen.method,
                seen.target,
                seen.header("remote-user"),
                seen.header("remote-groups"),
                seen.header("cookie"),
                seen.body.len()
            ));
        }
    }
    out
}

#[test]
fn nginx_auth_request_and_its_import_answer_alike() {
    let Some(bin) = nginx_bin() else {
        skip("nginx is not installed");
        return;
    };
    let origin = script_origin(auth_origin);
    let dir = tempfile::tempdir().unwrap();
    let (np, vp) = (free_port(), free_port());
    let render = |port: u16| {
        AUTH_CONFIG
            .replace("{PORT}", &port.to_string())
            .replace("{UP}", &origin.addr.to_string())
            .replace("{DIR}", &dir.path().display().to_string())
    };
    let nginx_conf = dir.path().join("nginx-auth.conf");
    std::fs::write(&nginx_conf, render(np)).unwrap();
    let mut nginx = Command::new(bin)
        .args(["-p", &dir.path().display().to_string(), "-c"])
        .arg(&nginx_conf)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn nginx");
    let naddr: SocketAddr = format!("127.0.0.1:{np}").parse().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || { listening(naddr) }),
        "nginx did not start"
    );
    let (toml, report) = import(dir.path(), &render(vp));
    assert!(!report.contains("refused:"), "{report}");
    assert!(toml.contains("forward_auth"), "{toml}");
    // The differences the comparison leaves out are named.
    for named in [
        "X-Original-URI is sent to the auth service as X-Forwarded-Uri",
        "an answer other than 2xx goes to the client as the auth service sent it",
    ] {
        assert!(report.contains(named), "{named:?} not in\n{report}");
    }
    let v = veloxy(&toml);
    let vaddr: SocketAddr = format!("127.0.0.1:{vp}").parse().unwrap();
    assert!(eventually(Duration::from_secs(10), || { listening(vaddr) }));

    let requests = [
        ("GET", "/", "Cookie: session=ok\r\nRemote-User: mallory\r\n"),
        (
            "GET",
            "/x?q=1",
            "Cookie: session=ok\r\nRemote-Groups: root\r\n",
        ),
        ("POST", "/form", "Cookie: session=ok\r\n"),
        ("GET", "/x", ""),
        ("POST", "/x", "Cookie: session=no\r\n"),
        ("GET", "/forbid", "Cookie: session=ok\r\n"),
        ("GET", "/open/page", ""),
        ("GET", "/authz", "Cookie: session=ok\r\n"),
    ];
    let mut differences = Vec::new();
    for (m, p, extra) in requests {
        let body = if m == "POST" { "hello" } else { "" };
        let raw = format!(
            "{m} {p} HTTP/1.1\r\nHost: app.example\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let n = auth_outcome(naddr, &raw, &origin);
        let x = auth_outcome(vaddr, &raw, &origin);
        if n != x {
            differences.push(format!("{m} {p}\n--- nginx\n{n}--- veloxy\n{x}"));
        }
    }
    let _ = nginx.kill();
    let _ = nginx.wait();
    drop(v);
    assert!(
        differences.is_empty(),
        "{} of {} requests differ:\n{}\nconfig:\n{toml}\nreport:\n{report}",
        differences.len(),
        requests.len(),
        differences.join("\n")
    );
}
