//! A route's `route` action (`RouteAction`): the cluster, path and host rewrites, timeout,
//! retries and hash policy.

use toml::Value;
use veloxy_import::tree::Node;
use veloxy_import::Loc;

use super::cluster::Variant;
use super::order::PathKind;
use super::route::{self, rest_capture, Cors, RouteOut};
use super::Ctx;
use crate::util::{seq, Fields};

/// Translates a `RouteAction` into `out`; a second route when a regex rewrite applies to part
/// of a prefix route's paths (the prefix route stays for the others).
pub fn action(
    ctx: &mut Ctx,
    _loc: &Loc,
    a: &Node,
    out: &mut RouteOut,
    websocket: bool,
) -> Option<RouteOut> {
    let mut f = Fields::new(a, "route");
    let mut variant = Variant {
        timeout_ms: Some(15_000),
        ..Default::default()
    };
    let cluster = cluster(ctx, &mut f);
    let mut timeout_set = false;
    if let Some((l, t)) = f.take("timeout") {
        if let Some(t) = route::timeout(t) {
            variant.timeout_ms = t;
        }
        timeout_set = true;
        let what = if variant.timeout_ms.is_none() {
            "0s turns Envoy's timeout off; veloxy's read_timeout is 1d, and bounds each wait \
             for the backend"
        } else {
            "Envoy's timeout bounds the whole answer, veloxy's read_timeout each wait between \
             reads from the backend (streamed answers differ)"
        };
        ctx.r.different(l, "route.timeout", what);
    }
    if let Some((l, p)) = f.take("retry_policy") {
        route::retry_policy(ctx, l, p, &mut variant);
    }
    if let Some((l, p)) = f.take("hash_policy") {
        route::hash_policy(ctx, l, p, &mut variant);
    }
    let extra = rewrites(ctx, &mut f, out);
    hosts(ctx, &mut f, out, cluster.as_ref().map(|c| c.1.as_str()));
    if let Some((l, u)) = f.take("upgrade_configs") {
        let on = seq(u).iter().any(|x| {
            x.get("upgrade_type").and_then(|t| t.scalar()).as_deref() == Some("websocket")
                && x.get("enabled").and_then(|e| e.as_bool()) != Some(false)
        });
        if on || !websocket {
            ctx.r.different(
                l,
                "route.upgrade_configs",
                "veloxy forwards WebSocket upgrades on every route",
            );
        } else {
            ctx.r.translated(l, "route.upgrade_configs");
        }
    }
    if let Some((l, c)) = f.take("cors") {
        out.cors = Some(Cors::Policy(route::cors_policy(ctx, l, "route.cors", c)));
    }
    f.ignore(
        &mut ctx.r,
        "idle_timeout",
        "veloxy bounds idle streams by read_timeout and body_timeout",
    );
    f.ignore(
        &mut ctx.r,
        "max_stream_duration",
        "veloxy bounds waits, not a stream's whole length",
    );
    f.ignore(&mut ctx.r, "priority", "Envoy's connection pool priority");
    f.ignore(
        &mut ctx.r,
        "cluster_not_found_response_code",
        "every cluster a route names exists in a static file",
    );
    f.ignore(
        &mut ctx.r,
        "include_vh_rate_limits",
        "global rate limit descriptors",
    );
    if let Some((l, _)) = f.take("append_x_forwarded_host") {
        ctx.r.translated(l, "route.append_x_forwarded_host");
    }
    for k in ["max_grpc_timeout", "grpc_timeout_offset"] {
        f.refuse(
            &mut ctx.r,
            k,
            "bounding the route by the client's grpc-timeout: veloxy does not read it",
        );
    }
    let mirrors = f.take("request_mirror_policies");
    f.refuse(
        &mut ctx.r,
        "rate_limits",
        "descriptors for a global rate limit service: veloxy limits locally (rate_limit)",
    );
    f.refuse(
        &mut ctx.r,
        "internal_redirect_policy",
        "following the backend's redirects inside the proxy: veloxy returns them",
    );
    f.refuse(
        &mut ctx.r,
        "hedge_policy",
        "hedged requests: veloxy lacks them",
    );
    f.finish(&mut ctx.r);
    let (cloc, name) = cluster?;
    let Some(group) = ctx.group(&name, variant.clone()) else {
        ctx.r.refused(
            &cloc,
            "route.cluster",
            format!("cluster {name} is not defined or has no endpoint veloxy can use"),
        );
        return None;
    };
    if timeout_set {
        ctx.r.translated(&cloc, "route.cluster");
    } else {
        ctx.r.different(
            &cloc,
            "route.cluster",
            "Envoy's default 15 s route timeout bounds the whole answer; veloxy's read_timeout \
             = 15s bounds each wait between reads (streamed answers differ)",
        );
    }
    out.target
        .insert(0, ("upstream".into(), Value::from(group.clone())));
    let mirror = mirrors.and_then(|(l, p)| mirror_policies(ctx, l, p));
    if let Some(m) = &mirror {
        out.target.push(("mirror".into(), m.clone()));
    }
    extra.map(|mut e| {
        e.target.insert(0, ("upstream".into(), Value::from(group)));
        if let Some(m) = mirror {
            e.target.push(("mirror".into(), m));
        }
        e
    })
}

/// `request_mirror_policies` as the route's `mirror`: each policy's cluster a plain HTTP/1.1
/// group, its `runtime_fraction`'s default the share copied (the runtime key is not read).
fn mirror_policies(ctx: &mut Ctx, l: &Loc, p: &Node) -> Option<Value> {
    let key = "route.request_mirror_policies";
    let mut tables = Vec::new();
    for m in seq(p) {
        let name = m
            .get("cluster")
            .and_then(|c| c.scalar())
            .unwrap_or_default();
        let h2 = ctx
            .cluster(&name)
            .is_some_and(|c| c.section.get("protocol").is_some());
        let group = match ctx.plain_group(&name) {
            Some(g) if !h2 => g,
            _ => {
                let why = format!(
                    "cluster {name:?} is not defined, has no endpoint veloxy can use, or                      speaks HTTP/2 (veloxy's copies are HTTP/1.1), or the policy names none"
                );
                ctx.r.refused(l, key, why);
                return None;
            }
        };
        let percent = match m
            .get("runtime_fraction")
            .and_then(|r| r.get("default_value"))
        {
            None => 100.0,
            Some(d) => {
                let n = d.get("numerator").and_then(|n| n.as_i64()).unwrap_or(0) as f64;
                let of = match d.get("denominator").and_then(|d| d.scalar()).as_deref() {
                    Some("TEN_THOUSAND") => 10_000.0,
                    Some("MILLION") => 1_000_000.0,
                    _ => 100.0,
                };
                (n * 100.0 / of).clamp(0.0, 100.0)
            }
        };
        let mut t = toml::Table::new();
        t.insert("upstream".into(), group.into());
        t.insert("percent".into(), percent.into());
        tables.push(Value::Table(t));
    }
    ctx.r.different(
        l,
        key,
        "the copies carry the client's Host (Envoy appends -shadow), a body of at most 64 KiB \
         (a larger one is not copied), and go on a new connection each; runtime keys and \
         trace_sampled are not read",
    );
    (!tables.is_empty()).then_some(Value::Array(tables))
}

/// `cluster`, or `weighted_clusters` with one cluster taking every request.
fn cluster(ctx: &mut Ctx, f: &mut Fields) -> Option<(Loc, String)> {
    if let Some((l, c)) = f.take("cluster") {
        return Some((l.clone(), c.scalar().unwrap_or_default()));
    }
    if let Some((l, w)) = f.take("weighted_clusters") {
        let list = seq(w.get("clusters").unwrap_or(w));
        let live: Vec<&Node> = list
            .iter()
            .filter(|c| c.get("weight").and_then(|w| w.as_i64()).unwrap_or(0) > 0)
            .collect();
        if let [one] = live.as_slice() {
            let name = one.get("name").and_then(|n| n.scalar()).unwrap_or_default();
            return Some((l.clone(), name));
        }
        ctx.r.refused(
            l,
            "route.weighted_clusters",
            "a weighted split between clusters: veloxy sends a route to one group (merge the \
             clusters into one group with server weights)",
        );
        return None;
    }
    f.refuse(
        &mut ctx.r,
        "cluster_header",
        "a cluster named by a request field: veloxy routes to a fixed group",
    );
    f.refuse(
        &mut ctx.r,
        "cluster_specifier_plugin",
        "a cluster picked by a plugin: veloxy routes to a fixed group",
    );
    None
}

/// `prefix_rewrite` and `regex_rewrite`.
fn rewrites(ctx: &mut Ctx, f: &mut Fields, out: &mut RouteOut) -> Option<RouteOut> {
    if let Some((l, p)) = f.take("prefix_rewrite") {
        let r = p.scalar().unwrap_or_default();
        match &out.m.path {
            PathKind::Prefix(_) if r == "/" => {
                out.target.push(("strip_prefix".into(), true.into()));
                ctx.r.translated(l, "route.prefix_rewrite");
            }
            PathKind::Exact(_) => {
                let t = r.replace('{', "{{").replace('}', "}}");
                out.target.push(("rewrite".into(), t.into()));
                ctx.r.translated(l, "route.prefix_rewrite");
            }
            PathKind::Prefix(_) => {
                let t = rest_capture(out, &r).unwrap_or_default();
                out.target.push(("rewrite".into(), t.into()));
                ctx.r.translated(l, "route.prefix_rewrite");
            }
            PathKind::Regex(_) => ctx.r.refused(
                l,
                "route.prefix_rewrite",
                "a prefix rewrite on a regex route (Envoy requires a prefix or path match)",
            ),
        }
    }
    let (l, rr) = f.take("regex_rewrite")?;
    let pattern = rr
        .get("pattern")
        .and_then(|p| p.get("regex"))
        .and_then(|p| p.scalar())
        .unwrap_or_default();
    let sub = substitution(
        &rr.get("substitution")
            .and_then(|s| s.scalar())
            .unwrap_or_default(),
    );
    let full = pattern.starts_with('^') && pattern.ends_with('$');
    let with_rest = |p: &str| {
        if p.ends_with('$') {
            (p.to_string(), sub.clone())
        } else {
            (format!("(?:{p})(?<rest>.*)$"), format!("{sub}{{re.rest}}"))
        }
    };
    match out.m.path.clone() {
        PathKind::Regex(re) if re == pattern => {
            let (re, t) = with_rest(&pattern);
            set_regex(out, &re);
            out.target.push(("rewrite".into(), t.into()));
            ctx.r.translated(l, "route.regex_rewrite");
            None
        }
        PathKind::Prefix(p)
            if pattern.starts_with('^')
                && pattern.starts_with(&format!("^{}", regex::escape(&p)).replace("\\/", "/")) =>
        {
            // The regex route rewrites the paths the pattern matches; the prefix route (kept
            // as the fallback) forwards the others unchanged, as Envoy does.
            let mut fallback = RouteOut {
                matching: out.matching.clone(),
                target: out.target.clone(),
                mutations: out.mutations.clone(),
                cors: out.cors.clone(),
                authz_off: out.authz_off,
                rate_limit: out.rate_limit.clone(),
                m: out.m.clone(),
                loc: out.loc.clone(),
                proxied: true,
            };
            fallback.m.entry = usize::MAX;
            let (re, t) = with_rest(&pattern);
            set_regex(out, &re);
            out.target.push(("rewrite".into(), t.into()));
            ctx.r.translated(l, "route.regex_rewrite");
            let _ = full;
            Some(fallback)
        }
        _ => {
            ctx.r.refused(
                l,
                "route.regex_rewrite",
                "a pattern that is not the route's own regex (or an anchored pattern under its \
                 prefix): veloxy rewrites with the captures of the route's path_regex",
            );
            None
        }
    }
}

fn set_regex(out: &mut RouteOut, re: &str) {
    out.m.path = PathKind::Regex(re.to_string());
    out.matching
        .retain(|(k, _)| !matches!(k.as_str(), "path" | "path_exact" | "path_regex"));
    out.matching.insert(0, ("path_regex".into(), re.into()));
}

/// An RE2 substitution (`\1`) as a veloxy template (`{re.1}`).
fn substitution(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.peek() {
                Some(d) if d.is_ascii_digit() => {
                    out.push_str(&format!("{{re.{d}}}"));
                    chars.next();
                }
                Some(_) => out.push(chars.next().unwrap_or('\\')),
                None => out.push('\\'),
            },
            '{' => out.push_str("{{"),
            '}' => out.push_str("}}"),
            c => out.push(c),
        }
    }
    out
}

/// `host_rewrite_literal`, `auto_host_rewrite` and the ones veloxy lacks.
fn hosts(ctx: &mut Ctx, f: &mut Fields, out: &mut RouteOut, cluster: Option<&str>) {
    if let Some((l, h)) = f.take("host_rewrite_literal") {
        route::host_rewrite(out, h.scalar().unwrap_or_default());
        ctx.r.translated(l, "route.host_rewrite_literal");
    }
    if let Some((l, on)) = f.take("auto_host_rewrite") {
        let dns = cluster
            .and_then(|c| ctx.cluster(c))
            .and_then(|c| c.dns_host.clone());
        match (on.as_bool(), dns) {
            (Some(false), _) => ctx.r.translated(l, "route.auto_host_rewrite"),
            (_, Some(h)) => {
                route::host_rewrite(out, h);
                ctx.r.translated(l, "route.auto_host_rewrite");
            }
            (_, None) => ctx.r.ignored(
                l,
                "route.auto_host_rewrite",
                "the cluster's endpoints have no DNS name, so Envoy keeps the client's Host too",
            ),
        }
    }
    for k in ["host_rewrite_header", "host_rewrite_path_regex"] {
        f.refuse(
            &mut ctx.r,
            k,
            "a Host taken from a request field or the path: set Host in request_headers with \
             a template instead",
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn substitutions() {
        assert_eq!(super::substitution("/v2/\\1/x"), "/v2/{re.1}/x");
    }
}
