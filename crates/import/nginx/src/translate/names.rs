//! `server_name`s as veloxy hosts: exact names, `.example.com` (the name and its
//! subdomains), `*.example.com`; a `~regex` that matches a finite set of names
//! (`~^(www\.)?example\.com$`) becomes that list; `name.*` (nginx's trailing wildcard) only
//! where the server answers every host anyway (it is the default server of each of its
//! listeners).

use regex_syntax::hir::{Class, Hir, HirKind, Look};

use super::Tr;
use crate::parse::Directive;

/// The most names a regex may expand to.
const MAX_NAMES: usize = 64;

/// Marks for `^` and `$` while enumerating (never in a host name).
const START: char = '\u{1}';
const END: char = '\u{2}';

/// `server_name`s as veloxy hosts, refusing the ones veloxy cannot match.
/// `default_everywhere`: the server is the default one of each of its listeners.
pub fn names(tr: &mut Tr<'_>, d: &Directive, default_everywhere: bool) -> Vec<String> {
    let mut out = Vec::new();
    for c in d.expanded().into_iter().filter(|c| c.name == "server_name") {
        let mut bad = Vec::new();
        for a in &c.args {
            let n = a.text.to_ascii_lowercase();
            if n.is_empty() || n == "_" {
                continue;
            }
            if let Some(rest) = n.strip_prefix('.') {
                out.push(rest.to_string());
                out.push(format!("*.{rest}"));
            } else if let Some(re) = a.text.strip_prefix('~') {
                match finite(re) {
                    Some(list) => out.extend(list),
                    None => bad.push(format!(
                        "{} (a regex matching names without a fixed list)",
                        a.text
                    )),
                }
            } else if n.ends_with(".*") {
                // The default server of each of its listeners answers every host anyway.
                if !default_everywhere {
                    bad.push(format!("{} (veloxy has no trailing wildcard)", a.text));
                }
            } else if n.contains('$') || n.contains('*') && !n.starts_with("*.") {
                bad.push(a.text.clone());
            } else {
                out.push(n);
            }
        }
        if !bad.is_empty() {
            tr.rep.refused(
                &c.loc,
                "server_name",
                format!(
                    "veloxy matches exact names and *.suffix only, not {}",
                    bad.join(", ")
                ),
            );
        } else {
            tr.rep.translated(&c.loc, "server_name");
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|n| seen.insert(n.clone()));
    out
}

/// The names a server-name regex matches, when they are a short finite list of host names.
pub fn finite(re: &str) -> Option<Vec<String>> {
    let hir = regex_syntax::ParserBuilder::new()
        .case_insensitive(true)
        .build()
        .parse(re)
        .ok()?;
    let mut out = Vec::new();
    for w in words(&hir)? {
        let name = w
            .strip_prefix(START)?
            .strip_suffix(END)?
            .to_ascii_lowercase();
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
        if !ok {
            return None;
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Every string `hir` matches (anchors as [`START`]/[`END`]), or `None` when there are too
/// many or infinitely many.
fn words(hir: &Hir) -> Option<Vec<String>> {
    let out = match hir.kind() {
        HirKind::Empty => vec![String::new()],
        HirKind::Literal(l) => vec![String::from_utf8(l.0.to_vec()).ok()?],
        HirKind::Class(Class::Unicode(c)) => {
            let mut v = Vec::new();
            for r in c.ranges() {
                // Host names are ASCII (`(?i)` adds signs such as U+212A KELVIN to `k`).
                for ch in (r.start()..=r.end()).filter(char::is_ascii) {
                    v.push(ch.to_string());
                    if v.len() > 2 * MAX_NAMES {
                        return None;
                    }
                }
            }
            v
        }
        HirKind::Class(Class::Bytes(_)) => return None,
        HirKind::Look(Look::Start) => vec![START.to_string()],
        HirKind::Look(Look::End) => vec![END.to_string()],
        HirKind::Look(_) => return None,
        HirKind::Capture(c) => words(&c.sub)?,
        HirKind::Repetition(r) => {
            let max = r.max?;
            if max > 8 {
                return None;
            }
            let sub = words(&r.sub)?;
            let mut all = Vec::new();
            let mut cur = vec![String::new()];
            for k in 0..=max {
                if k >= r.min {
                    all.extend(cur.iter().cloned());
                }
                cur = product(&cur, &sub)?;
            }
            all
        }
        HirKind::Concat(list) => {
            let mut cur = vec![String::new()];
            for h in list {
                cur = product(&cur, &words(h)?)?;
            }
            cur
        }
        HirKind::Alternation(list) => {
            let mut all = Vec::new();
            for h in list {
                all.extend(words(h)?);
            }
            all
        }
    };
    // Lower-cased and without repeats: `(?i)` classes double every letter.
    let mut seen = std::collections::BTreeSet::new();
    let out: Vec<String> = out
        .into_iter()
        .map(|w| w.to_ascii_lowercase())
        .filter(|w| seen.insert(w.clone()))
        .collect();
    (out.len() <= 4 * MAX_NAMES).then_some(out)
}

fn product(a: &[String], b: &[String]) -> Option<Vec<String>> {
    if a.len() * b.len() > 4 * MAX_NAMES {
        return None;
    }
    Some(
        a.iter()
            .flat_map(|x| b.iter().map(move |y| format!("{x}{y}")))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::finite;

    #[test]
    fn finite_regexes_expand() {
        assert_eq!(
            finite(r"^(www\.)?example\.com$").unwrap(),
            ["example.com", "www.example.com"]
        );
        assert_eq!(
            finite(r"^(api|admin)\.Example\.org$").unwrap(),
            ["api.example.org", "admin.example.org"]
        );
        assert_eq!(
            finite(r"^mx[1-2]\.mail\.example\.com$").unwrap(),
            ["mx1.mail.example.com", "mx2.mail.example.com"]
        );
    }

    #[test]
    fn open_regexes_do_not() {
        assert_eq!(finite(r"^(?<sub>.+)\.example\.com$"), None);
        assert_eq!(finite(r"^home\.example([0-9])*\.com$"), None);
        // Unanchored: it matches any name containing it.
        assert_eq!(finite(r"example\.com"), None);
        assert_eq!(finite(r"^example\.com"), None);
        assert_eq!(finite(r"^a_b\.com$"), None);
    }
}
