//! `location` blocks (and the server-level `return`/`rewrite`/`if`) as routes.
//!
//! Matching: `= /x` is `path_exact`, a prefix is `path`, `~`/`~*` is `path_regex` (`(?i)`
//! for `~*`). veloxy, like nginx, tries exact paths, then regexes in order, then the longest
//! prefix. A `proxy_pass` whose URI part replaces a prefix that is not cut at a `/` becomes a
//! regex route (`^/api(.*)` -> `/v1{re.1}`), ordered after the real regexes and longest
//! first, as nginx would pick the prefix after its regexes failed.

use toml::Value;
use veloxy_import::{Loc, Section};

use super::common::{self, At};
use super::level::ReqHeader;
use super::server::ServerCtx;
use super::upstream::Target;
use super::{Level, Tr};
use crate::parse::Directive;
use crate::vars::{self, VarCtx};

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
}

/// How a location matches.
#[derive(Debug, Clone)]
enum Match {
    Exact(String),
    Prefix(String),
    Regex(String),
}

/// A server-level `return`/`rewrite`/`if`.
pub enum ServerRule {
    /// Answers every request of the server.
    All(Section),
    /// `if ($scheme = http)`: answers the plain listeners' requests.
    Scheme(Section),
    /// `if ($host = NAME)` (or `!=`).
    Host {
        names: Vec<String>,
        negate: bool,
        sec: Section,
    },
    /// A `rewrite` with a regex: its own route.
    Regex(Section),
    /// Nothing to add (refused or reported).
    None,
}

fn ctx(lvl: &Level, sctx: &ServerCtx, captures: bool) -> VarCtx {
    let mut c = common::ctx(lvl);
    c.captures = captures;
    c.server_name = sctx.first_name.clone();
    c
}

/// `return CODE [TEXT|URL]` / `return URL` as a route target (set on `sec`).
fn return_target(
    tr: &mut Tr<'_>,
    d: &Directive,
    lvl: &Level,
    sctx: &ServerCtx,
    captures: bool,
    sec: &mut Section,
) -> bool {
    let (code, rest) = match d.arg(0).parse::<u16>() {
        Ok(c) => (c, d.args.get(1).map(|a| a.text.as_str())),
        Err(_) => (302, Some(d.arg(0))),
    };
    let c = ctx(lvl, sctx, captures);
    if code == 444 {
        tr.rep.different(
            &d.loc,
            "return",
            "veloxy cannot close without an answer: it answers 404",
        );
        sec.set("respond", table(&[("status", Value::from(404))]));
        return true;
    }
    if [301, 302, 303, 307, 308].contains(&code) {
        let url = rest.unwrap_or("");
        let to = match vars::template(url, &c) {
            Ok(t) => absolute(&t, sctx),
            Err(v) => {
                tr.rep
                    .refused(&d.loc, "return", format!("veloxy has no variable {v}"));
                return false;
            }
        };
        sec.set(
            "redirect",
            table(&[("to", to.into()), ("status", Value::from(i64::from(code)))]),
        );
        tr.rep.different(
            &d.loc,
            "return",
            "the redirect's body is veloxy's short text, not nginx's HTML page",
        );
        return true;
    }
    let mut t = vec![("status", Value::from(i64::from(code)))];
    match rest {
        Some(text) if vars::has_vars(text) => {
            tr.rep.refused(
                &d.loc,
                "return",
                "a body with variables: veloxy's fixed answers are literal",
            );
            return false;
        }
        Some(text) => {
            t.push(("body", text.into()));
            t.push((
                "content_type",
                lvl.default_type
                    .clone()
                    .unwrap_or_else(|| "text/plain".into())
                    .into(),
            ));
            tr.rep.translated(&d.loc, "return");
        }
        None if code >= 400 => tr.rep.different(
            &d.loc,
            "return",
            "the body is veloxy's short text, not nginx's HTML error page",
        ),
        None => tr.rep.translated(&d.loc, "return"),
    }
    sec.set("respond", table(&t));
    true
}

/// nginx makes a redirect to a local path absolute (`absolute_redirect on`): scheme, host
/// and, off the default ports, the port.
fn absolute(to: &str, sctx: &ServerCtx) -> String {
    if to.starts_with('/') {
        let port = if sctx.default_ports {
            ""
        } else {
            ":{server_port}"
        };
        format!("{{scheme}}://{{host}}{port}{to}")
    } else {
        to.to_string()
    }
}

fn table(kv: &[(&str, Value)]) -> Value {
    Value::Table(kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
}

/// A server-level `return`, `rewrite` or `if`. These answer in nginx's rewrite phase, before
/// access, auth and limits, so their routes take only the level's `add_header` fields.
pub fn server_rule(tr: &mut Tr<'_>, d: &Directive, lvl: &Level, sctx: &ServerCtx) -> ServerRule {
    let mut sec = Section::from(&d.loc);
    added_headers(lvl, &mut sec);
    match d.name.as_str() {
        "return" => {
            sec.set("path", "/");
            if return_target(tr, d, lvl, sctx, false, &mut sec) {
                ServerRule::All(sec)
            } else {
                ServerRule::None
            }
        }
        "rewrite" => match rewrite_redirect(tr, d, lvl, sctx) {
            Some((re, to, status))
                if re == "^" || re == "^(.*)$" || re == "^/(.*)$" || re == "^(.*)" =>
            {
                sec.set("path", "/");
                sec.set(
                    "redirect",
                    table(&[("to", to.into()), ("status", Value::from(status))]),
                );
                ServerRule::All(sec)
            }
            Some((re, to, status)) => {
                sec.set("path_regex", re);
                sec.set(
                    "redirect",
                    table(&[("to", to.into()), ("status", Value::from(status))]),
                );
                ServerRule::Regex(sec)
            }
            None => ServerRule::None,
        },
        _ => server_if(tr, d, lvl, sctx, sec),
    }
}

/// `if ($scheme = http) { return ...; }` and `if ($host = name) { return ...; }`.
fn server_if(
    tr: &mut Tr<'_>,
    d: &Directive,
    lvl: &Level,
    sctx: &ServerCtx,
    mut sec: Section,
) -> ServerRule {
    let cond: Vec<&str> = d
        .args
        .iter()
        .map(|a| a.text.trim_matches(['(', ')']))
        .filter(|s| !s.is_empty())
        .collect();
    let body = d.children();
    let ret = match body {
        [r] if r.name == "return" => r,
        _ => {
            tr.skip(
                d,
                "only `if` around a single return on $scheme or $host is translated",
            );
            return ServerRule::None;
        }
    };
    let rule = match cond.as_slice() {
        ["$scheme", op, v] if (*op == "=" && *v == "http") || (*op == "!=" && *v == "https") => 0,
        ["$host" | "$http_host", "=" | "!=", _] => 1,
        _ => {
            tr.skip(
                d,
                &format!(
                    "the condition {}: only $scheme and $host redirects are translated",
                    cond.join(" ")
                ),
            );
            return ServerRule::None;
        }
    };
    sec.set("path", "/");
    if !return_target(tr, ret, lvl, sctx, false, &mut sec) {
        tr.rep.refused(&d.loc, "if", "its return is refused");
        return ServerRule::None;
    }
    tr.rep.translated(&d.loc, "if");
    if rule == 0 {
        return ServerRule::Scheme(sec);
    }
    let name = cond[2].trim_matches('"').to_ascii_lowercase();
    ServerRule::Host {
        names: vec![name],
        negate: cond[1] == "!=",
        sec,
    }
}

/// A `rewrite REGEX URL redirect|permanent` (or an absolute URL): (regex, to, status).
fn rewrite_redirect(
    tr: &mut Tr<'_>,
    d: &Directive,
    lvl: &Level,
    sctx: &ServerCtx,
) -> Option<(String, String, i64)> {
    let flag = d.arg(2);
    let repl = d.arg(1);
    let absolute_url =
        repl.starts_with("http://") || repl.starts_with("https://") || repl.starts_with("$scheme");
    if !(flag == "redirect" || flag == "permanent" || absolute_url) {
        tr.rep.refused(&d.loc, "rewrite", format!("an internal rewrite ({}): veloxy matches routes once; rewrite upstream paths with proxy_pass", if flag.is_empty() { "no flag" } else { flag }));
        return None;
    }
    let status = if flag == "permanent" { 301 } else { 302 };
    let (repl, keep_query) = match repl.strip_suffix('?') {
        Some(r) => (r, false),
        None => (
            repl,
            !repl.contains("$request_uri") && !repl.contains("$args"),
        ),
    };
    let re = match regex(d.arg(0)) {
        Ok(r) => r,
        Err(e) => {
            tr.rep.refused(&d.loc, "rewrite", e);
            return None;
        }
    };
    match vars::template(repl, &ctx(lvl, sctx, true)) {
        Ok(t) => {
            // nginx appends the client's arguments: after `?` when the replacement has none,
            // after `&` when it has its own.
            let t = match (keep_query, t.contains('?')) {
                (false, _) => t,
                (true, false) => format!("{t}{{is_args}}{{query}}"),
                (true, true) => {
                    tr.rep.different(
                        &d.loc,
                        "rewrite",
                        "the client's arguments are appended after '&' even when it sent none \
                         (nginx leaves no '&' then)",
                    );
                    return Some((re, absolute(&format!("{t}&{{query}}"), sctx), status));
                }
            };
            tr.rep.translated(&d.loc, "rewrite");
            Some((re, absolute(&t, sctx), status))
        }
        Err(v) => {
            tr.rep
                .refused(&d.loc, "rewrite", format!("veloxy has no variable {v}"));
            None
        }
    }
}

/// An nginx (PCRE) regex as a veloxy (Rust) one, or why not.
fn regex(re: &str) -> Result<String, String> {
    regex_syntax::ParserBuilder::new()
        .build()
        .parse(re)
        .map(|_| re.to_string())
        .map_err(|e| format!("the regex {re:?} is not valid in veloxy (Rust regex syntax: no look-around or back-references): {}", e.to_string().lines().last().unwrap_or("")))
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
    for c in d.children() {
        match c.name.as_str() {
            "location" => nested.push(c),
            "proxy_pass" | "grpc_pass" | "return" | "rewrite" | "try_files" | "if" => {
                content.push(c)
            }
            "internal" => tr.rep.translated(&c.loc, "internal"),
            "expires" => content.push(c),
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
                    });
                }
            }
            "if" => location_if(tr, c, &lvl, sctx, &m, &mut extra),
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
    for c in content
        .iter()
        .filter(|c| c.name == "try_files" || c.name == "expires")
    {
        if target {
            tr.rep.ignored(
                &c.loc,
                &c.name,
                "the location answers by proxy_pass or return",
            );
        }
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
        });
    }
    if target {
        rules(tr, &lvl, proxied, &mut sec);
        for e in &mut extra {
            let mut e2 = e.sec.clone();
            rules(tr, &lvl, e2.get("upstream").is_some(), &mut e2);
            e.sec = e2;
        }
        out.extend(extra);
        out.push(Draft { sec, kind });
    } else {
        out.extend(extra);
    }
    tr.rep.translated(&d.loc, "location");
    for n in nested {
        location(tr, n, &lvl, sctx, None, out);
    }
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

/// `if ($request_method = M) { ... return ...; }` in a location: a route with `methods`.
fn location_if<'a>(
    tr: &mut Tr<'a>,
    d: &'a Directive,
    lvl: &Level,
    sctx: &ServerCtx,
    m: &Match,
    extra: &mut Vec<Draft>,
) {
    let cond: Vec<&str> = d
        .args
        .iter()
        .map(|a| a.text.trim_matches(['(', ')']))
        .filter(|s| !s.is_empty())
        .collect();
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
    for c in d.children() {
        if c.name == "return" && !ok {
            ok = return_target(tr, c, &inner, sctx, matches!(m, Match::Regex(_)), &mut sec);
        } else if !common::directive(tr, c, &mut inner, At::Location) {
            tr.skip(
                c,
                "inside if: only header directives and return are translated",
            );
        }
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
        });
    } else {
        tr.rep
            .refused(&d.loc, "if", "no translatable return inside");
    }
}

/// `proxy_pass` / `grpc_pass`: the group and the upstream path; false when refused.
fn proxy(
    tr: &mut Tr<'_>,
    d: &Directive,
    lvl: &Level,
    sctx: &ServerCtx,
    m: &Match,
    sec: &mut Section,
    kind: &mut Kind,
) -> bool {
    let mut url = d.arg(0).to_string();
    for (k, v) in &lvl.constants {
        url = url
            .replace(&format!("${{{k}}}"), v)
            .replace(&format!("${k}"), v);
    }
    let grpc = d.name == "grpc_pass";
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r.to_string()),
        None if grpc => ("grpc".into(), url.clone()),
        None => {
            tr.rep.refused(
                &d.loc,
                &d.name,
                format!("the address {url:?} (a variable holding the whole URL?)"),
            );
            return false;
        }
    };
    let tls = matches!(scheme.as_str(), "https" | "grpcs");
    let (host, uri) = if let Some(sock) = rest.strip_prefix("unix:") {
        match sock.split_once(':') {
            Some((p, u)) => (format!("unix:{p}"), Some(u.to_string())),
            None => (format!("unix:{sock}"), None),
        }
    } else {
        match rest.find(['/', '$']) {
            Some(i) => (rest[..i].to_string(), Some(rest[i..].to_string())),
            None => (rest.clone(), None),
        }
    };
    if vars::has_vars(&host) {
        tr.rep.refused(
            &d.loc,
            &d.name,
            format!("an upstream chosen per request ({host}): veloxy's groups are fixed"),
        );
        return false;
    }
    let block = tr.is_block(&host);
    let addr = if block || host.contains(':') || host.starts_with("unix:") {
        host.clone()
    } else {
        format!("{host}:{}", if tls { 443 } else { 80 })
    };
    let proxy_host = host.clone();
    let (group, mut diffs) = tr.group(
        &Target {
            host: addr,
            tls,
            grpc,
        },
        lvl,
        &d.loc,
    );
    sec.set("upstream", group);
    // The upstream path.
    match (uri.as_deref(), m) {
        (None, _) => {}
        (Some(u), _) if vars::has_vars(u) => {
            let (u, keep) = match u.strip_suffix("$is_args$args") {
                Some(b) => (b, true),
                None => (u, u.contains("$request_uri") || u.contains("$args")),
            };
            match vars::template(u, &ctx(lvl, sctx, matches!(m, Match::Regex(_)))) {
                Ok(t) if t == "{uri}" => {}
                Ok(t) => {
                    sec.set(
                        "rewrite",
                        if keep || t.contains('?') {
                            t
                        } else {
                            format!("{t}?")
                        },
                    );
                }
                Err(v) => {
                    tr.rep
                        .refused(&d.loc, &d.name, format!("veloxy has no variable {v}"));
                    return false;
                }
            }
        }
        (Some(_), Match::Regex(_)) => {
            tr.rep.refused(
                &d.loc,
                &d.name,
                "a URI part in a regex location (nginx refuses it too)",
            );
            return false;
        }
        (Some(u), Match::Exact(_)) => {
            sec.set("rewrite", u.replace('{', "{{").replace('}', "}}"));
        }
        (Some(u), Match::Prefix(p)) => {
            if u == p {
            } else if u == "/" && p.ends_with('/') {
                sec.set("strip_prefix", true);
            } else {
                sec.remove("path");
                sec.keys.insert(
                    0,
                    (
                        "path_regex".into(),
                        format!("^{}(.*)", regex_syntax::escape(p)).into(),
                    ),
                );
                sec.set(
                    "rewrite",
                    format!("{}{{re.1}}", u.replace('{', "{{").replace('}', "}}")),
                );
                *kind = Kind::PrefixRegex(p.len());
            }
        }
    }
    // Request headers: the level's proxy_set_header list, and nginx's Host: $proxy_host.
    let list: Vec<ReqHeader> = lvl.proxy_headers.as_deref().cloned().unwrap_or_default();
    let mut set = toml::Table::new();
    let mut remove = Vec::new();
    if !list.iter().any(|h| h.name().eq_ignore_ascii_case("host")) {
        let shown = proxy_host
            .strip_suffix(if tls { ":443" } else { ":80" })
            .unwrap_or(&proxy_host);
        if !shown.starts_with("unix:") {
            set.insert("Host".into(), shown.into());
        } else {
            set.insert("Host".into(), "localhost".into());
        }
    }
    for h in &list {
        match h {
            ReqHeader::Set(n, v) => {
                set.insert(n.clone(), v.as_str().into());
            }
            ReqHeader::Remove(n) => remove.push(Value::from(n.as_str())),
            ReqHeader::Default(_) => {}
        }
    }
    let mut rh = toml::Table::new();
    if !set.is_empty() {
        rh.insert("set".into(), Value::Table(set));
    }
    if !remove.is_empty() {
        rh.insert("remove".into(), Value::Array(remove));
    }
    if !rh.is_empty() {
        sec.set("request_headers", Value::Table(rh));
    }
    let unset: Vec<&str> = ["X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host"]
        .into_iter()
        .filter(|f| !list.iter().any(|h| h.name().eq_ignore_ascii_case(f)))
        .collect();
    if !unset.is_empty() {
        diffs.push(format!(
            "veloxy also sends {} (nginx sends them only when proxy_set_header sets them)",
            unset.join(", ")
        ));
    }
    if diffs.is_empty() {
        tr.rep.translated(&d.loc, &d.name);
    } else {
        tr.rep.different(&d.loc, &d.name, diffs.join("; "));
    }
    true
}

/// A file route: `root`/`alias`, `index`, `autoindex`, `try_files`.
fn files(
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
fn added_headers(lvl: &Level, sec: &mut Section) {
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
fn rules(tr: &mut Tr<'_>, lvl: &Level, proxied: bool, sec: &mut Section) {
    added_headers(lvl, sec);
    if let Some(pages) = lvl.error_pages.as_deref() {
        let mut t = toml::Table::new();
        for (code, uri) in pages {
            if let Some(root) = lvl.root.as_ref().filter(|r| !r.alias) {
                let file = format!("{}{}", root.path.trim_end_matches('/'), uri);
                if tr.prefix.join(&file).is_file() {
                    let base = tr.prefix.clone();
                    t.insert(code.clone(), tr.opts.out_path(&base, &file).into());
                }
            }
        }
        if !t.is_empty() {
            sec.set("error_pages", Value::Table(t));
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
    if proxied && lvl.gzip {
        sec.set("compress", true);
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
    });
}
