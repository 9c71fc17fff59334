//! The translation as a whole: the context every part writes into, and the order they run.

use std::collections::BTreeMap;
use std::path::PathBuf;

use veloxy_import::tree::Node;
use veloxy_import::{Config, ImportError, Imported, Loc, Options, Report};

use crate::entry::{Ep, Resolver};
use crate::input::{Inputs, Named};
use crate::lines::Lines;
use crate::route::Route;

/// Everything the translation shares.
pub struct Ctx<'a> {
    /// The command line's options.
    pub opts: &'a Options,
    /// The inputs.
    pub inp: Inputs,
    /// The output.
    pub cfg: Config,
    /// Report lines written directly (static keys).
    pub rep: Report,
    /// Report lines of dynamic objects, completed as routers use them.
    pub lines: Lines,
    /// Entry points.
    pub eps: Vec<Ep>,
    /// Certificate resolvers.
    pub resolvers: Vec<Resolver>,
    /// The one ACME configuration: (resolver, [server.acme] keys).
    pub acme: Option<(String, toml::Table)>,
    /// ACME names per listener.
    pub acme_hosts: BTreeMap<String, Vec<String>>,
    /// `forwardedHeaders.trustedIPs` of every entry point.
    pub trusted: Vec<String>,
    /// The static `serversTransport` (defaults for every service).
    pub global_transport: Option<(Node, Loc)>,
    /// `providers.docker.exposedByDefault`.
    pub exposed_by_default: bool,
    /// Routes, in router order.
    pub routes: Vec<Route>,
    /// Services translated so far: the upstream group, or why not.
    pub services: BTreeMap<String, Result<String, String>>,
    /// Upstream groups whose routes all asked for these retries (retry middleware).
    pub retries: BTreeMap<String, Vec<Option<i64>>>,
    /// `passHostHeader: false`: the Host each group's routes send.
    pub pass_host: BTreeMap<String, String>,
    /// Routers' `tls` lines: (key, place, listeners), for certificate problems.
    pub tls_lines: Vec<(String, Loc, Vec<String>)>,
    /// TLS options routers name.
    pub used_options: Vec<String>,
    /// Plain routers on entry points with TLS routers: (router key, place, listener, entry point).
    pub plain_on_tls: Vec<(String, Loc, String, String)>,
    /// Middlewares named by refused routers: (middleware, router).
    pub skipped: Vec<(String, String)>,
    /// Passthrough streams: (index in streams, router key, place).
    pub sni_streams: Vec<(usize, String, Loc)>,
    /// `[server] admin`, once set (the dashboard, ping and metrics point there).
    pub admin: Option<String>,
    /// Traefik's API port (its `traefik` entry point's, default 8080).
    pub api_port: u16,
    /// Host names of TLS routers without a resolver, per listener (for certificates whose
    /// names cannot be read).
    pub tls_hosts: BTreeMap<String, Vec<String>>,
}

/// Runs an import.
pub fn run(files: &[PathBuf], opts: &Options) -> Result<Imported, ImportError> {
    if files.is_empty() {
        return Err(ImportError::Usage(
            "traefik: give the static file and the dynamic files".into(),
        ));
    }
    let mut rep = Report::default();
    let inp = crate::input::read_all(files, opts, &mut rep)?;
    let mut ctx = Ctx {
        opts,
        inp,
        cfg: Config::default(),
        rep,
        lines: Lines::default(),
        eps: Vec::new(),
        resolvers: Vec::new(),
        acme: None,
        acme_hosts: BTreeMap::new(),
        trusted: Vec::new(),
        global_transport: None,
        exposed_by_default: true,
        routes: Vec::new(),
        services: BTreeMap::new(),
        retries: BTreeMap::new(),
        pass_host: BTreeMap::new(),
        tls_lines: Vec::new(),
        used_options: Vec::new(),
        sni_streams: Vec::new(),
        skipped: Vec::new(),
        plain_on_tls: Vec::new(),
        admin: None,
        api_port: 8080,
        tls_hosts: BTreeMap::new(),
    };
    let docker = crate::compose::settings(&ctx.inp.statics);
    ctx.api_port = docker.api_port;
    ctx.exposed_by_default = docker.exposed_by_default;
    let mut rep = std::mem::take(&mut ctx.rep);
    crate::compose::build(&mut ctx.inp, opts, &docker, &mut rep);
    ctx.rep = rep;
    crate::entry::statics(&mut ctx);
    for (loc, what) in std::mem::take(&mut ctx.inp.other) {
        let why = if what.eq_ignore_ascii_case("udp") {
            "UDP routers and services: veloxy has no UDP proxying"
        } else {
            "unknown dynamic section"
        };
        ctx.rep.refused(&loc, what, why);
    }
    crate::router::all(&mut ctx);
    crate::tcp::all(&mut ctx);
    crate::tls::listeners(&mut ctx);
    crate::tcp::check(&mut ctx);
    crate::router::plain_on_tls(&mut ctx);
    crate::order::check(&mut ctx);
    crate::service::finish(&mut ctx);
    crate::entry::forwarded_notes(&mut ctx);
    write_routes(&mut ctx);
    unused(&mut ctx);
    let mut report = ctx.rep;
    ctx.lines.flush(&mut report);
    report.sort();
    ctx.cfg.header.push("veloxy import --from traefik".into());
    Ok(Imported {
        config: ctx.cfg,
        report,
    })
}

/// Traefik's forwarded fields, which veloxy does not add by itself: X-Real-Ip, and
/// X-Forwarded-For replaced by the client address (Traefik drops the fields untrusted
/// clients send), X-Forwarded-Port.
fn base_headers(ctx: &Ctx) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("X-Real-Ip".to_string(), "{client_ip}".to_string());
    m.insert("X-Forwarded-Port".to_string(), "{server_port}".to_string());
    if ctx.trusted.is_empty() {
        m.insert("X-Forwarded-For".to_string(), "{client_ip}".to_string());
    }
    m
}

fn write_routes(ctx: &mut Ctx) {
    if !ctx.trusted.is_empty() {
        let t: Vec<toml::Value> = ctx.trusted.iter().map(|s| s.as_str().into()).collect();
        ctx.cfg.server.set("trusted_proxies", toml::Value::Array(t));
    }
    if let Some((_, t)) = &ctx.acme {
        if ctx.cfg.listeners.iter().any(|(_, l)| {
            l.get("tls")
                .and_then(|t| t.as_table())
                .is_some_and(|t| t.contains_key("acme"))
        }) {
            ctx.cfg.server.set("acme", toml::Value::Table(t.clone()));
        }
    }
    let http: Vec<String> = ctx
        .cfg
        .listeners
        .iter()
        .filter(|(_, s)| s.get("protocol").is_none())
        .map(|(n, _)| n.clone())
        .collect();
    let base = base_headers(ctx);
    let proxied = ctx
        .routes
        .iter()
        .filter(|r| matches!(r.action, crate::route::Action::Upstream(_)))
        .count();
    let set_name = if proxied > 1 { Some("traefik") } else { None };
    if let Some(name) = set_name {
        let loc = ctx.routes[0].loc.clone();
        let set = ctx.cfg.rule_set(name, &loc);
        set.from.clear();
        set.comments
            .push("the fields Traefik sets on every proxied request".into());
        let mut t = toml::Table::new();
        t.insert("set".into(), crate::route::table(&base));
        set.set("request_headers", toml::Value::Table(t));
    }
    for r in &ctx.routes {
        if matches!(r.action, crate::route::Action::Nothing) {
            continue;
        }
        let s = r.section(&http, set_name, &base);
        ctx.cfg.routes.push(s);
    }
}

/// Middlewares and services no router uses.
fn unused(ctx: &mut Ctx) {
    for (_, l, label, why) in std::mem::take(&mut ctx.inp.refused_rules) {
        ctx.rep.refused(&l, label, why);
    }
    if let Some((_, loc)) = &ctx.global_transport {
        if !ctx.lines.has("serversTransport") {
            let l = ctx.lines.at("serversTransport", loc, "serversTransport");
            l.ignored = Some("no HTTP service uses it".into());
        }
    }
    let lists: [(&str, &Vec<Named>); 3] = [
        ("http.middlewares", &ctx.inp.middlewares),
        ("http.services", &ctx.inp.services),
        ("http.serversTransports", &ctx.inp.transports),
    ];
    for (kind, list) in lists {
        for n in list {
            let key = format!("{kind}.{}", n.name);
            if !ctx.lines.has(&key) {
                let refused: Vec<&str> = ctx
                    .skipped
                    .iter()
                    .filter(|(m, _)| *m == n.name)
                    .map(|(_, r)| r.as_str())
                    .collect();
                let why = if refused.is_empty() {
                    "no router uses it".to_string()
                } else {
                    format!(
                        "only routers that get no route here use it ({})",
                        refused.join(", ")
                    )
                };
                let l = ctx.lines.at(&key, &n.loc, &key);
                l.ignored = Some(why);
            }
        }
    }
}
