//! Proxies (`frontend`, `backend`, `listen`) with the `defaults` section they take their
//! settings from, and the order the sections are translated in.

use std::collections::BTreeMap;

use crate::parse::{Line, Section};
use crate::Ctx;

/// A proxy and the defaults it inherits.
#[derive(Debug, Clone)]
pub struct Proxy<'s> {
    /// `frontend`, `backend` or `listen`.
    pub kind: &'s str,
    /// Its name.
    pub name: String,
    /// The section line.
    pub head: &'s Line,
    /// Its own lines.
    pub own: Vec<&'s Line>,
    /// The lines of the `defaults` section it takes (before its own).
    pub defaults: Vec<&'s Line>,
}

impl<'s> Proxy<'s> {
    /// Every effective line: the defaults' first, then its own.
    pub fn lines(&self) -> impl Iterator<Item = &'s Line> + '_ {
        self.defaults.iter().chain(&self.own).copied()
    }

    /// The last effective line with keyword `kw` (and first argument `arg`, when given).
    pub fn last(&self, kw: &str, arg: Option<&str>) -> Option<&'s Line> {
        self.lines()
            .filter(|l| l.kw() == kw && arg.is_none_or(|a| l.arg(0) == Some(a)))
            .last()
    }

    /// `option NAME` in effect (not cancelled by a later `no option NAME`): its line.
    pub fn option(&self, name: &str) -> Option<&'s Line> {
        let mut on = None;
        for l in self.lines() {
            if l.kw() == "option" && l.arg(0) == Some(name) {
                on = Some(l);
            } else if l.kw() == "no" && l.arg(0) == Some("option") && l.arg(1) == Some(name) {
                on = None;
            }
        }
        on
    }

    /// Whether the proxy is in `mode tcp` (HAProxy's default mode is tcp).
    pub fn tcp(&self) -> bool {
        self.last("mode", None).and_then(|l| l.arg(0)) != Some("http")
    }

    /// Its own lines with keyword `kw`.
    pub fn own_kw(&self, kw: &str) -> Vec<&'s Line> {
        self.own.iter().copied().filter(|l| l.kw() == kw).collect()
    }

    /// Whether this proxy receives traffic (`frontend`, `listen`).
    pub fn is_frontend(&self) -> bool {
        self.kind != "backend"
    }

    /// Whether this proxy has servers (`backend`, `listen`).
    pub fn is_backend(&self) -> bool {
        self.kind != "frontend"
    }
}

/// Translates every section.
pub fn translate(cx: &mut Ctx, sections: &[Section]) {
    for s in sections.iter().filter(|s| s.kind == "global") {
        crate::global::global(cx, s);
    }
    for s in sections.iter().filter(|s| s.kind == "userlist") {
        crate::global::userlist(cx, s);
    }
    let resolvers: Vec<&Section> = sections.iter().filter(|s| s.kind == "resolvers").collect();
    for s in &resolvers {
        crate::global::resolvers(cx, s);
    }
    crate::cache::collect(cx, sections);
    for s in sections.iter().filter(|s| {
        !matches!(
            s.kind.as_str(),
            "global"
                | "userlist"
                | "resolvers"
                | "defaults"
                | "frontend"
                | "backend"
                | "listen"
                | "cache"
        )
    }) {
        crate::global::other(cx, s);
    }
    let proxies = proxies(cx, sections);
    cx.tables = crate::limit::tables(&proxies);
    let backends: BTreeMap<String, &Proxy> = proxies
        .iter()
        .filter(|p| p.is_backend())
        .map(|p| (p.name.clone(), p))
        .collect();
    let mut groups = crate::backend::Groups::default();
    for p in proxies.iter().filter(|p| p.is_backend()) {
        crate::backend::translate(cx, p, &resolvers, &mut groups);
    }
    let mut server = crate::frontend::ServerKeys::default();
    for p in proxies.iter().filter(|p| p.is_frontend()) {
        if p.tcp() {
            crate::tcp::translate(cx, p, &backends, &groups, &proxies);
        } else {
            crate::frontend::translate(cx, p, &backends, &groups, &mut server);
        }
    }
    crate::tcp::merge_passthrough(cx);
    crate::route_out::simplify_listeners(&mut cx.out);
    server.write(cx);
    crate::stats::finish(cx);
    crate::cache::finish(cx, sections);
    for p in backends.values() {
        for l in p.lines() {
            if !cx.decided(l)
                && matches!(
                    l.kw(),
                    "acl" | "http-request" | "http-response" | "redirect"
                )
            {
                cx.ignore(l, "no frontend sends requests to this backend");
            }
        }
    }
    for s in sections.iter().filter(|s| s.kind == "defaults") {
        cx.ok(&s.head);
        for l in &s.lines {
            if !cx.decided(l) && crate::global::inheritable(l.kw()) {
                cx.ignore(l, "no frontend or backend takes this default");
            }
        }
    }
}

/// Every proxy with its defaults: `from NAME`, else the last `defaults` above it.
fn proxies<'s>(cx: &mut Ctx, sections: &'s [Section]) -> Vec<Proxy<'s>> {
    let mut named: BTreeMap<&str, &'s Section> = BTreeMap::new();
    let mut last: Option<&'s Section> = None;
    let mut out = Vec::new();
    for s in sections {
        match s.kind.as_str() {
            "defaults" => {
                let mut lines: Vec<&Line> = Vec::new();
                if let Some(f) = &s.from {
                    match named.get(f.as_str()) {
                        Some(d) => lines.extend(&d.lines),
                        None => cx.refuse(
                            &s.head,
                            format!("defaults section {f} is not defined above"),
                        ),
                    }
                }
                if !s.name.is_empty() {
                    named.insert(&s.name, s);
                }
                last = Some(s);
            }
            "frontend" | "backend" | "listen" => {
                let d = match &s.from {
                    Some(f) => match named.get(f.as_str()) {
                        Some(d) => Some(*d),
                        None => {
                            cx.refuse(
                                &s.head,
                                format!("defaults section {f} is not defined above"),
                            );
                            None
                        }
                    },
                    None => last,
                };
                let mut defaults: Vec<&Line> = Vec::new();
                if let Some(d) = d {
                    if let Some(f) = &d.from {
                        if let Some(dd) = named.get(f.as_str()) {
                            defaults.extend(&dd.lines);
                        }
                    }
                    defaults.extend(&d.lines);
                }
                out.push(Proxy {
                    kind: &s.kind,
                    name: s.name.clone(),
                    head: &s.head,
                    own: s.lines.iter().collect(),
                    defaults,
                });
            }
            _ => {}
        }
    }
    out
}
