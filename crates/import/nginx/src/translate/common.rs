//! Directives valid at several levels (`http`, `server`, `location`): they set what the
//! levels inside inherit ([`Level`]), and each reports itself once, where it is written.

use super::level::{Access, LimitReq, Own, ReqHeader, Root};
use super::{Level, Tr};
use crate::parse::Directive;
use crate::vars::{self, VarCtx};

/// The level a directive is written at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Http,
    Server,
    Location,
}

/// Handles `d` if it is a level directive; `false` when it is not one.
pub fn directive<'a>(tr: &mut Tr<'a>, d: &'a Directive, lvl: &mut Level, at: At) -> bool {
    let loc = &d.loc;
    let name = d.name.as_str();
    match name {
        "proxy_set_header" => proxy_set_header(tr, d, lvl),
        "add_header" => add_header(tr, d, lvl),
        "client_max_body_size" => match vars::size(d.arg(0)) {
            Some(s) if s == "0" => {
                lvl.max_body = Some(None);
                tr.rep.translated(loc, name);
            }
            Some(s) => {
                lvl.max_body = Some(Some(s));
                tr.rep.translated(loc, name);
            }
            None => tr.rep.refused(loc, name, format!("size {:?}", d.arg(0))),
        },
        "gzip" => {
            lvl.gzip = d.arg(0) == "on";
            tr.rep.translated(loc, name);
        }
        "gzip_types" => tr.rep.different(
            loc,
            name,
            "veloxy compresses its own list of types (text, JavaScript, JSON, XML, SVG, wasm, fonts)",
        ),
        "gzip_static" => tr.rep.translated(loc, name),
        "root" | "alias" => {
            lvl.root = Some(Root {
                path: d.arg(0).to_string(),
                alias: name == "alias",
            });
            if vars::has_vars(d.arg(0)) {
                tr.rep.refused(loc, name, "a path with variables");
                lvl.root = None;
            } else {
                tr.rep.translated(loc, name);
            }
        }
        "index" => {
            lvl.index = Some(d.args.iter().map(|a| a.text.clone()).collect());
            tr.rep.translated(loc, name);
        }
        "autoindex" => {
            lvl.autoindex = d.arg(0) == "on";
            tr.rep.translated(loc, name);
        }
        "proxy_connect_timeout" | "proxy_read_timeout" | "proxy_send_timeout"
        | "grpc_connect_timeout" | "grpc_read_timeout" | "grpc_send_timeout" => {
            let i = if name.ends_with("connect_timeout") {
                0
            } else if name.ends_with("read_timeout") {
                1
            } else {
                2
            };
            match vars::duration(d.arg(0)) {
                Some(v) => {
                    lvl.timeouts[i] = Some(v);
                    tr.rep.translated(loc, name);
                }
                None => tr.rep.refused(loc, name, format!("duration {:?}", d.arg(0))),
            }
        }
        "auth_basic" => {
            lvl.auth_realm = Some((d.arg(0) != "off").then(|| d.arg(0).to_string()));
            tr.rep.translated(loc, name);
        }
        "auth_basic_user_file" => {
            let base = tr.prefix.clone();
            lvl.auth_file = Some(tr.opts.out_path(&base, d.arg(0)));
            tr.rep.translated(loc, name);
        }
        "allow" | "deny" => access(tr, d, lvl),
        "limit_req" => limit_req(tr, d, lvl),
        "limit_req_status" => {
            if d.arg(0) == "429" {
                tr.rep.translated(loc, name);
            } else {
                tr.rep.different(loc, name, format!("veloxy answers 429 over the limit, not {}", d.arg(0)));
            }
        }
        "error_page" => super::pages::error_page(tr, d, lvl),
        "expires" => expires(tr, d, lvl),
        "default_type" => {
            lvl.default_type = Some(d.arg(0).to_string());
            tr.rep.translated(loc, name);
        }
        "set" => {
            let var = d.arg(0).trim_start_matches('$').to_string();
            if vars::has_vars(d.arg(1)) {
                tr.rep.refused(loc, name, format!("${var} from other variables: veloxy has no set"));
            } else {
                lvl.constants.insert(var, d.arg(1).to_string());
                tr.rep.translated(loc, name);
            }
        }
        "proxy_ssl_verify" => {
            lvl.ssl_verify = d.arg(0) == "on";
            tr.rep.translated(loc, name);
        }
        "proxy_ssl_trusted_certificate" => {
            let base = tr.prefix.clone();
            lvl.ssl_ca = Some(tr.opts.out_path(&base, d.arg(0)));
            tr.rep.translated(loc, name);
        }
        "proxy_ssl_name" => {
            lvl.ssl_name = Some(d.arg(0).to_string());
            tr.rep.translated(loc, name);
        }
        "proxy_ssl_server_name" | "proxy_ssl_verify_depth" | "proxy_ssl_protocols" => {
            tr.rep.translated(loc, name)
        }
        "proxy_next_upstream" => {
            lvl.no_retry = d.arg(0) == "off";
            if d.args.iter().any(|a| a.text.starts_with("http_")) {
                tr.rep.different(loc, name, "veloxy retries idempotent requests on 502, 503 and 504 (retry_on)");
            } else {
                tr.rep.translated(loc, name);
            }
        }
        "ssl_certificate" | "ssl_certificate_key" => {
            if vars::has_vars(d.arg(0)) {
                tr.rep.refused(loc, name, "certificate paths with variables");
                return true;
            }
            let base = tr.prefix.clone();
            let p = tr.opts.out_path(&base, d.arg(0));
            if name == "ssl_certificate" {
                lvl.cert = Some(p);
            } else {
                lvl.key = Some(p);
            }
            tr.rep.translated(loc, name);
        }
        "ssl_protocols" => {
            let old: Vec<&str> = d
                .args
                .iter()
                .map(|a| a.text.as_str())
                .filter(|p| matches!(*p, "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1"))
                .collect();
            let has12 = d.args.iter().any(|a| a.text == "TLSv1.2");
            if !has12 {
                tr.rep.different(loc, name, "veloxy also offers TLS 1.2");
            } else if !old.is_empty() {
                tr.rep.different(loc, name, format!("veloxy does not offer {}", old.join(", ")));
            } else {
                tr.rep.translated(loc, name);
            }
        }
        "access_log" if at == At::Http || d.arg(0) == "off" => access_log(tr, d),
        "keepalive_timeout" | "client_header_timeout" | "client_body_timeout" | "send_timeout" => {
            server_timeout(tr, d)
        }
        "real_ip_header" | "set_real_ip_from" | "real_ip_recursive" => real_ip(tr, d),
        "underscores_in_headers" => {
            if d.arg(0) == "on" {
                tr.cfg.server.set("underscores_in_headers", true);
            }
            tr.rep.translated(loc, name);
        }
        "proxy_redirect" => {
            if d.arg(0) == "off" || d.arg(0) == "default" {
                tr.rep.translated(loc, name);
            } else {
                tr.rep.refused(loc, name, "veloxy rewrites Location to the client's host only (location_rewrite)");
            }
        }
        "proxy_hide_header" => {
            Level::start(&mut lvl.own, Own::HIDE_HEADERS, &mut lvl.hide_headers)
                .push(d.arg(0).to_string());
            tr.rep.translated(loc, name);
        }
        "proxy_intercept_errors" => {
            lvl.intercept_errors = d.arg(0) == "on";
            tr.rep.translated(loc, name);
        }
        "proxy_pass_request_body" if lvl.auth_location && d.arg(0) == "off" => {
            tr.rep.translated(loc, name)
        }
        "proxy_pass_request_headers" | "proxy_pass_request_body" | "proxy_set_body" => {
            tr.rep.refused(loc, name, "veloxy always forwards the client's headers and body")
        }
        "auth_request" | "auth_request_set" => {
            // Reported by the level's prescan; here only where no prescan ran (inside if).
            if !tr.rep.entries.iter().any(|e| e.loc == *loc) && !tr.auth_pending.contains(loc) {
                tr.rep.refused(loc, name, "inside if: not translated");
            }
        }
        "log_not_found" | "log_subrequest" => tr.rep.ignored(
            loc,
            name,
            "what nginx writes to its error log; the answer is the same",
        ),
        "charset" | "charset_types" | "source_charset" | "override_charset" => super::pages::charset(tr, d, lvl),
        _ => return super::cache::directive(tr, d, lvl),
    }
    true
}

/// The variable context for values written at a level.
pub fn ctx(lvl: &Level) -> VarCtx {
    VarCtx {
        constants: lvl.constants.clone(),
        server_name: lvl.server_name.clone(),
        ..Default::default()
    }
}

/// A field name as veloxy takes it: nginx sends a name written with a trailing colon as
/// written (the peer reads `NAME:: value` as NAME with the value `: value`); veloxy refuses
/// such a name, so the colon is dropped and the difference named.
fn field_name(name: &str) -> (String, Option<String>) {
    match name.strip_suffix(':') {
        Some(n) if !n.is_empty() => (
            n.to_string(),
            Some(format!(
                "the name {name:?} is written with a colon: nginx sends `{name}: value`, which \
                 the peer reads as {n} with the value \": value\"; veloxy sends {n} with the value"
            )),
        ),
        _ => (name.to_string(), None),
    }
}

/// What veloxy's `{request_id}` does unlike nginx's `$request_id`, when `value` uses it;
/// the `[server] request_id` field it needs is set.
pub fn request_id(tr: &mut Tr<'_>, value: &str) -> Option<String> {
    if !vars::pieces(value)
        .iter()
        .any(|p| matches!(p, vars::Piece::Var(v) if v.eq_ignore_ascii_case("request_id")))
    {
        return None;
    }
    if tr.cfg.server.get("request_id").is_none() {
        tr.cfg.server.set("request_id", "X-Request-Id");
    }
    Some(
        "$request_id is veloxy's request ID ([server] request_id = \"X-Request-Id\"): veloxy \
         keeps a valid X-Request-Id the client sent (nginx always makes a new one), returns it \
         to the client and forwards it upstream in X-Request-Id"
            .into(),
    )
}

/// Reports `d` as translated, or with the differences in `diffs`.
fn report(tr: &mut Tr<'_>, d: &Directive, diffs: &[String]) {
    if diffs.is_empty() {
        tr.rep.translated(&d.loc, &d.name);
    } else {
        tr.rep.different(&d.loc, &d.name, diffs.join("; "));
    }
}

fn proxy_set_header(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let (name, colon) = field_name(d.arg(0));
    let value = d.arg(1);
    let lower = name.to_ascii_lowercase();
    // A level's first proxy_set_header starts its own list (the parent's is not kept).
    Level::start(&mut lvl.own, Own::PROXY_HEADERS, &mut lvl.proxy_headers);
    let mut c = ctx(lvl);
    c.captures = true;
    let managed = matches!(
        lower.as_str(),
        "connection"
            | "upgrade"
            | "keep-alive"
            | "te"
            | "transfer-encoding"
            | "content-length"
            | "proxy-connection"
    );
    let auth = super::auth::auth_field(lvl, value);
    let entry = match (lower.as_str(), value) {
        _ if auth.is_some() => match auth.flatten() {
            Some(f) if f.eq_ignore_ascii_case(&name) => Ok(ReqHeader::Auth(name.clone())),
            Some(f) => Err(super::auth::rename_why(&f, &name)),
            None => Err(format!(
                "{value} holds no field of the auth answer (its auth_request_set is refused)"
            )),
        },
        ("connection", v)
            if v.starts_with('$')
                && tr
                    .maps
                    .get(&v[1..])
                    .is_some_and(|m| m.arg(0) == "$http_upgrade") =>
        {
            tr.upgrade_map = Some(v[1..].to_string());
            Ok(ReqHeader::Default(name.clone()))
        }
        _ if managed => Ok(ReqHeader::Default(name.clone())),
        (_, "") => Ok(ReqHeader::Remove(name.clone())),
        ("x-forwarded-for", "$proxy_add_x_forwarded_for")
        | ("x-forwarded-proto", "$scheme")
        | ("host", "$http_host")
        | ("upgrade", "$http_upgrade") => Ok(ReqHeader::Default(name.clone())),
        ("connection", v) if v.eq_ignore_ascii_case("upgrade") || v.is_empty() => {
            Ok(ReqHeader::Default(name.clone()))
        }
        ("connection", v)
            if v.starts_with('$')
                && tr
                    .maps
                    .get(&v[1..])
                    .is_some_and(|m| m.arg(0) == "$http_upgrade") =>
        {
            tr.upgrade_map = Some(v[1..].to_string());
            Ok(ReqHeader::Default(name.clone()))
        }
        ("x-forwarded-for", v) if v.contains("$proxy_add_x_forwarded_for") => {
            Err("$proxy_add_x_forwarded_for inside a longer value".to_string())
        }
        ("host", "$proxy_host") => Ok(ReqHeader::Default(name.clone())),
        _ => vars::template(value, &c)
            .map(|t| ReqHeader::Set(name.clone(), t))
            .map_err(|v| format!("veloxy has no variable {v}")),
    };
    let list = Level::start(&mut lvl.own, Own::PROXY_HEADERS, &mut lvl.proxy_headers);
    match entry {
        Ok(e) => {
            list.retain(|h| !h.name().eq_ignore_ascii_case(&name));
            let default_host = matches!(&e, ReqHeader::Default(n) if n.eq_ignore_ascii_case("host") && value == "$proxy_host");
            if !default_host {
                list.push(e);
            }
            let diffs: Vec<String> = colon.into_iter().chain(request_id(tr, value)).collect();
            report(tr, d, &diffs);
        }
        Err(why) => tr.rep.refused(&d.loc, "proxy_set_header", why),
    }
}

fn add_header(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let always = d.arg(2) == "always";
    let mut c = ctx(lvl);
    c.captures = true;
    let (name, colon) = field_name(d.arg(0));
    if d.arg(1) == "$upstream_cache_status" {
        // Still an add_header of this level: the inherited list is not kept.
        Level::start(&mut lvl.own, Own::ADD_HEADERS, &mut lvl.add_headers);
        lvl.cache.status_header = Some(name);
        tr.rep.different(
            &d.loc,
            "add_header",
            "veloxy's cache status field (cache_status_header): HIT, MISS, STALE, REVALIDATED or \
             BYPASS (no EXPIRED or UPDATING), on every answer of a caching route",
        );
        return;
    }
    if super::auth::auth_field(lvl, d.arg(1)).is_some() {
        tr.rep.refused(&d.loc, "add_header", super::auth::ADD_WHY);
        return;
    }
    match vars::template(d.arg(1), &c) {
        Ok(t) => {
            Level::start(&mut lvl.own, Own::ADD_HEADERS, &mut lvl.add_headers).push((name, t));
            let mut diffs: Vec<String> =
                colon.into_iter().chain(request_id(tr, d.arg(1))).collect();
            if !always {
                diffs.push("veloxy adds it to every answer; nginx only to 200, 201, 204, 206, 301, 302, 303, 304, 307 and 308 (add `always` to match)".into());
            }
            report(tr, d, &diffs);
        }
        Err(v) => tr
            .rep
            .refused(&d.loc, "add_header", format!("veloxy has no variable {v}")),
    }
}

fn access(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let who = d.arg(0).to_string();
    if who != "all"
        && who != "unix:"
        && who.parse::<ipnet::IpNet>().is_err()
        && who.parse::<std::net::IpAddr>().is_err()
    {
        tr.rep.refused(&d.loc, &d.name, format!("address {who:?}"));
        return;
    }
    Level::start(&mut lvl.own, Own::ACCESS, &mut lvl.access).push(Access {
        allow: d.name == "allow",
        who,
        loc: d.loc.clone(),
    });
    tr.rep.translated(&d.loc, &d.name);
}

fn limit_req(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let mut zone = String::new();
    let mut burst = 0;
    let mut nodelay = false;
    for a in &d.args {
        if let Some(z) = a.text.strip_prefix("zone=") {
            zone = z.to_string();
        } else if let Some(b) = a.text.strip_prefix("burst=") {
            burst = b.parse().unwrap_or(0);
        } else if a.text == "nodelay" {
            nodelay = true;
        }
    }
    match tr.zones.get(&zone) {
        Some(Ok(_)) => {
            Level::start(&mut lvl.own, Own::LIMIT_REQ, &mut lvl.limit_req).push(LimitReq {
                zone,
                burst,
                loc: d.loc.clone(),
            });
            let mut diffs = Vec::new();
            if !nodelay && burst > 0 {
                diffs.push("veloxy answers requests over the rate at once (429) where nginx delays up to burst of them (no nodelay)");
            }
            diffs.push(
                "over the limit veloxy answers 429 with Retry-After, nginx 503 (limit_req_status)",
            );
            tr.rep.different(&d.loc, "limit_req", diffs.join("; "));
        }
        Some(Err(e)) => tr
            .rep
            .refused(&d.loc, "limit_req", format!("its zone is refused: {e}")),
        None => tr
            .rep
            .refused(&d.loc, "limit_req", format!("no limit_req_zone {zone:?}")),
    }
}

fn access_log(tr: &mut Tr<'_>, d: &Directive) {
    let path = d.arg(0);
    if path == "off" {
        tr.rep.translated(&d.loc, "access_log");
        return;
    }
    let format = d.arg(1);
    if tr.cfg.server.get("access_log").is_some() {
        tr.rep.ignored(
            &d.loc,
            "access_log",
            "veloxy writes one access log ([server.access_log])",
        );
        return;
    }
    let target = if path == "/dev/stdout" {
        "stdout".to_string()
    } else {
        path.to_string()
    };
    let mut t = toml::Table::new();
    t.insert("path".into(), target.into());
    t.insert("format".into(), "combined".into());
    tr.cfg.server.set("access_log", toml::Value::Table(t));
    tr.cfg.server.add_from(&d.loc);
    if format.is_empty() || format == "combined" {
        tr.rep.translated(&d.loc, "access_log");
    } else {
        tr.rep.different(
            &d.loc,
            "access_log",
            format!("veloxy writes the combined format, not {format:?}"),
        );
    }
}

fn server_timeout(tr: &mut Tr<'_>, d: &Directive) {
    let key = match d.name.as_str() {
        "keepalive_timeout" => "keepalive_timeout",
        "client_header_timeout" => "header_timeout",
        "client_body_timeout" => "body_timeout",
        _ => "send_timeout",
    };
    let Some(v) = vars::duration(d.arg(0)) else {
        tr.rep
            .refused(&d.loc, &d.name, format!("duration {:?}", d.arg(0)));
        return;
    };
    let v = if v == "0s" && key == "keepalive_timeout" {
        "0s".to_string()
    } else {
        v
    };
    match tr.cfg.server.get(key).and_then(|x| x.as_str()) {
        Some(old) if old != v => tr.rep.different(
            &d.loc,
            &d.name,
            format!("veloxy has one {key} for every server: {old} (from an earlier one) applies"),
        ),
        _ => {
            tr.cfg.server.set(key, v);
            tr.cfg.server.add_from(&d.loc);
            tr.rep.translated(&d.loc, &d.name);
        }
    }
}

fn real_ip(tr: &mut Tr<'_>, d: &Directive) {
    match d.name.as_str() {
        "set_real_ip_from" => {
            let list = match tr.cfg.server.get_mut("trusted_proxies") {
                Some(toml::Value::Array(a)) => a,
                _ => {
                    tr.cfg
                        .server
                        .set("trusted_proxies", toml::Value::Array(Vec::new()));
                    match tr.cfg.server.get_mut("trusted_proxies") {
                        Some(toml::Value::Array(a)) => a,
                        _ => unreachable!(),
                    }
                }
            };
            list.push(d.arg(0).into());
            tr.cfg.server.add_from(&d.loc);
            tr.rep.translated(&d.loc, &d.name);
        }
        "real_ip_header" => {
            let h = d.arg(0);
            if h.eq_ignore_ascii_case("proxy_protocol") {
                tr.rep.translated(&d.loc, &d.name);
                return;
            }
            if !h.eq_ignore_ascii_case("X-Forwarded-For") {
                tr.cfg.server.set("client_ip_header", h);
            }
            tr.rep.translated(&d.loc, &d.name);
        }
        _ => {
            if d.arg(0) == "on" {
                tr.rep.translated(&d.loc, &d.name);
            } else {
                tr.rep.different(&d.loc, &d.name, "veloxy takes the rightmost address that is not a trusted proxy (as real_ip_recursive on); nginx takes the last one");
            }
        }
    }
}

/// `expires`: nginx's Cache-Control (and Expires) on answers.
fn expires(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let a = d.arg(0);
    let value = match a {
        "off" => {
            lvl.expires = None;
            tr.rep.translated(&d.loc, "expires");
            return;
        }
        "max" => Some("max-age=315360000".to_string()),
        "epoch" => Some("no-cache".to_string()),
        _ if d.args.len() == 1 && a.starts_with('-') && vars::millis(&a[1..]).is_some() => {
            Some("no-cache".to_string())
        }
        _ if d.args.len() == 1 => {
            vars::millis(a.trim_start_matches('+')).map(|ms| format!("max-age={}", ms / 1000))
        }
        _ => None,
    };
    let Some(v) = value else {
        tr.rep.refused(
            &d.loc,
            "expires",
            format!(
                "expires {}: veloxy sets a fixed Cache-Control (no time of day, no `modified`)",
                d.args
                    .iter()
                    .map(|a| a.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        );
        return;
    };
    tr.rep.different(
        &d.loc,
        "expires",
        format!(
            "veloxy sends Cache-Control: {v} (cache_control on files; on proxied routes a \
             response_headers field set on every answer, where nginx sets it on 2xx and 3xx \
             only) without nginx's Expires field"
        ),
    );
    lvl.expires = Some(v);
}
