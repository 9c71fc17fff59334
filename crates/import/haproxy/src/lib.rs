//! `veloxy import --from haproxy`: haproxy.cfg (HAProxy 2.x) to a veloxy config.
//!
//! # Layout
//! * [`parse`]: the file as sections of located lines of words (quotes, escapes, `"${VAR}"`,
//!   `.if` blocks).
//! * [`acl`] and [`matcher`]: ACLs and `if`/`unless` conditions as route conditions.
//! * [`cases`]: HAProxy's first-match rule lists as routes veloxy ranks the same way.
//! * [`proxy`]: sections with their `defaults` applied; [`frontend`] (binds, rules, routes),
//!   [`rules`] (`http-request`, `redirect`), [`backend`] (servers, balance, checks), [`global`]
//!   (`global`, `userlist`, `resolvers` and the other sections), [`tcp`] (`mode tcp`),
//!   [`stats`] (the statistics page as the admin endpoint).
//! * [`fetch`]: ACL bodies; [`params`]: server parameters; [`factor`]: rule sets.

#![warn(missing_docs)]

pub mod acl;
pub mod backend;
pub mod cache;
pub mod cases;
pub mod checks;
pub mod factor;
pub mod fetch;
pub mod frontend;
pub mod global;
pub mod limit;
pub mod logfmt;
pub mod matcher;
pub mod params;
pub mod parse;
pub mod proxy;
pub mod route_out;
pub mod rules;
pub mod stats;
pub mod tcp;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use veloxy_import::{Config, ImportError, Imported, Importer, Loc, Options, Outcome, Report};

use crate::parse::Line;

/// The listener section `name` (it exists: made from a bind).
pub(crate) fn model_listener<'c>(cx: &'c mut Ctx, name: &str) -> &'c mut veloxy_import::Section {
    veloxy_import::model::named(&mut cx.out.listeners, name).expect("listener made from a bind")
}

/// The haproxy importer.
pub struct Haproxy;

impl Importer for Haproxy {
    fn name(&self) -> &'static str {
        "haproxy"
    }

    /// A section keyword (`frontend NAME`, `backend NAME`, `listen NAME`, `defaults`,
    /// `global`) at column 1 of a line that opens no `{` block (nginx and Caddy do).
    fn detect(&self, _path: &Path, text: &str) -> bool {
        let mut sections = 0;
        let mut indented = 0;
        for l in text.lines() {
            let t = l.trim_end();
            if t.ends_with('{') {
                return false;
            }
            let first = t.split_whitespace().next().unwrap_or("");
            if !l.starts_with([' ', '\t'])
                && matches!(
                    first,
                    "frontend" | "backend" | "listen" | "defaults" | "global"
                )
            {
                sections += 1;
            } else if l.starts_with([' ', '\t']) && !t.trim().is_empty() {
                indented += 1;
            }
        }
        sections > 0 && indented > 0
    }

    fn import(&self, files: &[PathBuf], opts: &Options) -> Result<Imported, ImportError> {
        if files.is_empty() {
            return Err(ImportError::Usage("haproxy: no file given".into()));
        }
        let mut texts = Vec::new();
        for f in files {
            let text = veloxy_import::source::read(f)?;
            let name: Arc<str> = f.display().to_string().into();
            texts.push((name, text));
        }
        let sections = parse::parse_files(&texts, opts)?;
        let base = files[0]
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let mut cx = Ctx::new(opts, base);
        for s in &sections {
            for l in std::iter::once(&s.head).chain(&s.lines) {
                cx.lines.insert(l.loc.clone(), l.clone());
            }
        }
        proxy::translate(&mut cx, &sections);
        Ok(cx.finish(&sections))
    }
}

/// What became of a directive, merged over every proxy that uses it (a `defaults` line is
/// used by several): refused beats different beats translated beats ignored.
#[derive(Debug, Clone)]
enum State {
    Ignored(String),
    Translated,
    Different(Vec<String>),
    Refused(String),
}

impl State {
    fn rank(&self) -> u8 {
        match self {
            State::Ignored(_) => 0,
            State::Translated => 1,
            State::Different(_) => 2,
            State::Refused(_) => 3,
        }
    }
}

/// The state of one import: options, the output and what became of each line.
pub struct Ctx<'a> {
    /// The command line's options.
    pub opts: &'a Options,
    /// The directory relative paths are taken from (the first file's).
    pub base: PathBuf,
    /// `crt-base` / `ca-base` of `global`.
    pub crt_base: Option<String>,
    /// `ca-base`.
    pub ca_base: Option<String>,
    /// The output.
    pub out: Config,
    /// The htpasswd file of each userlist (and group selection): name in the output.
    pub auth_files: HashMap<String, String>,
    /// Userlists: (user, hash, groups) of the users veloxy can check.
    pub userlists: HashMap<String, Vec<(String, String, Vec<String>)>>,
    /// Every bind address and its listener.
    pub binds: Vec<(String, String)>,
    /// tcp frontends waiting for the HTTPS listener their SNI rules pass through on.
    pub pending: Vec<tcp::Pending>,
    /// What the statistics lines ask of `[server] admin`.
    pub stats: stats::Stats,
    /// Stick tables that count request rates, by proxy name.
    pub tables: std::collections::BTreeMap<String, limit::Table>,
    /// Every deny rule made a rate limit: its line and status.
    pub rate_rules: Vec<(Loc, u16)>,
    /// HAProxy `cache` sections, by name.
    pub caches: std::collections::BTreeMap<String, cache::Cache>,
    states: HashMap<Loc, (String, State)>,
    lines: HashMap<Loc, Line>,
}

impl<'a> Ctx<'a> {
    fn new(opts: &'a Options, base: PathBuf) -> Self {
        Ctx {
            opts,
            base,
            crt_base: None,
            ca_base: None,
            out: Config::default(),
            auth_files: HashMap::new(),
            userlists: HashMap::new(),
            binds: Vec::new(),
            pending: Vec::new(),
            stats: stats::Stats::default(),
            tables: Default::default(),
            rate_rules: Vec::new(),
            caches: Default::default(),
            states: HashMap::new(),
            lines: HashMap::new(),
        }
    }

    fn set(&mut self, line: &Line, st: State) {
        let name = directive(line);
        match self.states.get_mut(&line.loc) {
            None => {
                self.states.insert(line.loc.clone(), (name, st));
            }
            Some((_, have)) => match (have, st) {
                (State::Different(a), State::Different(b)) => {
                    for x in b {
                        if !a.contains(&x) {
                            a.push(x);
                        }
                    }
                }
                (have, st) if st.rank() > have.rank() => *have = st,
                _ => {}
            },
        }
    }

    /// `line` translated with the same effect.
    pub fn ok(&mut self, line: &Line) {
        self.set(line, State::Translated);
    }

    /// `line` translated, with a difference clients or backends see.
    pub fn diff(&mut self, line: &Line, what: impl Into<String>) {
        self.set(line, State::Different(vec![what.into()]));
    }

    /// `line` changes nothing clients or backends see.
    pub fn ignore(&mut self, line: &Line, why: impl Into<String>) {
        self.set(line, State::Ignored(why.into()));
    }

    /// `line` is not translated: what veloxy lacks.
    pub fn refuse(&mut self, line: &Line, why: impl Into<String>) {
        self.set(line, State::Refused(why.into()));
    }

    /// The line at `loc`, translated with a difference, now has only this one (what was
    /// said of it no longer holds). Other outcomes stay.
    pub fn restate_diff(&mut self, loc: &Loc, what: impl Into<String>) {
        if let Some((_, st @ State::Different(_))) = self.states.get_mut(loc) {
            *st = State::Different(vec![what.into()]);
        }
    }

    /// The line at `loc` translated.
    pub fn ok_loc(&mut self, loc: &Loc) {
        if let Some(l) = self.lines.get(loc).cloned() {
            self.ok(&l);
        }
    }

    /// The line at `loc` refused.
    pub fn refuse_loc(&mut self, loc: &Loc, why: impl Into<String>) {
        if let Some(l) = self.lines.get(loc).cloned() {
            self.refuse(&l, why);
        }
    }

    /// The line at `loc` has no effect: every request it would match is taken earlier.
    pub fn shadowed(&mut self, loc: &Loc, why: impl Into<String>) {
        if let Some((_, st)) = self.states.get_mut(loc) {
            if matches!(st, State::Translated | State::Different(_)) {
                *st = State::Ignored(why.into());
            }
        }
    }

    /// Whether `line` already has an outcome.
    pub fn decided(&self, line: &Line) -> bool {
        self.states.contains_key(&line.loc)
    }

    /// A path named in the source, as the output names it.
    pub fn path(&self, base: Option<&str>, p: &str) -> String {
        let p = match base {
            Some(b) if !Path::new(p).is_absolute() => format!("{}/{p}", b.trim_end_matches('/')),
            _ => p.to_string(),
        };
        self.opts.out_path(&self.base, &p)
    }

    /// The path `p` as this machine can read it now (relative to the source's directory).
    pub fn local(&self, base: Option<&str>, p: &str) -> PathBuf {
        let p = match base {
            Some(b) if !Path::new(p).is_absolute() => format!("{}/{p}", b.trim_end_matches('/')),
            _ => p.to_string(),
        };
        self.base.join(p)
    }

    fn finish(mut self, sections: &[parse::Section]) -> Imported {
        let mut report = Report::default();
        for s in sections {
            for line in std::iter::once(&s.head).chain(&s.lines) {
                let (name, st) = self.states.remove(&line.loc).unwrap_or_else(|| {
                    (
                        directive(line),
                        State::Refused(format!("unknown keyword '{}' in {}", line.kw(), s.kind)),
                    )
                });
                let outcome = match st {
                    State::Translated => Outcome::Translated,
                    State::Different(w) => Outcome::Different(w.join("; ")),
                    State::Ignored(w) => Outcome::Ignored(w),
                    State::Refused(w) => Outcome::Refused(w),
                };
                report.add(&line.loc, name, outcome);
            }
        }
        report.sort();
        Imported {
            config: self.out,
            report,
        }
    }
}

/// The name a report line gives a directive: the keyword, with its second word for the
/// keywords that are families (`option forwardfor`, `http-request set-header`, `timeout
/// connect`), and the name of a section.
pub fn directive(line: &Line) -> String {
    let kw = line.kw();
    let two = matches!(
        kw,
        "option"
            | "no"
            | "timeout"
            | "http-request"
            | "http-response"
            | "http-after-response"
            | "http-check"
            | "tcp-request"
            | "tcp-response"
            | "stats"
            | "errorfile"
            | "frontend"
            | "backend"
            | "listen"
            | "userlist"
            | "resolvers"
            | "peers"
            | "mailers"
            | "program"
            | "ring"
            | "cache"
            | "http-errors"
    ) || (kw == "defaults" && line.arg(0).is_some());
    match (two, line.arg(0)) {
        (true, Some(a)) => format!("{kw} {a}"),
        _ => kw.to_string(),
    }
}

/// HAProxy's time value (`5000` is milliseconds, `5s`, `1m`, `100ms`, `1h`, `1d`, `10us`)
/// as a veloxy duration, or `None` when malformed.
pub fn duration(v: &str) -> Option<String> {
    let digits: String = v.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u64 = digits.parse().ok()?;
    let unit = &v[digits.len()..];
    let ms = match unit {
        "" | "ms" => n,
        "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        "d" => n * 86_400_000,
        "us" => return Some(format!("{n}us")),
        _ => return None,
    };
    Some(if ms % 3_600_000 == 0 && ms >= 3_600_000 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms >= 60_000 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 && ms > 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    })
}

/// A duration in milliseconds (for comparisons).
pub fn millis(v: &str) -> Option<u64> {
    let d = duration(v)?;
    let digits: String = d.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u64 = digits.parse().ok()?;
    Some(match &d[digits.len()..] {
        "h" => n * 3_600_000,
        "m" => n * 60_000,
        "s" => n * 1000,
        "us" => n / 1000,
        _ => n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("5000").as_deref(), Some("5s"));
        assert_eq!(duration("50000").as_deref(), Some("50s"));
        assert_eq!(duration("1500").as_deref(), Some("1500ms"));
        assert_eq!(duration("1h").as_deref(), Some("1h"));
        assert_eq!(duration("90s").as_deref(), Some("90s"));
        assert_eq!(duration("x"), None);
        assert_eq!(millis("2m"), Some(120_000));
    }

    #[test]
    fn detection() {
        let h = Haproxy;
        assert!(h.detect(
            Path::new("h.cfg"),
            "global\n  daemon\nfrontend a\n  bind :80\n"
        ));
        assert!(!h.detect(Path::new("n.conf"), "http {\n  server {\n  }\n}\n"));
        assert!(!h.detect(
            Path::new("Caddyfile"),
            "example.com {\n  reverse_proxy :8080\n}\n"
        ));
    }
}
