//! Applying a route's rules at admission: the real client address, the body cap, the header
//! edits of the upstream request and of the answers (rendered once, here), and CORS.

use std::sync::Arc;

use super::{answer, edit, Answer, Head, Peer, Record};
use crate::error::{ErrorKind, ProxyError};

/// The client's address from `client_ip_header` when the peer is a trusted proxy.
pub(super) fn real_client(
    settings: &crate::config::Settings,
    peer: &Peer,
    head: &Head,
) -> Option<(std::net::IpAddr, String)> {
    let real = settings.real_ip.as_ref()?;
    let values: Vec<&[u8]> = head
        .fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(&real.header))
        .map(|(_, v)| v)
        .collect();
    let ip = real.client(peer.addr.ip(), values.into_iter())?;
    Some((ip, ip.to_string()))
}

/// `cors`: a preflight's answer, or the response fields added for an allowed origin.
fn apply_cors(
    cors: &crate::cors::Cors,
    head: &Head,
    record: &mut Record,
    route: &crate::router::Route,
    id_field: Option<&str>,
    vars: &answer::RequestVars,
) -> Option<Answer> {
    let origin = head
        .fields
        .get("origin")
        .and_then(|o| std::str::from_utf8(o).ok());
    if let Some(origin) = origin {
        let preflight =
            head.method == "OPTIONS" && head.fields.get("access-control-request-method").is_some();
        if preflight {
            return Some(Answer::preflight(cors.preflight(origin)));
        }
    } else if !cors.varies() {
        return None;
    }
    let edit = record
        .edit
        .get_or_insert_with(|| response_edit(route, id_field, vars));
    cors.response_lines(origin, edit.lines_mut());
    None
}

/// The body length a request declares (Content-Length), if any.
fn declared_length(head: &Head) -> Option<u64> {
    head.fields
        .get("content-length")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The lines one side's rules render for this request (none when all their values are fixed:
/// those are added by reference), then the request ID's.
fn rendered(
    rules: Option<&crate::rules::HeaderRules>,
    id_field: Option<&str>,
    vars: &answer::RequestVars,
) -> Vec<u8> {
    let mut lines = Vec::new();
    if let Some(r) = rules.filter(|r| r.fixed().is_none()) {
        lines = edit::line_buffer();
        r.render(vars, &mut lines);
    }
    push_id(&mut lines, id_field, vars.request_id);
    lines
}

/// Renders the route's `request_headers` and the request ID for the upstream request.
pub(super) fn upstream_edit(
    route: &crate::router::Route,
    id_field: Option<&str>,
    vars: &answer::RequestVars,
) -> edit::UpstreamEdit {
    let rules = route.rules.clone();
    let lines = rendered(
        rules.as_ref().and_then(|r| r.request.as_ref()),
        id_field,
        vars,
    );
    edit::UpstreamEdit::new(rules, id_field.map(Into::into), lines)
}

/// Renders the route's `response_headers` and the request ID for every answer.
pub(super) fn response_edit(
    route: &crate::router::Route,
    id_field: Option<&str>,
    vars: &answer::RequestVars,
) -> edit::ResponseEdit {
    use crate::template::Vars;
    let rules = route.rules.clone();
    let lines = rendered(
        rules.as_ref().and_then(|r| r.response.as_ref()),
        id_field,
        vars,
    );
    let location = rules.as_ref().filter(|r| r.location_rewrite).map(|r| {
        let mut base = String::new();
        vars.value(&crate::template::Var::Scheme, &mut base);
        base.push_str("://");
        base.push_str(&String::from_utf8_lossy(vars.head.host));
        let sent_host = r.request.as_ref().and_then(|req| {
            let mut l = Vec::new();
            req.render(vars, &mut l);
            let host = edit::lines(&l)
                .find(|(n, _)| n.eq_ignore_ascii_case(b"host"))
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
            host
        });
        Box::new((base, sent_host))
    });
    edit::ResponseEdit::new(rules, id_field.map(Into::into), lines, location)
}

pub(super) fn push_id(lines: &mut Vec<u8>, field: Option<&str>, id: &str) {
    if let Some(f) = field {
        if lines.capacity() == 0 {
            *lines = edit::line_buffer();
        }
        lines.extend_from_slice(f.as_bytes());
        lines.extend_from_slice(b": ");
        lines.extend_from_slice(id.as_bytes());
        lines.extend_from_slice(b"\r\n");
    }
}

/// The rules that may answer before anything is forwarded, in order: the answer edit (so
/// every answer from here on carries the route's response rules), CORS (a preflight's
/// answer), `basic_auth` (401, or 429 for too many failed checks) and the declared body
/// length against `max_body_bytes` (413). `Ok(None)`: the request goes on.
pub(super) fn gate(
    route: &crate::router::Route,
    head: &Head,
    record: &mut Record,
    id_field: Option<&str>,
    alt_svc: Option<u16>,
    vars: &answer::RequestVars,
) -> Result<Option<Answer>, ProxyError> {
    let rules = route.rules.as_ref();
    // Only what acts on answers needs an edit: a route with request rules alone has none.
    let on_answers = |r: &Arc<crate::rules::RouteRules>| {
        r.response.is_some() || !r.error_pages.is_empty() || r.location_rewrite
    };
    if rules.is_some_and(on_answers) || id_field.is_some() || alt_svc.is_some() {
        let mut edit = response_edit(route, id_field, vars);
        if let Some(port) = alt_svc {
            let lines = edit.lines_mut();
            if lines.capacity() == 0 {
                *lines = edit::line_buffer();
            }
            let _ = std::io::Write::write_fmt(
                lines,
                format_args!("Alt-Svc: h3=\":{port}\"; ma=86400\r\n"),
            );
        }
        record.edit = Some(edit);
    }
    if let Some(cors) = rules.and_then(|r| r.cors.as_ref()) {
        if let Some(answer) = apply_cors(cors, head, record, route, id_field, vars) {
            return Ok(Some(answer));
        }
    }
    if let Some(auth) = rules.and_then(|r| r.basic_auth.as_ref()) {
        use crate::auth::{Checked, Refusal};
        match auth.check(head.fields.get("authorization"), vars.client_ip) {
            Checked::Pass => {}
            Checked::Refused(Refusal::Challenge) => {
                return Ok(Some(Answer::unauthorized(&auth.realm)))
            }
            Checked::Refused(Refusal::TooMany) => {
                return Err(ProxyError::downstream(ErrorKind::RateLimited))
            }
            // Checked off the worker before anything is answered (see `super::verified`).
            Checked::Verify(v) => record.verify = Some(v),
        }
    }
    if let Some(max) = rules.and_then(|r| r.max_body) {
        if declared_length(head).is_some_and(|n| n > max) {
            return Err(ProxyError::downstream(ErrorKind::BodyTooLarge));
        }
    }
    Ok(None)
}
