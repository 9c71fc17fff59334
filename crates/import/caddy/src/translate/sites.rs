//! Site blocks: addresses, listeners, Caddy's automatic HTTPS (certificates from ACME for
//! public names, the HTTP -> HTTPS redirect on the HTTP port, and what `auto_https` turns
//! off), `tls`, `bind` and `log`.
//!
//! Names Caddy serves with its local CA (`localhost`, `*.localhost`, `.local`, `.internal`,
//! `.home.arpa`, IP addresses, `tls internal`, the `local_certs` option) are refused: a veloxy
//! config names its certificate files and cannot ask for a local CA (the refusal says what to
//! run instead). The site's routes are still written, on a plain HTTP listener of that port
//! with a comment saying so. `http://` sites are plain HTTP in both.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Loc, Section};

use super::addr::{a_text, is_local, local_ca_refusal, parse_addr, Addr};
use super::flow::{Action, Emitted, Scope};
use super::matcher::path_cond;
use super::{report_nested, T};
use crate::lexer::Token;
use crate::parse::{Line, Site};

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

/// What a site's `tls` and `bind` lines say.
struct SiteTls<'l> {
    line: Option<&'l Line>,
    /// `tls CERT KEY`, as written in the output.
    files: Option<(String, String)>,
    internal: bool,
    bind: Option<String>,
}

/// HTTPS names the HTTP port redirects: host, HTTPS port, where.
type Redirects = Vec<(String, u16, Loc)>;

impl T<'_> {
    /// Every site, then the listeners and the redirect.
    pub fn sites(&mut self, sites: &[Site]) {
        let mut lst: BTreeMap<u16, Lst> = BTreeMap::new();
        let mut built = Vec::new();
        let mut redirects: Redirects = Vec::new();
        for s in sites {
            if let Some(b) = self.site(s, &mut lst, &mut redirects) {
                built.push(b);
            }
        }
        self.report_auto_https(&lst);
        if !matches!(
            self.auto_https.as_str(),
            "on" | "disable_certs" | "ignore_loaded_certs"
        ) {
            redirects.clear();
        }
        if let Some(first) = redirects.first() {
            let l = lst.entry(self.http_port).or_default();
            if l.from.is_empty() {
                l.from.push(first.2.clone());
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
        let redirect_routes = self.listeners(&lst, &names, &redirects);
        let serving = lst
            .iter()
            .filter(|(p, l)| {
                l.has_sites
                    || l.tls
                    || l.refused_tls
                    || **p != self.http_port
                    || redirects.is_empty()
            })
            .count();
        let many = serving > 1 || !redirect_routes.is_empty();
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

    /// The `auto_https` line, once it is known what it changed.
    fn report_auto_https(&mut self, lst: &BTreeMap<u16, Lst>) {
        let Some(loc) = self.auto_https_loc.take() else {
            return;
        };
        let loaded = lst
            .values()
            .any(|l| l.certs.iter().any(|(h, _, _)| !h.is_empty()));
        if self.auto_https == "ignore_loaded_certs" && loaded {
            self.report.different(
                &loc,
                "auto_https",
                "Caddy also obtains ACME certificates for names whose certificate is loaded \
                 with `tls CERT KEY`; veloxy serves the loaded files",
            );
        } else {
            self.report.translated(&loc, "auto_https");
        }
    }

    /// Writes the `[listeners]`; returns the redirect routes the HTTP port needs (when it
    /// also serves plain sites, the redirect is per host).
    fn listeners(
        &mut self,
        lst: &BTreeMap<u16, Lst>,
        names: &BTreeMap<u16, String>,
        redirects: &Redirects,
    ) -> Redirects {
        let http_sites = lst.get(&self.http_port).is_some_and(|l| l.has_sites);
        let mut redirect_routes = Vec::new();
        for (port, l) in lst {
            let mut sec = Section::default();
            for f in &l.from {
                sec.add_from(f);
            }
            let host = l.bind.clone().unwrap_or_default();
            sec.set("addr", format!("{host}:{port}"));
            if *port == self.http_port && !redirects.is_empty() {
                if http_sites {
                    redirect_routes.clone_from(redirects);
                } else {
                    sec.set("redirect_https", true);
                    let ports: Vec<u16> = redirects.iter().map(|r| r.1).collect();
                    if ports.iter().all(|p| *p == ports[0]) && ports[0] != 443 {
                        sec.set("https_port", i64::from(ports[0]));
                    }
                }
            }
            if l.tls {
                if self.http3 {
                    sec.set("http3", true);
                }
                sec.set("tls", Value::Table(tls_table(l)));
            }
            if l.refused_tls && !l.tls {
                sec.comments.push(
                    "Caddy serves this port over HTTPS (refused, see the report): plain HTTP here"
                        .into(),
                );
            }
            self.cfg.listeners.push((names[port].clone(), sec));
        }
        redirect_routes
    }

    /// One site block: its listeners' material, and its routes.
    fn site(
        &mut self,
        s: &Site,
        lst: &mut BTreeMap<u16, Lst>,
        redirects: &mut Redirects,
    ) -> Option<Built> {
        let first = s.addrs.first()?;
        let mut addrs = Vec::new();
        for a in &s.addrs {
            if let Some(e) = &a.unresolved {
                return self.refuse_site(s, a, e);
            }
            match parse_addr(&a.text, a, self.http_port, self.https_port) {
                Ok(x) => addrs.push(x),
                Err(e) => return self.refuse_site(s, a, &e),
            }
        }
        let st = self.site_tls(&s.body);
        let mut ports = Vec::new();
        let mut hosts: Vec<String> = Vec::new();
        let mut any_host = false;
        for a in &addrs {
            if !ports.contains(&a.port) {
                ports.push(a.port);
            }
            if a.host.is_empty() {
                any_host = true;
            } else if !hosts.contains(&a.host) {
                hosts.push(a.host.clone());
            }
            self.address(a, &st, &s.body, lst, redirects);
        }
        if let Some(l) = st.line {
            self.tls_directive(l, st.files.is_some());
        }
        for l in s
            .body
            .iter()
            .filter(|l| l.name() == "log" && l.unresolved().is_none())
        {
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
                action: Action::Respond(200, String::new(), None),
                from: vec![first.loc.clone()],
                comment: Some(
                    "Caddy answers requests no directive handles with an empty 200".into(),
                ),
            });
        }
        Some(Built { routes, ports })
    }

    /// The site's `tls` and `bind` lines (a line with an unresolved placeholder is refused
    /// and left out).
    fn site_tls<'l>(&mut self, body: &'l [Line]) -> SiteTls<'l> {
        for l in body
            .iter()
            .filter(|l| matches!(l.name(), "tls" | "bind" | "log"))
        {
            if let Some(why) = l.unresolved() {
                self.report.refused(l.loc(), l.name(), why.to_string());
                report_nested(self, l.body(), "its directive is refused");
            }
        }
        let usable = |n: &str| {
            body.iter()
                .find(|l| l.name() == n && l.unresolved().is_none())
        };
        let line = usable("tls");
        let files = line.and_then(|l| match l.args() {
            [c, k, ..] if !c.text.contains('@') && c.text != "internal" => {
                Some((self.path(&c.text), self.path(&k.text)))
            }
            _ => None,
        });
        let internal = line.is_some_and(|l| l.args().first().is_some_and(|a| a.text == "internal"));
        let bind_line = usable("bind");
        if let Some(b) = bind_line {
            match b.args() {
                [_] => self.report.translated(b.loc(), "bind"),
                _ => self.report.refused(
                    b.loc(),
                    "bind",
                    "several bind addresses (veloxy's listener has one)",
                ),
            }
        }
        SiteTls {
            line,
            files,
            internal,
            bind: bind_line
                .and_then(|l| l.args().first())
                .map(|t| t.text.clone()),
        }
    }

    /// One address: its listener (plain, or TLS with files or ACME), or why its HTTPS is
    /// refused.
    fn address(
        &mut self,
        a: &Addr,
        st: &SiteTls<'_>,
        body: &[Line],
        lst: &mut BTreeMap<u16, Lst>,
        redirects: &mut Redirects,
    ) {
        let tls = match a.scheme.as_str() {
            "http" => false,
            "https" => true,
            // Caddy turns TLS on for a name, or a `tls` directive, on any port but HTTP's,
            // whatever auto_https says (auto_https only decides the certificates).
            _ => a.port != self.http_port && (!a.host.is_empty() || st.line.is_some()),
        };
        let l = lst.entry(a.port).or_default();
        if !l
            .from
            .iter()
            .any(|f| f.file == a.loc.file && f.line == a.loc.line)
        {
            l.from.push(a.loc.clone());
        }
        if st.bind.is_some() {
            l.bind.clone_from(&st.bind);
        }
        if !tls {
            l.has_sites = true;
            self.report.translated(&a.loc, a_text(a));
            return;
        }
        let local = st.internal || self.local_certs || is_local(&a.host);
        let no_certs = matches!(self.auto_https.as_str(), "off" | "disable_certs");
        if let Some((c, k)) = &st.files {
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
        } else if local || a.host.is_empty() || no_certs {
            l.refused_tls = true;
            l.has_sites = true;
            let why = if no_certs && !local && !a.host.is_empty() {
                format!(
                    "with auto_https {}, Caddy serves {} over TLS on port {} but obtains no \
                     certificate for it (its handshakes fail): give the site `tls CERT KEY`, or \
                     an http:// address",
                    self.auto_https, a.host, a.port
                )
            } else {
                local_ca_refusal(a, body)
            };
            self.report.refused(&a.loc, a_text(a), why);
            return;
        } else if a.host.contains('*') {
            l.tls = true;
            self.report.refused(&a.loc, a_text(a), "a wildcard certificate needs the ACME DNS-01 challenge, which veloxy lacks: give the site `tls CERT KEY`");
        } else {
            l.tls = true;
            if !l.acme.contains(&a.host) {
                l.acme.push(a.host.clone());
            }
            self.report.translated(&a.loc, a_text(a));
        }
        if !a.host.is_empty() {
            redirects.push((a.host.clone(), a.port, a.loc.clone()));
        }
    }

    fn refuse_site(&mut self, s: &Site, a: &Token, why: &str) -> Option<Built> {
        self.report.refused(&a.loc, a.text.clone(), why.to_string());
        report_nested(self, &s.body, "its site's address is refused");
        None
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

/// A TLS listener's `tls = { cert, key, acme, certs }`.
fn tls_table(l: &Lst) -> toml::Table {
    let mut tls = toml::Table::new();
    let mut certs = l.certs.iter();
    if let Some((_, cert, key)) = certs.next() {
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
    tls
}
