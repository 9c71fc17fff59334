//! The `stream` block: a `server` with `proxy_pass` becomes a `protocol = "tcp"` listener
//! relaying to a group. SNI routing (`ssl_preread on` with `proxy_pass $var` and a `map
//! $ssl_preread_server_name $var { ... }`) becomes `[[streams]]` entries with `sni` on that
//! listener, one per target group, and the map's `default` the entry without `sni`.

use std::collections::HashMap;

use toml::Value;
use veloxy_import::{Config, Loc, Section};

use super::Tr;
use crate::parse::Directive;

/// A `map $ssl_preread_server_name $var`: (names, target) in order, and the default.
#[derive(Default)]
struct SniMap {
    entries: Vec<(String, String)>,
    default: Option<String>,
}

/// Translates one `stream { }` block.
pub fn translate<'a>(tr: &mut Tr<'a>, d: &'a Directive) {
    tr.rep.translated(&d.loc, "stream");
    for c in d.children() {
        if c.name == "upstream" {
            super::upstream::collect(tr, c);
        }
    }
    let mut maps: HashMap<String, SniMap> = HashMap::new();
    for c in d.children() {
        if c.name == "map" && c.arg(0) == "$ssl_preread_server_name" {
            let var = c.arg(1).trim_start_matches('$').to_string();
            maps.insert(var, sni_map(tr, c));
        }
    }
    for c in d.children() {
        match c.name.as_str() {
            "upstream" => {}
            "map" if c.arg(0) == "$ssl_preread_server_name" => {}
            "server" => server(tr, c, &maps),
            "include" => tr.include(c, |tr, list| {
                for x in list {
                    if x.name == "server" {
                        server(tr, x, &maps)
                    } else {
                        tr.unknown(x)
                    }
                }
            }),
            "proxy_connect_timeout"
            | "proxy_timeout"
            | "log_format"
            | "access_log"
            | "error_log" => tr.rep.ignored(&c.loc, &c.name, "stream tuning and logs"),
            _ => tr.unknown(c),
        }
    }
}

/// Reads a map of server names: exact names and wildcards (`*.x`, `.x` as `x` and `*.x`);
/// regex entries are refused (veloxy's `sni` is names and suffixes).
fn sni_map(tr: &mut Tr<'_>, d: &Directive) -> SniMap {
    tr.rep.translated(&d.loc, "map");
    let mut m = SniMap {
        entries: Vec::new(),
        default: d
            .children()
            .iter()
            .find(|e| e.name == "default")
            .map(|e| e.arg(0).to_string()),
    };
    for e in d.children() {
        let (name, target) = (e.name.as_str(), e.arg(0).to_string());
        match name {
            "hostnames" => tr.rep.translated(&e.loc, "hostnames"),
            "default" => tr.rep.translated(&e.loc, "default"),
            n if n.starts_with('~') && m.default.as_deref() == Some(target.as_str()) => tr
                .rep
                .ignored(&e.loc, n, "its target is the map's default anyway"),
            n if n.starts_with('~') => tr.rep.refused(
                &e.loc,
                n,
                "a regex server name: veloxy's sni lists exact names and *.suffix wildcards",
            ),
            n if n.starts_with('.') => {
                m.entries.push((n[1..].to_string(), target.clone()));
                m.entries.push((format!("*{n}"), target));
                tr.rep.translated(&e.loc, n);
            }
            n => {
                m.entries.push((n.to_string(), target));
                tr.rep.translated(&e.loc, n);
            }
        }
    }
    m
}

fn server(tr: &mut Tr<'_>, d: &Directive, maps: &HashMap<String, SniMap>) {
    let listen = d.children().iter().find(|c| c.name == "listen");
    let pass = d.children().iter().find(|c| c.name == "proxy_pass");
    let (Some(l), Some(p)) = (listen, pass) else {
        tr.skip(d, "a stream server without listen and proxy_pass");
        return;
    };
    let preread = d
        .children()
        .iter()
        .find(|c| c.name == "ssl_preread" && c.arg(0) == "on");
    let map = p
        .arg(0)
        .strip_prefix('$')
        .and_then(|v| maps.get(v))
        .filter(|_| preread.is_some());
    if (p.arg(0).starts_with('$') && map.is_none())
        || l.args.iter().any(|a| a.text == "udp" || a.text == "ssl")
    {
        tr.skip(
            d,
            "UDP, TLS termination or a variable target in stream: veloxy relays TCP, by SNI \
             with ssl_preread and a map of $ssl_preread_server_name",
        );
        return;
    }
    tr.rep.translated(&d.loc, "server");
    let port = l.arg(0).rsplit(':').next().unwrap_or("").to_string();
    let addr = if l.arg(0).contains(':') {
        l.arg(0).to_string()
    } else {
        format!(":{port}")
    };
    let lname = Config::unique(&tr.cfg.listeners, &format!("tcp_{port}"));
    let ls = tr.cfg.listener(&lname, &d.loc);
    ls.set("addr", addr);
    ls.set("protocol", "tcp");
    tr.rep.translated(&l.loc, "listen");
    match map {
        None => {
            let group = target_group(tr, p.arg(0), &p.loc);
            push_stream(tr, &d.loc, &lname, None, group);
        }
        Some(m) => {
            // One entry per target, in the order the map first names it.
            let mut targets: Vec<(&str, Vec<String>)> = Vec::new();
            for (name, target) in &m.entries {
                match targets.iter_mut().find(|(t, _)| t == target) {
                    Some((_, names)) => names.push(name.clone()),
                    None => targets.push((target, vec![name.clone()])),
                }
            }
            for (target, names) in targets {
                let group = target_group(tr, target, &p.loc);
                push_stream(tr, &d.loc, &lname, Some(names), group);
            }
            if let Some(def) = &m.default {
                let group = target_group(tr, def, &p.loc);
                push_stream(tr, &d.loc, &lname, None, group);
            }
        }
    }
    tr.rep.translated(&p.loc, "proxy_pass");
    for c in d.children() {
        if std::ptr::eq(c, l) || std::ptr::eq(c, p) {
            continue;
        }
        match c.name.as_str() {
            "ssl_preread" => tr.rep.translated(&c.loc, "ssl_preread"),
            "proxy_connect_timeout" | "proxy_timeout" => tr.rep.different(
                &c.loc,
                &c.name,
                "veloxy's stream timeouts are its group's connect_timeout and idle_timeout (not set)",
            ),
            _ => tr.unknown(c),
        }
    }
}

/// The group a stream target names: an `upstream` block's servers, or one address (a group
/// made once per target and reused).
fn target_group(tr: &mut Tr<'_>, target: &str, loc: &Loc) -> String {
    let existing = |tr: &Tr<'_>, name: &str| {
        tr.cfg
            .upstreams
            .iter()
            .any(|(n, _)| n == &veloxy_import::model::sanitize(name))
    };
    if existing(tr, target) {
        return veloxy_import::model::sanitize(target);
    }
    match tr.block_servers(target) {
        Some((bloc, servers)) => {
            let name = Config::unique(&tr.cfg.upstreams, target);
            let g = tr.cfg.upstream(&name, &bloc);
            g.set(
                "servers",
                Value::Array(servers.into_iter().map(Value::from).collect()),
            );
            name
        }
        None => {
            let base = target.split(':').next().unwrap_or("tcp");
            let name = Config::unique(&tr.cfg.upstreams, base);
            let g = tr.cfg.upstream(&name, loc);
            g.set("servers", Value::Array(vec![Value::from(target)]));
            name
        }
    }
}

fn push_stream(
    tr: &mut Tr<'_>,
    loc: &Loc,
    listener: &str,
    sni: Option<Vec<String>>,
    group: String,
) {
    let mut st = Section::from(loc);
    st.set("listener", listener);
    if let Some(names) = sni {
        st.set(
            "sni",
            Value::Array(names.into_iter().map(Value::from).collect()),
        );
    }
    st.set("upstream", group);
    tr.cfg.streams.push(st);
}
