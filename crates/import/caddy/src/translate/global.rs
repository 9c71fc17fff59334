//! The global options block: what maps to `[server]` and `[server.acme]`, what only changes
//! Caddy's own operation (ignored, with why), and what veloxy lacks (refused by name).

use toml::Value;

use super::{duration, size, T};
use crate::parse::Line;

/// What became of one option.
enum Out {
    Done,
    Different(String),
    Ignored(String),
    Refused(String),
    /// Reported by the option itself (or later, once the sites are known).
    Reported,
}

/// Caddy's `private_ranges`.
const PRIVATE_RANGES: &[&str] = &[
    "192.168.0.0/16",
    "172.16.0.0/12",
    "10.0.0.0/8",
    "127.0.0.1/8",
    "fd00::/8",
    "::1",
];

impl T<'_> {
    /// The global options block.
    pub fn global(&mut self, lines: &[Line]) {
        for l in lines {
            let name = l.name();
            let out = match l.unresolved() {
                Some(why) => Out::Refused(why.to_string()),
                None => self.global_option(l),
            };
            match out {
                Out::Done => self.report.translated(l.loc(), name),
                Out::Different(d) => self.report.different(l.loc(), name, d),
                Out::Ignored(w) => self.report.ignored(l.loc(), name, w),
                Out::Refused(w) => {
                    self.report.refused(l.loc(), name, w);
                    super::report_nested(self, l.body(), "its global option is refused");
                }
                Out::Reported => {}
            }
        }
    }

    fn global_option(&mut self, l: &Line) -> Out {
        let vals: Vec<&str> = l.args().iter().map(|t| t.text.as_str()).collect();
        let first = vals.first().copied().unwrap_or("");
        let name = l.name();
        match name {
            "email" => {
                self.acme().insert("email".into(), first.into());
                Out::Done
            }
            "acme_ca" => {
                self.acme().insert("directory".into(), first.into());
                Out::Done
            }
            "acme_ca_root" => {
                let p = self.path(first);
                self.acme().insert("ca_file".into(), p.into());
                Out::Done
            }
            "acme_dns" | "dns" => Out::Different(
                "veloxy validates certificates with tls-alpn-01 or http-01 (the CA must reach \
                 this host on port 443 or 80), not with DNS records"
                    .into(),
            ),
            "auto_https" => match first {
                "off" | "disable_redirects" | "disable_certs" | "ignore_loaded_certs" => {
                    self.auto_https = first.to_string();
                    // Reported with the sites: what it changes depends on them.
                    self.auto_https_loc = Some(l.loc().clone());
                    Out::Reported
                }
                _ => Out::Refused(format!("auto_https {first}")),
            },
            "http_port" | "https_port" => match first.parse::<u16>() {
                Ok(p) if name == "http_port" => {
                    self.http_port = p;
                    Out::Done
                }
                Ok(p) => {
                    self.https_port = p;
                    Out::Done
                }
                Err(_) => Out::Refused(format!("{name} {first}")),
            },
            "admin" => admin(first),
            "debug"
            | "persist_config"
            | "skip_install_trust"
            | "storage_check"
            | "storage_clean_interval"
            | "renew_interval"
            | "ocsp_interval"
            | "ocsp_stapling"
            | "key_type"
            | "preferred_chains"
            | "cert_lifetime" => Out::Ignored(
                "Caddy's own operation (logging, saved config, certificate upkeep): no effect on \
                 what clients or backends see"
                    .into(),
            ),
            "pki" => Out::Ignored(
                "Caddy's local CA settings (sites that use the local CA are refused)".into(),
            ),
            "metrics" => {
                Out::Ignored("metrics only; veloxy's are on its admin endpoint (/metrics)".into())
            }
            "storage" => self.storage(l, &vals),
            "log" => Out::Ignored(
                "Caddy's own logs (a site's access log is its log directive): no effect on what \
                 clients or backends see"
                    .into(),
            ),
            "grace_period" => match duration(first) {
                Some(d) => {
                    self.cfg.server.set("shutdown_timeout", d);
                    Out::Done
                }
                None => Out::Refused(format!("grace_period {first}")),
            },
            "shutdown_delay" => Out::Different(
                "veloxy stops accepting as soon as it is told to stop; Caddy keeps serving for \
                 this delay first"
                    .into(),
            ),
            "servers" => {
                self.servers(l);
                Out::Reported
            }
            "local_certs" => {
                self.local_certs = true;
                Out::Done
            }
            "order" => self.order(&vals),
            "on_demand_tls" => Out::Refused(
                "on_demand_tls (veloxy obtains certificates for configured names only)".into(),
            ),
            "cert_issuer" => {
                Out::Refused("cert_issuer (veloxy's issuer is one ACME directory: acme_ca)".into())
            }
            "acme_eab" => Out::Refused("acme_eab (ACME external account binding)".into()),
            "default_sni" | "fallback_sni" => Out::Refused(format!(
                "{name} (veloxy answers clients without a known SNI with the listener's first \
                 certificate)"
            )),
            "default_bind" => Out::Refused("default_bind".into()),
            other => Out::Refused(format!("global option {other}")),
        }
    }

    /// `order NAME first|last|before OTHER|after OTHER`: moves NAME in the directive order.
    fn order(&mut self, vals: &[&str]) -> Out {
        let (name, pos, other) = match vals {
            [n, p @ ("first" | "last")] => (*n, *p, None),
            [n, p @ ("before" | "after"), o] => (*n, *p, Some(*o)),
            _ => return Out::Refused(format!("order {}", vals.join(" "))),
        };
        let standard = self.order.iter().any(|d| d == name);
        self.order.retain(|d| d != name);
        let at = match (pos, other) {
            ("first", _) => 0,
            ("last", _) => self.order.len(),
            (p, Some(o)) => match self.order.iter().position(|d| d == o) {
                Some(i) if p == "before" => i,
                Some(i) => i + 1,
                None => {
                    return Out::Refused(format!("order {name} {p} {o}: {o} is not a directive"))
                }
            },
            _ => unreachable!("matched above"),
        };
        self.order.insert(at, name.to_string());
        if standard {
            Out::Done
        } else {
            Out::Ignored(format!(
                "places {name}, which is not a standard directive (a plugin: refused where it is \
                 used)"
            ))
        }
    }

    /// `storage file_system PATH` (or `{ root PATH }`): where certificates are kept.
    fn storage(&mut self, l: &Line, vals: &[&str]) -> Out {
        let root = match vals {
            ["file_system", p] => Some(p.to_string()),
            ["file_system"] => l
                .body()
                .iter()
                .find(|s| s.name() == "root")
                .and_then(|s| s.args().first())
                .map(|t| t.text.clone()),
            _ => None,
        };
        match root {
            Some(p) => {
                let p = self.path(&p);
                self.acme().insert("storage".into(), p.into());
                for s in l.body() {
                    self.report.translated(s.loc(), s.name());
                }
                Out::Different(
                    "veloxy keeps its own account and certificate files there (Caddy's are not \
                     read): certificates are obtained again"
                        .into(),
                )
            }
            None => {
                for s in l.body() {
                    self.report
                        .ignored(s.loc(), s.name(), "settings of Caddy's storage module");
                }
                Out::Different(format!(
                    "veloxy keeps certificates in its own storage folder, not in Caddy's {} \
                     storage: they are obtained again and not shared with other instances",
                    vals.first().copied().unwrap_or("configured")
                ))
            }
        }
    }

    /// `servers [address] { trusted_proxies ..., client_ip_headers ..., timeouts { ... } }`.
    fn servers(&mut self, l: &Line) {
        if l.args().is_empty() {
            self.report.translated(l.loc(), "servers");
        } else {
            self.report.different(
                l.loc(),
                "servers",
                "veloxy's [server] options apply to every listener, not to this address only",
            );
        }
        let strict = l
            .body()
            .iter()
            .any(|s| s.name() == "trusted_proxies_strict");
        for s in l.body() {
            let vals: Vec<&str> = s.args().iter().map(|t| t.text.as_str()).collect();
            let out = match (s.name(), vals.as_slice()) {
                ("trusted_proxies", ["static", ranges @ ..]) => {
                    let mut list: Vec<Value> = Vec::new();
                    for r in ranges {
                        if *r == "private_ranges" {
                            list.extend(PRIVATE_RANGES.iter().map(|p| Value::from(*p)));
                        } else {
                            list.push((*r).into());
                        }
                    }
                    self.cfg.server.set("trusted_proxies", Value::Array(list));
                    self.trusted_proxies = true;
                    if strict {
                        Out::Done
                    } else {
                        Out::Different(
                            "veloxy takes the client address from the right of X-Forwarded-For \
                             (the last one a trusted proxy did not add); Caddy without \
                             trusted_proxies_strict takes the leftmost"
                                .into(),
                        )
                    }
                }
                ("trusted_proxies", [module, ..]) => Out::Refused(format!(
                    "trusted_proxies {module} (veloxy's list is static ranges)"
                )),
                ("trusted_proxies_strict", []) => Out::Done,
                ("client_ip_headers", [h, rest @ ..]) => self.client_ip_headers(l, h, rest),
                ("timeouts", _) => {
                    self.timeouts(s);
                    Out::Done
                }
                ("max_header_size", [v]) => match size(v) {
                    Some(Value::Integer(n)) => {
                        self.cfg.server.set("max_header_bytes", n);
                        Out::Done
                    }
                    Some(Value::String(_)) => {
                        Out::Refused(format!("max_header_size {v} (give bytes)"))
                    }
                    _ => Out::Refused(format!("max_header_size {v}")),
                },
                ("protocols", ps) => self.protocols(ps),
                ("log_credentials", _) | ("metrics", _) => {
                    Out::Ignored("logs and metrics only".into())
                }
                ("name", _) => Out::Ignored("a name for Caddy's logs".into()),
                ("keepalive_interval", _) | ("enable_full_duplex", _) => {
                    Out::Ignored("connection upkeep with no visible effect".into())
                }
                (other, _) => Out::Refused(format!("servers {other}")),
            };
            match out {
                Out::Done => self.report.translated(s.loc(), s.name()),
                Out::Different(d) => self.report.different(s.loc(), s.name(), d),
                Out::Ignored(w) => self.report.ignored(s.loc(), s.name(), w),
                Out::Refused(w) => {
                    self.report.refused(s.loc(), s.name(), w);
                    super::report_nested(self, s.body(), "its option is refused");
                }
                Out::Reported => {}
            }
        }
    }

    /// `client_ip_headers A [B ...]`: veloxy reads one field.
    fn client_ip_headers(&mut self, servers: &Line, h: &str, rest: &[&str]) -> Out {
        let trusted = servers.body().iter().any(|s| {
            s.name() == "trusted_proxies" && s.args().first().is_some_and(|a| a.text == "static")
        });
        if !trusted {
            return Out::Ignored(
                "without trusted_proxies Caddy believes no client address header".into(),
            );
        }
        self.cfg.server.set("client_ip_header", h);
        if rest.is_empty() {
            Out::Done
        } else {
            Out::Different(format!(
                "veloxy reads {h} only; Caddy falls back to {}",
                rest.join(", ")
            ))
        }
    }

    /// `timeouts { read_header, read_body, idle, write }`.
    fn timeouts(&mut self, s: &Line) {
        for t in s.body() {
            let key = match t.name() {
                "read_header" => Some("header_timeout"),
                "read_body" => Some("body_timeout"),
                "idle" => Some("keepalive_timeout"),
                "write" => Some("send_timeout"),
                _ => None,
            };
            let d = t.args().first().and_then(|a| duration(&a.text));
            match (key, d) {
                (Some(k), Some(d)) => {
                    self.cfg.server.set(k, d);
                    self.report.different(
                        t.loc(),
                        t.name(),
                        "veloxy's limit is on the wait between reads/writes, Caddy's on the \
                         whole phase",
                    );
                }
                _ => self.report.refused(t.loc(), t.name(), "timeout"),
            }
        }
    }

    /// `protocols h1 h2 h2c h3`: which HTTP versions the listeners offer.
    fn protocols(&mut self, ps: &[&str]) -> Out {
        self.http3 = ps.contains(&"h3");
        let mut diffs = Vec::new();
        if !ps.contains(&"h2") {
            diffs.push("veloxy's TLS listeners also offer HTTP/2");
        }
        if !ps.contains(&"h1") {
            diffs.push("veloxy also speaks HTTP/1.1");
        }
        if ps.contains(&"h2c") {
            diffs.push("veloxy's plain listeners speak HTTP/1.1 only");
        }
        if diffs.is_empty() {
            Out::Done
        } else {
            Out::Different(diffs.join("; "))
        }
    }

    /// `[server.acme]`.
    pub fn acme(&mut self) -> &mut toml::Table {
        self.cfg.server.table("acme")
    }
}

/// `admin off | ADDRESS`: Caddy's config API.
fn admin(addr: &str) -> Out {
    let host = addr
        .strip_prefix("tcp/")
        .unwrap_or(addr)
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_matches(['[', ']']);
    if addr == "off" {
        return Out::Ignored(
            "Caddy's config API is off; veloxy's admin endpoint is separate ([server] admin, \
             not set)"
                .into(),
        );
    }
    let local = addr.is_empty()
        || addr.starts_with("unix/")
        || host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if local {
        Out::Ignored(
            "Caddy's config API (on this host only); veloxy's admin endpoint is separate \
             ([server] admin, not set)"
                .into(),
        )
    } else {
        Out::Different(format!(
            "Caddy's config API on {addr} is reachable from other hosts; veloxy opens no such \
             port (its admin endpoint is [server] admin, not set)"
        ))
    }
}
