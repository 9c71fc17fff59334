//! `upstream` blocks and `proxy_pass`/`grpc_pass` targets as veloxy upstream groups.
//!
//! A group carries what nginx sets per location (timeouts, TLS verification, retries), so
//! locations that reach one nginx upstream with different settings get one group each
//! (`api`, `api_2`). Every group states nginx's defaults where veloxy's differ: timeouts of
//! 60 s, no retry on an upstream's 5xx answer, and (for several servers) nginx's passive
//! check, `max_fails=1 fail_timeout=10s` counting errors and timeouts only.

use toml::Value;
use veloxy_import::{Config, Loc};

use super::{Level, Tr};
use crate::parse::Directive;

/// One `server` line of an upstream block.
#[derive(Debug, Clone)]
pub struct Server {
    addr: String,
    weight: u32,
    backup: bool,
    max_fails: Option<u32>,
    fail_timeout: Option<String>,
}

/// A parsed `upstream` block.
#[derive(Debug, Clone)]
pub struct Block {
    loc: Loc,
    servers: Vec<Server>,
    policy: Option<&'static str>,
    hash_key: Option<String>,
    keepalive: Option<u32>,
    /// Whether a location uses it.
    used: bool,
}

/// Pass 1: parses an `upstream` block and reports its directives.
pub fn collect<'a>(tr: &mut Tr<'a>, d: &'a Directive) {
    let mut b = Block {
        loc: d.loc.clone(),
        servers: Vec::new(),
        policy: None,
        hash_key: None,
        keepalive: None,
        used: false,
    };
    for c in tr.flat(d.children()) {
        let loc = &c.loc;
        match c.name.as_str() {
            "server" => server_line(tr, c, &mut b),
            "least_conn" => {
                b.policy = Some("least_conn");
                tr.rep.translated(loc, "least_conn");
            }
            "random" => {
                b.policy = Some("random");
                if c.args.is_empty() {
                    tr.rep.translated(loc, "random");
                } else {
                    tr.rep.different(
                        loc,
                        "random",
                        "veloxy picks one server at random (weighted), not the better of two",
                    );
                }
            }
            "ip_hash" => {
                b.policy = Some("consistent_hash");
                b.hash_key = Some("client_ip".into());
                tr.rep.different(loc, "ip_hash", "veloxy hashes the whole client address (nginx: the first three octets of IPv4), with a consistent hash");
            }
            "hash" => {
                let key = match c.arg(0) {
                    "$remote_addr" | "$binary_remote_addr" => Some("client_ip".to_string()),
                    "$request_uri" | "$uri" => Some("path".to_string()),
                    k => k
                        .strip_prefix("$http_")
                        .map(|h| format!("header:{}", h.replace('_', "-")))
                        .or_else(|| k.strip_prefix("$cookie_").map(|h| format!("cookie:{h}"))),
                };
                match key {
                    Some(k) => {
                        b.policy = Some("consistent_hash");
                        b.hash_key = Some(k);
                        if c.arg(1) == "consistent" {
                            tr.rep.translated(loc, "hash");
                        } else {
                            tr.rep.different(loc, "hash", "veloxy's hash is consistent (Maglev): keys map to other servers than nginx's");
                        }
                    }
                    None => tr.rep.refused(loc, "hash", format!("the key {}: veloxy hashes the client address, the path, a header or a cookie", c.arg(0))),
                }
            }
            "keepalive" => {
                b.keepalive = c.arg(0).parse().ok();
                tr.rep.translated(loc, "keepalive");
            }
            "keepalive_timeout" | "keepalive_time" | "keepalive_requests" => {
                tr.rep
                    .ignored(loc, &c.name, "upstream connection reuse tuning")
            }
            "zone" => tr.rep.ignored(
                loc,
                "zone",
                "veloxy shares upstream state between workers itself",
            ),
            "sticky" => tr.rep.refused(
                loc,
                "sticky",
                "nginx Plus sticky: use veloxy's sticky cookie by hand",
            ),
            _ => tr.unknown(c),
        }
    }
    tr.upstream_blocks.insert(d.arg(0).to_string(), b);
}

fn server_line(tr: &mut Tr<'_>, c: &Directive, b: &mut Block) {
    let mut s = Server {
        addr: c.arg(0).to_string(),
        weight: 1,
        backup: false,
        max_fails: None,
        fail_timeout: None,
    };
    let mut diffs = Vec::new();
    for a in c.args.iter().skip(1) {
        let t = a.text.as_str();
        if let Some(w) = t.strip_prefix("weight=") {
            s.weight = w.parse().unwrap_or(1);
        } else if let Some(m) = t.strip_prefix("max_fails=") {
            s.max_fails = m.parse().ok();
        } else if let Some(f) = t.strip_prefix("fail_timeout=") {
            s.fail_timeout = crate::vars::duration(f);
        } else if t == "down" {
            tr.rep.translated(&c.loc, "server");
            return;
        } else if t == "backup" {
            s.backup = true;
        } else if t == "resolve" {
            diffs.push("names are resolved again every 10s (dns server entry)");
        } else if t.starts_with("max_conns=") {
            diffs.push("max_conns is per group in veloxy (max_connections) and is not translated");
        }
    }
    if !s.addr.contains(':') && !s.addr.starts_with("unix:") {
        s.addr.push_str(":80");
    }
    if diffs.is_empty() {
        tr.rep.translated(&c.loc, "server");
    } else {
        tr.rep.different(&c.loc, "server", diffs.join("; "));
    }
    b.servers.push(s);
}

/// Where a `proxy_pass` goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// An `upstream` block's name, or `host:port`.
    pub host: String,
    /// `https://` / `grpcs://`.
    pub tls: bool,
    /// `grpc_pass`: HTTP/2.
    pub grpc: bool,
}

impl Tr<'_> {
    /// The veloxy group for `target` with the settings of `lvl`, created on first use;
    /// also the differences to report on the proxy_pass line.
    pub fn group(&mut self, t: &Target, lvl: &Level, loc: &Loc) -> (String, Vec<String>) {
        let mut diffs = Vec::new();
        let key = format!(
            "{}|{}|{}|{:?}|{}|{:?}|{:?}|{}",
            t.host,
            t.tls,
            t.grpc,
            lvl.timeouts,
            lvl.ssl_verify,
            lvl.ssl_ca,
            lvl.ssl_name,
            lvl.no_retry
        );
        if t.tls && !lvl.ssl_verify {
            diffs.push("veloxy verifies the backend's certificate (nginx's proxy_ssl_verify is off by default)".to_string());
        }
        if let Some(name) = self.groups.get(&key) {
            return (name.clone(), diffs);
        }
        let block = self.upstream_blocks.get_mut(&t.host).map(|b| {
            b.used = true;
            b.clone()
        });
        let base = match &block {
            Some(_) => t.host.clone(),
            None => {
                let (h, port) = t.host.rsplit_once(':').unwrap_or((&t.host, ""));
                if h.parse::<std::net::IpAddr>().is_ok() || h.starts_with('[') || h == "localhost" {
                    format!("backend_{port}")
                } else if h.starts_with("unix") {
                    "backend_unix".to_string()
                } else {
                    h.to_string()
                }
            }
        };
        let name = Config::unique(&self.cfg.upstreams, &base);
        let from = block.as_ref().map_or(loc, |b| &b.loc).clone();
        let s = self.cfg.upstream(&name, &from);
        let scheme = if t.tls { "https://" } else { "" };
        let servers: Vec<Server> = match &block {
            Some(b) => b.servers.clone(),
            None => vec![Server {
                addr: t.host.clone(),
                weight: 1,
                backup: false,
                max_fails: None,
                fail_timeout: None,
            }],
        };
        let list: Vec<Value> = servers
            .iter()
            .map(|sv| {
                let addr = if sv.addr.starts_with("unix:") {
                    sv.addr.clone()
                } else {
                    format!("{scheme}{}", sv.addr)
                };
                if sv.weight == 1 && !sv.backup {
                    Value::from(addr)
                } else {
                    let mut tb = toml::Table::new();
                    tb.insert("addr".into(), addr.into());
                    if sv.weight != 1 {
                        tb.insert("weight".into(), Value::from(i64::from(sv.weight)));
                    }
                    if sv.backup {
                        tb.insert("backup".into(), Value::from(true));
                    }
                    Value::Table(tb)
                }
            })
            .collect();
        s.set("servers", Value::Array(list));
        if let Some(b) = &block {
            if let Some(p) = b.policy {
                s.set("policy", p);
            }
            if let Some(k) = &b.hash_key {
                s.set("hash_key", k.as_str());
            }
            if let Some(k) = b.keepalive {
                s.set("keepalive", i64::from(k));
            }
        }
        if t.grpc {
            s.set("protocol", if t.tls { "h2" } else { "h2c" });
        }
        for (i, k) in ["connect_timeout", "read_timeout", "write_timeout"]
            .iter()
            .enumerate()
        {
            s.set(k, lvl.timeouts[i].clone().unwrap_or_else(|| "1m".into()));
        }
        if let Some(ca) = &lvl.ssl_ca {
            s.set("ca_file", ca.as_str());
        }
        if let Some(n) = &lvl.ssl_name {
            s.set("tls_server_name", n.as_str());
        }
        if servers.len() > 1 {
            if lvl.no_retry {
                s.set("retries", 0);
            }
            s.set("retry_on", Value::Array(Vec::new()));
            let fails = servers[0].max_fails.unwrap_or(1);
            let timeout = servers[0]
                .fail_timeout
                .clone()
                .unwrap_or_else(|| "10s".into());
            let mut o = toml::Table::new();
            o.insert("consecutive_failures".into(), Value::from(i64::from(fails)));
            o.insert("base_ejection".into(), timeout.clone().into());
            o.insert("max_ejection".into(), timeout.into());
            o.insert("on_5xx".into(), false.into());
            s.set("outlier", Value::Table(o));
        }
        self.groups.insert(key, name.clone());
        (name, diffs)
    }

    /// Reports each `upstream` block: translated when a location uses it.
    pub(crate) fn finish_upstreams(&mut self) {
        let blocks: Vec<(String, Block)> = std::mem::take(&mut self.upstream_blocks)
            .into_iter()
            .collect();
        for (name, b) in blocks {
            if b.used {
                self.rep.translated(&b.loc, "upstream");
            } else if !self.stream_upstream_used(&name) {
                self.rep
                    .ignored(&b.loc, "upstream", format!("{name} is used by no location"));
            }
        }
    }

    fn stream_upstream_used(&self, name: &str) -> bool {
        self.cfg.upstreams.iter().any(|(n, _)| n == name)
    }

    /// Whether `host` names an upstream block (a group of servers).
    pub fn is_block(&self, host: &str) -> bool {
        self.upstream_blocks.contains_key(host)
    }

    /// The servers of block `host` (for a stream group).
    pub fn block_servers(&mut self, host: &str) -> Option<(Loc, Vec<String>)> {
        let b = self.upstream_blocks.get_mut(host)?;
        b.used = true;
        Some((
            b.loc.clone(),
            b.servers.iter().map(|s| s.addr.clone()).collect(),
        ))
    }
}
