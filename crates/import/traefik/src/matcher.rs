//! From a rule's conjunctions ([`crate::rule::dnf`]) to veloxy route matches: each AND of
//! matchers becomes a [`Branch`] (host, path, methods, header and query conditions, client
//! addresses), then branches that differ in one list-valued dimension only (hosts, paths of
//! one kind, methods, client ranges) are merged, so `Host(`a`) || Host(`b`)` is one route
//! with `host = ["a", "b"]`.

use std::collections::BTreeMap;

use crate::rule::{Call, Lit};

/// How a branch matches the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathKind {
    /// `path`: byte prefix (PathPrefix).
    Prefix,
    /// `path_exact` (Path).
    Exact,
    /// `path_regex` (PathRegexp, v2 path templates).
    Regex,
}

/// One AND of matchers, as a veloxy route's match.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Branch {
    /// Host patterns (`a.example`, `*.example`); empty: any host.
    pub hosts: Vec<String>,
    /// Path kind of `paths`.
    pub kind: Option<PathKind>,
    /// Paths (prefixes, exact paths, or one regex); empty: any path.
    pub paths: Vec<String>,
    /// Methods (uppercase); empty: any.
    pub methods: Vec<String>,
    /// Header conditions (exact value).
    pub headers: BTreeMap<String, String>,
    /// Query conditions (exact value).
    pub query: BTreeMap<String, String>,
    /// ClientIP ranges (route `allow`).
    pub allow: Vec<String>,
    /// Negated ClientIP ranges (route `deny`).
    pub deny: Vec<String>,
    /// Negated paths: requests on them must not reach this branch.
    pub not_paths: Vec<(PathKind, String)>,
    /// Differences this match has from Traefik's (for the report).
    pub notes: Vec<String>,
}

/// Standard methods, for a negated `Method`.
const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
];

/// One conjunction as a branch: `Ok(None)` when it can never match (`Host(`a`) &&
/// Host(`b`)`), `Err` naming the matcher veloxy cannot express.
pub fn branch(lits: &[Lit]) -> Result<Option<Branch>, String> {
    let mut b = Branch::default();
    for l in lits {
        if !apply(&mut b, l)? {
            return Ok(None);
        }
    }
    b.notes.sort();
    b.notes.dedup();
    Ok(Some(b))
}

fn one_arg(c: &Call) -> Result<&str, String> {
    match c.args.as_slice() {
        [a] => Ok(a),
        _ => Err(format!("{c}: expected one argument")),
    }
}

/// Adds one literal; `false` when the conjunction cannot match.
fn apply(b: &mut Branch, l: &Lit) -> Result<bool, String> {
    let c = &l.call;
    let name = c.name.to_ascii_lowercase();
    match (name.as_str(), l.neg) {
        ("host" | "hostheader", false) => {
            let h = one_arg(c)?.to_ascii_lowercase();
            let h = h.split(':').next().unwrap_or_default().to_string();
            Ok(set_hosts(b, vec![h], l)?)
        }
        ("hostregexp", false) => {
            let (hosts, note) = crate::hostre::host_regexp(one_arg(c)?).ok_or_else(|| {
                format!("{l}: veloxy matches hosts by exact name or *.suffix only")
            })?;
            b.notes.extend(note);
            if hosts.is_empty() {
                return Ok(true);
            }
            Ok(set_hosts(b, hosts, l)?)
        }
        ("path" | "pathprefix" | "pathregexp", false) => {
            let arg = one_arg(c)?;
            let (kind, p) = match name.as_str() {
                "pathregexp" => (PathKind::Regex, arg.to_string()),
                _ => path_matcher(name == "path", arg),
            };
            Ok(set_path(b, kind, p, l)?)
        }
        ("path" | "pathprefix", true) => {
            let (kind, p) = path_matcher(name == "path", one_arg(c)?);
            if kind == PathKind::Regex {
                return Err(format!("{l}: veloxy cannot exclude a path pattern"));
            }
            b.not_paths.push((kind, p));
            Ok(true)
        }
        ("method", neg) => {
            let m = one_arg(c)?.to_ascii_uppercase();
            let set: Vec<String> = if neg {
                b.notes.push(format!(
                    "{l} becomes the list of standard methods without it: other methods do not match"
                ));
                METHODS
                    .iter()
                    .filter(|x| **x != m)
                    .map(|x| x.to_string())
                    .collect()
            } else {
                vec![m]
            };
            if b.methods.is_empty() {
                b.methods = set;
            } else {
                b.methods.retain(|x| set.contains(x));
                if b.methods.is_empty() {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        ("header" | "headers", false) => {
            let [k, v] = c.args.as_slice() else {
                return Err(format!("{c}: expected a name and a value"));
            };
            b.notes.push(format!(
                "{l}: veloxy compares the field's first value; Traefik any of its values"
            ));
            Ok(set_pair(&mut b.headers, k, v))
        }
        ("query", false) => query(b, c),
        ("clientip", false) => {
            let r = one_arg(c)?.to_string();
            if !b.allow.is_empty() && !b.allow.contains(&r) {
                return Err(format!("{l}: two ClientIP matchers in one AND"));
            }
            if b.allow.is_empty() {
                b.allow.push(r);
            }
            Ok(true)
        }
        ("clientip", true) => {
            b.deny.push(one_arg(c)?.to_string());
            Ok(true)
        }
        (
            "host" | "hostheader" | "hostregexp" | "header" | "headers" | "query" | "pathregexp",
            true,
        ) => Err(format!("{l}: veloxy routes cannot exclude this")),
        ("headerregexp" | "headersregexp" | "queryregexp", _) => Err(format!(
            "{l}: veloxy matches header and query values exactly, not by regex"
        )),
        ("hostsni" | "hostsniregexp" | "alpn", _) => {
            Err(format!("{l}: a TCP matcher in an HTTP router"))
        }
        _ => Err(format!("{l}: unknown matcher")),
    }
}

fn set_hosts(b: &mut Branch, hosts: Vec<String>, l: &Lit) -> Result<bool, String> {
    if b.hosts.is_empty() {
        b.hosts = hosts;
        return Ok(true);
    }
    let common: Vec<String> = b
        .hosts
        .iter()
        .filter(|h| hosts.contains(h))
        .cloned()
        .collect();
    if common.is_empty() {
        if hosts.iter().chain(&b.hosts).any(|h| h.starts_with("*.")) {
            return Err(format!("{l}: two host matchers that overlap in part"));
        }
        return Ok(false);
    }
    b.hosts = common;
    Ok(true)
}

fn set_path(b: &mut Branch, kind: PathKind, p: String, l: &Lit) -> Result<bool, String> {
    let Some(old) = b.kind else {
        b.kind = Some(kind);
        b.paths = vec![p];
        return Ok(true);
    };
    let cur = b.paths[0].clone();
    let keep = match (old, kind) {
        (PathKind::Regex, _) | (_, PathKind::Regex) => {
            return Err(format!(
                "{l}: a path regex together with another path matcher"
            ));
        }
        (PathKind::Prefix, PathKind::Prefix) if p.starts_with(&cur) => (kind, p),
        (PathKind::Prefix, PathKind::Prefix) if cur.starts_with(&p) => (old, cur),
        (PathKind::Exact, PathKind::Prefix) if cur.starts_with(&p) => (old, cur),
        (PathKind::Prefix, PathKind::Exact) if p.starts_with(&cur) => (kind, p),
        (PathKind::Exact, PathKind::Exact) if p == cur => (old, cur),
        _ => return Ok(false),
    };
    b.kind = Some(keep.0);
    b.paths = vec![keep.1];
    Ok(true)
}

fn set_pair(map: &mut BTreeMap<String, String>, k: &str, v: &str) -> bool {
    match map.get(k) {
        Some(old) => old == v,
        None => {
            map.insert(k.to_string(), v.to_string());
            true
        }
    }
}

/// `Query(`k`, `v`)` (v3), `Query(`k=v`, ...)` (v2).
fn query(b: &mut Branch, c: &Call) -> Result<bool, String> {
    let pairs: Vec<(String, String)> = match c.args.as_slice() {
        [k, v] if !(k.contains('=') && v.contains('=')) => vec![(k.clone(), v.clone())],
        args if args.iter().all(|a| a.contains('=')) && !args.is_empty() => args
            .iter()
            .map(|a| {
                let (k, v) = a.split_once('=').unwrap_or_default();
                (k.to_string(), v.to_string())
            })
            .collect(),
        _ => {
            return Err(format!(
                "{c}: veloxy matches a query parameter's value, not its presence"
            ))
        }
    };
    for (k, v) in pairs {
        if !set_pair(&mut b.query, &k, &v) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `Path`/`PathPrefix` argument: a plain path, or a v2 template (`/u/{id:[0-9]+}`) as a regex.
fn path_matcher(exact: bool, arg: &str) -> (PathKind, String) {
    if !arg.contains('{') {
        let kind = if exact {
            PathKind::Exact
        } else {
            PathKind::Prefix
        };
        return (kind, arg.to_string());
    }
    let mut re = format!("^{}", template_regex(arg, "[^/]+", true));
    if exact {
        re.push('$');
    }
    (PathKind::Regex, re)
}

/// A v2 (gorilla mux) template: literal text escaped, `{name}` as `default`, `{name:re}`
/// as a named group.
pub(crate) fn template_regex(t: &str, default: &str, named: bool) -> String {
    let mut out = String::new();
    let mut rest = t;
    while let Some(i) = rest.find('{') {
        out.push_str(&escape(&rest[..i]));
        let after = &rest[i + 1..];
        // The variable ends at the matching brace (its regex may hold `{2}`).
        let mut depth = 1;
        let end = after
            .char_indices()
            .find(|&(_, ch)| {
                depth += match ch {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map_or(after.len(), |(j, _)| j);
        let var = &after[..end];
        let (name, re) = var.split_once(':').unwrap_or((var, default));
        let name: String = name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !named {
            out.push_str(&format!("(?:{re})"));
        } else if name.is_empty() {
            out.push_str(&format!("({re})"));
        } else {
            out.push_str(&format!("(?P<{name}>{re})"));
        }
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out.push_str(&escape(rest));
    out
}

/// Escapes regex metacharacters.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Merges branches that differ in one list dimension only (hosts, paths of one non-regex
/// kind, methods, ClientIP ranges).
pub fn merge(mut v: Vec<Branch>) -> Vec<Branch> {
    let mut changed = true;
    while changed {
        changed = false;
        'outer: for i in 0..v.len() {
            for j in i + 1..v.len() {
                if let Some(m) = merged(&v[i], &v[j]) {
                    v[i] = m;
                    v.remove(j);
                    changed = true;
                    break 'outer;
                }
            }
        }
    }
    v
}

fn union(a: &[String], b: &[String]) -> Vec<String> {
    if a.is_empty() || b.is_empty() {
        return Vec::new();
    }
    let mut out = a.to_vec();
    for x in b {
        if !out.contains(x) {
            out.push(x.clone());
        }
    }
    out
}

fn merged(a: &Branch, b: &Branch) -> Option<Branch> {
    if a.headers != b.headers
        || a.query != b.query
        || a.deny != b.deny
        || a.not_paths != b.not_paths
    {
        return None;
    }
    let same_hosts = a.hosts == b.hosts;
    let same_paths = a.kind == b.kind && a.paths == b.paths;
    let same_methods = a.methods == b.methods;
    let same_allow = a.allow == b.allow;
    let diffs = [same_hosts, same_paths, same_methods, same_allow]
        .iter()
        .filter(|s| !**s)
        .count();
    if diffs > 1 {
        return None;
    }
    let mut m = a.clone();
    m.notes = union(&a.notes, &b.notes);
    if a.notes.is_empty() || b.notes.is_empty() {
        m.notes = a.notes.iter().chain(&b.notes).cloned().collect();
        m.notes.dedup();
    }
    if !same_hosts {
        m.hosts = union(&a.hosts, &b.hosts);
    } else if !same_paths {
        if a.kind != b.kind || a.kind == Some(PathKind::Regex) {
            // Different kinds: mergeable only when one matches every path (then both do).
            if a.paths.is_empty() || b.paths.is_empty() {
                m.kind = None;
                m.paths = Vec::new();
                return Some(m);
            }
            return None;
        }
        m.paths = union(&a.paths, &b.paths);
    } else if !same_methods {
        m.methods = union(&a.methods, &b.methods);
    } else if !same_allow {
        m.allow = union(&a.allow, &b.allow);
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule;

    fn branches(r: &str) -> Result<Vec<Branch>, String> {
        let d = rule::dnf(&rule::parse(r).unwrap())?;
        let mut out = Vec::new();
        for c in d {
            if let Some(b) = branch(&c)? {
                out.push(b);
            }
        }
        Ok(merge(out))
    }

    #[test]
    fn hosts_and_paths_merge() {
        let b =
            branches("(Host(`a.x`) || Host(`b.x`)) && (PathPrefix(`/api`) || PathPrefix(`/v1`))")
                .unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].hosts, ["a.x", "b.x"]);
        assert_eq!(b[0].paths, ["/api", "/v1"]);
        let b = branches("Host(`a.x`) && PathPrefix(`/api`) || Host(`b.x`)").unwrap();
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn impossible_and_refused() {
        assert!(branches("Host(`a`) && Host(`b`)").unwrap().is_empty());
        assert!(branches("HeadersRegexp(`X`, `.*`)").is_err());
        assert!(branches("!Host(`a`)").is_err());
        let b = branches("PathPrefix(`/a`) && Path(`/a/b`)").unwrap();
        assert_eq!(
            (b[0].kind, b[0].paths.clone()),
            (Some(PathKind::Exact), vec!["/a/b".to_string()])
        );
    }

    #[test]
    fn v2_templates() {
        assert_eq!(
            path_matcher(true, "/u/{id:[0-9]+}"),
            (PathKind::Regex, "^/u/(?P<id>[0-9]+)$".to_string())
        );
        assert_eq!(
            path_matcher(false, "/u/{id}/x"),
            (PathKind::Regex, "^/u/(?P<id>[^/]+)/x".to_string())
        );
    }
}
