//! HTTP services: `loadBalancer` (servers, weights, sticky cookie, health check,
//! passHostHeader, serversTransport) and `weighted` services of plain load balancers become
//! upstream groups.

use std::collections::BTreeMap;

use veloxy_import::tree::Node;
use veloxy_import::Loc;

use crate::auth::{server_entry, split_url};
use crate::input::{strip_provider, Named};
use crate::lines::Lines;
use crate::node::{entries, flag, get, get_kv, int, items, list_at, seconds, text};
use crate::translate::Ctx;

/// A server of a load balancer: (https, host:port, weight, h2c).
type Server = (bool, String, i64, bool);

/// The upstream group of service `name` (translated once), or why there is none.
pub fn upstream(ctx: &mut Ctx, name: &str) -> Result<String, String> {
    if let Some(internal) = name.strip_suffix("@internal") {
        return Err(format!(
            "Traefik's internal service {internal} (its dashboard, API or ping)"
        ));
    }
    let name = strip_provider(name).to_string();
    if let Some(r) = ctx.services.get(&name) {
        return r.clone();
    }
    let r = translate(ctx, &name);
    ctx.services.insert(name, r.clone());
    r
}

fn translate(ctx: &mut Ctx, name: &str) -> Result<String, String> {
    let svc = ctx
        .inp
        .services
        .iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| "not defined".to_string())?;
    let key = format!("http.services.{name}");
    let Some((k, body)) = entries(&svc.node)
        .first()
        .map(|(k, v)| (k.clone(), v.clone()))
    else {
        ctx.lines.at(&key, &svc.loc, &key).refuse("empty service");
        return Err("empty".into());
    };
    let directive = format!("{key}.{}", k.name);
    let mut lines = std::mem::take(&mut ctx.lines);
    lines.at(&key, &svc.loc, &directive);
    let r = match k.name.to_ascii_lowercase().as_str() {
        "loadbalancer" => load_balancer(ctx, &mut lines, &svc, &key, &body),
        "weighted" => weighted(ctx, &mut lines, &svc, &key, &body),
        "mirroring" => Err(
            "a mirroring service is not translated (veloxy's route key mirror = { upstream, \
             percent } does it: add it to the imported routes)"
                .to_string(),
        ),
        "failover" => Err(
            "veloxy has no failover between services (a group's servers are all active)"
                .to_string(),
        ),
        other => Err(format!("unknown service type {other}")),
    };
    if let Err(why) = &r {
        lines.at(&key, &svc.loc, &directive).refuse(why.clone());
    }
    ctx.lines = lines;
    r
}

fn servers_of(lb: &Node) -> Result<Vec<Server>, String> {
    let mut out = Vec::new();
    for s in get(lb, "servers").map(items).unwrap_or_default() {
        let url = text(s, "url").ok_or("a server without url")?;
        let (https, hostport, path) =
            split_url(&url).ok_or_else(|| format!("server {url} is not an http(s) or h2c URL"))?;
        if path != "/" {
            return Err(format!(
                "server {url} has a path: veloxy sends the request's own path"
            ));
        }
        let weight = int(s, "weight").unwrap_or(1);
        if weight <= 0 {
            continue;
        }
        out.push((
            https,
            hostport,
            weight,
            url.to_ascii_lowercase().starts_with("h2c://"),
        ));
    }
    if out.is_empty() {
        return Err("no servers (for a container: add a loadbalancer.server.port label)".into());
    }
    Ok(out)
}

fn load_balancer(
    ctx: &mut Ctx,
    lines: &mut Lines,
    svc: &Named,
    key: &str,
    lb: &Node,
) -> Result<String, String> {
    let servers = servers_of(lb)?;
    let group = veloxy_import::Config::unique(&ctx.cfg.upstreams, &svc.name);
    write_servers(ctx, &group, &svc.loc, &servers)?;
    let mut notes = default_notes(servers.len());
    for (k, v) in entries(lb) {
        let sub = format!("{key}.loadBalancer.{}", k.name);
        match k.name.to_ascii_lowercase().as_str() {
            "servers" | "server" => {}
            "sticky" => sticky(ctx, lines.at(&sub, &k.loc, &sub), &group, &svc.loc, v),
            "healthcheck" => health(ctx, lines.at(&sub, &k.loc, &sub), &group, &svc.loc, v),
            "passhostheader" => {
                let l = lines.at(&sub, &k.loc, &sub);
                if v.as_bool() == Some(false) {
                    let host = servers[0].1.clone();
                    if servers.len() > 1 {
                        l.note(format!(
                            "Host is set to the first server's address {host} for every server"
                        ));
                    }
                    ctx.pass_host.insert(group.clone(), host);
                }
            }
            "serverstransport" => {
                let name = strip_provider(&v.scalar().unwrap_or_default()).to_string();
                transport_named(ctx, lines, &group, &svc.loc, &name, &k.loc);
                notes.retain(|n| !n.starts_with("veloxy's default timeouts"));
            }
            "responseforwarding" => {
                lines.at(&sub, &k.loc, &sub).ignored =
                    Some("veloxy streams answers as they arrive".into());
            }
            "strategy" => {
                let s = v.scalar().unwrap_or_default().to_ascii_lowercase();
                let l = lines.at(&sub, &k.loc, &sub);
                match s.as_str() {
                    "wrr" | "" => {}
                    "p2c" => {
                        ctx.cfg.upstream(&group, &svc.loc).set("policy", "p2c_ewma");
                        l.note("veloxy's p2c compares latency times in-flight requests (Traefik: in-flight requests)");
                    }
                    "leasttime" => {
                        ctx.cfg.upstream(&group, &svc.loc).set("policy", "p2c_ewma");
                        l.note("veloxy's p2c_ewma picks by latency from two random servers");
                    }
                    other => {
                        l.refuse(format!("strategy {other}"));
                    }
                }
            }
            _ => {
                lines
                    .at(&sub, &k.loc, &sub)
                    .refuse("unknown loadBalancer option");
            }
        }
    }
    if get(lb, "serversTransport").is_none() {
        if let Some((t, l)) = ctx.global_transport.clone() {
            transport(ctx, lines, &group, &svc.loc, &t, "serversTransport", &l);
            notes.retain(|n| !n.starts_with("veloxy's default timeouts"));
        }
    }
    let line = lines.at(key, &svc.loc, key);
    for n in notes {
        line.note(n);
    }
    Ok(group)
}

fn default_notes(servers: usize) -> Vec<String> {
    let mut v = vec!["veloxy's default timeouts: 2s to connect (Traefik 30s) and 30s without a byte from the server before 504 (Traefik waits without limit)".to_string()];
    if servers > 1 {
        v.push("veloxy retries a failed connect, and 502/503/504 answers to idempotent requests, on another server, and ejects failing servers for a while (Traefik does neither without a retry middleware or health check)".into());
    }
    v
}

fn write_servers(ctx: &mut Ctx, group: &str, loc: &Loc, servers: &[Server]) -> Result<(), String> {
    let tls = servers.iter().any(|s| s.0);
    if tls && servers.iter().any(|s| !s.0) {
        return Err("mixes https:// and plain servers: veloxy has one scheme per group".into());
    }
    let entries: Vec<toml::Value> = servers
        .iter()
        .map(|(https, hp, w, _)| server_entry(*https, hp, (*w != 1).then_some(*w)))
        .collect();
    let s = ctx.cfg.upstream(group, loc);
    s.set("servers", toml::Value::Array(entries));
    if servers.iter().any(|s| s.3) {
        s.set("protocol", "h2c");
    }
    Ok(())
}

fn sticky(ctx: &mut Ctx, line: &mut crate::lines::Line, group: &str, loc: &Loc, v: &Node) {
    let Some(c) = get(v, "cookie") else {
        line.refuse("only cookie stickiness is known");
        return;
    };
    let mut t = toml::Table::new();
    match text(c, "name") {
        Some(n) => {
            t.insert("cookie".into(), n.into());
        }
        None => {
            line.note("the cookie is named veloxy_srv (Traefik: a name derived from the service)");
        }
    }
    let max_age = int(c, "maxAge").unwrap_or(0);
    t.insert("ttl".into(), format!("{}s", max_age.max(0)).into());
    t.insert("secure".into(), flag(c, "secure").unwrap_or(false).into());
    t.insert(
        "http_only".into(),
        flag(c, "httpOnly").unwrap_or(false).into(),
    );
    for k in ["sameSite", "path", "domain"] {
        if get(c, k).is_some() {
            line.note(format!(
                "{k}: veloxy's affinity cookie has no {k} attribute"
            ));
        }
    }
    line.note("the cookie's value is an opaque token of the server (Traefik: a hash of its URL)");
    ctx.cfg
        .upstream(group, loc)
        .set("sticky", toml::Value::Table(t));
}

fn health(ctx: &mut Ctx, line: &mut crate::lines::Line, group: &str, loc: &Loc, v: &Node) {
    let mut t = toml::Table::new();
    if let Some(p) = text(v, "path") {
        t.insert("path".into(), p.into());
    }
    let interval = text(v, "interval")
        .and_then(|i| seconds(&i))
        .unwrap_or(30.0);
    let timeout = text(v, "timeout").and_then(|i| seconds(&i)).unwrap_or(5.0);
    t.insert("interval".into(), crate::node::duration(interval).into());
    t.insert("timeout".into(), crate::node::duration(timeout).into());
    t.insert("healthy".into(), toml::Value::Integer(1));
    t.insert("unhealthy".into(), toml::Value::Integer(1));
    if let Some(h) = text(v, "hostname") {
        t.insert("host".into(), h.into());
    }
    if let Some(s) = int(v, "status") {
        t.insert("expect_status".into(), s.to_string().into());
    }
    for (k, why) in [
        ("port", "veloxy checks on the server's own port"),
        ("headers", "veloxy's checks send no extra fields"),
        ("mode", "veloxy's checks are HTTP GETs (or TCP connects)"),
        ("scheme", "veloxy checks with the group's scheme"),
    ] {
        if get(v, k).is_some() {
            line.refuse(format!("{k}: {why}"));
        }
    }
    if text(v, "method").is_some_and(|m| !m.eq_ignore_ascii_case("GET")) {
        line.refuse("method: veloxy's checks are GETs");
    }
    if get(v, "unhealthyInterval").is_some() {
        line.note("unhealthyInterval: veloxy checks down servers at the same interval");
    }
    if t.contains_key("path") {
        ctx.cfg
            .upstream(group, loc)
            .set("health", toml::Value::Table(t));
    } else {
        line.refuse("no path: Traefik's health checks are HTTP requests");
    }
}

fn transport_named(ctx: &mut Ctx, lines: &mut Lines, group: &str, loc: &Loc, name: &str, at: &Loc) {
    match ctx.inp.transports.iter().find(|t| t.name == name).cloned() {
        Some(t) => {
            let key = format!("http.serversTransports.{name}");
            transport(ctx, lines, group, loc, &t.node, &key, &t.loc);
            let _ = t.base;
        }
        None => {
            lines
                .at("serversTransport", at, "serversTransport")
                .refuse(format!("serversTransport {name} is not defined"));
        }
    }
}

/// A servers transport's options on group `group`.
fn transport(
    ctx: &mut Ctx,
    lines: &mut Lines,
    group: &str,
    loc: &Loc,
    t: &Node,
    key: &str,
    tloc: &Loc,
) {
    let line = lines.at(key, tloc, key);
    let mut set: Vec<(&str, toml::Value)> = Vec::new();
    for (k, v) in entries(t) {
        match k.name.to_ascii_lowercase().as_str() {
            "insecureskipverify" if v.as_bool() == Some(true) => {
                line.refuse("insecureSkipVerify: veloxy always verifies upstream certificates (give the CA as rootCAs)");
            }
            "insecureskipverify" => {}
            "rootcas" => {
                let cas = list_at(t, &k.name);
                if cas.len() > 1 {
                    line.refuse(
                        "several rootCAs: veloxy takes one CA file per group (concatenate them)",
                    );
                } else if let Some((ca, _)) = cas.first() {
                    let base = ctx
                        .inp
                        .statics
                        .first()
                        .map(|(_, b)| b.clone())
                        .unwrap_or_default();
                    set.push(("ca_file", ctx.opts.out_path(&base, ca).into()));
                }
            }
            "servername" => set.push(("tls_server_name", v.scalar().unwrap_or_default().into())),
            "maxidleconnsperhost" => {
                if let Some(n) = v.as_i64().filter(|n| *n >= 0) {
                    set.push(("keepalive", toml::Value::Integer(n)));
                }
            }
            "forwardingtimeouts" => {
                for (tk, tv) in entries(v) {
                    let Some(s) = tv
                        .scalar()
                        .as_deref()
                        .and_then(seconds)
                        .filter(|s| *s > 0.0)
                    else {
                        continue;
                    };
                    let d = crate::node::duration(s);
                    match tk.name.to_ascii_lowercase().as_str() {
                        "dialtimeout" => set.push(("connect_timeout", d.into())),
                        "responseheadertimeout" => {
                            set.push(("read_timeout", d.into()));
                            line.note("responseHeaderTimeout bounds the wait for the answer's head; veloxy's read_timeout bounds every wait between two reads");
                        }
                        "idleconntimeout" => set.push(("idle_timeout", d.into())),
                        _ => {}
                    }
                }
            }
            "disablehttp2" => {}
            "certificates" => {
                line.refuse(
                    "certificates: veloxy does not present client certificates to upstreams",
                );
            }
            "peercerturi" | "spiffe" => {
                line.refuse("peer certificate URI / SPIFFE checks");
            }
            _ => {
                line.refuse(format!("unknown serversTransport option {}", k.name));
            }
        }
    }
    let has_timeouts = set.iter().any(|(k, _)| k.ends_with("_timeout"));
    if !has_timeouts {
        line.note("veloxy's default timeouts: 2s to connect (Traefik 30s) and 30s without a byte from the server before 504 (Traefik waits without limit)");
    }
    let s = ctx.cfg.upstream(group, loc);
    for (k, v) in set {
        s.set(k, v);
    }
}

fn weighted(
    ctx: &mut Ctx,
    lines: &mut Lines,
    svc: &Named,
    key: &str,
    w: &Node,
) -> Result<String, String> {
    let mut children: Vec<(Vec<Server>, i64)> = Vec::new();
    for c in get(w, "services").map(items).unwrap_or_default() {
        let name =
            strip_provider(&text(c, "name").ok_or("a weighted entry without name")?).to_string();
        let weight = int(c, "weight").unwrap_or(1);
        let child = ctx
            .inp
            .services
            .iter()
            .find(|s| s.name == name)
            .cloned()
            .ok_or_else(|| format!("service {name} is not defined"))?;
        let lb = get(&child.node, "loadBalancer")
            .ok_or_else(|| format!("service {name} is not a plain load balancer"))?;
        if entries(lb).iter().any(|(k, _)| {
            !matches!(
                k.name.to_ascii_lowercase().as_str(),
                "servers" | "server" | "passhostheader"
            )
        }) {
            return Err(format!("service {name} has its own options (health check, sticky, transport): veloxy makes one group of the weighted servers"));
        }
        let ck = format!("http.services.{name}");
        lines.at(&ck, &child.loc, &format!("{ck}.loadBalancer"));
        if weight > 0 {
            children.push((servers_of(lb)?, weight));
        }
    }
    if children.is_empty() {
        return Err("no weighted services".into());
    }
    if get(w, "sticky").is_some() {
        lines
            .at(
                &format!("{key}.weighted.sticky"),
                &svc.loc,
                &format!("{key}.weighted.sticky"),
            )
            .refuse("stickiness between services");
    }
    if get(w, "healthCheck").is_some() {
        lines
            .at(
                &format!("{key}.weighted.healthCheck"),
                &svc.loc,
                &format!("{key}.weighted.healthCheck"),
            )
            .ignored = Some("it only propagates the children's health".into());
    }
    // P(server) = child weight / sum * server weight / child sum, in integers.
    let lcm = children.iter().fold(1i64, |acc, (s, _)| {
        let sum: i64 = s.iter().map(|x| x.2).sum();
        acc / gcd(acc, sum) * sum
    });
    let mut merged: BTreeMap<(bool, String, bool), i64> = BTreeMap::new();
    let mut order = Vec::new();
    for (servers, cw) in &children {
        let sum: i64 = servers.iter().map(|x| x.2).sum();
        for (https, hp, sw, h2c) in servers {
            let k = (*https, hp.clone(), *h2c);
            if !merged.contains_key(&k) {
                order.push(k.clone());
            }
            *merged.entry(k).or_default() += cw * sw * (lcm / sum);
        }
    }
    let g = merged.values().fold(0, |acc, w| gcd(acc, *w));
    let servers: Vec<Server> = order
        .iter()
        .map(|k| (k.0, k.1.clone(), merged[k] / g.max(1), k.2))
        .collect();
    let group = veloxy_import::Config::unique(&ctx.cfg.upstreams, &svc.name);
    write_servers(ctx, &group, &svc.loc, &servers)?;
    let line = lines.at(key, &svc.loc, key);
    for n in default_notes(servers.len()) {
        line.note(n);
    }
    line.note(
        "the weighted services become one group whose server weights give each service its share",
    );
    Ok(group)
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// After every router: `passHostHeader: false` sets Host on the routes to those groups,
/// the retry middleware's attempts become the groups' `retries`.
pub fn finish(ctx: &mut Ctx) {
    for r in ctx.routes.iter_mut() {
        if let crate::route::Action::Upstream(u) = &r.action {
            if let Some(h) = ctx.pass_host.get(u) {
                let h = h.clone();
                r.req("Host", &h);
            }
        }
    }
    let retries = std::mem::take(&mut ctx.retries);
    for (group, asks) in retries {
        let n = asks.iter().flatten().max().copied().unwrap_or(0);
        let all = ctx
            .routes
            .iter()
            .filter(|r| r.action == crate::route::Action::Upstream(group.clone()))
            .count();
        if let Some(s) = veloxy_import::model::named(&mut ctx.cfg.upstreams, &group) {
            s.set("retries", n);
        }
        let _ = all;
    }
    let _ = get_kv;
}
