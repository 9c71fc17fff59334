//! B3 propagation (`propagate = ["b3"]`, Zipkin's format): read from the single `b3` field
//! or the `X-B3-*` fields; veloxy writes the single field upstream ([`super::Trace::b3`]).
//!
//! Single: `b3: TRACEID-SPANID[-SAMPLED[-PARENTSPANID]]`, or the decision alone (`b3: 0`,
//! `1` or `d`). Multiple: `X-B3-TraceId`, `X-B3-SpanId`, `X-B3-Sampled` (`1`/`0`, also
//! `true`/`false`), `X-B3-Flags: 1` (debug, which samples), `X-B3-ParentSpanId`. A trace id
//! has 16 or 32 lowercase hex digits (a 64-bit id is the low half), a span id 16.

use super::Parent;

/// The multiple-field names, lowercase (all are replaced upstream when `b3` is written).
pub(crate) const MULTI: [&str; 5] = [
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
];

/// The client's B3 context: the single field first, else the multiple ones.
pub(crate) fn read<'a>(field: &impl Fn(&str) -> Option<&'a [u8]>) -> Option<Parent> {
    match field("b3") {
        Some(v) => single(v),
        None => multi(field),
    }
}

fn text(v: &[u8]) -> Option<&str> {
    std::str::from_utf8(v).ok().map(str::trim)
}

fn hex_ok(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn trace_id(s: &str) -> Option<u128> {
    let ok = (s.len() == 16 || s.len() == 32) && hex_ok(s);
    ok.then(|| u128::from_str_radix(s, 16).ok())
        .flatten()
        .filter(|&id| id != 0)
}

fn span_id(s: &str) -> Option<u64> {
    let ok = s.len() == 16 && hex_ok(s);
    ok.then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
        .filter(|&id| id != 0)
}

/// A sampling state: `1` and `d` (debug) sample, `0` does not.
fn decision(s: &str) -> Option<Option<bool>> {
    match s {
        "1" | "d" | "true" => Some(Some(true)),
        "0" | "false" => Some(Some(false)),
        _ => None,
    }
}

/// The single `b3` field.
pub(crate) fn single(v: &[u8]) -> Option<Parent> {
    let mut parts = text(v)?.split('-');
    let first = parts.next()?;
    let Some(span) = parts.next() else {
        return Some(Parent {
            ids: None,
            sampled: decision(first)?,
            w3c: false,
        });
    };
    let sampled = match parts.next() {
        Some(state) => decision(state)?,
        None => None,
    };
    if let Some(parent) = parts.next() {
        span_id(parent)?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Parent {
        ids: Some((trace_id(first)?, span_id(span)?)),
        sampled,
        w3c: false,
    })
}

/// The `X-B3-*` fields.
fn multi<'a>(field: &impl Fn(&str) -> Option<&'a [u8]>) -> Option<Parent> {
    let get = |n: &str| field(n).and_then(text);
    let debug = get("x-b3-flags") == Some("1");
    let sampled = match get("x-b3-sampled") {
        _ if debug => Some(true),
        Some(s) => decision(s)?,
        None => None,
    };
    let ids = match (get("x-b3-traceid"), get("x-b3-spanid")) {
        (Some(t), Some(s)) => Some((trace_id(t)?, span_id(s)?)),
        (None, None) => None,
        _ => return None,
    };
    (ids.is_some() || sampled.is_some()).then_some(Parent {
        ids,
        sampled,
        w3c: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const S: &str = "00f067aa0ba902b7";

    fn p(ids: Option<(u128, u64)>, sampled: Option<bool>) -> Option<Parent> {
        Some(Parent {
            ids,
            sampled,
            w3c: false,
        })
    }

    #[test]
    fn single_field() {
        let ids = Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7));
        assert_eq!(single(format!("{T}-{S}-1").as_bytes()), p(ids, Some(true)));
        assert_eq!(single(format!("{T}-{S}-0").as_bytes()), p(ids, Some(false)));
        assert_eq!(single(format!("{T}-{S}-d").as_bytes()), p(ids, Some(true)));
        assert_eq!(single(format!("{T}-{S}").as_bytes()), p(ids, None));
        assert_eq!(
            single(format!("{T}-{S}-1-{S}").as_bytes()),
            p(ids, Some(true))
        );
        // A 64-bit trace id is the low half.
        assert_eq!(
            single(format!("a3ce929d0e0e4736-{S}-1").as_bytes()),
            p(Some((0xa3ce929d0e0e4736, 0x00f067aa0ba902b7)), Some(true))
        );
        assert_eq!(single(b"0"), p(None, Some(false)));
        assert_eq!(single(b"d"), p(None, Some(true)));
        for bad in [
            format!("{T}-{S}-2"),
            format!("{}-{S}-1", T.to_uppercase()),
            format!("{T}-0000000000000000-1"),
            format!("{T}-{S}-1-xyz"),
            format!("{T}-{S}-1-{S}-extra"),
            T.to_string(),
            "2".to_owned(),
        ] {
            assert_eq!(single(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn multiple_fields() {
        let fields = |list: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                list.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.as_bytes())
            }
        };
        let ids = Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7));
        let f = fields(&[
            ("x-b3-traceid", T),
            ("x-b3-spanid", S),
            ("x-b3-sampled", "1"),
        ]);
        assert_eq!(read(&f), p(ids, Some(true)));
        let f = fields(&[("x-b3-traceid", T), ("x-b3-spanid", S), ("x-b3-flags", "1")]);
        assert_eq!(read(&f), p(ids, Some(true)));
        let f = fields(&[("x-b3-sampled", "0")]);
        assert_eq!(read(&f), p(None, Some(false)));
        // The single field wins.
        let f = fields(&[("b3", "0"), ("x-b3-sampled", "1")]);
        assert_eq!(read(&f), p(None, Some(false)));
        assert_eq!(read(&fields(&[("x-b3-traceid", T)])), None);
        assert_eq!(read(&fields(&[])), None);
    }
}
