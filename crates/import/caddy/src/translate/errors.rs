//! `handle_errors`: Caddy's error routes, where their common forms map to veloxy's
//! `error_pages` (a fixed file per status or status class):
//!
//! * `respond "BODY" [STATUS]`, for every error, for `handle_errors 404 5xx` codes, or under
//!   a matcher `expression {err.status_code} == 404` / `... in [502, 503]` (directly or in a
//!   `handle @matcher` block): the body becomes a generated file;
//! * `rewrite * /{err.status_code}.html` + `file_server` (with `root`): the files of that
//!   name found under the root.
//!
//! Other handlers (proxying errors, placeholders in a body, other matchers) are refused by
//! name.

use std::collections::{BTreeMap, HashMap};

use toml::Value;
use veloxy_import::GeneratedFile;

use super::flow::Scope;
use super::{report_nested, T};
use crate::lexer::Token;
use crate::parse::Line;

/// The statuses a page is for (`404`, `5xx`).
type Codes = Vec<String>;

/// What the block translates to: status -> file, and the differences to name.
#[derive(Default)]
struct Pages {
    files: BTreeMap<String, String>,
    diffs: Vec<String>,
}

impl T<'_> {
    /// A site's `handle_errors` block: its pages go to every route of the site.
    pub fn handle_errors(&mut self, l: &Line, scope: &mut Scope) {
        let mut pages = Pages::default();
        match self.error_pages(l, &mut pages) {
            Ok(()) if !pages.files.is_empty() => {
                let mut table = match scope.rules.keys.iter().find(|(k, _)| k == "error_pages") {
                    Some((_, Value::Table(t))) => t.clone(),
                    _ => toml::Table::new(),
                };
                for (k, v) in pages.files {
                    table.insert(k, v.into());
                }
                scope.rules.set("error_pages", Value::Table(table));
                pages.diffs.push(
                    "veloxy also sends these pages in place of the upstream's own error \
                     answers (Caddy: only for errors it raises itself)"
                        .into(),
                );
                self.report
                    .different(l.loc(), "handle_errors", pages.diffs.join("; "));
                report_lines(self, l.body());
            }
            Ok(()) => {
                self.report.refused(
                    l.loc(),
                    "handle_errors",
                    "no error page file exists for it (veloxy's error pages are files read at load)",
                );
                report_nested(self, l.body(), "inside a refused handle_errors");
            }
            Err(why) => {
                self.report.refused(l.loc(), "handle_errors", why);
                report_nested(self, l.body(), "inside a refused handle_errors");
            }
        }
    }

    fn error_pages(&mut self, l: &Line, pages: &mut Pages) -> Result<(), String> {
        if let Some(why) = l.unresolved() {
            return Err(why.to_string());
        }
        let mut all: Codes = l.args().iter().map(|t| t.text.clone()).collect();
        if all.iter().any(|c| !is_code(c)) {
            return Err(format!("handle_errors {}", all.join(" ")));
        }
        if all.is_empty() {
            all = vec!["4xx".into(), "5xx".into()];
        }
        let mut matchers: HashMap<String, Codes> = HashMap::new();
        for m in l.body().iter().filter(|m| m.name().starts_with('@')) {
            matchers.insert(m.name()[1..].to_string(), status_matcher(m)?);
        }
        let (mut root, mut rewrite, mut files) = (None, None, false);
        for sub in l.body() {
            match sub.name() {
                n if n.starts_with('@') => {}
                "respond" => {
                    let (codes, args) = matched(sub.args(), &matchers, &all)?;
                    self.error_respond(sub, args, &codes, pages)?;
                }
                "handle" => {
                    let (codes, rest) = matched(sub.args(), &matchers, &all)?;
                    match (rest, sub.body()) {
                        ([], [r]) if r.name() == "respond" && !has_matcher(r.args()) => {
                            self.error_respond(r, r.args(), &codes, pages)?
                        }
                        _ => {
                            return Err(
                                "a handle in handle_errors that does more than respond".into()
                            )
                        }
                    }
                }
                "root" => root = sub.args().last().map(|t| t.text.clone()),
                "rewrite" => rewrite = Some(error_rewrite(sub.args())?),
                "file_server" if sub.args().is_empty() && sub.body().is_empty() => files = true,
                other => return Err(format!("{other} inside handle_errors")),
            }
        }
        match (rewrite, files) {
            (None, false) => Ok(()),
            (Some(ext), true) => {
                let root = root.ok_or("an error file_server without root")?;
                self.error_files(&root, &ext, &all, pages);
                Ok(())
            }
            _ => Err("rewrite without file_server (or the reverse) in handle_errors".into()),
        }
    }

    /// `respond "BODY" [STATUS]` for `codes`: a generated file.
    fn error_respond(
        &mut self,
        l: &Line,
        args: &[Token],
        codes: &Codes,
        pages: &mut Pages,
    ) -> Result<(), String> {
        let (body, status) = match args {
            [b] if b.text.len() == 3 && b.text.parse::<u16>().is_ok() => {
                (String::new(), Some(&b.text))
            }
            [b] => (b.text.clone(), None),
            [b, s] => (b.text.clone(), Some(&s.text)),
            _ => return Err("respond in handle_errors without a body".into()),
        };
        if !l.body().is_empty() {
            return Err("respond with a block in handle_errors".into());
        }
        if body.contains('{') {
            return Err(
                "placeholders in an error body (veloxy's error pages are fixed files)".into(),
            );
        }
        if let Some(s) = status {
            if codes.iter().any(|c| c != s) {
                pages.diffs.push(format!(
                    "veloxy sends the page with the error's own status, not {s}"
                ));
            }
        }
        let html = body.trim_start().starts_with('<');
        let name = format!(
            "caddy-error-{}.{}",
            codes.join("-"),
            if html { "html" } else { "txt" }
        );
        if !self.cfg.files.iter().any(|f| f.name == name) {
            self.cfg.files.push(GeneratedFile {
                name: name.clone(),
                contents: body,
                mode: 0o644,
            });
        }
        for c in codes {
            pages.files.entry(c.clone()).or_insert_with(|| name.clone());
        }
        Ok(())
    }

    /// The `NNN.ext` files under `root` for the statuses in `codes`.
    fn error_files(&mut self, root: &str, ext: &str, codes: &Codes, pages: &mut Pages) {
        let dir = self.base.join(root);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut found: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .filter(|n| {
                n.strip_suffix(ext).is_some_and(|s| {
                    s.len() == 3 && s.parse::<u16>().is_ok_and(|v| (400..600).contains(&v))
                })
            })
            .collect();
        found.sort();
        for f in found {
            let status = f[..3].to_string();
            let class = format!("{}xx", &status[..1]);
            if codes.contains(&status) || codes.contains(&class) {
                let path = self.path(&format!("{}/{f}", root.trim_end_matches('/')));
                pages.files.insert(status, path);
            }
        }
        pages.diffs.push(format!(
            "veloxy reads the {root}/NNN{ext} files that exist now, at load (Caddy looks them up \
             for each error)"
        ));
    }
}

/// Reports the lines of a translated `handle_errors` block.
fn report_lines(t: &mut T<'_>, lines: &[Line]) {
    for l in lines {
        t.report.translated(l.loc(), l.name());
        report_lines(t, l.body());
    }
}

fn is_code(c: &str) -> bool {
    (c.len() == 3 && c.parse::<u16>().is_ok())
        || (c.len() == 3 && c.ends_with("xx") && c.starts_with(['4', '5']))
}

fn has_matcher(args: &[Token]) -> bool {
    args.first()
        .is_some_and(|t| !t.quoted && t.text.starts_with('@'))
}

/// The statuses a directive's matcher selects, and its other arguments.
fn matched<'a>(
    args: &'a [Token],
    matchers: &HashMap<String, Codes>,
    all: &Codes,
) -> Result<(Codes, &'a [Token]), String> {
    match args.first() {
        Some(t) if has_matcher(args) => {
            let name = &t.text[1..];
            let codes = matchers
                .get(name)
                .ok_or_else(|| format!("matcher @{name} is not defined"))?;
            Ok((codes.clone(), &args[1..]))
        }
        Some(t) if !t.quoted && t.text == "*" => Ok((all.clone(), &args[1..])),
        _ => Ok((all.clone(), args)),
    }
}

/// `@name expression {err.status_code} == 404` or `... in [502, 503]`.
fn status_matcher(m: &Line) -> Result<Codes, String> {
    let text: Vec<&str> = m.args().iter().map(|t| t.text.as_str()).collect();
    let expr = match text.as_slice() {
        ["expression", rest @ ..] => rest.join(" "),
        _ => {
            return Err(format!(
                "matcher {} in handle_errors (veloxy's error pages are per status)",
                m.name()
            ))
        }
    };
    let rest = ["{err.status_code}", "{http.error.status_code}"]
        .iter()
        .find_map(|p| expr.trim().strip_prefix(p))
        .ok_or_else(|| format!("expression {expr}"))?
        .trim();
    let list = if let Some(v) = rest.strip_prefix("==") {
        v.trim().to_string()
    } else if let Some(v) = rest.strip_prefix("in") {
        v.trim()
            .strip_prefix('[')
            .and_then(|v| v.strip_suffix(']'))
            .ok_or_else(|| format!("expression {expr}"))?
            .to_string()
    } else {
        return Err(format!("expression {expr}"));
    };
    let codes: Codes = list.split(',').map(|c| c.trim().to_string()).collect();
    if codes
        .iter()
        .all(|c| c.len() == 3 && c.parse::<u16>().is_ok())
    {
        Ok(codes)
    } else {
        Err(format!("expression {expr}"))
    }
}

/// `rewrite * /{err.status_code}.EXT`: the extension.
fn error_rewrite(args: &[Token]) -> Result<String, String> {
    let to = match args {
        [m, to] if m.text == "*" => &to.text,
        [to] => &to.text,
        _ => return Err("rewrite in handle_errors".into()),
    };
    ["/{err.status_code}", "/{http.error.status_code}"]
        .iter()
        .find_map(|p| to.strip_prefix(p))
        .filter(|ext| ext.starts_with('.') && !ext.contains(['/', '{']))
        .map(String::from)
        .ok_or_else(|| format!("rewrite {to} in handle_errors"))
}
