//! `sticky` (issue 13, part): a cookie keeps a client on its backend over HTTP/1.1 and
//! HTTP/2, survives the backend's restart, and moves off a dead backend (replaced).

use std::time::Duration;

use veloxy_testkit::*;

/// (backend name, Set-Cookie value if any) of one request with `cookie`.
fn ask(s: &Site, cookie: Option<&str>, h2: bool) -> (String, Option<String>) {
    if h2 {
        let headers: Vec<(&str, &str)> = cookie.map(|c| ("cookie", c)).into_iter().collect();
        let r = s.h2("/", &headers);
        (
            r.header("x-upstream").unwrap_or("").to_owned(),
            r.header("set-cookie").map(str::to_owned),
        )
    } else {
        let extra = cookie.map_or(String::new(), |c| format!("Cookie: {c}\r\n"));
        let (_, raw) = s.h1("/", &extra);
        (
            raw_header(&raw, "x-upstream").unwrap_or("").to_owned(),
            raw_header(&raw, "set-cookie").map(str::to_owned),
        )
    }
}

#[test]
fn sticky_cookie_keeps_survives_restart_and_moves_off_a_dead_backend() {
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let a_addr = a.addr;
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\nupstream = \"app\"\n\
             [upstreams.app]\nservers = [\"{}\", \"{}\"]\nretries = 1\n\
             sticky = {{ cookie = \"srv\", ttl = \"1h\", secure = true }}\n\
             [upstreams.app.health]\npath = \"/health\"\ninterval = \"50ms\"\ntimeout = \"100ms\"\nhealthy = 1\nunhealthy = 1\n",
            a.addr, b.addr
        ),
    );
    let (first, set) = ask(&s, None, false);
    let set = set.expect("the first answer sets the cookie");
    assert!(set.starts_with("srv="), "{set}");
    assert!(set.contains("Max-Age=3600") && set.contains("Secure") && set.contains("HttpOnly"));
    assert!(!set.contains(&a.addr.port().to_string()), "opaque: {set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    // Round robin would alternate; the cookie keeps the backend, over both protocols, and is
    // not set again.
    for i in 0..6 {
        let (name, again) = ask(&s, Some(&cookie), i % 2 == 1);
        assert_eq!(name, first);
        assert!(again.is_none());
    }
    // Pin to "a" whichever came first.
    let a_cookie = if first == "a" {
        cookie.clone()
    } else {
        let mut found = None;
        for _ in 0..4 {
            if let (n, Some(c)) = ask(&s, None, false) {
                if n == "a" {
                    found = Some(c.split(';').next().unwrap().to_owned());
                    break;
                }
            }
        }
        found.expect("round robin reaches a")
    };
    // "a" dies: once it is marked down, the cookie's requests move to "b", with a new cookie.
    drop(a);
    let moved = eventually(
        Duration::from_secs(5),
        || matches!(ask(&s, Some(&a_cookie), false), (n, Some(_)) if n == "b"),
    );
    assert!(
        moved,
        "requests moved off the dead backend with a replaced cookie"
    );
    // "a" comes back on the same address: its cookie leads to it again.
    let a2 = upstream(&["--name", "a", "--listen", &a_addr.to_string()]);
    let back = eventually(Duration::from_secs(5), || {
        ask(&s, Some(&a_cookie), true).0 == "a"
    });
    assert!(back, "the cookie survives the backend's restart");
    drop(a2);
    drop(b);
}

/// Issue 32, item 2: `ttl = "0s"` is a session cookie (no Max-Age), never `Max-Age=0`, which
/// browsers take as "delete": affinity holds.
#[test]
fn a_zero_ttl_sets_a_session_cookie() {
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\nupstream = \"app\"\n\
             [upstreams.app]\nservers = [\"{}\", \"{}\"]\n\
             sticky = {{ cookie = \"srv\", ttl = \"0s\" }}\n",
            a.addr, b.addr
        ),
    );
    for h2 in [false, true] {
        let (_, set) = ask(&s, None, h2);
        let set = set.expect("the first answer sets the cookie");
        assert!(set.starts_with("srv="), "{set}");
        assert!(!set.contains("Max-Age"), "a session cookie: {set}");
    }
}
