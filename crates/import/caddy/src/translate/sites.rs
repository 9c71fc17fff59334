//! Site blocks: addresses, listeners, Caddy's automatic HTTPS (certificates from ACME for
//! public names, the HTTP -> HTTPS redirect on the HTTP port), `tls`, `bind` and `log`.
//!
//! Names Caddy serves with its local CA (`localhost`, `*.localhost`, `.local`, `.internal`,
//! `.home.arpa`, IP addresses, `tls internal`, the `local_certs` option) are refused: a veloxy
//! config names its certificate files and has no local CA of its own. The site's routes are
//! still written, on a plain HTTP listener of that port with a comment saying so; give the
//! site `tls CERT KEY` (or an `http://` address) to import it fully.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Loc, Section};

use super::flow::{Emitted, Scope};
use super::matcher::{path_cond, Cond};
use super::{report_nested, T};
use crate::lexer::Token;
use crate::parse::{Line, Site};

/// One site address.
#[derive(Debug, Clone)]
struct Addr {
    scheme: String,
    host: String,
    port: u16,
    path: Option<String>,
    loc: Loc,
}

/// A listener being built.
#[derive(Debug, Default)]
struct Lst {
    tls: bool,
    bind: Option<String>,
    acme: Vec<String>,
    certs: Vec<(Vec<String>, String, String)>,
    refused_tls: bool,
    from: Vec<Loc>,
    /// Plain sites on it (the HTTP port then has routes, not only redirects).
    has_sites: bool,
}

/// A site's routes and the listeners they are on.
struct Built {
    routes: Vec<Emitted>,
    ports: Vec<u16>,
}

impl T<'_> {
    /// Every site, then the listeners and the redirect.
    pub fn sites(&mut self, sites: &[Site]) {
        let mut lst: BTreeMap<u16, Lst> = BTreeMap::new();
        let mut built = Vec::new();
        // HTTPS hosts needing the HTTP -> HTTPS redirect, with their HTTPS port.
        let mut redirects: Vec<(String, u16, Loc)> = Vec::new();
        for s in sites {
            if let Some(b) = self.site(s, &mut lst, &mut redirects) {
                built.push(b);
            }
        }
        let redirect_ok = self.auto_https == "on" || self.auto_https == "disable_certs";
        if redirect_ok && !redirects.is_empty() {
            let hp = self.http_port;
            let l = lst.entry(hp).or_default();
            if l.from.is_empty() {
                l.from.push(redirects[0].2.clone());
            }
        }
        let names: BTreeMap<u16, String> = lst
            .iter()
            .map(|(p, l)| {
                let n = match (p, l.tls) {
                    (443, true) => "https".to_string(),
                    (80, false) => "http".to_string(),
                    (p, true) => format!("https_{p}"),
                    (p, false) => format!("http_{p}"),
                };
                (*p, n)
            })
            .collect();
        let http_sites = lst.get(&self.http_port).is_some_and(|l| l.has_sites);
        let mut redirect_routes = Vec::new();
        for (port, l) in &lst {
            let name = &names[port];
            let mut sec = Section::default();
            for f in &l.from {
                sec.add_from(f);
            }
            let host = l.bind.clone().unwrap_or_default();
            sec.set("addr", format!("{host}:{port}"));
            if *port == self.http_port && !redirects.is_empty() && redirect_ok && !http_sites {
                sec.set("redirect_https", true);
                let ports: Vec<u16> = redirects.iter().map(|r| r.1).collect();
                if ports.iter().all(|p| *p == ports[0]) && ports[0] != 443 {
                    sec.set("https_port", i64::from(ports[0]));
                }
            } else if *port == self.http_port && !redirects.is_empty() && redirect_ok {
                redirect_routes = redirects.clone();
            }
            if l.tls {
                sec.set("http3", true);
                let mut tls = toml::Table::new();
                let mut certs = l.certs.iter();
                if let Some((hosts, cert, key)) = certs.next() {
                    let _ = hosts;
                    tls.insert("cert".into(), cert.clone().into());
                    tls.insert("key".into(), key.clone().into());
                }
                if !l.acme.is_empty() {
                    tls.insert(
                        "acme".into(),
                        Value::Array(l.acme.iter().cloned().map(Value::String).collect()),
                    );
                }
                let more: Vec<Value> = certs
                    .map(|(h, c, k)| {
                        let mut t = toml::Table::new();
                        t.insert(
                            "hosts".into(),
                            Value::Array(h.iter().cloned().map(Value::String).collect()),
                        );
                        t.insert("cert".into(), c.clone().into());
                        t.insert("key".into(), k.clone().into());
                        Value::Table(t)
                    })
                    .collect();
                if !more.is_empty() {
                    tls.insert("certs".into(), Value::Array(more));
                }
                sec.set("tls", Value::Table(tls));
            }
            if l.refused_tls && !l.tls {
                sec.comments.push("Caddy serves this port over HTTPS with its local CA (refused, see the report): plain HTTP here".into());
            }
            self.cfg.listeners.push((name.clone(), sec));
        }
        let serving: Vec<&String> = lst
            .iter()
            .filter(|(p, l)| {
                l.has_sites
                    || l.tls
                    || l.refused_tls
                    || **p != self.http_port
                    || redirects.is_empty()
            })
            .map(|(p, _)| &names[p])
            .collect();
        let many = serving.len() > 1 || (!redirect_routes.is_empty());
        for b in built {
            let on: Vec<String> = b.ports.iter().map(|p| names[p].clone()).collect();
            for e in b.routes {
                let listeners = if many { on.clone() } else { Vec::new() };
                let sec = self.route_section(&e, &listeners);
                self.add_route(sec);
            }
        }
        for (host, port, loc) in redirect_routes {
            let mut sec = Section::from(&loc);
            sec.set("listener", names[&self.http_port].clone());
            sec.set("host", host);
            let to = if port == 443 {
                "https://{host}{uri}".to_string()
            } else {
                format!("https://{{host}}:{port}{{uri}}")
            };
            let mut r = toml::Table::new();
            r.insert("to".into(), to.into());
            sec.set("redirect", Value::Table(r));
            self.add_route(sec);
        }
    }

    /// One site block: its listeners' material, and its routes.
    fn site(
        &mut self,
        s: &Site,
        lst: &mut BTreeMap<u16, Lst>,
        redirects: &mut Vec<(String, u16, Loc)>,
    ) -> Option<Built> {
        let first = s.addrs.first()?;
        let mut addrs = Vec::new();
        for a in &s.addrs {
            let text = match self.opts.expand_env(&a.text) {
                Ok(t) => t,
                Err(e) => return self.refuse_site(s, a, &e),
            };
            match parse_addr(&text, a, self.http_port, self.https_port) {
                Ok(x) => addrs.push(x),
                Err(e) => return self.refuse_site(s, a, &e),
            }
        }
        let tls_line = s.body.iter().find(|l| l.name() == "tls");
        let files = tls_line.and_then(|l| match l.args() {
            [c, k, ..] if !c.text.contains('@') && c.text != "internal" => {
                Some((self.path(&c.text), self.path(&k.text)))
            }
            _ => None,
        });
        let internal =
            tls_line.is_some_and(|l| l.args().first().is_some_and(|a| a.text == "internal"));
        let bind = s
            .body
            .iter()
            .find(|l| l.name() == "bind")
            .and_then(|l| l.args().first())
            .map(|t| t.text.clone());
        if let Some(b) = s.body.iter().find(|l| l.name() == "bind") {
            match b.args() {
                [_] => self.report.translated(b.loc(), "bind"),
                _ => self.report.refused(
                    b.loc(),
                    "bind",
                    "several bind addresses (veloxy's listener has one)",
                ),
            }
        }
        let mut ports = Vec::new();
        let mut hosts: Vec<String> = Vec::new();
        let mut any_host = false;
        for a in &addrs {
            let tls = match a.scheme.as_str() {
                "http" => false,
                "https" => true,
                _ => {
                    a.port != self.http_port
                        && (!a.host.is_empty() || tls_line.is_some())
                        && self.auto_https != "off"
                        || (files.is_some() && a.port != self.http_port)
                }
            };
            let l = lst.entry(a.port).or_default();
            if !l
                .from
                .iter()
                .any(|f| f.file == a.loc.file && f.line == a.loc.line)
            {
                l.from.push(a.loc.clone());
            }
            if bind.is_some() {
                l.bind.clone_from(&bind);
            }
            if !ports.contains(&a.port) {
                ports.push(a.port);
            }
            if a.host.is_empty() {
                any_host = true;
            } else if !hosts.contains(&a.host) {
                hosts.push(a.host.clone());
            }
            if !tls {
                l.has_sites = true;
                self.report.translated(&a.loc, a_text(a));
                continue;
            }
            let local = internal || self.local_certs || is_local(&a.host);
            if let Some((c, k)) = &files {
                l.tls = true;
                let hs = if a.host.is_empty() {
                    vec![]
                } else {
                    vec![a.host.clone()]
                };
                match l.certs.iter_mut().find(|(_, c2, k2)| c2 == c && k2 == k) {
                    Some((h, _, _)) => h.extend(hs),
                    None => l.certs.push((hs, c.clone(), k.clone())),
                }
                self.report.translated(&a.loc, a_text(a));
            } else if local || a.host.is_empty() {
                l.refused_tls = true;
                l.has_sites = true;
                self.report.refused(&a.loc, a_text(a), format!("Caddy serves {} over HTTPS with a certificate from its local CA; a veloxy config has no local CA: give the site `tls CERT KEY` (or an http:// address)", if a.host.is_empty() { "this site" } else { &a.host }));
                continue;
            } else if a.host.contains('*') {
                l.tls = true;
                self.report.refused(&a.loc, a_text(a), "a wildcard certificate needs the ACME DNS-01 challenge, which veloxy lacks: give the site `tls CERT KEY`");
            } else {
                l.tls = true;
                if self.auto_https != "disable_certs" && !l.acme.contains(&a.host) {
                    l.acme.push(a.host.clone());
                }
                self.report.translated(&a.loc, a_text(a));
            }
            if !a.host.is_empty() {
                redirects.push((a.host.clone(), a.port, a.loc.clone()));
            }
        }
        if let Some(l) = tls_line {
            self.tls_directive(l, files.is_some());
        }
        for l in s.body.iter().filter(|l| l.name() == "log") {
            self.log(l);
        }
        let mut scope = Scope::default();
        // An address without a host takes every host.
        scope.cond.hosts = if any_host { vec![] } else { hosts };
        if let Some(p) = addrs.iter().find_map(|a| a.path.clone()) {
            scope.cond.path = path_cond(&p);
        }
        let mut routes = Vec::new();
        let all = self.walk(&s.body, &scope, true, &mut routes);
        if !all {
            routes.push(Emitted {
                cond: scope.cond.clone(),
                rules: Default::default(),
                action: super::flow::Action::Respond(200, String::new(), None),
                from: vec![first.loc.clone()],
                comment: Some(
                    "Caddy answers requests no directive handles with an empty 200".into(),
                ),
            });
        }
        Some(Built { routes, ports })
    }

    fn refuse_site(&mut self, s: &Site, a: &Token, why: &str) -> Option<Built> {
        self.report.refused(&a.loc, a.text.clone(), why.to_string());
        report_nested(self, &s.body, "its site's address is refused");
        None
    }

    /// `tls email | cert key | internal | { ... }`.
    fn tls_directive(&mut self, l: &Line, files: bool) {
        let args: Vec<&str> = l.args().iter().map(|t| t.text.as_str()).collect();
        match args.as_slice() {
            [email] if email.contains('@') => {
                self.acme().insert("email".into(), (*email).into());
                self.report.translated(l.loc(), "tls");
            }
            ["internal"] => self.report.refused(
                l.loc(),
                "tls",
                "tls internal: Caddy's local CA (a veloxy config names its certificate files)",
            ),
            _ if files => self.report.translated(l.loc(), "tls"),
            [] => self.report.translated(l.loc(), "tls"),
            other => self
                .report
                .refused(l.loc(), "tls", format!("tls {}", other.join(" "))),
        }
        for sub in l.body() {
            let v: Vec<&str> = sub.args().iter().map(|t| t.text.as_str()).collect();
            let name = sub.name();
            match name {
                "protocols" if v.iter().all(|p| *p == "tls1.2" || *p == "tls1.3") => {
                    self.report.translated(sub.loc(), name)
                }
                "ca" => {
                    self.acme()
                        .insert("directory".into(), v.first().copied().unwrap_or("").into());
                    self.report.translated(sub.loc(), name);
                }
                "ca_root" => {
                    let p = self.path(v.first().copied().unwrap_or(""));
                    self.acme().insert("ca_file".into(), p.into());
                    self.report.translated(sub.loc(), name);
                }
                "key_type" | "alpn" | "resolvers" | "propagation_timeout" | "propagation_delay" => {
                    self.report
                        .ignored(sub.loc(), name, "no effect on what clients see")
                }
                "ciphers" | "curves" => self.report.different(
                    sub.loc(),
                    name,
                    "veloxy offers rustls's default suites and groups",
                ),
                "dns" => self.report.refused(
                    sub.loc(),
                    name,
                    "the ACME DNS-01 challenge (veloxy's ACME uses tls-alpn-01 and http-01)",
                ),
                "on_demand" => self.report.refused(
                    sub.loc(),
                    name,
                    "on-demand certificates (veloxy obtains certificates for configured names)",
                ),
                "client_auth" => {
                    self.report
                        .refused(sub.loc(), name, "client certificate authentication (mTLS)")
                }
                other => self
                    .report
                    .refused(sub.loc(), other, format!("tls {other}")),
            }
        }
    }

    /// `log { output file PATH | stdout | stderr; format json|console }`: the access log.
    fn log(&mut self, l: &Line) {
        let mut path = "stdout".to_string();
        let mut diff =
            vec!["veloxy's access log is one for every site, with its own fields".to_string()];
        for sub in l.body() {
            let v: Vec<&str> = sub.args().iter().map(|t| t.text.as_str()).collect();
            match (sub.name(), v.as_slice()) {
                ("output", ["file", p, ..]) => path = self.path(p),
                ("output", ["stdout"]) => {}
                ("output", ["stderr"]) => diff.push("written to stdout, not stderr".into()),
                ("format", _) | ("level", _) => {}
                _ => diff.push(format!("{} ignored", sub.name())),
            }
        }
        if l.body().iter().all(|s| s.name() != "output") {
            diff.push("written to stdout, not stderr".into());
        }
        let t = self.cfg.server.table("access_log");
        t.insert("path".into(), path.into());
        t.insert("format".into(), "json".into());
        self.report.different(l.loc(), "log", diff.join("; "));
    }

    fn add_route(&mut self, sec: Section) {
        if let Some(prev) = self.cfg.routes.iter_mut().find(|r| r.keys == sec.keys) {
            for f in &sec.from {
                prev.add_from(f);
            }
            return;
        }
        self.cfg.routes.push(sec);
    }
}

fn a_text(a: &Addr) -> String {
    if a.host.is_empty() {
        format!("site :{}", a.port)
    } else {
        format!("site {}", a.host)
    }
}

/// Names Caddy gives certificates from its local CA.
fn is_local(host: &str) -> bool {
    let h = host.trim_start_matches("*.");
    h == "localhost"
        || h.ends_with(".localhost")
        || h.ends_with(".local")
        || h.ends_with(".internal")
        || h.ends_with(".home.arpa")
        || h.trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok()
}

/// `[scheme://][host][:port][/path]`.
fn parse_addr(text: &str, tok: &Token, http_port: u16, https_port: u16) -> Result<Addr, String> {
    let (scheme, rest) = match text.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => (String::new(), text),
    };
    if !scheme.is_empty() && scheme != "http" && scheme != "https" {
        return Err(format!(
            "site address scheme {scheme}:// (veloxy serves HTTP and HTTPS)"
        ));
    }
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_string())),
        None => (rest, None),
    };
    let (host, port) = if hostport.starts_with('[') {
        match hostport.find(']') {
            Some(i) => (&hostport[..=i], hostport[i + 1..].strip_prefix(':')),
            None => return Err(format!("site address {text}")),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("site address port {p}"))?,
        None if scheme == "http" => http_port,
        None if scheme.is_empty() && host.is_empty() => http_port,
        None => https_port,
    };
    if host.contains('{') {
        return Err(format!("site address {text} with a placeholder"));
    }
    Ok(Addr {
        scheme,
        host: host.to_ascii_lowercase(),
        port,
        path,
        loc: tok.loc.clone(),
    })
}

/// The route's conditions and the site's listeners as keys (used by output).
pub fn cond_keys(sec: &mut Section, c: &Cond, listeners: &[String]) {
    match listeners {
        [] => {}
        [one] => {
            sec.set("listener", one.clone());
        }
        many => {
            sec.set(
                "listener",
                Value::Array(many.iter().cloned().map(Value::String).collect()),
            );
        }
    }
    match c.hosts.as_slice() {
        [] => {}
        [one] => {
            sec.set("host", one.clone());
        }
        many => {
            sec.set(
                "host",
                Value::Array(many.iter().cloned().map(Value::String).collect()),
            );
        }
    }
    match &c.path {
        super::matcher::PathCond::Any => {}
        super::matcher::PathCond::Prefix(p) => {
            sec.set("path", p.clone());
        }
        super::matcher::PathCond::Exact(p) => {
            sec.set("path_exact", p.clone());
        }
        super::matcher::PathCond::Regex(p) => {
            sec.set("path_regex", p.clone());
        }
    }
    if !c.methods.is_empty() {
        sec.set(
            "methods",
            Value::Array(c.methods.iter().cloned().map(Value::String).collect()),
        );
    }
    for (k, m) in [("headers", &c.headers), ("query", &c.query)] {
        if !m.is_empty() {
            sec.set(
                k,
                Value::Table(
                    m.iter()
                        .map(|(a, b)| (a.clone(), Value::String(b.clone())))
                        .collect(),
                ),
            );
        }
    }
}
