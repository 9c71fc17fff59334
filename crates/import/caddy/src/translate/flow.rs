//! Caddy's handler chain as veloxy routes.
//!
//! Caddy sorts a site's directives by a fixed order (not file order; `route` blocks keep
//! theirs), runs middleware (headers, auth, encode, rewrites) whose matcher holds, and ends at
//! the first handler that answers (`respond`, `redir`, `reverse_proxy`, `file_server`);
//! `handle` blocks are exclusive branches. veloxy has one route per request class, each with
//! its rules and one answer, picked by specificity. So every answering directive becomes a
//! route for its matcher within its branch, carrying the middleware that holds for it; a
//! middleware whose matcher covers part of a route's requests splits that route in two (the
//! narrower part, with the rule, wins by veloxy's precedence: longer prefix, more conditions).

use std::collections::HashMap;

use toml::Value;
use veloxy_import::Loc;

use super::matcher::{self, relate, Cond, Matcher, PathCond, Rel};
use super::T;
use crate::parse::Line;

/// Caddy's directive order (httpcaddyfile's `defaultDirectiveOrder`, 2.8).
pub const ORDER: &[&str] = &[
    "tracing",
    "map",
    "vars",
    "fs",
    "root",
    "log_append",
    "skip_log",
    "log_skip",
    "log_name",
    "header",
    "copy_response_headers",
    "request_body",
    "redir",
    "method",
    "rewrite",
    "uri",
    "try_files",
    "basicauth",
    "basic_auth",
    "forward_auth",
    "request_header",
    "encode",
    "push",
    "intercept",
    "templates",
    "invoke",
    "handle",
    "handle_path",
    "route",
    "abort",
    "error",
    "copy_response",
    "respond",
    "metrics",
    "reverse_proxy",
    "php_fastcgi",
    "file_server",
    "acme_server",
];

/// Route rules collected from middleware (the keys of a veloxy route besides its match and
/// its answer).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rules {
    /// Route keys set directly (`compress`, `basic_auth`, `forward_auth`, `max_body_bytes`,
    /// `allow`, `deny`...), in order.
    pub keys: Vec<(String, Value)>,
    /// `request_headers` operations.
    pub req: Headers,
    /// `response_headers` operations.
    pub resp: Headers,
    /// `root` (as written in the output).
    pub root: Option<String>,
    /// `try_files` (veloxy spelling).
    pub try_files: Option<Vec<String>>,
    /// A prefix removed from the path before the answer (`handle_path`, `uri strip_prefix`).
    pub strip: Option<String>,
    /// `rewrite` template (veloxy spelling).
    pub rewrite: Option<String>,
}

/// Header operations: set, add, remove.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headers {
    /// Replace.
    pub set: toml::Table,
    /// Append.
    pub add: toml::Table,
    /// Remove.
    pub remove: Vec<String>,
}

impl Headers {
    /// Whether no operation is set.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    fn merge(&mut self, o: &Headers) {
        for (k, v) in &o.set {
            self.remove.retain(|r| !r.eq_ignore_ascii_case(k));
            self.set.insert(k.clone(), v.clone());
        }
        for (k, v) in &o.add {
            self.add.insert(k.clone(), v.clone());
        }
        for r in &o.remove {
            self.set.retain(|k, _| !k.eq_ignore_ascii_case(r));
            self.add.retain(|k, _| !k.eq_ignore_ascii_case(r));
            if !self.remove.contains(r) {
                self.remove.push(r.clone());
            }
        }
    }

    /// As a `{ set, add, remove }` table.
    pub fn to_value(&self) -> Value {
        let mut t = toml::Table::new();
        if !self.set.is_empty() {
            t.insert("set".into(), Value::Table(self.set.clone()));
        }
        if !self.add.is_empty() {
            t.insert("add".into(), Value::Table(self.add.clone()));
        }
        if !self.remove.is_empty() {
            t.insert(
                "remove".into(),
                Value::Array(self.remove.iter().cloned().map(Value::String).collect()),
            );
        }
        Value::Table(t)
    }
}

impl Rules {
    /// Adds `o` over these rules (a later directive's keys win).
    pub fn merge(&mut self, o: &Rules) {
        for (k, v) in &o.keys {
            match self.keys.iter_mut().find(|(k2, _)| k2 == k) {
                Some((_, v2)) => *v2 = v.clone(),
                None => self.keys.push((k.clone(), v.clone())),
            }
        }
        self.req.merge(&o.req);
        self.resp.merge(&o.resp);
        for (dst, src) in [(&mut self.root, &o.root), (&mut self.strip, &o.strip)] {
            if src.is_some() {
                dst.clone_from(src);
            }
        }
        if o.rewrite.is_some() {
            self.rewrite.clone_from(&o.rewrite);
        }
        if o.try_files.is_some() {
            self.try_files.clone_from(&o.try_files);
        }
    }

    /// Sets a route key.
    pub fn set(&mut self, k: &str, v: impl Into<Value>) {
        let v = v.into();
        match self.keys.iter_mut().find(|(k2, _)| k2 == k) {
            Some((_, v2)) => *v2 = v,
            None => self.keys.push((k.to_string(), v)),
        }
    }
}

/// What a route answers with.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `upstream = NAME`.
    Proxy(String),
    /// Files from `root` (the rules' root), with these file-route keys.
    Files(Vec<(String, Value)>),
    /// `redirect = { to, status }`.
    Redirect(String, u16),
    /// `respond = { status, body, content_type }`.
    Respond(u16, String, Option<String>),
}

/// One route to write.
#[derive(Debug, Clone)]
pub struct Emitted {
    /// Its conditions.
    pub cond: Cond,
    /// Its rules.
    pub rules: Rules,
    /// Its answer.
    pub action: Action,
    /// The source lines it came from (the answering directive first).
    pub from: Vec<Loc>,
    /// A comment above it.
    pub comment: Option<String>,
}

/// A branch of the chain: the conditions that lead here, the middleware that holds for
/// every request of it, and middleware that holds for some.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// The branch's conditions.
    pub cond: Cond,
    /// Rules for every request.
    pub rules: Rules,
    /// Rules for the requests matching one of the alternatives.
    pub partial: Vec<(Vec<Cond>, Rules, Loc)>,
    /// Named matchers in sight.
    pub matchers: HashMap<String, (Loc, Result<Matcher, String>)>,
    /// Where the branch starts (for `# from`).
    pub from: Vec<Loc>,
}

/// What a directive's matcher token (if any) stands for.
pub enum Matched {
    /// No matcher: every request.
    All,
    /// Conditions (alternatives).
    Conds(Vec<Cond>),
    /// Client ranges (`remote_ip`), negated or not.
    Remote(Vec<String>, bool),
    /// A matcher veloxy cannot write.
    Refused(String),
}

/// The matcher of `line` (its first argument, if it is one) and the remaining arguments.
pub fn matcher_of<'l>(line: &'l Line, scope: &Scope) -> (Matched, &'l [crate::lexer::Token]) {
    let args = line.args();
    let Some(first) = args.first().filter(|t| matcher::is_inline_matcher(t)) else {
        return (Matched::All, args);
    };
    let rest = &args[1..];
    if first.text == "*" {
        return (Matched::All, rest);
    }
    if let Some(name) = first.text.strip_prefix('@') {
        return match scope.matchers.get(name) {
            None => (
                Matched::Refused(format!("matcher @{name} is not defined")),
                rest,
            ),
            Some((_, Err(e))) => (Matched::Refused(format!("matcher @{name}: {e}")), rest),
            Some((_, Ok(Matcher::Conds(c)))) => (Matched::Conds(c.clone()), rest),
            Some((_, Ok(Matcher::RemoteIp { ranges, negated }))) => {
                (Matched::Remote(ranges.clone(), *negated), rest)
            }
        };
    }
    let c = Cond {
        path: matcher::path_cond(&first.text),
        ..Default::default()
    };
    (Matched::Conds(vec![c]), rest)
}

/// The kind of directive, for the walk.
fn rank(name: &str, order: &[String]) -> usize {
    // Caddy sorts handle_path as handle: one group of exclusive branches.
    let name = if name == "handle_path" {
        "handle"
    } else {
        name
    };
    order.iter().position(|d| d == name).unwrap_or(order.len())
}

/// Caddy's order: by directive, then (same directive) most specific path matcher first,
/// then those with any matcher before those without.
fn sort_lines<'l>(lines: &'l [Line], scope: &Scope, order: &[String]) -> Vec<&'l Line> {
    let mut v: Vec<(usize, &Line)> = lines.iter().enumerate().collect();
    let key = |l: &Line| -> (usize, i64) {
        let spec = match matcher_of(l, scope).0 {
            Matched::Conds(c) => match matcher::specificity(&c) {
                Some(n) => -(n as i64) - 2,
                None => -1,
            },
            Matched::All => 0,
            _ => -1,
        };
        (rank(l.name(), order), spec)
    };
    v.sort_by(|(i, a), (j, b)| key(a).cmp(&key(b)).then(i.cmp(j)));
    v.into_iter().map(|(_, l)| l).collect()
}

impl T<'_> {
    /// Walks `lines` in `scope`, pushing routes to `out`. `sorted`: Caddy's directive order
    /// (site blocks, `handle`); else file order (`route`). Returns whether a directive
    /// answers every request of the scope (later ones are unreachable).
    pub fn walk(
        &mut self,
        lines: &[Line],
        scope: &Scope,
        sorted: bool,
        out: &mut Vec<Emitted>,
    ) -> bool {
        let mut scope = scope.clone();
        for l in lines.iter().filter(|l| l.name().starts_with('@')) {
            let name = l.name()[1..].to_string();
            scope
                .matchers
                .insert(name, (l.loc().clone(), matcher::define(l)));
        }
        for l in lines.iter().filter(|l| l.name().starts_with('@')) {
            match matcher::define(l) {
                Ok(_) => self.report.translated(l.loc(), l.name()),
                Err(e) => self.report.refused(l.loc(), l.name(), e),
            }
        }
        for l in lines.iter().filter(|l| l.name() == "handle_errors") {
            self.handle_errors(l, &mut scope);
        }
        let mut kept = Vec::new();
        for l in lines {
            if l.name() == "handle_errors" || super::middleware::SITE_LEVEL.contains(&l.name()) {
                continue;
            }
            if l.name().starts_with('@') {
                kept.push(l.clone());
                continue;
            }
            // A branch's own tokens decide it; its lines are checked when it is walked.
            let why = if matches!(l.name(), "handle" | "handle_path" | "route") {
                l.toks.iter().find_map(|t| t.unresolved.as_deref())
            } else {
                l.unresolved()
            };
            match why {
                None => kept.push(l.clone()),
                Some(e) => {
                    self.report.refused(l.loc(), l.name(), e.to_string());
                    super::report_nested(self, l.body(), "its directive is refused");
                }
            }
        }
        let lines = kept;
        let lines = &lines[..];
        let order: Vec<&Line> = if sorted {
            sort_lines(lines, &scope, &self.order)
        } else {
            lines.iter().collect()
        };
        let mut done: Option<Loc> = None;
        for l in order {
            if l.name().starts_with('@') {
                continue;
            }
            if let Some(at) = &done {
                self.report.ignored(
                    l.loc(),
                    l.name(),
                    format!("never reached: the directive at {at} answers every request first"),
                );
                super::report_nested(self, l.body(), "never reached");
                continue;
            }
            if self.step(l, &mut scope, sorted, out) {
                done = Some(l.loc().clone());
            }
        }
        done.is_some()
    }

    /// One directive; true when it answers every request of the scope.
    fn step(&mut self, l: &Line, scope: &mut Scope, sorted: bool, out: &mut Vec<Emitted>) -> bool {
        let name = l.name();
        let (m, args) = matcher_of(l, scope);
        if let Matched::Refused(why) = &m {
            self.report.refused(l.loc(), name, why.clone());
            super::report_nested(self, l.body(), "its directive's matcher is refused");
            return false;
        }
        match name {
            "handle" | "handle_path" | "route" => self.branch(l, m, scope, out),
            _ if super::handlers::is_answer(name) => self.answer(l, m, args, scope, out),
            _ => {
                let Some(delta) = self.middleware(l, args, scope, sorted) else {
                    return false;
                };
                match m {
                    Matched::All => scope.rules.merge(&delta),
                    Matched::Conds(c) => scope.partial.push((c, delta, l.loc().clone())),
                    Matched::Remote(..) | Matched::Refused(_) => {
                        // Reported by middleware(): remote matchers on middleware are refused.
                    }
                }
                false
            }
        }
    }

    /// `handle`, `handle_path`, `route`: a branch for each alternative of the matcher.
    fn branch(&mut self, l: &Line, m: Matched, scope: &Scope, out: &mut Vec<Emitted>) -> bool {
        let name = l.name();
        let conds = match m {
            Matched::All => vec![Cond::default()],
            Matched::Conds(c) => c,
            Matched::Remote(..) => {
                self.report.refused(
                    l.loc(),
                    name,
                    "a remote_ip matcher on a branch (veloxy's address lists are rules, not conditions)",
                );
                super::report_nested(self, l.body(), "its branch's matcher is refused");
                return false;
            }
            Matched::Refused(_) => unreachable!("handled by step"),
        };
        let mut strip = None;
        if name == "handle_path" {
            match conds.as_slice() {
                [Cond {
                    path: PathCond::Prefix(p),
                    ..
                }] => strip = Some(p.trim_end_matches('/').to_string()),
                _ => {
                    self.report.refused(
                        l.loc(),
                        name,
                        "handle_path needs one path prefix matcher (/prefix/*)",
                    );
                    super::report_nested(self, l.body(), "its branch is refused");
                    return false;
                }
            }
        }
        self.report.translated(l.loc(), name);
        let mut all = false;
        for c in &conds {
            let mut child = scope.clone();
            let rel = relate(&scope.cond, c);
            let covers = rel == Rel::Covers;
            match rel {
                Rel::Covers => {}
                Rel::Overlap(n) => child.cond = n,
                Rel::Disjoint => continue,
                Rel::Unknown => {
                    self.report
                        .refused(l.loc(), name, "two path regexes in one route");
                    continue;
                }
            }
            if let Some(p) = &strip {
                child.rules.strip = Some(p.clone());
            }
            child.from.push(l.loc().clone());
            let before = self.report.entries.len();
            let answered = self.walk(l.body(), &child, name != "route", out);
            // A branch walked for several alternatives reports its lines once.
            if !std::ptr::eq(c, &conds[0]) {
                self.report.entries.truncate(before);
            }
            all |= answered && covers;
        }
        all
    }
}
