//! Route policies: CORS, retries and the hash key.

use toml::{Table, Value};
use veloxy_import::tree::Node;
use veloxy_import::Loc;

use super::cluster::Variant;
use super::Ctx;
use crate::util::{seq, string_match};

/// A `CorsPolicy` as veloxy's `cors`; `None` when no origin can be listed.
pub fn cors_policy(ctx: &mut Ctx, loc: &Loc, d: &str, p: &Node) -> Option<Table> {
    let mut origins = Vec::new();
    let mut bad = Vec::new();
    for m in seq(p.get("allow_origin_string_match").unwrap_or(p)) {
        match string_match(m) {
            Ok(o) => origins.push(Value::from(o)),
            Err(_)
                if m.get("safe_regex")
                    .and_then(|r| r.get("regex"))
                    .and_then(|r| r.scalar())
                    .as_deref()
                    == Some(".*") =>
            {
                origins.push("*".into())
            }
            Err(e) => bad.push(e),
        }
    }
    if !bad.is_empty() || origins.is_empty() {
        ctx.r.refused(
            loc,
            d,
            format!(
                "origins by {}: veloxy lists exact origins (or *)",
                if bad.is_empty() {
                    "no exact match".to_string()
                } else {
                    bad.join(", ")
                }
            ),
        );
        return None;
    }
    let list = |k: &str| -> Option<Value> {
        let s = p.get(k)?.scalar()?;
        Some(Value::Array(
            s.split(',')
                .map(|x| x.trim())
                .filter(|x| !x.is_empty())
                .map(Value::from)
                .collect(),
        ))
    };
    let mut t = Table::new();
    let any = origins.iter().any(|o| o.as_str() == Some("*"));
    t.insert("origins".into(), Value::Array(origins));
    for (k, key) in [
        ("allow_methods", "methods"),
        ("allow_headers", "headers"),
        ("expose_headers", "expose_headers"),
    ] {
        if let Some(v) = list(k) {
            t.insert(key.into(), v);
        }
    }
    let creds = p.get("allow_credentials").and_then(|b| b.as_bool()) == Some(true);
    if creds {
        t.insert("credentials".into(), true.into());
    }
    if let Some(secs) = p.get("max_age").and_then(|m| m.as_i64()) {
        t.insert(
            "max_age".into(),
            crate::util::dur(secs as u64 * 1000).into(),
        );
    }
    let mut diffs = vec!["veloxy answers preflights 204 (Envoy 200)"];
    if any {
        diffs.push("with origins = [\"*\"] veloxy answers Access-Control-Allow-Origin: * where Envoy echoes the origin");
    }
    if creds && any {
        diffs.push("veloxy refuses credentials with any origin, so credentials are left off");
        t.remove("credentials");
    }
    ctx.r.different(loc, d, diffs.join("; "));
    Some(t)
}

/// `retry_policy` -> the group's retries and statuses.
pub fn retry_policy(ctx: &mut Ctx, loc: &Loc, p: &Node, v: &mut Variant) {
    let n = p.get("num_retries").and_then(|n| n.as_i64()).unwrap_or(1);
    v.retries = n.clamp(0, 10) as u32;
    let on = p
        .get("retry_on")
        .and_then(|r| r.scalar())
        .unwrap_or_default();
    let mut codes: Vec<u16> = Vec::new();
    let mut other = Vec::new();
    for c in on.split(',').map(str::trim) {
        match c {
            "5xx" => codes.extend([500, 501, 502, 503, 504]),
            "gateway-error" => codes.extend([502, 503, 504]),
            "retriable-4xx" => codes.push(409),
            "retriable-status-codes" => codes.extend(
                seq(p.get("retriable_status_codes").unwrap_or(p))
                    .iter()
                    .filter_map(|c| c.as_i64())
                    .map(|c| c as u16),
            ),
            "connect-failure" | "reset" | "refused-stream" | "reset-before-request" | "" => {}
            o => other.push(o.to_string()),
        }
    }
    codes.sort_unstable();
    codes.dedup();
    v.retry_on = codes;
    let mut diffs = vec![
        "veloxy retries only idempotent requests whose body it holds, and counts retries per \
         upstream group; Envoy retries any request"
            .to_string(),
    ];
    if on.contains("5xx") {
        diffs.push("statuses above 504 are not retried".into());
    }
    if !other.is_empty() {
        diffs.push(format!("{} not retried on", other.join(", ")));
    }
    if p.get("per_try_timeout").is_some() {
        diffs.push("per_try_timeout has no equivalent (read_timeout bounds each wait)".into());
    }
    ctx.r.different(loc, "route.retry_policy", diffs.join("; "));
}

/// `hash_policy` -> the group's hash key.
pub fn hash_policy(ctx: &mut Ctx, loc: &Loc, p: &Node, v: &mut Variant) {
    let first = seq(p).first();
    let key = first.and_then(|h| {
        if let Some(hd) = h.get("header") {
            return Some(format!("header:{}", hd.get("header_name")?.scalar()?));
        }
        if let Some(c) = h.get("cookie") {
            if c.get("ttl").is_some() {
                return None;
            }
            return Some(format!("cookie:{}", c.get("name")?.scalar()?));
        }
        if h.get("connection_properties").is_some() {
            return Some("client_ip".into());
        }
        None
    });
    match key {
        Some(k) => {
            v.hash_key = Some(k);
            if seq(p).len() > 1 {
                ctx.r.different(
                    loc,
                    "route.hash_policy",
                    "veloxy hashes on the first key only",
                );
            } else {
                ctx.r.translated(loc, "route.hash_policy");
            }
        }
        None => ctx.r.refused(
            loc,
            "route.hash_policy",
            "a hash on a query parameter, filter state or a generated cookie: veloxy hashes on \
             the client address, the path, a header or an existing cookie",
        ),
    }
}
