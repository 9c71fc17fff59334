//! `proxy_pass` / `grpc_pass`: the upstream group, the upstream path and the request
//! headers nginx sends.

use toml::Value;
use veloxy_import::Section;

use super::{ctx, Kind, Match};
use crate::parse::Directive;
use crate::translate::level::ReqHeader;
use crate::translate::server::ServerCtx;
use crate::translate::upstream::Target;
use crate::translate::{Level, Tr};
use crate::vars;

/// `proxy_pass` / `grpc_pass`: the group and the upstream path; false when refused.
pub(super) fn proxy(
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
        // The host ends at the first `/`, or at a variable of the request's URI
        // (`http://app$request_uri`); any other variable there names the host itself.
        let end = rest.find('/').unwrap_or(rest.len());
        let uri_var = ["$request_uri", "$uri", "$is_args", "$args", "$query_string"]
            .iter()
            .filter_map(|v| rest[..end].find(v))
            .min();
        match uri_var.unwrap_or(end) {
            i if i < rest.len() => (rest[..i].to_string(), Some(rest[i..].to_string())),
            _ => (rest.clone(), None),
        }
    };
    if host.is_empty() || vars::has_vars(&host) {
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
            ReqHeader::Default(_) | ReqHeader::Auth(_) => {}
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
            "veloxy also sends {} (nginx sends {} only when proxy_set_header sets {})",
            unset.join(", "),
            if unset.len() == 1 { "it" } else { "them" },
            if unset.len() == 1 { "it" } else { "them" }
        ));
    }
    if diffs.is_empty() {
        tr.rep.translated(&d.loc, &d.name);
    } else {
        tr.rep.different(&d.loc, &d.name, diffs.join("; "));
    }
    true
}
