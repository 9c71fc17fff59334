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
