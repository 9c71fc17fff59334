//! A fetched answer as a stored object: its freshness from `Cache-Control` (or the targeted
//! field that replaces it), its `Vary` names, the header lines kept (Date, cookies left out),
//! its tags; and a stale object refreshed by a 304. Used by the fill ([`super::fill`]).

use std::time::Duration;

use bytes::Bytes;

use super::fill::Fill;
use super::policy::{self, CacheControl};
use super::Object;

pub(super) fn vary_names(headers: &http::HeaderMap) -> Vec<Box<str>> {
    let mut names: Vec<Box<str>> = headers
        .get_all(http::header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase().into_boxed_str())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The directives this cache obeys: the first targeted field present and valid (RFC 9213:
/// the configured one, then `CDN-Cache-Control`; `Cache-Control` and `Expires` are then
/// ignored, the bool says so), else `Cache-Control`.
pub(super) fn cache_control(h: &http::HeaderMap, targeted: &[Box<str>]) -> (CacheControl, bool) {
    let lines = |name: &str| {
        h.get_all(name)
            .iter()
            .map(|v| v.as_bytes())
            .collect::<Vec<_>>()
    };
    targeted
        .iter()
        .filter(|n| h.contains_key(&***n))
        .find_map(|n| CacheControl::parse_targeted(lines(n).into_iter()))
        .map(|cc| (cc, true))
        .unwrap_or_else(|| {
            (
                CacheControl::parse(lines("cache-control").into_iter()),
                false,
            )
        })
}

pub(super) type Built = Option<(Object, Option<policy::Lifetime>)>;

/// `Expires` as Unix seconds: `None` when absent, `Some(None)` when invalid or given more
/// than once (either way already expired, RFC 9111 section 5.3).
fn expires(h: &http::HeaderMap) -> Option<Option<u64>> {
    let mut lines = h.get_all(http::header::EXPIRES).iter();
    let first = lines.next()?;
    Some(match lines.next() {
        None => policy::http_date(first.as_bytes()),
        Some(_) => None,
    })
}

/// The fetched response as an object, with its lifetime when it may be stored.
pub(super) fn build(f: &super::fetch::Fetched, fill: &Fill, requested: u64, now: u64) -> Built {
    let h = &f.headers;
    if f.status == 304 {
        return None;
    }
    let (cc, targeted) = cache_control(h, &fill.rc.targeted);
    let date = h
        .get(http::header::DATE)
        .and_then(|v| policy::http_date(v.as_bytes()));
    let facts = policy::Facts {
        status: f.status,
        cc: &cc,
        expires: expires(h).filter(|_| !targeted),
        date,
        now: now / 1000,
        has_validator: h.contains_key(http::header::ETAG)
            || h.contains_key(http::header::LAST_MODIFIED),
        set_cookie: h.contains_key(http::header::SET_COOKIE),
        vary_star: vary_names(h).iter().any(|n| &**n == "*"),
        authorization: fill.authorization,
        request_no_store: false,
    };
    let life = policy::lifetime(&facts, &fill.rc.settings);
    let age = h
        .get(http::header::AGE)
        .and_then(|v| policy::age(v.as_bytes()));
    let initial = policy::initial_age_ms(age, date, requested, now);
    let obj = Object {
        status: f.status,
        lines: lines_of(h, now),
        body: f.body.clone(),
        etag: h
            .get(http::header::ETAG)
            .map(|v| Bytes::copy_from_slice(v.as_bytes())),
        last_modified: h.get(http::header::LAST_MODIFIED).and_then(|v| {
            Some((
                Bytes::copy_from_slice(v.as_bytes()),
                policy::http_date(v.as_bytes())?,
            ))
        }),
        tags: tags_of(h),
        born_ms: now.saturating_sub(initial),
        compressible: Object::may_compress(f.status, h, f.body.len()),
        encoded: Default::default(),
        life: life.unwrap_or(policy::Lifetime {
            fresh: Duration::ZERO,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
            always_revalidate: true,
        }),
    };
    Some((obj, life))
}

/// A 304 for a stored object: its fields updated from the 304's (RFC 9111 4.3.4), the body
/// kept, the lifetime computed afresh.
pub(super) fn revalidated(
    old: &Object,
    f: &super::fetch::Fetched,
    fill: &Fill,
    requested: u64,
    now: u64,
) -> Built {
    let mut merged = http::HeaderMap::new();
    for (n, v) in crate::http1::lines(&old.lines) {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n),
            http::HeaderValue::from_bytes(v),
        ) {
            merged.append(n, v);
        }
    }
    for name in f.headers.keys() {
        merged.remove(name);
    }
    if !f.headers.contains_key(http::header::DATE) {
        // A 304 without a Date was generated now (RFC 9110 6.6.1): the old Date goes, and
        // the object is dated on arrival as any answer without one.
        merged.remove(http::header::DATE);
    }
    for (n, v) in &f.headers {
        merged.append(n.clone(), v.clone());
    }
    let fetched = super::fetch::Fetched {
        status: old.status,
        headers: merged,
        body: old.body.clone(),
    };
    let (obj, life) = build(&fetched, fill, requested, now)?;
    Some((obj, life))
}

/// Fields kept with an object: the upstream's (Server and Date included, RFC 9111 section 3.1:
/// a stored answer keeps the origin's Date, updated by a 304), not Age (veloxy computes it),
/// not Set-Cookie (a stored response is shared: only the
/// client whose request fetched it gets its cookies, see [`cookie_lines`]); framing and
/// hop-by-hop fields are already gone.
pub(super) fn lines_of(h: &http::HeaderMap, now: u64) -> Bytes {
    let mut out = Vec::with_capacity(256);
    if !h.contains_key(http::header::DATE) {
        // Dated on arrival (RFC 9110 6.6.1), so that every answer from it has one Date.
        let at = std::time::UNIX_EPOCH + Duration::from_millis(now);
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(httpdate::fmt_http_date(at).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for (n, v) in h {
        if matches!(n.as_str(), "age" | "set-cookie" | "content-length") {
            continue;
        }
        out.extend_from_slice(n.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    Bytes::from(out)
}

/// The response's Set-Cookie lines, for the one client whose request fetched it; `None`
/// when it set none.
pub(super) fn cookie_lines(h: &http::HeaderMap) -> Option<Bytes> {
    let mut out = Vec::new();
    for v in h.get_all(http::header::SET_COOKIE) {
        out.extend_from_slice(b"set-cookie: ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    (!out.is_empty()).then(|| Bytes::from(out))
}

/// `Surrogate-Key` and `Cache-Tag` values (space- or comma-separated).
pub(super) fn tags_of(h: &http::HeaderMap) -> Box<[Box<str>]> {
    ["surrogate-key", "cache-tag"]
        .iter()
        .flat_map(|n| h.get_all(*n).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([' ', ',']))
        .filter(|t| !t.is_empty())
        .map(Into::into)
        .collect()
}
