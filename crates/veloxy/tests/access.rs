//! Access control (issue 13, first part): `allow` / `deny` on routes, and the real client
//! address behind `trusted_proxies`, shown through templates, `allow` and `rate_limit`, over
//! HTTP/1.1 and HTTP/2 with TLS.

use std::io::Write;
use std::net::TcpStream;

use veloxy_testkit::*;

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n")
}

#[test]
fn allow_and_deny_lists() {
    let s = Site::start(
        "",
        "",
        "[[routes]]\npath = \"/office/\"\nallow = [\"10.0.0.0/8\", \"2001:db8::/32\"]\nrespond = { body = \"office\" }\n\
         [[routes]]\npath = \"/open/\"\ndeny = [\"127.0.0.2\"]\nrespond = { body = \"open\" }\n\
         [[routes]]\npath = \"/local/\"\nallow = [\"127.0.0.0/8\"]\ndeny = [\"127.0.0.3\"]\nrespond = { body = \"local\" }\n",
    );
    // HTTPS, HTTP/1.1 and HTTP/2, from 127.0.0.1.
    assert_eq!(s.h1("/office/x", "").0, 403);
    assert_eq!(s.h2("/office/x", &[]).status, 403);
    assert_eq!(raw_body(&s.h1("/open/x", "").1), "open");
    assert_eq!(s.h2("/local/x", &[]).body_str(), "local");
    // Other loopback sources on the plain listener: deny wins over allow.
    let plain = s.addr("plain");
    assert_eq!(
        request_from("127.0.0.2", plain, get("/open/x", "").as_bytes()).0,
        403
    );
    assert_eq!(
        request_from("127.0.0.3", plain, get("/local/x", "").as_bytes()).0,
        403
    );
    assert_eq!(
        request_from("127.0.0.4", plain, get("/local/x", "").as_bytes()).0,
        200
    );
}

#[test]
fn real_client_ip_from_trusted_proxies_only() {
    let up = upstream(&[]);
    let s = Site::start(
        "trusted_proxies = [\"127.0.0.1\"]",
        "",
        &format!(
            "[[routes]]\npath = \"/who\"\nrespond = {{ body = \"who\" }}\n\
             response_headers = {{ add = {{ \"X-Client\" = \"{{client_ip}}\" }} }}\n\
             [[routes]]\npath = \"/lan/\"\nallow = [\"203.0.113.0/24\"]\nrespond = {{ body = \"lan\" }}\n\
             [[routes]]\npath = \"/limited/\"\nrespond = {{ body = \"ok\" }}\n\
             rate_limit = {{ rate = \"1/m\", burst = 1 }}\n\
             [[routes]]\nupstream = \"app\"\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            up.addr
        ),
    );
    let xff = |ip: &str| format!("X-Forwarded-For: 198.51.100.9, {ip}\r\n");
    // From the trusted proxy (127.0.0.1): the rightmost untrusted address.
    let (_, raw) = s.h1("/who", &xff("203.0.113.7"));
    assert_eq!(raw_header(&raw, "x-client"), Some("203.0.113.7"));
    let r = s.h2("/who", &[("x-forwarded-for", "203.0.113.8")]);
    assert_eq!(r.header("x-client"), Some("203.0.113.8"));
    assert_eq!(s.h1("/lan/x", &xff("203.0.113.7")).0, 200);
    assert_eq!(s.h1("/lan/x", &xff("192.0.2.1")).0, 403);
    // rate_limit keys on it: one bucket per real client.
    assert_eq!(s.h1("/limited/x", &xff("192.0.2.10")).0, 200);
    assert_eq!(s.h1("/limited/x", &xff("192.0.2.10")).0, 429);
    assert_eq!(s.h1("/limited/x", &xff("192.0.2.11")).0, 200);
    // The X-Forwarded-For sent upstream is the one received plus the immediate peer (the
    // trusted proxy), not the client twice (issue 32, item 11), over HTTP/1.1 and HTTP/2.
    let (_, raw) = s.h1("/echo", &xff("203.0.113.7"));
    assert!(
        raw_body(&raw).contains("X-Forwarded-For: 198.51.100.9, 203.0.113.7, 127.0.0.1\r\n"),
        "{raw}"
    );
    let r = s.h2("/echo", &[("x-forwarded-for", "198.51.100.9, 203.0.113.8")]);
    assert!(
        r.body_str()
            .to_ascii_lowercase()
            .contains("x-forwarded-for: 198.51.100.9, 203.0.113.8, 127.0.0.1\r\n"),
        "{}",
        r.body_str()
    );
    // From an untrusted peer (127.0.0.2) the header is ignored: a spoofed address gains
    // nothing.
    let plain = s.addr("plain");
    let (_, raw) = request_from(
        "127.0.0.2",
        plain,
        get("/who", &xff("203.0.113.7")).as_bytes(),
    );
    assert_eq!(raw_header(&raw, "x-client"), Some("127.0.0.2"));
    assert_eq!(
        request_from(
            "127.0.0.2",
            plain,
            get("/lan/x", &xff("203.0.113.7")).as_bytes()
        )
        .0,
        403
    );
}

#[test]
fn basic_auth_with_an_apache_htpasswd_file() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("htpasswd");
    if !htpasswd(&users, "alice", "wonder land", &["-c", "-B"]) {
        skip("Apache's htpasswd (apache2-utils) is not installed");
        return;
    }
    assert!(htpasswd(&users, "bob", "builder", &["-m"]));
    let up = upstream(&[]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath = \"/admin/\"\nupstream = \"app\"\n\
             basic_auth = {{ realm = \"admin\", users_file = \"{}\" }}\n\
             response_headers = {{ add = {{ \"X-Area\" = \"admin\" }} }}\n\
             [[routes]]\nupstream = \"app\"\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            users.display(),
            up.addr
        ),
    );
    let auth = basic_credentials;
    // No credentials: 401 with the challenge (and the route's response rules).
    let (status, raw) = s.h1("/admin/x", "");
    assert_eq!(status, 401, "{raw}");
    assert!(raw.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{raw}");
    assert_eq!(
        raw_header(&raw, "www-authenticate"),
        Some("Basic realm=\"admin\", charset=\"UTF-8\"")
    );
    assert_eq!(raw_header(&raw, "x-area"), Some("admin"));
    // bcrypt and apr1 users pass, over HTTP/1.1 and HTTP/2; a wrong password does not.
    let ok = auth("alice", "wonder land");
    assert_eq!(s.h1("/admin/x", &format!("Authorization: {ok}\r\n")).0, 200);
    let r = s.h2("/admin/x", &[("authorization", &ok)]);
    assert_eq!(r.status, 200);
    assert!(r.header("x-upstream").is_some());
    let bob = auth("bob", "builder");
    assert_eq!(s.h2("/admin/x", &[("authorization", &bob)]).status, 200);
    let bad = auth("alice", "wrong");
    assert_eq!(
        s.h1("/admin/x", &format!("Authorization: {bad}\r\n")).0,
        401
    );
    assert_eq!(s.h2("/admin/x", &[("authorization", &bad)]).status, 401);
    // The open route needs nothing.
    assert_eq!(s.h1("/open", "").0, 200);
    // Guessing is limited per client address: 429 once the failed checks run out, while a
    // verified credential (remembered) still passes.
    let statuses: Vec<u16> = (0..25)
        .map(|i| {
            let guess = auth("alice", &format!("guess{i}"));
            s.h1("/admin/x", &format!("Authorization: {guess}\r\n")).0
        })
        .collect();
    assert!(statuses.contains(&429), "{statuses:?}");
    assert_eq!(s.h1("/admin/x", &format!("Authorization: {ok}\r\n")).0, 200);
}

#[test]
fn cors_preflights_and_response_fields() {
    let up = upstream(&[]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath = \"/api/\"\nupstream = \"app\"\n\
             cors = {{ origins = [\"https://app.example.com\"], methods = [\"GET\", \"POST\"], headers = [\"Content-Type\", \"Authorization\"], expose_headers = [\"X-Total\"], credentials = true, max_age = \"1h\" }}\n\
             [[routes]]\npath = \"/public/\"\nupstream = \"app\"\ncors = {{ origins = [\"*\"] }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            up.addr
        ),
    );
    let preflight =
        "OPTIONS /api/items HTTP/1.1\r\nHost: localhost\r\nOrigin: https://app.example.com\r\n\
                     Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n";
    let (status, raw) = s.h1_raw(preflight);
    assert_eq!(status, 204, "{raw}");
    assert_eq!(
        raw_header(&raw, "access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        raw_header(&raw, "access-control-allow-methods"),
        Some("GET, POST")
    );
    assert_eq!(
        raw_header(&raw, "access-control-allow-headers"),
        Some("Content-Type, Authorization")
    );
    assert_eq!(raw_header(&raw, "access-control-max-age"), Some("3600"));
    assert_eq!(
        raw_header(&raw, "access-control-allow-credentials"),
        Some("true")
    );
    assert!(
        raw_header(&raw, "x-upstream").is_none(),
        "answered by veloxy: {raw}"
    );
    // HTTP/2 preflight, and an origin that is not allowed: no CORS fields.
    let mut req = h2_get("localhost", "/api/items", true);
    *req.method_mut() = http::Method::OPTIONS;
    req.headers_mut()
        .insert("origin", "https://evil.example".parse().unwrap());
    req.headers_mut()
        .insert("access-control-request-method", "POST".parse().unwrap());
    let r = s.h2_req(req, None);
    assert_eq!(r.status, 204);
    assert!(r.header("access-control-allow-origin").is_none());
    // Actual requests: fields for an allowed origin only.
    let (_, raw) = s.h1("/api/echo", "Origin: https://app.example.com\r\n");
    assert_eq!(
        raw_header(&raw, "access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        raw_header(&raw, "access-control-expose-headers"),
        Some("X-Total")
    );
    assert_eq!(raw_header(&raw, "vary"), Some("Origin"));
    let r = s.h2("/api/echo", &[("origin", "https://evil.example")]);
    assert_eq!(r.status, 200);
    assert!(r.header("access-control-allow-origin").is_none());
    let r = s.h2("/public/echo", &[("origin", "https://any.example")]);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    // Issue 31, item 14: on a route whose answers depend on Origin, every answer says so (a
    // cache in front must not serve one origin's answer to another): refused origins, no
    // Origin at all, refused preflights; a plain `*` route's answers do not vary.
    assert_eq!(r.header("vary"), None);
    let r = s.h2("/api/echo", &[("origin", "https://evil.example")]);
    assert_eq!(r.header("vary"), Some("Origin"));
    assert_eq!(raw_header(&s.h1("/api/echo", "").1, "vary"), Some("Origin"));
    let (status, raw) = s.h1_raw(
        "OPTIONS /api/items HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\n\
         Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((status, raw_header(&raw, "vary")), (204, Some("Origin")));
    assert!(raw_header(&s.h1("/public/echo", "").1, "vary").is_none());
}

#[test]
fn proxy_protocol_v1_and_v2_from_trusted_peers_only() {
    let s = Site::start(
        "trusted_proxies = [\"127.0.0.1\"]",
        "proxy_protocol = true",
        "[[routes]]\nrespond = { body = \"ok\" }\n\
         response_headers = { add = { \"X-Client\" = \"{client_ip}\" } }\n",
    );
    let plain = s.addr("plain");
    let req = get("/", "");
    // v1 from the trusted balancer: the client is the header's source.
    let v1 = format!("PROXY TCP4 192.0.2.7 10.0.0.1 56324 80\r\n{req}");
    let (status, raw) = request_from("127.0.0.1", plain, v1.as_bytes());
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw_header(&raw, "x-client"), Some("192.0.2.7"));
    // v2 (binary), IPv6 source.
    let mut v2 = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    v2.extend_from_slice(&[0x21, 0x21, 0, 36]);
    let src: std::net::Ipv6Addr = "2001:db8::9".parse().unwrap();
    v2.extend_from_slice(&src.octets());
    v2.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    v2.extend_from_slice(&[0x30, 0x39, 0, 80]);
    v2.extend_from_slice(req.as_bytes());
    let mut c = TcpStream::connect(plain).unwrap();
    c.write_all(&v2).unwrap();
    let (status, raw) = read_to_close(&mut c);
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw_header(&raw, "x-client"), Some("2001:db8::9"));
    // An untrusted peer, and a connection without a header: closed, unanswered.
    assert_eq!(
        request_from("127.0.0.2", plain, v1.as_bytes()),
        (0, String::new())
    );
    assert_eq!(
        request_from("127.0.0.1", plain, req.as_bytes()),
        (0, String::new())
    );
}
