//! The `stream` block: a `server` with `proxy_pass` becomes a TCP listener relaying to a
//! group. SNI routing (`ssl_preread` with a `map` of `$ssl_preread_server_name`) needs a TLS
//! listener in veloxy (names not listed are terminated by veloxy), so it is refused.

use toml::Value;
use veloxy_import::{Config, Section};

use super::Tr;
use crate::parse::Directive;

/// Translates one `stream { }` block.
pub fn translate<'a>(tr: &mut Tr<'a>, d: &'a Directive) {
    tr.rep.translated(&d.loc, "stream");
    for c in d.children() {
        if c.name == "upstream" {
            super::upstream::collect(tr, c);
        }
    }
    for c in d.children() {
        match c.name.as_str() {
            "upstream" => {}
            "server" => server(tr, c),
            "map" if c.arg(0) == "$ssl_preread_server_name" => {
                tr.rep.refused(&c.loc, "map", "SNI routing of passthrough TLS: veloxy's [[streams]] sni needs a TLS listener of its own for the other names");
                for e in c.children() {
                    tr.skip(e, "an entry of a refused map");
                }
            }
            "include" => tr.include(c, |tr, list| {
                for x in list {
                    if x.name == "server" {
                        server(tr, x)
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

fn server(tr: &mut Tr<'_>, d: &Directive) {
    let listen = d.children().iter().find(|c| c.name == "listen");
    let pass = d.children().iter().find(|c| c.name == "proxy_pass");
    let (Some(l), Some(p)) = (listen, pass) else {
        tr.skip(d, "a stream server without listen and proxy_pass");
        return;
    };
    if d.children().iter().any(|c| c.name == "ssl_preread")
        || p.arg(0).starts_with('$')
        || l.args.iter().any(|a| a.text == "udp" || a.text == "ssl")
    {
        tr.skip(d, "SNI routing, UDP or TLS termination in stream: veloxy relays plain TCP (or SNI on its own TLS listener)");
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
    let target = p.arg(0).to_string();
    let group = match tr.block_servers(&target) {
        Some((loc, servers)) => {
            let name = Config::unique(&tr.cfg.upstreams, &target);
            let g = tr.cfg.upstream(&name, &loc);
            g.set(
                "servers",
                Value::Array(servers.into_iter().map(Value::from).collect()),
            );
            name
        }
        None => {
            let name = Config::unique(&tr.cfg.upstreams, target.split(':').next().unwrap_or("tcp"));
            let g = tr.cfg.upstream(&name, &p.loc);
            g.set("servers", Value::Array(vec![Value::from(target.as_str())]));
            name
        }
    };
    tr.rep.translated(&p.loc, "proxy_pass");
    let mut st = Section::from(&d.loc);
    st.set("listener", lname);
    st.set("upstream", group);
    tr.cfg.streams.push(st);
    for c in d.children() {
        if std::ptr::eq(c, l) || std::ptr::eq(c, p) {
            continue;
        }
        match c.name.as_str() {
            "proxy_connect_timeout" | "proxy_timeout" => tr.rep.different(&c.loc, &c.name, "veloxy's stream timeouts are its group's connect_timeout and idle_timeout (not set)"),
            _ => tr.unknown(c),
        }
    }
}
