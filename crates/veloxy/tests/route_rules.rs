//! Route rules (issue 12, first part): `respond`, `redirect` with templates, a listener's
//! `redirect_https`, and `path_exact` precedence, over HTTP/1.1 and over HTTP/2 with TLS.

use veloxy_testkit::*;

/// The site of these tests: `web` (TLS) and `plain` listeners serving `routes`, with one
/// upstream group `app`.
fn site(up: std::net::SocketAddr, plain_keys: &str, routes: &str) -> Site {
    Site::start(
        "",
        plain_keys,
        &format!("{routes}\n[upstreams.app]\nservers = [\"{up}\"]\n"),
    )
}

fn header<'a>(raw: &'a str, name: &str) -> Option<&'a str> {
    raw_header(raw, name)
}

#[test]
fn respond_answers_without_an_upstream() {
    let up = upstream(&[]);
    let s = site(
        up.addr,
        "",
        "[[routes]]\npath_exact = \"/healthz\"\nrespond = { status = 200, body = \"ok\\n\" }\n\
         [[routes]]\npath = \"/gone/\"\nrespond = { status = 410, body = \"gone\", content_type = \"text/html\" }\n\
         [[routes]]\nupstream = \"app\"\n",
    );
    let (status, raw) = s.h1("/healthz", "");
    assert_eq!(status, 200, "{raw}");
    assert!(raw.ends_with("\r\n\r\nok\n"), "{raw}");
    assert_eq!(
        header(&raw, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(header(&raw, "content-length"), Some("3"));
    let r = s.h2("/healthz", &[]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok\n"));
    let r = s.h2("/gone/x", &[]);
    assert_eq!((r.status, r.body_str().as_str()), (410, "gone"));
    assert_eq!(r.header("content-type"), Some("text/html"));
    // path_exact matches only the exact path: /healthz/x goes to the proxy route.
    let (status, raw) = s.h1("/healthz/x", "");
    assert_eq!(status, 200);
    assert!(header(&raw, "x-upstream").is_some(), "{raw}");
}

#[test]
fn redirect_renders_its_template() {
    let up = upstream(&[]);
    let s = site(
        up.addr,
        "",
        "[[routes]]\npath = \"/old/\"\nredirect = { to = \"https://{host}/new{path}?from={query.id}&ua={header.user-agent}\", status = 301 }\n\
         [[routes]]\nhost = \"localhost\"\npath = \"/moved\"\nredirect = { to = \"{scheme}://example.org{uri}\" }\n\
         [[routes]]\nupstream = \"app\"\n",
    );
    let (status, raw) = s.h1("/old/a?id=7", "");
    assert_eq!(status, 301, "{raw}");
    assert_eq!(
        header(&raw, "location"),
        Some("https://localhost/new/old/a?from=7&ua=")
    );
    let r = s.h2("/moved?x=1", &[]);
    assert_eq!(r.status, 308, "default status");
    assert_eq!(r.header("location"), Some("https://example.org/moved?x=1"));
}

#[test]
fn redirect_https_listener_sends_every_request_to_https() {
    let up = upstream(&[]);
    let s = site(
        up.addr,
        "redirect_https = true\nhttps_port = 8443",
        "[[routes]]\nupstream = \"app\"\n",
    );
    let plain = s.addr("plain");
    let r = request(
        plain,
        "GET /a/b?c=d HTTP/1.1\r\nHost: example.com:8080\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some("https://example.com:8443/a/b?c=d")
    );
    // HEAD gets the head only; keep-alive is kept.
    let mut c = Client::connect(plain);
    c.send(b"HEAD / HTTP/1.1\r\nHost: example.com\r\n\r\n");
    let r = c.read_response(true);
    assert_eq!(r.status, 308);
    assert!(r.body.is_empty());
    c.send(b"GET /x HTTP/1.1\r\nHost: example.com\r\n\r\n");
    assert_eq!(
        c.read_response(false).header("location"),
        Some("https://example.com:8443/x")
    );
    // The TLS listener itself still proxies.
    assert_eq!(s.h1("/", "").0, 200);
}

#[test]
fn bad_rules_are_refused_with_file_line_and_key() {
    let cases = [
        (
            "[[routes]]\nredirect = { to = \"/x\", status = 200 }\n",
            "routes[0].redirect.status: 200 is not a redirect status",
        ),
        (
            "[[routes]]\nredirect = { to = \"https://{hots}/\" }\n",
            "routes[0].redirect.to: unknown template variable {hots}",
        ),
        (
            // (path with path_exact is a union: see tests/route_lists.rs)
            "[[routes]]\npath_regex = \"^/a\"\npath_exact = \"/a\"\nrespond = {}\n",
            "routes[0].path_regex: a route has one of path (prefix), path_exact and path_regex",
        ),
        (
            "[[routes]]\nupstream = \"app\"\nrespond = {}\n",
            "routes[0]: a route has one of upstream (proxy), root (files), redirect and respond",
        ),
    ];
    for (routes, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.toml");
        std::fs::write(
            &path,
            format!(
                "[listeners.web]\naddr = \"127.0.0.1:0\"\n{routes}[upstreams.app]\nservers = [\"127.0.0.1:9\"]\n"
            ),
        )
        .unwrap();
        let out = std::process::Command::new(VELOXY)
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{routes}: {text}");
        assert!(text.contains(want), "{routes}: want {want:?} in {text}");
        assert!(text.contains(&format!("{}:", path.display())), "{text}");
    }
}

/// The request line the echo upstream saw.
fn request_line(echo_body: &str) -> &str {
    // A raw HTTP/1.1 response: the body follows the response head.
    let body = match echo_body.starts_with("HTTP/") {
        true => echo_body.split_once("\r\n\r\n").map_or("", |(_, b)| b),
        false => echo_body,
    };
    body.lines().next().unwrap_or("")
}

#[test]
fn strip_prefix_and_rewrite_change_the_upstream_target() {
    let up = upstream(&[]);
    let s = site(
        up.addr,
        "",
        "[[routes]]\npath = \"/api/\"\nupstream = \"app\"\nstrip_prefix = true\n\
         [[routes]]\npath_exact = \"/v1/echo\"\nupstream = \"app\"\nrewrite = \"/echo?from={path}&{query}\"\n\
         [[routes]]\npath = \"/old/\"\nupstream = \"app\"\nrewrite = \"/echo\"\n\
         [[routes]]\npath = \"/socket/\"\nupstream = \"app\"\nrewrite = \"/echo?\"\n\
         [[routes]]\nupstream = \"app\"\n",
    );
    // HTTP/1.1 over TLS: the prefix goes, the query stays.
    let (status, raw) = s.h1("/api/echo?x=1", "");
    assert_eq!(status, 200, "{raw}");
    assert_eq!(request_line(&raw), "GET /echo?x=1 HTTP/1.1");
    // The path keeps at least "/".
    let (_, raw) = s.h1("/api/", "");
    assert!(raw.contains("x-upstream"), "{raw}");
    // HTTP/2: the same rules.
    let r = s.h2("/api/echo?y=2", &[]);
    assert_eq!(request_line(&r.body_str()), "GET /echo?y=2 HTTP/1.1");
    // A rewrite with its own query replaces the client's; without one, the query is kept.
    let r = s.h2("/v1/echo?a=b", &[]);
    assert_eq!(
        request_line(&r.body_str()),
        "GET /echo?from=/v1/echo&a=b HTTP/1.1"
    );
    let (_, raw) = s.h1("/old/anything?k=v", "");
    assert_eq!(request_line(&raw), "GET /echo?k=v HTTP/1.1");
    // An empty trailing '?' drops the query (issue 32, item 5).
    let (_, raw) = s.h1("/socket/x?EIO=4&t=1", "");
    assert_eq!(request_line(&raw), "GET /echo HTTP/1.1");
    let r = s.h2("/socket/x?EIO=4", &[]);
    assert_eq!(request_line(&r.body_str()), "GET /echo HTTP/1.1");
}

/// `{is_args}` is "?" when the request has a query and "" otherwise (nginx's `$is_args`), so
/// a redirect keeps the query without a bare `?` (the form `veloxy import` writes for nginx's
/// `rewrite ... permanent`).
#[test]
fn is_args_adds_a_question_mark_only_with_a_query() {
    let up = upstream(&[]);
    let s = site(
        up.addr,
        "",
        "[[routes]]\npath = \"/old/\"\nredirect = { to = \"/new{path}{is_args}{query}\", status = 301 }\n",
    );
    let (status, raw) = s.h1("/old/a?x=1&y=2", "");
    assert_eq!(status, 301, "{raw}");
    assert_eq!(header(&raw, "location"), Some("/new/old/a?x=1&y=2"));
    let (_, raw) = s.h1("/old/a", "");
    assert_eq!(header(&raw, "location"), Some("/new/old/a"));
    let r = s.h2("/old/b?z", &[]);
    assert_eq!(r.header("location"), Some("/new/old/b?z"));
}
