//! `location` blocks (and the server-level `return`/`rewrite`/`if`) as routes.
//!
//! Matching: `= /x` is `path_exact`, a prefix is `path`, `~`/`~*` is `path_regex` (`(?i)`
//! for `~*`). veloxy, like nginx, tries exact paths, then regexes in order, then the longest
//! prefix. A `proxy_pass` whose URI part replaces a prefix that is not cut at a `/` becomes a
//! regex route (`^/api(.*)` -> `/v1{re.1}`), ordered after the real regexes and longest
//! first, as nginx would pick the prefix after its regexes failed.
//!
//! * [`return_rewrite`]: `return`, `rewrite` and the server-level `if` idioms.
//! * [`proxy`]: `proxy_pass`/`grpc_pass` (the group, the upstream path, request headers).
//! * [`files`]: file routes and the rules every route of a level takes.

mod files;
mod proxy;

use super::auth;
mod return_rewrite;

use toml::Value;
use veloxy_import::{Loc, Section};

use super::common::{self, At};
use super::server::ServerCtx;
use super::{Level, Tr};
use crate::parse::Directive;
use crate::vars::{self, VarCtx};
use files::{files, rules};
use proxy::proxy;
use return_rewrite::{regex, return_target, rewrite_redirect};

/// The words of an `if (...)` condition, parentheses stripped: `["$scheme", "=", "http"]`.
fn condition(d: &Directive) -> Vec<&str> {
    d.args
        .iter()
        .map(|a| a.text.trim_matches(['(', ')']))
        .filter(|s| !s.is_empty())
        .collect()
}
pub use return_rewrite::{server_rule, ServerRule};

/// Where a route goes in the server's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A `~`/`~*` location (file order among them).
    Regex,
    /// A prefix turned into a regex (after the real ones, longest first).
    PrefixRegex(usize),
    /// Exact and prefix routes (their order does not matter).
    Other,
}

/// A route being built (no listener or host yet).
#[derive(Debug, Clone)]
pub struct Draft {
    /// Its keys.
    pub sec: Section,
    /// Its place.
    pub kind: Kind,
    /// Its rules are set already (an `if` inside the location, a level of its own).
    pub ruled: bool,
}

/// How a location matches.
#[derive(Debug, Clone)]
pub(super) enum Match {
    Exact(String),
    Prefix(String),
    Regex(String),
}

pub(super) fn ctx(lvl: &Level, sctx: &ServerCtx, captures: bool) -> VarCtx {
    let mut c = common::ctx(lvl);
    c.captures = captures;
    c.server_name = sctx.first_name.clone();
    c
}

pub(super) fn table(kv: &[(&str, Value)]) -> Value {
    Value::Table(kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
}

/// A `location` (and the ones nested in it) as drafts.
pub fn location<'a>(
    tr: &mut Tr<'a>,
    d: &'a Directive,
    parent: &Level,
    sctx: &ServerCtx,
    _outer: Option<&str>,
    out: &mut Vec<Draft>,
) {
    let (modifier, pattern) = match d.args.len() {
        1 => ("", d.arg(0)),
        _ => (d.arg(0), d.arg(1)),
    };
    if pattern.starts_with('@') || modifier.starts_with('@') {
        tr.skip(d, "a named location: veloxy has no internal redirects (try_files or error_page to it are refused)");
        return;
    }
    let m = match modifier {
        "=" => Match::Exact(pattern.to_string()),
        "" | "^~" => Match::Prefix(pattern.to_string()),
        "~" | "~*" => match regex(pattern) {
            Ok(r) if modifier == "~*" => Match::Regex(format!("(?i){r}")),
            Ok(r) => Match::Regex(r),
            Err(e) => {
                tr.skip(d, &e);
                return;
            }
        },
        other => {
            tr.skip(d, &format!("location modifier {other:?}"));
            return;
        }
    };
    let mut lvl = parent.child();
    let mut nested = Vec::new();
    let mut content: Vec<&Directive> = Vec::new();
    let kids = tr.flat(d.children());
    let auth_target = auth::answers(&m, &sctx.auth_uris);
    lvl.auth_location = auth_target;
    auth::prescan(tr, &kids, &mut lvl);
    let internal = kids.iter().any(|c| c.name == "internal");
    for c in kids.iter().copied() {
        match c.name.as_str() {
            "location" => nested.push(c),
            "proxy_pass" | "grpc_pass" | "return" | "rewrite" | "try_files" | "if"
                if internal && !auth_target =>
            {
                tr.skip_ignored(c, "in an internal location: reached only by nginx's internal redirects (X-Accel-Redirect, error_page, try_files), which veloxy has not; clients get 404 from both")
            }
            "proxy_pass" | "grpc_pass" | "return" | "rewrite" | "try_files" | "if" => {
                content.push(c)
            }
            "internal" => tr.rep.translated(&c.loc, "internal"),
            "limit_except" => tr.skip(c, "veloxy has no per-method access rules"),
            _ => {
                if !common::directive(tr, c, &mut lvl, At::Location) {
                    tr.unknown(c);
                }
            }
        }
    }
    let is_regex = matches!(m, Match::Regex(_));
    let mut sec = Section::from(&d.loc);
    let mut kind = if is_regex { Kind::Regex } else { Kind::Other };
    match &m {
        Match::Exact(p) => sec.set("path_exact", p.as_str()),
        Match::Prefix(p) => sec.set("path", p.as_str()),
        Match::Regex(r) => sec.set("path_regex", r.as_str()),
    };
    let mut extra: Vec<Draft> = Vec::new();
    let mut target = false;
    let mut proxied = false;
    let mut has_content = false;
    let mut break_rewrite: Option<(String, String)> = None;
    let mut pending: Vec<MethodIf> = Vec::new();
    for c in &content {
        has_content = true;
        match c.name.as_str() {
            "return" if !target => {
                target = return_target(tr, c, &lvl, sctx, is_regex, &mut sec);
            }
            "return" => {
                tr.rep
                    .ignored(&c.loc, "return", "never reached: an earlier return answers")
            }
            "rewrite" => {
                if c.arg(2) == "break" && !c.arg(1).starts_with("http") {
                    match regex(c.arg(0)).and_then(|r| {
                        vars::template(c.arg(1), &ctx(&lvl, sctx, true))
                            .map(|t| (r, t))
                            .map_err(|v| format!("veloxy has no variable {v}"))
                    }) {
                        Ok(rt) if !is_regex && c.arg(0).starts_with('^') => {
                            break_rewrite = Some(rt);
                            tr.rep.translated(&c.loc, "rewrite");
                        }
                        Ok(_) => tr.rep.refused(
                            &c.loc,
                            "rewrite",
                            "a rewrite inside a regex location (two regexes): not translated",
                        ),
                        Err(e) => tr.rep.refused(&c.loc, "rewrite", e),
                    }
                    continue;
                }
                if let Some((re, to, status)) = rewrite_redirect(tr, c, &lvl, sctx) {
                    let mut s = Section::from(&c.loc);
                    s.set("path_regex", re);
                    s.set(
                        "redirect",
                        table(&[("to", to.into()), ("status", Value::from(status))]),
                    );
                    extra.push(Draft {
                        sec: s,
                        kind: Kind::Regex,
                        ruled: false,
                    });
                }
            }
            "if" => location_if(tr, c, &lvl, sctx, &m, &mut extra, &mut pending),
            _ => {}
        }
    }
    if !target {
        if let Some(pp) = content
            .iter()
            .find(|c| c.name == "proxy_pass" || c.name == "grpc_pass")
        {
            match proxy(tr, pp, &lvl, sctx, &m, &mut sec, &mut kind) {
                true => {
                    target = true;
                    proxied = true;
                }
                false => return skip_rest(tr, d, &content, pp, nested, &lvl, sctx, out),
            }
        }
    }
    for c in content.iter().filter(|c| c.name == "try_files") {
        if target {
            tr.rep.ignored(
                &c.loc,
                &c.name,
                "the location answers by proxy_pass or return",
            );
        }
    }
    if auth_target {
        auth::record(tr, &m, proxied.then_some(&sec), &lvl, internal);
    }
    if internal {
        // Clients get 404 (nginx's answer to an external request for an internal location).
        if auth_target {
            auth::report_headers(tr, &kids, &lvl);
        }
        sec.keys
            .retain(|(k, _)| matches!(k.as_str(), "path" | "path_exact" | "path_regex"));
        sec.set("respond", table(&[("status", Value::from(404))]));
        rules(tr, &lvl, false, &mut sec);
        out.extend(extra);
        out.push(Draft {
            sec,
            kind: if is_regex { Kind::Regex } else { Kind::Other },
            ruled: true,
        });
        tr.rep.translated(&d.loc, "location");
        for n in nested {
            location(tr, n, &lvl, sctx, None, out);
        }
        return;
    }
    if !target && (has_content || lvl.root.is_some() && nested.is_empty() || nested.is_empty()) {
        target = files(tr, &content, &lvl, &m, &mut sec);
    }
    if let (Some((re, t)), true) = (break_rewrite, proxied) {
        let mut s = sec.clone();
        s.remove("path");
        s.remove("strip_prefix");
        s.keys.insert(0, ("path_regex".into(), re.into()));
        s.set("rewrite", t);
        extra.push(Draft {
            sec: s,
            kind: Kind::Regex,
            ruled: false,
        });
    }
    for p in pending {
        method_variant(tr, p, target.then_some(&sec), proxied, kind, &mut extra);
    }
    if target {
        rules(tr, &lvl, proxied, &mut sec);
        for e in extra.iter_mut().filter(|e| !e.ruled) {
            let mut e2 = e.sec.clone();
            rules(tr, &lvl, e2.get("upstream").is_some(), &mut e2);
            e.sec = e2;
        }
        out.extend(extra);
        out.push(Draft {
            sec,
            kind,
            ruled: true,
        });
    } else {
        out.extend(extra);
    }
    tr.rep.translated(&d.loc, "location");
    for n in nested {
        location(tr, n, &lvl, sctx, None, out);
    }
}

/// The location's route for one method with an `if`'s level, or the `if` refused.
fn method_variant(
    tr: &mut Tr<'_>,
    p: MethodIf,
    target: Option<&Section>,
    proxied: bool,
    kind: Kind,
    extra: &mut Vec<Draft>,
) {
    let Some(sec) = target else {
        tr.rep.refused(
            &p.loc,
            "if",
            "its location has no target to serve the method with",
        );
        return;
    };
    if sec.get("rewrite").is_some() || sec.get("strip_prefix").is_some() {
        // nginx passes the request's own URI from inside an `if` (proxy_pass's URI part is
        // not applied there).
        tr.rep.refused(
            &p.loc,
            "if",
            "an if without return around a proxy_pass with a URI part (nginx then sends the URI unchanged)",
        );
        return;
    }
    let mut s = sec.clone();
    s.from = vec![p.loc.clone()];
    s.keys.insert(
        1,
        (
            "methods".into(),
            Value::Array(vec![p.method.as_str().into()]),
        ),
    );
    rules(tr, &p.lvl, proxied, &mut s);
    tr.rep.translated(&p.loc, "if");
    extra.push(Draft {
        sec: s,
        kind,
        ruled: true,
    });
}

/// After a refused proxy_pass: the other content lines and nested locations are reported.
#[allow(clippy::too_many_arguments)]
fn skip_rest<'a>(
    tr: &mut Tr<'a>,
    d: &Directive,
    content: &[&Directive],
    pp: &Directive,
    nested: Vec<&'a Directive>,
    lvl: &Level,
    sctx: &ServerCtx,
    out: &mut Vec<Draft>,
) {
    tr.rep
        .refused(&d.loc, "location", "its proxy_pass is refused");
    for c in content.iter().filter(|c| !std::ptr::eq(**c, pp)) {
        if !tr.rep.entries.iter().any(|e| e.loc == c.loc) {
            tr.rep
                .refused(&c.loc, &c.name, "its location's proxy_pass is refused");
        }
    }
    for n in nested {
        location(tr, n, lvl, sctx, None, out);
    }
}

/// An `if ($request_method = M)` without a return: the location's own target for that
/// method, with the `if`'s level (its `add_header` list replaces the location's).
pub(super) struct MethodIf {
    loc: Loc,
    method: String,
    lvl: Level,
}

/// `if ($request_method = M) { ... return ...; }` in a location: a route with `methods`;
/// without a return, a [`MethodIf`] for the location to finish.
fn location_if<'a>(
    tr: &mut Tr<'a>,
    d: &'a Directive,
    lvl: &Level,
    sctx: &ServerCtx,
    m: &Match,
    extra: &mut Vec<Draft>,
    pending: &mut Vec<MethodIf>,
) {
    let cond = condition(d);
    let ["$request_method", "=", method] = cond.as_slice() else {
        tr.skip(d, &format!("the condition {}: only `$request_method = M` with a return is translated in a location", cond.join(" ")));
        return;
    };
    let mut inner = lvl.child();
    let mut sec = Section::from(&d.loc);
    match m {
        Match::Exact(p) => sec.set("path_exact", p.as_str()),
        Match::Prefix(p) => sec.set("path", p.as_str()),
        Match::Regex(r) => sec.set("path_regex", r.as_str()),
    };
    sec.set(
        "methods",
        Value::Array(vec![Value::from(
            method.trim_matches('"').to_ascii_uppercase(),
        )]),
    );
    let mut ok = false;
    let mut has_return = false;
    let mut all_known = true;
    for c in tr.flat(d.children()) {
        if c.name == "return" && !ok {
            has_return = true;
            ok = return_target(tr, c, &inner, sctx, matches!(m, Match::Regex(_)), &mut sec);
        } else if !common::directive(tr, c, &mut inner, At::Location) {
            all_known = false;
            tr.skip(
                c,
                "inside if: only header directives and return are translated",
            );
        }
    }
    if !has_return && all_known {
        pending.push(MethodIf {
            loc: d.loc.clone(),
            method: method.to_ascii_uppercase(),
            lvl: inner,
        });
        return;
    }
    if ok {
        tr.rep.translated(&d.loc, "if");
        rules(tr, &inner, false, &mut sec);
        extra.push(Draft {
            sec,
            kind: if matches!(m, Match::Regex(_)) {
                Kind::Regex
            } else {
                Kind::Other
            },
            ruled: true,
        });
    } else {
        tr.rep
            .refused(&d.loc, "if", "no translatable return inside");
    }
}

/// A server whose locations do not cover `/`: nginx serves the root's files there (or 404).
pub fn fallback(
    tr: &mut Tr<'_>,
    lvl: &Level,
    _sctx: &ServerCtx,
    drafts: &mut Vec<Draft>,
    loc: &Loc,
) {
    let covered = drafts.iter().any(|d| {
        d.sec.get("path").and_then(|p| p.as_str()) == Some("/") && d.sec.get("methods").is_none()
    });
    if covered {
        return;
    }
    let mut sec = Section::from(loc);
    sec.set("path", "/");
    let m = Match::Prefix("/".into());
    if lvl.root.is_some() && files(tr, &[], lvl, &m, &mut sec) {
        rules(tr, lvl, false, &mut sec);
    } else if drafts.is_empty() {
        return;
    } else {
        sec.set("respond", table(&[("status", Value::from(404))]));
    }
    drafts.push(Draft {
        sec,
        kind: Kind::Other,
        ruled: true,
    });
}
