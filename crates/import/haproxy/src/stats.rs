//! HAProxy's statistics page (`stats enable`, `stats uri`, stats-only `listen`/`frontend`
//! sections) becomes veloxy's admin endpoint: `[server] admin` on loopback, on the port of
//! the stats section's bind when no listener takes it, else 9900.

use veloxy_import::Loc;

use crate::parse::Line;
use crate::proxy::Proxy;
use crate::Ctx;

/// The difference every statistics line carries.
pub const ADMIN: &str = "veloxy has no stats page; its admin endpoint (/metrics, /upstreams, /healthz; on loopback; a token with admin_token_file for other addresses) replaces it";

/// `stats auth`: what the credentials become.
const AUTH: &str = "the admin endpoint takes a bearer token (admin_token_file), not these credentials (on loopback it takes none)";

/// The port veloxy's admin endpoint takes when no stats bind gives a free one.
const DEFAULT_PORT: u16 = 9900;

/// What the statistics lines ask of the output.
#[derive(Debug, Default)]
pub struct Stats {
    /// A statistics line was translated: `[server] admin` is written.
    used: bool,
    /// The ports of stats-only sections' binds, in file order.
    ports: Vec<u16>,
    /// The sections asking for it (for `# from`).
    from: Vec<Loc>,
}

/// Whether proxy `p` serves only the statistics page (no server, no backend rule).
pub fn only(p: &Proxy) -> bool {
    p.own.iter().any(|l| l.kw() == "stats")
        && !p.own.iter().any(|l| {
            matches!(
                l.kw(),
                "server" | "server-template" | "use_backend" | "default_backend"
            )
        })
}

/// A `stats` line of a proxy (or of the `defaults` it takes).
pub fn line(cx: &mut Ctx, p: &Proxy, l: &Line) {
    // In a proxy that also serves traffic: the path HAProxy answers with the page.
    let uri = p
        .last("stats", Some("uri"))
        .and_then(|u| u.arg(1))
        .unwrap_or("/haproxy?stats");
    let page = (!only(p)).then_some(uri);
    cx.stats.used = true;
    if !cx.stats.from.contains(&p.head.loc) {
        cx.stats.from.push(p.head.loc.clone());
    }
    cx.diff(l, ADMIN);
    match l.arg(0) {
        Some("auth") => cx.diff(l, AUTH),
        Some("uri" | "enable") => {
            let uri_line = p.last("stats", Some("uri"));
            let here = uri_line.map_or(l.arg(0) == Some("enable"), |u| u.loc == l.loc);
            if let (Some(uri), true) = (page, here) {
                cx.diff(
                    l,
                    format!("requests for {uri} get the routes' answers (HAProxy answers them with its statistics page)"),
                );
            }
        }
        _ => {}
    }
}

/// A stats-only section: no listener is made; its lines become the admin endpoint.
pub fn section(cx: &mut Ctx, p: &Proxy) {
    let none = "no listener is made for this statistics-only section";
    cx.diff(p.head, ADMIN);
    cx.diff(p.head, none);
    for l in p.own.iter().copied() {
        match (l.kw(), l.arg(0)) {
            ("bind", Some(a)) => {
                if let Some(port) = a
                    .split(',')
                    .next()
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, port)| port.parse::<u16>().ok())
                {
                    cx.stats.ports.push(port);
                }
                cx.diff(l, ADMIN);
                cx.diff(l, none);
            }
            ("mode", _) => {
                cx.diff(l, ADMIN);
                cx.diff(l, none);
            }
            ("http-request", Some("use-service")) if l.arg(1) == Some("prometheus-exporter") => {
                cx.diff(l, "veloxy's Prometheus metrics are GET /metrics on its admin endpoint (veloxy's own metric names)");
            }
            _ => {}
        }
    }
    if p.kind == "listen" {
        if let Some(port) = p
            .head
            .arg(1)
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, port)| port.parse::<u16>().ok())
        {
            cx.stats.ports.push(port);
        }
    }
}

/// The own lines of stats-only section `p` no other rule decided: they shape the page only.
pub fn rest(cx: &mut Ctx, p: &Proxy) {
    for l in p.own.iter().copied() {
        if !cx.decided(l) {
            cx.ignore(
                l,
                "applies only to HAProxy's statistics page, which veloxy replaces by its admin endpoint",
            );
        }
    }
}

/// Writes `[server] admin` when a statistics line asked for it.
pub fn finish(cx: &mut Ctx) {
    if !cx.stats.used || cx.out.server.get("admin").is_some() {
        return;
    }
    let taken = |cx: &Ctx, port: u16| {
        let p = format!(":{port}");
        cx.binds.iter().any(|(a, _)| a.ends_with(&p))
    };
    let port = cx
        .stats
        .ports
        .iter()
        .copied()
        .find(|&p| !taken(cx, p))
        .unwrap_or_else(|| {
            (DEFAULT_PORT..u16::MAX)
                .find(|&p| !taken(cx, p))
                .unwrap_or(DEFAULT_PORT)
        });
    cx.out.server.set("admin", format!("127.0.0.1:{port}"));
    for l in cx.stats.from.clone() {
        cx.out.server.add_from(&l);
    }
}
