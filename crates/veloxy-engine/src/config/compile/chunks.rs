//! The file cut at its top-level table headers, without parsing it: which byte ranges are
//! `[[routes]]` entries (with their `[routes.KEY]` sub-tables), which are `[upstreams.NAME]`
//! groups and which are everything else. A reload uses it to find the route entries whose
//! text is unchanged (see `reuse`).
//!
//! Hand-written because no TOML crate reports table spans without building the whole
//! document (which is what a reload of an unchanged entry should not pay for). It only needs
//! to find the lines that start a table: it follows strings (basic, literal and multi-line),
//! comments and the nesting of arrays and inline tables, and gives up (`None`: no reuse, the
//! whole file is compiled) on anything it is not sure of, such as a quoted first key in a
//! header. A wrong cut is caught anyway: the parsed file must have one route per route range.

use std::ops::Range;

/// What a range of the file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Top-level keys and every table but the two below.
    Other,
    /// One `[[routes]]` entry and its `[routes.KEY]` sub-tables.
    Route,
    /// One `[upstreams.NAME]` table (or a sub-table of one).
    Upstream,
}

/// One range of the file, from a header line to the next one.
#[derive(Debug, Clone)]
pub(super) struct Chunk {
    /// Bytes of the file, from the start of its header line.
    pub span: Range<usize>,
    pub kind: Kind,
    /// A route whose keys are all in [`PLAIN_KEYS`]: its compiled form depends on its own
    /// text, the rest of the file but `[upstreams]`, and the few group settings routes read.
    pub plain: bool,
}

/// Route keys whose compiling reads no file, no live slot (cache stores, Redis) and no
/// group setting but its protocol, PROXY header version and `location_rewrite`. A route
/// with any other key (`root`, `use`, `forward_auth`, `cache`, `rate_limit`, ...) is
/// compiled anew on every reload.
const PLAIN_KEYS: &[&str] = &[
    "listener",
    "host",
    "path",
    "path_exact",
    "path_regex",
    "methods",
    "headers",
    "query",
    "request_headers",
    "response_headers",
    "max_body_bytes",
    "location_rewrite",
    "allow",
    "deny",
    "cors",
    "upstream",
    "redirect",
    "strip_prefix",
    "rewrite",
    "respond",
    "compress",
    "max_concurrency",
    "queue",
    "queue_timeout",
];

/// The file's chunks in order, covering it whole; `None` where the text is not understood.
pub(super) fn chunks(text: &str) -> Option<Vec<Chunk>> {
    let b = text.as_bytes();
    let mut out = vec![Chunk {
        span: 0..0,
        kind: Kind::Other,
        plain: true,
    }];
    let mut depth = 0usize;
    // Under a `[routes.KEY]` header: the keys are the sub-table's, not the route's.
    let mut sub_table = false;
    let mut i = 0;
    while i < b.len() {
        let line_start = i;
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
            i += 1;
        }
        if depth == 0 && i < b.len() && b[i] == b'[' {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            let (kind, sub) = header(&text[i..end])?;
            let last = out.last_mut()?;
            sub_table = sub.is_some();
            match sub {
                // `[routes.KEY]`: part of the entry above.
                Some(key) => {
                    if last.kind != Kind::Route {
                        return None;
                    }
                    last.plain &= PLAIN_KEYS.contains(&key);
                }
                None => {
                    last.span.end = line_start;
                    out.push(Chunk {
                        span: line_start..0,
                        kind,
                        plain: true,
                    });
                }
            }
            i = (end + 1).min(b.len());
            continue;
        }
        if depth == 0 && i < b.len() && !matches!(b[i], b'\n' | b'\r' | b'#') {
            let key_end = b[i..]
                .iter()
                .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-'))
                .map_or(b.len(), |n| i + n);
            let last = out.last_mut()?;
            if last.kind == Kind::Route && !sub_table {
                last.plain &= key_end > i && PLAIN_KEYS.contains(&&text[i..key_end]);
            }
        }
        i = rest_of_line(b, i, &mut depth)?;
    }
    if depth != 0 {
        return None;
    }
    out.last_mut()?.span.end = b.len();
    Some(out)
}

/// A header line's kind, and for a `[routes.KEY]` sub-table its first key under `routes`.
fn header(line: &str) -> Option<(Kind, Option<&str>)> {
    let array = line.starts_with("[[");
    let inner = line.trim_start_matches('[');
    let first_end = inner.find(['.', ']'])?;
    let first = inner[..first_end].trim();
    if first.is_empty() || first.starts_with(['"', '\'']) {
        return None;
    }
    let rest = &inner[first_end..];
    match first {
        "routes" if rest.starts_with(']') => array.then_some((Kind::Route, None)),
        "routes" => {
            let sub = rest[1..].trim_start();
            let end = sub.find(['.', ']']).unwrap_or(sub.len());
            Some((Kind::Route, Some(sub[..end].trim())))
        }
        "upstreams" => Some((Kind::Upstream, None)),
        _ => Some((Kind::Other, None)),
    }
}

/// Scans from `i` past the end of its line (or of the multi-line string or array that
/// starts on it), keeping the nesting depth of arrays and inline tables.
fn rest_of_line(b: &[u8], mut i: usize, depth: &mut usize) -> Option<usize> {
    while i < b.len() {
        match b[i] {
            b'\n' => return Some(i + 1),
            b'#' => {
                return Some(
                    b[i..]
                        .iter()
                        .position(|&c| c == b'\n')
                        .map_or(b.len(), |n| i + n + 1),
                )
            }
            q @ (b'"' | b'\'') => i = string_end(b, i, q)?,
            b'[' | b'{' => {
                *depth += 1;
                i += 1;
            }
            b']' | b'}' => {
                *depth = depth.checked_sub(1)?;
                i += 1;
            }
            _ => i += 1,
        }
    }
    Some(i)
}

/// The byte after the string that starts at `i` with quote `q` (basic strings have `\`
/// escapes, literal ones none; triple quotes span lines).
fn string_end(b: &[u8], i: usize, q: u8) -> Option<usize> {
    let escapes = q == b'"';
    let triple = b[i..].starts_with(&[q, q, q]);
    let mut j = if triple { i + 3 } else { i + 1 };
    while j < b.len() {
        let c = b[j];
        if escapes && c == b'\\' {
            j += 2;
            continue;
        }
        if c == b'\n' && !triple {
            return None;
        }
        if c == q {
            if !triple {
                return Some(j + 1);
            }
            if b[j..].starts_with(&[q, q, q]) {
                // Up to two more quotes belong to the string (`"""a"""""`).
                let mut end = j + 3;
                while end < b.len() && end < j + 5 && b[end] == q {
                    end += 1;
                }
                return Some(end);
            }
        }
        j += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<(Kind, bool, &str)> {
        chunks(text)
            .unwrap()
            .into_iter()
            .map(|c| (c.kind, c.plain, &text[c.span]))
            .collect()
    }

    #[test]
    fn cuts_at_top_level_headers_only() {
        let text = "[server]\nworkers = 1\n\n[[routes]]\nhost = \"a\"\nupstream = \"g\"\n\
                    [routes.redirect]\nto = \"/x\"\n[[routes]]\nroot = \"/srv\" # [[routes]]\n\
                    s = \"\"\"\n[[routes]]\n\"\"\"\n[upstreams.g]\nservers = [\n  [\"a\"],\n]\n\
                    [[routes]]\nheaders = { a = \"]\" }\nt = '''\n[x]\n'''\n";
        let k = kinds(text);
        assert_eq!(k.len(), 6, "{k:#?}");
        assert_eq!(k[1].0, Kind::Other);
        assert_eq!((k[2].0, k[2].1), (Kind::Route, true));
        assert!(k[2].2.contains("[routes.redirect]"));
        assert_eq!((k[3].0, k[3].1), (Kind::Route, false));
        assert!(k[3].2.contains("\"\"\"\n[[routes]]\n\"\"\""));
        assert_eq!(k[4].0, Kind::Upstream);
        assert!(k[4].2.contains("[\"a\"],"));
        assert_eq!((k[5].0, k[5].1), (Kind::Route, false));
        assert!(k[5].2.ends_with("'''\n[x]\n'''\n"));
        let joined: String = k.iter().map(|c| c.2).collect();
        assert_eq!(joined, text);
    }

    #[test]
    fn gives_up_on_what_it_does_not_follow() {
        assert!(chunks("[\"routes\"]\n").is_none());
        assert!(chunks("[server]\n[routes.x]\n").is_none());
        assert!(chunks("a = [1,\n").is_none());
        assert!(chunks("a = \"x\n\"\n").is_none());
    }
}
