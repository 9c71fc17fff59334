//! Report lines that collect what several places learn about one directive (a middleware
//! used by three routers, a service) before they are written.

use veloxy_import::{Loc, Report};

/// One directive's line in the making.
#[derive(Debug, Clone)]
pub struct Line {
    /// Where it is.
    pub loc: Loc,
    /// Its name.
    pub directive: String,
    /// Differences found.
    pub notes: Vec<String>,
    /// Why it was refused (the first reason wins).
    pub refused: Option<String>,
    /// Why it was ignored (when nothing else happened).
    pub ignored: Option<String>,
}

/// Lines by key, in the order first seen.
#[derive(Debug, Default)]
pub struct Lines {
    lines: Vec<(String, Line)>,
}

impl Lines {
    /// The line under `key`, created for `directive` at `loc` when absent.
    pub fn at(&mut self, key: &str, loc: &Loc, directive: &str) -> &mut Line {
        let i = match self.lines.iter().position(|(k, _)| k == key) {
            Some(i) => i,
            None => {
                self.lines.push((
                    key.to_string(),
                    Line {
                        loc: loc.clone(),
                        directive: directive.to_string(),
                        notes: Vec::new(),
                        refused: None,
                        ignored: None,
                    },
                ));
                self.lines.len() - 1
            }
        };
        &mut self.lines[i].1
    }

    /// Whether `key` (or a key under it, `key.field`) has a line.
    pub fn has(&self, key: &str) -> bool {
        let under = format!("{key}.");
        self.lines
            .iter()
            .any(|(k, _)| k == key || k.starts_with(&under))
    }

    /// Writes every line into the report.
    pub fn flush(self, report: &mut Report) {
        for (_, l) in self.lines {
            l.write(report);
        }
    }
}

impl Line {
    /// Adds a difference (once).
    pub fn note(&mut self, what: impl Into<String>) -> &mut Self {
        let what = what.into();
        if !self.notes.contains(&what) {
            self.notes.push(what);
        }
        self
    }

    /// Refuses (the first reason is kept).
    pub fn refuse(&mut self, why: impl Into<String>) -> &mut Self {
        if self.refused.is_none() {
            self.refused = Some(why.into());
        }
        self
    }

    /// Writes the line.
    pub fn write(self, report: &mut Report) {
        if let Some(r) = self.refused {
            report.refused(&self.loc, self.directive, r);
        } else if !self.notes.is_empty() {
            report.different(&self.loc, self.directive, self.notes.join("; "));
        } else if let Some(i) = self.ignored {
            report.ignored(&self.loc, self.directive, i);
        } else {
            report.translated(&self.loc, self.directive);
        }
    }
}
