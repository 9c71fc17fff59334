//! `server` blocks: listeners (one per address: veloxy listeners are per address, and nginx
//! listens on IPv6 only where `[::]:` is written), the default server of each address (its
//! routes match any host), `server_name`s as route hosts, certificates chosen by SNI, and the
//! server-level `return`/`if` redirect idioms.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Config, Loc, Section};

use super::common::{self, At};
use super::location::{self, Kind};
use super::{Level, Tr};
use crate::parse::Directive;

/// One `listen`.
#[derive(Debug, Clone)]
struct Listen {
    addr: String,
    port: u16,
    ssl: bool,
    http2: bool,
    default: bool,
    proxy_protocol: bool,
}

/// What a server's locations need to know about it.
#[derive(Debug, Clone, Default)]
pub struct ServerCtx {
    /// The first name (`$server_name`).
    pub first_name: Option<String>,
    /// Every listener of the server is on its scheme's default port (80, 443): nginx's
    /// absolute redirects then carry no port.
    pub default_ports: bool,
    /// The `auth_request` URIs the server uses: locations answering them are auth locations.
    pub auth_uris: Vec<String>,
}

/// Translates every server.
pub fn translate_servers<'a>(tr: &mut Tr<'a>, servers: &[(&'a Directive, Level)]) {
    // Listeners first: every server's listen lines, and the default server of each address.
    let mut listens: Vec<Vec<Listen>> = Vec::new();
    let mut defaults: BTreeMap<String, usize> = BTreeMap::new();
    let mut explicit: Vec<String> = Vec::new();
    for (i, (d, _)) in servers.iter().enumerate() {
        let mut list = Vec::new();
        for c in d.expanded().into_iter().filter(|c| c.name == "listen") {
            match parse_listen(c) {
                Ok(l) => {
                    tr.rep.translated(&c.loc, "listen");
                    list.push(l);
                }
                Err(e) => tr.rep.refused(&c.loc, "listen", e),
            }
        }
        if !d.expanded().iter().any(|c| c.name == "listen") {
            list.push(parse_listen_text("80").expect("a port"));
        }
        for l in &list {
            let name = listener(tr, l, &d.loc);
            let explicit_before = explicit.contains(&name);
            if l.default && !explicit_before {
                explicit.push(name.clone());
                defaults.insert(name, i);
            } else {
                defaults.entry(name).or_insert(i);
            }
        }
        listens.push(list);
    }
    for (i, (d, http)) in servers.iter().enumerate() {
        let names: Vec<String> = listens[i].iter().map(listener_name).collect();
        let default_on: Vec<String> = names
            .iter()
            .filter(|n| defaults.get(*n) == Some(&i))
            .cloned()
            .collect();
        server(tr, d, http, &listens[i], &default_on);
    }
}

fn listener_name(l: &Listen) -> String {
    let v6 = l.addr.starts_with('[');
    let base = match (l.port, l.ssl) {
        (80, false) => "http".to_string(),
        (443, true) => "https".to_string(),
        (p, _) => format!("port_{p}"),
    };
    let host = l.addr.rsplit_once(':').map_or("", |(h, _)| h);
    let local = match host {
        "" | "[::]" => String::new(),
        h => format!(
            "_{}",
            veloxy_import::model::sanitize(h.trim_matches(['[', ']']))
        ),
    };
    format!(
        "{base}{local}{}",
        if v6 && host == "[::]" { "_v6" } else { "" }
    )
}

/// The listener for `l`, created on first use.
fn listener(tr: &mut Tr<'_>, l: &Listen, loc: &Loc) -> String {
    let name = listener_name(l);
    let new = !tr.cfg.listeners.iter().any(|(n, _)| *n == name);
    let s = tr.cfg.listener(&name, loc);
    if new {
        s.set("addr", l.addr.as_str());
        if l.ssl && !l.http2 {
            s.set("http2", false);
        } else if !l.ssl && l.http2 {
            s.set("http2", true);
        }
        if l.proxy_protocol {
            s.set("proxy_protocol", true);
        }
    } else if l.http2 && l.ssl {
        s.remove("http2");
    }
    name
}

fn parse_listen(d: &Directive) -> Result<Listen, String> {
    let mut l = parse_listen_text(d.arg(0))?;
    for a in d.args.iter().skip(1) {
        match a.text.as_str() {
            "ssl" => l.ssl = true,
            "http2" => l.http2 = true,
            "default_server" | "default" => l.default = true,
            "proxy_protocol" => l.proxy_protocol = true,
            "quic" | "http3" => {
                return Err("QUIC listeners: add http3 = true to the TLS listener by hand".into())
            }
            _ => {}
        }
    }
    Ok(l)
}

fn parse_listen_text(a: &str) -> Result<Listen, String> {
    if a.starts_with("unix:") {
        return Err("unix-socket listeners: veloxy listens on TCP".into());
    }
    let (host, port) = if let Ok(p) = a.parse::<u16>() {
        (String::new(), p)
    } else if let Some(rest) = a.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or(format!("address {a:?}"))?;
        (
            format!("[{h}]"),
            p.parse().map_err(|_| format!("port in {a:?}"))?,
        )
    } else if let Some((h, p)) = a.rsplit_once(':') {
        (
            h.to_string(),
            p.parse().map_err(|_| format!("port in {a:?}"))?,
        )
    } else {
        (a.to_string(), 80)
    };
    let host = match host.as_str() {
        "*" | "0.0.0.0" => String::new(),
        "localhost" => "127.0.0.1".into(),
        h => h.to_string(),
    };
    Ok(Listen {
        addr: format!("{host}:{port}"),
        port,
        ssl: false,
        http2: false,
        default: false,
        proxy_protocol: false,
    })
}

/// nginx's `$server_name`: the first `server_name` argument ("" without one), when it is a
/// literal name.
fn first_name(d: &Directive) -> Option<String> {
    let first = d
        .expanded()
        .into_iter()
        .find(|c| c.name == "server_name")
        .map_or("", |c| c.arg(0));
    (!first.starts_with(['~', '.', '*']) && !first.contains(['*', '$']))
        .then(|| first.to_ascii_lowercase())
}

fn server<'a>(
    tr: &mut Tr<'a>,
    d: &'a Directive,
    http: &Level,
    listens: &[Listen],
    default_on: &[String],
) {
    tr.rep.translated(&d.loc, "server");
    let mut lvl = http.child();
    let default_everywhere = listens
        .iter()
        .all(|l| default_on.contains(&listener_name(l)));
    let hosts = super::names::names(tr, d, default_everywhere);
    lvl.server_name = first_name(d);
    let mut locations = Vec::new();
    let mut rules = Vec::new();
    let kids = tr.flat(d.children());
    super::auth::prescan(tr, &kids, &mut lvl);
    tr.auth_targets.clear();
    for c in kids {
        match c.name.as_str() {
            "listen" | "server_name" => {}
            "location" => locations.push(c),
            "return" | "rewrite" | "if" => rules.push(c),
            "ssl" => tr.rep.translated(&c.loc, "ssl"),
            "http2" | "http3" | "quic_retry" => tr.rep.refused(
                &c.loc,
                &c.name,
                "write http2 on the listen line (nginx 1.22 syntax)",
            ),
            "access_log" => {
                if !common::directive(tr, c, &mut lvl, At::Server) {
                    tr.rep.ignored(&c.loc, "access_log", "veloxy writes one access log ([server.access_log]); per-server logs are not kept apart");
                }
            }
            _ => {
                if !common::directive(tr, c, &mut lvl, At::Server) {
                    tr.unknown(c);
                }
            }
        }
    }
    let all: Vec<String> = listens.iter().map(listener_name).collect();
    tls(tr, &lvl, listens, &hosts, default_on, &d.loc);
    let sctx = ServerCtx {
        first_name: lvl.server_name.clone(),
        default_ports: listens
            .iter()
            .all(|l| (l.port == 80 && !l.ssl) || (l.port == 443 && l.ssl)),
        auth_uris: super::auth::server_uris(d, &lvl),
    };
    // Server-level redirects: (listeners, hosts, route) taking part of the traffic first.
    let plain: Vec<String> = listens
        .iter()
        .filter(|l| !l.ssl)
        .map(listener_name)
        .collect();
    let mut serve_listeners = all.clone();
    // Hosts: None = the server's own (any host where it is the default); Some = these names
    // only, even where it is the default.
    let mut serve_hosts: Option<Vec<String>> = None;
    let mut early: Vec<(Vec<String>, Option<Vec<String>>, Section)> = Vec::new();
    let mut all_answered = false;
    for r in rules {
        match location::server_rule(tr, r, &lvl, &sctx) {
            location::ServerRule::All(sec) => {
                early.push((serve_listeners.clone(), serve_hosts.clone(), sec));
                all_answered = true;
            }
            location::ServerRule::Scheme(sec) => {
                early.push((plain.clone(), serve_hosts.clone(), sec));
                serve_listeners.retain(|l| !plain.contains(l));
                if serve_listeners.is_empty() {
                    all_answered = true;
                }
            }
            location::ServerRule::Host { names, negate, sec } => {
                if negate {
                    early.push((serve_listeners.clone(), None, sec));
                    serve_hosts = Some(names);
                } else {
                    early.push((serve_listeners.clone(), Some(names), sec));
                }
            }
            location::ServerRule::Regex(sec) => {
                early.push((serve_listeners.clone(), serve_hosts.clone(), sec))
            }
            location::ServerRule::None => {}
        }
    }
    let mut drafts = Vec::new();
    if all_answered {
        for l in locations {
            tr.skip_ignored(
                l,
                "never reached: the server's return answers every request first",
            );
        }
    } else {
        for l in locations {
            location::location(tr, l, &lvl, &sctx, None, &mut drafts);
        }
        location::fallback(tr, &lvl, &sctx, &mut drafts, &d.loc);
        super::auth::resolve(tr, &mut drafts);
    }
    drafts.sort_by_key(|d| match d.kind {
        Kind::Regex => (0, 0),
        Kind::PrefixRegex(n) => (1, usize::MAX - n),
        Kind::Other => (2, 0),
    });
    for (ls, h, sec) in early {
        emit(tr, &ls, default_on, &hosts, h.as_deref(), sec);
    }
    for dr in drafts {
        emit(
            tr,
            &serve_listeners,
            default_on,
            &hosts,
            serve_hosts.as_deref(),
            dr.sec,
        );
    }
}

/// Adds `body` as routes on `listeners` for `hosts`: on the listeners where this server is
/// the default, with no host (it answers any name); elsewhere for its names.
/// `only`: these names alone, even where the server is the default.
fn emit(
    tr: &mut Tr<'_>,
    listeners: &[String],
    default_on: &[String],
    hosts: &[String],
    only: Option<&[String]>,
    body: Section,
) {
    let every: Vec<String> = tr
        .cfg
        .listeners
        .iter()
        .filter(|(_, s)| s.get("protocol").is_none())
        .map(|(n, _)| n.clone())
        .collect();
    let (dflt, named): (Vec<String>, Vec<String>) = match only {
        Some(_) => (Vec::new(), listeners.to_vec()),
        None => listeners
            .iter()
            .cloned()
            .partition(|l| default_on.contains(l)),
    };
    let hosts = only.unwrap_or(hosts);
    for (ls, any) in [(dflt, true), (named, false)] {
        if ls.is_empty() || (!any && hosts.is_empty()) {
            continue;
        }
        let mut r = Section {
            from: body.from.clone(),
            comments: body.comments.clone(),
            keys: Vec::new(),
        };
        let covers_all = ls.len() == every.len();
        if !covers_all {
            r.set("listener", names_value(&ls));
        }
        if !any {
            r.set("host", names_value(hosts));
        }
        r.keys.extend(body.keys.iter().cloned());
        tr.cfg.routes.push(r);
    }
}

/// One name as a string, several as a list.
pub fn names_value(list: &[String]) -> Value {
    match list {
        [one] => Value::from(one.as_str()),
        many => Value::Array(many.iter().map(|s| Value::from(s.as_str())).collect()),
    }
}

/// The server's certificate on its TLS listeners: the default certificate where it is the
/// default server (or the first with one), else an SNI entry for its names.
fn tls(
    tr: &mut Tr<'_>,
    lvl: &Level,
    listens: &[Listen],
    hosts: &[String],
    default_on: &[String],
    loc: &Loc,
) {
    let (Some(cert), Some(key)) = (&lvl.cert, &lvl.key) else {
        return;
    };
    for l in listens.iter().filter(|l| l.ssl) {
        let name = listener_name(l);
        let s = tr.cfg.listener(&name, loc);
        let tls = s.table("tls");
        let has_default = tls.contains_key("cert");
        if !has_default && (default_on.contains(&name) || hosts.is_empty()) {
            tls.insert("cert".into(), cert.as_str().into());
            tls.insert("key".into(), key.as_str().into());
            continue;
        }
        if !has_default && tls.get("certs").is_none() {
            tls.insert("cert".into(), cert.as_str().into());
            tls.insert("key".into(), key.as_str().into());
            continue;
        }
        if tls.get("cert").and_then(|c| c.as_str()) == Some(cert.as_str()) || hosts.is_empty() {
            continue;
        }
        let mut entry = toml::Table::new();
        entry.insert(
            "hosts".into(),
            Value::Array(hosts.iter().map(|h| Value::from(h.as_str())).collect()),
        );
        entry.insert("cert".into(), cert.as_str().into());
        entry.insert("key".into(), key.as_str().into());
        match tls.get_mut("certs") {
            Some(Value::Array(a)) => a.push(Value::Table(entry)),
            _ => {
                tls.insert("certs".into(), Value::Array(vec![Value::Table(entry)]));
            }
        }
    }
    let _ = Config::unique;
}
