//! File routes (`root`/`alias`, `index`, `autoindex`, `try_files`) and the rules every
//! route of a level takes.

use toml::Value;
use veloxy_import::Section;

use super::{table, Match};
use crate::parse::Directive;
use crate::translate::{Level, Tr};

/// A file route: `root`/`alias`, `index`, `autoindex`, `try_files`.
pub(super) fn files(
    tr: &mut Tr<'_>,
    content: &[&Directive],
    lvl: &Level,
    m: &Match,
    sec: &mut Section,
) -> bool {
    let prefix = match m {
        Match::Prefix(p) => p.clone(),
        Match::Exact(p) => p
            .rsplit_once('/')
            .map_or("/".into(), |(a, _)| format!("{a}/")),
        Match::Regex(_) => String::new(),
    };
    let try_files = content.iter().find(|c| c.name == "try_files");
    let Some(root) = &lvl.root else {
        if let Some(t) = try_files {
            tr.rep
                .refused(&t.loc, "try_files", "no root to serve files from");
        }
        sec.set("respond", table(&[("status", Value::from(404))]));
        return true;
    };
    if matches!(m, Match::Regex(_)) && root.alias {
        if let Some(t) = try_files {
            tr.rep
                .refused(&t.loc, "try_files", "alias in a regex location");
        }
        sec.set("respond", table(&[("status", Value::from(404))]));
        return true;
    }
    let dir = if root.alias || matches!(m, Match::Regex(_)) {
        root.path.clone()
    } else {
        format!("{}{}", root.path.trim_end_matches('/'), prefix)
    };
    let base = tr.prefix.clone();
    sec.set("root", tr.opts.out_path(&base, &dir));
    if let Some(idx) = &lvl.index {
        if idx.as_slice() != ["index.html"] {
            sec.set(
                "index",
                Value::Array(idx.iter().map(|s| Value::from(s.as_str())).collect()),
            );
        }
    }
    if lvl.autoindex {
        sec.set("browse", true);
    }
    if let Some(cc) = &lvl.expires {
        sec.set("cache_control", cc.as_str());
    }
    if let Some(t) = try_files {
        let mut list = Vec::new();
        let mut bad = None;
        for (i, a) in t.args.iter().enumerate() {
            let v = a.text.as_str();
            if i == 0 && v == "$uri" {
                continue;
            }
            if v.starts_with('=') && i == t.args.len() - 1 {
                if v != "=404" {
                    bad = Some(format!("the final {v}: veloxy answers 404"));
                }
                continue;
            }
            if v.starts_with('@') {
                bad = Some(format!(
                    "the fallback {v}: a named location (veloxy's try_files serves files only)"
                ));
                continue;
            }
            let rel = match v.strip_prefix(prefix.as_str()) {
                Some(r) if !prefix.is_empty() && prefix != "/" && !v.starts_with('$') => {
                    format!("/{r}")
                }
                _ => v.to_string(),
            };
            if crate::vars::pieces(&rel)
                .iter()
                .any(|p| matches!(p, crate::vars::Piece::Var(n) if *n != "uri"))
            {
                bad = Some(format!("{v}: only $uri is known to veloxy's try_files"));
                continue;
            }
            list.push(Value::from(rel));
        }
        if !list.is_empty() {
            sec.set("try_files", Value::Array(list));
        }
        match bad {
            Some(b) => tr.rep.refused(&t.loc, "try_files", b),
            None => tr.rep.translated(&t.loc, "try_files"),
        }
    }
    if !lvl.gzip {
        sec.set("compress", false);
    }
    true
}

/// The level's `add_header` fields as the route's `response_headers`.
pub(super) fn added_headers(lvl: &Level, sec: &mut Section) {
    if let Some(list) = lvl.add_headers.as_deref().filter(|l| !l.is_empty()) {
        let add: toml::Table = list
            .iter()
            .map(|(n, v)| (n.clone(), Value::from(v.as_str())))
            .collect();
        sec.set("response_headers", table(&[("add", Value::Table(add))]));
    }
}

/// The rules every route of a level takes: headers added to answers, the body limit,
/// access, auth, rate limit, compression, error pages.
pub(super) fn rules(tr: &mut Tr<'_>, lvl: &Level, proxied: bool, sec: &mut Section) {
    added_headers(lvl, sec);
    if let Some(pages) = lvl.error_pages.as_deref() {
        let mut t = toml::Table::new();
        for (code, uri, loc) in pages {
            let Some(root) = lvl.root.as_ref().filter(|r| !r.alias) else {
                tr.amend(
                    loc,
                    "on a route with no root holding the page (an alias, or no root) veloxy answers its own error text",
                );
                continue;
            };
            {
                let file = format!("{}{}", root.path.trim_end_matches('/'), uri);
                if !tr.prefix.join(&file).is_file() {
                    tr.amend(
                        loc,
                        &format!(
                            "{file} is not a file where the import ran: veloxy answers its own \
                             error text instead"
                        ),
                    );
                } else {
                    let base = tr.prefix.clone();
                    t.insert(code.clone(), tr.opts.out_path(&base, &file).into());
                    if proxied && !lvl.intercept_errors {
                        tr.amend(
                            loc,
                            "veloxy's error pages also replace a proxied upstream's own error \
                             answers (nginx only with proxy_intercept_errors on)",
                        );
                    }
                }
            }
        }
        if !t.is_empty() {
            sec.set("error_pages", Value::Table(t));
        }
    }
    if let (true, Some(hide)) = (proxied, lvl.hide_headers.as_deref()) {
        if !hide.is_empty() {
            let rh = sec.table("response_headers");
            rh.insert(
                "remove".into(),
                Value::Array(hide.iter().map(|h| Value::from(h.as_str())).collect()),
            );
        }
    }
    if let (true, Some(cc)) = (proxied, &lvl.expires) {
        let rh = sec.table("response_headers");
        if !matches!(rh.get("set"), Some(Value::Table(_))) {
            rh.insert("set".into(), Value::Table(toml::Table::new()));
        }
        if let Some(Value::Table(set)) = rh.get_mut("set") {
            set.insert("Cache-Control".into(), cc.as_str().into());
        }
    }
    if proxied {
        match &lvl.max_body {
            None => sec.set("max_body_bytes", "1MiB"),
            Some(Some(s)) => sec.set("max_body_bytes", s.as_str()),
            Some(None) => sec,
        };
    }
    if let Some(list) = lvl.access.as_deref().filter(|l| !l.is_empty()) {
        let ends_deny_all = list.last().is_some_and(|a| !a.allow && a.who == "all");
        let allow: Vec<Value> = list
            .iter()
            .filter(|a| a.allow && a.who != "all")
            .map(|a| Value::from(a.who.as_str()))
            .collect();
        let deny: Vec<Value> = list
            .iter()
            .filter(|a| !a.allow && a.who != "all")
            .map(|a| Value::from(a.who.as_str()))
            .collect();
        let mut deny = deny;
        if ends_deny_all && allow.is_empty() {
            deny = vec![Value::from("0.0.0.0/0"), Value::from("::/0")];
        } else if ends_deny_all {
            sec.set("allow", Value::Array(allow));
        }
        if !deny.is_empty() {
            sec.set("deny", Value::Array(deny));
        }
    }
    if let (Some(Some(realm)), Some(file)) = (&lvl.auth_realm, &lvl.auth_file) {
        sec.set(
            "basic_auth",
            table(&[
                ("realm", realm.as_str().into()),
                ("users_file", file.as_str().into()),
            ]),
        );
    }
    if let Some(l) = lvl.limit_req.as_deref().and_then(|l| l.first()) {
        if let Some(Ok((rate, key))) = tr.zones.get(&l.zone) {
            let mut t = vec![
                ("rate", Value::from(rate.as_str())),
                ("burst", Value::from(i64::from(l.burst.max(1)))),
            ];
            if key != "client_ip" {
                t.push(("key", key.as_str().into()));
            }
            sec.set("rate_limit", table(&t));
        }
    }
    crate::translate::auth::placeholder(tr, lvl, proxied, sec);
    if proxied {
        crate::translate::cache::route(tr, lvl, sec);
    }
    if proxied && lvl.gzip {
        sec.set("compress", true);
    }
}
