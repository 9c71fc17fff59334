//! Locations (host, path, path type, backend) as ingress-nginx builds them, then as veloxy
//! routes: ingress-nginx's path semantics, its redirects to HTTPS, default locations and
//! canaries.

use toml::Value;
use veloxy_import::tree::Node;
use veloxy_import::{Loc, Section};

use crate::annotations::Ann;
use crate::groups::Backend;
use crate::locations::{collect, kind_of, Server};
use crate::tls::Certs;
use crate::util::{self, table};
use crate::{Ctx, IngInfo};

/// A path type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Exact`.
    Exact,
    /// `Prefix`: element-wise (`/p` matches `/p` and `/p/...`).
    Prefix,
    /// `ImplementationSpecific`: nginx's byte prefix.
    Impl,
}

/// What a location sends to.
#[derive(Debug, Clone)]
pub enum Target {
    /// A Service port.
    Service(Backend),
    /// The controller's default backend: 404.
    NotFound,
}

/// One nginx location.
#[derive(Debug, Clone)]
pub struct Location {
    /// Host ("" = any).
    pub host: String,
    /// Path as written.
    pub path: String,
    /// Path type.
    pub kind: Kind,
    /// The Ingress it came from.
    pub ing: usize,
    /// Where it sends.
    pub target: Target,
    /// The path item (or the Ingress for synthetic ones).
    pub loc: Loc,
    /// The report directive (None for synthetic locations).
    pub directive: Option<String>,
    /// Canary Ingresses for the same host and path.
    pub canary: Vec<(usize, Backend, Loc, String)>,
}

/// Builds every route, redirect and stream.
pub fn build(ctx: &mut Ctx, ings: &[IngInfo], certs: &Certs) {
    let (mut locs, servers, catch_all) = collect(ctx, ings);
    canaries(ctx, ings, &mut locs);
    // Hosts without a `/` location get their first Ingress's default backend, or, when
    // host-less routes exist (which veloxy would fall back to), the controller's 404.
    let hostless = locs.iter().any(|l| l.host.is_empty()) || catch_all;
    for s in &servers {
        if s.host.is_empty()
            || locs
                .iter()
                .any(|l| l.host == s.host && l.path == "/" && l.kind != Kind::Exact)
        {
            continue;
        }
        let ing = &ings[s.first];
        let target = match ing
            .obj
            .spec("defaultBackend")
            .map(|b| Backend::read(b, &ing.obj.ns))
        {
            Some(Ok(b)) => Target::Service(b),
            _ if hostless => Target::NotFound,
            _ => continue,
        };
        locs.push(Location {
            host: s.host.clone(),
            path: "/".into(),
            kind: Kind::Prefix,
            ing: s.first,
            target,
            loc: ing.obj.loc.clone(),
            directive: None,
            canary: Vec::new(),
        });
    }
    let https = certs.any() || ings.iter().any(|i| i.imported && i.ann.ssl_passthrough);
    crate::tls::listeners(ctx, certs, https, &ings[0].obj.loc);
    base_sets(ctx, certs);
    let plan = RedirectPlan::new(ctx, ings, &locs, certs);
    if plan.listener_wide {
        ctx.config
            .listener("http", &ings[0].obj.loc)
            .set("redirect_https", true);
    }
    let mut out: Vec<(usize, Section)> = Vec::new();
    for s in &servers {
        emit_host(ctx, ings, &locs, &s.host, certs, &plan, &mut out);
    }
    if !servers.iter().any(|s| s.host.is_empty()) {
        emit_host(ctx, ings, &locs, "", certs, &plan, &mut out);
    }
    plan.emit(ctx, &mut out);
    extras(ctx, ings, &servers, &locs, certs, &mut out);
    finish(ctx, ings, out);
}

/// Attaches canary Ingresses' paths to the main locations of the same host and path.
fn canaries(ctx: &mut Ctx, ings: &[IngInfo], locs: &mut [Location]) {
    for (i, info) in ings.iter().enumerate() {
        if !info.imported || info.ann.canary.is_none() {
            continue;
        }
        let ing = info.obj;
        if let Some(db) = ing.spec("defaultBackend") {
            ctx.report.ignored(
                &db.loc,
                "spec.defaultBackend",
                "a canary Ingress's default backend is not used by ingress-nginx",
            );
        }
        for rule in ing.spec("rules").and_then(Node::as_seq).unwrap_or(&[]) {
            let host = rule.get("host").and_then(Node::scalar).unwrap_or_default();
            let paths = rule
                .get("http")
                .and_then(|h| h.get("paths"))
                .and_then(Node::as_seq)
                .unwrap_or(&[]);
            for p in paths {
                let path = p
                    .get("path")
                    .and_then(Node::scalar)
                    .unwrap_or_else(|| "/".into());
                let (_, kname) = kind_of(p);
                let directive = format!(
                    "path {}{path} ({kname}, canary)",
                    if host.is_empty() { "*" } else { &host }
                );
                let backend = match p.get("backend").map(|b| Backend::read(b, &ing.ns)) {
                    Some(Ok(b)) => b,
                    Some(Err(e)) => {
                        ctx.report.refused(&p.loc, directive, e);
                        continue;
                    }
                    None => {
                        ctx.report.refused(&p.loc, directive, "no backend");
                        continue;
                    }
                };
                match locs.iter_mut().find(|l| l.host == host && l.path == path && l.directive.is_some()) {
                    Some(l) => l.canary.push((i, backend, p.loc.clone(), directive)),
                    None => ctx.report.ignored(&p.loc, directive, "no main Ingress serves this host and path: ingress-nginx ignores a canary alone"),
                }
            }
        }
    }
}

/// `[rule_sets.ingress-nginx]`: the fields ingress-nginx sets on every proxied request;
/// `[rule_sets.hsts]`: Strict-Transport-Security for hosts with a certificate.
fn base_sets(ctx: &mut Ctx, certs: &Certs) {
    let loc = ctx.objs.ingresses[0].loc.clone();
    let headers = default_headers(ctx, &Default::default(), &[]);
    let compress = ctx.g.compress;
    let s = ctx.config.rule_set("ingress-nginx", &loc);
    s.comments
        .push("what ingress-nginx sets on every request it proxies".into());
    s.set("request_headers", headers);
    if compress {
        s.set("compress", true);
    }
    if let (Some(h), true) = (ctx.g.hsts.clone(), certs.any()) {
        let s = ctx.config.rule_set("hsts", &loc);
        s.set(
            "response_headers",
            table([("set", table([("Strict-Transport-Security", h.into())]))]),
        );
    }
}

/// ingress-nginx's upstream request fields, plus an Ingress's own.
fn default_headers(
    ctx: &Ctx,
    extra: &std::collections::BTreeMap<String, String>,
    remove: &[String],
) -> Value {
    let mut set = toml::Table::new();
    set.insert("X-Real-IP".into(), "{client_ip}".into());
    if !(ctx.g.use_forwarded_headers && ctx.g.compute_full_xff) {
        set.insert("X-Forwarded-For".into(), "{client_ip}".into());
    }
    set.insert("X-Forwarded-Port".into(), "{server_port}".into());
    set.insert("X-Forwarded-Scheme".into(), "{scheme}".into());
    set.insert("X-Scheme".into(), "{scheme}".into());
    let xff = format!("{{header.{}}}", ctx.g.forwarded_for_header);
    set.insert("X-Original-Forwarded-For".into(), xff.into());
    set.insert(
        "X-Original-Forwarded-Host".into(),
        "{header.X-Forwarded-Host}".into(),
    );
    for (k, v) in extra {
        set.insert(k.clone(), v.as_str().into());
    }
    let mut rm = vec!["Proxy".to_string()];
    rm.extend(remove.iter().cloned());
    table([("set", Value::Table(set)), ("remove", util::strings(&rm))])
}

/// The route rule keys an Ingress sets itself.
pub fn own_rules(ctx: &Ctx, ann: &Ann, rewrite: bool) -> toml::Table {
    let mut t = ann.rules.clone();
    if let Some(v) = ann.body_size.clone().unwrap_or(ctx.g.body_size.clone()) {
        t.insert("max_body_bytes".into(), v.into());
    }
    let mut extra = ann.request_set.clone();
    if let (Some(p), true) = (&ann.x_forwarded_prefix, rewrite) {
        extra.insert("X-Forwarded-Prefix".into(), p.clone());
    }
    if !extra.is_empty() || !ann.request_remove.is_empty() {
        t.insert(
            "request_headers".into(),
            default_headers(ctx, &extra, &ann.request_remove),
        );
    }
    t
}

/// Whether a location's Ingress rewrites its paths.
fn needs_rewrite(ann: &Ann, path: &str) -> bool {
    ann.rewrite.as_deref().is_some_and(|t| t != path)
}

/// Which locations redirect plain HTTP to HTTPS, and how that is written.
pub struct RedirectPlan {
    /// Every request on the plain listener is redirected (`redirect_https`).
    pub listener_wide: bool,
    /// Hosts whose every location redirects: one catch-all redirect route each.
    pub whole_hosts: Vec<String>,
    code: u16,
    from: Vec<Loc>,
}

fn redirects(ctx: &Ctx, ann: &Ann, host: &str, certs: &Certs) -> bool {
    ann.force_ssl_redirect
        || ctx.g.force_ssl_redirect
        || (ann.ssl_redirect.unwrap_or(ctx.g.ssl_redirect) && certs.covers(host))
}

impl RedirectPlan {
    fn new(ctx: &Ctx, ings: &[IngInfo], locs: &[Location], certs: &Certs) -> Self {
        let mut hosts: Vec<String> = Vec::new();
        for l in locs {
            if !hosts.contains(&l.host) {
                hosts.push(l.host.clone());
            }
        }
        let whole_hosts: Vec<String> = hosts
            .into_iter()
            .filter(|h| {
                !h.is_empty()
                    && locs
                        .iter()
                        .filter(|l| &l.host == h)
                        .all(|l| redirects(ctx, &ings[l.ing].ann, h, certs))
            })
            .collect();
        let www = ings.iter().any(|i| i.imported && i.ann.from_to_www);
        let listener_wide = !locs.is_empty()
            && !www
            && ctx.g.redirect_code == 308
            && locs.iter().all(|l| whole_hosts.contains(&l.host));
        let from = locs
            .iter()
            .filter(|l| whole_hosts.contains(&l.host))
            .map(|l| l.loc.clone())
            .take(1)
            .collect();
        RedirectPlan {
            listener_wide,
            whole_hosts,
            code: ctx.g.redirect_code,
            from,
        }
    }

    fn emit(&self, _ctx: &mut Ctx, out: &mut Vec<(usize, Section)>) {
        if self.listener_wide || self.whole_hosts.is_empty() {
            return;
        }
        let mut r = Section {
            from: self.from.clone(),
            ..Default::default()
        };
        r.comments
            .push("ingress-nginx's ssl-redirect: hosts with a certificate".into());
        r.set("listener", "http");
        r.set("host", util::one_or_list(&self.whole_hosts));
        r.set(
            "redirect",
            table([
                ("to", "https://{host}{uri}".into()),
                ("status", i64::from(self.code).into()),
            ]),
        );
        out.push((usize::MAX, r));
    }
}

/// The routes of one host, in ingress-nginx's order for regex hosts.
fn emit_host(
    ctx: &mut Ctx,
    ings: &[IngInfo],
    locs: &[Location],
    host: &str,
    certs: &Certs,
    plan: &RedirectPlan,
    out: &mut Vec<(usize, Section)>,
) {
    let mut mine: Vec<&Location> = locs.iter().filter(|l| l.host == host).collect();
    let regex = mine
        .iter()
        .any(|l| ings[l.ing].ann.use_regex || needs_rewrite(&ings[l.ing].ann, &l.path));
    if regex {
        mine.sort_by(|a, b| b.path.cmp(&a.path));
        mine.sort_by_key(|l| std::cmp::Reverse(l.path.len()));
    }
    for l in &mine {
        let exact = l.kind == Kind::Prefix
            && mine
                .iter()
                .any(|o| o.kind == Kind::Exact && o.path == l.path);
        crate::route::emit(ctx, ings, l, (regex, exact), (certs, plan), out);
    }
}

/// app-root, from-to-www-redirect and ssl-passthrough.
fn extras(
    ctx: &mut Ctx,
    ings: &[IngInfo],
    servers: &[Server],
    locs: &[Location],
    certs: &Certs,
    out: &mut Vec<(usize, Section)>,
) {
    // (Ingress, host) of every location, once: looked up per server instead of scanning every
    // location for every server of every Ingress (cubic: 4 s at 1,000 Ingresses).
    let placed: std::collections::HashSet<(usize, &str)> =
        locs.iter().map(|l| (l.ing, l.host.as_str())).collect();
    for (i, info) in ings.iter().enumerate() {
        if !info.imported || info.ann.canary.is_some() {
            continue;
        }
        if info.ann.app_root.is_none() && !info.ann.from_to_www && !info.ann.ssl_passthrough {
            continue;
        }
        let hosts: Vec<String> = servers
            .iter()
            .filter(|s| placed.contains(&(i, s.host.as_str())))
            .map(|s| s.host.clone())
            .collect();
        if let Some(root) = &info.ann.app_root {
            let mut r = Section::from(&info.obj.loc);
            let named: Vec<String> = hosts.iter().filter(|h| !h.is_empty()).cloned().collect();
            if !named.is_empty() {
                r.set("host", util::one_or_list(&named));
            }
            r.set("path_exact", "/");
            r.set(
                "redirect",
                table([
                    ("to", format!("{{scheme}}://{{authority}}{root}").into()),
                    ("status", 302.into()),
                ]),
            );
            out.push((i, r));
        }
        if info.ann.from_to_www {
            for h in hosts.iter().filter(|h| !h.is_empty()) {
                let from = match h.strip_prefix("www.") {
                    Some(bare) => bare.to_string(),
                    None => format!("www.{h}"),
                };
                if servers.iter().any(|s| s.host == from) {
                    continue;
                }
                let mut r = Section::from(&info.obj.loc);
                r.set("host", from.as_str());
                let to = format!("{{scheme}}://{h}:{{server_port}}{{uri}}");
                r.set(
                    "redirect",
                    table([
                        ("to", to.into()),
                        ("status", i64::from(ctx.g.redirect_code).into()),
                    ]),
                );
                out.push((i, r));
            }
        }
        if info.ann.ssl_passthrough {
            passthrough(ctx, i, info, locs, &hosts, certs);
        }
    }
}

fn passthrough(
    ctx: &mut Ctx,
    i: usize,
    info: &IngInfo,
    locs: &[Location],
    hosts: &[String],
    _certs: &Certs,
) {
    for h in hosts.iter().filter(|h| !h.is_empty()) {
        let Some(root) = locs
            .iter()
            .find(|l| l.ing == i && &l.host == h && l.path == "/")
        else {
            continue;
        };
        let Target::Service(b) = &root.target else {
            continue;
        };
        let plain = Ann::default();
        let Ok(servers) = ctx.servers(b, false) else {
            continue;
        };
        let name = veloxy_import::Config::unique(&ctx.config.upstreams, &format!("{}-tls", b.name));
        let g = ctx.config.upstream(&name, &info.obj.loc);
        g.set("servers", Value::Array(servers));
        g.set("connect_timeout", ctx.g.connect_timeout.as_str());
        let _ = plain;
        let mut s = Section::from(&root.loc);
        s.set("listener", "https");
        s.set("sni", util::strings(&[h]));
        s.set("upstream", name.as_str());
        ctx.config.streams.push(s);
    }
}

/// Merges routes that differ only in their list of paths, moves an Ingress's shared rules
/// into a rule set when several of its routes use them, and writes the routes.
fn finish(ctx: &mut Ctx, ings: &[IngInfo], out: Vec<(usize, Section)>) {
    // Prefix and exact routes match the same whatever their order, so any two of one
    // Ingress that differ in one list key merge; regex routes keep their order.
    let mut merged: Vec<(usize, Section)> = Vec::new();
    for (i, r) in out {
        let regex = r.get("path_regex").is_some();
        let into = merged
            .iter_mut()
            .rev()
            .take_while(|(_, m)| !regex || m.get("path_regex").is_none());
        let mut done = false;
        for (j, m) in into {
            if *j == i && m.get("path_regex").is_none() && !regex && crate::route::merge(m, &r) {
                done = true;
                break;
            }
        }
        if !done {
            merged.push((i, r));
        }
    }
    for (i, info) in ings.iter().enumerate() {
        let rules: Vec<&str> = crate::route::RULE_KEYS.to_vec();
        let users: Vec<usize> = merged
            .iter()
            .enumerate()
            .filter(|(_, (j, r))| *j == i && rules.iter().any(|k| r.get(k).is_some()))
            .map(|(n, _)| n)
            .collect();
        if users.len() < 2 {
            continue;
        }
        let name = veloxy_import::Config::unique(&ctx.config.rule_sets, &info.obj.name);
        let mut set = Section::from(&info.obj.loc);
        for k in &rules {
            if let Some(v) = merged[users[0]].1.get(k).cloned() {
                if users.iter().all(|&n| merged[n].1.get(k) == Some(&v)) {
                    set.set(k, v);
                }
            }
        }
        if set.keys.is_empty() {
            continue;
        }
        for &n in &users {
            let r = &mut merged[n].1;
            for (k, _) in &set.keys {
                r.remove(k);
            }
            if let Some(Value::Array(u)) = r.get_mut("use") {
                u.insert(0, name.as_str().into());
            }
        }
        ctx.config.rule_sets.push((name, set));
    }
    ctx.config.routes.extend(merged.into_iter().map(|(_, r)| r));
}
