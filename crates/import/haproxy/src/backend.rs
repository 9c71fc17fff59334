//! Backends (and the server half of `listen`): servers, balance, checks, persistence, timeouts.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Config, Section};

use crate::parse::{Line, Section as Src};
use crate::proxy::Proxy;
use crate::Ctx;

/// What frontends need to know about each backend.
#[derive(Debug, Default)]
pub struct Groups {
    /// By HAProxy backend name.
    pub by_name: BTreeMap<String, Group>,
}

/// One translated backend.
#[derive(Debug, Clone)]
pub struct Group {
    /// The veloxy upstream group, `None` when no server is usable (HAProxy answers 503).
    pub upstream: Option<String>,
    /// `option forwardfor` in effect.
    pub forwardfor: bool,
    /// `timeout tunnel` (or the longer of client/server), for WebSockets.
    pub tunnel: Option<String>,
}

use crate::params::QUIET;
pub(crate) use crate::params::{get, has, params};

/// One usable server.
pub(crate) struct Server<'l> {
    pub(crate) line: &'l Line,
    pub(crate) entry: Value,
    pub(crate) p: Vec<(String, Option<String>)>,
}

/// Translates backend `p` into an upstream group.
pub fn translate(cx: &mut Ctx, p: &Proxy, resolvers: &[&Src], groups: &mut Groups) {
    if p.kind == "backend" {
        cx.ok(p.head);
        crate::frontend::common(cx, p);
    }
    let mut defaults: Vec<(String, Option<String>)> = Vec::new();
    let mut servers: Vec<Server> = Vec::new();
    for l in p.lines() {
        if l.kw() == "default-server" {
            defaults.extend(params(&l.args()));
            cx.ok(l);
        }
    }
    for l in p.own.iter().copied() {
        match l.kw() {
            "server" | "server-template" => {
                if let Some(s) = server(cx, l, &defaults, resolvers) {
                    servers.push(s);
                }
            }
            _ => {}
        }
    }
    let name = Config::unique(&cx.out.upstreams, &p.name);
    let forwardfor = p.option("forwardfor").is_some();
    let tunnel = p
        .last("timeout", Some("tunnel"))
        .and_then(|l| l.arg(1))
        .and_then(crate::duration);
    if servers.is_empty() {
        no_server(cx, p);
        groups.by_name.insert(
            p.name.clone(),
            Group {
                upstream: None,
                forwardfor,
                tunnel,
            },
        );
        return;
    }
    let mut sec = Section::from(&p.head.loc);
    let list: Vec<Value> = servers.iter().map(|s| s.entry.clone()).collect();
    sec.set("servers", Value::Array(list));
    balance(cx, p, &mut sec);
    group_tls(cx, &servers, &mut sec, p);
    if p.tcp() {
        crate::checks::tcp_timeouts(cx, p, &mut sec);
    } else {
        timeouts(cx, p, &mut sec);
    }
    crate::checks::health(cx, p, &servers, &mut sec);
    crate::checks::persistence(cx, p, &servers, &mut sec);
    crate::checks::limits(cx, &servers, &mut sec);
    crate::checks::retries(cx, p, servers.len(), &mut sec);
    for l in p.lines() {
        match (l.kw(), l.arg(0)) {
            ("option", Some("redispatch")) => cx.ok(l),
            ("option", Some("forwardfor")) if !cx.decided(l) => cx.ok(l),
            ("http-reuse", _) => cx.ignore(l, "upstream connection reuse: no visible effect"),
            ("fullconn", _) | ("hash-balance-factor", _) => cx.ignore(l, "balancing tuning"),
            ("stick-table", _) if !p.own.iter().any(|x| x.kw() == "stick") => {}
            ("stick-table" | "stick" | "stick-on", _) => {
                cx.refuse(l, "stick tables: veloxy has cookie and hash affinity only (balance source, cookie insert)")
            }
            _ => {}
        }
    }
    cx.out.upstreams.push((name.clone(), sec));
    groups.by_name.insert(
        p.name.clone(),
        Group {
            upstream: Some(name),
            forwardfor,
            tunnel,
        },
    );
}

/// A backend without a usable server: HAProxy answers 503 without connecting anywhere, so
/// its connection settings change nothing.
fn no_server(cx: &mut Ctx, p: &Proxy) {
    if crate::stats::only(p) {
        if p.kind == "backend" {
            cx.diff(p.head, "a statistics-page backend: veloxy answers the requests sent to it 503 (it has no stats page; its admin endpoint replaces it)");
            crate::stats::rest(cx, p);
        }
        return;
    }
    let table_only = !p
        .own
        .iter()
        .any(|l| matches!(l.kw(), "server" | "server-template"))
        && p.own.iter().any(|l| l.kw() == "stick-table");
    if table_only {
        cx.shadowed(&p.head.loc, STICK_TABLE);
    } else if p.kind == "backend" {
        cx.diff(
            p.head,
            "no usable server: HAProxy answers 503 (veloxy: the same fixed answer)",
        );
    }
    for l in p.lines() {
        let rule = matches!(
            l.kw(),
            "acl"
                | "http-request"
                | "http-response"
                | "http-after-response"
                | "redirect"
                | "server"
                | "server-template"
                | "stats"
                | "mode"
                | "tcp-request"
                | "tcp-response"
                | "use-server"
        );
        if rule || cx.decided(l) {
            continue;
        }
        if l.kw() == "stick-table" {
            cx.ignore(l, STICK_TABLE);
        } else {
            cx.ignore(
                l,
                "no usable server: HAProxy answers 503 without connecting to a server, so this changes nothing",
            );
        }
    }
}

/// A `stick-table` nothing sticks on: counters for rules (those rules are reported).
pub(crate) const STICK_TABLE: &str =
    "a table of counters: only the rules that use it change answers (those are reported)";

/// A `server` (or `server-template`) line: its entry, or `None` when left out.
fn server<'l>(
    cx: &mut Ctx,
    l: &'l Line,
    defaults: &[(String, Option<String>)],
    resolvers: &[&Src],
) -> Option<Server<'l>> {
    if let Some(e) = &l.env_error {
        cx.refuse(l, e.clone());
        return None;
    }
    let args = l.args();
    let template = l.kw() == "server-template";
    let (addr, rest) = if template {
        (
            args.get(2).copied().unwrap_or_default(),
            args.get(3..).unwrap_or(&[]),
        )
    } else {
        (
            args.get(1).copied().unwrap_or_default(),
            args.get(2..).unwrap_or(&[]),
        )
    };
    let mut p = defaults.to_vec();
    p.extend(params(rest));
    let backup = has(&p, "backup");
    if has(&p, "disabled") {
        cx.ok(l);
        return None;
    }
    let weight = get(&p, "weight")
        .map(|w| w.parse::<i64>().unwrap_or(1))
        .unwrap_or(1);
    if weight == 0 {
        cx.ok(l);
        return None;
    }
    let addr = addr
        .trim_start_matches("ipv4@")
        .trim_start_matches("ipv6@")
        .trim_start_matches("tcp@")
        .trim_start_matches("tcp4@")
        .trim_start_matches("tcp6@");
    let addr = if let Some(path) = addr
        .strip_prefix("unix@")
        .or_else(|| addr.strip_prefix('/').map(|_| addr))
    {
        format!("unix:{path}")
    } else {
        let Some((host, port)) = addr
            .rsplit_once(':')
            .filter(|(_, p)| p.parse::<u16>().is_ok())
        else {
            cx.refuse(l, format!("server address {addr}: veloxy needs a fixed port (HAProxy uses the client's port when none is given)"));
            return None;
        };
        format!("{host}:{port}")
    };
    let mut notes = Vec::new();
    let dns = get(&p, "resolvers").is_some() || template;
    let entry = match dns {
        true if !addr.starts_with("unix:") => {
            let mut t = toml::Table::new();
            t.insert("dns".into(), addr.clone().into());
            let hold = resolvers
                .iter()
                .find(|s| s.name == r_or(&p))
                .and_then(|s| crate::global::hold_valid(s));
            if let Some(h) = hold.filter(|h| h != "10s") {
                t.insert("resolve".into(), h.into());
            }
            if weight != 1 {
                t.insert("weight".into(), weight.into());
            }
            if template {
                notes.push(format!(
                    "veloxy sends to every address {addr} resolves to (HAProxy fills at most {} server slots)",
                    args.get(1).unwrap_or(&"?")
                ));
            }
            Value::Table(t)
        }
        _ if weight != 1 || backup => {
            let mut t = toml::Table::new();
            t.insert("addr".into(), addr.clone().into());
            if weight != 1 {
                t.insert("weight".into(), weight.into());
            }
            Value::Table(t)
        }
        _ => Value::from(addr.clone()),
    };
    // veloxy's backup server: picked only while no other server may be, as HAProxy's.
    let entry = match entry {
        Value::Table(mut t) if backup => {
            t.insert("backup".into(), true.into());
            Value::Table(t)
        }
        e => e,
    };
    for (k, v) in &p {
        match k.as_str() {
            "check" | "inter" | "rise" | "fall" | "weight" | "cookie" | "maxconn" | "ssl" | "verify" | "backup"
            | "ca-file" | "sni" | "alpn" | "proto" | "send-proxy" | "send-proxy-v2" | "resolvers"
            | "no-ssl" | "no-send-proxy" | "no-send-proxy-v2" => {}
            "slowstart" => notes.push("slowstart: veloxy gives a recovered server its full weight at once".into()),
            "observe" => notes.push("observe: veloxy's passive checks (outlier) always watch connections and 5xx answers".into()),
            "on-marked-down" | "on-marked-up" => notes.push(format!("{k}: veloxy keeps established connections to a server marked down")),
            "port" | "addr" => notes.push(format!("{k} {}: veloxy checks the server's own address", v.as_deref().unwrap_or(""))),
            "agent-check" | "agent-port" | "agent-inter" | "agent-addr" | "agent-send" => {
                cx.refuse(l, "agent checks: veloxy has HTTP and TCP checks only");
                return Some(Server { line: l, entry, p });
            }
            "track" => notes.push("track: veloxy checks this server itself".into()),
            "crt" => {
                cx.refuse(l, "crt: veloxy has no client certificates toward backends");
                return Some(Server { line: l, entry, p });
            }
            "send-proxy-v2-ssl" | "send-proxy-v2-ssl-cn" | "source" | "usesrc" | "namespace" | "redir" => {
                cx.refuse(l, format!("{k}: veloxy has no equivalent"));
                return Some(Server { line: l, entry, p });
            }
            q if QUIET.contains(&q) => {}
            other => notes.push(format!("{other}: not translated")),
        }
    }
    if notes.is_empty() {
        cx.ok(l);
    } else {
        for n in notes {
            cx.diff(l, n);
        }
    }
    Some(Server { line: l, entry, p })
}

fn r_or(p: &[(String, Option<String>)]) -> String {
    get(p, "resolvers").unwrap_or_default().to_string()
}

fn balance(cx: &mut Ctx, p: &Proxy, sec: &mut Section) {
    let Some(l) = p.last("balance", None) else {
        return;
    };
    let arg = l.arg(0).unwrap_or("roundrobin");
    let (policy, key) = match arg {
        "roundrobin" | "static-rr" => ("round_robin", None),
        "leastconn" => ("least_conn", None),
        "random" => ("random", None),
        "source" => ("consistent_hash", Some("client_ip".to_string())),
        "uri" => ("consistent_hash", Some("path".to_string())),
        a if a.starts_with("hdr(") => (
            "consistent_hash",
            Some(format!(
                "header:{}",
                a.trim_start_matches("hdr(").trim_end_matches(')')
            )),
        ),
        a if a.starts_with("rdp-cookie") => {
            cx.refuse(l, "balance rdp-cookie: veloxy has no RDP cookie hashing");
            return;
        }
        a => {
            cx.refuse(l, format!("balance {a}: veloxy has round_robin, least_conn, random and consistent_hash on the client address, path, a header or a cookie"));
            return;
        }
    };
    if policy != "round_robin" {
        sec.set("policy", policy);
    }
    if let Some(k) = key {
        sec.set("hash_key", k);
    }
    if arg == "uri" && l.args().len() > 1 {
        cx.diff(l, "the options of balance uri (len, depth, whole) are not translated: veloxy hashes the whole path");
    } else if arg == "random" && l.args().len() > 1 {
        cx.diff(
            l,
            "veloxy picks one random server (HAProxy: the best of several draws)",
        );
    } else {
        cx.ok(l);
    }
    for h in p.lines().filter(|x| x.kw() == "hash-type") {
        cx.ok(h);
    }
}

fn group_tls(cx: &mut Ctx, servers: &[Server], sec: &mut Section, p: &Proxy) {
    let ssl: Vec<bool> = servers.iter().map(|s| has(&s.p, "ssl")).collect();
    if ssl.iter().any(|&b| b) {
        if ssl.iter().any(|&b| !b) {
            for s in servers.iter().filter(|s| !has(&s.p, "ssl")) {
                cx.refuse(s.line, "veloxy speaks TLS to every server of a group or to none; this one (without ssl) is sent TLS too");
            }
        }
        let list: Vec<Value> = servers.iter().map(|s| https(&s.entry)).collect();
        sec.set("servers", Value::Array(list));
        let first = &servers[0].p;
        let unverified: Vec<bool> = servers
            .iter()
            .map(|s| get(&s.p, "verify") == Some("none"))
            .collect();
        let all_unverified = unverified.iter().all(|&u| u);
        if all_unverified {
            // HAProxy ignores ca-file then; veloxy refuses ca_file beside tls_verify = false.
            sec.set("tls_verify", false);
        } else if let Some(ca) = get(first, "ca-file") {
            let ca_base = cx.ca_base.clone();
            sec.set("ca_file", cx.path(ca_base.as_deref(), ca));
        }
        if let Some(sni) = get(first, "sni") {
            match sni.strip_prefix("str(").and_then(|s| s.strip_suffix(')')) {
                Some(name) => {
                    sec.set("tls_server_name", name);
                }
                None if sni.contains("hdr(host)") => {
                    for s in servers {
                        cx.diff(s.line, "sni from the request's Host: veloxy sends the server's host name (or tls_server_name) as SNI");
                    }
                }
                None => {
                    for s in servers {
                        cx.refuse(
                            s.line,
                            format!("sni {sni}: veloxy's SNI toward a group is one fixed name"),
                        );
                    }
                }
            }
        }
        for (s, &u) in servers.iter().zip(&unverified) {
            if u && !all_unverified {
                cx.refuse(s.line, "verify none beside servers that verify: veloxy's tls_verify = false covers a whole group; this server's certificate would be checked (a self-signed one fails with 502)");
            }
        }
        if get(first, "alpn").is_some_and(|a| a.split(',').next() == Some("h2")) {
            sec.set("protocol", "h2");
        }
    } else if servers.iter().any(|s| get(&s.p, "proto") == Some("h2")) {
        sec.set("protocol", "h2c");
    }
    let _ = p;
}

fn https(entry: &Value) -> Value {
    match entry {
        Value::String(a) => Value::from(format!("https://{a}")),
        Value::Table(t) => {
            let mut t = t.clone();
            for k in ["addr", "dns"] {
                if let Some(Value::String(a)) = t.get(k).cloned() {
                    t.insert(k.into(), format!("https://{a}").into());
                }
            }
            Value::Table(t)
        }
        v => v.clone(),
    }
}

fn timeouts(cx: &mut Ctx, p: &Proxy, sec: &mut Section) {
    let mut missing = Vec::new();
    match p.last("timeout", Some("connect")) {
        Some(l) => match l.arg(1).and_then(crate::duration) {
            Some(d) => {
                if d != "2s" {
                    sec.set("connect_timeout", d);
                }
                cx.ok(l);
            }
            None => cx.refuse(l, "a malformed time"),
        },
        None => missing.push(
            "no timeout connect: HAProxy waits without limit, veloxy's connect_timeout is 2s",
        ),
    }
    match p.last("timeout", Some("server")) {
        Some(l) => match l.arg(1).and_then(crate::duration) {
            Some(d) => {
                if d != "30s" {
                    sec.set("read_timeout", d.clone());
                    sec.set("write_timeout", d);
                }
                cx.ok(l);
            }
            None => cx.refuse(l, "a malformed time"),
        },
        None => missing
            .push("no timeout server: HAProxy waits without limit, veloxy's read_timeout is 30s"),
    }
    for m in missing {
        cx.diff(p.head, m);
    }
    for l in p.lines().filter(|l| l.kw() == "timeout") {
        match l.arg(0) {
            Some("queue") => cx.ignore(
                l,
                "veloxy does not queue at servers (beyond max_connections it answers 503)",
            ),
            Some("tunnel") => cx.ok(l),
            _ => {}
        }
    }
}
