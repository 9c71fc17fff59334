//! `max_size` and `timeout` on search bodies: `size` and `from + size` clamped in a `_search`
//! body, or in each search of an `_msearch` body (NDJSON: a header line, then a body line),
//! where a `timeout` is also added to each search without one (`_msearch` takes no `timeout`
//! parameter in its URL).

use bytes::Bytes;
use serde_json::Value;

/// Clamps one search body; `true` when it changed.
fn clamp_one(v: &mut Value, max: Option<u64>, timeout: Option<&str>) -> bool {
    let Some(obj) = v.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    if let Some(t) = timeout.filter(|_| !obj.contains_key("timeout")) {
        obj.insert("timeout".into(), Value::from(t));
        changed = true;
    }
    let Some(max) = max else {
        return changed;
    };
    let mut from = obj.get("from").and_then(Value::as_u64).unwrap_or(0);
    if from > max {
        obj.insert("from".into(), Value::from(max));
        from = max;
        changed = true;
    }
    let allowed = max - from;
    // No `size`: the cluster's default (10) applies, clamped too when it is above the bound.
    let size = obj.get("size").and_then(Value::as_u64).unwrap_or(10);
    if size > allowed {
        obj.insert("size".into(), Value::from(allowed));
        changed = true;
    }
    changed
}

/// The body with its sizes within `max`, or `None` when it needs no change (or is not JSON:
/// the cluster then gives its own error).
pub(crate) fn clamp(
    body: &[u8],
    max: Option<u32>,
    timeout: Option<&str>,
    multi: bool,
) -> Option<Bytes> {
    let max = max.map(u64::from);
    if !multi {
        let mut v: Value = serde_json::from_slice(body).ok()?;
        return clamp_one(&mut v, max, timeout).then(|| Bytes::from(v.to_string()));
    }
    let mut out = Vec::with_capacity(body.len());
    let mut changed = false;
    let lines = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.trim_ascii().is_empty());
    for (n, line) in lines.enumerate() {
        if n % 2 == 1 {
            let mut v: Value = serde_json::from_slice(line).ok()?;
            if clamp_one(&mut v, max, timeout) {
                changed = true;
                out.extend_from_slice(v.to_string().as_bytes());
                out.push(b'\n');
                continue;
            }
        }
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    changed.then(|| Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_clamped_in_bodies() {
        let clamp = |b: &[u8], max: u32, multi: bool| clamp(b, Some(max), None, multi);
        let b = clamp(br#"{"query":{"match_all":{}},"size":5000}"#, 100, false).unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["size"], 100);
        let b = clamp(br#"{"from":90,"size":50}"#, 100, false).unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            (v["from"].as_u64(), v["size"].as_u64()),
            (Some(90), Some(10))
        );
        assert!(clamp(br#"{"size":5}"#, 100, false).is_none());
        let m = clamp(
            b"{\"index\":\"a\"}\n{\"size\":500}\n{}\n{\"size\":1}\n",
            100,
            true,
        )
        .unwrap();
        let lines: Vec<&[u8]> = m.split(|b| *b == b'\n').collect();
        assert_eq!(lines[1], br#"{"size":100}"#);
        assert_eq!(lines[3], br#"{"size":1}"#);
        let t = super::clamp(b"{}\n{\"size\":1}\n", None, Some("2s"), true).unwrap();
        assert_eq!(
            t,
            Bytes::from_static(b"{}\n{\"size\":1,\"timeout\":\"2s\"}\n")
        );
    }
}
