//! What a veloxy route can match on (host, path, methods, headers, query, TLS or not), the
//! intersection of two such matches, and veloxy's precedence between two routes.

use std::collections::BTreeMap;

/// A route's host: exact (lowercase) or a suffix (`.example.com` for `*.example.com`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Host {
    /// `api.example.com`.
    Exact(String),
    /// `.example.com`: any longer name ending so.
    Suffix(String),
}

impl Host {
    /// As a veloxy `host` value.
    pub fn value(&self) -> String {
        match self {
            Host::Exact(h) => h.clone(),
            Host::Suffix(s) => format!("*{s}"),
        }
    }

    fn rank(h: &Option<Host>) -> u8 {
        match h {
            Some(Host::Exact(_)) => 2,
            Some(Host::Suffix(_)) => 1,
            None => 0,
        }
    }
}

/// A route's path condition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathPat {
    /// Byte prefix (`path`).
    Prefix(String),
    /// `path_exact`.
    Exact(String),
    /// `path_regex` (Rust syntax).
    Regex(String),
}

/// The conditions of one route (every one given must hold).
#[derive(Debug, Clone, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Match {
    /// `host`.
    pub host: Option<Host>,
    /// `path` / `path_exact` / `path_regex`.
    pub path: Option<PathPat>,
    /// `methods` (sorted).
    pub methods: Option<Vec<String>>,
    /// `headers` (first value, exact).
    pub headers: BTreeMap<String, String>,
    /// `query` (first value, exact).
    pub query: BTreeMap<String, String>,
    /// Only on TLS listeners (`Some(true)`) or only on plain ones (`Some(false)`).
    pub tls: Option<bool>,
}

/// The intersection of two matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Meet {
    /// No request matches both.
    Empty,
    /// Exactly the requests matching both.
    Both(Match),
    /// Some requests may match both, but no single route says which.
    Unknown,
}

impl Match {
    /// A match on TLS or plain listeners only.
    pub fn tls(on: bool) -> Match {
        Match {
            tls: Some(on),
            ..Default::default()
        }
    }

    /// The requests matching both `self` and `o`.
    pub fn meet(&self, o: &Match) -> Meet {
        let host = match (&self.host, &o.host) {
            (None, h) | (h, None) => h.clone(),
            (Some(a), Some(b)) => match meet_host(a, b) {
                Some(h) => Some(h),
                None => return Meet::Empty,
            },
        };
        let path = match (&self.path, &o.path) {
            (None, p) | (p, None) => p.clone(),
            (Some(a), Some(b)) => match meet_path(a, b) {
                Meet2::Empty => return Meet::Empty,
                Meet2::Unknown => return Meet::Unknown,
                Meet2::Some(p) => Some(p),
            },
        };
        let methods = match (&self.methods, &o.methods) {
            (None, m) | (m, None) => m.clone(),
            (Some(a), Some(b)) => {
                let m: Vec<String> = a.iter().filter(|x| b.contains(x)).cloned().collect();
                if m.is_empty() {
                    return Meet::Empty;
                }
                Some(m)
            }
        };
        let Some(headers) = merge(&self.headers, &o.headers) else {
            return Meet::Empty;
        };
        let Some(query) = merge(&self.query, &o.query) else {
            return Meet::Empty;
        };
        let tls = match (self.tls, o.tls) {
            (Some(a), Some(b)) if a != b => return Meet::Empty,
            (a, b) => a.or(b),
        };
        Meet::Both(Match {
            host,
            path,
            methods,
            headers,
            query,
            tls,
        })
    }

    /// Whether every request `self` matches is matched by `o` too (false when unsure).
    pub fn within(&self, o: &Match) -> bool {
        match self.meet(o) {
            Meet::Both(m) if m == *self => true,
            // A prefix inside a regex that is that prefix followed by anything.
            Meet::Both(m) => match (&self.path, &o.path) {
                (Some(PathPat::Prefix(p)), Some(PathPat::Regex(r))) if covers(r, p) => {
                    Match {
                        path: self.path.clone(),
                        ..m
                    } == *self
                }
                _ => false,
            },
            _ => false,
        }
    }

    fn conditions(&self) -> usize {
        usize::from(self.methods.is_some()) + self.headers.len() + self.query.len()
    }
}

fn merge(
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, String>> {
    let mut out = a.clone();
    for (k, v) in b {
        match out.get(k) {
            Some(x) if x != v => return None,
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Some(out)
}

fn meet_host(a: &Host, b: &Host) -> Option<Host> {
    match (a, b) {
        (Host::Exact(x), Host::Exact(y)) => (x == y).then(|| a.clone()),
        (Host::Exact(e), Host::Suffix(s)) | (Host::Suffix(s), Host::Exact(e)) => {
            (e.len() > s.len() && e.ends_with(s.as_str())).then(|| Host::Exact(e.clone()))
        }
        (Host::Suffix(x), Host::Suffix(y)) => {
            if x.ends_with(y.as_str()) {
                Some(a.clone())
            } else if y.ends_with(x.as_str()) {
                Some(b.clone())
            } else {
                None
            }
        }
    }
}

enum Meet2 {
    Empty,
    Unknown,
    Some(PathPat),
}

fn meet_path(a: &PathPat, b: &PathPat) -> Meet2 {
    use PathPat::*;
    match (a, b) {
        (Prefix(x), Prefix(y)) => {
            if x.starts_with(y.as_str()) {
                Meet2::Some(a.clone())
            } else if y.starts_with(x.as_str()) {
                Meet2::Some(b.clone())
            } else {
                Meet2::Empty
            }
        }
        (Exact(e), Prefix(p)) | (Prefix(p), Exact(e)) => {
            if e.starts_with(p.as_str()) {
                Meet2::Some(Exact(e.clone()))
            } else {
                Meet2::Empty
            }
        }
        (Exact(x), Exact(y)) => {
            if x == y {
                Meet2::Some(a.clone())
            } else {
                Meet2::Empty
            }
        }
        (Regex(r), Exact(e)) | (Exact(e), Regex(r)) => match regex_matches(r, e) {
            Some(true) => Meet2::Some(Exact(e.clone())),
            Some(false) => Meet2::Empty,
            None => Meet2::Unknown,
        },
        (Regex(r), Prefix(p)) | (Prefix(p), Regex(r)) => {
            if p == "/" {
                return Meet2::Some(Regex(r.clone()));
            }
            if unanchored(r) && regex_matches(r, p) == Some(true) {
                // A match inside the prefix is a match in every path that starts with it.
                return Meet2::Some(Regex(r.clone()));
            }
            match literal_prefix(r) {
                Some(l) if l.starts_with(p.as_str()) => Meet2::Some(Regex(r.clone())),
                Some(l) if !p.starts_with(l.as_str()) => Meet2::Empty,
                _ => Meet2::Unknown,
            }
        }
        (Regex(x), Regex(y)) => {
            if x == y {
                return Meet2::Some(a.clone());
            }
            match (literal_prefix(x), literal_prefix(y)) {
                (Some(l1), Some(l2)) if !l1.starts_with(&l2) && !l2.starts_with(&l1) => {
                    Meet2::Empty
                }
                _ => Meet2::Unknown,
            }
        }
    }
}

/// Whether regex `r` matches every path starting with `p` (`^P`, `^P(.*)`, `^P.*`).
fn covers(r: &str, p: &str) -> bool {
    let Some(rest) = r.strip_prefix('^') else {
        return false;
    };
    let esc = regex_syntax::escape(p);
    [rest.strip_prefix(p), rest.strip_prefix(esc.as_str())]
        .into_iter()
        .flatten()
        .any(|tail| matches!(tail, "" | "(.*)" | ".*"))
}

/// Whether `r` has no anchor or boundary (so a match stays one in a longer text).
fn unanchored(r: &str) -> bool {
    !r.contains('^')
        && !r.contains('$')
        && !r.contains("\\b")
        && !r.contains("\\B")
        && !r.contains("\\z")
        && !r.contains("\\A")
}

/// Whether regex `r` matches `s` (`None` when `r` does not compile).
pub fn regex_matches(r: &str, s: &str) -> Option<bool> {
    let re = regex_automata::meta::Regex::new(r).ok()?;
    Some(re.is_match(s))
}

/// The literal text every match of `r` starts the path with, when `r` is anchored (`^/api/`).
pub fn literal_prefix(r: &str) -> Option<String> {
    let rest = r.strip_prefix('^')?;
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.peek() {
                Some(&n) if n.is_ascii_punctuation() => {
                    out.push(n);
                    chars.next();
                }
                _ => break,
            },
            '.' | '[' | ']' | '(' | ')' | '{' | '}' | '|' | '$' | '^' => break,
            '*' | '?' => {
                out.pop();
                break;
            }
            '+' => break,
            c => out.push(c),
        }
        if matches!(chars.peek(), Some('*' | '?' | '{')) {
            out.pop();
            break;
        }
    }
    Some(out)
}

/// One route as veloxy orders it: its match and its position in the file.
pub struct Ranked<'a> {
    /// The conditions.
    pub m: &'a Match,
    /// File position (ties go to the earlier).
    pub index: usize,
    /// For a regex: the first position of a route with the same pattern.
    pub first_of_regex: usize,
}

/// Whether veloxy tries `x` before `a` (its router's sort order).
pub fn before(x: &Ranked, a: &Ranked) -> bool {
    let (hx, ha) = (Host::rank(&x.m.host), Host::rank(&a.m.host));
    if hx != ha {
        return hx > ha;
    }
    let kind = |m: &Match| match m.path {
        Some(PathPat::Exact(_)) => 0u8,
        Some(PathPat::Regex(_)) => 1,
        _ => 2,
    };
    let (kx, ka) = (kind(x.m), kind(a.m));
    if kx != ka {
        return kx < ka;
    }
    if kx == 1 {
        if x.first_of_regex != a.first_of_regex {
            return x.first_of_regex < a.first_of_regex;
        }
    } else {
        let text = |m: &Match| match &m.path {
            Some(PathPat::Prefix(p) | PathPat::Exact(p)) => p.clone(),
            _ => "/".to_string(),
        };
        let (px, pa) = (text(x.m), text(a.m));
        if px.len() != pa.len() {
            return px.len() > pa.len();
        }
        if px != pa {
            return px < pa;
        }
    }
    let (cx, ca) = (x.m.conditions(), a.m.conditions());
    if cx != ca {
        return cx > ca;
    }
    x.index < a.index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(p: &str) -> Match {
        Match {
            path: Some(PathPat::Prefix(p.into())),
            ..Default::default()
        }
    }

    #[test]
    fn meets() {
        assert_eq!(
            prefix("/a").meet(&prefix("/a/b")),
            Meet::Both(prefix("/a/b"))
        );
        assert_eq!(prefix("/a").meet(&prefix("/b")), Meet::Empty);
        let h = Match {
            host: Some(Host::Suffix(".example.com".into())),
            ..Default::default()
        };
        let e = Match {
            host: Some(Host::Exact("a.example.com".into())),
            ..Default::default()
        };
        assert_eq!(h.meet(&e), Meet::Both(e.clone()));
        assert!(e.within(&h));
        assert!(!h.within(&e));
        let r = Match {
            path: Some(PathPat::Regex("^/api/v[0-9]+/".into())),
            ..Default::default()
        };
        assert_eq!(r.meet(&prefix("/api/")), Meet::Both(r.clone()));
        assert_eq!(r.meet(&prefix("/web")), Meet::Empty);
        assert_eq!(r.meet(&prefix("/api/v1/x")), Meet::Unknown);
        assert_eq!(
            literal_prefix(r"^/static/.*\.css$").as_deref(),
            Some("/static/")
        );
        assert_eq!(literal_prefix(r"^/ab?c").as_deref(), Some("/a"));
        assert_eq!(literal_prefix(r"/x"), None);
    }

    #[test]
    fn precedence() {
        let a = prefix("/api");
        let b = prefix("/api/admin");
        let ra = Ranked {
            m: &a,
            index: 0,
            first_of_regex: 0,
        };
        let rb = Ranked {
            m: &b,
            index: 1,
            first_of_regex: 1,
        };
        assert!(before(&rb, &ra));
        assert!(!before(&ra, &rb));
    }
}
