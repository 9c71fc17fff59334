//! TCP routers: `HostSNI(`*`)` on a plain entry point is a `protocol = "tcp"` listener
//! relaying to the service; `HostSNI(`a`)` with `tls.passthrough` is a `[[streams]]` entry
//! with `sni` on the entry point's TLS listener.

use veloxy_import::{Loc, Section};

use crate::auth::server_entry;
use crate::input::{strip_provider, Named};
use crate::node::{get, get_kv, int, items, list_at, text};
use crate::rule;
use crate::translate::Ctx;

/// Translates the TCP routers (before the TLS listeners are made: passthrough needs TLS).
pub fn all(ctx: &mut Ctx) {
    for r in ctx.inp.tcp_routers.clone() {
        let key = format!("tcp.routers.{}", r.name);
        if let Err(why) = router(ctx, &r, &key) {
            ctx.lines.at(&key, &r.loc, &key).refuse(why);
        } else {
            ctx.lines.at(&key, &r.loc, &key);
        }
    }
    for s in ctx.inp.tcp_services.clone() {
        let key = format!("tcp.services.{}", s.name);
        if !ctx.lines.has(&key) {
            ctx.lines.at(&key, &s.loc, &key).ignored = Some("no router uses it".into());
        }
    }
}

/// The names of `HostSNI(...)` alternatives; `["*"]` for any.
fn sni_names(rule_text: &str) -> Result<Vec<String>, String> {
    let e = rule::parse(rule_text).map_err(|e| format!("the rule does not parse {e}"))?;
    let mut names = Vec::new();
    for conj in rule::dnf(&e)? {
        let [lit] = conj.as_slice() else {
            return Err(
                "a TCP rule with more than HostSNI: veloxy routes TCP by SNI name only".into(),
            );
        };
        if lit.neg || !lit.call.name.eq_ignore_ascii_case("HostSNI") {
            return Err(format!("{lit}: veloxy routes TCP by SNI name only"));
        }
        names.extend(lit.call.args.iter().map(|a| a.to_ascii_lowercase()));
    }
    Ok(names)
}

fn router(ctx: &mut Ctx, r: &Named, key: &str) -> Result<(), String> {
    let n = &r.node;
    let names = sni_names(&text(n, "rule").ok_or("no rule")?)?;
    let any = names.iter().any(|s| s == "*");
    let eps: Vec<String> = {
        let l: Vec<String> = list_at(n, "entryPoints")
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        if l.is_empty() {
            crate::entry::defaults(&ctx.eps)
        } else {
            l
        }
    };
    let tls = get(n, "tls");
    let passthrough = tls
        .and_then(|t| get(t, "passthrough"))
        .and_then(|p| p.as_bool())
        == Some(true);
    if tls.is_some() && !passthrough {
        return Err("TLS termination for a TCP router: veloxy relays TCP as it is, or passes TLS through by SNI".into());
    }
    if !passthrough && !any {
        return Err(
            "HostSNI names without TLS passthrough (a plain TCP connection has no SNI)".into(),
        );
    }
    let svc = text(n, "service").ok_or("no service")?;
    let group = service(ctx, strip_provider(&svc))?;
    for e in eps {
        let Some(ep) = ctx.eps.iter_mut().find(|x| x.name == e) else {
            return Err(format!("entry point {e} is not defined"));
        };
        let mut s = Section::from(&r.loc);
        s.comments.push(format!("tcp router {}", r.name));
        s.set("listener", ep.listener.as_str());
        if passthrough && !any {
            ep.tls = true;
            s.set("sni", crate::route::strings(&names));
            ctx.sni_streams
                .push((ctx.cfg.streams.len(), key.to_string(), r.loc.clone()));
        } else {
            let listener = ep.listener.clone();
            if ctx.routes.iter().any(|rt| rt.listeners.contains(&listener)) {
                return Err(format!("entry point {e} also has HTTP routers: veloxy's TCP listeners relay every connection"));
            }
            ctx.cfg.listener(&listener, &r.loc).set("protocol", "tcp");
        }
        s.set("upstream", group.as_str());
        ctx.cfg.streams.push(s);
    }
    Ok(())
}

fn service(ctx: &mut Ctx, name: &str) -> Result<String, String> {
    let svc = ctx
        .inp
        .tcp_services
        .iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| format!("service {name} is not defined"))?;
    let key = format!("tcp.services.{name}");
    if let Some((n, _)) = ctx
        .cfg
        .upstreams
        .iter()
        .find(|(_, s)| s.comments.contains(&key))
    {
        return Ok(n.clone());
    }
    let lb = get(&svc.node, "loadBalancer").ok_or_else(|| {
        ctx.lines
            .at(&key, &svc.loc, &key)
            .refuse("only loadBalancer TCP services are translated");
        format!("service {name}: not a load balancer")
    })?;
    let mut servers = Vec::new();
    for s in get(lb, "servers").map(items).unwrap_or_default() {
        let addr = text(s, "address").ok_or("a TCP server without address")?;
        if get(s, "tls").and_then(|t| t.as_bool()) == Some(true) {
            ctx.lines
                .at(&key, &svc.loc, &key)
                .refuse("servers with tls: veloxy relays TCP streams as they are");
            return Err(format!("service {name}: TLS to the servers"));
        }
        servers.push(server_entry(
            false,
            &addr,
            int(s, "weight").filter(|w| *w != 1),
        ));
    }
    if servers.is_empty() {
        ctx.lines.at(&key, &svc.loc, &key).refuse("no servers");
        return Err(format!("service {name}: no servers"));
    }
    let group = veloxy_import::Config::unique(&ctx.cfg.upstreams, name);
    let sec = ctx.cfg.upstream(&group, &svc.loc);
    sec.comments.push(key.clone());
    sec.set("servers", toml::Value::Array(servers));
    let line = ctx.lines.at(&key, &svc.loc, &format!("{key}.loadBalancer"));
    if let Some((k, pp)) = get_kv(lb, "proxyProtocol") {
        let v = int(pp, "version").unwrap_or(2);
        ctx.cfg
            .upstream(&group, &svc.loc)
            .set("proxy_protocol", format!("v{v}"));
        let _ = k;
    }
    if get(lb, "terminationDelay").is_some() {
        line.note("terminationDelay: veloxy closes both sides when either closes");
    }
    line.note("veloxy's connect timeout is 2s (Traefik 30s)");
    Ok(group)
}

/// After the TLS listeners: passthrough streams on a listener that got no certificate are
/// refused (veloxy terminates the other names itself, so the listener needs one).
pub fn check(ctx: &mut Ctx) {
    let mut drop = Vec::new();
    for (i, key, loc) in ctx.sni_streams.clone() {
        let listener = ctx.cfg.streams[i]
            .get("listener")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let has_tls = ctx
            .cfg
            .listeners
            .iter()
            .any(|(n, s)| n == &listener && s.get("tls").is_some());
        if !has_tls {
            ctx.lines.at(&key, &loc, &key).refuse(format!(
                "SNI passthrough on listener {listener}, which has no certificate of its own: veloxy terminates the other names there (give tls.certificates)"
            ));
            drop.push(i);
        }
    }
    for i in drop.into_iter().rev() {
        ctx.cfg.streams.remove(i);
    }
    let _: Option<Loc> = None;
}
