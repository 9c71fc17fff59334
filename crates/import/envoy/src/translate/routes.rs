//! `route_config`: virtual hosts (domains) and their routes, with the header edits of every
//! level folded per route and the rules routes share written once as a rule set.

use toml::{Table, Value};
use veloxy_import::tree::Node;
use veloxy_import::{Loc, Section};

use super::hcm::Scope;
use super::headers::{self, Mutations};
use super::order;
use super::route::{self, Cors, RouteOut};
use super::Ctx;
use crate::util::{seq, Fields};

/// One virtual host, read.
struct Vhost {
    name: String,
    loc: Loc,
    /// `None`: any host.
    hosts: Option<Vec<String>>,
    mutations: Mutations,
    cors: Option<Cors>,
    authz_off: bool,
    rate_limit: Option<Table>,
    routes: Vec<RouteOut>,
    /// `require_tls` on a plain listener: everything redirects.
    require_tls: bool,
}

/// Translates a `route_config`; the routes, in order.
pub fn route_config(ctx: &mut Ctx, scope: &Scope, rc: &Node) -> Vec<Section> {
    let mut f = Fields::new(rc, "route_config");
    f.take("name");
    let global = headers::read(ctx, &mut f);
    f.ignore(
        &mut ctx.r,
        "max_direct_response_body_size_bytes",
        "a load-time limit of Envoy's on direct_response bodies",
    );
    f.refuse(
        &mut ctx.r,
        "internal_only_headers",
        "fields removed from requests of external clients only: veloxy cannot tell them apart",
    );
    f.refuse(
        &mut ctx.r,
        "request_mirror_policies",
        "mirroring for every route at once: veloxy's mirror is a route's (set \
         request_mirror_policies on the routes' actions)",
    );
    if let Some((l, _)) = f.take("most_specific_header_mutations_wins") {
        ctx.r.different(
            l,
            "route_config.most_specific_header_mutations_wins",
            "veloxy lets the configuration-wide edits win over the route's for the same field",
        );
    }
    let mut vhosts = Vec::new();
    if let Some((_, vs)) = f.take("virtual_hosts") {
        for v in seq(vs) {
            vhosts.push(vhost(ctx, scope, v));
        }
    }
    f.finish(&mut ctx.r);
    let mut out = Vec::new();
    let all: Vec<Option<Vec<String>>> = vhosts.iter().map(|v| v.hosts.clone()).collect();
    for (n, v) in vhosts.iter_mut().enumerate() {
        let matches: Vec<order::Match> = v.routes.iter().map(|r| r.m.clone()).collect();
        let keep = order::analyze(&matches, &mut ctx.r);
        let mut i = 0;
        v.routes.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        if v.require_tls {
            out.push(tls_redirect(v));
            continue;
        }
        let catch_all = v.routes.iter().any(|r| {
            matches!(&r.m.path, order::PathKind::Prefix(p) if p == "/") && r.m.conds.is_empty()
        });
        let mut rs = emit(ctx, scope, v, &global);
        if !catch_all && less_specific(v, n, &all) {
            rs.push(not_found(v));
        }
        out.extend(rs);
    }
    if let Some((path, loc)) = &scope.filters.health_path {
        let mut s = Section::from(loc);
        s.set("path_exact", path.as_str());
        let mut t = Table::new();
        t.insert("status".into(), Value::Integer(200));
        t.insert("body".into(), "".into());
        s.set("respond", Value::Table(t));
        out.insert(0, s);
    }
    out
}

/// Whether a less specific virtual host could take this one's requests: `*`, or a wildcard
/// domain above one of its names.
fn less_specific(v: &Vhost, me: usize, all: &[Option<Vec<String>>]) -> bool {
    let Some(mine) = &v.hosts else {
        return false;
    };
    all.iter()
        .enumerate()
        .filter(|(i, _)| *i != me)
        .any(|(_, o)| match o {
            None => true,
            Some(hs) => hs.iter().any(|w| {
                w.starts_with("*.") && mine.iter().any(|h| h != w && h.ends_with(&w[1..]))
            }),
        })
}

/// One virtual host.
fn vhost(ctx: &mut Ctx, scope: &Scope, v: &Node) -> Vhost {
    let mut f = Fields::new(v, "virtual_host");
    let name = f
        .take("name")
        .and_then(|(_, n)| n.scalar())
        .unwrap_or_else(|| "vhost".into());
    let hosts = match f.take("domains") {
        Some((l, d)) => domains(ctx, scope, l, d),
        None => None,
    };
    let mutations = headers::read(ctx, &mut f);
    let mut cors = None;
    let mut authz_off = false;
    let mut rate_limit = None;
    if let Some((l, c)) = f.take("cors") {
        cors = Some(Cors::Policy(route::cors_policy(
            ctx,
            l,
            "virtual_host.cors",
            c,
        )));
    }
    if let Some((_, pf)) = f.take("typed_per_filter_config") {
        route::per_filter(ctx, pf, &mut cors, &mut authz_off, &mut rate_limit);
    }
    let mut require_tls = false;
    if let Some((l, t)) = f.take("require_tls") {
        match crate::util::enum_name(t).as_deref() {
            Some("NONE") => ctx.r.translated(l, "virtual_host.require_tls"),
            _ if scope.tls => ctx.r.translated(l, "virtual_host.require_tls"),
            Some("EXTERNAL_ONLY") => {
                require_tls = true;
                ctx.r.different(
                    l,
                    "virtual_host.require_tls",
                    "veloxy redirects internal clients to HTTPS too",
                );
            }
            _ => {
                require_tls = true;
                ctx.r.translated(l, "virtual_host.require_tls");
            }
        }
    }
    f.refuse(
        &mut ctx.r,
        "retry_policy",
        "a virtual host's retry policy: set retry_policy on its routes",
    );
    f.refuse(
        &mut ctx.r,
        "rate_limits",
        "descriptors for a global rate limit service: veloxy limits locally (rate_limit)",
    );
    f.refuse(
        &mut ctx.r,
        "hedge_policy",
        "hedged requests: veloxy lacks them",
    );
    f.refuse(
        &mut ctx.r,
        "request_mirror_policies",
        "mirroring for every route at once: veloxy's mirror is a route's (set \
         request_mirror_policies on the routes' actions)",
    );
    f.ignore(
        &mut ctx.r,
        "include_request_attempt_count",
        "x-envoy-attempt-count for Envoy meshes",
    );
    let mut routes = Vec::new();
    if let Some((_, rs)) = f.take("routes") {
        for r in seq(rs) {
            routes.extend(route::route(ctx, r, scope.websocket));
        }
    }
    f.finish(&mut ctx.r);
    Vhost {
        name,
        loc: v.loc.clone(),
        hosts,
        mutations,
        cors,
        authz_off,
        rate_limit,
        routes,
        require_tls,
    }
}

/// `domains` -> `host` (a list); `None` for `*`.
fn domains(ctx: &mut Ctx, scope: &Scope, loc: &Loc, d: &Node) -> Option<Vec<String>> {
    let mut hosts: Vec<String> = Vec::new();
    let mut any = false;
    let mut ports = false;
    let mut bad = Vec::new();
    for x in seq(d) {
        let s = x.scalar().unwrap_or_default().to_ascii_lowercase();
        if s == "*" {
            any = true;
            continue;
        }
        let (name, port) = match s.rsplit_once(':') {
            Some((n, p)) if !n.contains(':') || n.ends_with(']') => (n.to_string(), Some(p)),
            _ => (s.clone(), None),
        };
        if port.is_some() {
            ports = true;
        }
        let wild_ok = name
            .strip_prefix("*.")
            .map_or(!name.contains('*'), |r| !r.contains('*'));
        if !wild_ok {
            bad.push(s);
            continue;
        }
        if !hosts.contains(&name) {
            hosts.push(name);
        }
    }
    if !bad.is_empty() {
        ctx.r.refused(
            loc,
            "virtual_host.domains",
            format!(
                "{}: veloxy matches exact names and *.suffix only (these are left out)",
                bad.join(", ")
            ),
        );
    } else if ports {
        ctx.r.different(
            loc,
            "virtual_host.domains",
            "veloxy ignores the port of the Host: a domain with a port matches that name on \
             any port",
        );
    } else {
        ctx.r.translated(loc, "virtual_host.domains");
    }
    if any {
        if !scope.sni.is_empty() {
            return Some(scope.sni.to_vec());
        }
        return None;
    }
    Some(hosts)
}

/// The virtual host's rules as a route with no rules of its own gets them.
fn vhost_rules(scope: &Scope, v: &Vhost, global: &Mutations, r: Option<&RouteOut>) -> Table {
    let mut t = Table::new();
    let empty = Mutations::default();
    let own = r.map_or(&empty, |r| &r.mutations);
    headers::fold(&[own, &v.mutations, global], &mut t);
    let proxied = r.is_none_or(|r| r.proxied);
    let cors = r.and_then(|r| r.cors.clone()).or_else(|| v.cors.clone());
    if let (true, Some(Cors::Policy(Some(p)))) = (scope.filters.cors, cors) {
        t.insert("cors".into(), Value::Table(p));
    }
    let authz_off = v.authz_off || r.is_some_and(|r| r.authz_off);
    if let (Some(a), false, true) = (&scope.filters.authz, authz_off, proxied) {
        t.insert("forward_auth".into(), Value::Table(a.clone()));
    }
    if scope.filters.compress && proxied {
        t.insert("compress".into(), true.into());
    }
    let rate = r
        .and_then(|r| r.rate_limit.clone())
        .or_else(|| v.rate_limit.clone())
        .or_else(|| scope.filters.rate_limit.clone());
    if let (Some(rl), true) = (rate, scope.filters.rate_limit_filter) {
        t.insert("rate_limit".into(), Value::Table(rl));
    }
    if let Some(n) = scope.filters.max_body {
        t.insert("max_body_bytes".into(), Value::Integer(n));
    }
    t
}

/// The routes of one virtual host as sections; rules every route shares go to a rule set.
fn emit(ctx: &mut Ctx, scope: &Scope, v: &Vhost, global: &Mutations) -> Vec<Section> {
    let shared = vhost_rules(scope, v, global, None);
    let per: Vec<Table> = v
        .routes
        .iter()
        .map(|r| vhost_rules(scope, v, global, Some(r)))
        .collect();
    // A route may take the set when it has every key of it (its own values win).
    let fits = |t: &Table| shared.keys().all(|k| t.contains_key(k));
    let users = per.iter().filter(|t| fits(t)).count();
    let set = if !shared.is_empty() && users >= 2 {
        Some(rule_set(ctx, &v.name, &v.loc, &shared))
    } else {
        None
    };
    let mut out = Vec::new();
    for (r, rules) in v.routes.iter().zip(per) {
        let mut s = Section::from(&r.loc);
        if let Some(h) = &v.hosts {
            s.set("host", names(h));
        }
        for (k, val) in &r.matching {
            s.set(k, val.clone());
        }
        let use_set = set.as_ref().filter(|_| fits(&rules));
        if let Some(name) = use_set {
            s.set("use", Value::Array(vec![Value::from(name.clone())]));
        }
        for (k, val) in &r.target {
            s.set(k, val.clone());
        }
        for (k, val) in rules {
            if use_set.is_some() && shared.get(&k) == Some(&val) {
                continue;
            }
            if !r.proxied && k == "forward_auth" {
                continue;
            }
            s.set(&k, val);
        }
        out.push(s);
    }
    out
}

/// A rule set with these keys (an identical one is reused).
fn rule_set(ctx: &mut Ctx, name: &str, loc: &Loc, keys: &Table) -> String {
    if let Some((n, _)) = ctx.cfg.rule_sets.iter().find(|(_, s)| {
        s.keys.len() == keys.len() && s.keys.iter().all(|(k, v)| keys.get(k) == Some(v))
    }) {
        return n.clone();
    }
    let n = veloxy_import::Config::unique(&ctx.cfg.rule_sets, name);
    let s = ctx.cfg.rule_set(&n, loc);
    for (k, v) in keys {
        s.set(k, v.clone());
    }
    n
}

fn names(h: &[String]) -> Value {
    if h.len() == 1 {
        Value::from(h[0].clone())
    } else {
        Value::Array(h.iter().map(|x| Value::from(x.clone())).collect())
    }
}

/// `require_tls` on a plain listener: one redirect for the whole virtual host.
fn tls_redirect(v: &Vhost) -> Section {
    let mut s = Section::from(&v.loc);
    if let Some(h) = &v.hosts {
        s.set("host", names(h));
    }
    let mut t = Table::new();
    t.insert("to".into(), "https://{host}{uri}".into());
    t.insert("status".into(), Value::Integer(301));
    s.set("redirect", Value::Table(t));
    s
}

/// Envoy answers 404 for a path none of the virtual host's routes match, even when a
/// less specific virtual host has a route for it; veloxy would fall through to that one.
fn not_found(v: &Vhost) -> Section {
    let mut s = Section::from(&v.loc);
    s.comments.push(format!(
        "Envoy answers 404 for paths no route of virtual host {} matches",
        v.name
    ));
    if let Some(h) = &v.hosts {
        s.set("host", names(h));
    }
    let mut t = Table::new();
    t.insert("status".into(), Value::Integer(404));
    t.insert("body".into(), "".into());
    s.set("respond", Value::Table(t));
    s
}
