//! More of the response cache: compression of cached answers on a `compress = true` route,
//! `ignore_cache_control`, a custom `key` and `methods`, invalidation by unsafe requests,
//! targeted fields (`CDN-Cache-Control`), `Age` parsing, `immutable`, chunked upstream
//! answers.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use veloxy_testkit::*;

#[path = "support/cache.rs"]
mod support;
use support::*;

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("a gzip body");
    out
}

#[test]
fn a_compressing_route_serves_hits_in_the_client_s_coding() {
    let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    let sent = text.clone();
    let o = script_origin(move |_| {
        Scripted::ok(sent.clone())
            .header("content-type", "text/plain")
            .header("cache-control", "max-age=60")
    });
    let v = veloxy(&cache_config(&o, &Setup::default()).replace(
        "[[routes]]\nupstream = \"app\"\n",
        "[[routes]]\nupstream = \"app\"\ncompress = true\n",
    ));
    for (i, p) in [Proto::H1, Proto::H2, Proto::H1].into_iter().enumerate() {
        let r = fetch(&v, p, "GET", "/t", &[("accept-encoding", "gzip")]);
        assert_eq!(r.status, 200, "{p:?}");
        assert_eq!(x_cache(&r), Some(if i == 0 { "MISS" } else { "HIT" }));
        assert_eq!(r.header("content-encoding"), Some("gzip"), "{p:?}");
        assert!(r.body.len() < text.len() / 2, "{p:?}: compressed");
        assert_eq!(gunzip(&r.body), text.as_bytes(), "{p:?}");
        assert!(r
            .header("vary")
            .is_some_and(|v| v.eq_ignore_ascii_case("accept-encoding")));
    }
    // A client that takes no coding gets the stored body as it is.
    let r = get1(&v, "/t", &[]);
    assert_eq!(
        (x_cache(&r), r.header("content-encoding")),
        (Some("HIT"), None)
    );
    assert_eq!(r.body_str(), text);
    assert_eq!(o.hits(), 1);
}

#[test]
fn ignore_cache_control_stores_by_default_ttl_and_a_custom_key_merges_urls() {
    let o = script_origin(|r| {
        Scripted::ok(format!("v{}", r.seq)).header("cache-control", "no-store, private")
    });
    // The key leaves out the query: /p?a=1 and /p?a=2 share one object.
    let v = start(
        &o,
        "default_ttl = \"60s\", ignore_cache_control = true, key = \"{host}{path}\", methods = [\"GET\"]",
    );
    assert_eq!(
        summary(&get1(&v, "/p?a=1", &[])),
        (200, "v1".into(), Some("MISS"))
    );
    assert_eq!(
        summary(&get1(&v, "/p?a=2", &[])),
        (200, "v1".into(), Some("HIT"))
    );
    // HEAD is not in methods: it bypasses the cache.
    let r = fetch(&v, Proto::H1, "HEAD", "/p?a=1", &[]);
    assert_eq!(x_cache(&r), Some("BYPASS"));
    assert_eq!(o.hits(), 2);
}

#[test]
fn a_large_hit_is_byte_exact_whole_and_in_ranges_over_both_protocols() {
    // 300 KB of a pattern that never repeats at a power of two: a wrong offset shows.
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let sent = body.clone();
    let o = script_origin(move |_| {
        Scripted::ok(sent.clone())
            .header("content-type", "application/octet-stream")
            .header("cache-control", "max-age=60")
    });
    let v = start(&o, "");
    for (i, p) in [Proto::H1, Proto::H1, Proto::H2].into_iter().enumerate() {
        let r = fetch(&v, p, "GET", "/big", &[]);
        assert_eq!(
            x_cache(&r),
            Some(if i == 0 { "MISS" } else { "HIT" }),
            "{p:?}"
        );
        assert!(r.body == body, "{p:?}: the whole body, byte for byte");
        for (from, to) in [(0, 99), (40_000, 140_000), (299_000, 299_999)] {
            let range = format!("bytes={from}-{to}");
            let r = fetch(&v, p, "GET", "/big", &[("range", &range)]);
            assert_eq!(r.status, 206, "{p:?} {range}");
            assert!(r.body == body[from..=to], "{p:?} {range}: byte for byte");
        }
    }
    let r = fetch(&v, Proto::H1, "HEAD", "/big", &[]);
    assert_eq!(r.header("content-length"), Some("300000"));
    assert!(r.body.is_empty());
    assert_eq!(o.hits(), 1);
}

/// GETs `paths` (with `accept-language: en` and `fr`, the origin's Vary) and returns the
/// cache status of each answer, in order.
fn statuses(v: &Veloxy, paths: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for path in paths {
        for lang in ["en", "fr"] {
            let r = get1(v, path, &[("accept-language", lang)]);
            assert_eq!(r.status, 200, "{path} {lang}");
            out.push(format!("{path} {lang} {}", x_cache(&r).unwrap_or("-")));
        }
    }
    out
}

#[test]
fn an_unsafe_request_invalidates_its_uri_and_same_origin_locations_in_every_variant() {
    let o = script_origin(|r| match (r.method.as_str(), r.path()) {
        ("GET", _) => Scripted::ok(format!("v{}", r.seq))
            .header("cache-control", "max-age=60")
            .header("vary", "Accept-Language"),
        (_, "/fail") => Scripted::new(404).with_body("no"),
        _ => Scripted::new(201)
            .with_body("made")
            .header("location", "/a/other")
            .header("content-location", "http://elsewhere.test/a/third"),
    });
    let v = start(&o, "");
    let paths = ["/a/post", "/a/other", "/a/third", "/fail"];
    let all = |s: &str| -> Vec<String> {
        paths
            .iter()
            .flat_map(|p| ["en", "fr"].map(|l| format!("{p} {l} {s}")))
            .collect()
    };
    assert_eq!(statuses(&v, &paths), all("MISS"));
    assert_eq!(statuses(&v, &paths), all("HIT"));
    // A failed unsafe request (404) invalidates nothing.
    let r = fetch_body(&v, Proto::H1, "POST", "/fail", &[], b"x");
    assert_eq!(r.status, 404);
    assert_eq!(statuses(&v, &paths), all("HIT"));
    for (p, method) in [
        (Proto::H1, "POST"),
        (Proto::H2, "DELETE"),
        (Proto::H2, "PATCH"),
    ] {
        let r = fetch_body(&v, p, method, "/a/post", &[], b"x");
        assert_eq!(r.status, 201, "{p:?} {method}");
        let after = statuses(&v, &paths);
        let expect: Vec<String> = paths
            .iter()
            .flat_map(|path| {
                // The request's URI and its Location, each variant; not the Content-Location
                // of another origin, nor an unrelated URI.
                let s = if matches!(*path, "/a/post" | "/a/other") {
                    "MISS"
                } else {
                    "HIT"
                };
                ["en", "fr"].map(|l| format!("{path} {l} {s}"))
            })
            .collect();
        assert_eq!(after, expect, "{p:?} {method}");
        assert_eq!(statuses(&v, &paths), all("HIT"), "{p:?} {method}");
    }
}

/// The cache status of two GETs of `path` in a row.
fn twice(v: &Veloxy, path: &str) -> [String; 2] {
    [0, 1].map(|_| {
        let r = get1(v, path, &[]);
        assert_eq!(r.status, 200, "{path}");
        x_cache(&r).unwrap_or("-").to_owned()
    })
}

#[test]
fn cdn_cache_control_and_the_configured_targeted_field_replace_cache_control() {
    let o = script_origin(|r| {
        let s = Scripted::ok(format!("v{}", r.seq));
        match r.path() {
            // The targeted field decides, whatever Cache-Control and Expires say.
            "/cdn-fresh" => s
                .header("cache-control", "no-store")
                .header("expires", "Thu, 01 Jan 1970 00:00:00 GMT")
                .header("cdn-cache-control", "max-age=60"),
            "/cdn-no-store" => s
                .header("cache-control", "max-age=60")
                .header("cdn-cache-control", "no-store"),
            "/cdn-private" => s
                .header("cache-control", "max-age=60")
                .header("cdn-cache-control", "private"),
            "/cdn-short" => s
                .header("cache-control", "max-age=60")
                .header("cdn-cache-control", "max-age=0"),
            // Not a valid Structured Field: ignored, Cache-Control decides.
            "/cdn-invalid" => s
                .header("cache-control", "max-age=60")
                .header("cdn-cache-control", "max-age=\"60\""),
            // The configured field comes before CDN-Cache-Control.
            "/own" => s
                .header("cache-control", "no-store")
                .header("cdn-cache-control", "no-store")
                .header("veloxy-cache-control", "max-age=60"),
            _ => s.header("cache-control", "max-age=60"),
        }
    });
    let hit = ["MISS", "HIT"].map(String::from);
    // CDN-Cache-Control is obeyed without any setting.
    let plain = start(&o, "");
    assert_eq!(twice(&plain, "/cdn-fresh"), hit);
    let v = start_with(
        &o,
        Setup {
            caches: "targeted_cache_control = \"Veloxy-Cache-Control\"",
            ..Setup::default()
        },
    );
    assert_eq!(twice(&v, "/cdn-fresh"), hit);
    assert_eq!(twice(&v, "/cdn-invalid"), hit);
    assert_eq!(twice(&v, "/own"), hit);
    for p in ["/cdn-no-store", "/cdn-private", "/cdn-short"] {
        let [_, second] = twice(&v, p);
        assert_ne!(second, "HIT", "{p}");
    }
    // Forwarded unchanged, from the cache too.
    let r = get1(&v, "/cdn-fresh", &[]);
    assert_eq!(r.header("cdn-cache-control"), Some("max-age=60"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    // Without the setting, the own field means nothing: CDN-Cache-Control's no-store decides.
    let [_, second] = twice(&plain, "/own");
    assert_ne!(second, "HIT");
}

#[test]
fn an_age_counts_by_its_first_member_and_an_invalid_one_is_ignored() {
    let o = script_origin(|r| {
        let s = Scripted::ok(format!("v{}", r.seq)).header("cache-control", "max-age=3600");
        match r.path() {
            "/suffix" => s.header("age", "7200, 0"),
            "/twoline" => s.header("age", "7200").header("age", "0"),
            "/prefix" => s.header("age", "0, 7200"),
            "/abc" => s.header("age", "abc"),
            "/negative" => s.header("age", "-7200"),
            "/float" => s.header("age", "7200.0"),
            "/young" => s.header("age", "30"),
            _ => s,
        }
    });
    let v = start(&o, "");
    // Older than its max-age on arrival: stored stale, fetched again.
    for p in ["/suffix", "/twoline"] {
        assert_eq!(twice(&v, p), ["MISS", "MISS"], "{p}");
    }
    for p in ["/prefix", "/abc", "/negative", "/float", "/young"] {
        assert_eq!(twice(&v, p), ["MISS", "HIT"], "{p}");
    }
    let age: u64 = get1(&v, "/young", &[])
        .header("age")
        .unwrap()
        .parse()
        .unwrap();
    assert!((30..40).contains(&age), "a valid Age counts: {age}");
    let age = get1(&v, "/abc", &[]).header("age").unwrap().to_owned();
    assert!(
        age.parse::<u64>().unwrap() < 10,
        "an invalid Age counts as 0: {age}"
    );
}

#[test]
fn a_fresh_immutable_answer_serves_a_reload_but_not_a_forced_one() {
    let o = script_origin(|r| {
        let cc = if r.path() == "/imm" {
            "max-age=60, immutable"
        } else {
            "max-age=60"
        };
        Scripted::ok(format!("v{}", r.seq))
            .header("cache-control", cc)
            .header("etag", "\"e\"")
    });
    let v = start(&o, "");
    let reload = [("cache-control", "max-age=0")];
    for p in [Proto::H1, Proto::H2] {
        let path = format!("/imm?{p:?}");
        let first = fetch(&v, p, "GET", &path, &[]);
        assert_eq!(x_cache(&first), Some("MISS"));
        let r = fetch(&v, p, "GET", &path, &reload);
        assert_eq!(summary(&r), (200, first.body_str(), Some("HIT")), "{p:?}");
        let r = fetch(&v, p, "GET", &path, &[("cache-control", "no-cache")]);
        assert_ne!(
            x_cache(&r),
            Some("HIT"),
            "{p:?}: a forced reload revalidates"
        );
    }
    let hits = o.hits();
    get1(&v, "/plain", &[]);
    let r = get1(&v, "/plain", &reload);
    assert_ne!(
        x_cache(&r),
        Some("HIT"),
        "without immutable a reload revalidates"
    );
    assert_eq!(o.hits(), hits + 2);
}

/// A raw upstream answering every request on a connection with `head` and a chunked body
/// `hello world` (two chunks); counts the requests.
fn chunked_origin(head: &'static str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let addr = tcp_origin(move |mut s| {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        loop {
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                counter.fetch_add(1, Ordering::SeqCst);
                let reply = format!(
                    "HTTP/1.1 200 OK\r\n{head}Transfer-Encoding: chunked\r\n\r\n\
                     5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
                );
                if s.write_all(reply.as_bytes()).is_err() {
                    return;
                }
            }
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
    });
    (addr, hits)
}

#[test]
fn a_chunked_upstream_answer_is_stored_de_chunked_and_served() {
    for head in [
        "Cache-Control: max-age=60\r\n",
        "Cache-Control: max-age=60\r\nContent-Length: 11\r\n",
    ] {
        let (addr, hits) = chunked_origin(head);
        let dummy = script_origin(|_| Scripted::ok(""));
        let config = cache_config(&dummy, &Setup::default())
            .replace(&dummy.addr.to_string(), &addr.to_string());
        let v = veloxy(&config);
        for (i, p) in [Proto::H1, Proto::H2, Proto::H1].into_iter().enumerate() {
            let r = fetch(&v, p, "GET", "/c", &[]);
            let want = if i == 0 { "MISS" } else { "HIT" };
            assert_eq!(
                summary(&r),
                (200, "hello world".into(), Some(want)),
                "{head:?} {p:?}"
            );
            assert_eq!(r.header("content-length"), Some("11"), "{head:?} {p:?}");
            assert_eq!(r.header("transfer-encoding"), None, "{head:?} {p:?}");
        }
        assert_eq!(hits.load(Ordering::SeqCst), 1, "{head:?}");
    }
}
