//! Middleware directives (they change the request or the answer and hand on): `root`,
//! `header`, `request_header`, `encode`, `basicauth`, `forward_auth`, `request_body`,
//! `rewrite`, `uri`, `try_files`, and the ones veloxy refuses.

use toml::Value;
use veloxy_import::{GeneratedFile, Section};

use super::flow::{Headers, Rules, Scope};
use super::placeholder::template;
use super::T;
use crate::lexer::Token;
use crate::parse::Line;

/// Directives the site translator handles (reported there).
pub const SITE_LEVEL: &[&str] = &["tls", "bind", "log"];

impl T<'_> {
    /// A middleware directive: the rules it adds (`None`: refused or ignored, reported).
    pub fn middleware(
        &mut self,
        l: &Line,
        args: &[Token],
        scope: &Scope,
        sorted: bool,
    ) -> Option<Rules> {
        let name = l.name();
        if SITE_LEVEL.contains(&name) {
            return None;
        }
        let r = self.middleware_rules(l, args, scope, sorted);
        match r {
            Ok((rules, None)) => {
                self.report.translated(l.loc(), name);
                Some(rules)
            }
            Ok((rules, Some(d))) => {
                self.report.different(l.loc(), name, d);
                Some(rules)
            }
            Err(Skip::Ignored(w)) => {
                self.report.ignored(l.loc(), name, w);
                None
            }
            Err(Skip::Refused(w)) => {
                self.report.refused(l.loc(), name, w);
                super::report_nested(self, l.body(), "its directive is refused");
                None
            }
        }
    }

    fn middleware_rules(
        &mut self,
        l: &Line,
        args: &[Token],
        scope: &Scope,
        _sorted: bool,
    ) -> Result<(Rules, Option<String>), Skip> {
        let mut r = Rules::default();
        let vals: Vec<&str> = args.iter().map(|t| t.text.as_str()).collect();
        let name = l.name();
        if matches!(
            super::flow::matcher_of(l, scope).0,
            super::flow::Matched::Remote(..)
        ) {
            return Err(Skip::Refused(
                "a remote_ip matcher on middleware (veloxy's address lists are allow/deny rules)"
                    .into(),
            ));
        }
        match name {
            "root" => {
                let Some(p) = vals.first() else {
                    return Err(Skip::Refused("root without a path".into()));
                };
                r.root = Some(self.path(p));
                Ok((r, None))
            }
            "header" => header(&mut r.resp, &vals, l.body()).map(|d| (r, d)),
            "request_header" => header(&mut r.req, &vals, l.body()).map(|d| (r, d)),
            "encode" => {
                r.set("compress", true);
                Ok((r, Some("veloxy picks gzip, br or zstd by the client's Accept-Encoding for its compressible types (Caddy: the listed encodings, any response of 512 bytes or more)".into())))
            }
            "basicauth" | "basic_auth" => self.basicauth(l, &vals).map(|d| {
                (d, Some("veloxy's 401 challenge adds charset=\"UTF-8\" and its own short body".into()))
            }),
            "forward_auth" => self.forward_auth(l, &vals).map(|d| (d, Some("veloxy sends the auth service the client's Cookie and Authorization (Caddy: every request field)".into()))),
            "request_body" => {
                for sub in l.body() {
                    match (sub.name(), sub.args()) {
                        ("max_size", [v]) => {
                            let size = super::size(&v.text).ok_or_else(|| Skip::Refused(format!("max_size {}", v.text)))?;
                            r.set("max_body_bytes", size);
                        }
                        (other, _) => return Err(Skip::Refused(format!("request_body {other}"))),
                    }
                }
                Ok((r, Some("veloxy answers 413 before forwarding a larger body; Caddy 2.6 starts forwarding and answers 502 when the body passes the limit".into())))
            }
            "rewrite" => {
                let Some(to) = vals.first() else {
                    return Err(Skip::Refused("rewrite without a target".into()));
                };
                let t = template(to, None).map_err(Skip::Refused)?;
                r.rewrite = Some(t);
                Ok((r, Some("veloxy rewrites the path sent upstream: other directives still match the original path".into())))
            }
            "uri" => match vals.as_slice() {
                ["strip_prefix", p] => {
                    r.strip = Some(p.trim_end_matches('/').to_string());
                    Ok((r, None))
                }
                [op, ..] => Err(Skip::Refused(format!("uri {op} (veloxy removes a matched prefix or rewrites with a template)"))),
                [] => Err(Skip::Refused("uri without an operation".into())),
            },
            "try_files" => {
                let mut files = Vec::new();
                for v in &vals {
                    match *v {
                        "{path}" | "{path}/" | "{http.request.uri.path}" | "{http.request.uri.path}/" => {}
                        v => files.push(Value::String(try_file(v).map_err(Skip::Refused)?)),
                    }
                }
                r.try_files = Some(files.into_iter().filter_map(|v| v.as_str().map(String::from)).collect());
                Ok((r, None))
            }
            "skip_log" | "log_skip" => Err(Skip::Ignored("only the access log changes".into())),
            "push" => Err(Skip::Ignored("HTTP/2 server push: browsers ignore it".into())),
            "vars" | "map" => Err(Skip::Refused(format!("{name} (veloxy has no request variables)"))),
            "templates" => Err(Skip::Refused("templates (veloxy does not execute templates in answers)".into())),
            "handle_errors" => Err(Skip::Refused("handle_errors (veloxy's error pages are fixed files per status: error_pages)".into())),
            "method" => Err(Skip::Refused("method (veloxy does not change the request method)".into())),
            "tracing" => Err(Skip::Refused("tracing (veloxy has no OpenTelemetry export)".into())),
            "invoke" => Err(Skip::Refused("invoke (named routes)".into())),
            other => Err(Skip::Refused(format!("{other} is not a Caddy directive veloxy knows (a plugin?)"))),
        }
    }

    /// `basicauth [hash [realm]] { user hash }`: an htpasswd file beside the output.
    fn basicauth(&mut self, l: &Line, vals: &[&str]) -> Result<Rules, Skip> {
        let (alg, realm) = match vals {
            [] => ("bcrypt", None),
            [a] => (*a, None),
            [a, r, ..] => (*a, Some(*r)),
        };
        if alg != "bcrypt" {
            return Err(Skip::Refused(format!(
                "basicauth {alg} hashes (veloxy reads bcrypt)"
            )));
        }
        let mut lines = String::new();
        for u in l.body() {
            let [hash, ..] = u.args() else {
                return Err(Skip::Refused(format!("user {} without a hash", u.name())));
            };
            let h = decode_hash(&hash.text)
                .ok_or_else(|| Skip::Refused(format!("the hash of {} is not bcrypt", u.name())))?;
            lines.push_str(&format!("{}:{h}\n", u.name()));
        }
        let name = self.htpasswd_name();
        self.cfg.files.push(GeneratedFile {
            name: name.clone(),
            contents: lines,
            mode: 0o600,
        });
        let mut t = toml::Table::new();
        if let Some(realm) = realm {
            t.insert("realm".into(), realm.into());
        }
        t.insert("users_file".into(), name.into());
        let mut r = Rules::default();
        r.set("basic_auth", Value::Table(t));
        Ok(r)
    }

    fn htpasswd_name(&self) -> String {
        let n = self
            .cfg
            .files
            .iter()
            .filter(|f| f.name.ends_with(".htpasswd"))
            .count();
        if n == 0 {
            "caddy.htpasswd".into()
        } else {
            format!("caddy-{}.htpasswd", n + 1)
        }
    }

    /// `forward_auth upstream { uri /verify, copy_headers A B }`.
    fn forward_auth(&mut self, l: &Line, vals: &[&str]) -> Result<Rules, Skip> {
        let mut servers: Vec<Value> = Vec::new();
        for v in vals {
            let (host_port, tls) = match v.split_once("://") {
                Some(("https", r)) => (r.to_string(), true),
                Some((_, r)) => (r.to_string(), false),
                None => (v.to_string(), false),
            };
            let hp = if host_port.contains(':') {
                host_port
            } else {
                format!("{host_port}:{}", if tls { 443 } else { 80 })
            };
            servers.push(Value::String(if tls {
                format!("https://{hp}")
            } else {
                hp
            }));
        }
        let mut fa = toml::Table::new();
        let mut copy: Vec<Value> = Vec::new();
        let mut done = Vec::new();
        for sub in l.body() {
            let a: Vec<&str> = sub.args().iter().map(|t| t.text.as_str()).collect();
            match sub.name() {
                "uri" => {
                    let [u] = a.as_slice() else {
                        return Err(Skip::Refused("forward_auth uri needs one value".into()));
                    };
                    if u.contains('{') {
                        return Err(Skip::Refused(format!(
                            "forward_auth uri {u} with a placeholder (veloxy sends a fixed path)"
                        )));
                    }
                    fa.insert("path".into(), (*u).into());
                }
                "copy_headers" => {
                    let names = a.iter().copied().chain(sub.body().iter().map(|b| b.name()));
                    for n in names {
                        if n.contains('>') {
                            return Err(Skip::Refused(format!(
                                "copy_headers {n} (veloxy copies fields under their own name)"
                            )));
                        }
                        copy.push(n.into());
                    }
                }
                "to" => servers.extend(a.iter().map(|s| Value::String(s.to_string()))),
                "header_up" => {
                    return Err(Skip::Refused(
                        "forward_auth header_up (veloxy sends a fixed set of fields)".into(),
                    ))
                }
                "trusted_proxies" => {}
                other => return Err(Skip::Refused(format!("forward_auth {other}"))),
            }
            done.push(sub);
        }
        for sub in done {
            self.report.translated(sub.loc(), sub.name());
        }
        if servers.is_empty() {
            return Err(Skip::Refused("forward_auth without an upstream".into()));
        }
        let mut g = Section::from(l.loc());
        g.set(
            "servers",
            // Plain addresses: the engine takes the auth service's Host from its first
            // backend at load, which a `dns` entry does not have yet.
            Value::Array(servers.clone()),
        );
        let base = servers[0]
            .as_str()
            .unwrap_or("auth")
            .trim_start_matches("https://")
            .split([':', '.'])
            .next()
            .unwrap_or("auth")
            .to_string();
        let group = self.group(if base.is_empty() { "auth" } else { &base }, g);
        let mut t = toml::Table::new();
        t.insert("upstream".into(), group.into());
        for (k, v) in fa {
            t.insert(k, v);
        }
        if !copy.is_empty() {
            t.insert("copy_headers".into(), Value::Array(copy));
        }
        let mut r = Rules::default();
        r.set("forward_auth", Value::Table(t));
        Ok(r)
    }
}

/// Why a middleware directive gives no rules.
pub enum Skip {
    Ignored(String),
    Refused(String),
}

/// `header` / `request_header` operations (one line or a block); `Ok(Some(_))` names a
/// difference.
fn header(h: &mut Headers, vals: &[&str], block: &[Line]) -> Result<Option<String>, Skip> {
    let mut ops: Vec<Vec<String>> = Vec::new();
    if !vals.is_empty() {
        ops.push(vals.iter().map(|s| s.to_string()).collect());
    }
    for b in block {
        let mut op = vec![b.name().to_string()];
        op.extend(b.args().iter().map(|t| t.text.clone()));
        ops.push(op);
    }
    for op in ops {
        let field = op[0].as_str();
        if field == "defer" {
            continue;
        }
        if let Some(n) = field.strip_prefix('-') {
            h.remove.push(n.to_string());
            continue;
        }
        let (name, add) = match field.strip_prefix('+') {
            Some(n) => (n, true),
            None => (field.trim_start_matches('>'), false),
        };
        if name.starts_with('?') {
            return Err(Skip::Refused(format!(
                "{name} (veloxy sets a field whether or not it is there)"
            )));
        }
        let value = match op.len() {
            2 => template(&op[1], None).map_err(Skip::Refused)?,
            1 => return Err(Skip::Refused(format!("{name} without a value"))),
            _ => {
                return Err(Skip::Refused(format!(
                    "{name} find/replace (veloxy sets whole values)"
                )))
            }
        };
        if add {
            h.add.insert(name.to_string(), value.into());
        } else {
            h.set.insert(name.to_string(), value.into());
        }
    }
    Ok(None)
}

/// A `try_files` entry in veloxy's spelling (`{path}.html` -> `$uri.html`).
fn try_file(v: &str) -> Result<String, String> {
    let v = v
        .replace("{http.request.uri.path}", "$uri")
        .replace("{path}", "$uri");
    if v.contains('{') {
        return Err(format!(
            "try_files {v} (veloxy's try_files knows $uri only)"
        ));
    }
    if v.contains('?') {
        return Err(format!("try_files {v} with a query"));
    }
    Ok(v)
}

/// A Caddy password hash (base64 of a bcrypt hash, or the bcrypt hash itself).
fn decode_hash(h: &str) -> Option<String> {
    use base64::Engine as _;
    let raw = if h.starts_with("$2") {
        h.to_string()
    } else {
        let bytes = base64::engine::general_purpose::STANDARD.decode(h).ok()?;
        String::from_utf8(bytes).ok()?
    };
    raw.starts_with("$2").then_some(raw)
}
