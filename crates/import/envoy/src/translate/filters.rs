//! HTTP filters (`http_filters` of a connection manager and their per-route configs), active
//! health checks and access logs.

use toml::{Table, Value};
use veloxy_import::tree::Node;
use veloxy_import::{Loc, Section};

use super::Ctx;
use crate::util::{dur, duration_ms, seq, string_match, typed, Fields};

/// What the HTTP filters in front of the router do to every route.
#[derive(Debug, Default, Clone)]
pub struct HttpFilters {
    /// The CORS filter is there (the policies are on virtual hosts and routes).
    pub cors: bool,
    /// `ext_authz` with an HTTP service: `forward_auth`.
    pub authz: Option<Table>,
    /// `compressor`.
    pub compress: bool,
    /// `local_ratelimit` with a bucket for the whole connection manager.
    pub rate_limit: Option<Table>,
    /// `local_ratelimit` is there (per-route buckets apply).
    pub rate_limit_filter: bool,
    /// `buffer`: the request body cap.
    pub max_body: Option<i64>,
    /// `health_check` (not pass-through): the path answered 200 by the proxy itself.
    pub health_path: Option<(String, Loc)>,
}

/// The name of an HTTP filter: its `@type`'s package (`cors`, `router`...) or its name.
pub fn filter_name(x: &Node) -> String {
    if let Some(tc) = x.get("typed_config") {
        let (ty, _) = typed(tc);
        let parts: Vec<&str> = ty.split('.').collect();
        if parts.len() >= 3 && ty.starts_with("envoy.extensions.filters.http.") {
            return parts[parts.len() - 3].to_string();
        }
    }
    let name = x.get("name").and_then(|n| n.scalar()).unwrap_or_default();
    name.trim_start_matches("envoy.filters.http.")
        .trim_start_matches("envoy.")
        .to_string()
}

/// Reads `http_filters`.
pub fn http_filters(ctx: &mut Ctx, hf: &Node) -> HttpFilters {
    let mut out = HttpFilters::default();
    for x in seq(hf) {
        let kind = filter_name(x);
        let full = x
            .get("name")
            .and_then(|n| n.scalar())
            .unwrap_or(kind.clone());
        let d = format!("http_filters.{full}");
        let body = x.get("typed_config").and_then(|t| typed(t).1);
        let loc = &x.loc;
        if x.get("disabled").and_then(|b| b.as_bool()) == Some(true) {
            ctx.r.ignored(loc, d, "disabled (no route enables it here)");
            continue;
        }
        match kind.as_str() {
            "router" => ctx.r.translated(loc, d),
            "cors" => {
                out.cors = true;
                ctx.r.translated(loc, d);
            }
            "compressor" => {
                out.compress = true;
                ctx.r.different(
                    loc,
                    d,
                    "veloxy picks gzip, br or zstd from Accept-Encoding and uses its own list \
                     of compressible types and minimum length",
                );
            }
            "ext_authz" => ext_authz(ctx, loc, &d, body, &mut out),
            "local_ratelimit" => {
                out.rate_limit_filter = true;
                match body.and_then(|b| bucket(b).transpose()) {
                    Some(Ok(t)) => {
                        out.rate_limit = Some(t);
                        ctx.r.different(
                            loc,
                            d,
                            "veloxy keeps one bucket per route (Envoy one for the whole \
                             listener) and answers 429 with Retry-After",
                        );
                    }
                    Some(Err(e)) => ctx.r.refused(loc, d, e),
                    None => ctx.r.translated(loc, d),
                }
            }
            "buffer" => {
                let n = body
                    .and_then(|b| b.get("max_request_bytes"))
                    .and_then(|n| n.as_i64());
                out.max_body = n;
                ctx.r.different(
                    loc,
                    d,
                    "veloxy caps the body (413) without buffering it all first",
                );
            }
            "health_check" => health_filter(ctx, loc, &d, body, &mut out),
            "decompressor" => decompressor(ctx, loc, &d, body),
            "grpc_stats" | "grpc_http1_bridge" if kind == "grpc_stats" => {
                ctx.r.ignored(loc, d, "Envoy's gRPC statistics")
            }
            _ => ctx
                .r
                .refused(loc, d, format!("veloxy lacks Envoy's {kind} filter")),
        }
    }
    out
}

/// `decompressor`: veloxy has none; a filter with both directions disabled does nothing.
fn decompressor(ctx: &mut Ctx, loc: &Loc, d: &str, body: Option<&Node>) {
    let on = |dir: &str| {
        body.and_then(|b| b.get(dir)?.get("common_config")?.get("enabled"))
            .and_then(|e| e.get("default_value")?.as_bool())
            .unwrap_or(true)
    };
    let mut what = Vec::new();
    if on("request_direction_config") {
        what.push("request bodies sent with Content-Encoding: gzip reach the backend decompressed");
    }
    if on("response_direction_config") {
        what.push("compressed answers reach the client decompressed");
    }
    if what.is_empty() {
        ctx.r
            .ignored(loc, d, "both directions are disabled: it changes nothing");
        return;
    }
    ctx.r.refused(
        loc,
        d,
        format!(
            "veloxy lacks Envoy's decompressor filter: through Envoy {}",
            what.join(" and ")
        ),
    );
}

/// `ext_authz` with an `http_service`: `forward_auth`.
fn ext_authz(ctx: &mut Ctx, loc: &Loc, d: &str, body: Option<&Node>, out: &mut HttpFilters) {
    let Some(b) = body else {
        ctx.r.refused(loc, d, "no typed_config");
        return;
    };
    if b.get("grpc_service").is_some() {
        ctx.r.refused(
            loc,
            d,
            "an authorization service over gRPC: veloxy's forward_auth asks an HTTP service",
        );
        return;
    }
    let Some(hs) = b.get("http_service") else {
        ctx.r.refused(loc, d, "no http_service");
        return;
    };
    let uri = hs.get("server_uri");
    let cluster = uri
        .and_then(|u| u.get("cluster"))
        .and_then(|c| c.scalar())
        .unwrap_or_default();
    let Some(group) = ctx.plain_group(&cluster) else {
        ctx.r.refused(
            loc,
            d,
            format!("cluster {cluster} is not defined or has no endpoint veloxy can use"),
        );
        return;
    };
    let mut t = Table::new();
    t.insert("upstream".into(), group.into());
    if let Some(p) = hs.get("path_prefix").and_then(|p| p.scalar()) {
        t.insert("path".into(), p.into());
    }
    let copy: Vec<Value> = hs
        .get("authorization_response")
        .and_then(|r| r.get("allowed_upstream_headers"))
        .and_then(|a| a.get("patterns"))
        .map(|p| {
            seq(p)
                .iter()
                .filter_map(|m| string_match(m).ok())
                .map(Value::from)
                .collect()
        })
        .unwrap_or_default();
    if !copy.is_empty() {
        t.insert("copy_headers".into(), Value::Array(copy));
    }
    if let Some(ms) = uri.and_then(|u| u.get("timeout")).and_then(duration_ms) {
        t.insert("timeout".into(), dur(ms).into());
    }
    let mut diffs = vec![
        "Envoy sends the client's method and path (after path_prefix) to the auth service; \
         veloxy sends GET to path with X-Forwarded-Method, -Uri, -Host, -Proto and -For, and \
         only the Cookie and Authorization fields",
    ];
    if b.get("failure_mode_allow").and_then(|f| f.as_bool()) == Some(true) {
        diffs.push("the auth service down lets requests through in Envoy (failure_mode_allow); veloxy answers 503");
    } else {
        diffs.push("the auth service down is 403 in Envoy, 503 in veloxy");
    }
    if b.get("with_request_body").is_some() {
        diffs.push("veloxy sends no request body to the auth service");
    }
    ctx.r.different(loc, d, diffs.join("; "));
    out.authz = Some(t);
}

/// `health_check` filter: the proxy answers a path itself.
fn health_filter(ctx: &mut Ctx, loc: &Loc, d: &str, body: Option<&Node>, out: &mut HttpFilters) {
    let Some(b) = body else {
        ctx.r.refused(loc, d, "no typed_config");
        return;
    };
    if b.get("pass_through_mode").and_then(|p| p.as_bool()) == Some(true) {
        ctx.r.refused(
            loc,
            d,
            "pass-through health checks cached from the backends: veloxy lacks them",
        );
        return;
    }
    let path = seq(b.get("headers").unwrap_or(b)).iter().find_map(|h| {
        let name = h.get("name")?.scalar()?;
        if name != ":path" {
            return None;
        }
        h.get("string_match")
            .and_then(|m| string_match(m).ok())
            .or_else(|| h.get("exact_match")?.scalar())
    });
    match path {
        Some(p) => {
            out.health_path = Some((p, loc.clone()));
            ctx.r.different(
                loc,
                d,
                "veloxy answers 200 itself on this path; Envoy also answers 503 while draining",
            );
        }
        None => ctx.r.refused(
            loc,
            d,
            "a health check matched on other than an exact :path",
        ),
    }
}

/// A `local_ratelimit` config's bucket as `rate_limit`; `None` when the filter is not enabled
/// there (no `filter_enabled`, or 0%).
pub fn bucket(b: &Node) -> Result<Option<Table>, String> {
    let Some(tb) = b.get("token_bucket") else {
        return Ok(None);
    };
    let enabled = b
        .get("filter_enabled")
        .and_then(|f| f.get("default_value"))
        .and_then(|v| v.get("numerator"))
        .and_then(|n| n.as_i64())
        .unwrap_or(0);
    if enabled == 0 {
        return Ok(None);
    }
    let max = tb.get("max_tokens").and_then(|n| n.as_i64()).unwrap_or(1);
    let per = tb
        .get("tokens_per_fill")
        .and_then(|n| n.as_i64())
        .unwrap_or(1);
    let every = tb
        .get("fill_interval")
        .and_then(duration_ms)
        .unwrap_or(1000);
    let rate = if every == 1000 {
        format!("{per}/s")
    } else if every == 60_000 {
        format!("{per}/m")
    } else if every == 3_600_000 {
        format!("{per}/h")
    } else if (per as u64 * 60_000).is_multiple_of(every) {
        format!("{}/m", per as u64 * 60_000 / every)
    } else if (per as u64 * 3_600_000).is_multiple_of(every) {
        format!("{}/h", per as u64 * 3_600_000 / every)
    } else {
        return Err(format!(
            "{per} tokens every {}: not a whole number per second, minute or hour",
            dur(every)
        ));
    };
    let mut t = Table::new();
    t.insert("rate".into(), rate.into());
    t.insert("burst".into(), Value::Integer(max));
    t.insert("key".into(), "route".into());
    Ok(Some(t))
}

/// `health_checks` -> `[upstreams.NAME.health]` (the first check).
pub fn health_checks(ctx: &mut Ctx, loc: &Loc, hc: &Node, s: &mut Section) {
    for (i, h) in seq(hc).iter().enumerate() {
        if i > 0 {
            ctx.r.refused(
                &h.loc,
                "cluster.health_checks",
                "a second health check: veloxy runs one per group",
            );
            continue;
        }
        let mut f = Fields::new(h, "health_check");
        let mut t = Table::new();
        let mut diffs = vec![
            "when fewer than half of the endpoints are healthy Envoy balances over all of them \
             (panic mode); veloxy keeps to the healthy ones",
        ];
        if let Some((_, http)) = f.take("http_health_check") {
            let mut hf = Fields::new(http, "http_health_check");
            if let Some((l, p)) = hf.take("path") {
                t.insert("path".into(), p.scalar().unwrap_or_default().into());
                ctx.r.translated(l, "http_health_check.path");
            }
            if let Some((l, p)) = hf.take("host") {
                t.insert("host".into(), p.scalar().unwrap_or_default().into());
                ctx.r.translated(l, "http_health_check.host");
            }
            let status = match hf.take("expected_statuses") {
                Some((l, st)) => {
                    let ranges: Vec<(i64, i64)> = seq(st)
                        .iter()
                        .filter_map(|r| Some((r.get("start")?.as_i64()?, r.get("end")?.as_i64()?)))
                        .collect();
                    match ranges.as_slice() {
                        [(a, b)] if b - a == 1 => {
                            ctx.r.translated(l, "http_health_check.expected_statuses");
                            a.to_string()
                        }
                        [(a, b)] => {
                            ctx.r.translated(l, "http_health_check.expected_statuses");
                            format!("{a}-{}", b - 1)
                        }
                        _ => {
                            ctx.r.refused(
                                l,
                                "http_health_check.expected_statuses",
                                "several ranges: veloxy expects one status or range",
                            );
                            "200".into()
                        }
                    }
                }
                None => "200".into(),
            };
            t.insert("expect_status".into(), status.into());
            hf.refuse(
                &mut ctx.r,
                "request_headers_to_add",
                "fields added to health check requests: veloxy's checks send Host only",
            );
            hf.ignore(
                &mut ctx.r,
                "codec_client_type",
                "veloxy checks over HTTP/1.1",
            );
            hf.finish(&mut ctx.r);
        } else if let Some((l, tcp)) = f.take("tcp_health_check") {
            if tcp.get("send").is_some() || tcp.get("receive").is_some() {
                ctx.r.refused(
                    l,
                    "tcp_health_check",
                    "a payload sent and expected: veloxy's TCP check is a connect",
                );
            } else {
                ctx.r.translated(l, "tcp_health_check");
            }
        } else if let Some((l, _)) = f.take("grpc_health_check") {
            ctx.r.refused(
                l,
                "grpc_health_check",
                "gRPC health checks: veloxy checks over HTTP/1.1 or TCP",
            );
        }
        for (k, key) in [("interval", "interval"), ("timeout", "timeout")] {
            if let Some((l, v)) = f.take(k) {
                if let Some(ms) = duration_ms(v) {
                    t.insert(key.into(), dur(ms).into());
                }
                ctx.r.translated(l, format!("health_check.{k}"));
            }
        }
        for (k, key) in [
            ("healthy_threshold", "healthy"),
            ("unhealthy_threshold", "unhealthy"),
        ] {
            if let Some((l, v)) = f.take(k) {
                if let Some(n) = v.as_i64() {
                    t.insert(key.into(), Value::Integer(n));
                }
                ctx.r.translated(l, format!("health_check.{k}"));
            }
        }
        for k in [
            "interval_jitter",
            "interval_jitter_percent",
            "initial_jitter",
            "no_traffic_interval",
            "no_traffic_healthy_interval",
            "unhealthy_interval",
            "unhealthy_edge_interval",
            "healthy_edge_interval",
        ] {
            if f.has(k) {
                diffs.push(
                    "veloxy checks at one interval (no jitter, no-traffic or edge intervals)",
                );
            }
            f.ignore(
                &mut ctx.r,
                k,
                "scheduling of Envoy's checks (see the health_checks line)",
            );
        }
        for k in [
            "event_log_path",
            "always_log_health_check_failures",
            "event_logger",
        ] {
            f.ignore(&mut ctx.r, k, "logging of Envoy's checks");
        }
        f.finish(&mut ctx.r);
        diffs.dedup();
        s.set("health", Value::Table(t));
        ctx.r
            .different(loc, "cluster.health_checks", diffs.join("; "));
    }
}

/// An access log: `[server.access_log]` (veloxy's line formats).
pub fn access_log(ctx: &mut Ctx, loc: &Loc, d: &str) {
    if ctx.cfg.server.get("access_log").is_some() {
        ctx.r.different(
            loc,
            d,
            "veloxy writes one access log for every listener (the first one named)",
        );
        return;
    }
    let mut t = Table::new();
    t.insert("path".into(), "stdout".into());
    t.insert("format".into(), "json".into());
    ctx.cfg.server.set("access_log", Value::Table(t));
    ctx.cfg.server.add_from(loc);
    ctx.r.different(
        loc,
        d,
        "veloxy writes its own JSON lines to stdout, not Envoy's format or path",
    );
}
