//! Route actions (issue 12): request and response header rules, error pages, the body cap,
//! `location_rewrite` (against a real nginx) and `[server] request_id`, over HTTP/1.1 and
//! HTTP/2 with TLS.

use veloxy_testkit::*;

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l.eq_ignore_ascii_case(line))
}

#[test]
fn header_rules_edit_the_upstream_request_and_every_answer() {
    let up = upstream(&[]);
    let rules = "request_headers = { set = { \"X-Real-IP\" = \"{client_ip}\", \"Host\" = \"app.internal\", \"X-Forwarded-Proto\" = \"edge\" }, add = { \"X-Route\" = \"main\", \"X-Empty\" = \"{header.x-none}\" }, remove = [\"X-Debug\"] }\n\
                 response_headers = { set = { \"Strict-Transport-Security\" = \"max-age=63072000; includeSubDomains\" }, add = { \"X-Frame-Options\" = \"DENY\" }, remove = [\"X-Upstream\", \"Server\"] }\n";
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath = \"/\"\nupstream = \"app\"\n{rules}\
             [[routes]]\npath_exact = \"/fixed\"\nrespond = {{ body = \"ok\" }}\n{rules}\
             [[routes]]\npath = \"/dead/\"\nupstream = \"dead\"\n{rules}\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.dead]\nservers = [\"127.0.0.1:9\"]\nretries = 0\n",
            up.addr
        ),
    );
    let check_upstream_saw = |seen: &str| {
        assert!(has_line(seen, "X-Real-IP: 127.0.0.1"), "{seen}");
        assert!(has_line(seen, "Host: app.internal"), "{seen}");
        assert!(!has_line(seen, "Host: localhost"), "{seen}");
        assert!(has_line(seen, "X-Route: main"), "{seen}");
        assert!(has_line(seen, "X-Forwarded-Proto: edge"), "{seen}");
        assert!(
            !seen
                .to_ascii_lowercase()
                .contains("x-forwarded-proto: https"),
            "{seen}"
        );
        assert!(!seen.to_ascii_lowercase().contains("x-debug"), "{seen}");
        assert!(!seen.to_ascii_lowercase().contains("x-empty"), "{seen}");
        assert!(
            seen.contains("X-Keep: yes") || seen.contains("x-keep: yes"),
            "{seen}"
        );
    };
    // HTTP/1.1 over TLS.
    let (status, raw) = s.h1("/echo", "X-Debug: 1\r\nX-Keep: yes\r\n");
    assert_eq!(status, 200, "{raw}");
    check_upstream_saw(raw_body(&raw));
    assert_eq!(
        raw_header(&raw, "strict-transport-security"),
        Some("max-age=63072000; includeSubDomains")
    );
    assert_eq!(raw_header(&raw, "x-frame-options"), Some("DENY"));
    assert_eq!(raw_header(&raw, "x-upstream"), None, "{raw}");
    // HTTP/2.
    let r = s.h2("/echo", &[("x-debug", "1"), ("x-keep", "yes")]);
    assert_eq!(r.status, 200);
    check_upstream_saw(&r.body_str());
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert!(r.header("x-upstream").is_none());
    // Every answer on the route: a fixed response and veloxy's own error.
    for path in ["/fixed", "/dead/x"] {
        let (status, raw) = s.h1(path, "");
        assert!(status == 200 || status == 502, "{raw}");
        assert_eq!(raw_header(&raw, "x-frame-options"), Some("DENY"), "{raw}");
        assert_eq!(raw_header(&raw, "server"), None, "{raw}");
        let r = s.h2(path, &[]);
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{path}");
        assert!(r.header("strict-transport-security").is_some(), "{path}");
    }
}

#[test]
fn error_pages_replace_upstream_and_own_errors() {
    let up = upstream(&[]);
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("502.html", "<h1>bad gateway page</h1>"),
        ("5xx.html", "<h1>server error page</h1>"),
        ("404.txt", "not here"),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let d = dir.path().display();
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath = \"/up/\"\nupstream = \"app\"\nstrip_prefix = true\n\
             error_pages = {{ \"502\" = \"{d}/502.html\", \"5xx\" = \"{d}/5xx.html\", \"404\" = \"{d}/404.txt\" }}\n\
             [[routes]]\npath = \"/dead/\"\nupstream = \"dead\"\nerror_pages = {{ \"5xx\" = \"{d}/5xx.html\" }}\n\
             [[routes]]\npath = \"/plain/\"\nupstream = \"app\"\nstrip_prefix = true\n\
             [upstreams.app]\nservers = [\"{}\"]\nretries = 0\n\
             [upstreams.dead]\nservers = [\"127.0.0.1:9\"]\nretries = 0\n",
            up.addr
        ),
    );
    for (path, status, body, ctype) in [
        (
            "/up/status/502",
            502,
            "<h1>bad gateway page</h1>",
            "text/html; charset=utf-8",
        ),
        (
            "/up/status/503",
            503,
            "<h1>server error page</h1>",
            "text/html; charset=utf-8",
        ),
        (
            "/up/status/404",
            404,
            "not here",
            "text/plain; charset=utf-8",
        ),
        (
            "/dead/x",
            502,
            "<h1>server error page</h1>",
            "text/html; charset=utf-8",
        ),
    ] {
        let (got, raw) = s.h1(path, "");
        assert_eq!(got, status, "{path}: {raw}");
        assert_eq!(raw_body(&raw), body, "{path}");
        assert_eq!(raw_header(&raw, "content-type"), Some(ctype), "{path}");
        let r = s.h2(path, &[]);
        assert_eq!(
            (r.status, r.body_str().as_str()),
            (status, body),
            "HTTP/2 {path}"
        );
    }
    // Not an error, or no page for it: the upstream's own answer.
    let (status, raw) = s.h1("/up/status/201", "");
    assert_eq!(status, 201, "{raw}");
    assert!(!raw.contains("page"), "{raw}");
    let (status, raw) = s.h1("/plain/status/502", "");
    assert_eq!(status, 502);
    assert!(!raw.contains("bad gateway page"), "{raw}");
}

#[test]
fn max_body_bytes_refuses_large_bodies_before_forwarding() {
    let up = upstream(&[]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\nupstream = \"app\"\nmax_body_bytes = \"1KiB\"\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            up.addr
        ),
    );
    let post = |len: usize| {
        format!(
            "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{}",
            "a".repeat(len)
        )
    };
    assert_eq!(s.h1_raw(&post(1024)).0, 200);
    let (status, raw) = s.h1_raw(&post(1025));
    assert_eq!(status, 413, "{raw}");
    // A chunked body is counted as it streams: 413, and the connection closes.
    let chunk = "a".repeat(600);
    let chunked = format!(
        "POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n\
         258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n"
    );
    let (status, raw) = s.h1_raw(&chunked);
    assert_eq!(status, 413, "{raw}");
    assert_eq!(raw_header(&raw, "connection"), Some("close"), "{raw}");
    // HTTP/2: a declared length over the cap, and a body of unknown length passing it.
    let mut req = h2_get("localhost", "/echo", true);
    *req.method_mut() = http::Method::POST;
    req.headers_mut()
        .insert("content-length", "2000".parse().unwrap());
    assert_eq!(s.h2_req(req, Some(vec![b'a'; 2000].into())).status, 413);
    let mut req = h2_get("localhost", "/echo", true);
    *req.method_mut() = http::Method::POST;
    assert_eq!(s.h2_req(req, Some(vec![b'a'; 2000].into())).status, 413);
    let mut req = h2_get("localhost", "/echo", true);
    *req.method_mut() = http::Method::POST;
    assert_eq!(s.h2_req(req, Some(vec![b'a'; 1000].into())).status, 200);
}

#[test]
fn location_rewrite_points_backend_redirects_at_the_client_host() {
    let Some(nginx) = Nginx::start(
        "location /login { return 302 http://$server_addr:$server_port/welcome?x=1; }\n\
         location /refresh { add_header Refresh \"0; url=http://$server_addr:$server_port/r\"; return 200 ok; }\n",
    ) else {
        return;
    };
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath = \"/\"\nupstream = \"nginx\"\nlocation_rewrite = true\n\
             [[routes]]\npath = \"/raw/\"\nupstream = \"nginx\"\nrewrite = \"/login\"\n\
             [upstreams.nginx]\nservers = [\"{}\"]\n",
            nginx.addr
        ),
    );
    let (status, raw) = s.h1("/login", "");
    assert_eq!(status, 302, "{raw}");
    assert_eq!(
        raw_header(&raw, "location"),
        Some("https://localhost/welcome?x=1")
    );
    let (_, raw) = s.h1("/refresh", "");
    assert_eq!(
        raw_header(&raw, "refresh"),
        Some("0; url=https://localhost/r")
    );
    let r = s.h2("/login", &[]);
    assert_eq!(r.header("location"), Some("https://localhost/welcome?x=1"));
    // Without location_rewrite the backend's own address goes through.
    let (_, raw) = s.h1("/raw/", "");
    let want = format!("http://{}/welcome?x=1", nginx.addr);
    assert_eq!(raw_header(&raw, "location"), Some(want.as_str()));
}

#[test]
fn request_id_is_kept_or_made_forwarded_returned_and_logged() {
    let up = upstream(&[]);
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("access.log");
    let s = Site::start(
        &format!(
            "request_id = \"X-Request-Id\"\n[server.access_log]\npath = \"{}\"\nformat = \"json\"\n",
            log.display()
        ),
        "",
        &format!(
            "[[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
            up.addr
        ),
    );
    let (_, raw) = s.h1("/echo", "X-Request-Id: abc-123\r\n");
    assert_eq!(raw_header(&raw, "x-request-id"), Some("abc-123"));
    assert!(has_line(raw_body(&raw), "X-Request-Id: abc-123"), "{raw}");
    assert_eq!(raw_body(&raw).matches("abc-123").count(), 1, "{raw}");
    // Invalid or absent: a new one, the same upstream and downstream.
    let (_, raw) = s.h1("/echo", "X-Request-Id: bad id\r\n");
    let id = raw_header(&raw, "x-request-id").unwrap().to_owned();
    assert_eq!(id.len(), 32, "{raw}");
    assert!(raw_body(&raw).contains(&id), "{raw}");
    let r = s.h2("/echo", &[]);
    let id2 = r.header("x-request-id").unwrap().to_owned();
    assert!(r.body_str().contains(&id2));
    assert_ne!(id, id2);
    assert!(eventually(std::time::Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|t| {
            t.contains("\"request_id\":\"abc-123\"")
                && t.contains(&format!("\"request_id\":\"{id2}\""))
        })
    }));
}

#[test]
fn every_template_variable_renders_over_both_protocols() {
    let vars = [
        "host",
        "uri",
        "path",
        "query",
        "scheme",
        "client_ip",
        "client_port",
        "server_port",
        "request_id",
        "header.x-a",
        "cookie.sid",
        "query.k",
        "re.1",
        "re.name",
    ];
    let add: Vec<String> = vars
        .iter()
        .map(|v| format!("\"X-V-{}\" = \"{{{v}}}\"", v.replace('.', "-")))
        .collect();
    let s = Site::start(
        "request_id = \"X-Request-Id\"",
        "",
        &format!(
            "[[routes]]\npath_regex = \"^/t/(?<name>[a-z]+)$\"\nrespond = {{ body = \"ok\" }}\n\
             response_headers = {{ add = {{ {} }} }}\n",
            add.join(", ")
        ),
    );
    let web = s.addr("web");
    let check = |get: &dyn Fn(&str) -> Option<String>, scheme_port: u16| {
        let v = |name: &str| get(&format!("x-v-{}", name.replace('.', "-")));
        assert_eq!(v("host").as_deref(), Some("localhost"));
        assert_eq!(v("uri").as_deref(), Some("/t/abc?k=v1&z=2"));
        assert_eq!(v("path").as_deref(), Some("/t/abc"));
        assert_eq!(v("query").as_deref(), Some("k=v1&z=2"));
        assert_eq!(v("scheme").as_deref(), Some("https"));
        assert_eq!(v("client_ip").as_deref(), Some("127.0.0.1"));
        assert!(v("client_port").unwrap().parse::<u16>().is_ok());
        assert_eq!(v("server_port").unwrap(), scheme_port.to_string());
        assert_eq!(v("request_id").map(|i| i.len()), Some(32));
        assert_eq!(v("header.x-a").as_deref(), Some("hdr"));
        assert_eq!(v("cookie.sid").as_deref(), Some("c00k"));
        assert_eq!(v("query.k").as_deref(), Some("v1"));
        assert_eq!(v("re.1").as_deref(), Some("abc"));
        assert_eq!(v("re.name").as_deref(), Some("abc"));
    };
    let (_, raw) = s.h1("/t/abc?k=v1&z=2", "X-A: hdr\r\nCookie: a=1; sid=c00k\r\n");
    check(&|n| raw_header(&raw, n).map(str::to_owned), web.port());
    let r = s.h2(
        "/t/abc?k=v1&z=2",
        &[("x-a", "hdr"), ("cookie", "a=1"), ("cookie", "sid=c00k")],
    );
    check(&|n| r.header(n).map(str::to_owned), web.port());
}
