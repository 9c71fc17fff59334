//! `http-request`, `redirect`, `monitor-uri` and `http-response` lines as steps of a proxy's
//! first-match list (see [`crate::cases`]).

use crate::acl::{self, Acls, Dnf, Lit, Term};
use crate::cases::{Case, Edit, HdrOp, Step, Target};
use crate::matcher::{literal_prefix, Match, PathPat};
use crate::parse::Line;
use crate::proxy::Proxy;
use crate::Ctx;

/// HAProxy's own answer bodies (`http_err_msgs`), by status.
pub fn haproxy_body(status: u16) -> Option<&'static str> {
    Some(match status {
        200 => "<html><body><h1>200 OK</h1>\nService ready.\n</body></html>\n",
        400 => "<html><body><h1>400 Bad request</h1>\nYour browser sent an invalid request.\n</body></html>\n",
        401 => "<html><body><h1>401 Unauthorized</h1>\nYou need a valid user and password to access this content.\n</body></html>\n",
        403 => "<html><body><h1>403 Forbidden</h1>\nRequest forbidden by administrative rules.\n</body></html>\n",
        404 => "<html><body><h1>404 Not Found</h1>\nThe resource could not be found.\n</body></html>\n",
        405 => "<html><body><h1>405 Method Not Allowed</h1>\nA request was made of a resource using a request method not supported by that resource\n</body></html>\n",
        408 => "<html><body><h1>408 Request Time-out</h1>\nYour browser didn't send a complete request in time.\n</body></html>\n",
        410 => "<html><body><h1>410 Gone</h1>\nThe resource is no longer available and will not be available again.\n</body></html>\n",
        425 => "<html><body><h1>425 Too Early</h1>\nYour browser sent early data.\n</body></html>\n",
        429 => "<html><body><h1>429 Too Many Requests</h1>\nYou have sent too many requests in a given amount of time.\n</body></html>\n",
        500 => "<html><body><h1>500 Internal Server Error</h1>\nAn internal server error occurred.\n</body></html>\n",
        502 => "<html><body><h1>502 Bad Gateway</h1>\nThe server returned an invalid or incomplete response.\n</body></html>\n",
        503 => "<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>\n",
        504 => "<html><body><h1>504 Gateway Time-out</h1>\nThe server didn't respond in time.\n</body></html>\n",
        _ => return None,
    })
}

/// HAProxy's own answer with `status`.
pub fn haproxy_answer(status: u16) -> Target {
    Target::Respond {
        status,
        body: haproxy_body(status).unwrap_or_default().to_string(),
        ctype: "text/html".into(),
    }
}

/// The ACLs of a proxy, each line reported; `ports`: the ports of the frontend's binds.
pub fn acls(cx: &mut Ctx, p: &Proxy, ports: &[u16]) -> Acls {
    let mut acls = Acls::default();
    acls.ports = ports.to_vec();
    acls.rates = crate::limit::ProxyRates::of(p);
    for l in p.lines().filter(|l| l.kw() == "acl") {
        let args = l.args();
        let Some((name, body)) = args.split_first() else {
            cx.refuse(l, "acl needs a name");
            continue;
        };
        let acl = match &l.env_error {
            Some(e) => Err(e.clone()),
            None => acl::parse_acl(body, &cx.base),
        };
        match &acl {
            Ok(a) => {
                let notes: Vec<String> = a.note.iter().cloned().chain(a.port_note(ports)).collect();
                if notes.is_empty() {
                    cx.ok(l);
                }
                for n in notes {
                    cx.diff(l, n);
                }
            }
            Err(e) => cx.refuse(l, e.clone()),
        }
        acls.add(name, acl);
    }
    acls
}

/// Splits `words` at the first `if`/`unless`: the action's words and the condition's.
fn split_cond(words: &[String]) -> (&[String], &[String]) {
    match words.iter().position(|w| w == "if" || w == "unless") {
        Some(i) => (&words[..i], &words[i..]),
        None => (words, &[]),
    }
}

/// The request steps of proxy `p` (`monitor-uri`, `http-request`, then `redirect`), each
/// with its line; lines that cannot be translated are refused and left out.
pub fn request_steps<'l>(cx: &mut Ctx, p: &Proxy<'l>, acls: &Acls) -> Vec<(&'l Line, Step)> {
    let mut out = Vec::new();
    if p.is_frontend() {
        if let Some(l) = p.last("monitor-uri", None) {
            let m = Match {
                path: Some(PathPat::Exact(l.arg(0).unwrap_or("/").to_string())),
                ..Default::default()
            };
            let term = Term {
                m,
                ..Default::default()
            };
            let case = Case::all(haproxy_answer(200), &l.loc);
            out.push((l, Step::Stop(vec![term], vec![case])));
            cx.ok(l);
        }
    }
    let lines: Vec<&Line> = p.lines().filter(|l| l.kw() == "http-request").collect();
    let redirects: Vec<&Line> = p.lines().filter(|l| l.kw() == "redirect").collect();
    for l in lines.into_iter().chain(redirects) {
        if let Some(e) = &l.env_error {
            cx.refuse(l, e.clone());
            continue;
        }
        match step(cx, l, acls) {
            Ok(Some((steps, notes))) => {
                if notes.is_empty() {
                    cx.ok(l);
                }
                for n in notes {
                    cx.diff(l, n);
                }
                out.extend(steps.into_iter().map(|s| (l, s)));
            }
            Ok(None) => {}
            Err(e) => cx.refuse(l, e),
        }
    }
    out
}

type Built = Option<(Vec<Step>, Vec<String>)>;

fn step(cx: &mut Ctx, l: &Line, acls: &Acls) -> Result<Built, String> {
    let words: Vec<String> = l.words.iter().map(|w| w.text.clone()).collect();
    let redirect_kw = l.kw() == "redirect";
    let body = if redirect_kw { &words[..] } else { &words[1..] };
    let (action, cond) = split_cond(body);
    let Some(kind) = action.first() else {
        return Err("an action is missing".into());
    };
    let a: Vec<&str> = action[1..].iter().map(String::as_str).collect();
    let c = acl::condition(cond, acls, &cx.base)?;
    let dnf = c.dnf;
    let mut notes = c.notes;
    let plain = |dnf: &Dnf| -> Result<(), String> {
        if dnf.iter().any(|t| !t.guards.is_empty()) {
            return Err(
                "a client address or credential test: a veloxy route cannot be chosen by them"
                    .into(),
            );
        }
        if dnf.iter().any(|t| t.sni.is_some()) {
            return Err("an SNI test in an HTTP rule".into());
        }
        Ok(())
    };
    let steps = match kind.as_str() {
        "set-header" | "add-header" => {
            plain(&dnf)?;
            let name = field_name(a.first().ok_or("a header name is missing")?, &mut notes);
            let v = crate::logfmt::template(a.get(1).copied().unwrap_or(""))?;
            let op = if kind == "set-header" {
                HdrOp::Set(name.to_string(), v)
            } else {
                HdrOp::Add(name.to_string(), v)
            };
            vec![Step::Edit(dnf, Edit::Req(op))]
        }
        "del-header" => {
            plain(&dnf)?;
            if a.len() > 1 {
                return Err(
                    "del-header with a match method: veloxy removes a header by name".into(),
                );
            }
            let name = field_name(a.first().ok_or("a header name is missing")?, &mut notes);
            vec![Step::Edit(dnf, Edit::Req(HdrOp::Del(name)))]
        }
        "set-path" => {
            plain(&dnf)?;
            let fmt = a.first().ok_or("a path is missing")?;
            match regsub(fmt)? {
                Some((m, tpl)) => vec![Step::Edit(narrow(dnf, &m)?, Edit::Path(tpl))],
                None => vec![Step::Edit(dnf, Edit::Path(crate::logfmt::template(fmt)?))],
            }
        }
        "replace-path" => {
            plain(&dnf)?;
            let (re, fmt) = (
                a.first().ok_or("a regex is missing")?,
                a.get(1).ok_or("a replacement is missing")?,
            );
            acl::check_regex(re)?;
            let m = Match {
                path: Some(PathPat::Regex(re.to_string())),
                ..Default::default()
            };
            vec![Step::Edit(
                narrow(dnf, &m)?,
                Edit::Path(backrefs(&crate::logfmt::template(fmt)?)),
            )]
        }
        "redirect" => {
            plain(&dnf)?;
            let (to, status) = redirect(&a)?;
            notes.push("veloxy's redirects carry a short text body (HAProxy's are empty)".into());
            let case = Case::all(Target::Redirect { to, status }, &l.loc);
            vec![Step::Stop(dnf, vec![case])]
        }
        "deny" | "tarpit" if kind == "deny" => deny(cx, &a, dnf, l, acls, &mut notes)?,
        "cache-use" => {
            plain(&dnf)?;
            let name = a.first().ok_or("a cache name is missing")?;
            match cx.caches.get_mut(*name) {
                Some(c) => c.rules.push(l.loc.clone()),
                None => return Err(format!("cache {name} is not defined")),
            }
            vec![Step::Edit(dnf, Edit::Cache(name.to_string()))]
        }
        "auth" => {
            notes.push("veloxy's 401 has its own body, adds charset=\"UTF-8\" to WWW-Authenticate and carries the route's response headers (HAProxy's own answers skip http-response rules)".into());
            auth(cx, &a, dnf)?
        }
        "return" => {
            plain(&dnf)?;
            vec![Step::Stop(dnf, vec![Case::all(ret(&a)?, &l.loc)])]
        }
        "capture" | "set-log-level" | "set-var-fmt" | "set-var" | "unset-var" | "track-sc0"
        | "track-sc1" | "track-sc2" | "sc-inc-gpc0" | "sc-inc-gpc1" | "sc-set-gpt0"
        | "set-mark" | "set-tos" | "wait-for-handshake" | "disable-l7-retry" => {
            cx.ignore(l, "logging, variables and counters: only rules that use them change answers (those are reported)");
            return Ok(None);
        }
        other => return Err(format!("http-request {other}: no veloxy equivalent")),
    };
    Ok(Some((steps, notes)))
}

/// A header name as written, without the `:` some configs end it with (HAProxy takes the
/// colon as part of the name: `X-A:: v` on the wire, which backends read as `X-A` with the
/// value `: v`); the difference goes to `notes`.
fn field_name(name: &str, notes: &mut Vec<String>) -> String {
    match name.strip_suffix(':') {
        Some(n) if !n.is_empty() => {
            notes.push(format!("header name {name}: veloxy's field is {n} (HAProxy sends the colon as part of the name: the field arrives as {n} with a value starting ': ')"));
            n.to_string()
        }
        _ => name.to_string(),
    }
}

/// `redirect scheme|location|prefix X [code N] [drop-query] ...`: the Location and status.
fn redirect(a: &[&str]) -> Result<(String, u16), String> {
    let (kind, target) = (
        a.first().ok_or("redirect needs a type")?,
        a.get(1).ok_or("redirect needs a target")?,
    );
    let mut status = 302;
    let mut drop_query = false;
    let mut i = 2;
    while i < a.len() {
        match a[i] {
            "code" => {
                status = a
                    .get(i + 1)
                    .and_then(|c| c.parse().ok())
                    .ok_or("code needs a status")?;
                i += 1;
            }
            "drop-query" => drop_query = true,
            "append-slash" => return Err("append-slash has no veloxy equivalent".into()),
            "set-cookie" | "clear-cookie" => {
                return Err(format!("{}: a redirect in veloxy sets no cookie", a[i]))
            }
            other => return Err(format!("redirect option {other}")),
        }
        i += 1;
    }
    let uri = if drop_query { "{path}" } else { "{uri}" };
    let to = match *kind {
        "scheme" => format!("{}://{{authority}}{uri}", crate::logfmt::template(target)?),
        "location" => crate::logfmt::template(target)?,
        "prefix" if *target == "/" => uri.to_string(),
        "prefix" => format!(
            "{}{uri}",
            crate::logfmt::template(target.trim_end_matches('/'))?
        ),
        k => return Err(format!("redirect {k}")),
    };
    Ok((to, status))
}

fn deny(
    cx: &mut Ctx,
    a: &[&str],
    dnf: Dnf,
    l: &Line,
    acls: &Acls,
    notes: &mut Vec<String>,
) -> Result<Vec<Step>, String> {
    let mut status = 403;
    let mut i = 0;
    while i < a.len() {
        match a[i] {
            "deny_status" | "status" => {
                status = a
                    .get(i + 1)
                    .and_then(|c| c.parse().ok())
                    .ok_or("deny_status needs a status")?;
                i += 1;
            }
            other => return Err(format!("deny option {other}")),
        }
        i += 1;
    }
    let mut steps = Vec::new();
    for t in dnf {
        if t.sni.is_some() {
            return Err("an SNI test in an HTTP rule".into());
        }
        let mut route = t.clone();
        route.guards.clear();
        let edit = match t.guards.as_slice() {
            [] => {
                steps.push(Step::Stop(
                    vec![t],
                    vec![Case::all(haproxy_answer(status), &l.loc)],
                ));
                continue;
            }
            [(false, Lit::Rate(t))] => {
                let (limit, more) = crate::limit::resolve(cx, &acls.rates, t, l, status)?;
                for n in more {
                    if !notes.contains(&n) {
                        notes.push(n);
                    }
                }
                steps.push(Step::Edit(vec![route], Edit::Rate(limit)));
                continue;
            }
            [(true, Lit::Rate(_))] => {
                return Err("a negated request-rate test: veloxy's rate_limit refuses the clients above the rate".into())
            }
            [(false, Lit::Src(a))] => Edit::Deny(a.clone()),
            [(true, Lit::Src(a))] => Edit::Allow(a.clone()),
            _ => {
                return Err(
                    "a mix of address and other tests veloxy's allow/deny cannot express".into(),
                )
            }
        };
        let text = "veloxy's 403 for a refused address has its own short text body";
        if status != 403 {
            notes.push(format!(
                "veloxy refuses the address with 403 (HAProxy: {status})"
            ));
        } else if !notes.iter().any(|n| n == text) {
            notes.push(text.into());
        }
        steps.push(Step::Edit(vec![route], edit));
    }
    Ok(steps)
}

fn auth(cx: &mut Ctx, a: &[&str], dnf: Dnf) -> Result<Vec<Step>, String> {
    let realm = match a {
        ["realm", r, ..] => r.to_string(),
        _ => "Restricted".to_string(),
    };
    let mut steps = Vec::new();
    for t in dnf {
        let mut route = t.clone();
        route.guards.clear();
        match t.guards.as_slice() {
            [(true, Lit::Auth { list, groups })] => {
                let file = crate::global::auth_file(cx, list, groups)?;
                steps.push(Step::Edit(vec![route], Edit::Auth(realm.clone(), file)));
            }
            [] => {
                return Err(
                    "auth without an http_auth test: every request would be asked for credentials"
                        .into(),
                )
            }
            _ => return Err("auth with tests veloxy's basic_auth cannot express".into()),
        }
    }
    Ok(steps)
}

/// `return [status N] [content-type T] [string S]`.
fn ret(a: &[&str]) -> Result<Target, String> {
    let mut status = 200;
    let mut ctype = String::new();
    let mut body = String::new();
    let mut i = 0;
    while i < a.len() {
        let v = a.get(i + 1).copied().unwrap_or("");
        match a[i] {
            "status" => status = v.parse().map_err(|_| "status needs a number")?,
            "content-type" => ctype = v.to_string(),
            "string" => body = v.to_string(),
            "lf-string" if !v.contains('%') => body = v.to_string(),
            "hdr" => {
                return Err(
                    "return with hdr: veloxy's fixed answers take a content type only".into(),
                )
            }
            other => {
                return Err(format!(
                "return {other}: veloxy's fixed answers take a status, a content type and a string"
            ))
            }
        }
        i += 2;
    }
    if ctype.is_empty() && body.is_empty() {
        if let Some(b) = haproxy_body(status) {
            return Ok(Target::Respond {
                status,
                body: b.into(),
                ctype: "text/html".into(),
            });
        }
    }
    Ok(Target::Respond {
        status,
        body,
        ctype,
    })
}

/// `%[path,regsub(^PREFIX,REPL)]`: the path condition it applies to and the template.
fn regsub(fmt: &str) -> Result<Option<(Match, String)>, String> {
    let Some(inner) = fmt
        .strip_prefix("%[path,regsub(")
        .and_then(|s| s.strip_suffix(")]"))
    else {
        return Ok(None);
    };
    let (re, repl) = inner
        .split_once(',')
        .ok_or("regsub needs a regex and a replacement")?;
    let repl = repl.split(',').next().unwrap_or("");
    if !re.starts_with('^') {
        return Err(
            "regsub on the path without '^': veloxy's rewrite replaces a matched prefix only"
                .into(),
        );
    }
    acl::check_regex(re)?;
    let groups = regex_syntax::Parser::new()
        .parse(re)
        .map(|h| h.properties().explicit_captures_len())
        .map_err(|e| e.to_string())?;
    let m = Match {
        path: Some(PathPat::Regex(format!("{re}(.*)"))),
        ..Default::default()
    };
    let tpl = format!(
        "{}{{re.{}}}",
        backrefs(&crate::logfmt::template(repl)?),
        groups + 1
    );
    Ok(Some((m, tpl)))
}

/// `\1` in a replacement as `{re.1}`.
fn backrefs(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push_str(&format!("{{re.{}}}", chars.next().unwrap_or('0')));
        } else {
            out.push(c);
        }
    }
    out
}

/// Each term of `dnf` narrowed to `m` too (a rewrite that needs its regex route).
fn narrow(dnf: Dnf, m: &Match) -> Result<Dnf, String> {
    let mut out = Vec::new();
    for mut t in dnf {
        match t.m.meet(m) {
            crate::matcher::Meet::Empty => {}
            crate::matcher::Meet::Both(x) => {
                t.m = x;
                out.push(t);
            }
            crate::matcher::Meet::Unknown => {
                return Err(format!(
                    "the rule's path test and its regex {:?} cannot be one route",
                    m.path
                        .as_ref()
                        .map(|p| format!("{p:?}"))
                        .unwrap_or_default()
                ))
            }
        }
    }
    Ok(out)
}

/// Whether a regex route is implied by a prefix (for reporting).
pub fn regex_under(r: &str, prefix: &str) -> bool {
    literal_prefix(r).is_some_and(|l| l.starts_with(prefix))
}

/// The response header operations of proxy `p`: (TLS-only / plain-only / both, op).
/// `after`: the `http-after-response` lines instead (they apply to HAProxy's own answers too).
pub fn response_ops(
    cx: &mut Ctx,
    p: &Proxy,
    acls: &Acls,
    after: bool,
) -> Vec<(Option<bool>, HdrOp)> {
    let mut out = Vec::new();
    let kw = if after {
        "http-after-response"
    } else {
        "http-response"
    };
    for l in p
        .lines()
        .filter(|l| l.kw() == kw || (!after && l.kw() == "rspadd"))
    {
        if crate::cache::is_store(l) {
            continue;
        }
        if l.kw() == "rspadd" {
            cx.refuse(l, format!("{}: not translated", l.kw()));
            continue;
        }
        let words: Vec<String> = l.words[1..].iter().map(|w| w.text.clone()).collect();
        let (action, cond) = split_cond(&words);
        let mut notes = Vec::new();
        let r = (|| -> Result<Option<(Option<bool>, HdrOp)>, String> {
            let c = acl::condition(cond, acls, &cx.base)?;
            let tls = match c.dnf.as_slice() {
                [t] if t.negs.is_empty() && t.guards.is_empty() && t.sni.is_none() && Match { tls: None, ..t.m.clone() } == Match::default() => t.m.tls,
                _ => return Err("a condition on the response or the request: veloxy's response_headers apply to every answer of a route".into()),
            };
            let a: Vec<&str> = action.iter().map(String::as_str).collect();
            let op = match a.as_slice() {
                ["set-header", n, v] => {
                    HdrOp::Set(field_name(n, &mut notes), crate::logfmt::template(v)?)
                }
                ["add-header", n, v] => {
                    HdrOp::Add(field_name(n, &mut notes), crate::logfmt::template(v)?)
                }
                ["del-header", n] => HdrOp::Del(field_name(n, &mut notes)),
                ["capture", ..] | ["set-log-level", ..] | ["set-var", ..] => return Ok(None),
                [k, ..] => return Err(format!("{kw} {k}: no veloxy equivalent")),
                [] => return Err("an action is missing".into()),
            };
            if !after && !matches!(op, HdrOp::Del(_)) {
                notes.push("veloxy also sets it on its own error answers (502, 504) of the route; HAProxy's own answers skip http-response rules".into());
            }
            Ok(Some((tls, op)))
        })();
        match r {
            Ok(Some(x)) => {
                if notes.is_empty() {
                    cx.ok(l);
                }
                for n in notes {
                    cx.diff(l, n);
                }
                out.push(x);
            }
            Ok(None) => cx.ignore(l, "logging and variables"),
            Err(e) => cx.refuse(l, e),
        }
    }
    out
}

#[cfg(test)]
mod field_tests {
    use super::field_name;

    #[test]
    fn a_trailing_colon_is_not_part_of_the_name() {
        let mut notes = Vec::new();
        assert_eq!(
            field_name("X-Forwarded-Proto:", &mut notes),
            "X-Forwarded-Proto"
        );
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("colon"));
        let mut none = Vec::new();
        assert_eq!(field_name("X-Real-IP", &mut none), "X-Real-IP");
        assert!(none.is_empty());
    }
}
