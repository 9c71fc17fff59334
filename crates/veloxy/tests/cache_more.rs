//! More of the response cache: compression of cached answers on a `compress = true` route,
//! `ignore_cache_control`, and a custom `key` and `methods`.

use std::io::Read;

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
