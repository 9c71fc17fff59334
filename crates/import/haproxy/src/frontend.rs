//! HTTP frontends (and the front half of `listen`): binds become listeners, the rule lists
//! become routes, client-side timeouts become `[server]` keys.

use std::collections::BTreeMap;

use veloxy_import::{Loc, Section};

use crate::backend::Groups;
use crate::cases::{self, Case, HdrOp, Rules, Step, Target};
use crate::parse::Line;
use crate::proxy::Proxy;
use crate::Ctx;

/// `[server]` keys from the client-side timeouts (the first frontend's; veloxy has one set).
#[derive(Default)]
pub struct ServerKeys {
    first: Option<(String, BTreeMap<&'static str, String>)>,
    from: Vec<Loc>,
}

impl ServerKeys {
    /// Writes the keys into `[server]`.
    pub fn write(&self, cx: &mut Ctx) {
        if let Some((_, keys)) = &self.first {
            for (k, v) in keys {
                cx.out.server.set(k, v.clone());
            }
        }
        if !cx.out.routes.is_empty() {
            cx.out.server.set("underscores_in_headers", true);
            for l in &self.from {
                cx.out.server.add_from(l);
            }
        }
    }
}

/// A listener made from a bind: its name and whether it terminates TLS.
#[derive(Debug, Clone)]
pub struct Listener {
    /// veloxy name.
    pub name: String,
    /// TLS.
    pub tls: bool,
}

/// Translates HTTP frontend `p`.
pub fn translate(
    cx: &mut Ctx,
    p: &Proxy,
    backends: &BTreeMap<String, &Proxy>,
    groups: &Groups,
    server: &mut ServerKeys,
) {
    if crate::stats::only(p) {
        crate::stats::section(cx, p);
        common(cx, p);
        crate::stats::rest(cx, p);
        return;
    }
    cx.ok(p.head);
    let listeners = crate::tcp::binds(cx, p, false);
    timeouts(cx, p, server, &listeners, backends, groups);
    common(cx, p);
    let ports = crate::tcp::bind_ports(p);
    let acls = crate::rules::acls(cx, p, &ports);
    let steps = crate::rules::request_steps(cx, p, &acls);
    let resp_front = crate::rules::response_ops(cx, p, &acls, false);
    let resp_after = crate::rules::response_ops(cx, p, &acls, true);
    let front_stores = crate::cache::stores(cx, p);
    let mut store_back: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut resp_back: BTreeMap<String, Vec<(Option<bool>, HdrOp)>> = BTreeMap::new();
    let mut tail: Vec<Case> = Vec::new();
    let mut cache: BTreeMap<String, Vec<Case>> = BTreeMap::new();
    let mut nested = |cx: &mut Ctx, name: &str, l: &Line| -> Option<Vec<Case>> {
        if let Some(c) = cache.get(name) {
            return Some(c.clone());
        }
        let Some(b) = backends.get(name) else {
            cx.refuse(l, format!("backend {name} is not defined"));
            return None;
        };
        if b.tcp() {
            cx.refuse(
                l,
                format!("backend {name} is in mode tcp behind an HTTP frontend"),
            );
            return None;
        }
        let g = &groups.by_name[name];
        forwarded(cx, p, b, g.forwardfor);
        let base = match &g.upstream {
            Some(u) => Case::all(Target::Backend(u.clone()), &b.head.loc),
            None => Case::all(crate::rules::haproxy_answer(503), &b.head.loc),
        };
        let mut later = vec![base];
        if b.kind == "backend" {
            let bacls = crate::rules::acls(cx, b, &ports);
            for (line, step) in crate::rules::request_steps(cx, b, &bacls).iter().rev() {
                match cases::apply(step, later.clone(), true) {
                    Ok(v) => later = v,
                    Err(e) => cx.refuse(line, e),
                }
            }
            if let Some(u) = &g.upstream {
                let mut ops = crate::rules::response_ops(cx, b, &bacls, false);
                ops.extend(crate::rules::response_ops(cx, b, &bacls, true));
                resp_back.insert(u.clone(), ops);
                store_back.insert(u.clone(), crate::cache::stores(cx, b));
            }
        }
        cache.insert(name.to_string(), later.clone());
        Some(later)
    };
    let mut uses: Vec<(&Line, Step)> = Vec::new();
    for l in p.lines().filter(|l| l.kw() == "use_backend") {
        let words: Vec<String> = l.words[2..].iter().map(|w| w.text.clone()).collect();
        let name = l.arg(0).unwrap_or_default();
        if name.contains("%[") {
            cx.refuse(
                l,
                "a backend name computed per request (a map): veloxy routes name their upstream",
            );
            continue;
        }
        let cond = match crate::acl::condition(&words, &acls, &cx.base) {
            Ok(c) => c,
            Err(e) => {
                cx.refuse(l, e);
                continue;
            }
        };
        if cond
            .dnf
            .iter()
            .any(|t| !t.guards.is_empty() || t.sni.is_some())
        {
            cx.refuse(
                l,
                "a client address, credential or SNI test: a veloxy route cannot be chosen by them",
            );
            continue;
        }
        let Some(n) = nested(cx, name, l) else {
            continue;
        };
        let n = n
            .into_iter()
            .map(|c| Case {
                from: vec![l.loc.clone()],
                ..c
            })
            .collect();
        for note in cond.notes {
            cx.diff(l, note);
        }
        cx.ok(l);
        uses.push((l, Step::Stop(cond.dnf, n)));
    }
    if let Some((l, name)) = p
        .last("default_backend", None)
        .map(|l| (l, l.arg(0).unwrap_or_default().to_string()))
        .or_else(|| (p.kind == "listen").then(|| (p.head, p.name.clone())))
    {
        if let Some(n) = nested(cx, &name, l) {
            if l.kw() == "default_backend" {
                cx.ok(l);
            }
            tail.extend(n.into_iter().map(|c| Case {
                from: vec![l.loc.clone()],
                ..c
            }));
        }
    }
    if tail.is_empty() {
        tail.push(Case::all(crate::rules::haproxy_answer(503), &p.head.loc));
    }
    for (line, step) in uses.iter().rev().chain(steps.iter().rev()) {
        match cases::apply(step, tail.clone(), true) {
            Ok(v) => tail = v,
            Err(e) => cx.refuse(line, e),
        }
    }
    let fixed_tls = fixed_tls(cx, &listeners, &mut tail);
    let tls_resp = resp_front
        .iter()
        .chain(&resp_after)
        .chain(resp_back.values().flatten())
        .any(|(t, _)| t.is_some());
    let mut cs = tail;
    if tls_resp || listeners.iter().any(|l| l.tls) != listeners.iter().all(|l| l.tls) {
        cs = cases::split_tls(cs);
    }
    for c in &mut cs {
        let tls = c.m.tls.or(fixed_tls);
        let pick = |ops: &[(Option<bool>, HdrOp)]| -> Vec<HdrOp> {
            ops.iter()
                .filter(|(t, _)| t.is_none() || tls.is_none() || *t == tls)
                .map(|(_, o)| o.clone())
                .collect()
        };
        if let Target::Backend(u) = &c.target {
            let mut resp = resp_back.get(u).map(|v| pick(v)).unwrap_or_default();
            resp.extend(pick(&resp_front));
            resp.extend(pick(&resp_after));
            c.rules.resp = resp;
            // The first cache looked up that answers are also stored in.
            c.rules.cache.retain(|n| {
                front_stores.contains(n) || store_back.get(u).is_some_and(|s| s.contains(n))
            });
            c.rules.cache.truncate(1);
        } else {
            // HAProxy's own answers skip http-response rules, not http-after-response ones.
            c.rules = Rules {
                allow: c.rules.allow.clone(),
                deny: c.rules.deny.clone(),
                auth: c.rules.auth.clone(),
                rate: c.rules.rate.clone(),
                resp: pick(&resp_after),
                ..Default::default()
            };
        }
    }
    emit(cx, p, &listeners, cs, &server.from);
    if server.from.is_empty() {
        server.from.push(p.head.loc.clone());
    }
}

/// When every listener of the frontend is TLS (or none is), `ssl_fc` is constant: cases that
/// test it are kept without the test or dropped. Returns that constant.
fn fixed_tls(cx: &mut Ctx, listeners: &[Listener], cases: &mut Vec<Case>) -> Option<bool> {
    let fixed = if listeners.is_empty() {
        return None;
    } else if listeners.iter().all(|l| l.tls) {
        true
    } else if listeners.iter().all(|l| !l.tls) {
        false
    } else {
        return None;
    };
    let mut dropped: Vec<Loc> = Vec::new();
    cases.retain_mut(|c| match c.m.tls {
        Some(t) if t != fixed => {
            dropped.extend(c.from.first().cloned());
            false
        }
        Some(_) => {
            c.m.tls = None;
            true
        }
        None => true,
    });
    for loc in dropped {
        if !cases.iter().any(|c| c.from.first() == Some(&loc)) {
            let why = if fixed {
                "every listener of this frontend is TLS: the rule never applies"
            } else {
                "no listener of this frontend is TLS: the rule never applies"
            };
            cx.shadowed(&loc, why);
        }
    }
    Some(fixed)
}

/// The X-Forwarded-* difference of a frontend/backend pair.
fn forwarded(cx: &mut Ctx, f: &Proxy, b: &Proxy, back_ff: bool) {
    match f.option("forwardfor").or(if back_ff { b.option("forwardfor") } else { None }) {
        Some(l) => {
            let a = l.args();
            cx.diff(l, "veloxy also sets X-Forwarded-Proto and X-Forwarded-Host, and appends the client to an X-Forwarded-For the client sent (HAProxy adds a separate field)");
            if a.contains(&"except") {
                cx.diff(l, "except: veloxy adds X-Forwarded-For for every client");
            }
            if a.contains(&"header") {
                cx.diff(l, "header: veloxy's field is X-Forwarded-For");
            }
            if a.contains(&"if-none") {
                cx.diff(l, "if-none: veloxy appends to an X-Forwarded-For the client sent");
            }
        }
        None => cx.diff(
            b.head,
            "no option forwardfor: HAProxy sends no X-Forwarded-For; veloxy adds X-Forwarded-For, X-Forwarded-Proto and X-Forwarded-Host",
        ),
    }
}

/// Client-side timeouts and listener limits.
fn timeouts(
    cx: &mut Ctx,
    p: &Proxy,
    server: &mut ServerKeys,
    listeners: &[Listener],
    backends: &BTreeMap<String, &Proxy>,
    groups: &Groups,
) {
    let t = |k: &str| p.last("timeout", Some(k));
    let val = |l: Option<&Line>| l.and_then(|l| l.arg(1)).and_then(crate::duration);
    let client = val(t("client"));
    let request = val(t("http-request"));
    let keepalive = val(t("http-keep-alive"));
    let mut keys: BTreeMap<&'static str, String> = BTreeMap::new();
    let header = request.clone().or(client.clone());
    let ka = keepalive.clone().or(request.clone()).or(client.clone());
    for (k, v, dflt) in [
        ("header_timeout", header, "10s"),
        ("keepalive_timeout", ka, "60s"),
        ("body_timeout", client.clone(), "60s"),
        ("send_timeout", client.clone(), "60s"),
    ] {
        if let Some(v) = v.filter(|v| v != dflt) {
            keys.insert(k, v);
        }
    }
    let lines: Vec<&Line> = ["client", "http-request", "http-keep-alive"]
        .iter()
        .filter_map(|k| t(k))
        .collect();
    match &server.first {
        None => {
            server.first = Some((p.name.clone(), keys));
            lines.iter().for_each(|l| cx.ok(l));
        }
        Some((name, have)) if *have != keys => {
            for l in lines {
                cx.diff(
                    l,
                    format!("veloxy has one set of client timeouts: frontend {name}'s are used"),
                );
            }
        }
        Some(_) => lines.iter().for_each(|l| cx.ok(l)),
    }
    if client.is_none() {
        cx.diff(p.head, "no timeout client: HAProxy waits for clients without limit, veloxy's body and send timeouts are 60s");
    }
    for l in p
        .lines()
        .filter(|l| l.kw() == "timeout" && matches!(l.arg(0), Some("client-fin" | "server-fin")))
    {
        cx.ignore(l, "half-closed connection tuning");
    }
    let mut tunnel = val(t("tunnel"));
    if tunnel.is_none() {
        let used: Vec<&str> = p
            .lines()
            .filter(|l| l.kw() == "use_backend" || l.kw() == "default_backend")
            .filter_map(|l| l.arg(0))
            .collect();
        tunnel = used
            .iter()
            .chain([p.name.as_str()].iter())
            .find_map(|b| groups.by_name.get(*b).and_then(|g| g.tunnel.clone()));
        let _ = backends;
    }
    let maxconn = p.last("maxconn", None);
    for lst in listeners {
        let sec = crate::model_listener(cx, &lst.name);
        if let Some(tn) = &tunnel {
            if tn != "10m" {
                sec.set("upgrade_idle_timeout", tn.clone());
            }
        }
        if let Some(m) = maxconn
            .and_then(|l| l.arg(0))
            .and_then(|v| v.parse::<i64>().ok())
        {
            sec.set("max_connections", m);
        }
    }
    if let Some(l) = maxconn {
        cx.diff(l, "beyond it veloxy accepts and answers 503 with Retry-After (HAProxy leaves connections waiting in the backlog)");
    }
}

/// Keywords of any HTTP proxy that change nothing or are refused.
pub fn common(cx: &mut Ctx, p: &Proxy) {
    for l in p.lines() {
        let kw = l.kw();
        match (kw, l.arg(0)) {
            ("mode", _) => cx.ok(l),
            (
                "log" | "log-format" | "log-tag" | "capture" | "declare" | "log-format-sd"
                | "error-log-format",
                _,
            ) => cx.ignore(l, "logging: no effect on what clients or backends see"),
            ("option", Some(o)) | ("no", Some(o @ "option")) => {
                let o = if kw == "no" { l.arg(1).unwrap_or(o) } else { o };
                match o {
                    "httplog" | "tcplog" | "dontlognull" | "dontlog-normal" | "log-separate-errors"
                    | "log-health-checks" | "logasap" | "contstats" | "socket-stats" | "httpslog" => {
                        cx.ignore(l, "logging: no effect on what clients or backends see")
                    }
                    "http-server-close" | "http-keep-alive" | "httpclose" | "forceclose"
                    | "http-pretend-keepalive" | "http-no-delay" | "http-buffer-request" | "abortonclose"
                    | "splice-auto" | "splice-request" | "splice-response" | "tcp-smart-accept"
                    | "tcp-smart-connect" | "tcpka" | "clitcpka" | "srvtcpka" | "independent-streams"
                    | "nolinger" | "prefer-last-server" | "http-use-htx" | "allbackups" | "http-tunnel"
                    | "disable-h2-upgrade" => cx.ignore(l, "connection handling: veloxy keeps client and backend connections alive on its own"),
                    "forwardfor" | "httpchk" | "redispatch" | "tcp-check" | "ssl-hello-chk" => {}
                    "originalto" => cx.refuse(l, "option originalto: veloxy has no template for the address the client connected to"),
                    "http-ignore-probes" => cx.ignore(l, "logging of empty connections"),
                    "accept-invalid-http-request" | "accept-invalid-http-response" | "accept-unsafe-violations-in-http-request" => {
                        cx.refuse(l, "veloxy refuses malformed HTTP")
                    }
                    other => cx.refuse(l, format!("option {other}: not translated")),
                }
            }
            ("errorfile", Some(code)) => {
                let stock = l.arg(1).is_some_and(|f| {
                    {
                        // Debian's and the official Docker image's copies of the stock pages.
                        [
                            "/etc/haproxy/errors/",
                            "/usr/share/haproxy/",
                            "/usr/local/etc/haproxy/errors/",
                        ]
                        .iter()
                        .any(|d| f.starts_with(d))
                    }
                });
                if stock {
                    cx.diff(l, format!("HAProxy's stock {code} page: veloxy's own {code} answers have a short text/plain body"));
                } else {
                    cx.refuse(l, "custom error files: veloxy's error_pages also replace backends' error bodies, and take a body file, not a raw HTTP response");
                }
            }
            ("errorloc" | "errorloc302" | "errorloc303" | "errorfiles" | "http-error", _) => {
                cx.refuse(l, "custom error answers: not translated")
            }
            ("compression", _) => {
                cx.diff(
                    l,
                    "veloxy's compress picks its own content types and algorithms (gzip, br, zstd)",
                );
            }
            ("stats", _) => crate::stats::line(cx, p, l),
            ("unique-id-format", _) => cx.diff(l, "veloxy's request IDs are 32 hex digits"),
            ("unique-id-header", Some(h)) => {
                cx.out.server.set("request_id", h.to_string());
                cx.ok(l);
            }
            ("description" | "id" | "bind-process" | "email-alert" | "enabled" | "disabled", _) => {
                cx.ignore(l, "no effect on traffic")
            }
            ("tcp-request", Some("inspect-delay")) => cx.ignore(l, "content inspection delay"),
            ("tcp-request", Some("content" | "connection" | "session"))
                if l.arg(1).is_some_and(|a| a.starts_with("track-sc")) =>
            {
                cx.ignore(
                    l,
                    "counters: only the rules that use them change answers (those are reported)",
                )
            }
            ("tcp-request" | "tcp-response", _) => cx.refuse(
                l,
                "tcp-request/tcp-response rules in an HTTP proxy: not translated",
            ),
            ("rate-limit", _) => cx.refuse(
                l,
                "rate-limit sessions: veloxy's rate_limit counts requests per client",
            ),
            (
                "reqadd" | "reqrep" | "reqdel" | "reqirep" | "rspadd" | "rspdel" | "rsprep"
                | "block" | "reqallow" | "reqdeny" | "reqpass" | "reqtarpit",
                _,
            ) => cx.refuse(
                l,
                "a keyword HAProxy 2.1 removed: write it as http-request/http-response",
            ),
            ("filter", Some("compression")) => cx.ok(l),
            ("stick-table", _) => cx.ignore(l, crate::backend::STICK_TABLE),
            ("filter", _) => cx.refuse(l, "filters: not translated"),
            ("monitor", _) => cx.refuse(l, "monitor fail: not translated"),
            ("force-persist" | "ignore-persist" | "use-server" | "persist", _) => {
                cx.refuse(l, "persistence rules: not translated")
            }
            _ => {}
        }
    }
}

/// Writes the routes of `cases` for this frontend's listeners.
fn emit(cx: &mut Ctx, p: &Proxy, listeners: &[Listener], mut cs: Vec<Case>, _first: &[Loc]) {
    if listeners.is_empty() {
        return;
    }
    let routes = loop {
        match cases::routes(&cs) {
            Ok(r) => break r,
            Err(e) => {
                // Drop the last case's directive and try again.
                let Some(last) = cs
                    .iter()
                    .rev()
                    .find(|c| c.from.first().is_some_and(|l| l != &p.head.loc))
                    .and_then(|c| c.from.first().cloned())
                else {
                    return;
                };
                if let Some(line) = p.lines().find(|l| l.loc == last) {
                    cx.refuse(line, e);
                }
                cs.retain(|c| c.from.first() != Some(&last));
            }
        }
    };
    let rules: std::collections::BTreeSet<Loc> = routes
        .iter()
        .filter_map(|(_, ci)| cs[*ci].rules.rate.as_ref().map(|r| r.from.clone()))
        .collect();
    let mut out: Vec<Section> = Vec::new();
    for (m, ci) in routes {
        let c = &cs[ci];
        let names: Vec<&str> = listeners
            .iter()
            .filter(|l| m.tls.is_none_or(|t| t == l.tls))
            .map(|l| l.name.as_str())
            .collect();
        if names.is_empty() {
            continue;
        }
        match crate::route_out::route(cx, &m, c, &names) {
            Ok(sec) => out.push(sec),
            Err(e) => {
                if let Some(line) = p.lines().find(|l| Some(&l.loc) == c.from.first()) {
                    cx.refuse(line, e);
                }
            }
        }
    }
    let origins: Vec<Loc> = cs.iter().filter_map(|c| c.from.first().cloned()).collect();
    for o in origins {
        if o != p.head.loc && !out.iter().any(|r| r.from.contains(&o)) {
            cx.shadowed(&o, "every request it matches is taken by an earlier rule");
        }
    }
    let first = cx.out.routes.len();
    let out = crate::route_out::merge(out);
    let limited = out.iter().filter(|r| r.get("rate_limit").is_some()).count();
    for loc in rules.iter().filter(|_| limited > 1) {
        if let Some(l) = p.lines().find(|l| l.loc == *loc) {
            cx.diff(l, format!("veloxy keeps one bucket per route: a client gets the allowance on each of the {limited} routes carrying it (HAProxy counts them all in one table)"));
        }
    }
    if let Some(kept) = rules.first() {
        let subsumed: Vec<(Loc, u16)> = cx
            .rate_rules
            .iter()
            .filter(|(l, _)| !rules.contains(l) && p.lines().any(|x| x.loc == *l))
            .cloned()
            .collect();
        for (loc, status) in subsumed {
            cx.restate_diff(&loc, format!("the stricter limit of line {} is the routes' rate_limit (veloxy has one per route): every client this rule refuses is over it too, and veloxy answers 429 (HAProxy: {status})", kept.line));
        }
    }
    cx.out.routes.extend(out);
    crate::factor::rule_sets(&mut cx.out, first, &p.name, &p.head.loc);
}
