//! `forward_auth` (issue 13, part) against a small real auth service from the test kit, over
//! HTTP/1.1 and HTTP/2 with TLS.

use veloxy_testkit::*;

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l.eq_ignore_ascii_case(line))
}

#[test]
fn forward_auth_passes_copies_refuses_and_fails_closed() {
    let auth = auth_server();
    let up = upstream(&[]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath = \"/dead/\"\nupstream = \"app\"\n\
             forward_auth = {{ upstream = \"nobody\", path = \"/verify\", timeout = \"1s\" }}\n\
             [[routes]]\nupstream = \"app\"\n\
             forward_auth = {{ upstream = \"authelia\", path = \"/api/verify\", copy_headers = [\"Remote-User\", \"Remote-Groups\", \"Remote-Email\"], timeout = \"2s\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.authelia]\nservers = [\"{}\"]\n\
             [upstreams.nobody]\nservers = [\"127.0.0.1:9\"]\nretries = 0\n",
            up.addr, auth.addr
        ),
    );
    // No session: the auth service's redirect goes to the client as it is; nothing is
    // forwarded.
    let (status, raw) = s.h1("/echo?x=1", "Remote-User: mallory\r\n");
    assert_eq!(status, 302, "{raw}");
    assert!(raw.starts_with("HTTP/1.1 302 Found\r\n"), "{raw}");
    assert_eq!(
        raw_header(&raw, "location"),
        Some("https://auth.example.com/?rd=/echo?x=1")
    );
    assert_eq!(raw_header(&raw, "set-cookie"), Some("auth_flow=1"));
    assert!(raw_header(&raw, "x-upstream").is_none(), "{raw}");
    assert_eq!(raw_body(&raw), "login");
    let seen = auth.seen.lock().unwrap().last().cloned().unwrap();
    assert!(seen.starts_with("GET /api/verify HTTP/1.1"), "{seen}");
    for line in [
        "X-Forwarded-Method: GET",
        "X-Forwarded-Uri: /echo?x=1",
        "X-Forwarded-Host: localhost",
        "X-Forwarded-For: 127.0.0.1",
        "X-Forwarded-Proto: https",
    ] {
        assert!(has_line(&seen, line), "{line} in {seen}");
    }
    let r = s.h2("/echo", &[]);
    assert_eq!(r.status, 302);
    assert_eq!(r.body_str(), "login");
    // A session: forwarded, with the listed fields copied (and only those); the client's own
    // Remote-User never reaches the upstream.
    let (status, raw) = s.h1(
        "/echo",
        "Cookie: a=1; session=good\r\nRemote-User: mallory\r\n",
    );
    assert_eq!(status, 200, "{raw}");
    let body = raw_body(&raw);
    assert!(has_line(body, "Remote-User: alice"), "{body}");
    assert!(has_line(body, "Remote-Groups: admins"), "{body}");
    assert!(has_line(body, "Remote-Email: alice@example.com"), "{body}");
    assert!(
        !body.contains("mallory") && !body.contains("X-Other"),
        "{body}"
    );
    let seen = auth.seen.lock().unwrap().last().cloned().unwrap();
    assert!(has_line(&seen, "cookie: a=1; session=good"), "{seen}");
    let r = s.h2(
        "/echo",
        &[("authorization", "Bearer ok"), ("remote-user", "mallory")],
    );
    assert_eq!(r.status, 200);
    let body = r.body_str();
    assert!(has_line(&body, "remote-user: alice"), "{body}");
    assert!(!body.contains("mallory"), "{body}");
    // The auth service down: 503, never a pass.
    assert_eq!(s.h1("/dead/echo", "Cookie: session=good\r\n").0, 503);
    assert_eq!(
        s.h2("/dead/echo", &[("cookie", "session=good")]).status,
        503
    );
}

/// Issue 31, item 14: an auth service that does not answer in time is logged as that, not as
/// "no backend available", and the request fails closed.
#[test]
fn a_forward_auth_timeout_is_logged_as_one() {
    let slow = script_origin(|_| Scripted::new(200).delay(std::time::Duration::from_secs(5)));
    let up = upstream(&[]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\nupstream = \"app\"\n\
             forward_auth = {{ upstream = \"auth\", path = \"/verify\", timeout = \"300ms\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.auth]\nservers = [\"{}\"]\n",
            up.addr, slow.addr
        ),
    );
    assert_eq!(s.h1("/echo", "").0, 503);
    assert_eq!(s.h2("/echo", &[]).status, 503);
    let log = s.v.proc.log_text();
    assert!(log.contains("did not answer within its timeout"), "{log}");
    assert!(!log.contains("no backend available"), "{log}");
}

/// `send_headers`, `remove_headers` and `trust_forward_header` (issue 38): which client
/// fields the auth service sees, which nobody sees, and whose X-Forwarded-* it gets; over
/// HTTP/1.1 and HTTP/2.
#[test]
fn forward_auth_field_control() {
    let auth = auth_server();
    let up = upstream(&[]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath_regex = \"^/some(/.*)$\"\nrewrite = \"{{re.1}}\"\nupstream = \"app\"\n\
             forward_auth = {{ upstream = \"authelia\", copy_headers = [\"Remote-User\"], \
             send_headers = [\"Authorization\", \"X-Tenant\", \"X-Api-*\"], remove_headers = [\"X-Internal-*\"] }}\n\
             [[routes]]\npath_regex = \"^/all(/.*)$\"\nrewrite = \"{{re.1}}\"\nupstream = \"app\"\n\
             forward_auth = {{ upstream = \"authelia\", send_headers = \"all\", trust_forward_header = true }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.authelia]\nservers = [\"{}\"]\n",
            up.addr, auth.addr
        ),
    );
    let last_seen = || auth.seen.lock().unwrap().last().cloned().unwrap();
    let fields = "Authorization: Bearer ok\r\nCookie: session=none\r\nX-Tenant: t1\r\n\
                  X-Api-Key: k1\r\nX-Other: o1\r\nX-Internal-Role: admin\r\n\
                  X-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Host: spoofed.example\r\n";
    let (status, raw) = s.h1("/some/echo", fields);
    assert_eq!(status, 200, "{raw}");
    let seen = last_seen();
    for line in ["authorization: Bearer ok", "x-tenant: t1", "x-api-key: k1"] {
        assert!(has_line(&seen, line), "{line} in {seen}");
    }
    for absent in [
        "session=none",
        "X-Other",
        "X-Internal",
        "203.0.113.7",
        "spoofed",
    ] {
        assert!(
            !seen.contains(absent),
            "{absent} sent to the auth service: {seen}"
        );
    }
    assert!(has_line(&seen, "X-Forwarded-For: 127.0.0.1"), "{seen}");
    // The removed field reaches the upstream neither; the others are forwarded as usual.
    let body = raw_body(&raw);
    assert!(!body.contains("X-Internal-Role"), "{body}");
    assert!(has_line(body, "X-Other: o1"), "{body}");
    let r = s.h2(
        "/some/echo",
        &[
            ("authorization", "Bearer ok"),
            ("x-internal-role", "admin"),
            ("cookie", "a=1"),
        ],
    );
    assert_eq!(r.status, 200);
    let seen = last_seen();
    assert!(has_line(&seen, "authorization: Bearer ok"), "{seen}");
    assert!(
        !seen.contains("x-internal") && !seen.contains("a=1"),
        "{seen}"
    );
    assert!(
        !r.body_str().contains("x-internal-role"),
        "{}",
        r.body_str()
    );

    // "all", trusting the client's X-Forwarded-*: every field but Host and hop-by-hop ones;
    // the For chain extended; one Cookie line from HTTP/2's split cookies.
    let (status, raw) = s.h1("/all/echo", fields);
    assert_eq!(status, 200, "{raw}");
    let seen = last_seen();
    for line in [
        "Cookie: session=none",
        "X-Other: o1",
        "X-Internal-Role: admin",
        "X-Forwarded-For: 203.0.113.7, 127.0.0.1",
        "X-Forwarded-Host: spoofed.example",
    ] {
        assert!(has_line(&seen, line), "{line} in {seen}");
    }
    assert_eq!(
        seen.matches("\r\nHost:").count() + seen.matches("\r\nhost:").count(),
        1,
        "{seen}"
    );
    let r = s.h2(
        "/all/echo",
        &[
            ("authorization", "Bearer ok"),
            ("cookie", "a=1"),
            ("cookie", "b=2"),
        ],
    );
    assert_eq!(r.status, 200);
    let seen = last_seen();
    assert!(has_line(&seen, "Cookie: a=1; b=2"), "{seen}");
}
