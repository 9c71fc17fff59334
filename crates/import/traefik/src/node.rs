//! Reading Traefik's configuration trees: keys are case-insensitive (`entryPoints` and the
//! labels' `entrypoints` are one key), lists may be sequences or comma-separated strings
//! (labels), durations are Go durations or bare seconds.

use veloxy_import::tree::{Key, Node, Value};
use veloxy_import::Loc;

/// The value under `key`, compared without case.
pub fn get<'a>(n: &'a Node, key: &str) -> Option<&'a Node> {
    n.as_map()?
        .iter()
        .find(|(k, _)| k.name.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
        .filter(|v| !v.is_null())
}

/// The key and value under `key` (the key's location is where the directive starts).
pub fn get_kv<'a>(n: &'a Node, key: &str) -> Option<(&'a Key, &'a Node)> {
    n.as_map()?
        .iter()
        .find(|(k, _)| k.name.eq_ignore_ascii_case(key))
        .map(|(k, v)| (k, v))
}

/// The value at a dotted path (`http.redirections.entryPoint`).
pub fn at<'a>(n: &'a Node, path: &str) -> Option<&'a Node> {
    path.split('.').try_fold(n, |n, k| get(n, k))
}

/// The entries of a mapping (none for anything else).
pub fn entries(n: &Node) -> &[(Key, Node)] {
    n.as_map().unwrap_or_default()
}

/// A scalar as text.
pub fn text(n: &Node, key: &str) -> Option<String> {
    get(n, key)?.scalar()
}

/// A boolean (also `"true"`).
pub fn flag(n: &Node, key: &str) -> Option<bool> {
    get(n, key)?.as_bool()
}

/// An integer (also a string of digits).
pub fn int(n: &Node, key: &str) -> Option<i64> {
    let v = get(n, key)?;
    v.as_i64().or_else(|| v.scalar()?.trim().parse().ok())
}

/// A list of scalars: a sequence, or a comma-separated string (labels). Each with its place.
pub fn list(n: &Node) -> Vec<(String, Loc)> {
    match &n.value {
        Value::Seq(items) => items
            .iter()
            .filter_map(|i| Some((i.scalar()?, i.loc.clone())))
            .collect(),
        Value::Null => Vec::new(),
        _ => n
            .scalar()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| (s.to_string(), n.loc.clone()))
            .collect(),
    }
}

/// The list under `key` (see [`list`]).
pub fn list_at(n: &Node, key: &str) -> Vec<(String, Loc)> {
    get(n, key).map(list).unwrap_or_default()
}

/// The items of a sequence; a mapping of index keys (`servers[0]` from labels) counts too.
pub fn items(n: &Node) -> Vec<&Node> {
    match &n.value {
        Value::Seq(s) => s.iter().collect(),
        Value::Map(m) if m.iter().all(|(k, _)| k.name.parse::<usize>().is_ok()) => {
            m.iter().map(|(_, v)| v).collect()
        }
        Value::Null => Vec::new(),
        _ => vec![n],
    }
}

/// A Go duration (`10s`, `1m30s`, `500ms`) or a bare number of seconds, as seconds.
pub fn seconds(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<f64>() {
        return Some(n);
    }
    let mut total = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * mult;
        rest = &rest[unit_end..];
    }
    Some(total)
}

/// Seconds as a veloxy duration (`"30s"`, `"250ms"`, `"2m"`).
pub fn duration(secs: f64) -> String {
    if secs >= 60.0 && secs % 3600.0 == 0.0 {
        format!("{}h", (secs / 3600.0) as u64)
    } else if secs >= 60.0 && secs % 60.0 == 0.0 {
        format!("{}m", (secs / 60.0) as u64)
    } else if secs.fract() == 0.0 {
        format!("{}s", secs as u64)
    } else {
        format!("{}ms", (secs * 1000.0).round() as u64)
    }
}

/// A Node built by the importer (labels), at `loc`.
pub fn mk(loc: &Loc, value: Value) -> Node {
    Node {
        loc: loc.clone(),
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(seconds("1m30s"), Some(90.0));
        assert_eq!(seconds("500ms"), Some(0.5));
        assert_eq!(seconds("10"), Some(10.0));
        assert_eq!(seconds("x"), None);
        assert_eq!(duration(90.0), "90s");
        assert_eq!(duration(120.0), "2m");
        assert_eq!(duration(0.25), "250ms");
    }
}
