//! `envoy.filters.network.http_connection_manager`: the HTTP settings of a listener, its
//! HTTP filters and its route configuration.

use veloxy_import::tree::Node;
use veloxy_import::Loc;

use super::filters::{http_filters, HttpFilters};
use super::Ctx;
use crate::util::{duration_ms, seq, Fields};

/// Where a connection manager's routes apply.
pub struct Scope<'a> {
    /// Whether it terminates TLS.
    pub tls: bool,
    /// The chain's `server_names` when the listener has several HTTP chains.
    pub sni: &'a [String],
    /// The HTTP filters in front of the router.
    pub filters: &'a HttpFilters,
    /// `upgrade_configs` allows WebSocket.
    pub websocket: bool,
}

/// Translates one HTTP connection manager.
pub fn hcm(
    ctx: &mut Ctx,
    listener: &str,
    tls: bool,
    sni: &[String],
    loc: &Loc,
    directive: &str,
    b: &Node,
) {
    let mut f = Fields::new(b, "http_connection_manager");
    f.take("@type");
    let filters = match f.take("http_filters") {
        Some((_, hf)) => http_filters(ctx, hf),
        None => HttpFilters::default(),
    };
    let mut diffs = Vec::new();
    codec(ctx, &mut f, listener, tls);
    let remote = match f.take("use_remote_address") {
        Some((l, v)) => {
            let on = v.as_bool().unwrap_or(false);
            if on {
                ctx.r
                    .translated(l, "http_connection_manager.use_remote_address");
            } else {
                ctx.r.different(
                    l,
                    "http_connection_manager.use_remote_address",
                    "veloxy appends the client address to X-Forwarded-For (Envoy keeps the \
                     client's field as it came)",
                );
            }
            on
        }
        None => {
            diffs.push(
                "Envoy keeps the client's X-Forwarded-For and X-Forwarded-Proto as they came \
                 (use_remote_address is false); veloxy appends the client address to \
                 X-Forwarded-For and sets X-Forwarded-Proto to its own scheme",
            );
            false
        }
    };
    if let Some((l, n)) = f.take("xff_num_trusted_hops") {
        trusted_hops(ctx, l, n.as_i64().unwrap_or(0), remote);
    }
    if let Some((l, v)) = f.take("skip_xff_append") {
        if v.as_bool() == Some(false) {
            // Envoy's default: the client address is appended, as veloxy does.
            ctx.r
                .translated(l, "http_connection_manager.skip_xff_append");
        } else {
            ctx.r.refused(
                l,
                "http_connection_manager.skip_xff_append",
                "veloxy always appends the client address to X-Forwarded-For",
            );
        }
    }
    f.ignore(
        &mut ctx.r,
        "internal_address_config",
        "which peers Envoy treats as internal (its x-envoy-* field handling)",
    );
    request_id(ctx, &mut f);
    server_fields(ctx, &mut f, &mut diffs);
    timeouts(ctx, &mut f);
    let websocket = upgrades(ctx, &mut f);
    if !websocket {
        diffs.push(
            "Envoy refuses WebSocket upgrades (403) without upgrade_configs; veloxy forwards \
             them",
        );
    }
    paths(ctx, &mut f, &mut diffs);
    if let Some((l, _)) = f.take("access_log") {
        super::filters::access_log(ctx, l, "http_connection_manager.access_log");
    }
    f.refuse(
        &mut ctx.r,
        "rds",
        "routes from RDS (xDS): veloxy reads a static file; put the route_config inline",
    );
    f.refuse(
        &mut ctx.r,
        "scoped_routes",
        "scoped route tables (xDS): put the route_config inline",
    );
    f.refuse(
        &mut ctx.r,
        "local_reply_config",
        "rewritten local replies (Envoy's own error answers): veloxy's error_pages are files \
         per route",
    );
    f.refuse(
        &mut ctx.r,
        "via",
        "a Via field on requests and answers: veloxy adds none (name it in request_headers \
         and response_headers)",
    );
    f.ignore(
        &mut ctx.r,
        "forward_client_cert_details",
        "veloxy does not verify client certificates, so there are none to forward",
    );
    f.ignore(
        &mut ctx.r,
        "add_user_agent",
        "x-envoy-downstream-service-cluster fields for Envoy meshes",
    );
    diffs.push(
        "Envoy adds x-envoy-expected-rq-timeout-ms (and x-envoy-original-path on a rewrite) \
         upstream and answers with server: envoy and x-envoy-upstream-service-time; veloxy \
         adds no x-envoy-* field, passes the backend's Server and sets X-Forwarded-Host",
    );
    let scope = Scope {
        tls,
        sni,
        filters: &filters,
        websocket,
    };
    let routes = match f.take("route_config") {
        Some((_, rc)) => super::routes::route_config(ctx, &scope, rc),
        None => Vec::new(),
    };
    f.finish(&mut ctx.r);
    ctx.r.different(loc, directive, diffs.join("; "));
    share(ctx, listener, routes);
}

/// Adds a listener's routes, sharing an identical earlier list (one route on two listeners).
fn share(ctx: &mut Ctx, listener: &str, routes: Vec<veloxy_import::Section>) {
    let same = |a: &[veloxy_import::Section], b: &[veloxy_import::Section]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.keys == y.keys)
    };
    if let Some((ls, rs)) = ctx.route_lists.iter_mut().find(|(_, rs)| same(rs, &routes)) {
        if !ls.iter().any(|l| l == listener) {
            ls.push(listener.to_string());
        }
        for (r, n) in rs.iter_mut().zip(&routes) {
            for l in &n.from {
                r.add_from(l);
            }
        }
        return;
    }
    ctx.route_lists.push((vec![listener.to_string()], routes));
}

/// `codec_type`: HTTP/2 on the listener.
fn codec(ctx: &mut Ctx, f: &mut Fields, listener: &str, tls: bool) {
    let codec = f.take("codec_type");
    let kind = codec
        .and_then(|(_, c)| crate::util::enum_name(c))
        .unwrap_or_else(|| "AUTO".into());
    let l = ctx.cfg.listener(listener, f.loc);
    match kind.as_str() {
        "HTTP1" => {
            l.set("http2", false);
        }
        _ if !tls => {
            l.set("http2", true);
        }
        _ => {}
    }
    if let Some((loc, _)) = codec {
        match kind.as_str() {
            "HTTP2" => ctx.r.different(
                loc,
                "http_connection_manager.codec_type",
                "veloxy also accepts HTTP/1.1 on this listener (Envoy only HTTP/2)",
            ),
            "HTTP3" => ctx.r.refused(
                loc,
                "http_connection_manager.codec_type",
                "HTTP/3 only: use http3 = true on a TLS listener",
            ),
            _ => ctx.r.translated(loc, "http_connection_manager.codec_type"),
        }
    }
}

/// `xff_num_trusted_hops`: veloxy trusts proxies by address, not by count.
fn trusted_hops(ctx: &mut Ctx, loc: &Loc, n: i64, remote: bool) {
    if n == 0 {
        ctx.r
            .translated(loc, "http_connection_manager.xff_num_trusted_hops");
        return;
    }
    let private = [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "127.0.0.0/8",
        "fc00::/7",
        "::1/128",
    ];
    let v: Vec<toml::Value> = private.iter().map(|p| (*p).into()).collect();
    ctx.cfg.server.set("trusted_proxies", toml::Value::Array(v));
    ctx.cfg.server.add_from(loc);
    let whose = if remote {
        ""
    } else {
        " (and, use_remote_address being false, Envoy takes the address from X-Forwarded-For alone)"
    };
    ctx.r.different(
        loc,
        "http_connection_manager.xff_num_trusted_hops",
        format!(
            "Envoy trusts the last {n} X-Forwarded-For entries whatever their address; veloxy \
             trusts the proxies in trusted_proxies, here the private and loopback ranges: list \
             your load balancers' addresses instead{whose}"
        ),
    );
}

/// `generate_request_id` (default on) and friends: `[server] request_id`.
fn request_id(ctx: &mut Ctx, f: &mut Fields) {
    let gen = match f.take("generate_request_id") {
        Some((loc, v)) => {
            let on = v.as_bool().unwrap_or(true);
            ctx.r
                .translated(loc, "http_connection_manager.generate_request_id");
            on
        }
        None => true,
    };
    if gen {
        ctx.cfg.server.set("request_id", "X-Request-Id");
    }
    f.ignore(
        &mut ctx.r,
        "preserve_external_request_id",
        "veloxy keeps a valid incoming X-Request-Id",
    );
    if let Some((loc, _)) = f.take("always_set_request_id_in_response") {
        ctx.r.translated(
            loc,
            "http_connection_manager.always_set_request_id_in_response",
        );
    }
    f.ignore(
        &mut ctx.r,
        "request_id_extension",
        "the form of Envoy's generated IDs (veloxy's are 32 hex digits)",
    );
}

/// `server_name`, `server_header_transformation`, header limits, underscores.
fn server_fields(ctx: &mut Ctx, f: &mut Fields, diffs: &mut Vec<&'static str>) {
    f.refuse(
        &mut ctx.r,
        "server_name",
        "a Server field on every answer: veloxy passes the backend's (set it in \
         response_headers)",
    );
    if let Some((loc, v)) = f.take("server_header_transformation") {
        match crate::util::enum_name(v).as_deref() {
            Some("PASS_THROUGH") => ctx
                .r
                .translated(loc, "http_connection_manager.server_header_transformation"),
            _ => ctx.r.different(
                loc,
                "http_connection_manager.server_header_transformation",
                "veloxy passes the backend's Server field and adds none",
            ),
        }
    }
    if let Some((loc, kb)) = f.take("max_request_headers_kb") {
        let kb = kb.as_i64().unwrap_or(60);
        ctx.cfg.server.set("max_header_bytes", kb * 1024);
        ctx.r
            .translated(loc, "http_connection_manager.max_request_headers_kb");
    }
    let mut underscores = true;
    if let Some((loc, cp)) = f.take("common_http_protocol_options") {
        let mut cf = Fields::new(cp, "common_http_protocol_options");
        if let Some((l, a)) = cf.take("headers_with_underscores_action") {
            match crate::util::enum_name(a).as_deref() {
                Some("DROP_HEADER") => {
                    underscores = false;
                    ctx.r.translated(l, "headers_with_underscores_action");
                }
                Some("REJECT_REQUEST") => {
                    underscores = false;
                    ctx.r.different(
                        l,
                        "headers_with_underscores_action",
                        "veloxy drops such fields; Envoy answers 400",
                    );
                }
                _ => ctx.r.translated(l, "headers_with_underscores_action"),
            }
        }
        if let Some((l, t)) = cf.take("idle_timeout") {
            if let Some(ms) = duration_ms(t) {
                ctx.cfg
                    .server
                    .set("keepalive_timeout", crate::util::dur(ms));
                ctx.r
                    .translated(l, "common_http_protocol_options.idle_timeout");
            }
        }
        cf.ignore(
            &mut ctx.r,
            "max_headers_count",
            "veloxy bounds the request head by bytes (max_header_bytes)",
        );
        cf.ignore(
            &mut ctx.r,
            "max_connection_duration",
            "Envoy drains connections after this long; veloxy keeps them while active",
        );
        cf.finish(&mut ctx.r);
        let _ = loc;
    }
    if underscores {
        ctx.cfg.server.set("underscores_in_headers", true);
    }
    let _ = diffs;
}

/// The timeouts of the connection manager.
fn timeouts(ctx: &mut Ctx, f: &mut Fields) {
    if let Some((loc, t)) = f.take("request_headers_timeout") {
        if let Some(ms) = duration_ms(t).filter(|ms| *ms > 0) {
            ctx.cfg.server.set("header_timeout", crate::util::dur(ms));
        }
        ctx.r
            .translated(loc, "http_connection_manager.request_headers_timeout");
    }
    f.ignore(
        &mut ctx.r,
        "stream_idle_timeout",
        "veloxy bounds idle streams by body_timeout, send_timeout and the group's read_timeout",
    );
    f.ignore(
        &mut ctx.r,
        "request_timeout",
        "veloxy bounds the request head by header_timeout and each body read by body_timeout",
    );
    for k in ["drain_timeout", "delayed_close_timeout"] {
        f.ignore(&mut ctx.r, k, "how Envoy closes connections it drains");
    }
    f.ignore(
        &mut ctx.r,
        "http2_protocol_options",
        "HTTP/2 window and stream tuning (veloxy's limits are its own)",
    );
    f.ignore(
        &mut ctx.r,
        "http_protocol_options",
        "HTTP/1.1 codec options of Envoy's",
    );
}

/// `upgrade_configs`: WebSocket.
fn upgrades(ctx: &mut Ctx, f: &mut Fields) -> bool {
    let Some((_, u)) = f.take("upgrade_configs") else {
        return false;
    };
    let mut ws = false;
    for x in seq(u) {
        let ty = x
            .get("upgrade_type")
            .and_then(|t| t.scalar())
            .unwrap_or_default();
        let enabled = x.get("enabled").and_then(|e| e.as_bool()).unwrap_or(true);
        if ty.eq_ignore_ascii_case("websocket") && enabled {
            ws = true;
            ctx.r.translated(&x.loc, "upgrade_configs.websocket");
        } else if ty.eq_ignore_ascii_case("CONNECT") {
            ctx.r.refused(
                &x.loc,
                "upgrade_configs.CONNECT",
                "CONNECT tunnels: veloxy answers CONNECT with 501",
            );
        } else {
            ctx.r.different(
                &x.loc,
                format!("upgrade_configs.{ty}"),
                "veloxy forwards every HTTP/1.1 upgrade, not only the listed ones",
            );
        }
    }
    ws
}

/// Path normalization.
fn paths(ctx: &mut Ctx, f: &mut Fields, diffs: &mut Vec<&'static str>) {
    let norm = f.take("normalize_path");
    match norm {
        Some((loc, v)) if v.as_bool() == Some(true) => ctx
            .r
            .translated(loc, "http_connection_manager.normalize_path"),
        Some((loc, _)) => ctx.r.different(
            loc,
            "http_connection_manager.normalize_path",
            "veloxy matches routes on the normalized path (dot segments removed)",
        ),
        None => diffs.push(
            "veloxy matches routes on the normalized path (dot segments removed, %-encoded \
             unreserved characters decoded); Envoy matches the path as sent",
        ),
    }
    f.ignore(
        &mut ctx.r,
        "merge_slashes",
        "veloxy matches paths with their slashes as sent",
    );
    f.ignore(
        &mut ctx.r,
        "path_with_escaped_slashes_action",
        "veloxy matches %2F as sent (it is never decoded to '/')",
    );
    for k in ["strip_matching_host_port", "strip_any_host_port"] {
        if let Some((loc, _)) = f.take(k) {
            ctx.r
                .translated(loc, format!("http_connection_manager.{k}"));
        }
    }
}
