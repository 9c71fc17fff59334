//! The HTTP response cache (RFC 9111), through real processes: hits and misses with the
//! `X-Cache` status header, what is stored (freshness, `no-store`, `private`, `Authorization`,
//! `Set-Cookie`, `max_object`), `Vary`, conditional and range requests answered from the
//! cache, request collapsing across workers, purging (admin endpoint and `PURGE`) and the
//! metrics. The tests that need time to pass (expiry, revalidation, stale-*) are in
//! cache_stale.rs. Each test scripts its origin with [`script_origin`].

use veloxy_testkit::*;

#[path = "support/cache.rs"]
mod support;
use support::*;

use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use Proto::{H1, H2};

fn miss_then_hit(p: Proto) {
    let o = script_origin(|_| Scripted::ok("hello").header("cache-control", "max-age=60"));
    let v = start(&o, "");
    let first = fetch(&v, p, "GET", "/page", &[]);
    assert_eq!(summary(&first), (200, "hello".into(), Some("MISS")));
    let second = fetch(&v, p, "GET", "/page", &[]);
    assert_eq!(summary(&second), (200, "hello".into(), Some("HIT")));
    assert_eq!(
        second.header("x-origin-seq"),
        Some("1"),
        "the stored answer"
    );
    let age = second.header("age").expect("Age on a hit");
    let age: u64 = age.parse().expect("Age in integer seconds");
    assert!(age <= 60, "Age {age}");
    assert_eq!(o.hits(), 1);
    // Another URI is another key.
    let other = fetch(&v, p, "GET", "/page?v=2", &[]);
    assert_eq!(summary(&other), (200, "hello".into(), Some("MISS")));
    assert_eq!(o.hits(), 2);
}

#[test]
fn miss_then_hit_with_age_over_http1() {
    miss_then_hit(H1);
}

#[test]
fn miss_then_hit_with_age_over_http2() {
    miss_then_hit(H2);
}

#[test]
fn methods_not_cached_bypass_and_reach_the_origin_every_time() {
    let o = script_origin(|r| {
        Scripted::ok(format!("{} {}", r.method, r.seq)).header("cache-control", "max-age=60")
    });
    let v = start(&o, "");
    for (i, p) in [H1, H2, H1].into_iter().enumerate() {
        let r = fetch_body(&v, p, "POST", "/form", &[], b"a=1");
        assert_eq!(
            summary(&r),
            (200, format!("POST {}", i + 1), Some("BYPASS"))
        );
    }
    assert_eq!(o.hits(), 3);
    assert_eq!(o.request(3).unwrap().body, b"a=1");
    // The POSTs stored nothing for GET.
    assert_eq!(x_cache(&get1(&v, "/form", &[])), Some("MISS"));
    assert_eq!(x_cache(&get1(&v, "/form", &[])), Some("HIT"));
    assert_eq!(o.hits(), 4);
}

#[test]
fn cache_status_header_can_be_renamed_or_turned_off() {
    let o = script_origin(|_| Scripted::ok("x").header("cache-control", "max-age=60"));
    let off = start_with(
        &o,
        Setup {
            caches: "cache_status_header = \"\"",
            ..Setup::default()
        },
    );
    for p in [H1, H2] {
        let r = fetch(&off, p, "GET", "/", &[]);
        assert_eq!(r.status, 200);
        assert_eq!(x_cache(&r), None, "{p:?}: {:?}", r.headers);
    }
    assert_eq!(o.hits(), 1, "still cached, just not reported");

    let renamed = start_with(
        &o,
        Setup {
            caches: "cache_status_header = \"X-Veloxy-Cache\"",
            ..Setup::default()
        },
    );
    let r = get1(&renamed, "/", &[]);
    assert_eq!(
        (r.header("x-veloxy-cache"), x_cache(&r)),
        (Some("MISS"), None)
    );
    let r = get1(&renamed, "/", &[]);
    assert_eq!(r.header("x-veloxy-cache"), Some("HIT"));
}

/// Gets `path` twice over HTTP/1.1 and returns the two cache statuses.
fn twice(v: &Veloxy, path: &str, headers: &[(&str, &str)]) -> [String; 2] {
    [0, 1].map(|_| {
        let r = get1(v, path, headers);
        assert_eq!(r.status, 200, "{path}: {}", r.head);
        x_cache(&r).unwrap_or("(none)").to_string()
    })
}

#[test]
fn freshness_from_s_maxage_max_age_and_expires() {
    let o = script_origin(|r| {
        let now = SystemTime::now();
        let cc = match r.path() {
            "/s-maxage-wins" => "max-age=0, s-maxage=60",
            "/s-maxage-zero" => "max-age=60, s-maxage=0",
            _ => "",
        };
        let mut s = Scripted::ok(r.path().to_string()).header("date", http_date(now));
        if !cc.is_empty() {
            s = s.header("cache-control", cc);
        }
        match r.path() {
            "/expires-future" => s.header("expires", http_date(now + Duration::from_secs(60))),
            "/expires-past" => s.header("expires", http_date(now - Duration::from_secs(60))),
            _ => s,
        }
    });
    let v = start(&o, "");
    assert_eq!(twice(&v, "/s-maxage-wins", &[]), ["MISS", "HIT"]);
    assert_eq!(twice(&v, "/s-maxage-zero", &[]), ["MISS", "BYPASS"]);
    assert_eq!(twice(&v, "/expires-future", &[]), ["MISS", "HIT"]);
    assert_eq!(twice(&v, "/expires-past", &[]), ["MISS", "BYPASS"]);
    assert_eq!(o.hits(), 6);
}

#[test]
fn responses_without_freshness_are_not_stored_when_default_ttl_is_zero() {
    let o = script_origin(|r| Scripted::ok(format!("n{}", r.seq)));
    // Not stored: a hit-for-pass sends the next ones straight upstream.
    let v = start(&o, "default_ttl = \"0s\"");
    assert_eq!(twice(&v, "/plain", &[]), ["MISS", "BYPASS"]);
    assert_eq!(o.hits(), 2);
    // The default is the same.
    let v = start(&o, "");
    assert_eq!(twice(&v, "/plain", &[]), ["MISS", "BYPASS"]);
    assert_eq!(o.hits(), 4);
}

#[test]
fn default_ttl_stores_responses_without_freshness_but_not_no_store_ones() {
    let o = script_origin(|r| match r.path() {
        "/no-store" => Scripted::ok("secret").header("cache-control", "no-store"),
        _ => Scripted::ok("plain"),
    });
    let v = start(&o, "default_ttl = \"30s\"");
    assert_eq!(twice(&v, "/plain", &[]), ["MISS", "HIT"]);
    assert_eq!(twice(&v, "/no-store", &[]), ["MISS", "BYPASS"]);
    assert_eq!(o.hits(), 3);
}

#[test]
fn no_store_and_private_responses_are_never_stored() {
    let o = script_origin(|r| {
        let cc = match r.path() {
            "/no-store" => "no-store",
            "/no-store-max-age" => "max-age=60, no-store",
            _ => "private, max-age=60",
        };
        Scripted::ok("x").header("cache-control", cc)
    });
    let v = start(&o, "default_ttl = \"30s\"");
    for path in ["/no-store", "/no-store-max-age", "/private"] {
        let statuses = twice(&v, path, &[]);
        assert!(
            !statuses.contains(&"HIT".to_string()),
            "{path}: {statuses:?}"
        );
    }
    assert_eq!(o.hits(), 6);
}

#[test]
fn no_cache_response_is_stored_but_revalidated_every_time() {
    let o = script_origin(|r| {
        let base = |s: Scripted| {
            s.header("etag", "\"v1\"")
                .header("cache-control", "no-cache")
        };
        if r.header("if-none-match") == Some("\"v1\"") {
            base(Scripted::not_modified())
        } else {
            base(Scripted::ok("payload"))
        }
    });
    let v = start(&o, "");
    assert_eq!(
        summary(&get1(&v, "/doc", &[])),
        (200, "payload".into(), Some("MISS"))
    );
    for n in 2..=3 {
        let r = get1(&v, "/doc", &[]);
        assert_eq!(summary(&r), (200, "payload".into(), Some("REVALIDATED")));
        assert_eq!(r.header("etag"), Some("\"v1\""));
        let seen = o.request(n).expect("the origin was asked");
        assert_eq!(seen.header("if-none-match"), Some("\"v1\""), "{seen:?}");
    }
    assert_eq!(o.hits(), 3);
}

#[test]
fn authorization_requests_are_stored_only_when_public_or_s_maxage() {
    let o = script_origin(|r| {
        let cc = match r.path() {
            "/public" => "public, max-age=60",
            "/s-maxage" => "s-maxage=60",
            _ => "max-age=60",
        };
        Scripted::ok("for you").header("cache-control", cc)
    });
    let v = start(&o, "");
    let auth = [("Authorization", "Bearer token")];
    assert_eq!(twice(&v, "/plain", &auth), ["MISS", "MISS"]);
    assert_eq!(twice(&v, "/public", &auth), ["MISS", "HIT"]);
    assert_eq!(twice(&v, "/s-maxage", &auth), ["MISS", "HIT"]);
    assert_eq!(o.hits(), 4);
}

#[test]
fn set_cookie_responses_are_stored_only_when_public_or_s_maxage() {
    let o = script_origin(|r| {
        let cc = match r.path() {
            "/public" => "public, max-age=60",
            "/s-maxage" => "s-maxage=60",
            _ => "max-age=60",
        };
        Scripted::ok("hi")
            .header("cache-control", cc)
            .header("set-cookie", format!("session={}", r.seq))
    });
    let v = start(&o, "");
    // Not stored: the key passes straight upstream for a while (BYPASS).
    assert_eq!(twice(&v, "/plain", &[]), ["MISS", "BYPASS"]);
    assert_eq!(twice(&v, "/public", &[]), ["MISS", "HIT"]);
    assert_eq!(twice(&v, "/s-maxage", &[]), ["MISS", "HIT"]);
    assert_eq!(o.hits(), 4);
}

/// Issue 31, item 5 (and issue 32, item 4): an answer a caching route fetches but does not
/// store reaches its client whole, Set-Cookie and Server included, and its key then goes
/// straight upstream (hit-for-pass); a stored answer gives its cookies only to the client
/// whose request fetched it, and keeps the upstream's Server on every hit.
fn uncacheable_answers_pass_whole_and_stored_ones_keep_their_server(p: Proto) {
    let o = script_origin(|r| {
        let cc = match r.path() {
            "/login" => "no-store",
            "/mine" => "private, max-age=60",
            "/shared" => "public, max-age=60",
            _ => "",
        };
        let mut s = Scripted::ok(format!("seq {}", r.seq))
            .header("server", "origin-srv")
            .header("set-cookie", format!("csrf={}", r.seq));
        if !cc.is_empty() {
            s = s.header("cache-control", cc);
        }
        s
    });
    let v = start(&o, "");
    for path in ["/login", "/mine", "/plain"] {
        let first = fetch(&v, p, "GET", path, &[]);
        assert_eq!(x_cache(&first), Some("MISS"), "{path}");
        assert!(
            first
                .header("set-cookie")
                .is_some_and(|c| c.starts_with("csrf=")),
            "{path}: {:?}",
            first.headers
        );
        assert_eq!(first.header("server"), Some("origin-srv"), "{path}");
        let second = fetch(&v, p, "GET", path, &[]);
        assert_eq!(x_cache(&second), Some("BYPASS"), "{path}: a hit-for-pass");
        assert!(second.header("set-cookie").is_some(), "{path}");
        assert_eq!(second.header("server"), Some("origin-srv"), "{path}");
    }
    let first = fetch(&v, p, "GET", "/shared", &[]);
    assert_eq!(x_cache(&first), Some("MISS"));
    assert!(
        first.header("set-cookie").is_some(),
        "the fetching client's cookie"
    );
    let hit = fetch(&v, p, "GET", "/shared", &[]);
    assert_eq!(x_cache(&hit), Some("HIT"));
    assert_eq!(
        hit.header("set-cookie"),
        None,
        "a stored copy has no cookie"
    );
    assert_eq!(hit.header("server"), Some("origin-srv"));
    let servers = hit
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("server"))
        .count();
    assert_eq!(servers, 1);
}

#[test]
fn uncacheable_answers_pass_whole_and_stored_ones_keep_their_server_over_http1() {
    uncacheable_answers_pass_whole_and_stored_ones_keep_their_server(H1);
}

#[test]
fn uncacheable_answers_pass_whole_and_stored_ones_keep_their_server_over_http2() {
    uncacheable_answers_pass_whole_and_stored_ones_keep_their_server(H2);
}

fn vary_keeps_one_variant_per_accept_encoding(p: Proto) {
    let o = script_origin(|r| {
        let enc = r.header("accept-encoding").unwrap_or("none").to_string();
        Scripted::ok(format!("variant {enc}"))
            .header("cache-control", "max-age=60")
            .header("vary", "Accept-Encoding")
    });
    let v = start(&o, "");
    for round in ["MISS", "HIT"] {
        for enc in ["gzip", "br"] {
            let r = fetch(&v, p, "GET", "/v", &[("Accept-Encoding", enc)]);
            assert_eq!(summary(&r), (200, format!("variant {enc}"), Some(round)));
        }
    }
    assert_eq!(o.hits(), 2);
}

#[test]
fn vary_keeps_one_variant_per_accept_encoding_over_http1() {
    vary_keeps_one_variant_per_accept_encoding(H1);
}

#[test]
fn vary_keeps_one_variant_per_accept_encoding_over_http2() {
    vary_keeps_one_variant_per_accept_encoding(H2);
}

/// Issue 31, item 9: a Vary field sent on several lines selects the variant of its combined
/// value (RFC 9111 section 4.1), not of its first line.
fn vary_compares_the_combined_value_of_a_repeated_field(p: Proto) {
    let o = script_origin(|r| {
        let langs: Vec<&str> = r
            .headers
            .iter()
            .filter(|(n, _)| n == "x-lang")
            .map(|(_, v)| v.as_str())
            .collect();
        Scripted::ok(format!("variant {}", langs.join(", ")))
            .header("cache-control", "max-age=60")
            .header("vary", "X-Lang")
    });
    let v = start(&o, "");
    let two = [("X-Lang", "en"), ("X-Lang", "fr")];
    assert_eq!(
        summary(&fetch(&v, p, "GET", "/l", &two)),
        (200, "variant en, fr".into(), Some("MISS"))
    );
    let one = fetch(&v, p, "GET", "/l", &[("X-Lang", "en")]);
    assert_eq!(summary(&one), (200, "variant en".into(), Some("MISS")));
    assert_eq!(summary(&fetch(&v, p, "GET", "/l", &two)).2, Some("HIT"));
    assert_eq!(
        summary(&fetch(&v, p, "GET", "/l", &[("X-Lang", "en, fr")])).1,
        "variant en, fr"
    );
}

#[test]
fn vary_compares_the_combined_value_of_a_repeated_field_over_http1() {
    vary_compares_the_combined_value_of_a_repeated_field(H1);
}

#[test]
fn vary_compares_the_combined_value_of_a_repeated_field_over_http2() {
    vary_compares_the_combined_value_of_a_repeated_field(H2);
}

#[test]
fn client_if_none_match_is_answered_from_the_cache() {
    let o = script_origin(|_| {
        Scripted::ok("tagged")
            .header("etag", "\"v1\"")
            .header("cache-control", "max-age=60")
    });
    let v = start(&o, "");
    assert_eq!(x_cache(&get1(&v, "/t", &[])), Some("MISS"));
    for p in [H1, H2] {
        let r = fetch(&v, p, "GET", "/t", &[("If-None-Match", "\"v1\"")]);
        assert_eq!(r.status, 304, "{p:?}");
        assert!(r.body.is_empty(), "{p:?}: a 304 has no body");
        assert_eq!(r.header("etag"), Some("\"v1\""), "{p:?}");
        let r = fetch(&v, p, "GET", "/t", &[("If-None-Match", "\"other\"")]);
        assert_eq!(summary(&r), (200, "tagged".into(), Some("HIT")), "{p:?}");
    }
    assert_eq!(o.hits(), 1, "the origin is not asked");
}

#[test]
fn range_request_is_served_from_the_cached_object() {
    let body: Vec<u8> = (0..10000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let stored = body.clone();
    let o =
        script_origin(move |_| Scripted::ok(stored.clone()).header("cache-control", "max-age=60"));
    let v = start(&o, "");
    let full = get1(&v, "/blob", &[]);
    assert_eq!((full.body.len(), x_cache(&full)), (10000, Some("MISS")));
    for p in [H1, H2] {
        let r = fetch(&v, p, "GET", "/blob", &[("Range", "bytes=100-199")]);
        assert_eq!(r.status, 206, "{p:?}");
        assert_eq!(
            r.header("content-range"),
            Some("bytes 100-199/10000"),
            "{p:?}"
        );
        assert_eq!(r.body, &body[100..200], "{p:?}");
    }
    assert_eq!(o.hits(), 1, "the origin is not asked again");
}

#[test]
fn head_after_get_is_a_hit_without_body() {
    let o = script_origin(|_| Scripted::ok("0123456789").header("cache-control", "max-age=60"));
    let v = start(&o, "");
    let host = format!("Host: {}\r\n", v.addr);
    let mut c = Client::connect(v.addr);
    c.send(format!("GET /h HTTP/1.1\r\n{host}\r\n").as_bytes());
    assert_eq!(x_cache(&c.read_response(false)), Some("MISS"));
    c.send(format!("HEAD /h HTTP/1.1\r\n{host}\r\n").as_bytes());
    let head = c.read_response(true);
    assert_eq!((head.status, x_cache(&head)), (200, Some("HIT")));
    assert_eq!(head.header("content-length"), Some("10"), "{}", head.head);
    // No body followed the HEAD answer: the next answer on the connection parses.
    c.send(format!("GET /h HTTP/1.1\r\n{host}Connection: close\r\n\r\n").as_bytes());
    assert_eq!(
        summary(&c.read_response(false)),
        (200, "0123456789".into(), Some("HIT"))
    );
    let r = fetch(&v, H2, "HEAD", "/h", &[]);
    assert_eq!((r.status, x_cache(&r)), (200, Some("HIT")));
    assert!(r.body.is_empty());
    assert_eq!(o.hits(), 1);
}

#[test]
fn objects_larger_than_max_object_are_served_in_full_but_not_stored() {
    const BIG: usize = 2 * 1024 * 1024 + 7;
    let big: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
    let sent = big.clone();
    let o = script_origin(move |r| {
        let body = if r.path() == "/big" {
            sent.clone()
        } else {
            b"small".to_vec()
        };
        Scripted::ok(body).header("cache-control", "max-age=60")
    });
    let v = start(&o, "");
    for p in [H1, H2, H1] {
        let r = fetch(&v, p, "GET", "/big", &[]);
        assert_eq!((r.status, r.body.len()), (200, BIG), "{p:?}");
        assert!(r.body == big, "{p:?}: the body arrives intact");
        assert_ne!(x_cache(&r), Some("HIT"), "{p:?}");
    }
    assert_eq!(o.hits(), 3);
    assert_eq!(twice(&v, "/small", &[]), ["MISS", "HIT"]);
}

#[test]
fn concurrent_misses_collapse_into_one_origin_request_across_workers() {
    // 1000 HTTP/2 streams (8 connections of 125, under the 128-stream limit) and 50 HTTP/1.1
    // clients ask for one cold key while the origin takes 300 ms to answer.
    const H2_CONNS: usize = 8;
    const STREAMS: usize = 125;
    const H1_CLIENTS: usize = 50;
    let o = script_origin(|_| {
        Scripted::ok("collapsed")
            .header("cache-control", "max-age=60")
            .delay(Duration::from_millis(300))
    });
    let v = start_with(
        &o,
        Setup {
            workers: 2,
            ..Setup::default()
        },
    );
    let authority = v.addr.to_string();
    let go = Arc::new(Barrier::new(H1_CLIENTS + 1));
    // Connected before the threads start, so that every thread reaches the barrier.
    let clients: Vec<Client> = (0..H1_CLIENTS).map(|_| Client::connect(v.addr)).collect();
    let h1: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let (go, host) = (go.clone(), authority.clone());
            std::thread::spawn(move || {
                go.wait();
                c.send(
                    format!("GET /hot HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                );
                c.read_response(false)
            })
        })
        .collect();
    let h2 = runtime().block_on(async {
        tokio::time::timeout(WAIT, async {
            let mut conns = Vec::new();
            for _ in 0..H2_CONNS {
                conns.push(h2_connect(v.addr, None).await);
            }
            go.wait();
            let mut streams = Vec::new();
            for c in &conns {
                for _ in 0..STREAMS {
                    let (mut c, a) = (c.clone(), authority.clone());
                    streams.push(tokio::spawn(async move {
                        h2_send(&mut c, h2_get(&a, "/hot", false), None).await
                    }));
                }
            }
            let mut replies = Vec::new();
            for s in streams {
                replies.push(h2_response(s.await.unwrap().expect("HTTP/2 response")));
            }
            replies
        })
        .await
        .expect("every stream answered in time")
    });
    let h1: Vec<Response> = h1.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(h2.len() + h1.len(), H2_CONNS * STREAMS + H1_CLIENTS);
    for r in h2.iter().chain(&h1) {
        assert_eq!((r.status, r.body_str().as_str()), (200, "collapsed"));
        assert_eq!(r.header("x-origin-seq"), Some("1"));
    }
    assert_eq!(o.hits(), 1, "one origin request for all of them");
}

/// The `purged` count of an admin purge answer.
fn purged(r: &Response) -> u64 {
    assert_eq!(r.status, 200, "{}{}", r.head, r.body_str());
    let json: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
    json["purged"].as_u64().unwrap_or_else(|| panic!("{json}"))
}

/// Requests name the host `cache.test` (no port), so `{method}{scheme}://{authority}{uri}` renders
/// `GEThttp://cache.test/PATH`.
const HOST: [(&str, &str); 1] = [("Host", "cache.test")];

/// The cache status of a GET for `path` with Host `cache.test`.
fn status_of(v: &Veloxy, path: &str) -> String {
    x_cache(&get1(v, path, &HOST))
        .unwrap_or("(none)")
        .to_string()
}

fn warm(v: &Veloxy, paths: &[&str]) {
    for path in paths {
        assert_eq!(status_of(v, path), "MISS", "{path}");
        assert_eq!(status_of(v, path), "HIT", "{path}");
    }
}

fn tagged_origin() -> ScriptOrigin {
    script_origin(|r| {
        let s = Scripted::ok(r.path().to_string()).header("cache-control", "max-age=60");
        match r.path() {
            "/t/1" => s.header("surrogate-key", "t1 t2"),
            "/t/2" => s.header("surrogate-key", "t2"),
            _ if r.method == "PURGE" => Scripted::new(405),
            _ => s,
        }
    })
}

#[test]
fn admin_purges_by_key_restricted_to_a_cache() {
    let o = tagged_origin();
    let v = start_with(
        &o,
        Setup {
            caches: "[caches.other]\nmemory = \"4MiB\"\nmax_object = \"1MiB\"",
            ..Setup::default()
        },
    );
    warm(&v, &["/a", "/b"]);
    let r = admin(
        &v,
        "POST",
        "/cache/purge?key=GEThttp://cache.test/a&cache=other",
    );
    assert_eq!(purged(&r), 0, "not in that cache");
    assert_eq!(status_of(&v, "/a"), "HIT");
    assert_eq!(
        purged(&admin(
            &v,
            "POST",
            "/cache/purge?key=GEThttp://cache.test/a"
        )),
        1
    );
    assert_eq!(status_of(&v, "/a"), "MISS");
    assert_eq!(status_of(&v, "/b"), "HIT");
    let r = admin(
        &v,
        "POST",
        "/cache/purge?key=GEThttp://cache.test/b&cache=main",
    );
    assert_eq!(purged(&r), 1);
    assert_eq!(status_of(&v, "/b"), "MISS");
}

#[test]
fn admin_purges_by_prefix() {
    let o = tagged_origin();
    let v = start(&o, "");
    warm(&v, &["/p/1", "/p/2", "/q"]);
    let r = admin(&v, "POST", "/cache/purge?prefix=GEThttp://cache.test/p/");
    assert_eq!(purged(&r), 2);
    assert_eq!(status_of(&v, "/q"), "HIT");
    assert_eq!(status_of(&v, "/p/1"), "MISS");
    assert_eq!(status_of(&v, "/p/2"), "MISS");
    assert_eq!(
        purged(&admin(
            &v,
            "POST",
            "/cache/purge?prefix=GEThttp://cache.test"
        )),
        3
    );
    assert_eq!(status_of(&v, "/q"), "MISS");
}

#[test]
fn admin_purges_by_surrogate_key_tag() {
    let o = tagged_origin();
    let v = start(&o, "");
    warm(&v, &["/t/1", "/t/2", "/none"]);
    assert_eq!(purged(&admin(&v, "POST", "/cache/purge?tag=t1")), 1);
    assert_eq!(status_of(&v, "/t/2"), "HIT");
    assert_eq!(status_of(&v, "/none"), "HIT");
    assert_eq!(purged(&admin(&v, "POST", "/cache/purge?tag=t2")), 1);
    assert_eq!(status_of(&v, "/t/1"), "MISS");
    assert_eq!(status_of(&v, "/t/2"), "MISS");
    assert_eq!(status_of(&v, "/none"), "HIT");
}

#[test]
fn purge_method_works_only_on_routes_that_allow_the_client() {
    let o = tagged_origin();
    let v = start_with(
        &o,
        Setup {
            routes: "[[routes]]\npath = \"/open/\"\nupstream = \"app\"\n\
                     cache = { store = \"main\", purge = [\"127.0.0.0/8\"] }",
            ..Setup::default()
        },
    );
    warm(&v, &["/open/a", "/closed/a"]);
    let r = fetch(&v, H1, "PURGE", "/open/a", &HOST);
    assert_eq!(r.status, 200, "{}{}", r.head, r.body_str());
    assert_eq!(status_of(&v, "/open/a"), "MISS");
    let r = fetch(&v, H1, "PURGE", "/closed/a", &HOST);
    assert_ne!(r.status, 200, "no purge on this route: {}", r.head);
    assert_eq!(status_of(&v, "/closed/a"), "HIT");
}

/// The sum of every sample of metric `name` (all label sets).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn metrics_count_hits_and_misses() {
    let o = script_origin(|_| Scripted::ok("m").header("cache-control", "max-age=60"));
    let v = start(&o, "");
    assert_eq!(twice(&v, "/m", &[]), ["MISS", "HIT"]);
    let mut text = String::new();
    let counted = eventually(Duration::from_secs(5), || {
        text = admin(&v, "GET", "/metrics").body_str();
        metric_sum(&text, "veloxy_cache_hits_total") > 0.0
            && metric_sum(&text, "veloxy_cache_misses_total") > 0.0
    });
    assert!(counted, "{text}");
}
