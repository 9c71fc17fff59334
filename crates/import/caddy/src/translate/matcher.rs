//! Caddy request matchers (`@name { ... }`, `@name path ...`, inline `/path*` tokens) as
//! veloxy route conditions, and how two conditions relate (one covers the other, they never
//! both hold, or they overlap in a condition both can be written as).

use std::collections::BTreeMap;

use crate::lexer::Token;
use crate::parse::Line;

/// A veloxy path condition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PathCond {
    /// Every path.
    #[default]
    Any,
    /// `path = "/api/"`.
    Prefix(String),
    /// `path_exact = "/x"`.
    Exact(String),
    /// `path_regex = "..."`.
    Regex(String),
}

/// The conditions of one veloxy route (all must hold).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cond {
    /// Host names (any of them); empty: any host.
    pub hosts: Vec<String>,
    /// The path.
    pub path: PathCond,
    /// Methods (any of them); empty: any.
    pub methods: Vec<String>,
    /// Request fields with exact values.
    pub headers: BTreeMap<String, String>,
    /// Query parameters with exact values.
    pub query: BTreeMap<String, String>,
}

/// A matcher: the alternatives it stands for (any of them matches), or only client address
/// lists (`remote_ip`, `not remote_ip`), which veloxy has as `allow`/`deny` rules.
#[derive(Debug, Clone, PartialEq)]
pub enum Matcher {
    /// Any of these conditions.
    Conds(Vec<Cond>),
    /// `remote_ip`: these client ranges (`negated`: every other client).
    RemoteIp {
        /// The ranges.
        ranges: Vec<String>,
        /// `not remote_ip ...`.
        negated: bool,
    },
}

/// How a route's condition relates to a middleware's matcher.
#[derive(Debug, Clone, PartialEq)]
pub enum Rel {
    /// Every request of the route matches.
    Covers,
    /// No request of the route matches.
    Disjoint,
    /// Some do: those of this narrower condition.
    Overlap(Cond),
    /// veloxy cannot write the intersection (two regexes).
    Unknown,
}

/// A path matcher token (`/api/*`, `/x`, `*.php`, `*`) as a condition.
pub fn path_cond(p: &str) -> PathCond {
    if p == "*" || p == "/*" {
        return PathCond::Any;
    }
    let star = p.matches('*').count();
    if star == 0 {
        return PathCond::Exact(p.to_string());
    }
    if star == 1 && p.ends_with('*') && p.starts_with('/') {
        return PathCond::Prefix(p[..p.len() - 1].to_string());
    }
    // Caddy: a leading `*` is a suffix match, a middle one matches within one segment.
    let mut re = String::from("^");
    let body = p.strip_prefix('*').map_or(p, |rest| {
        re.push_str(".*");
        rest
    });
    let parts: Vec<&str> = body.split('*').collect();
    for (i, part) in parts.iter().enumerate() {
        re.push_str(&regex_escape(part));
        if i + 1 < parts.len() {
            re.push_str(if i + 2 == parts.len() && body.ends_with('*') {
                ".*"
            } else {
                "[^/]*"
            });
        }
    }
    re.push('$');
    PathCond::Regex(re)
}

/// `s` with regex metacharacters escaped.
pub fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether a token written after a directive's name is an inline matcher: `*`, a path
/// starting with `/`, or `@name`.
pub fn is_inline_matcher(t: &Token) -> bool {
    !t.quoted && (t.text == "*" || t.text.starts_with('/') || t.text.starts_with('@'))
}

/// A named matcher's definition: `@name matcher args` or `@name { matcher args ... }`.
/// `Err` names what veloxy cannot match on.
pub fn define(line: &Line) -> Result<Matcher, String> {
    if let Some(why) = line.unresolved() {
        return Err(why.to_string());
    }
    let mut acc = Acc::default();
    if line.toks.len() > 1 {
        // `@name path /a /b` or the shorthand `@name /a /b`? Caddy requires a matcher name.
        acc.add(&line.toks[1].text, &line.toks[2..], line.body())?;
    }
    for l in line.body() {
        acc.add(l.name(), l.args(), l.body())?;
    }
    acc.finish()
}

#[derive(Default)]
struct Acc {
    alts: Vec<Cond>,
    remote: Option<(Vec<String>, bool)>,
    other: bool,
}

impl Acc {
    fn base(&mut self) -> &mut Vec<Cond> {
        if self.alts.is_empty() {
            self.alts.push(Cond::default());
        }
        self.other = true;
        &mut self.alts
    }

    fn add(&mut self, kind: &str, args: &[Token], block: &[Line]) -> Result<(), String> {
        let vals: Vec<&str> = args.iter().map(|t| t.text.as_str()).collect();
        match kind {
            "path" => {
                if vals.is_empty() {
                    return Err("path matcher without a path".into());
                }
                let base = self.base().clone();
                let paths: Vec<PathCond> = vals.iter().map(|p| path_cond(p)).collect();
                let mut out = Vec::new();
                for c in &base {
                    for p in &paths {
                        if c.path != PathCond::Any {
                            return Err("two path matchers in one matcher set".into());
                        }
                        out.push(Cond {
                            path: p.clone(),
                            ..c.clone()
                        });
                    }
                }
                self.alts = out;
            }
            "path_regexp" => {
                let re = match vals.as_slice() {
                    [re] | [_, re] => re.to_string(),
                    _ => return Err("path_regexp needs one regular expression".into()),
                };
                for c in self.base() {
                    c.path = PathCond::Regex(re.clone());
                }
            }
            "host" => {
                let hosts: Vec<String> = vals.iter().map(|h| h.to_ascii_lowercase()).collect();
                if hosts
                    .iter()
                    .any(|h| h.contains('*') && !h.starts_with("*."))
                {
                    return Err(format!(
                        "host pattern {hosts:?}: veloxy matches exact names and *.suffix"
                    ));
                }
                for c in self.base() {
                    c.hosts = hosts.clone();
                }
            }
            "method" => {
                let m: Vec<String> = vals.iter().map(|m| m.to_ascii_uppercase()).collect();
                for c in self.base() {
                    c.methods = m.clone();
                }
            }
            "header" => {
                let (name, value) =
                    match vals.as_slice() {
                        [n, v] => (n.to_string(), v.to_string()),
                        [n] => {
                            return Err(format!(
                            "header matcher on the presence of {n} (veloxy matches exact values)"
                        ))
                        }
                        _ => return Err(
                            "header matcher with several values (veloxy matches one exact value)"
                                .into(),
                        ),
                    };
                if value.contains('*') {
                    return Err(format!(
                        "header matcher {name} with a wildcard value (veloxy matches exact values)"
                    ));
                }
                for c in self.base() {
                    c.headers.insert(name.clone(), value.clone());
                }
            }
            "query" => {
                for v in &vals {
                    let Some((k, val)) = v.split_once('=') else {
                        return Err(format!("query matcher {v} (veloxy matches key=value)"));
                    };
                    if val.contains('*') {
                        return Err(format!(
                            "query matcher {v} with a wildcard (veloxy matches exact values)"
                        ));
                    }
                    for c in self.base() {
                        c.query.insert(k.to_string(), val.to_string());
                    }
                }
            }
            "remote_ip" | "client_ip" => {
                let ranges: Vec<String> = vals
                    .iter()
                    .filter(|v| **v != "forwarded")
                    .map(|v| v.to_string())
                    .collect();
                if vals.contains(&"forwarded") {
                    return Err(
                        "remote_ip forwarded (the client address from X-Forwarded-For)".into(),
                    );
                }
                self.remote = Some((ranges, false));
            }
            "not" => {
                let inner_kind = vals.first().copied();
                match (inner_kind, block) {
                    (Some("remote_ip" | "client_ip"), []) => {
                        self.remote =
                            Some((vals[1..].iter().map(|v| v.to_string()).collect(), true));
                    }
                    _ => return Err("not (veloxy has no negated conditions)".into()),
                }
            }
            other => return Err(format!("{other} matcher")),
        }
        Ok(())
    }

    fn finish(self) -> Result<Matcher, String> {
        match (self.remote, self.other) {
            (Some((ranges, negated)), false) => Ok(Matcher::RemoteIp { ranges, negated }),
            (Some(_), true) => {
                Err("remote_ip together with other conditions (veloxy's address lists are rules, not conditions)".into())
            }
            (None, _) => Ok(Matcher::Conds(if self.alts.is_empty() {
                vec![Cond::default()]
            } else {
                self.alts
            })),
        }
    }
}

/// How `route` relates to the matcher condition `m`.
pub fn relate(route: &Cond, m: &Cond) -> Rel {
    let mut out = route.clone();
    let mut covers = true;
    // Hosts.
    if !m.hosts.is_empty() {
        if route.hosts.is_empty() {
            out.hosts = m.hosts.clone();
            covers = false;
        } else {
            let both: Vec<String> = route
                .hosts
                .iter()
                .filter(|h| m.hosts.contains(h))
                .cloned()
                .collect();
            if both.is_empty() {
                return Rel::Disjoint;
            }
            if both.len() < route.hosts.len() {
                covers = false;
            }
            out.hosts = both;
        }
    }
    // Path.
    match path_rel(&route.path, &m.path) {
        PathRel::Covers => {}
        PathRel::Disjoint => return Rel::Disjoint,
        PathRel::Narrow(p) => {
            out.path = p;
            covers = false;
        }
        PathRel::Unknown => return Rel::Unknown,
    }
    // Methods.
    if !m.methods.is_empty() {
        if route.methods.is_empty() {
            out.methods = m.methods.clone();
            covers = false;
        } else {
            let both: Vec<String> = route
                .methods
                .iter()
                .filter(|x| m.methods.contains(x))
                .cloned()
                .collect();
            if both.is_empty() {
                return Rel::Disjoint;
            }
            covers &= both.len() == route.methods.len();
            out.methods = both;
        }
    }
    for (map_r, map_m, map_o) in [
        (&route.headers, &m.headers, &mut out.headers),
        (&route.query, &m.query, &mut out.query),
    ] {
        for (k, v) in map_m {
            match map_r.get(k) {
                Some(rv) if rv == v => {}
                Some(_) => return Rel::Disjoint,
                None => {
                    map_o.insert(k.clone(), v.clone());
                    covers = false;
                }
            }
        }
    }
    if covers {
        Rel::Covers
    } else {
        Rel::Overlap(out)
    }
}

enum PathRel {
    Covers,
    Disjoint,
    Narrow(PathCond),
    Unknown,
}

fn path_rel(r: &PathCond, m: &PathCond) -> PathRel {
    use PathCond::*;
    match (r, m) {
        (_, Any) => PathRel::Covers,
        (Any, m) => PathRel::Narrow(m.clone()),
        (a, b) if a == b => PathRel::Covers,
        (Prefix(a), Prefix(b)) if a.starts_with(b.as_str()) => PathRel::Covers,
        (Prefix(a), Prefix(b)) if b.starts_with(a.as_str()) => PathRel::Narrow(Prefix(b.clone())),
        (Prefix(_), Prefix(_)) => PathRel::Disjoint,
        (Exact(a), Prefix(b)) if a.starts_with(b.as_str()) => PathRel::Covers,
        (Exact(_), Prefix(_)) => PathRel::Disjoint,
        (Prefix(a), Exact(b)) if b.starts_with(a.as_str()) => PathRel::Narrow(Exact(b.clone())),
        (Prefix(_), Exact(_)) | (Exact(_), Exact(_)) => PathRel::Disjoint,
        _ => PathRel::Unknown,
    }
}

/// The length Caddy sorts same-named directives by: a single path matcher's length (longest
/// first), `None` without a path matcher.
pub fn specificity(c: &[Cond]) -> Option<usize> {
    match c {
        [one] => match &one.path {
            PathCond::Prefix(p) => Some(p.len() * 2),
            PathCond::Exact(p) => Some(p.len() * 2 + 1),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(path_cond("/api/*"), PathCond::Prefix("/api/".into()));
        assert_eq!(path_cond("/x"), PathCond::Exact("/x".into()));
        assert_eq!(path_cond("*"), PathCond::Any);
        assert_eq!(path_cond("*.php"), PathCond::Regex("^.*\\.php$".into()));
        assert_eq!(
            path_cond("/u/*/edit"),
            PathCond::Regex("^/u/[^/]*/edit$".into())
        );
    }

    #[test]
    fn relations() {
        let api = Cond {
            path: PathCond::Prefix("/api/".into()),
            ..Default::default()
        };
        let any = Cond::default();
        assert_eq!(relate(&api, &any), Rel::Covers);
        assert_eq!(relate(&any, &api), Rel::Overlap(api.clone()));
        let static_ = Cond {
            path: PathCond::Prefix("/static/".into()),
            ..Default::default()
        };
        assert_eq!(relate(&api, &static_), Rel::Disjoint);
    }
}
