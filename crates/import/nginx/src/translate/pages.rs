//! `error_page` (files under root, status changes, the auth_request redirect idiom) and the
//! `charset` family.

use super::level::Own;
use super::{Level, Tr};
use crate::parse::Directive;
use crate::vars;

/// `error_page CODE... [=[NEWCODE]] URI`.
pub fn error_page(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let uri = d.args.last().map_or("", |a| a.text.as_str()).to_string();
    let mut codes: Vec<&str> = Vec::new();
    let mut change: Option<&str> = None;
    for a in &d.args[..d.args.len().saturating_sub(1)] {
        match a.text.strip_prefix('=') {
            Some(c) => change = Some(c),
            None => codes.push(a.text.as_str()),
        }
    }
    let auth_codes = codes.iter().all(|c| *c == "401" || *c == "403");
    let file = uri.starts_with('/') && !vars::has_vars(&uri);
    if auth_codes && super::auth::active(lvl).is_some() {
        let target = match super::auth::auth_field(lvl, &uri) {
            Some(Some(f)) if f.eq_ignore_ascii_case("location") => {
                "the auth answer's Location".to_string()
            }
            _ => uri.clone(),
        };
        tr.rep.different(
            &d.loc,
            "error_page",
            format!(
                "the auth service's refusal reaches the client as it is (a 401 stays a 401, with \
                 the auth service's Location and body), where nginx answers {} {target}: point \
                 forward_auth at an endpoint that answers the redirect itself (Authelia's \
                 /api/authz/forward-auth or /api/verify?rd=URL)",
                change.map_or("with".to_string(), |c| if c.is_empty() {
                    "with".into()
                } else {
                    format!("{c} to")
                }),
            ),
        );
        return;
    }
    if !file {
        tr.rep.refused(
            &d.loc,
            "error_page",
            "a redirect or named location as an error page: veloxy sends files",
        );
        return;
    }
    let own = Level::start(&mut lvl.own, Own::ERROR_PAGES, &mut lvl.error_pages);
    for c in &codes {
        own.push((c.to_string(), uri.clone(), d.loc.clone()));
    }
    match change {
        None => tr.rep.translated(&d.loc, "error_page"),
        Some(c) => tr.rep.different(
            &d.loc,
            "error_page",
            format!(
                "veloxy sends the page with the original status ({}); nginx answers {}",
                codes.join(", "),
                if c.is_empty() {
                    "with the status of the page's own answer (200 for a file)".to_string()
                } else {
                    c.to_string()
                }
            ),
        ),
    }
}

/// `charset`, `charset_types`, `source_charset`, `override_charset`: nginx names a charset
/// in Content-Type; veloxy names utf-8 on the text types of its own table for files, and
/// leaves proxied answers as they come.
pub fn charset(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let loc = &d.loc;
    let name = d.name.as_str();
    let arg = d.arg(0).to_ascii_lowercase();
    match name {
        "charset" if arg == "off" => {
            lvl.charset = None;
            tr.rep.different(loc, name, "veloxy still names charset=utf-8 on text files (text/html, text/css, text/plain, JavaScript...)");
        }
        "charset" if arg == "utf-8" || arg == "utf8" => {
            lvl.charset = Some(arg);
            tr.rep.different(loc, name, "veloxy names charset=utf-8 on the text types of its own table for files (text/css and more besides nginx's charset_types) and leaves a proxied answer's Content-Type as the upstream sent it (nginx adds the charset to proxied text/html too)");
        }
        "charset" => tr.rep.refused(
            loc,
            name,
            format!("veloxy names utf-8 only, not {}", d.arg(0)),
        ),
        "charset_types" => tr.rep.different(
            loc,
            name,
            "veloxy names charset=utf-8 on its own list of text types for files, not this list",
        ),
        "source_charset" | "override_charset"
            if lvl
                .charset
                .as_deref()
                .is_none_or(|c| c == arg || arg == "off") =>
        {
            tr.rep.ignored(
                loc,
                name,
                "no recoding: the source and answer charsets are the same",
            )
        }
        _ => tr
            .rep
            .refused(loc, name, "veloxy does not recode answers between charsets"),
    }
}
