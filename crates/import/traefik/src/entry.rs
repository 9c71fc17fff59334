//! The static configuration: entry points (listeners, their redirections and defaults),
//! certificate resolvers (ACME), providers and the keys that change nothing a client sees.

use veloxy_import::tree::Node;
use veloxy_import::{Config, Loc};

use crate::lines::Lines;
use crate::node::{at, entries, flag, get, get_kv, int, list_at, seconds, text};
use crate::translate::Ctx;

/// An entry point.
#[derive(Debug, Clone)]
pub struct Ep {
    /// Its name.
    pub name: String,
    /// The veloxy listener's name.
    pub listener: String,
    /// Where it is defined.
    pub loc: Loc,
    /// veloxy `addr`.
    pub addr: String,
    /// Its port.
    pub port: u16,
    /// `http.redirections.entryPoint`: the target entry point, the scheme, permanent.
    pub redirect: Option<(String, String, bool, Loc)>,
    /// `http.tls`: routers on it are TLS routers by default (with this config and place).
    pub default_tls: Option<(Node, Loc)>,
    /// `http.middlewares`: prepended to its routers' middlewares.
    pub middlewares: Vec<(String, Loc)>,
    /// `asDefault`.
    pub as_default: bool,
    /// Serves TLS (an entry point with TLS routers).
    pub tls: bool,
    /// `forwardedHeaders.trustedIPs`.
    pub trusted: Vec<String>,
    /// Not defined in the inputs: made up from a router's reference.
    pub guessed: bool,
}

/// A certificate resolver: its ACME challenge (or why veloxy cannot use it).
#[derive(Debug, Clone)]
pub struct Resolver {
    /// Its name.
    pub name: String,
    /// `http-01` / `tls-alpn-01`, or why not.
    pub challenge: Result<&'static str, String>,
}

/// Parses `:80`, `0.0.0.0:443`, `[::]:8080/tcp`: (veloxy addr, port, udp).
pub fn address(a: &str) -> Option<(String, u16, bool)> {
    let (hostport, proto) = a.split_once('/').unwrap_or((a, "tcp"));
    let (host, port) = hostport.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let addr = if host.is_empty() || host == "0.0.0.0" {
        format!(":{port}")
    } else {
        format!("{host}:{port}")
    };
    Some((addr, port, proto.eq_ignore_ascii_case("udp")))
}

/// Reads every static tree: entry points, resolvers, the rest reported.
pub fn statics(ctx: &mut Ctx) {
    for (loc, path) in std::mem::take(&mut ctx.inp.config_file) {
        if ctx.inp.static_file {
            ctx.rep.different(
                &loc,
                "--configFile",
                format!("Traefik reads {path}; the static file given on the command line is taken for it"),
            );
        } else {
            ctx.rep.refused(
                &loc,
                "--configFile",
                format!("give the static file it names ({path}) on the command line"),
            );
        }
    }
    read_statics(ctx);
    redirections(ctx);
}

/// `http.redirections.entryPoint` -> the listener's `redirect_https`.
fn redirections(ctx: &mut Ctx) {
    let eps = ctx.eps.clone();
    for e in &eps {
        let Some((to, scheme, permanent, loc)) = &e.redirect else {
            continue;
        };
        let key = format!("entryPoints.{}.http.redirections", e.name);
        let Some(target) = eps.iter().find(|t| &t.name == to) else {
            ctx.rep
                .refused(loc, key, format!("entry point {to} is not defined"));
            continue;
        };
        if scheme != "https" {
            ctx.rep.refused(
                loc,
                key,
                format!("a redirection to {scheme}: veloxy's listeners redirect to https only"),
            );
            continue;
        }
        let l = ctx.cfg.listener(&e.listener, &e.loc);
        l.set("redirect_https", true);
        if target.port != 443 {
            l.set("https_port", target.port as i64);
        }
        let what = if *permanent {
            "GET requests get 308 (Traefik: 301; other methods 308 in both)"
        } else {
            "veloxy's redirect is permanent (308); Traefik's is temporary (302 for GET, 307 for other methods)"
        };
        ctx.rep.different(loc, key, what);
    }
}

fn read_statics(ctx: &mut Ctx) {
    let trees: Vec<(Node, std::path::PathBuf)> = ctx.inp.statics.clone();
    let mut pending = Vec::new();
    for (tree, base) in &trees {
        for (k, v) in entries(tree) {
            let lower = k.name.to_ascii_lowercase();
            match lower.as_str() {
                "entrypoints" => {
                    for (name, ep) in entries(v) {
                        entry_point(ctx, &name.name, &name.loc, ep);
                    }
                }
                "certificatesresolvers" => {
                    for (name, r) in entries(v) {
                        resolver(ctx, &name.name, &name.loc, r);
                    }
                }
                "providers" => providers(ctx, v, base),
                "serverstransport" => {
                    ctx.global_transport = Some((v.clone(), k.loc.clone()));
                }
                "api" | "ping" | "metrics" | "log" | "accesslog" | "global" => {
                    pending.push((k.name.clone(), k.loc.clone(), v.clone()));
                }
                "tracing" | "pilot" | "hostresolver" => {
                    ctx.rep.ignored(
                        &k.loc,
                        &k.name,
                        "tracing and telemetry change nothing a client sees",
                    );
                }
                "core" => {
                    ctx.rep.translated(&k.loc, &k.name);
                }
                "experimental" => {
                    ctx.rep
                        .refused(&k.loc, &k.name, "plugins and experimental features");
                }
                _ if crate::v1::is_static_key(&lower) => {
                    ctx.rep.refused(&k.loc, &k.name, crate::v1::WHY);
                }
                _ => ctx.rep.refused(&k.loc, &k.name, "unknown static option"),
            }
        }
    }
    crate::ops::statics(ctx, pending);
}

fn entry_point(ctx: &mut Ctx, name: &str, loc: &Loc, n: &Node) {
    let mut lines = std::mem::take(&mut ctx.lines);
    let key = format!("entryPoints.{name}");
    let line = lines.at(&key, loc, &key);
    let Some((addr, port, udp)) = text(n, "address").as_deref().and_then(address) else {
        line.refuse("no address such as \":80\"");
        ctx.lines = lines;
        return;
    };
    if udp {
        line.refuse("a UDP entry point: veloxy has no UDP proxying");
        ctx.lines = lines;
        return;
    }
    if addr.starts_with(':') {
        line.note(format!("veloxy's {addr} is every IPv4 address; Traefik also listens on IPv6 (add a [::]{addr} listener for it)"));
    }
    let listener = veloxy_import::model::sanitize(name);
    let mut ep = Ep {
        name: name.to_string(),
        listener: listener.clone(),
        loc: loc.clone(),
        addr: addr.clone(),
        port,
        redirect: None,
        default_tls: None,
        middlewares: Vec::new(),
        as_default: flag(n, "asDefault").unwrap_or(false),
        tls: false,
        trusted: Vec::new(),
        guessed: false,
    };
    ctx.cfg.listener(&listener, loc).set("addr", addr.as_str());
    for (k, v) in entries(n) {
        let sub = format!("{key}.{}", k.name);
        match k.name.to_ascii_lowercase().as_str() {
            "address" | "asdefault" => {}
            "http" => http_options(&mut ep, &mut lines, &key, v),
            "http2" => {
                if let Some(m) = int(v, "maxConcurrentStreams") {
                    ctx.cfg
                        .listener(&listener, loc)
                        .set("h2_max_concurrent_streams", m);
                }
                lines.at(&sub, &k.loc, &sub);
            }
            "http3" => {
                ctx.cfg.listener(&listener, loc).set("http3", true);
                let l = lines.at(&sub, &k.loc, &sub);
                if get(v, "advertisedPort").is_some() {
                    l.note("advertisedPort: veloxy advertises the listener's own port in Alt-Svc");
                }
            }
            "forwardedheaders" => {
                let l = lines.at(&sub, &k.loc, &sub);
                ep.trusted = list_at(v, "trustedIPs")
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect();
                if flag(v, "insecure") == Some(true) {
                    l.refuse("insecure: veloxy trusts X-Forwarded-For only from [server] trusted_proxies");
                } else if !ep.trusted.is_empty() {
                    l.note("veloxy's trusted_proxies are server-wide, not per entry point");
                }
            }
            "proxyprotocol" => {
                let l = lines.at(&sub, &k.loc, &sub);
                let ips: Vec<String> = list_at(v, "trustedIPs")
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect();
                if flag(v, "insecure") == Some(true) || ips.is_empty() {
                    l.refuse("insecure PROXY protocol: veloxy accepts it from [server] trusted_proxies only");
                } else {
                    ctx.cfg.listener(&listener, loc).set("proxy_protocol", true);
                    ep.trusted.extend(ips);
                    l.note("veloxy's trusted_proxies are server-wide, not per entry point");
                }
            }
            "transport" => transport(ctx, &mut lines, &sub, &k.loc, v),
            other if crate::v1::is_entry_point_key(other) => {
                lines.at(&sub, &k.loc, &sub).refuse(crate::v1::WHY);
            }
            _ => {
                lines
                    .at(&sub, &k.loc, &sub)
                    .refuse("unknown entry point option");
            }
        }
    }
    for t in &ep.trusted {
        if !ctx.trusted.contains(t) {
            ctx.trusted.push(t.clone());
        }
    }
    ctx.lines = lines;
    ctx.eps.push(ep);
}

fn http_options(ep: &mut Ep, lines: &mut Lines, key: &str, v: &Node) {
    for (k, v2) in entries(v) {
        let sub = format!("{key}.http.{}", k.name);
        match k.name.to_ascii_lowercase().as_str() {
            "redirections" => {
                let Some(r) = get(v2, "entryPoint") else {
                    lines.at(&sub, &k.loc, &sub).refuse("unknown redirection");
                    continue;
                };
                let to = text(r, "to").unwrap_or_default();
                let scheme = text(r, "scheme").unwrap_or_else(|| "https".into());
                let permanent = flag(r, "permanent").unwrap_or(true);
                if get(r, "priority").is_some() {
                    let l = lines.at(
                        &format!("{sub}.priority"),
                        &k.loc,
                        &format!("{sub}.entryPoint.priority"),
                    );
                    l.note("veloxy's redirect_https answers every request of the listener");
                }
                ep.redirect = Some((to, scheme, permanent, k.loc.clone()));
            }
            "tls" => {
                ep.default_tls = Some((v2.clone(), k.loc.clone()));
                lines.at(&sub, &k.loc, &sub);
            }
            "middlewares" => {
                ep.middlewares = list_at(v, "middlewares");
                lines.at(&sub, &k.loc, &sub);
            }
            "encodequerysemicolons" | "sanitizepath" | "encodedcharacters" => {
                lines.at(&sub, &k.loc, &sub).ignored = Some("request normalization details".into());
            }
            _ => {
                lines
                    .at(&sub, &k.loc, &sub)
                    .refuse("unknown entry point option");
            }
        }
    }
}

fn transport(ctx: &mut Ctx, lines: &mut Lines, sub: &str, loc: &Loc, v: &Node) {
    let l = lines.at(sub, loc, sub);
    if let Some(rt) = get(v, "respondingTimeouts") {
        for (k, t) in entries(rt) {
            let Some(secs) = t.scalar().as_deref().and_then(seconds) else {
                continue;
            };
            let d = crate::node::duration(secs);
            match k.name.to_ascii_lowercase().as_str() {
                "readtimeout" if secs > 0.0 => {
                    ctx.cfg.server.set("body_timeout", d.as_str());
                    l.note("readTimeout bounds Traefik's whole request read; veloxy's body_timeout is the longest wait between two reads");
                }
                "idletimeout" if secs > 0.0 => {
                    ctx.cfg.server.set("keepalive_timeout", d.as_str());
                }
                "writetimeout" if secs > 0.0 => {
                    l.note("writeTimeout bounds Traefik's whole response write; veloxy's send_timeout is the longest wait for the client to read");
                    ctx.cfg.server.set("send_timeout", d.as_str());
                }
                _ => {}
            }
        }
    }
    if let Some(lc) = get(v, "lifeCycle") {
        if let Some(s) = text(lc, "graceTimeOut").as_deref().and_then(seconds) {
            ctx.cfg
                .server
                .set("shutdown_timeout", crate::node::duration(s).as_str());
        }
    }
    if get(v, "keepAliveMaxRequests").is_some() || get(v, "keepAliveMaxTime").is_some() {
        l.note("keepAliveMaxRequests/keepAliveMaxTime: veloxy does not cap a connection's requests or age");
    }
}

fn resolver(ctx: &mut Ctx, name: &str, loc: &Loc, n: &Node) {
    let key = format!("certificatesResolvers.{name}");
    let mut lines = Lines::default();
    let line = lines.at(&key, loc, &key);
    let Some(acme) = get(n, "acme") else {
        line.refuse("only ACME resolvers are known");
        lines.flush(&mut ctx.rep);
        return;
    };
    let challenge = if get(acme, "dnsChallenge").is_some() {
        Err(format!("resolver {name} uses the DNS-01 challenge: veloxy's ACME has HTTP-01 and TLS-ALPN-01 only (wildcard certificates need DNS-01)"))
    } else if get(acme, "tlsChallenge").is_some() {
        Ok("tls-alpn-01")
    } else if get(acme, "httpChallenge").is_some() {
        Ok("http-01")
    } else {
        Err(format!("resolver {name} has no challenge"))
    };
    match &challenge {
        Err(why) => {
            line.refuse(why.clone());
        }
        Ok(ch) => {
            let mut t = toml::Table::new();
            if let Some(e) = text(acme, "email") {
                t.insert("email".into(), e.into());
            }
            if let Some(ca) = text(acme, "caServer") {
                t.insert("directory".into(), ca.into());
            }
            t.insert("challenge".into(), (*ch).into());
            if let Some((_, old)) = &ctx.acme {
                if old != &t {
                    line.refuse(
                        "a second ACME resolver with other settings: veloxy has one [server.acme]",
                    );
                }
            } else {
                ctx.acme = Some((name.to_string(), t));
            }
            if get(acme, "storage").is_some() {
                line.note("storage: veloxy keeps its own account and certificates (under [server.acme] storage), so it requests its own certificates once");
            }
            if let Some(kt) = text(acme, "keyType").filter(|k| !k.starts_with("EC")) {
                line.note(format!(
                    "keyType {kt}: veloxy's ACME certificates have ECDSA P-256 keys"
                ));
            }
            if at(acme, "httpChallenge.entryPoint").is_some() || get(acme, "tlsChallenge").is_some()
            {
                // The challenge is answered on the listeners themselves.
            }
        }
    }
    lines.flush(&mut ctx.rep);
    ctx.resolvers.push(Resolver {
        name: name.to_string(),
        challenge,
    });
}

fn providers(ctx: &mut Ctx, v: &Node, base: &std::path::Path) {
    for (k, p) in entries(v) {
        let sub = format!("providers.{}", k.name);
        match k.name.to_ascii_lowercase().as_str() {
            "file" => {
                let mut rep = std::mem::take(&mut ctx.rep);
                let r =
                    crate::input::follow_file_provider(p, base, ctx.opts, &mut rep, &mut ctx.inp);
                ctx.rep = rep;
                let given = !ctx.inp.routers.is_empty() || !ctx.inp.tcp_routers.is_empty();
                match r {
                    Ok(Ok(())) => ctx.rep.translated(&k.loc, &sub),
                    Ok(Err(_)) if given => ctx.rep.different(&k.loc, &sub, "read from the dynamic files given on the command line; veloxy does not watch them (reload with SIGHUP after a change)"),
                    Ok(Err(why)) => ctx.rep.refused(&k.loc, &sub, why),
                    Err(e) => ctx.rep.refused(&k.loc, &sub, e.to_string()),
                }
            }
            "docker" | "swarm" => docker(ctx, &k.loc, &sub, p),
            "providersthrottleduration" => {
                ctx.rep.ignored(&k.loc, &sub, "configuration reload timing")
            }
            _ => ctx.rep.refused(
                &k.loc,
                &sub,
                "a provider veloxy import cannot read: give its routers as a dynamic file",
            ),
        }
    }
}

/// `providers.docker`: the compose files given stand for the containers; each option's line.
fn docker(ctx: &mut Ctx, loc: &Loc, sub: &str, p: &Node) {
    if !ctx.inp.compose {
        ctx.rep.refused(
            loc,
            sub,
            "container labels: give the docker-compose file on the command line",
        );
        return;
    }
    let notes = std::mem::take(&mut ctx.inp.docker_notes);
    for (k, v) in entries(p) {
        let key = format!("{sub}.{}", k.name);
        match k.name.to_ascii_lowercase().as_str() {
            "exposedbydefault" | "defaultrule" => ctx.rep.translated(&k.loc, key),
            "network" => ctx.rep.ignored(
                &k.loc,
                key,
                "veloxy reaches each container by its compose service name on the network they share",
            ),
            "endpoint" | "tls" | "httpclienttimeout" | "username" | "password" => {
                ctx.rep.ignored(
                    &k.loc,
                    key,
                    "the Docker API connection: veloxy import reads the compose files instead",
                )
            }
            "watch" | "refreshseconds" | "swarmmoderefreshseconds" | "pollinterval" => {
                ctx.rep.ignored(
                    &k.loc,
                    key,
                    "change detection: reload veloxy (SIGHUP) after a change",
                )
            }
            "allowemptyservices" => ctx.rep.ignored(
                &k.loc,
                key,
                "container health states are docker's; veloxy checks servers itself when a health check is set",
            ),
            "constraints" => {
                let c = v.scalar().unwrap_or_default();
                ctx.rep.different(&k.loc, key, format!("not evaluated: every container of the compose files given is taken (Traefik keeps those matching {c})"));
            }
            "usebindportip" if v.as_bool() == Some(true) => ctx.rep.different(
                &k.loc,
                key,
                "veloxy reaches the container's own port by its service name (Traefik: the published host address and port)",
            ),
            "usebindportip" | "swarmmode" => ctx.rep.translated(&k.loc, key),
            _ => ctx.rep.refused(&k.loc, key, "unknown docker provider option"),
        }
    }
    if notes.is_empty() {
        ctx.rep.translated(loc, sub);
    } else {
        ctx.rep.different(loc, sub, notes.join("; "));
    }
}

/// The entry points routers get without `entryPoints`: those `asDefault`, else all.
pub fn defaults(eps: &[Ep]) -> Vec<String> {
    let d: Vec<String> = eps
        .iter()
        .filter(|e| e.as_default)
        .map(|e| e.name.clone())
        .collect();
    if d.is_empty() {
        eps.iter().map(|e| e.name.clone()).collect()
    } else {
        d
    }
}

/// Entry points named by routers but never defined (a dynamic file without its static one):
/// `web` and `http` on :80, `websecure` and `https` on :443, else refused.
pub fn guess(cfg: &mut Config, name: &str, loc: &Loc) -> Option<Ep> {
    let port = match name.to_ascii_lowercase().as_str() {
        "web" | "http" => 80,
        "websecure" | "https" | "web-secure" => 443,
        _ => return None,
    };
    let listener = veloxy_import::model::sanitize(name);
    cfg.listener(&listener, loc).set("addr", format!(":{port}"));
    Some(Ep {
        name: name.to_string(),
        listener,
        loc: loc.clone(),
        addr: format!(":{port}"),
        port,
        redirect: None,
        default_tls: None,
        middlewares: Vec::new(),
        as_default: false,
        tls: port == 443,
        trusted: Vec::new(),
        guessed: true,
    })
}

/// The key of `node` named `k`, for report places.
pub fn key_loc(n: &Node, k: &str) -> Option<Loc> {
    get_kv(n, k).map(|(key, _)| key.loc.clone())
}

/// What veloxy's forwarded fields differ in from Traefik's, named on each entry point that
/// serves HTTP routes.
pub const FORWARDED_NOTE: &str = "veloxy sets X-Forwarded-Port to the listener's port (Traefik: the Host field's port, else 80/443) and X-Forwarded-Proto to http/https on WebSocket upgrades (Traefik: ws/wss); it sends no X-Forwarded-Server (Traefik: its host name) and does not add the Accept-Encoding: gzip Traefik's client puts on requests without one";

/// Adds [`FORWARDED_NOTE`] to the entry points whose listeners have proxied routes.
pub fn forwarded_notes(ctx: &mut Ctx) {
    for e in ctx.eps.clone() {
        let used = ctx.routes.iter().any(|r| {
            r.listeners.contains(&e.listener)
                && matches!(r.action, crate::route::Action::Upstream(_))
        });
        if !used {
            continue;
        }
        if e.guessed {
            // No entry point line: the note goes on the first router using it.
            if let Some(r) = ctx
                .routes
                .iter()
                .find(|r| r.listeners.contains(&e.listener))
            {
                let key = format!("http.routers.{}", r.router);
                let loc = r.loc.clone();
                ctx.lines.at(&key, &loc, &key).note(FORWARDED_NOTE);
            }
        } else {
            let key = format!("entryPoints.{}", e.name);
            ctx.lines.at(&key, &e.loc, &key).note(FORWARDED_NOTE);
        }
    }
}
