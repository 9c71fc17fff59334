//! ACLs (`acl NAME FETCH [flags] PATTERN...` and anonymous `{ ... }`) and the conditions of
//! rules (`if`/`unless`, `!`, `or`/`||`, implicit AND), turned into terms a route can match.

use std::collections::BTreeMap;
use std::path::Path;

use crate::matcher::{Host, Match, Meet, PathPat};

/// One alternative of an ACL: what a request must have for it to match.
#[derive(Debug, Clone, PartialEq)]
pub enum Lit {
    /// Route conditions.
    Route(Match),
    /// The client address is in one of these (`src`).
    Src(Vec<String>),
    /// The request carries credentials of this userlist (and one of these groups, if any).
    Auth {
        /// The userlist.
        list: String,
        /// Groups (`http_auth_group`), empty for any user.
        groups: Vec<String>,
    },
    /// The TLS ClientHello names one of these (tcp mode `req.ssl_sni`).
    Sni(Vec<String>),
    /// Always true or always false.
    Const(bool),
}

/// An ACL's alternatives (any one matching makes it true), and a difference to report.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    /// OR of these.
    pub alts: Vec<Lit>,
    /// What veloxy matches differently.
    pub note: Option<String>,
}

/// The named ACLs of a proxy: each name's lines (OR-ed), or why one is refused.
#[derive(Debug, Default)]
pub struct Acls {
    named: BTreeMap<String, Result<Acl, String>>,
}

impl Acls {
    /// Adds a line of ACL `name` (lines with the same name are OR-ed).
    pub fn add(&mut self, name: &str, acl: Result<Acl, String>) {
        match (self.named.get_mut(name), acl) {
            (None, a) => {
                self.named.insert(name.to_string(), a);
            }
            (Some(Ok(have)), Ok(a)) => {
                have.alts.extend(a.alts);
                have.note = have.note.take().or(a.note);
            }
            (Some(slot @ Ok(_)), Err(e)) => *slot = Err(e),
            (Some(Err(_)), _) => {}
        }
    }
}

/// A condition in disjunctive normal form: any term true makes it true.
pub type Dnf = Vec<Term>;

/// One term: every positive literal holds and no negated one does.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Term {
    /// The route conditions of the positive literals.
    pub m: Match,
    /// Route conditions that must not hold.
    pub negs: Vec<Match>,
    /// Address and credential literals (negated: `true`).
    pub guards: Vec<(bool, Lit)>,
    /// SNI names (tcp mode).
    pub sni: Option<Vec<String>>,
}

/// The result of parsing a condition: its terms and the differences of the ACLs it used.
pub struct Cond {
    /// The terms.
    pub dnf: Dnf,
    /// Differences from the ACLs used.
    pub notes: Vec<String>,
}

/// Parses `ACL-EXPR` after `if`/`unless` (`words[0]` is `if` or `unless`), or `None` words
/// (no condition: always).
pub fn condition(words: &[String], acls: &Acls, base: &Path) -> Result<Cond, String> {
    if words.is_empty() {
        return Ok(Cond {
            dnf: vec![Term::default()],
            notes: Vec::new(),
        });
    }
    let unless = match words[0].as_str() {
        "if" => false,
        "unless" => true,
        other => return Err(format!("expected if or unless, found '{other}'")),
    };
    let mut notes = Vec::new();
    // OR of ANDs of entries; an entry is an OR of signed literals (negated: true).
    let mut ors: Vec<Vec<Vec<(bool, Lit)>>> = vec![Vec::new()];
    let mut i = 1;
    while i < words.len() {
        let w = &words[i];
        if w == "or" || w == "||" {
            ors.push(Vec::new());
            i += 1;
            continue;
        }
        let (neg, w) = match w.strip_prefix('!') {
            Some("") => {
                i += 1;
                (
                    true,
                    words
                        .get(i)
                        .ok_or("'!' at the end of the condition")?
                        .as_str(),
                )
            }
            Some(rest) => (true, rest),
            None => (false, w.as_str()),
        };
        let (acl, inline) = if w == "{" {
            let end = words[i..]
                .iter()
                .position(|x| x == "}")
                .ok_or("'{' without '}'")?;
            let inner: Vec<&str> = words[i + 1..i + end].iter().map(String::as_str).collect();
            i += end + 1;
            (parse_acl(&inner, base)?, true)
        } else {
            i += 1;
            (named(w, acls)?, false)
        };
        // A named ACL's difference is reported on its own line.
        if let Some(n) = acl.note.filter(|_| inline) {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
        let and = ors.last_mut().expect("one");
        if neg {
            // not (a or b) = not a and not b
            and.extend(acl.alts.into_iter().map(|l| vec![(true, l)]));
        } else {
            and.push(acl.alts.into_iter().map(|l| (false, l)).collect());
        }
    }
    let mut dnf = Vec::new();
    for and in ors {
        dnf.extend(expand_and(&and)?);
    }
    if unless {
        dnf = negate(&dnf)?;
    }
    Ok(Cond { dnf, notes })
}

fn named(name: &str, acls: &Acls) -> Result<Acl, String> {
    if let Some(a) = builtin(name) {
        return Ok(a);
    }
    match acls.named.get(name) {
        Some(Ok(a)) => Ok(a.clone()),
        Some(Err(e)) => Err(format!("acl {name} is refused ({e})")),
        None => Err(format!("acl {name} is not defined")),
    }
}

fn builtin(name: &str) -> Option<Acl> {
    let methods = |m: &[&str]| {
        Lit::Route(Match {
            methods: Some(m.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        })
    };
    let lit = match name {
        "TRUE" | "HTTP" | "HTTP_URL_SLASH" => Lit::Const(true),
        "FALSE" => Lit::Const(false),
        "LOCALHOST" => Lit::Src(vec!["127.0.0.0/8".into(), "::1".into()]),
        "METH_GET" => methods(&["GET", "HEAD"]),
        "METH_HEAD" => methods(&["HEAD"]),
        "METH_POST" => methods(&["POST"]),
        "METH_PUT" => methods(&["PUT"]),
        "METH_DELETE" => methods(&["DELETE"]),
        "METH_OPTIONS" => methods(&["OPTIONS"]),
        "METH_TRACE" => methods(&["TRACE"]),
        "METH_CONNECT" => methods(&["CONNECT"]),
        _ => return None,
    };
    Some(Acl {
        alts: vec![lit],
        note: None,
    })
}

/// An AND of entries (each an OR of signed literals) as terms.
fn expand_and(and: &[Vec<(bool, Lit)>]) -> Result<Dnf, String> {
    let mut terms = vec![Term::default()];
    for entry in and {
        let mut next = Vec::new();
        for t in &terms {
            for (neg, l) in entry {
                let mut t = t.clone();
                let holds = if *neg {
                    add_neg(&mut t, l)?
                } else {
                    add_pos(&mut t, l)?
                };
                if holds {
                    next.push(t);
                }
            }
        }
        terms = next;
        if terms.len() > 256 {
            return Err("the condition expands into too many cases".into());
        }
    }
    Ok(terms)
}

/// Adds a positive literal; `false` when the term can never hold.
fn add_pos(t: &mut Term, l: &Lit) -> Result<bool, String> {
    match l {
        Lit::Const(b) => Ok(*b),
        Lit::Route(m) => match t.m.meet(m) {
            Meet::Empty => Ok(false),
            Meet::Both(m) => {
                t.m = m;
                Ok(true)
            }
            Meet::Unknown => Err("two path conditions that no single route can express".into()),
        },
        Lit::Sni(names) => {
            t.sni = Some(match &t.sni {
                None => names.clone(),
                Some(have) => have.iter().filter(|n| names.contains(n)).cloned().collect(),
            });
            Ok(!t.sni.as_ref().is_some_and(Vec::is_empty))
        }
        g => {
            t.guards.push((false, g.clone()));
            Ok(true)
        }
    }
}

/// Adds a negated literal; `false` when the term can never hold.
fn add_neg(t: &mut Term, l: &Lit) -> Result<bool, String> {
    match l {
        Lit::Const(b) => Ok(!b),
        Lit::Route(m) if *m == Match::tls(true) || *m == Match::tls(false) => {
            add_pos(t, &Lit::Route(Match::tls(m.tls != Some(true))))
        }
        Lit::Route(m) => {
            if t.m.within(m) {
                return Ok(false);
            }
            t.negs.push(m.clone());
            Ok(true)
        }
        Lit::Sni(_) => Err("a negated SNI condition".into()),
        g => {
            t.guards.push((true, g.clone()));
            Ok(true)
        }
    }
}

/// `unless`: the negation of a DNF, as a DNF.
fn negate(dnf: &Dnf) -> Result<Dnf, String> {
    // not (T1 or T2) = (not T1) and (not T2); not T = any of its literals false.
    let mut and: Vec<Vec<(bool, Lit)>> = Vec::new();
    for t in dnf {
        if t.sni.is_some() {
            return Err("'unless' on an SNI condition".into());
        }
        let mut entry = Vec::new();
        if t.m != Match::default() {
            entry.push((true, Lit::Route(t.m.clone())));
        }
        entry.extend(t.negs.iter().map(|n| (false, Lit::Route(n.clone()))));
        entry.extend(t.guards.iter().map(|(neg, g)| (!neg, g.clone())));
        if entry.is_empty() {
            return Ok(Vec::new());
        }
        and.push(entry);
    }
    expand_and(&and)
}

/// Parses an ACL body: `FETCH[,conv] [-i] [-m METHOD] [-f FILE] [--] PATTERN...`.
pub fn parse_acl(words: &[&str], base: &Path) -> Result<Acl, String> {
    let Some((&fetch_conv, rest)) = words.split_first() else {
        return Err("an empty ACL".into());
    };
    let parts = split_top(fetch_conv);
    let mut parts = parts.iter().map(String::as_str);
    let fetch = parts.next().unwrap_or_default().to_string();
    let mut ci = false;
    let mut strip_port = false;
    for conv in parts {
        match conv {
            "lower" => ci = true,
            "field(1,:)" | "host_only" => strip_port = true,
            other => return Err(format!("converter {other}")),
        }
    }
    let mut method: Option<String> = None;
    let mut patterns: Vec<String> = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        match rest[i] {
            "-i" => ci = true,
            "-n" | "-u" => {}
            "-m" => {
                i += 1;
                method = Some(rest.get(i).ok_or("-m needs a method")?.to_string());
            }
            "-f" => {
                i += 1;
                let f = rest.get(i).ok_or("-f needs a file")?;
                let text = std::fs::read_to_string(base.join(f))
                    .map_err(|e| format!("pattern file {f}: {e}"))?;
                patterns.extend(
                    text.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty() && !l.starts_with('#'))
                        .map(str::to_string),
                );
            }
            "--" => {
                patterns.extend(rest[i + 1..].iter().map(|s| s.to_string()));
                break;
            }
            p => patterns.push(p.to_string()),
        }
        i += 1;
    }
    let (name, arg) = match fetch.split_once('(') {
        Some((n, a)) => (n.to_string(), Some(a.trim_end_matches(')').to_string())),
        None => (fetch.clone(), None),
    };
    let name = name.strip_prefix("req.").unwrap_or(&name).to_string();
    let fetch_args = Fetch {
        name,
        arg,
        ci,
        strip_port,
        method,
    };
    fetch_args.build(&patterns)
}

/// `a,b(c,d),e` split at the commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut depth = 0;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(String::new());
                continue;
            }
            _ => {}
        }
        out.last_mut().expect("one").push(c);
    }
    out
}

struct Fetch {
    name: String,
    arg: Option<String>,
    ci: bool,
    strip_port: bool,
    method: Option<String>,
}

impl Fetch {
    fn build(&self, patterns: &[String]) -> Result<Acl, String> {
        let (base, suffix) = match self.name.split_once('_') {
            Some((b, s))
                if matches!(
                    s,
                    "beg"
                        | "end"
                        | "reg"
                        | "sub"
                        | "dom"
                        | "dir"
                        | "len"
                        | "cnt"
                        | "val"
                        | "ip"
                        | "str"
                ) =>
            {
                (b.to_string(), Some(s.to_string()))
            }
            _ => (self.name.clone(), None),
        };
        let method = self.method.clone().or(suffix.clone());
        let mut note = None;
        let alts = match (base.as_str(), self.arg.as_deref()) {
            ("hdr" | "fhdr", Some(h)) if h.eq_ignore_ascii_case("host") => {
                if !self.ci {
                    note = Some("Host is compared case-insensitively (HAProxy compares it as written without -i)".to_string());
                }
                if !self.strip_port && method.as_deref() != Some("dom") {
                    let n = "a Host with a port matches too (veloxy ignores the port)";
                    note = Some(match note {
                        Some(x) => format!("{x}; {n}"),
                        None => n.to_string(),
                    });
                }
                host_alts(method.as_deref(), patterns)?
            }
            ("hdr" | "fhdr", Some(h)) => {
                if method.as_deref().unwrap_or("str") != "str" {
                    return Err(format!(
                        "{} on header {h}: veloxy matches a header's exact value only",
                        method.unwrap_or_default()
                    ));
                }
                note = Some(format!(
                    "{h} is compared with its first value{}",
                    if self.ci {
                        ", exactly (HAProxy: any value, ignoring case)"
                    } else {
                        " (HAProxy: any value)"
                    }
                ));
                patterns
                    .iter()
                    .map(|p| {
                        let mut m = Match::default();
                        m.headers.insert(h.to_string(), p.clone());
                        Lit::Route(m)
                    })
                    .collect()
            }
            ("path" | "url", None) => {
                if base == "url"
                    && !matches!(
                        method.as_deref(),
                        Some("beg" | "reg" | "sub" | "end" | "dir")
                    )
                {
                    return Err("url: veloxy matches the path without the query".into());
                }
                if base == "url" {
                    note = Some(
                        "url matched on the path (the query is not part of it in veloxy)".into(),
                    );
                }
                path_alts(method.as_deref(), patterns, self.ci)?
            }
            ("method", None) => vec![Lit::Route(Match {
                methods: Some({
                    let mut m: Vec<String> = patterns.iter().map(|p| p.to_uppercase()).collect();
                    m.sort();
                    m.dedup();
                    m
                }),
                ..Default::default()
            })],
            ("src", None) => vec![Lit::Src(patterns.to_vec())],
            ("ssl_fc", None) => vec![Lit::Route(Match::tls(true))],
            ("ssl_sni" | "req_ssl_sni", None) if method.as_deref().unwrap_or("str") == "str" => {
                vec![Lit::Sni(
                    patterns.iter().map(|p| p.to_lowercase()).collect(),
                )]
            }
            ("ssl_sni" | "req_ssl_sni", None) if method.as_deref() == Some("end") => {
                vec![Lit::Sni(
                    patterns
                        .iter()
                        .map(|p| format!("*.{}", p.trim_start_matches('.')))
                        .collect(),
                )]
            }
            ("ssl_hello_type" | "req_ssl_hello_type", None) => vec![Lit::Const(true)],
            ("url_param" | "urlp", Some(q)) if method.as_deref().unwrap_or("str") == "str" => {
                patterns
                    .iter()
                    .map(|p| {
                        let mut m = Match::default();
                        m.query.insert(q.to_string(), p.clone());
                        Lit::Route(m)
                    })
                    .collect()
            }
            ("http_auth", Some(l)) => vec![Lit::Auth {
                list: l.to_string(),
                groups: Vec::new(),
            }],
            ("http_auth_group", Some(l)) => vec![Lit::Auth {
                list: l.to_string(),
                groups: patterns.to_vec(),
            }],
            ("always_true", None) => vec![Lit::Const(true)],
            ("always_false", None) => vec![Lit::Const(false)],
            _ => {
                return Err(format!(
                    "fetch {}{} has no veloxy equivalent",
                    self.name,
                    self.arg
                        .as_deref()
                        .map(|a| format!("({a})"))
                        .unwrap_or_default()
                ))
            }
        };
        Ok(Acl { alts, note })
    }
}

fn host_alts(method: Option<&str>, patterns: &[String]) -> Result<Vec<Lit>, String> {
    let route = |h: Host| {
        Lit::Route(Match {
            host: Some(h),
            ..Default::default()
        })
    };
    let mut out = Vec::new();
    for p in patterns {
        let p = p.to_lowercase();
        match method.unwrap_or("str") {
            "str" => out.push(route(Host::Exact(p))),
            "end" if p.starts_with('.') => out.push(route(Host::Suffix(p))),
            "dom" => {
                out.push(route(Host::Exact(p.clone())));
                out.push(route(Host::Suffix(format!(".{p}"))));
            }
            m => {
                return Err(format!(
                    "host match -m {m} {p}: veloxy matches exact names and *.suffix"
                ))
            }
        }
    }
    Ok(out)
}

fn path_alts(method: Option<&str>, patterns: &[String], ci: bool) -> Result<Vec<Lit>, String> {
    let route = |p: PathPat| {
        Lit::Route(Match {
            path: Some(p),
            ..Default::default()
        })
    };
    let flags = if ci { "(?i)" } else { "" };
    let mut out = Vec::new();
    for p in patterns {
        let q = escape_regex(p);
        let pat = match (method.unwrap_or("str"), ci) {
            ("str", false) => PathPat::Exact(p.clone()),
            ("beg", false) => PathPat::Prefix(p.clone()),
            ("str", true) => PathPat::Regex(format!("(?i)^{q}$")),
            ("beg", true) => PathPat::Regex(format!("(?i)^{q}")),
            ("end", _) => PathPat::Regex(format!("{flags}{q}$")),
            ("sub", _) => PathPat::Regex(format!("{flags}{q}")),
            ("dir", _) => PathPat::Regex(format!(
                "{flags}(?:^|/){}(?:/|$)",
                escape_regex(p.trim_matches('/'))
            )),
            ("reg", _) => {
                check_regex(p)?;
                PathPat::Regex(format!("{flags}{p}"))
            }
            (m, _) => return Err(format!("path match -m {m}")),
        };
        out.push(route(pat));
    }
    Ok(out)
}

/// Refuses what Rust's regex syntax does not take (look-around, back-references).
pub fn check_regex(r: &str) -> Result<(), String> {
    regex_syntax::Parser::new()
        .parse(r)
        .map(|_| ())
        .map_err(|e| {
            format!(
                "regex {r:?} is not Rust regex syntax ({})",
                e.to_string().lines().last().unwrap_or("")
            )
        })
}

/// `s` as a regex matching itself literally.
pub fn escape_regex(s: &str) -> String {
    regex_syntax::escape(s)
}
