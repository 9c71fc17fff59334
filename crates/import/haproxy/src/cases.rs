//! HAProxy decides first-match: `http-request` rules in order, then `use_backend` rules in
//! order, then `default_backend`. veloxy routes by specificity (host, then path kind and
//! length, then conditions, then file order). This module turns an ordered list of rules into
//! cases (a match and what answers it), then into routes veloxy ranks the same way: where
//! veloxy would prefer a later case for requests an earlier one also matches, a route for the
//! overlap with the earlier case's answer is added, ranked above the later one.

use veloxy_import::Loc;

use crate::acl::{Dnf, Term};
use crate::matcher::{before, Match, Meet, PathPat, Ranked};

/// What answers a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Proxied to this upstream group.
    Backend(String),
    /// A redirect.
    Redirect {
        /// Location template.
        to: String,
        /// Status.
        status: u16,
    },
    /// A fixed answer.
    Respond {
        /// Status.
        status: u16,
        /// Body.
        body: String,
        /// Content-Type.
        ctype: String,
    },
}

/// A header operation, in HAProxy's order.
#[derive(Debug, Clone, PartialEq)]
pub enum HdrOp {
    /// `set-header`.
    Set(String, String),
    /// `add-header`.
    Add(String, String),
    /// `del-header`.
    Del(String),
}

/// What happens to a request on its way (and to the answer).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rules {
    /// Request header operations.
    pub req: Vec<HdrOp>,
    /// Response header operations (proxied answers).
    pub resp: Vec<HdrOp>,
    /// The upstream path template.
    pub rewrite: Option<String>,
    /// Client addresses allowed (others 403).
    pub allow: Option<Vec<String>>,
    /// Client addresses refused.
    pub deny: Vec<String>,
    /// Basic auth: (realm, htpasswd file).
    pub auth: Option<(String, String)>,
    /// A request-rate limit (the stick-table idiom).
    pub rate: Option<crate::limit::RateLimit>,
    /// The caches `cache-use` looks answers up in, in order (the first one answers are also
    /// stored in is kept).
    pub cache: Vec<String>,
}

/// One case: requests matching `m` get `target` with `rules`.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// The conditions.
    pub m: Match,
    /// What answers.
    pub target: Target,
    /// What is done on the way.
    pub rules: Rules,
    /// The directives it came from (for `# from`).
    pub from: Vec<Loc>,
}

impl Case {
    /// A catch-all case.
    pub fn all(target: Target, from: &Loc) -> Case {
        Case {
            m: Match::default(),
            target,
            rules: Rules::default(),
            from: vec![from.clone()],
        }
    }

    fn outcome_eq(&self, o: &Case) -> bool {
        self.target == o.target && self.rules == o.rules
    }

    fn meet(&self, m: &Match) -> Result<Option<Case>, String> {
        match self.m.meet(m) {
            Meet::Empty => Ok(None),
            Meet::Both(m) => Ok(Some(Case { m, ..self.clone() })),
            Meet::Unknown => Err(overlap_error(&self.m, m)),
        }
    }
}

fn overlap_error(a: &Match, b: &Match) -> String {
    let p = |m: &Match| match &m.path {
        Some(PathPat::Regex(r)) => format!("path regex {r}"),
        Some(PathPat::Prefix(r)) => format!("path prefix {r}"),
        Some(PathPat::Exact(r)) => format!("path {r}"),
        None => "any path".into(),
    };
    format!(
        "no veloxy route expresses the requests matching both {} and {}",
        p(a),
        p(b)
    )
}

/// A change a non-terminal rule makes.
#[derive(Debug, Clone)]
pub enum Edit {
    /// A request header operation (frontend rules run before the backend's).
    Req(HdrOp),
    /// A response header operation (frontend rules run after the backend's).
    Resp(HdrOp),
    /// `set-path` / `replace-path`: a template; `{path}` stands for the path so far.
    Path(String),
    /// Only these addresses.
    Allow(Vec<String>),
    /// Not these addresses.
    Deny(Vec<String>),
    /// Basic auth (realm, file).
    Auth(String, String),
    /// A request-rate limit.
    Rate(crate::limit::RateLimit),
    /// `http-request cache-use NAME`.
    Cache(String),
}

impl Edit {
    /// Applies this edit, made before (`early`) or after the rules already in `r`.
    fn apply(&self, r: &mut Rules, early: bool) -> Result<(), String> {
        match self {
            Edit::Req(op) if early => r.req.insert(0, op.clone()),
            Edit::Req(op) => r.req.push(op.clone()),
            Edit::Resp(op) if early => r.resp.push(op.clone()),
            Edit::Resp(op) => r.resp.insert(0, op.clone()),
            Edit::Path(t) => {
                r.rewrite = Some(match (&r.rewrite, early) {
                    (None, _) => t.clone(),
                    (Some(later), true) => later.replace("{path}", t),
                    (Some(earlier), false) => t.replace("{path}", earlier),
                })
            }
            Edit::Allow(a) => match &r.allow {
                None => r.allow = Some(a.clone()),
                Some(have) if have == a => {}
                Some(_) => return Err("two different lists of allowed addresses".into()),
            },
            Edit::Deny(d) => r.deny.extend(d.iter().cloned()),
            Edit::Auth(realm, file) => match &r.auth {
                Some(have) if have != &(realm.clone(), file.clone()) => {
                    return Err("two different basic auth rules".into())
                }
                _ => r.auth = Some((realm.clone(), file.clone())),
            },
            Edit::Rate(l) => r.rate = Some(crate::limit::combine(r.rate.take(), l)?),
            Edit::Cache(n) if r.cache.contains(n) => {}
            Edit::Cache(n) if early => r.cache.insert(0, n.clone()),
            Edit::Cache(n) => r.cache.push(n.clone()),
        }
        Ok(())
    }
}

/// A rule of an ordered list.
#[derive(Debug, Clone)]
pub enum Step {
    /// Requests matching `cond` stop here with these cases' answers.
    Stop(Dnf, Vec<Case>),
    /// Requests matching `cond` get `edit`, then go on.
    Edit(Dnf, Edit),
}

/// The cases of `steps` followed by `later` (which must end with a catch-all). `early`: the
/// steps run before the rules already in `later`'s cases (request side).
pub fn expand(steps: &[Step], mut later: Vec<Case>, early: bool) -> Result<Vec<Case>, String> {
    for step in steps.iter().rev() {
        later = apply(step, later, early)?;
        if later.len() > 4000 {
            return Err("the rules expand into too many routes".into());
        }
    }
    Ok(later)
}

/// One step in front of `later`.
pub fn apply(step: &Step, later: Vec<Case>, early: bool) -> Result<Vec<Case>, String> {
    match step {
        Step::Stop(dnf, nested) => {
            let mut cases = later;
            for t in dnf.iter().rev() {
                cases = stop(t, nested, cases)?;
            }
            Ok(cases)
        }
        Step::Edit(dnf, edit) => {
            let mut out = Vec::new();
            for c in &later {
                out.extend(edit_terms(c, dnf, edit, early)?);
            }
            Ok(out)
        }
    }
}

fn stop(t: &Term, nested: &[Case], later: Vec<Case>) -> Result<Vec<Case>, String> {
    let mut out = Vec::new();
    for n in &t.negs {
        let Meet::Both(mn) = t.m.meet(n) else {
            continue;
        };
        for c in &later {
            out.extend(c.meet(&mn)?);
        }
    }
    for x in nested {
        out.extend(x.meet(&t.m)?);
    }
    out.extend(later);
    Ok(out)
}

fn edit_terms(c: &Case, terms: &[Term], edit: &Edit, early: bool) -> Result<Vec<Case>, String> {
    let Some((t, rest)) = terms.split_first() else {
        return Ok(vec![c.clone()]);
    };
    let mut out = Vec::new();
    let Some(cm) = c.meet(&t.m)? else {
        return edit_terms(c, rest, edit, early);
    };
    for n in &t.negs {
        if let Some(cn) = cm.meet(n)? {
            out.extend(edit_terms(&cn, rest, edit, early)?);
        }
    }
    let mut changed = cm;
    edit.apply(&mut changed.rules, early)?;
    out.push(changed);
    out.extend(edit_terms(c, rest, edit, early)?);
    Ok(out)
}

/// Splits every case by TLS when any case depends on it, so each case is on TLS or plain
/// listeners only.
pub fn split_tls(cases: Vec<Case>) -> Vec<Case> {
    if cases.iter().all(|c| c.m.tls.is_none()) {
        return cases;
    }
    let mut out = Vec::new();
    for c in cases {
        if c.m.tls.is_some() {
            out.push(c);
            continue;
        }
        for on in [true, false] {
            let mut x = c.clone();
            x.m.tls = Some(on);
            out.push(x);
        }
    }
    out
}

/// The routes that answer like the first-match `cases`: each with the index of the case
/// whose answer it gives. Unreachable cases are left out.
pub fn routes(cases: &[Case]) -> Result<Vec<(Match, usize)>, String> {
    // Base routes: one per case no earlier case covers entirely.
    let mut live: Vec<usize> = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        if !live.iter().any(|&j| c.m.within(&cases[j].m)) {
            live.push(i);
        }
    }
    let mut routes: Vec<(Match, usize)> = live.iter().map(|&i| (cases[i].m.clone(), i)).collect();
    for _round in 0..64 {
        let mut added = false;
        sort(&mut routes);
        let first_of = |rs: &[(Match, usize)], m: &Match| -> usize {
            match &m.path {
                Some(PathPat::Regex(r)) => rs
                    .iter()
                    .enumerate()
                    .filter(|(_, (x, _))| matches!(&x.path, Some(PathPat::Regex(y)) if y == r))
                    .map(|(i, _)| i)
                    .min()
                    .unwrap_or(0),
                _ => 0,
            }
        };
        let snapshot = routes.clone();
        let pos = |m: &Match, case: usize| {
            snapshot
                .iter()
                .position(|(x, c)| x == m && *c == case)
                .unwrap_or(0)
        };
        for (xm, xc) in &snapshot {
            for &a in live.iter().filter(|&&a| a < *xc) {
                if cases[a].outcome_eq(&cases[*xc]) {
                    continue;
                }
                let am = &cases[a].m;
                let meet = xm.meet(am);
                if matches!(meet, Meet::Empty) {
                    continue;
                }
                let rx = Ranked {
                    m: xm,
                    index: pos(xm, *xc),
                    first_of_regex: first_of(&snapshot, xm),
                };
                let ra = Ranked {
                    m: am,
                    index: pos(am, a),
                    first_of_regex: first_of(&snapshot, am),
                };
                let both = match meet {
                    Meet::Empty => continue,
                    Meet::Both(b) => b,
                    Meet::Unknown if before(&rx, &ra) => return Err(overlap_error(xm, am)),
                    Meet::Unknown => continue,
                };
                if !before(&rx, &ra) {
                    continue;
                }
                if routes.iter().any(|(m, c)| *m == both && *c <= a) {
                    continue;
                }
                // The overlap already answered by a route of an earlier case than `a`?
                routes.retain(|(m, c)| !(*m == both && *c > a));
                routes.push((both, a));
                added = true;
            }
        }
        if !added {
            sort(&mut routes);
            // Drop routes another route with the same match (an earlier case) makes unreachable.
            let mut out: Vec<(Match, usize)> = Vec::new();
            for (m, c) in routes {
                if !out.iter().any(|(x, _)| *x == m) {
                    out.push((m, c));
                }
            }
            return Ok(out);
        }
    }
    Err("the rules overlap in too many ways".into())
}

/// File order: by case, the overlap routes (made later) before the case's own route.
fn sort(routes: &mut [(Match, usize)]) {
    routes.sort_by_key(|r| r.1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matcher::Host;
    use std::sync::Arc;

    fn loc() -> Loc {
        let f: Arc<str> = "t".into();
        Loc::new(&f, 1, 1)
    }

    fn case(m: Match, b: &str) -> Case {
        Case {
            m,
            target: Target::Backend(b.into()),
            rules: Rules::default(),
            from: vec![loc()],
        }
    }

    fn prefix(p: &str) -> Match {
        Match {
            path: Some(PathPat::Prefix(p.into())),
            ..Default::default()
        }
    }

    #[test]
    fn a_longer_later_prefix_is_shadowed() {
        let cases = vec![
            case(prefix("/api"), "a"),
            case(prefix("/api/admin"), "b"),
            case(Match::default(), "d"),
        ];
        let r = routes(&cases).unwrap();
        assert_eq!(r, vec![(prefix("/api"), 0), (Match::default(), 2)]);
    }

    #[test]
    fn host_after_path_gets_the_overlap() {
        let host = Match {
            host: Some(Host::Exact("x.com".into())),
            ..Default::default()
        };
        let cases = vec![
            case(prefix("/api"), "a"),
            case(host.clone(), "b"),
            case(Match::default(), "d"),
        ];
        let r = routes(&cases).unwrap();
        let both = Match {
            host: Some(Host::Exact("x.com".into())),
            path: Some(PathPat::Prefix("/api".into())),
            ..Default::default()
        };
        assert!(r.contains(&(both, 0)));
        assert!(r.contains(&(host, 1)));
    }
}
