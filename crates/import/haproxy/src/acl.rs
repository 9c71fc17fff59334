//! ACLs (`acl NAME FETCH [flags] PATTERN...` and anonymous `{ ... }`) and the conditions of
//! rules (`if`/`unless`, `!`, `or`/`||`, implicit AND), turned into terms a route can match.

use std::collections::BTreeMap;
use std::path::Path;

use crate::matcher::{Match, Meet};

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
    /// The client's tracked request rate exceeds a limit.
    Rate(crate::limit::RateTest),
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
    /// The ports named in Host patterns (`name:8080`), left out of the route's host.
    pub ports: Vec<u16>,
}

impl Acl {
    /// The difference of its Host patterns' ports, for a frontend listening on `binds`: none
    /// when every bind is on a port the patterns name (clients send that port).
    pub fn port_note(&self, binds: &[u16]) -> Option<String> {
        if self.ports.is_empty()
            || (!binds.is_empty() && binds.iter().all(|b| self.ports.contains(b)))
        {
            return None;
        }
        let ports: Vec<String> = self.ports.iter().map(|p| format!(":{p}")).collect();
        Some(format!(
            "veloxy matches the host name on any port (HAProxy: only a Host naming {})",
            ports.join(" or ")
        ))
    }
}

/// The named ACLs of a proxy: each name's lines (OR-ed), or why one is refused.
#[derive(Debug, Default)]
pub struct Acls {
    named: BTreeMap<String, Result<Acl, String>>,
    /// The ports the frontend listens on (for Host patterns with a port).
    pub ports: Vec<u16>,
    /// The proxy's tracking rules (for request-rate tests).
    pub rates: crate::limit::ProxyRates,
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
                have.ports.extend(a.ports);
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
        if inline {
            for n in acl.note.iter().cloned().chain(acl.port_note(&acls.ports)) {
                if !notes.contains(&n) {
                    notes.push(n);
                }
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
        ..Default::default()
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

pub use crate::fetch::{check_regex, escape_regex, parse_acl};
