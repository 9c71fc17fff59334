//! Traefik's operator features: the API and dashboard (`api`, routers to `api@internal`),
//! `ping`, `metrics`, `log`, `accessLog` and `global`. veloxy has no dashboard; its admin
//! endpoint (`[server] admin`: `/metrics`, `/upstreams`, `/healthz`) takes their place, on a
//! loopback address.

use veloxy_import::tree::Node;
use veloxy_import::Loc;

use crate::node::{entries, flag, get, text};
use crate::translate::Ctx;

/// What veloxy's admin endpoint serves, for report lines.
const ADMIN: &str = "its admin endpoint (/metrics, /upstreams, /healthz)";

/// The admin endpoint's address (set on first use): 127.0.0.1 on Traefik's API port (the
/// `traefik` entry point, default 8080) unless a listener has that port, else 9900.
pub fn admin(ctx: &mut Ctx) -> String {
    if let Some(a) = &ctx.admin {
        return a.clone();
    }
    let used: Vec<u16> = ctx.eps.iter().map(|e| e.port).collect();
    let port = [ctx.api_port, 9900, 9901, 9902]
        .into_iter()
        .find(|p| !used.contains(p))
        .unwrap_or(9903);
    let addr = format!("127.0.0.1:{port}");
    ctx.cfg.server.set("admin", addr.as_str());
    ctx.admin = Some(addr.clone());
    addr
}

/// The static `api`, `ping` and `metrics` (after the entry points, whose ports the admin
/// endpoint must not take).
pub fn statics(ctx: &mut Ctx, pending: Vec<(String, Loc, Node)>) {
    for (name, loc, v) in pending {
        match name.to_ascii_lowercase().as_str() {
            "api" => api(ctx, &name, &loc, &v),
            "ping" => ping(ctx, &name, &loc, &v),
            "metrics" => metrics(ctx, &name, &loc, &v),
            "log" => log(ctx, &name, &loc, &v),
            "accesslog" => access_log(ctx, &name, &loc, &v),
            _ => ctx.rep.ignored(
                &loc,
                &name,
                "update checks and anonymous usage statistics change nothing a client sees",
            ),
        }
    }
}

/// A section given as `--api` / `--api=false` (a scalar) or as a mapping; `None`: off.
fn on(v: &Node) -> Option<&Node> {
    match v.as_bool() {
        Some(false) => None,
        _ => Some(v),
    }
}

fn api(ctx: &mut Ctx, name: &str, loc: &Loc, v: &Node) {
    let Some(v) = on(v) else {
        ctx.rep.ignored(loc, name, "the API is off");
        return;
    };
    let insecure = flag(v, "insecure") == Some(true);
    if flag(v, "dashboard") == Some(false) && !insecure {
        ctx.rep.ignored(
            loc,
            name,
            "the dashboard is off and the API is served only through routers to api@internal",
        );
        return;
    }
    let addr = admin(ctx);
    let mut what = format!("veloxy has no dashboard; {ADMIN} is set to {addr}");
    if insecure {
        what.push_str(&format!(
            "; api.insecure: Traefik served its API and dashboard on :{} of every interface (entry point traefik), veloxy's admin endpoint listens on loopback only (another address needs [server] admin_token_file)",
            ctx.api_port
        ));
    }
    if flag(v, "debug") == Some(true) {
        what.push_str("; api.debug: veloxy has no /debug/ endpoints");
    }
    ctx.rep.different(loc, name, what);
}

fn ping(ctx: &mut Ctx, name: &str, loc: &Loc, v: &Node) {
    let Some(v) = on(v) else {
        ctx.rep.ignored(loc, name, "ping is off");
        return;
    };
    let ep = text(v, "entryPoint").unwrap_or_else(|| "traefik".into());
    let addr = admin(ctx);
    ctx.rep.different(
        loc,
        name,
        format!("Traefik answered GET /ping with 200 OK on entry point {ep}; veloxy's health check is GET /healthz on its admin endpoint {addr} (200, or 503 while shutting down): point the health check there"),
    );
}

fn metrics(ctx: &mut Ctx, name: &str, loc: &Loc, v: &Node) {
    let Some(p) = get(v, "prometheus") else {
        ctx.rep.ignored(
            loc,
            name,
            "metrics pushed to a collector (telemetry) change nothing a client sees; veloxy serves Prometheus metrics on its admin endpoint",
        );
        return;
    };
    let ep = text(p, "entryPoint").unwrap_or_else(|| "traefik".into());
    let addr = admin(ctx);
    let mut what = format!("veloxy's admin endpoint serves Prometheus metrics at http://{addr}/metrics (Traefik: /metrics on entry point {ep}), with other metric names (veloxy_*, not traefik_*) and labels");
    if entries(v).len() > 1 {
        what.push_str(
            "; the other metrics backends are not translated (veloxy has Prometheus only)",
        );
    }
    ctx.rep.different(loc, name, what);
}

/// `log.level` -> `[server] log_level`.
fn log(ctx: &mut Ctx, name: &str, loc: &Loc, v: &Node) {
    let Some(v) = on(v) else {
        ctx.rep
            .ignored(loc, name, "logging changes nothing a client sees");
        return;
    };
    if let Some(level) = text(v, "level") {
        let l = match level.to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            _ => "error",
        };
        ctx.cfg.server.set("log_level", l);
    }
    let mut notes = Vec::new();
    if let Some(f) = text(v, "filePath") {
        notes.push(format!("veloxy logs to stderr (Traefik: {f})"));
    }
    if text(v, "format").is_some_and(|f| f.eq_ignore_ascii_case("json")) {
        notes.push("veloxy's log lines are text (Traefik: JSON)".to_string());
    }
    if notes.is_empty() {
        ctx.rep.translated(loc, name);
    } else {
        ctx.rep.different(loc, name, notes.join("; "));
    }
}

/// `accessLog` -> `[server.access_log]` (Traefik's default: CLF lines on stdout).
fn access_log(ctx: &mut Ctx, name: &str, loc: &Loc, v: &Node) {
    let Some(v) = on(v) else {
        ctx.rep.ignored(loc, name, "the access log is off");
        return;
    };
    let mut t = toml::Table::new();
    let path = text(v, "filePath").unwrap_or_else(|| "stdout".into());
    t.insert("path".into(), path.into());
    let json = text(v, "format").is_some_and(|f| f.eq_ignore_ascii_case("json"));
    let mut notes = Vec::new();
    if json {
        t.insert("format".into(), "json".into());
        notes.push("veloxy's JSON access log has its own field names".to_string());
    } else {
        t.insert("format".into(), "combined".into());
        notes.push("veloxy writes the combined log format (Traefik's CLF lines add the request count, router and service names and the duration)".to_string());
    }
    if get(v, "filters").is_some() {
        notes.push("filters: veloxy logs every request".into());
    }
    if get(v, "fields").is_some() {
        notes.push("fields: veloxy's fields are fixed".into());
    }
    ctx.cfg.server.set("access_log", toml::Value::Table(t));
    ctx.rep.different(loc, name, notes.join("; "));
}

/// What a router to one of Traefik's internal services becomes.
pub enum Internal {
    /// No route: the note says why (the dashboard, ping, metrics: the admin endpoint).
    Dropped(String),
    /// The route answers itself (`noop@internal`: an empty 200).
    Answer(crate::route::Action),
    /// Not one veloxy knows.
    Unknown,
}

/// A router whose service is `service` (ending in `@internal`).
pub fn internal_service(ctx: &mut Ctx, service: &str) -> Internal {
    let name = service.trim_end_matches("@internal");
    let no_route = "this router gets no route (its requests answer 404)";
    match name {
        "api" | "dashboard" | "rest" => {
            let addr = admin(ctx);
            Internal::Dropped(format!("{name}@internal is Traefik's dashboard and API: veloxy has no dashboard; {ADMIN} is set to {addr}; {no_route}"))
        }
        "ping" => {
            let addr = admin(ctx);
            Internal::Dropped(format!("ping@internal: veloxy's health check is GET /healthz on its admin endpoint {addr}; {no_route}"))
        }
        "prometheus" => {
            let addr = admin(ctx);
            Internal::Dropped(format!("prometheus@internal: veloxy serves Prometheus metrics (other names: veloxy_*) at http://{addr}/metrics; {no_route}"))
        }
        "noop" => Internal::Answer(crate::route::Action::Respond(200, String::new())),
        _ => Internal::Unknown,
    }
}
