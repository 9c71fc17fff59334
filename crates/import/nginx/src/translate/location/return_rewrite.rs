//! `return`, `rewrite` and the server-level `if` idioms as route targets.

use toml::Value;
use veloxy_import::Section;

use super::files::added_headers;
use super::{condition, ctx, table};
use crate::parse::Directive;
use crate::translate::server::ServerCtx;
use crate::translate::{Level, Tr};
use crate::vars;

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

/// `return CODE [TEXT|URL]` / `return URL` as a route target (set on `sec`).
pub(super) fn return_target(
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
pub(super) fn absolute(to: &str, sctx: &ServerCtx) -> String {
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
    let cond = condition(d);
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
pub(super) fn rewrite_redirect(
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
pub(super) fn regex(re: &str) -> Result<String, String> {
    regex_syntax::ParserBuilder::new()
        .build()
        .parse(re)
        .map(|_| re.to_string())
        .map_err(|e| format!("the regex {re:?} is not valid in veloxy (Rust regex syntax: no look-around or back-references): {}", e.to_string().lines().last().unwrap_or("")))
}
