//! Envoy tries a virtual host's routes in order and takes the first that matches; veloxy picks
//! the most specific (an exact path, then the first matching regex, then the longest prefix;
//! more conditions first). This finds the routes where the two disagree: a route an earlier
//! one always wins over is unreachable (left out, as Envoy never uses it), and a route veloxy
//! prefers over an earlier overlapping one is named in the report.

use std::collections::BTreeMap;

use veloxy_import::{Loc, Outcome};

/// How a route matches the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathKind {
    /// A byte prefix.
    Prefix(String),
    /// The whole path.
    Exact(String),
    /// A regex (its source).
    Regex(String),
}

/// What the order analysis needs of one route.
#[derive(Debug, Clone)]
pub struct Match {
    /// The path condition.
    pub path: PathKind,
    /// Methods, header and query conditions (`name=value`), all required.
    pub conds: BTreeMap<String, String>,
    /// Where the route is (for the other route's report line).
    pub loc: Loc,
    /// The index of the route's `match` line in the report.
    pub entry: usize,
}

fn rank(p: &PathKind) -> u8 {
    match p {
        PathKind::Exact(_) => 3,
        PathKind::Regex(_) => 2,
        PathKind::Prefix(_) => 1,
    }
}

/// The literal start of a regex anchored with `^` (`None` when it is not anchored).
fn literal_start(re: &str) -> Option<String> {
    let rest = re.strip_prefix('^')?;
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) if !n.is_ascii_alphanumeric() => out.push(n),
                _ => break,
            },
            '.' | '[' | '(' | '*' | '+' | '?' | '{' | '|' | '$' | ')' => {
                if matches!(c, '*' | '?' | '{') {
                    out.pop();
                }
                break;
            }
            c => out.push(c),
        }
    }
    Some(out)
}

fn regex_matches(re: &str, path: &str) -> bool {
    regex::Regex::new(re).map_or(true, |r| r.is_match(path))
}

/// Whether every path `b` matches, `a` matches too.
fn covers(a: &PathKind, b: &PathKind) -> bool {
    match (a, b) {
        (PathKind::Prefix(p), PathKind::Prefix(q) | PathKind::Exact(q)) => {
            q.starts_with(p.as_str())
        }
        (PathKind::Prefix(p), PathKind::Regex(r)) => {
            p == "/" || literal_start(r).is_some_and(|l| l.starts_with(p.as_str()))
        }
        (PathKind::Exact(p), PathKind::Exact(q)) => p == q,
        (PathKind::Regex(r), PathKind::Exact(q)) => regex_matches(r, q),
        (PathKind::Regex(r), PathKind::Regex(s)) => r == s,
        _ => false,
    }
}

/// Whether some path matches both.
fn overlap(a: &PathKind, b: &PathKind) -> bool {
    match (a, b) {
        (PathKind::Prefix(p), PathKind::Prefix(q)) => {
            p.starts_with(q.as_str()) || q.starts_with(p.as_str())
        }
        (PathKind::Prefix(p), PathKind::Exact(e)) | (PathKind::Exact(e), PathKind::Prefix(p)) => {
            e.starts_with(p.as_str())
        }
        (PathKind::Exact(p), PathKind::Exact(q)) => p == q,
        (PathKind::Regex(r), PathKind::Exact(e)) | (PathKind::Exact(e), PathKind::Regex(r)) => {
            regex_matches(r, e)
        }
        (PathKind::Regex(r), PathKind::Prefix(p)) | (PathKind::Prefix(p), PathKind::Regex(r)) => {
            match literal_start(r) {
                Some(l) => l.starts_with(p.as_str()) || p.starts_with(l.as_str()),
                None => true,
            }
        }
        (PathKind::Regex(_), PathKind::Regex(_)) => true,
    }
}

/// Whether veloxy tries `b` before `a` (it is more specific).
fn prefers(b: &Match, a: &Match) -> bool {
    let (rb, ra) = (rank(&b.path), rank(&a.path));
    if rb != ra {
        return rb > ra;
    }
    match (&a.path, &b.path) {
        (PathKind::Prefix(p), PathKind::Prefix(q)) if p != q => q.len() > p.len(),
        (PathKind::Regex(r), PathKind::Regex(s)) if r != s => false,
        _ => b.conds.len() > a.conds.len(),
    }
}

/// Conditions of `a` all among those of `b` (then `a` holds whenever `b` does).
fn conds_within(a: &Match, b: &Match) -> bool {
    a.conds.iter().all(|(k, v)| b.conds.get(k) == Some(v))
}

/// Conditions that cannot both hold.
fn conds_exclusive(a: &Match, b: &Match) -> bool {
    a.conds
        .iter()
        .any(|(k, v)| b.conds.get(k).is_some_and(|w| w != v))
}

/// What became of each route of one virtual host: `true` keeps it.
pub fn analyze(matches: &[Match], report: &mut veloxy_import::Report) -> Vec<bool> {
    let mut keep = vec![true; matches.len()];
    for j in 0..matches.len() {
        let b = &matches[j];
        let mut note = None;
        for (i, a) in matches.iter().enumerate().take(j) {
            if !keep[i] || conds_exclusive(a, b) {
                continue;
            }
            if covers(&a.path, &b.path) && conds_within(a, b) {
                keep[j] = false;
                if let Some(e) = report.entries.get_mut(b.entry) {
                    e.outcome = Outcome::Ignored(format!(
                        "unreachable: the route at line {} comes first and matches every \
                         request this one does, so Envoy never uses it (left out)",
                        a.loc.line
                    ));
                }
                break;
            }
            if overlap(&a.path, &b.path) && prefers(b, a) && note.is_none() {
                note = Some(a.loc.line);
            }
        }
        if let (true, Some(line)) = (keep[j], note) {
            let what = format!(
                "Envoy tries routes in order, so a request that also matches the route at line \
                 {line} goes there; veloxy prefers this more specific route"
            );
            let Some(e) = report.entries.get_mut(b.entry) else {
                continue;
            };
            e.outcome = match &e.outcome {
                Outcome::Different(w) => Outcome::Different(format!("{w}; {what}")),
                Outcome::Translated => Outcome::Different(what),
                other => other.clone(),
            };
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_starts() {
        assert_eq!(literal_start("^/api/v[0-9]+").as_deref(), Some("/api/v"));
        assert_eq!(literal_start("^/a\\.b").as_deref(), Some("/a.b"));
        assert_eq!(literal_start("^/ab?").as_deref(), Some("/a"));
        assert_eq!(literal_start("/x"), None);
    }

    #[test]
    fn coverage() {
        let p = |s: &str| PathKind::Prefix(s.into());
        assert!(covers(&p("/"), &p("/api")));
        assert!(!covers(&p("/api"), &p("/")));
        assert!(overlap(&p("/api"), &p("/")));
        assert!(covers(
            &PathKind::Regex("^/u/[0-9]+$".into()),
            &PathKind::Exact("/u/1".into())
        ));
    }
}
