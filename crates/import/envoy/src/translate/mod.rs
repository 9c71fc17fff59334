//! The translation of one Envoy bootstrap into the veloxy model.
//!
//! Order: `static_resources.secrets` (certificates named by listeners), the clusters (read
//! first, written last: routes decide their timeouts and retries), then the listeners with
//! their filter chains, HTTP connection managers and routes.

mod action;
mod cluster;
mod filters;
mod hcm;
mod headers;
mod listener;
mod order;
mod policy;
mod route;
mod routes;
mod runtime;
mod sockets;

use std::path::PathBuf;

use veloxy_import::tree::Node;
use veloxy_import::{Config, Loc, Options, Report};

use crate::util::{seq, Fields};

pub use cluster::Cluster;

/// What the translation of one import holds.
pub struct Ctx<'o> {
    /// The output.
    pub cfg: Config,
    /// One line per source field.
    pub r: Report,
    /// The command line's options.
    pub opts: &'o Options,
    /// The directory of the file being read (relative paths in it are from there).
    pub base: PathBuf,
    /// Every cluster, written out at the end.
    pub clusters: Vec<Cluster>,
    /// `static_resources.secrets`: name -> the `tls_certificate` node.
    pub secrets: Vec<(String, Node)>,
    /// How many listeners carry HTTP routes (routes name their listener only when several).
    pub http_listeners: usize,
    /// Route lists of earlier connection managers, to share one list between listeners.
    pub route_lists: Vec<(Vec<String>, Vec<veloxy_import::Section>)>,
    /// Each named listener: Envoy's name -> the veloxy listener's (for runtime limits).
    pub listener_names: Vec<(String, String)>,
}

impl<'o> Ctx<'o> {
    /// An empty translation.
    pub fn new(opts: &'o Options) -> Self {
        Ctx {
            cfg: Config::default(),
            r: Report::default(),
            opts,
            base: PathBuf::from("."),
            clusters: Vec::new(),
            secrets: Vec::new(),
            http_listeners: 0,
            route_lists: Vec::new(),
            listener_names: Vec::new(),
        }
    }

    /// A path named in the source, as the output names it.
    pub fn path(&self, p: &str) -> String {
        self.opts.out_path(&self.base, p)
    }

    /// Finishes the import: the clusters and the route lists are written.
    pub fn finish(mut self) -> veloxy_import::Imported {
        cluster::write_all(&mut self);
        let single = self.http_listeners <= 1;
        for (listeners, routes) in std::mem::take(&mut self.route_lists) {
            for mut r in routes {
                if !single {
                    let v: Vec<toml::Value> = listeners.iter().map(|l| l.clone().into()).collect();
                    let value = if v.len() == 1 {
                        v[0].clone()
                    } else {
                        toml::Value::Array(v)
                    };
                    r.keys.insert(0, ("listener".into(), value));
                }
                self.cfg.routes.push(r);
            }
        }
        self.r.sort();
        veloxy_import::Imported {
            config: self.cfg,
            report: self.r,
        }
    }
}

/// Translates one bootstrap document.
pub fn bootstrap(ctx: &mut Ctx, root: &Node) {
    let mut f = Fields::new(root, "bootstrap");
    if let Some((_, sr)) = f.take("static_resources") {
        static_resources(ctx, sr);
    }
    f.ignore(
        &mut ctx.r,
        "node",
        "the node's identity for xDS and stats (no effect on traffic)",
    );
    f.refuse(
        &mut ctx.r,
        "dynamic_resources",
        "listeners and clusters from xDS (LDS/CDS/ADS): veloxy reads a static file; dump the \
         configuration (admin /config_dump) into static_resources",
    );
    if let Some((loc, a)) = f.take("admin") {
        admin(ctx, loc, a);
    }
    if let Some((loc, lr)) = f.take("layered_runtime") {
        runtime::layered_runtime(ctx, loc, lr);
    }
    for k in [
        "stats_sinks",
        "stats_config",
        "stats_flush_interval",
        "stats_flush_on_admin",
        "stats_server_version_override",
        "enable_dispatcher_stats",
    ] {
        f.ignore(
            &mut ctx.r,
            k,
            "Envoy's statistics (veloxy has its own metrics on the admin endpoint)",
        );
    }
    f.ignore(
        &mut ctx.r,
        "tracing",
        "veloxy exports no traces: the trace context fields Envoy's tracer adds upstream \
         (traceparent, x-b3-*) are not added",
    );
    for k in ["watchdog", "watchdogs"] {
        f.ignore(&mut ctx.r, k, "Envoy's own deadlock detection");
    }
    f.ignore(
        &mut ctx.r,
        "overload_manager",
        "Envoy's memory-pressure actions: veloxy bounds memory with its own fixed limits",
    );
    f.ignore(
        &mut ctx.r,
        "cluster_manager",
        "local cluster and outlier event log settings of Envoy's",
    );
    f.ignore(
        &mut ctx.r,
        "flags_path",
        "Envoy's drain/hot-restart flag files",
    );
    f.ignore(&mut ctx.r, "hds_config", "Envoy's health discovery service");
    f.finish(&mut ctx.r);
}

fn static_resources(ctx: &mut Ctx, sr: &Node) {
    let mut f = Fields::new(sr, "static_resources");
    if let Some((_, secrets)) = f.take("secrets") {
        for s in seq(secrets) {
            let name = s.get("name").and_then(|n| n.scalar()).unwrap_or_default();
            match s.get("tls_certificate") {
                Some(c) => {
                    ctx.secrets.push((name, c.clone()));
                    ctx.r.translated(&s.loc, "secret.tls_certificate");
                }
                None => ctx.r.refused(
                    &s.loc,
                    "secret",
                    "only tls_certificate secrets are translated (veloxy verifies no client \
                     certificates)",
                ),
            }
        }
    }
    if let Some((_, clusters)) = f.take("clusters") {
        for c in seq(clusters) {
            cluster::read(ctx, c);
        }
    }
    if let Some((_, listeners)) = f.take("listeners") {
        ctx.http_listeners = seq(listeners)
            .iter()
            .filter(|l| listener::has_http(l))
            .count();
        for l in seq(listeners) {
            listener::listener(ctx, l);
        }
    }
    f.finish(&mut ctx.r);
}

/// `admin`: veloxy's admin endpoint on the same port (its API differs). Envoy's admin has no
/// authentication and veloxy refuses an unauthenticated admin off loopback, so an admin on
/// any other address is bound to loopback.
fn admin(ctx: &mut Ctx, loc: &Loc, a: &Node) {
    let Some(addr) = a.get("address") else {
        ctx.r
            .ignored(loc, "admin", "no address: Envoy's admin endpoint is off");
        return;
    };
    const ENDPOINTS: &str = "the endpoints differ (/metrics, /upstreams, /healthz, /reload): \
                             Envoy's /stats, /clusters, /config_dump, /quitquitquit and the \
                             admin access_log are not there";
    match crate::util::socket_address(addr) {
        Ok((host, Some(port), true)) => {
            let v6 = host.starts_with('[');
            let loopback = host == "[::1]" || host.starts_with("127.");
            let bind = if loopback {
                host.clone()
            } else if v6 {
                "[::1]".to_string()
            } else {
                "127.0.0.1".to_string()
            };
            ctx.cfg.server.set("admin", format!("{bind}:{port}"));
            ctx.cfg.server.add_from(loc);
            let why = if loopback {
                ENDPOINTS.to_string()
            } else {
                format!(
                    "bound to loopback ({bind}:{port}, not {host}:{port}: Envoy's admin has no \
                     authentication; veloxy's on a public address needs admin_token_file); \
                     {ENDPOINTS}"
                )
            };
            ctx.r.different(loc, "admin", why);
        }
        Ok(_) => ctx
            .r
            .refused(loc, "admin", "an admin address that is not IP:port"),
        Err(e) => ctx.r.refused(loc, "admin", e),
    }
}
