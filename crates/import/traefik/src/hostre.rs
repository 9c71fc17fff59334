//! `HostRegexp` as veloxy host patterns: v3 regexes and v2 templates
//! (`{sub:[a-z]+}.example.com`) that are a literal name, a name with optional or alternative
//! leading labels (`(www\\.)?example\\.com`), or any label(s) under a domain (`*.example.com`,
//! with the difference named when the label pattern is narrower).

use crate::matcher::template_regex;

/// A HostRegexp (v3 regex, or v2 `{sub:[a-z]+}.example.com`) as veloxy host patterns:
/// empty = any host. `None` when it has no such form. The note names what veloxy matches
/// more broadly.
pub fn host_regexp(arg: &str) -> Option<(Vec<String>, Option<String>)> {
    let v2 = arg.contains('{') && is_v2_template(arg);
    let re = if v2 {
        format!("^{}$", template_regex(arg, "[^.]+", false))
    } else {
        arg.to_string()
    };
    let body = re.strip_prefix('^').unwrap_or(&re);
    let anchored = body.ends_with('$') && !body.ends_with("\\$") && re.starts_with('^');
    let body = body.strip_suffix('$').unwrap_or(body);
    if matches!(body, "" | ".*" | ".+") {
        return Some((Vec::new(), None));
    }
    let loose = (!anchored).then(|| {
        format!("HostRegexp(`{arg}`) is unanchored in Traefik (it also matches names containing it); veloxy matches the name exactly")
    });
    if let Some(name) = literal(body) {
        return Some((vec![name], loose));
    }
    // `(www\.)?example\.com` / `(?:a|b)\.example\.com`
    if let Some((alts, rest)) = leading_group(body) {
        let tail = literal(
            rest.strip_prefix("\\.")
                .or_else(|| rest.strip_prefix('.'))?,
        )?;
        let optional = alts.1;
        let mut hosts = Vec::new();
        if let Some(names) = alts
            .0
            .iter()
            .map(|a| literal(a))
            .collect::<Option<Vec<_>>>()
        {
            for n in names {
                let n = n.trim_end_matches('.');
                hosts.push(format!("{n}.{tail}"));
            }
            if optional {
                hosts.push(tail.clone());
            }
            return Some((hosts, loose));
        }
        let label = alts.0.join("|");
        return Some((vec![format!("*.{tail}")], wildcard_note(&label, &tail, arg)));
    }
    // `[a-z]+\.example\.com`, `.+\.example\.com`
    for sep in ["\\.", "."] {
        if let Some(i) = body.find(sep) {
            let (label, rest) = (&body[..i], &body[i + sep.len()..]);
            if is_label_class(label) {
                let tail = literal(rest)?;
                return Some((vec![format!("*.{tail}")], wildcard_note(label, &tail, arg)));
            }
        }
    }
    None
}

fn wildcard_note(label: &str, tail: &str, arg: &str) -> Option<String> {
    (!matches!(label, ".+" | "(.+)" | "(?:.+)")).then(|| {
        format!("HostRegexp(`{arg}`) becomes *.{tail}: veloxy matches every name under {tail}, not only labels matching {label}")
    })
}

fn is_v2_template(s: &str) -> bool {
    let mut rest = s;
    while let Some(i) = rest.find('{') {
        let after = &rest[i + 1..];
        let name_end = after.find([':', '}']).unwrap_or(after.len());
        let name = &after[..name_end];
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return true;
        }
        rest = after;
    }
    false
}

/// A label class: `[a-z]+`, `[a-z0-9-]+`, `[^.]+`, `.+`, `\w+`, optionally in a group.
fn is_label_class(s: &str) -> bool {
    let s = s
        .strip_prefix("(?:")
        .or_else(|| s.strip_prefix('('))
        .and_then(|x| x.strip_suffix(')'))
        .unwrap_or(s);
    if matches!(s, ".+" | ".*" | "\\w+" | "[^.]+" | "[^\\.]+") {
        return true;
    }
    s.starts_with('[')
        && (s.ends_with("]+") || s.ends_with("]*"))
        && s[1..s.len() - 2]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `(a|b)` or `(?:a\.)?` at the start of `s`: the alternatives, whether optional, the rest.
fn leading_group(s: &str) -> Option<((Vec<String>, bool), String)> {
    let inner_start = if s.starts_with("(?:") {
        3
    } else if s.starts_with('(') && !s.starts_with("(?") {
        1
    } else {
        return None;
    };
    let close = s.find(')')?;
    let inner = &s[inner_start..close];
    let mut rest = &s[close + 1..];
    let optional = rest.starts_with('?');
    if optional {
        rest = &rest[1..];
    }
    let alts: Vec<String> = inner.split('|').map(str::to_string).collect();
    if optional {
        // `(www\.)?example\.com`: the group includes its dot.
        let alts = alts
            .iter()
            .map(|a| {
                a.strip_suffix("\\.")
                    .or_else(|| a.strip_suffix('.'))
                    .map(str::to_string)
            })
            .collect::<Option<Vec<_>>>()?;
        // The rest has no leading dot then: make it look like the non-optional case.
        return Some(((alts, true), format!("\\.{rest}")));
    }
    Some(((alts, false), rest.to_string()))
}

/// A regex that is a literal host name (`\.` escapes; an unescaped `.` taken as a dot).
fn literal(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '.' => out.push('.'),
                '-' => out.push('-'),
                _ => return None,
            },
            c if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' => {
                out.push(c.to_ascii_lowercase())
            }
            _ => return None,
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_regexps() {
        let h = |s| host_regexp(s).map(|(h, n)| (h, n.is_some()));
        assert_eq!(
            h("{sub:[a-z]+}.example.com"),
            Some((vec!["*.example.com".into()], true))
        );
        assert_eq!(
            h("^.+\\.example\\.com$"),
            Some((vec!["*.example.com".into()], false))
        );
        assert_eq!(
            h("^(www\\.)?example\\.com$"),
            Some((vec!["www.example.com".into(), "example.com".into()], false))
        );
        assert_eq!(h("^.+$"), Some((vec![], false)));
        assert_eq!(h("^a[0-9]\\.x$"), None);
    }
}
