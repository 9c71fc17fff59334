//! The HTTP response cache once time has passed: expiry, revalidation with `If-None-Match` and
//! `If-Modified-Since`, `stale-if-error` (from the response and from the route) and
//! `stale-while-revalidate`. These tests sleep: they are about a `max-age=1` running out.

use veloxy_testkit::*;

#[path = "support/cache.rs"]
mod support;
use support::*;

use std::time::{Duration, Instant};

#[test]
fn max_age_one_is_a_hit_within_the_second_and_a_miss_after() {
    let o =
        script_origin(|r| Scripted::ok(format!("v{}", r.seq)).header("cache-control", "max-age=1"));
    let v = start(&o, "");
    assert_eq!(
        summary(&get1(&v, "/", &[])),
        (200, "v1".into(), Some("MISS"))
    );
    assert_eq!(
        summary(&get1(&v, "/", &[])),
        (200, "v1".into(), Some("HIT"))
    );
    std::thread::sleep(PAST_ONE_SECOND);
    assert_eq!(
        summary(&get1(&v, "/", &[])),
        (200, "v2".into(), Some("MISS"))
    );
    assert_eq!(
        summary(&get1(&v, "/", &[])),
        (200, "v2".into(), Some("HIT"))
    );
    assert_eq!(o.hits(), 2);
}

/// A `max-age=1` response with validator header `validator`; once expired, the origin answers
/// 304 (with `x-fresh: 2` and `max-age=60`) to a request whose `conditional` header carries
/// it. Checks the conditional request, the merged answer and the hit after it.
fn expired_entry_is_revalidated(validator: (&'static str, &'static str), conditional: &str) {
    let o = script_origin(move |r| {
        if r.seq == 1 {
            Scripted::ok("original")
                .header("cache-control", "max-age=1")
                .header(validator.0, validator.1)
                .header("x-fresh", "1")
        } else {
            Scripted::not_modified()
                .header("cache-control", "max-age=60")
                .header(validator.0, validator.1)
                .header("x-fresh", "2")
        }
    });
    let v = start(&o, "");
    assert_eq!(
        summary(&get1(&v, "/doc", &[])),
        (200, "original".into(), Some("MISS"))
    );
    std::thread::sleep(PAST_ONE_SECOND);
    let r = get1(&v, "/doc", &[]);
    assert_eq!(summary(&r), (200, "original".into(), Some("REVALIDATED")));
    assert_eq!(
        r.header("x-fresh"),
        Some("2"),
        "headers updated from the 304"
    );
    let seen = o.request(2).expect("a conditional request upstream");
    assert_eq!(seen.header(conditional), Some(validator.1), "{seen:?}");
    let r = get1(&v, "/doc", &[]);
    assert_eq!(summary(&r), (200, "original".into(), Some("HIT")));
    assert_eq!(r.header("x-fresh"), Some("2"));
    assert_eq!(o.hits(), 2);
}

#[test]
fn expired_entry_is_revalidated_with_if_none_match() {
    expired_entry_is_revalidated(("etag", "\"v1\""), "if-none-match");
}

#[test]
fn expired_entry_is_revalidated_with_if_modified_since() {
    expired_entry_is_revalidated(
        ("last-modified", "Tue, 15 Nov 1994 12:45:26 GMT"),
        "if-modified-since",
    );
}

#[test]
fn stale_if_error_from_the_response_serves_stale_when_the_origin_is_down() {
    let o = script_origin(|r| {
        let cc = if r.path() == "/sie" {
            "max-age=1, stale-if-error=60"
        } else {
            "max-age=1"
        };
        Scripted::ok(format!("old {}", r.path())).header("cache-control", cc)
    });
    let v = start(&o, "");
    assert_eq!(x_cache(&get1(&v, "/sie", &[])), Some("MISS"));
    assert_eq!(x_cache(&get1(&v, "/plain", &[])), Some("MISS"));
    std::thread::sleep(PAST_ONE_SECOND);
    o.stop();
    let r = get1(&v, "/sie", &[]);
    assert_eq!(summary(&r), (200, "old /sie".into(), Some("STALE")));
    let r = get1(&v, "/plain", &[]);
    assert!(
        r.status >= 500,
        "no stale-if-error: the error is passed on: {} {}",
        r.head,
        r.body_str()
    );
}

#[test]
fn route_stale_if_error_serves_stale_when_the_origin_answers_500() {
    let o = script_origin(|r| {
        if r.seq == 1 {
            Scripted::ok("good").header("cache-control", "max-age=1")
        } else {
            Scripted::new(500).with_body("broken")
        }
    });
    let v = start(&o, "stale_if_error = \"1m\"");
    assert_eq!(
        summary(&get1(&v, "/", &[])),
        (200, "good".into(), Some("MISS"))
    );
    std::thread::sleep(PAST_ONE_SECOND);
    let r = get1(&v, "/", &[]);
    assert_eq!(summary(&r), (200, "good".into(), Some("STALE")));
    assert_eq!(o.hits(), 2, "the origin was tried");
}

#[test]
fn stale_while_revalidate_answers_at_once_and_refreshes_in_the_background() {
    let o = script_origin(|r| {
        let s = Scripted::ok(format!("v{}", r.seq))
            .header("cache-control", "max-age=1, stale-while-revalidate=30");
        if r.seq == 1 {
            s
        } else {
            s.delay(Duration::from_millis(500))
        }
    });
    let v = start(&o, "");
    assert_eq!(
        summary(&get1(&v, "/", &[])),
        (200, "v1".into(), Some("MISS"))
    );
    std::thread::sleep(PAST_ONE_SECOND);
    let t = Instant::now();
    let r = get1(&v, "/", &[]);
    let took = t.elapsed();
    assert_eq!(summary(&r), (200, "v1".into(), Some("STALE")));
    assert!(
        took < Duration::from_millis(250),
        "the stale answer does not wait for the 500 ms refresh: {took:?}"
    );
    let mut last = None;
    let refreshed = eventually(Duration::from_secs(5), || {
        let r = get1(&v, "/", &[]);
        let done = summary(&r) == (200, "v2".into(), Some("HIT"));
        last = Some(r);
        done
    });
    assert!(refreshed, "{last:?}");
    assert_eq!(o.hits(), 2, "one background refresh");
}

#[test]
fn a_304_refreshed_answer_carries_the_304_s_date_and_hits_keep_it() {
    let now = std::time::SystemTime::now();
    let first_date = http_date(now - Duration::from_secs(20));
    let refreshed_date = http_date(now - Duration::from_secs(5));
    let (d1, d2) = (first_date.clone(), refreshed_date.clone());
    // Stale on arrival (20 s old, max-age=1): the next request revalidates at once.
    let o = script_origin(move |r| {
        if r.seq == 1 {
            Scripted::ok("body")
                .header("cache-control", "max-age=1")
                .header("etag", "\"e\"")
                .header("date", d1.clone())
        } else {
            Scripted::not_modified()
                .header("cache-control", "max-age=60")
                .header("etag", "\"e\"")
                .header("date", d2.clone())
                .header("x-fresh", "2")
        }
    });
    let v = start(&o, "");
    let r = get1(&v, "/d", &[]);
    assert_eq!(x_cache(&r), Some("MISS"));
    assert_eq!(
        r.header("date"),
        Some(first_date.as_str()),
        "the origin's Date"
    );
    for (p, label) in [
        (Proto::H1, "REVALIDATED"),
        (Proto::H1, "HIT"),
        (Proto::H2, "HIT"),
    ] {
        let r = fetch(&v, p, "GET", "/d", &[]);
        assert_eq!(summary(&r), (200, "body".into(), Some(label)), "{p:?}");
        assert_eq!(
            r.header("date"),
            Some(refreshed_date.as_str()),
            "{p:?} {label}: the 304's Date"
        );
        assert_eq!(r.header("x-fresh"), Some("2"), "{p:?} {label}");
        assert_eq!(
            r.headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("date"))
                .count(),
            1
        );
        let age: u64 = r.header("age").unwrap().parse().unwrap();
        assert!(
            (5..30).contains(&age),
            "{p:?} {label}: Age counts from it: {age}"
        );
    }
    assert_eq!(o.hits(), 2);
}

#[test]
fn an_answer_without_a_date_is_dated_on_arrival_and_its_hits_keep_that_date() {
    let o = script_origin(|r| {
        Scripted::ok(format!("v{}", r.seq)).header("cache-control", "max-age=60")
    });
    let v = start(&o, "");
    let first = get1(&v, "/n", &[]);
    assert_eq!(x_cache(&first), Some("MISS"));
    let date = first.header("date").unwrap().to_owned();
    // Past the second the answer arrived in: a hit still says when it was received.
    std::thread::sleep(Duration::from_millis(1100));
    for p in [Proto::H1, Proto::H2] {
        let r = fetch(&v, p, "GET", "/n", &[]);
        assert_eq!(x_cache(&r), Some("HIT"), "{p:?}");
        assert_eq!(r.header("date"), Some(date.as_str()), "{p:?}");
        assert!(
            r.header("age").unwrap().parse::<u64>().unwrap() >= 1,
            "{p:?}"
        );
    }
}
