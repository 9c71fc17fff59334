//! The short-config vocabulary (issue 33): `[rule_sets.NAME]` taken with `use`, and routes
//! listing several listeners, hosts and paths. A list is the same as one route per
//! combination; a set's keys apply where the route sets none itself.

use veloxy_testkit::*;

fn get_host(addr: std::net::SocketAddr, host: &str, path: &str) -> Response {
    request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
}

#[test]
fn lists_and_rule_sets_behave_as_routes_written_out() {
    let v = veloxy(
        "[server]\nworkers = 1\n\
         [listeners.a]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [listeners.b]\naddr = \"127.0.0.1:0\"\n\
         [listeners.c]\naddr = \"127.0.0.1:0\"\n\
         [rule_sets.secure]\n\
         response_headers = { set = { \"X-Frame-Options\" = \"DENY\" } }\n\
         max_body_bytes = 10\n\
         [rule_sets.other]\n\
         response_headers = { set = { \"X-Other\" = \"1\" } }\n\
         max_body_bytes = 5\n\
         deny = [\"127.0.0.1\"]\n\
         [[routes]]\nlistener = [\"a\", \"b\"]\nhost = [\"example.com\", \"*.example.org\"]\n\
         path = [\"/api/\", \"/v2/\"]\nuse = [\"secure\"]\n\
         respond = { body = \"listed\" }\n\
         [[routes]]\npath = \"/denied/\"\nuse = [\"secure\", \"other\"]\n\
         respond = { body = \"denied\" }\n\
         [[routes]]\npath_exact = [\"/x\", \"/y\"]\nuse = [\"secure\"]\n\
         response_headers = { set = { \"X-Own\" = \"1\" } }\n\
         respond = { body = \"exact\" }\n\
         [[routes]]\npath = \"/p/\"\npath_exact = \"/p\"\nrespond = { body = \"union\" }\n\
         [[routes]]\nrespond = { status = 404, body = \"fallback\" }\n",
    );
    let a = logged_addr(&v, "listening listener=a addr=");
    let b = logged_addr(&v, "listening listener=b addr=");
    let c = logged_addr(&v, "listening listener=c addr=");
    // Every combination of listener (a, b), host and path answers from the listed route,
    // with the set's header.
    for addr in [a, b] {
        for host in ["example.com", "www.example.org"] {
            for path in ["/api/x", "/v2/y"] {
                let r = get_host(addr, host, path);
                assert_eq!(r.body_str(), "listed", "{host}{path}");
                assert_eq!(r.header("x-frame-options"), Some("DENY"));
            }
        }
    }
    // Two sets: the second fills what the route and the first left unset (deny: 403).
    let r = get_host(a, "t", "/denied/");
    assert_eq!(r.status, 403, "{}", r.body_str());
    // Not on listener c, not for another host or path.
    assert_eq!(get_host(c, "example.com", "/api/x").body_str(), "fallback");
    assert_eq!(get_host(a, "example.net", "/api/x").body_str(), "fallback");
    assert_eq!(get_host(a, "example.com", "/v3/x").body_str(), "fallback");
    // path_exact lists, on every listener; the route's own response_headers replace the set's.
    for addr in [a, b, c] {
        for path in ["/x", "/y"] {
            let r = get_host(addr, "any.test", path);
            assert_eq!(r.body_str(), "exact");
            assert_eq!(r.header("x-own"), Some("1"));
            assert_eq!(
                r.header("x-frame-options"),
                None,
                "the route's own key wins whole"
            );
        }
        assert_eq!(get_host(addr, "any.test", "/x/more").body_str(), "fallback");
    }
    // path with path_exact: a union (the exact name and everything under the prefix).
    assert_eq!(get_host(a, "t", "/p").body_str(), "union");
    assert_eq!(get_host(a, "t", "/p/q").body_str(), "union");
    assert_eq!(get_host(a, "t", "/pq").body_str(), "fallback");
    // The set's body cap applies to the exact routes too.
    let r = request(
        a,
        "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
    );
    assert_eq!(r.status, 413);
    // The same over HTTP/2 (h2c on listener a).
    let h2 = |host: &str, path: &str| {
        http2::runtime().block_on(async {
            let mut c = h2_connect(a, None).await;
            let req = http::Request::builder()
                .uri(format!("http://{host}{path}"))
                .body(())
                .unwrap();
            h2_send(&mut c, req, None).await.unwrap()
        })
    };
    for (host, path) in [("example.com", "/api/x"), ("www.example.org", "/v2/y")] {
        let r = h2(host, path);
        assert_eq!(r.body_str(), "listed", "h2 {host}{path}");
        assert_eq!(r.header("x-frame-options"), Some("DENY"));
    }
    assert_eq!(h2("t", "/denied/").status, 403);
    let r = h2("any.test", "/y");
    assert_eq!(
        (r.body_str().as_str(), r.header("x-own")),
        ("exact", Some("1"))
    );
    assert_eq!(r.header("x-frame-options"), None);
    assert_eq!(h2("t", "/p").body_str(), "union");
    assert_eq!(h2("t", "/p/q").body_str(), "union");
    assert_eq!(h2("example.net", "/api/x").body_str(), "fallback");
}
