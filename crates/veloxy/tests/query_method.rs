//! The QUERY method (draft-ietf-httpbis-safe-method-w-body: safe, idempotent, with a body),
//! through real processes: forwarded with its body from HTTP/1.1 and HTTP/2 clients to an
//! HTTP/1 upstream and to an h2c upstream; retried like GET on a `retry_on` status and on a
//! dead backend (where a POST is not); matched by a route's `methods = ["QUERY"]`; on a cached
//! route, passed through (never stored) and kept apart from GET's stored answer.

use veloxy_testkit::*;

#[path = "support/cache.rs"]
mod support;
use support::*;

use Proto::{H1, H2};

const BODY: &[u8] = b"{\"q\":\"veloxy\",\"limit\":3}";
const JSON: (&str, &str) = ("content-type", "application/json");

/// An origin answering `METHOD BODY` (and the request's content type) to everything.
fn echo_origin() -> ScriptOrigin {
    script_origin(|r| {
        Scripted::ok(format!(
            "{} {} {}",
            r.method,
            r.header("content-type").unwrap_or("-"),
            String::from_utf8_lossy(&r.body)
        ))
        .header("cache-control", "max-age=60")
    })
}

fn plain(servers: &str, group: &str, routes: &str) -> String {
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         {routes}\n[[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [{servers}]\n{group}\n"
    )
}

fn expected(method: &str) -> String {
    format!(
        "{method} application/json {}",
        String::from_utf8_lossy(BODY)
    )
}

#[test]
fn query_is_forwarded_with_its_body_over_http1_and_http2() {
    let o = echo_origin();
    let v = veloxy(&plain(&format!("\"{}\"", o.addr), "", ""));
    for p in [H1, H2] {
        let r = fetch_body(&v, p, "QUERY", "/search?x=1", &[JSON], BODY);
        assert_eq!((r.status, r.body_str()), (200, expected("QUERY")), "{p:?}");
        let seen = o.request(o.hits()).unwrap();
        assert_eq!(
            (seen.method.as_str(), seen.target.as_str()),
            ("QUERY", "/search?x=1")
        );
        assert_eq!(seen.body, BODY, "{p:?}");
        // Framed by its length, or chunked (an HTTP/2 request need not declare a length).
        let framing = (
            seen.header("content-length"),
            seen.header("transfer-encoding"),
        );
        let len = BODY.len().to_string();
        assert!(
            framing == (Some(len.as_str()), None) || framing == (None, Some("chunked")),
            "{p:?}: a framed body: {framing:?}"
        );
    }
    // An empty QUERY from an HTTP/2 client still says its length, like an empty POST.
    let r = fetch_body(&v, H2, "QUERY", "/search", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(
        o.request(o.hits()).unwrap().header("content-length"),
        Some("0")
    );
}

#[test]
fn query_is_forwarded_with_its_body_to_an_h2c_upstream() {
    let o = echo_origin();
    // A veloxy speaking h2c on its listener, in front of the origin: the h2 upstream.
    let back = veloxy(&plain(&format!("\"{}\"", o.addr), "", ""));
    let front = veloxy(&plain(
        &format!("\"{}\"", back.addr),
        "protocol = \"h2c\"",
        "",
    ));
    for p in [H1, H2] {
        let r = fetch_body(&front, p, "QUERY", "/search", &[JSON], BODY);
        assert_eq!((r.status, r.body_str()), (200, expected("QUERY")), "{p:?}");
        let seen = o.request(o.hits()).unwrap();
        assert_eq!((seen.method.as_str(), &seen.body[..]), ("QUERY", BODY));
    }
}

/// `dead`: a port nothing listens on.
fn dead_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[test]
fn query_is_retried_like_get_on_a_503_and_on_a_dead_backend() {
    let busy = script_origin(|_| Scripted::new(503).with_body("busy"));
    let o = echo_origin();
    let v = veloxy(&plain(
        &format!("\"{}\", \"{}\"", busy.addr, o.addr),
        "retries = 1\nretry_on = [503]",
        "",
    ));
    // Round robin sends some of these to the busy backend first: every one is retried there.
    for p in [H1, H2, H1, H2] {
        let r = fetch_body(&v, p, "QUERY", "/q", &[JSON], BODY);
        assert_eq!((r.status, r.body_str()), (200, expected("QUERY")), "{p:?}");
    }
    assert!(busy.hits() >= 1, "the busy backend was tried");
    let seen = busy.request(1).unwrap();
    assert_eq!((seen.method.as_str(), &seen.body[..]), ("QUERY", BODY));
    assert_eq!(o.request(o.hits()).unwrap().body, BODY, "the body replayed");
    // A POST is not idempotent: its 503 is the answer.
    let statuses: Vec<u16> = (0..4)
        .map(|_| fetch_body(&v, H1, "POST", "/q", &[JSON], BODY).status)
        .collect();
    assert!(statuses.contains(&503), "POST is not retried: {statuses:?}");

    let dead = dead_addr();
    let v = veloxy(&plain(
        &format!("\"{dead}\", \"{}\"", o.addr),
        "retries = 1",
        "",
    ));
    for p in [H1, H2, H1, H2] {
        let r = fetch_body(&v, p, "QUERY", "/q", &[JSON], BODY);
        assert_eq!((r.status, r.body_str()), (200, expected("QUERY")), "{p:?}");
    }
}

#[test]
fn routes_match_methods_query() {
    let o = echo_origin();
    let other = script_origin(|r| Scripted::ok(format!("other {}", r.method)));
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nmethods = [\"QUERY\"]\nupstream = \"q\"\n\
         [[routes]]\nupstream = \"other\"\n\
         [upstreams.q]\nservers = [\"{}\"]\n[upstreams.other]\nservers = [\"{}\"]\n",
        o.addr, other.addr
    ));
    for p in [H1, H2] {
        let r = fetch_body(&v, p, "QUERY", "/s", &[JSON], BODY);
        assert_eq!((r.status, r.body_str()), (200, expected("QUERY")), "{p:?}");
        for m in ["GET", "POST"] {
            let body: &[u8] = if m == "GET" { b"" } else { BODY };
            let r = fetch_body(&v, p, m, "/s", &[JSON], body);
            assert_eq!(r.body_str(), format!("other {m}"), "{p:?}");
        }
    }
    // Lowercase in the config is the same method.
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nmethods = [\"query\"]\nupstream = \"q\"\n\
         [[routes]]\nrespond = {{ status = 404 }}\n\
         [upstreams.q]\nservers = [\"{}\"]\n",
        o.addr
    ));
    assert_eq!(fetch_body(&v, H1, "QUERY", "/s", &[JSON], BODY).status, 200);
    assert_eq!(fetch(&v, H1, "GET", "/s", &[]).status, 404);
}

#[test]
fn a_cached_route_passes_query_through_and_keeps_it_apart_from_get() {
    let o = echo_origin();
    let v = start(&o, "");
    let get = fetch(&v, H1, "GET", "/r", &[]);
    assert_eq!(summary(&get), (200, "GET - ".into(), Some("MISS")));
    assert_eq!(x_cache(&fetch(&v, H2, "GET", "/r", &[])), Some("HIT"));
    for p in [H1, H2, H1] {
        // Never GET's stored answer, never stored itself: the origin answers each one.
        let hits = o.hits();
        let r = fetch_body(&v, p, "QUERY", "/r", &[JSON], BODY);
        assert_eq!(
            summary(&r),
            (200, expected("QUERY"), Some("BYPASS")),
            "{p:?}"
        );
        assert_eq!(o.hits(), hits + 1, "{p:?}");
    }
    // GET's entry is untouched, and no QUERY answer is served to a GET.
    let again = fetch(&v, H1, "GET", "/r", &[]);
    assert_eq!(summary(&again), (200, "GET - ".into(), Some("HIT")));
    assert_eq!(again.header("x-origin-seq"), Some("1"));
    // A QUERY to a URI not yet cached stores nothing for a later GET either.
    let r = fetch_body(&v, H1, "QUERY", "/fresh", &[JSON], BODY);
    assert_eq!(x_cache(&r), Some("BYPASS"));
    let g = fetch(&v, H1, "GET", "/fresh", &[]);
    assert_eq!(summary(&g), (200, "GET - ".into(), Some("MISS")));
}

/// A QUERY on a route caching QUERY, with its length declared (HTTP/2 clients need not).
fn query(v: &Veloxy, p: Proto, path: &str, ct: &str, body: &[u8]) -> Response {
    let len = body.len().to_string();
    let mut headers = vec![("content-type", ct)];
    if p == H2 {
        headers.push(("content-length", &len));
    }
    fetch_body(v, p, "QUERY", path, &headers, body)
}

fn query_answer(body: &[u8], ct: &str) -> String {
    format!("QUERY {ct} {}", String::from_utf8_lossy(body))
}

#[test]
fn query_answers_are_cached_per_body_and_content_type() {
    let o = echo_origin();
    let v = start(&o, "methods = [\"GET\", \"HEAD\", \"QUERY\"]");
    let json = "application/json";
    let other: &[u8] = b"{\"q\":\"other\"}";
    for p in [H1, H2] {
        let path = format!("/s/{p:?}");
        let first = query(&v, p, &path, json, BODY);
        assert_eq!(
            summary(&first),
            (200, query_answer(BODY, json), Some("MISS"))
        );
        let seq = first.header("x-origin-seq").unwrap().to_string();
        let seen = o.request(o.hits()).unwrap();
        assert_eq!(
            (seen.method.as_str(), &seen.body[..]),
            ("QUERY", BODY),
            "the fill sends the body"
        );
        // The same body (from either protocol) is the stored answer.
        for q in [H1, H2] {
            let hit = query(&v, q, &path, json, BODY);
            assert_eq!(
                summary(&hit),
                (200, query_answer(BODY, json), Some("HIT")),
                "{q:?}"
            );
            assert_eq!(hit.header("x-origin-seq"), Some(seq.as_str()));
        }
        // Another body, or the same body as another type, is another entry.
        let miss = query(&v, p, &path, json, other);
        assert_eq!(
            summary(&miss),
            (200, query_answer(other, json), Some("MISS"))
        );
        let hit = query(&v, p, &path, json, other);
        assert_eq!(summary(&hit), (200, query_answer(other, json), Some("HIT")));
        let typed = query(&v, p, &path, "text/plain", BODY);
        assert_eq!(
            summary(&typed),
            (200, query_answer(BODY, "text/plain"), Some("MISS"))
        );
        // GET never gets a QUERY's answer, and a QUERY never gets GET's.
        let get = fetch(&v, p, "GET", &path, &[]);
        assert_eq!(summary(&get), (200, "GET - ".into(), Some("MISS")));
        assert_eq!(x_cache(&fetch(&v, p, "GET", &path, &[])), Some("HIT"));
        let again = query(&v, p, &path, json, BODY);
        assert_eq!(
            summary(&again),
            (200, query_answer(BODY, json), Some("HIT"))
        );
        assert_eq!(again.header("x-origin-seq"), Some(seq.as_str()));
    }
}

#[test]
fn query_bodies_over_64_kib_and_routes_without_query_bypass_the_cache() {
    let o = echo_origin();
    let v = start(&o, "methods = [\"GET\", \"QUERY\"]");
    let big = vec![b'x'; 64 * 1024 + 1];
    for p in [H1, H2, H1] {
        let hits = o.hits();
        let r = query(&v, p, "/big", "text/plain", &big);
        assert_eq!((r.status, x_cache(&r)), (200, Some("BYPASS")), "{p:?}");
        assert_eq!(o.hits(), hits + 1);
        assert_eq!(o.request(o.hits()).unwrap().body.len(), big.len());
    }
    // At the bound it is cached.
    let edge = vec![b'y'; 64 * 1024];
    assert_eq!(
        x_cache(&query(&v, H1, "/edge", "text/plain", &edge)),
        Some("MISS")
    );
    assert_eq!(
        x_cache(&query(&v, H2, "/edge", "text/plain", &edge)),
        Some("HIT")
    );
    // An HTTP/2 QUERY that does not declare its length is not cached.
    let r = fetch_body(&v, H2, "QUERY", "/edge", &[JSON], BODY);
    assert_eq!(x_cache(&r), Some("BYPASS"));
    // A route whose cache does not name QUERY: the test above
    // (a_cached_route_passes_query_through_and_keeps_it_apart_from_get).
}

#[test]
fn a_query_answer_that_may_not_be_stored_is_answered_and_passed_after() {
    let o = script_origin(|r| {
        Scripted::ok(format!("{} {}", r.method, String::from_utf8_lossy(&r.body)))
            .header("cache-control", "no-store")
    });
    let v = start(&o, "methods = [\"QUERY\"]");
    let first = query(&v, H1, "/ns", "text/plain", b"a");
    assert_eq!(summary(&first), (200, "QUERY a".into(), Some("MISS")));
    // A hit-for-pass now: forwarded with its body, answered, stored nowhere.
    for p in [H1, H2] {
        let hits = o.hits();
        let r = query(&v, p, "/ns", "text/plain", b"a");
        assert_eq!(
            summary(&r),
            (200, "QUERY a".into(), Some("BYPASS")),
            "{p:?}"
        );
        assert_eq!(o.hits(), hits + 1);
        assert_eq!(o.request(o.hits()).unwrap().body, b"a");
    }
}
