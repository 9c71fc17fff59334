//! Route matching (issue 12): `path_regex` with `{re.*}` captures, `methods` / `headers` /
//! `query` conditions, and the documented precedence, over HTTP/1.1 and HTTP/2 with TLS.

use veloxy_testkit::*;

/// The request line the echo upstream saw (first line of its body).
fn seen_line(body: &str) -> &str {
    body.lines().next().unwrap_or("")
}

#[test]
fn path_regex_captures_feed_the_rewrite() {
    let up = upstream(&[]);
    let s = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\npath_regex = \"^/u/(?<id>[0-9]+)$\"\nupstream = \"app\"\n\
             rewrite = \"/echo?user={{re.id}}&n={{re.1}}\"\n\
             [[routes]]\npath = \"/u/\"\nrespond = {{ body = \"prefix\" }}\n\
             [[routes]]\nupstream = \"app\"\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            up.addr
        ),
    );
    let (status, raw) = s.h1("/u/42", "");
    assert_eq!(status, 200, "{raw}");
    assert_eq!(seen_line(raw_body(&raw)), "GET /echo?user=42&n=42 HTTP/1.1");
    let r = s.h2("/u/7", &[]);
    assert_eq!(seen_line(&r.body_str()), "GET /echo?user=7&n=7 HTTP/1.1");
    // Not a number: the regex does not match, the prefix route does.
    assert_eq!(raw_body(&s.h1("/u/abc", "").1), "prefix");
    assert_eq!(s.h2("/u/42/x", &[]).body_str(), "prefix");
}

#[test]
fn conditions_and_precedence() {
    let s = Site::start(
        "",
        "",
        "[[routes]]\npath = \"/api/\"\nrespond = { body = \"plain\" }\n\
         [[routes]]\npath = \"/api/\"\nmethods = [\"POST\", \"put\"]\nrespond = { body = \"write\" }\n\
         [[routes]]\npath = \"/api/\"\nheaders = { \"X-Canary\" = \"1\" }\nrespond = { body = \"canary\" }\n\
         [[routes]]\npath = \"/api/\"\nheaders = { \"X-Canary\" = \"1\" }\nquery = { \"debug\" = \"1\" }\nrespond = { body = \"canary-debug\" }\n\
         [[routes]]\npath_regex = \"^/api/r[0-9]+$\"\nrespond = { body = \"regex-1\" }\n\
         [[routes]]\npath_regex = \"^/api/r\"\nrespond = { body = \"regex-2\" }\n\
         [[routes]]\npath_exact = \"/api/r1\"\nrespond = { body = \"exact\" }\n\
         [[routes]]\nhost = \"localhost\"\npath = \"/\"\nrespond = { body = \"host\" }\n\
         [[routes]]\npath = \"/api/v2/\"\nrespond = { body = \"longer\" }\n",
    );
    let h1 = |path: &str, headers: &str| raw_body(&s.h1(path, headers).1).to_owned();
    // Host specificity first: the exact-host route wins over every any-host route.
    let host_only = Site::start(
        "",
        "",
        "[[routes]]\npath_exact = \"/x\"\nrespond = { body = \"any-host-exact\" }\n\
         [[routes]]\nhost = \"localhost\"\nrespond = { body = \"host\" }\n",
    );
    assert_eq!(raw_body(&host_only.h1("/x", "").1), "host");
    // Then an exact path, then the first matching regex in file order, then the longest
    // prefix.
    for (path, want) in [
        ("/api/r1", "exact"),
        ("/api/r2", "regex-1"),
        ("/api/rx", "regex-2"),
        ("/api/v2/a", "longer"),
        ("/api/y", "plain"),
    ] {
        // The `host = "localhost"` route only matches Host: localhost; ask for another host.
        let raw = format!("GET {path} HTTP/1.1\r\nHost: other\r\nConnection: close\r\n\r\n");
        assert_eq!(raw_body(&s.h1_raw(&raw).1), want, "HTTP/1.1 {path}");
        let mut req = h2_get("other", path, true);
        *req.uri_mut() = format!("https://other{path}").parse().unwrap();
        assert_eq!(s.h2_req(req, None).body_str(), want, "HTTP/2 {path}");
    }
    assert_eq!(h1("/", ""), "host");
    // Among routes with the same path, more conditions first.
    let other = |extra: &str, target: &str, method: &str| {
        let raw = format!(
            "{method} {target} HTTP/1.1\r\nHost: other\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        raw_body(&s.h1_raw(&raw).1).to_owned()
    };
    assert_eq!(other("", "/api/y", "GET"), "plain");
    assert_eq!(other("", "/api/y", "POST"), "write");
    assert_eq!(
        other("", "/api/y", "PUT"),
        "write",
        "methods are case-insensitive"
    );
    assert_eq!(other("X-Canary: 1\r\n", "/api/y", "GET"), "canary");
    assert_eq!(
        other("X-Canary: 2\r\n", "/api/y", "GET"),
        "plain",
        "exact values"
    );
    assert_eq!(
        other("X-Canary: 1\r\n", "/api/y?a=b&debug=1", "GET"),
        "canary-debug"
    );
    // The same over HTTP/2.
    let mut req = h2_get("other", "/api/y?debug=1", true);
    req.headers_mut().insert("x-canary", "1".parse().unwrap());
    assert_eq!(s.h2_req(req, None).body_str(), "canary-debug");
    let mut req = h2_get("other", "/api/y", true);
    *req.method_mut() = http::Method::POST;
    assert_eq!(s.h2_req(req, Some("".into())).body_str(), "write");
}

/// A config over 1 MiB is compiled on a thread of its own (so the parse's memory can be given
/// back whole): the same routes, the same precedence and the same errors as a small one.
#[test]
fn a_large_config_is_compiled_the_same() {
    let mut routes = String::new();
    for i in 0..12_000 {
        routes.push_str(&format!(
            "[[routes]]\nhost = \"h{i}.example.test\"\npath = \"/p/\"\n\
             respond = {{ body = \"route {i} of a table padded to pass one mebibyte\" }}\n"
        ));
    }
    assert!(routes.len() > 1 << 20, "{} bytes", routes.len());
    let get = |s: &Site, host: &str, path: &str| {
        s.h1_raw(&format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        ))
    };
    let body = |s: &Site, host: &str, path: &str| raw_body(&get(s, host, path).1).to_owned();
    let s = Site::start("", "", &routes);
    assert_eq!(
        body(&s, "h11999.example.test", "/p/x"),
        "route 11999 of a table padded to pass one mebibyte"
    );
    assert_eq!(
        body(&s, "H7.Example.Test", "/p/"),
        "route 7 of a table padded to pass one mebibyte"
    );
    assert_eq!(get(&s, "h7.example.test", "/q").0, 404);
    // An error in a large config names its line as in a small one.
    let bad = format!(
        "[listeners.plain]\naddr = \"127.0.0.1:0\"\n{routes}\
         [[routes]]\npath = \"/z\"\nupstream = \"missing\"\n"
    );
    let out = check(&bad);
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    let line = bad.lines().count();
    assert!(
        text.contains(&format!(":{line}:")) && text.contains("missing"),
        "line {line} not named: {text}"
    );
}
