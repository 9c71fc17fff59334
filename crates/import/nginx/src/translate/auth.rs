//! `auth_request` (the Authelia / oauth2-proxy / vouch idiom) as veloxy's `forward_auth`.
//!
//! nginx sends a GET subrequest to a location (usually `internal`) that proxies to the auth
//! service; a 2xx lets the request pass, 401 and 403 are answered with nginx's own page (only
//! `WWW-Authenticate` kept), anything else is a 500. `auth_request_set $v
//! $upstream_http_NAME` + `proxy_set_header NAME $v` copies a field of the auth answer onto
//! the upstream request: veloxy's `copy_headers` when the names are the same.
//!
//! The protected routes get a placeholder `forward_auth` while the server's locations are
//! translated ([`placeholder`]); the auth locations are recorded as they pass ([`record`]);
//! [`resolve`] then writes the real key and reports the `auth_request` line.

use toml::Value;
use veloxy_import::{Loc, Outcome, Section};

use super::level::{Own, ReqHeader};
use super::location::{Draft, Match};
use super::{Level, Tr};
use crate::parse::Directive;

/// What veloxy's auth request carries, for the report.
const SENDS: &str = "X-Forwarded-Method, -Proto, -Host, -Uri and -For and, of the client's \
                     fields, only Cookie and Authorization";

/// A location that answers an `auth_request` URI.
#[derive(Debug, Clone)]
pub struct Target {
    /// How it matches.
    m: Match,
    /// Its route's section after `proxy_pass` (group, rewrite, Host), `None`: not proxied.
    sec: Option<Section>,
    /// Its `proxy_set_header` list.
    headers: Vec<ReqHeader>,
    /// Its read timeout.
    timeout: String,
    /// `internal`: its header lines are reported as the auth request's.
    internal: bool,
}

/// One `auth_request URI` as used by a route.
#[derive(Debug, Clone)]
pub struct Use {
    uri: String,
    loc: Loc,
}

/// Sets the level's `auth_request` and `auth_request_set` before its other directives are
/// read (nginx evaluates them per request, so their order does not matter) and reports the
/// `auth_request_set` lines by what uses their variable in `list`.
pub fn prescan(tr: &mut Tr<'_>, list: &[&Directive], lvl: &mut Level) {
    for d in list {
        match d.name.as_str() {
            "auth_request" if d.arg(0) == "off" => {
                lvl.auth_request = Some(None);
                tr.rep.translated(&d.loc, "auth_request");
            }
            "auth_request" => {
                lvl.auth_request = Some(Some((d.arg(0).to_string(), d.loc.clone())));
                tr.auth_pending.push(d.loc.clone());
            }
            "auth_request_set" => {
                let var = d.arg(0).trim_start_matches('$').to_string();
                let field = d
                    .arg(1)
                    .strip_prefix("$upstream_http_")
                    .filter(|f| !crate::vars::has_vars(&format!("${f}")[1..]))
                    .map(|f| f.replace('_', "-"));
                Level::start(&mut lvl.own, Own::AUTH_VARS, &mut lvl.auth_vars)
                    .push((var.clone(), field.clone()));
                report_set(tr, d, &var, field.as_deref(), list);
            }
            _ => {}
        }
    }
}

/// Reports one `auth_request_set` by the directives of its block that use its variable.
fn report_set(tr: &mut Tr<'_>, d: &Directive, var: &str, field: Option<&str>, list: &[&Directive]) {
    let Some(field) = field else {
        tr.rep.refused(
            &d.loc,
            "auth_request_set",
            format!(
                "{}: only a field of the auth answer ($upstream_http_NAME) reaches the request \
                 (forward_auth copy_headers)",
                d.arg(1)
            ),
        );
        return;
    };
    let uses: Vec<&&Directive> = list
        .iter()
        .filter(|c| !std::ptr::eq(**c, d) && c.args.iter().any(|a| uses_var(&a.text, var)))
        .collect();
    let Some(u) = uses.first() else {
        tr.rep.ignored(
            &d.loc,
            "auth_request_set",
            format!("${var} is used nowhere in its block"),
        );
        return;
    };
    match u.name.as_str() {
        "proxy_set_header" | "grpc_set_header" if u.arg(0).eq_ignore_ascii_case(field) => {
            tr.rep.translated(&d.loc, "auth_request_set")
        }
        "proxy_set_header" | "grpc_set_header" => tr.rep.refused(
            &d.loc,
            "auth_request_set",
            rename_why(field, u.arg(0)),
        ),
        "error_page" => tr.rep.translated(&d.loc, "auth_request_set"),
        "add_header" => tr.rep.refused(
            &d.loc,
            "auth_request_set",
            ADD_WHY,
        ),
        other => tr.rep.refused(
            &d.loc,
            "auth_request_set",
            format!("${var} is used by {other}: veloxy copies auth answer fields onto the upstream request only"),
        ),
    }
}

/// Why an auth answer's field cannot reach the backend under another name.
pub fn rename_why(field: &str, name: &str) -> String {
    format!(
        "the auth answer's {field} would reach the backend as {name}: veloxy copies auth answer \
         fields under their own names (forward_auth copy_headers)"
    )
}

/// Why an auth answer's field cannot be added to the client's answer.
pub const ADD_WHY: &str = "a field of the auth service's 2xx answer added to the client's \
                           answer: veloxy passes the auth service's fields to the client only \
                           when it refuses";

/// Whether `value` is exactly `$var` (or `${var}`).
fn uses_var(value: &str, var: &str) -> bool {
    value == format!("${var}") || value == format!("${{{var}}}")
}

/// The auth answer's field held by `value` (`$v` of an `auth_request_set` of the level).
pub fn auth_field(lvl: &Level, value: &str) -> Option<Option<String>> {
    let list = lvl.auth_vars.as_deref()?;
    list.iter()
        .find(|(v, _)| uses_var(value, v))
        .map(|(_, f)| f.clone())
}

/// The level's `auth_request` URI and line, when one is in effect.
pub fn active(lvl: &Level) -> Option<&(String, Loc)> {
    lvl.auth_request.as_ref().and_then(|a| a.as_ref())
}

/// The route's placeholder `forward_auth` (resolved by [`resolve`] once the server's
/// locations are known); on a route that is not proxied, the refusal and a deny-all.
pub fn placeholder(tr: &mut Tr<'_>, lvl: &Level, proxied: bool, sec: &mut Section) {
    let Some((uri, loc)) = active(lvl).cloned() else {
        return;
    };
    if sec.get("redirect").is_some() || sec.get("respond").is_some() {
        // nginx's return answers in the rewrite phase, before access checks.
        return;
    }
    if !proxied {
        deny_all(sec);
        refuse_once(
            tr,
            &loc,
            "a route serving files: veloxy's forward_auth protects proxied routes only (the \
             route denies every client instead)",
        );
        return;
    }
    let copy: Vec<Value> = lvl
        .proxy_headers
        .as_deref()
        .into_iter()
        .flatten()
        .filter_map(|h| match h {
            ReqHeader::Auth(n) => Some(Value::from(n.as_str())),
            _ => None,
        })
        .collect();
    let mut t = toml::Table::new();
    t.insert("use".into(), Value::from(tr.auth_uses.len() as i64));
    if !copy.is_empty() {
        t.insert("copy_headers".into(), Value::Array(copy));
    }
    tr.auth_uses.push(Use { uri, loc });
    sec.set("forward_auth", Value::Table(t));
}

fn deny_all(sec: &mut Section) {
    sec.remove("forward_auth");
    sec.remove("allow");
    sec.set(
        "deny",
        Value::Array(vec![Value::from("0.0.0.0/0"), Value::from("::/0")]),
    );
}

fn refuse_once(tr: &mut Tr<'_>, loc: &Loc, why: &str) {
    tr.rep.entries.retain(|e| e.loc != *loc);
    tr.rep.refused(loc, "auth_request", why);
}

/// Records a location of the server that answers an `auth_request` URI.
pub fn record(tr: &mut Tr<'_>, m: &Match, sec: Option<&Section>, lvl: &Level, internal: bool) {
    tr.auth_targets.push(Target {
        m: m.clone(),
        sec: sec.cloned(),
        headers: lvl.proxy_headers.as_deref().cloned().unwrap_or_default(),
        timeout: lvl.timeouts[1].clone().unwrap_or_else(|| "1m".into()),
        internal,
    });
}

/// Whether a location matching `m` answers one of the server's `auth_request` URIs.
pub fn answers(m: &Match, uris: &[String]) -> bool {
    uris.iter().any(|u| match m {
        Match::Exact(p) => p == u,
        Match::Prefix(p) => u.starts_with(p.as_str()),
        Match::Regex(_) => false,
    })
}

/// The `auth_request` URIs a server uses (its own, its locations', the inherited one).
pub fn server_uris(d: &Directive, lvl: &Level) -> Vec<String> {
    fn walk(list: &[Directive], out: &mut Vec<String>) {
        for c in list {
            if c.name == "auth_request" && c.arg(0) != "off" {
                out.push(c.arg(0).to_string());
            }
            walk(c.children(), out);
        }
    }
    let mut out: Vec<String> = active(lvl).map(|(u, _)| u.clone()).into_iter().collect();
    walk(d.children(), &mut out);
    out
}

/// The target answering `uri`: nginx's exact match, else the longest prefix.
fn find<'t>(targets: &'t [Target], uri: &str) -> Option<&'t Target> {
    targets
        .iter()
        .find(|t| matches!(&t.m, Match::Exact(p) if p == uri))
        .or_else(|| {
            targets
                .iter()
                .filter_map(|t| match &t.m {
                    Match::Prefix(p) if uri.starts_with(p.as_str()) => Some((p.len(), t)),
                    _ => None,
                })
                .max_by_key(|(n, _)| *n)
                .map(|(_, t)| t)
        })
}

/// The path nginx's subrequest to `uri` reaches upstream through the target's proxy_pass.
fn upstream_path(t: &Target, sec: &Section, uri: &str) -> Result<String, String> {
    let unescape = |s: &str| s.replace("{{", "{").replace("}}", "}");
    let literal = |s: &str| !s.replace("{{", "").replace("}}", "").contains('{');
    let rewrite = sec.get("rewrite").and_then(|v| v.as_str());
    let strip = sec.get("strip_prefix").and_then(|v| v.as_bool()) == Some(true);
    let path = match (&t.m, rewrite, strip) {
        (_, None, false) => uri.to_string(),
        (Match::Prefix(p), None, true) => format!("/{}", &uri[p.len()..]),
        (Match::Exact(_), Some(r), _) if literal(r) => unescape(r),
        (Match::Prefix(p), Some(r), _) if r.ends_with("{re.1}") && literal(&r[..r.len() - 6]) => {
            format!("{}{}", unescape(&r[..r.len() - 6]), &uri[p.len()..])
        }
        _ => return Err("the auth location's proxy_pass path is made per request".into()),
    };
    Ok(path.strip_suffix('?').unwrap_or(&path).to_string())
}

/// After the server's locations: each placeholder becomes a real `forward_auth` (or, when
/// the auth location cannot be translated, a deny-all with the `auth_request` refused).
pub fn resolve(tr: &mut Tr<'_>, drafts: &mut [Draft]) {
    let targets = std::mem::take(&mut tr.auth_targets);
    for dr in drafts.iter_mut() {
        let Some(Value::Table(ph)) = dr.sec.get("forward_auth").cloned() else {
            continue;
        };
        let Some(i) = ph.get("use").and_then(|v| v.as_integer()) else {
            continue;
        };
        let u = tr.auth_uses[i as usize].clone();
        match forward_auth(tr, &targets, &u) {
            Ok((mut fa, diffs)) => {
                if let Some(c) = ph.get("copy_headers") {
                    fa.insert("copy_headers".into(), c.clone());
                }
                dr.sec.set("forward_auth", Value::Table(fa));
                if !tr.rep.entries.iter().any(|e| e.loc == u.loc) {
                    tr.rep.different(&u.loc, "auth_request", diffs.join("; "));
                }
            }
            Err(why) => {
                deny_all(&mut dr.sec);
                refuse_once(
                    tr,
                    &u.loc,
                    &format!("{why} (the routes it protects deny every client instead)"),
                );
            }
        }
    }
}

/// The `forward_auth` table for one use, and the differences to report.
fn forward_auth(
    tr: &mut Tr<'_>,
    targets: &[Target],
    u: &Use,
) -> Result<(toml::Table, Vec<String>), String> {
    let t = find(targets, &u.uri).ok_or_else(|| {
        format!(
            "no location of the server answers {} with proxy_pass",
            u.uri
        )
    })?;
    let sec = t
        .sec
        .as_ref()
        .ok_or_else(|| format!("the location answering {} does not proxy", u.uri))?;
    let group = sec
        .get("upstream")
        .and_then(|v| v.as_str())
        .ok_or("the auth location has no upstream")?
        .to_string();
    let path = upstream_path(t, sec, &u.uri)?;
    let mut fa = toml::Table::new();
    fa.insert("upstream".into(), group.as_str().into());
    fa.insert("path".into(), path.as_str().into());
    fa.insert("timeout".into(), t.timeout.as_str().into());
    let mut diffs = vec![format!(
        "veloxy sends GET {path} to the auth service with {SENDS} (nginx's subrequest carries \
         every field of the client's request and the auth location's proxy_set_header fields)"
    )];
    // Host: nginx's (the auth location's Host, or proxy_pass's host) against veloxy's (the
    // group's first server).
    let nginx_host = sec
        .get("request_headers")
        .and_then(|r| r.get("set"))
        .and_then(|s| s.get("Host"))
        .and_then(|h| h.as_str())
        .map(str::to_string);
    let veloxy_host = tr
        .cfg
        .upstreams
        .iter()
        .find(|(n, _)| *n == group)
        .and_then(|(_, s)| s.get("servers"))
        .and_then(|v| v.as_array())
        .and_then(|a| a.first())
        .and_then(|v| {
            v.as_str()
                .or_else(|| v.get("addr").and_then(|a| a.as_str()))
        })
        .map(|s| s.trim_start_matches("https://").to_string());
    match (nginx_host, veloxy_host) {
        (Some(n), Some(v)) if n != v => diffs.push(format!("Host: {v} (nginx: {n})")),
        _ => {}
    }
    diffs.push(
        "an answer other than 2xx goes to the client as the auth service sent it (status, \
         Location, Set-Cookie, WWW-Authenticate, body); nginx answers 401 and 403 with its own \
         page keeping only WWW-Authenticate, and 500 for any other status"
            .into(),
    );
    diffs.push(format!(
        "one timeout of {} for the whole auth exchange (nginx: the auth location's connect and \
         read timeouts, 60s each by default)",
        t.timeout
    ));
    if path.contains("/api/authz/auth-request") {
        diffs.push(
            "Authelia's /api/authz/auth-request reads X-Original-Method and X-Original-URL, \
             which veloxy does not send: point path at /api/authz/forward-auth, which reads \
             X-Forwarded-*"
                .into(),
        );
    }
    for h in &t.headers {
        match header_outcome(h) {
            Outcome::Different(w) if !t.internal => diffs.push(w),
            Outcome::Refused(w) if !t.internal => return Err(w),
            _ => {}
        }
    }
    Ok((fa, diffs))
}

/// What becomes of one `proxy_set_header` of an auth location in veloxy's auth request.
pub fn header_outcome(h: &ReqHeader) -> Outcome {
    let name = h.name().to_string();
    let lower = name.to_ascii_lowercase();
    let value = match h {
        ReqHeader::Set(_, v) => v.as_str(),
        ReqHeader::Remove(_) => return Outcome::Translated,
        ReqHeader::Default(_) => "",
        ReqHeader::Auth(_) => "?",
    };
    let same =
        |what: &str| Outcome::Different(format!("{name} is sent to the auth service as {what}"));
    match (lower.as_str(), value) {
        ("content-length" | "connection" | "upgrade", _) => Outcome::Translated,
        ("x-forwarded-for", "" | "{client_ip}") => Outcome::Translated,
        ("x-forwarded-proto", "" | "{scheme}") => Outcome::Translated,
        ("x-forwarded-host", "{authority}") => Outcome::Translated,
        ("x-forwarded-host", "{host}") => Outcome::Different(
            "X-Forwarded-Host carries the Host as the client sent it (with its port), not $host"
                .into(),
        ),
        ("x-forwarded-uri", "{uri}") => Outcome::Translated,
        ("x-forwarded-method", "{method}") => Outcome::Translated,
        ("cookie", "{header.cookie}") | ("authorization", "{header.authorization}") => {
            Outcome::Translated
        }
        ("x-original-uri" | "x-auth-request-redirect" | "x-original-request-uri", "{uri}") => {
            same("X-Forwarded-Uri (the same value)")
        }
        ("x-original-url", v) if v.starts_with("{scheme}://") && v.ends_with("{uri}") => {
            same("X-Forwarded-Proto, X-Forwarded-Host and X-Forwarded-Uri")
        }
        ("x-original-method", "{method}") => same("X-Forwarded-Method (the same value)"),
        ("x-real-ip", "{client_ip}") => same("X-Forwarded-For (the client address)"),
        ("proxy-authorization", "{header.authorization}") => {
            same("Authorization (the client's own field)")
        }
        ("host", _) => {
            Outcome::Different("Host: veloxy's auth request names the auth server's address".into())
        }
        _ => Outcome::Refused(format!(
            "{name} on the auth request: veloxy's forward_auth sends {SENDS}"
        )),
    }
}

/// An internal auth location's `proxy_set_header` lines, reported as the auth request's
/// (and its `proxy_redirect`, which changes an answer no client receives).
pub fn report_headers(tr: &mut Tr<'_>, list: &[&Directive], lvl: &Level) {
    let headers = lvl.proxy_headers.as_deref().cloned().unwrap_or_default();
    for d in list.iter().filter(|d| d.name == "proxy_redirect") {
        tr.rep.entries.retain(|e| e.loc != d.loc);
        tr.rep.ignored(
            &d.loc,
            "proxy_redirect",
            "in an internal auth location: the auth answer reaches no client through it \
             (auth_request_set reads the upstream's own fields)",
        );
    }
    for d in list.iter().filter(|d| d.name == "proxy_set_header") {
        let Some(h) = headers
            .iter()
            .find(|h| h.name().eq_ignore_ascii_case(d.arg(0)))
        else {
            continue;
        };
        let Some(e) = tr.rep.entries.iter_mut().rev().find(|e| e.loc == d.loc) else {
            continue;
        };
        if matches!(e.outcome, Outcome::Refused(_)) {
            continue;
        }
        e.outcome = header_outcome(h);
    }
}
