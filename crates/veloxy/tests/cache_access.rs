//! Access rules combined with `cache` (issue 31, item 1): a stored answer is never served to a
//! client the route's rules would refuse, over HTTP/1.1, HTTP/2 and HTTP/3. forward_auth runs
//! before a hit is served (and fails closed while the auth service is down), its copied fields
//! reach the origin on the cache fill, and basic_auth and allow/deny hold on hits too.

use veloxy_testkit::*;

#[derive(Clone, Copy, Debug)]
enum Proto {
    H1,
    H2,
    H3,
}

const ALL: [Proto; 3] = [Proto::H1, Proto::H2, Proto::H3];

/// (status, body, X-Cache) of a GET of `path` with `headers`.
fn get(s: &Site, p: Proto, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    match p {
        Proto::H1 => {
            let lines: String = headers
                .iter()
                .map(|(n, v)| format!("{n}: {v}\r\n"))
                .collect();
            let (status, raw) = s.h1(path, &lines);
            let cache = raw_header(&raw, "x-cache").unwrap_or("").to_owned();
            (status, raw_body(&raw).to_owned(), cache)
        }
        Proto::H2 | Proto::H3 => {
            let r = match p {
                Proto::H2 => s.h2(path, headers),
                _ => s.h3(path, headers).expect("HTTP/3 request"),
            };
            let cache = r.header("x-cache").unwrap_or("").to_owned();
            (r.status, r.body_str(), cache)
        }
    }
}

/// An origin whose answers are cacheable for a minute (`public`: also those to requests with
/// Authorization) and name the user the proxy vouched
/// for (forward_auth's `Remote-User`).
fn origin() -> ScriptOrigin {
    script_origin(|r| {
        let user = r.header("remote-user").unwrap_or("nobody");
        Scripted::ok(format!("secret for {user}")).header("cache-control", "public, max-age=60")
    })
}

const CACHES: &str = "[caches.main]\nmemory = \"16MiB\"\nmax_object = \"1MiB\"\n";

#[test]
fn forward_auth_runs_before_every_cache_hit_and_the_fill_carries_its_fields() {
    let o = origin();
    // A stoppable auth service: a session cookie passes as alice, anything else gets 401.
    let auth = script_origin(|r| {
        if r.header("cookie")
            .is_some_and(|c| c.contains("session=good"))
        {
            Scripted::new(200).header("Remote-User", "alice")
        } else {
            Scripted::new(401)
                .header("www-authenticate", "Bearer")
                .with_body("login")
        }
    });
    let s = Site::start_with(
        "",
        "http3 = true\n",
        "",
        &format!(
            "{CACHES}[[routes]]\nupstream = \"app\"\ncache = {{ store = \"main\" }}\n\
             forward_auth = {{ upstream = \"auth\", path = \"/verify\", copy_headers = [\"Remote-User\"], timeout = \"2s\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n\
             [upstreams.auth]\nservers = [\"{}\"]\nretries = 0\n",
            o.addr, auth.addr
        ),
    );
    let good = [("cookie", "session=good")];
    for p in ALL {
        let path = format!("/doc-{p:?}");
        let first = get(&s, p, &path, &good);
        assert_eq!(first.0, 200, "{p:?}");
        // The fill reached the origin with the field forward_auth copied.
        assert_eq!(first.1, "secret for alice", "{p:?}");
        assert_eq!(first.2, "MISS", "{p:?}");
        let hit = get(&s, p, &path, &good);
        assert_eq!(
            (hit.0, hit.1.as_str(), hit.2.as_str()),
            (200, "secret for alice", "HIT"),
            "{p:?}"
        );
        // No session: the auth service's refusal, never the stored answer.
        let (status, body, _) = get(&s, p, &path, &[]);
        assert_eq!((status, body.as_str()), (401, "login"), "{p:?}");
    }
    let origin_hits = o.hits();
    assert_eq!(origin_hits, 3, "one fill per protocol's path");
    // The auth service down: every request fails closed with 503, hits included.
    auth.stop();
    for p in ALL {
        let (status, body, _) = get(&s, p, &format!("/doc-{p:?}"), &good);
        assert_eq!(status, 503, "{p:?}: {body}");
        assert!(!body.contains("secret"), "{p:?}: {body}");
    }
    assert_eq!(o.hits(), origin_hits);
}

#[test]
fn basic_auth_and_allow_deny_hold_on_cache_hits() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("htpasswd");
    if !htpasswd(&users, "alice", "wonder", &["-c", "-B", "-C", "5"]) {
        skip("Apache's htpasswd (apache2-utils) is not installed");
        return;
    }
    let o = origin();
    let routes = |deny: &str| {
        format!(
            "{CACHES}[[routes]]\npath = \"/basic/\"\nupstream = \"app\"\ncache = {{ store = \"main\" }}\n\
             basic_auth = {{ realm = \"r\", users_file = \"{}\" }}\n\
             [[routes]]\nupstream = \"app\"\ncache = {{ store = \"main\" }}\n{deny}\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            users.display(),
            o.addr
        )
    };
    let s = Site::start_with("", "http3 = true\n", "", &routes(""));
    let ok = basic_credentials("alice", "wonder");
    let wrong = basic_credentials("alice", "nope");
    let unknown = basic_credentials("mallory", "wonder");
    for p in ALL {
        let path = format!("/basic/{p:?}");
        assert_eq!(get(&s, p, &path, &[("authorization", &ok)]).0, 200, "{p:?}");
        let hit = get(&s, p, &path, &[("authorization", &ok)]);
        assert_eq!((hit.0, hit.2.as_str()), (200, "HIT"), "{p:?}");
        for creds in [&wrong, &unknown] {
            let (status, body, _) = get(&s, p, &path, &[("authorization", creds)]);
            assert_eq!(status, 401, "{p:?}: {body}");
            assert!(!body.contains("secret"), "{p:?}: {body}");
        }
        assert_eq!(get(&s, p, &path, &[]).0, 401, "{p:?}");
        // Filled for the open route, stored for the allow/deny step below.
        assert_eq!(get(&s, p, &format!("/open/{p:?}"), &[]).0, 200, "{p:?}");
    }
    // The stores survive a reload that denies this client: the hits are refused too.
    reload_with(
        &s.v,
        &reload_config(&s, &routes("deny = [\"127.0.0.1\"]")),
        "reloaded",
    );
    for p in ALL {
        let (status, body, _) = get(&s, p, &format!("/open/{p:?}"), &[]);
        assert_eq!(status, 403, "{p:?}: {body}");
        assert!(!body.contains("secret"), "{p:?}: {body}");
    }
}

/// The site's config with its routes replaced by `routes` (the listeners, and the ports they
/// bound, are kept: a reload keeps a listener whose address is unchanged).
fn reload_config(s: &Site, routes: &str) -> String {
    let current = std::fs::read_to_string(s.v.dir.path().join("veloxy.toml")).unwrap();
    let (head, _) = current.split_once("[caches.main]").unwrap();
    format!("{head}{routes}")
}

/// Issue 31, item 2: the port a request names reaches the upstream in Host (and
/// X-Forwarded-Host), so it is in the default cache key: a request naming another port cannot
/// poison the entry everyone else gets; and only digits are a port (400 otherwise).
#[test]
fn the_port_is_in_the_cache_key_and_only_digits_are_a_port() {
    let o = script_origin(|r| {
        let host = r.header("host").unwrap_or("");
        Scripted::ok(format!("links to {host}")).header("cache-control", "max-age=60")
    });
    let s = Site::start_with(
        "",
        "http3 = true\n",
        "",
        &format!(
            "{CACHES}[[routes]]\nupstream = \"app\"\ncache = {{ store = \"main\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            o.addr
        ),
    );
    // HTTP/1.1: the attacker's request first, then everyone else's.
    let h1 = |host: &str| {
        s.h1_raw(&format!(
            "GET /h1 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        ))
    };
    let (status, raw) = h1("localhost:1234");
    assert_eq!((status, raw_body(&raw)), (200, "links to localhost:1234"));
    let (_, raw) = h1("localhost");
    assert_eq!(raw_body(&raw), "links to localhost", "poisoned: {raw}");
    assert_eq!(raw_header(&raw, "x-cache"), Some("MISS"));
    let (_, raw) = h1("localhost");
    assert_eq!(raw_header(&raw, "x-cache"), Some("HIT"));
    // HTTP/2 and HTTP/3: the port in `:authority`.
    let r = s.h2_req(h2_get("localhost:1234", "/h2", true), None);
    assert_eq!(r.body_str(), "links to localhost:1234");
    let r = s.h2_req(h2_get("localhost", "/h2", true), None);
    assert_eq!(r.body_str(), "links to localhost", "poisoned over HTTP/2");
    let r = s.h3_req(h3_get("localhost:1234", "/h3")).unwrap();
    assert_eq!(r.body_str(), "links to localhost:1234");
    let r = s.h3_req(h3_get("localhost", "/h3")).unwrap();
    assert_eq!(r.body_str(), "links to localhost", "poisoned over HTTP/3");
    // Anything but digits after the colon is refused before it reaches the cache or the
    // upstream.
    let before = o.hits();
    for host in [
        "localhost:'-alert(1)-'",
        "localhost:80x",
        "localhost:123456",
        "local'host",
        "localhost:8080:1",
        "[::1]x",
    ] {
        let (status, raw) = h1(host);
        assert_eq!(status, 400, "{host}: {raw}");
    }
    assert_eq!(o.hits(), before);
}
