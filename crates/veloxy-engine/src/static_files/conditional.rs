//! Validators and conditional requests (RFC 9110 section 13).
//!
//! ETags are strong and derived from the file's size and modification time in nanoseconds
//! (`"<size hex>-<mtime secs hex>.<nanos hex>"`, plus `-br`/`-zst`/`-gz` for a compressed
//! variant, whose bytes differ). Strong, because a byte range of one version must never be
//! combined with another: `If-Range` only accepts strong validators. Size plus nanosecond
//! mtime changes with every real write; a same-size rewrite within the filesystem's timestamp
//! granularity would go unnoticed, the same trade-off nginx makes.

use std::time::{SystemTime, UNIX_EPOCH};

use super::Headers;

/// What the preconditions decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Serve the representation (ranges still apply).
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// The base ETag of a file version (with its quotes).
pub fn etag(len: u64, mtime: SystemTime) -> String {
    let d = mtime.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("\"{len:x}-{:x}.{:x}\"", d.as_secs(), d.subsec_nanos())
}

/// The ETag of a compressed variant: the base tag with the coding's suffix inside the quotes.
pub fn variant_etag(base: &str, suffix: &str) -> String {
    format!("{}-{suffix}\"", base.trim_end_matches('"'))
}

/// Whole seconds since the epoch (HTTP dates have no finer precision).
pub fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn parse_date(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?;
    httpdate::parse_http_date(s.trim()).ok().map(secs)
}

/// The entity-tags of an `If-Match`/`If-None-Match` list; `None` for `*`.
fn tags(v: &[u8]) -> Option<Vec<&[u8]>> {
    let v = v.trim_ascii();
    if v == b"*" {
        return None;
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        while i < v.len() && (v[i] == b',' || v[i] == b' ' || v[i] == b'\t') {
            i += 1;
        }
        let start = i;
        if v[i..].starts_with(b"W/") {
            i += 2;
        }
        if i >= v.len() || v[i] != b'"' {
            // Malformed: skip to the next comma.
            while i < v.len() && v[i] != b',' {
                i += 1;
            }
            continue;
        }
        match v[i + 1..].iter().position(|&b| b == b'"') {
            Some(close) => {
                i += close + 2;
                out.push(&v[start..i]);
            }
            None => break,
        }
    }
    Some(out)
}

fn opaque(tag: &[u8]) -> &[u8] {
    tag.strip_prefix(b"W/").unwrap_or(tag)
}

/// Weak comparison: the opaque tags are equal, `W/` ignored on both sides.
fn weak_match(a: &[u8], b: &[u8]) -> bool {
    opaque(a) == opaque(b)
}

/// Strong comparison: neither is weak and they are equal.
fn strong_match(a: &[u8], b: &[u8]) -> bool {
    !a.starts_with(b"W/") && !b.starts_with(b"W/") && a == b
}

/// Evaluates `If-Match`, `If-Unmodified-Since`, `If-None-Match` and `If-Modified-Since` in the
/// RFC's order for a GET or HEAD of the representation tagged `etag`, modified at `mtime`.
pub fn evaluate(headers: &dyn Headers, etag: &str, mtime: u64) -> Outcome {
    let etag = etag.as_bytes();
    if let Some(v) = headers.get("if-match") {
        let ok = match tags(v) {
            None => true,
            Some(list) => list.iter().any(|t| strong_match(t, etag)),
        };
        if !ok {
            return Outcome::Failed;
        }
    } else if let Some(date) = headers.get("if-unmodified-since").and_then(parse_date) {
        if mtime > date {
            return Outcome::Failed;
        }
    }
    if let Some(v) = headers.get("if-none-match") {
        let matched = match tags(v) {
            None => true,
            Some(list) => list.iter().any(|t| weak_match(t, etag)),
        };
        return if matched {
            Outcome::NotModified
        } else {
            Outcome::Proceed
        };
    }
    if let Some(date) = headers.get("if-modified-since").and_then(parse_date) {
        if mtime <= date {
            return Outcome::NotModified;
        }
    }
    Outcome::Proceed
}

/// `If-Range`: true when the Range may be honored (no If-Range, or it names this version by
/// a strong ETag or by its exact Last-Modified date).
pub fn if_range_allows(headers: &dyn Headers, etag: &str, mtime: u64) -> bool {
    let Some(v) = headers.get("if-range") else {
        return true;
    };
    let v = v.trim_ascii();
    if v.starts_with(b"\"") || v.starts_with(b"W/") {
        return strong_match(v, etag.as_bytes());
    }
    parse_date(v) == Some(mtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct H(Vec<(&'static str, &'static str)>);
    impl Headers for H {
        fn get(&self, name: &str) -> Option<&[u8]> {
            self.0
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_bytes())
        }
    }

    const TAG: &str = "\"10-5f5e1000.0\"";
    // 0x5f5e1000 = 1600000000 = Sun, 13 Sep 2020 12:26:40 GMT
    const MTIME: u64 = 1_600_000_000;

    fn ev(h: Vec<(&'static str, &'static str)>) -> Outcome {
        evaluate(&H(h), TAG, MTIME)
    }

    #[test]
    fn etag_forms() {
        let t = UNIX_EPOCH + std::time::Duration::new(MTIME, 5);
        assert_eq!(etag(16, t), "\"10-5f5e1000.5\"");
        assert_eq!(variant_etag("\"a\"", "br"), "\"a-br\"");
    }

    #[test]
    fn if_none_match() {
        assert_eq!(ev(vec![]), Outcome::Proceed);
        assert_eq!(ev(vec![("If-None-Match", TAG)]), Outcome::NotModified);
        assert_eq!(ev(vec![("If-None-Match", "*")]), Outcome::NotModified);
        assert_eq!(
            ev(vec![("If-None-Match", "\"x\", W/\"10-5f5e1000.0\"")]),
            Outcome::NotModified,
            "weak comparison"
        );
        assert_eq!(
            ev(vec![("If-None-Match", "\"x\", \"y\"")]),
            Outcome::Proceed
        );
        assert_eq!(ev(vec![("If-None-Match", "garbage")]), Outcome::Proceed);
        // If-None-Match wins over If-Modified-Since.
        assert_eq!(
            ev(vec![
                ("If-None-Match", "\"x\""),
                ("If-Modified-Since", "Sun, 13 Sep 2020 12:26:40 GMT")
            ]),
            Outcome::Proceed
        );
    }

    #[test]
    fn if_modified_since() {
        assert_eq!(
            ev(vec![("If-Modified-Since", "Sun, 13 Sep 2020 12:26:40 GMT")]),
            Outcome::NotModified
        );
        assert_eq!(
            ev(vec![("If-Modified-Since", "Sun, 13 Sep 2020 12:26:39 GMT")]),
            Outcome::Proceed
        );
        assert_eq!(
            ev(vec![("If-Modified-Since", "yesterday")]),
            Outcome::Proceed
        );
    }

    #[test]
    fn preconditions_fail() {
        assert_eq!(ev(vec![("If-Match", "\"x\"")]), Outcome::Failed);
        assert_eq!(ev(vec![("If-Match", TAG)]), Outcome::Proceed);
        assert_eq!(ev(vec![("If-Match", "*")]), Outcome::Proceed);
        assert_eq!(
            ev(vec![("If-Match", "W/\"10-5f5e1000.0\"")]),
            Outcome::Failed,
            "If-Match uses strong comparison"
        );
        assert_eq!(
            ev(vec![(
                "If-Unmodified-Since",
                "Sun, 13 Sep 2020 12:26:39 GMT"
            )]),
            Outcome::Failed
        );
        assert_eq!(
            ev(vec![(
                "If-Unmodified-Since",
                "Sun, 13 Sep 2020 12:26:40 GMT"
            )]),
            Outcome::Proceed
        );
    }

    #[test]
    fn if_range() {
        let h = |v: &'static str| H(vec![("If-Range", v)]);
        assert!(if_range_allows(&H(vec![]), TAG, MTIME));
        assert!(if_range_allows(&h(TAG), TAG, MTIME));
        assert!(!if_range_allows(&h("\"other\""), TAG, MTIME));
        assert!(!if_range_allows(&h("W/\"10-5f5e1000.0\""), TAG, MTIME));
        assert!(if_range_allows(
            &h("Sun, 13 Sep 2020 12:26:40 GMT"),
            TAG,
            MTIME
        ));
        assert!(!if_range_allows(
            &h("Sun, 13 Sep 2020 12:26:41 GMT"),
            TAG,
            MTIME
        ));
    }
}
