//! `reverse_proxy`: the upstream group (servers, `lb_policy`, active and passive health,
//! `transport http`) and the route's header rules (`header_up`, `header_down`).
//!
//! Caddy's defaults that differ from veloxy's are written out: no retries (veloxy: 2), no
//! passive health checks (veloxy ejects after 5 failures), and, with `health_uri`, checks
//! every 30s with a 5s timeout, expecting 2xx, one result flipping a backend's state.

use toml::Value;
use veloxy_import::{Config, Section};

use super::flow::{Action, Rules, Scope};
use super::handlers::Answer;
use super::upstream::{dur, header_op, lb_policy, name_for, server_entry, upstreams, Upstream};
use super::T;
use crate::lexer::Token;
use crate::parse::Line;

impl T<'_> {
    /// `reverse_proxy [upstreams...] { ... }`.
    pub fn reverse_proxy(&mut self, l: &Line, args: &[Token], scope: &Scope) -> Answer {
        let mut servers: Vec<Upstream> = Vec::new();
        for a in args {
            servers.extend(upstreams(&a.text)?);
        }
        for sub in l.body().iter().filter(|s| s.name() == "to") {
            for a in sub.args() {
                servers.extend(upstreams(&a.text)?);
            }
            self.report.translated(sub.loc(), "to");
        }
        if servers.is_empty() {
            return Err("no upstream (dynamic upstreams are not supported)".into());
        }
        let mut g = Section::from(l.loc());
        let single = (servers.len() == 1).then(|| servers[0].addr.clone());
        g.set(
            "servers",
            Value::Array(servers.iter().map(|s| server_entry(&s.addr)).collect()),
        );
        if servers.iter().any(|s| s.h2c) {
            g.set("protocol", "h2c");
        }
        let mut b = Build {
            g,
            single,
            ..Default::default()
        };
        if !self.trusted_proxies {
            // Caddy replaces an untrusted client's X-Forwarded-For; veloxy appends to it.
            b.rules
                .req
                .set
                .insert("X-Forwarded-For".into(), "{client_ip}".into());
        }
        for sub in l.body() {
            let vals: Vec<&str> = sub.args().iter().map(|t| t.text.as_str()).collect();
            let r = self.proxy_option(sub, &vals, &mut b);
            self.report_option(sub, r, &mut b);
        }
        let Build {
            mut g,
            rules,
            health,
            outlier,
            ..
        } = b.finish(servers.len());
        if !health.is_empty() {
            g.set("health", Value::Table(health));
        }
        if !outlier.is_empty() {
            g.set("outlier", Value::Table(outlier));
        }
        let mut diffs: Vec<String> = Vec::new();
        let base = name_for(&servers[0].addr);
        let name = self.group(&base, g);
        let _ = scope;
        diffs.push(
            "Caddy's upstream requests carry Accept-Encoding: gzip when the client sent none \
             (Go adds it and decodes the answer), and answers without a Content-Type get a \
             sniffed one; veloxy forwards both as they are"
                .into(),
        );
        let diff = Some(diffs.join("; "));
        Ok((Action::Proxy(name), rules, diff))
    }

    /// Reports one option of the block.
    fn report_option(&mut self, sub: &Line, r: Opt, b: &mut Build) {
        match r {
            Opt::Done if sub.name() == "header_down" => self.report.different(
                sub.loc(),
                "header_down",
                "veloxy applies it to every answer of the route, its own errors included (Caddy: the upstream's answers)",
            ),
            Opt::Done => self.report.translated(sub.loc(), sub.name()),
            Opt::Different(d) => self.report.different(sub.loc(), sub.name(), d),
            Opt::Ignored(w) => self.report.ignored(sub.loc(), sub.name(), w),
            Opt::Refused(w) => self.report.refused(sub.loc(), sub.name(), w),
            Opt::Passive => {
                b.passive = true;
                self.report.different(
                    sub.loc(),
                    sub.name(),
                    "veloxy ejects a backend after that many consecutive failures (for base_ejection, doubling when it fails again), where Caddy counts failures within the window",
                );
            }
            Opt::Retries(n, d) => {
                b.retries = Some(n);
                match d {
                    Some(d) => self.report.different(sub.loc(), sub.name(), d),
                    None => self.report.translated(sub.loc(), sub.name()),
                }
            }
            Opt::Skip => {}
        }
    }

    /// Adds group `g` under a name based on `base`, or reuses an identical group.
    pub fn group(&mut self, base: &str, g: Section) -> String {
        if let Some((n, _)) = self.cfg.upstreams.iter().find(|(_, s)| s.keys == g.keys) {
            return n.clone();
        }
        let name = Config::unique(&self.cfg.upstreams, base);
        self.cfg.upstreams.push((name.clone(), g));
        name
    }

    /// One option of the `reverse_proxy` block.
    fn proxy_option(&mut self, sub: &Line, vals: &[&str], b: &mut Build) -> Opt {
        let (g, rules, health, outlier, single) = (
            &mut b.g,
            &mut b.rules,
            &mut b.health,
            &mut b.outlier,
            b.single.as_deref(),
        );
        let first = vals.first().copied().unwrap_or("");
        match sub.name() {
            "to" => Opt::Skip,
            "lb_policy" => lb_policy(vals, g),
            "lb_retries" => match first.parse::<u32>() {
                Ok(n) => Opt::Retries(n, None),
                Err(_) => Opt::Refused(format!("lb_retries {first}")),
            },
            "lb_try_duration" => Opt::Retries(
                2,
                Some("veloxy retries a failed attempt on up to 2 other backends at once, not for a duration".into()),
            ),
            "lb_try_interval" => Opt::Ignored("veloxy retries at once on another backend".into()),
            "health_uri" | "health_path" => {
                health.insert("path".into(), first.into());
                Opt::Done
            }
            "health_interval" => dur(health, "interval", first),
            "health_timeout" => dur(health, "timeout", first),
            "health_status" => {
                let s = match first {
                    "2xx" => "200-299".to_string(),
                    "3xx" => "300-399".to_string(),
                    s if s.parse::<u16>().is_ok() => s.to_string(),
                    s => return Opt::Refused(format!("health_status {s}")),
                };
                health.insert("expect_status".into(), s.into());
                Opt::Done
            }
            "health_headers" => {
                for h in sub.body() {
                    if h.name().eq_ignore_ascii_case("host") && h.args().len() == 1 {
                        health.insert("host".into(), h.args()[0].text.clone().into());
                    } else {
                        return Opt::Refused(format!("health check header {} (veloxy's checks set only Host)", h.name()));
                    }
                }
                Opt::Done
            }
            "health_port" => Opt::Refused("health_port (veloxy checks each backend on its own port)".into()),
            "health_body" => Opt::Refused("health_body (veloxy checks the status only)".into()),
            "health_passes" | "health_fails" => Opt::Skip,
            "fail_duration" => match super::duration(first) {
                Some(d) => {
                    outlier.insert("base_ejection".into(), d.into());
                    outlier.entry("consecutive_failures").or_insert(1.into());
                    outlier.entry("on_5xx").or_insert(false.into());
                    Opt::Passive
                }
                None => Opt::Refused(format!("fail_duration {first}")),
            },
            "max_fails" => match first.parse::<u32>() {
                Ok(n) => {
                    outlier.insert("consecutive_failures".into(), n.into());
                    Opt::Done
                }
                Err(_) => Opt::Refused(format!("max_fails {first}")),
            },
            "unhealthy_status" => {
                if vals.iter().all(|v| v.starts_with('5')) {
                    outlier.insert("on_5xx".into(), true.into());
                    Opt::Different("veloxy counts every 5xx as a failure".into())
                } else {
                    Opt::Refused(format!("unhealthy_status {}", vals.join(" ")))
                }
            }
            "unhealthy_latency" | "unhealthy_request_count" => {
                Opt::Refused(format!("{} (veloxy's passive checks count failures)", sub.name()))
            }
            "header_up" => header_op(&mut rules.req, vals, single),
            "header_down" => header_op(&mut rules.resp, vals, single),
            "transport" => self.transport(sub, vals, g),
            "flush_interval" | "buffer_requests" | "buffer_responses" | "request_buffers"
            | "response_buffers" | "stream_timeout" | "stream_close_delay" => {
                Opt::Ignored("veloxy streams bodies both ways as they arrive".into())
            }
            "trusted_proxies" => Opt::Refused("trusted_proxies on reverse_proxy (veloxy's is [server] trusted_proxies)".into()),
            other => Opt::Refused(format!("reverse_proxy {other}")),
        }
    }
}

/// A `reverse_proxy` being translated: its group, its route rules, its health settings.
#[derive(Default)]
pub struct Build {
    g: Section,
    rules: Rules,
    health: toml::Table,
    outlier: toml::Table,
    passive: bool,
    retries: Option<u32>,
    /// The one server's address (for `{upstream_hostport}`).
    single: Option<String>,
}

impl Build {
    /// Caddy's defaults where they differ from veloxy's: checks every 30s (5s timeout, 2xx,
    /// one result flips a backend), no retries and no passive ejection across several
    /// servers.
    fn finish(mut self, servers: usize) -> Self {
        let h = &mut self.health;
        if !h.is_empty() {
            h.entry("interval").or_insert("30s".into());
            h.entry("timeout").or_insert("5s".into());
            h.entry("expect_status").or_insert("200-299".into());
            h.insert("healthy".into(), 1.into());
            h.insert("unhealthy".into(), 1.into());
        }
        if servers > 1 {
            self.g.set("retries", self.retries.unwrap_or(0));
            if !self.passive {
                self.outlier.insert("consecutive_failures".into(), 0.into());
            }
        } else if let Some(n) = self.retries {
            self.g.set("retries", n);
        }
        self
    }
}

/// What became of one `reverse_proxy` option.
pub enum Opt {
    Done,
    Different(String),
    Ignored(String),
    Refused(String),
    Passive,
    Retries(u32, Option<String>),
    Skip,
}
