//! The import report: one line per source directive.
//!
//! `FILE:LINE:COL: DIRECTIVE: translated | translated with a difference: WHAT | ignored: WHY |
//! refused: WHY`, then `imported: N translated, N with differences, N ignored, N refused`.

use std::fmt::Write as _;

use crate::source::Loc;

/// What became of one source directive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Translated with the same effect.
    Translated,
    /// Translated, but clients or backends see this difference.
    Different(String),
    /// Not translated, and nothing a client or backend sees depends on it (why).
    Ignored(String),
    /// Not translated: veloxy lacks it, or it cannot be known (what is missing).
    Refused(String),
}

/// One report line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where the directive is.
    pub loc: Loc,
    /// The directive as the source names it (`proxy_pass`, `reverse_proxy`,
    /// `middlewares.strip.stripPrefix`, `nginx.ingress.kubernetes.io/rewrite-target`...).
    pub directive: String,
    /// What became of it.
    pub outcome: Outcome,
}

/// Every directive of an import, in source order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The lines, in the order they were added.
    pub entries: Vec<Entry>,
}

/// How many lines of each outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Translated.
    pub translated: usize,
    /// Translated with a difference.
    pub different: usize,
    /// Ignored.
    pub ignored: usize,
    /// Refused.
    pub refused: usize,
}

impl Report {
    /// Adds a line.
    pub fn add(&mut self, loc: &Loc, directive: impl Into<String>, outcome: Outcome) {
        self.entries.push(Entry {
            loc: loc.clone(),
            directive: directive.into(),
            outcome,
        });
    }

    /// `directive` translated with the same effect.
    pub fn translated(&mut self, loc: &Loc, directive: impl Into<String>) {
        self.add(loc, directive, Outcome::Translated);
    }

    /// `directive` translated, with a difference clients or backends see.
    pub fn different(&mut self, loc: &Loc, directive: impl Into<String>, what: impl Into<String>) {
        self.add(loc, directive, Outcome::Different(what.into()));
    }

    /// `directive` not translated, changing nothing a client or backend sees.
    pub fn ignored(&mut self, loc: &Loc, directive: impl Into<String>, why: impl Into<String>) {
        self.add(loc, directive, Outcome::Ignored(why.into()));
    }

    /// `directive` not translated: what veloxy lacks.
    pub fn refused(&mut self, loc: &Loc, directive: impl Into<String>, why: impl Into<String>) {
        self.add(loc, directive, Outcome::Refused(why.into()));
    }

    /// Lines are kept in source order: by file as first seen, then line and column.
    pub fn sort(&mut self) {
        let mut order: Vec<std::sync::Arc<str>> = Vec::new();
        for e in &self.entries {
            if !order.contains(&e.loc.file) {
                order.push(e.loc.file.clone());
            }
        }
        let rank = |f: &std::sync::Arc<str>| order.iter().position(|o| o == f).unwrap_or(0);
        self.entries
            .sort_by_key(|e| (rank(&e.loc.file), e.loc.line, e.loc.col));
    }

    /// The totals.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for e in &self.entries {
            match e.outcome {
                Outcome::Translated => c.translated += 1,
                Outcome::Different(_) => c.different += 1,
                Outcome::Ignored(_) => c.ignored += 1,
                Outcome::Refused(_) => c.refused += 1,
            }
        }
        c
    }

    /// Whether anything was refused (`--strict` exits 1 then).
    pub fn has_refused(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.outcome, Outcome::Refused(_)))
    }

    /// The report as text, one line per directive and the totals last.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            let _ = write!(out, "{}: {}: ", e.loc, e.directive);
            let _ = match &e.outcome {
                Outcome::Translated => writeln!(out, "translated"),
                Outcome::Different(w) => writeln!(out, "translated with a difference: {w}"),
                Outcome::Ignored(w) => writeln!(out, "ignored: {w}"),
                Outcome::Refused(w) => writeln!(out, "refused: {w}"),
            };
        }
        let c = self.counts();
        let _ = writeln!(
            out,
            "imported: {} translated, {} with differences, {} ignored, {} refused",
            c.translated, c.different, c.ignored, c.refused
        );
        out
    }

    /// The report as JSON: `{"entries": [{file, line, col, directive, outcome, detail}],
    /// "summary": {translated, different, ignored, refused}}`.
    pub fn json(&self) -> String {
        let entries: Vec<_> = self
            .entries
            .iter()
            .map(|e| {
                let (outcome, detail) = match &e.outcome {
                    Outcome::Translated => ("translated", None),
                    Outcome::Different(w) => ("different", Some(w)),
                    Outcome::Ignored(w) => ("ignored", Some(w)),
                    Outcome::Refused(w) => ("refused", Some(w)),
                };
                serde_json::json!({
                    "file": &*e.loc.file, "line": e.loc.line, "col": e.loc.col,
                    "directive": e.directive, "outcome": outcome, "detail": detail,
                })
            })
            .collect();
        let c = self.counts();
        let v = serde_json::json!({
            "entries": entries,
            "summary": {"translated": c.translated, "different": c.different,
                        "ignored": c.ignored, "refused": c.refused},
        });
        let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
        s.push('\n');
        s
    }
}
