//! The annotation families read together: CORS, access lists and rate limits, affinity,
//! redirects and canaries.

use toml::Value;

use crate::annotations::{bad, diff, ignore, ok, refuse, Ann, Canary, Keys};
use crate::util::{self, table};
use crate::Ctx;

/// enable-cors and cors-*: ingress-nginx's defaults when a key is absent.
pub(crate) fn cors(ctx: &mut Ctx, keys: &mut Keys, ann: &mut Ann) {
    const FAMILY: &[&str] = &[
        "cors-allow-origin",
        "cors-allow-methods",
        "cors-allow-headers",
        "cors-allow-credentials",
        "cors-expose-headers",
        "cors-max-age",
    ];
    if keys.bool("enable-cors") != Some(true) {
        if keys.has("enable-cors") {
            ok(ctx, keys, "enable-cors");
        }
        for name in FAMILY {
            ignore(
                ctx,
                keys,
                name,
                "enable-cors is not \"true\": ingress-nginx ignores it",
            );
        }
        return;
    }
    let get = |n: &str| keys.get(n).map(|(_, v)| v);
    let mut origins: Vec<String> = get("cors-allow-origin")
        .map(|v| util::list(&v))
        .unwrap_or_else(|| vec!["*".into()]);
    if origins.iter().any(|o| o == "*") {
        origins = vec!["*".into()];
    }
    let methods = util::list(
        &get("cors-allow-methods")
            .unwrap_or_else(|| "GET, PUT, POST, DELETE, PATCH, OPTIONS".into()),
    );
    let headers = util::list(&get("cors-allow-headers").unwrap_or_else(|| {
        "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,\
         Content-Type,Range,Authorization"
            .into()
    }));
    let expose = util::list(&get("cors-expose-headers").unwrap_or_default());
    let mut credentials = keys.bool("cors-allow-credentials").unwrap_or(true);
    let max_age = get("cors-max-age")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1_728_000);
    let mut notes = vec![
        "veloxy answers a preflight (OPTIONS with Origin and Access-Control-Request-Method) \
         itself with 204 only for an allowed origin and adds Allow-Methods, Allow-Headers and \
         Max-Age to preflights only; ingress-nginx answers every OPTIONS request of an \
         allowed origin with 204 and adds them to every answer"
            .to_string(),
    ];
    if origins == ["*"] && credentials {
        credentials = false;
        notes.push(
            "with origin \"*\", ingress-nginx also sends Access-Control-Allow-Credentials: \
             true, a combination browsers refuse for credentialed requests; veloxy sends no \
             Allow-Credentials (the same outcome in a browser)"
                .into(),
        );
    }
    if origins.iter().any(|o| o.contains('*') && o != "*") {
        refuse(
            ctx,
            keys,
            "enable-cors",
            "wildcard origins (https://*.example.com): veloxy's cors lists exact origins",
        );
        for name in FAMILY {
            ignore(ctx, keys, name, "part of the refused enable-cors");
        }
        return;
    }
    let mut c = toml::Table::new();
    c.insert("origins".into(), util::strings(&origins));
    c.insert("methods".into(), util::strings(&methods));
    c.insert("headers".into(), util::strings(&headers));
    if !expose.is_empty() {
        c.insert("expose_headers".into(), util::strings(&expose));
    }
    c.insert("credentials".into(), credentials.into());
    c.insert("max_age".into(), format!("{max_age}s").into());
    ann.rules.insert("cors".into(), Value::Table(c));
    diff(ctx, keys, "enable-cors", notes.join("; "));
    for name in FAMILY {
        ok(ctx, keys, name);
    }
}

/// Allow/deny lists and rate limits.
pub(crate) fn access(ctx: &mut Ctx, keys: &mut Keys, ann: &mut Ann) {
    for (name, key) in [
        ("whitelist-source-range", "allow"),
        ("allowlist-source-range", "allow"),
        ("denylist-source-range", "deny"),
    ] {
        if let Some((_, v)) = keys.get(name) {
            ann.rules.insert(key.into(), util::strings(&util::list(&v)));
            ok(ctx, keys, name);
        }
    }
    let mult = match keys.get("limit-burst-multiplier") {
        Some((_, v)) => match v.trim().parse::<u32>() {
            Ok(m) => {
                ok(ctx, keys, "limit-burst-multiplier");
                m
            }
            Err(_) => {
                bad(ctx, keys, "limit-burst-multiplier");
                5
            }
        },
        None => 5,
    };
    let status = "over the limit veloxy answers 429 with Retry-After, ingress-nginx 503 \
                  (limit-req-status-code)";
    for (name, unit) in [("limit-rps", "s"), ("limit-rpm", "m")] {
        let Some((_, v)) = keys.get(name) else {
            continue;
        };
        let Ok(n) = v.trim().parse::<u32>() else {
            bad(ctx, keys, name);
            continue;
        };
        if ann.rules.contains_key("rate_limit") {
            refuse(
                ctx,
                keys,
                name,
                "veloxy takes one rate limit per route (limit-rps is translated)",
            );
            continue;
        }
        // nginx's limit_req burst=B nodelay lets B + 1 requests through at once.
        ann.rules.insert(
            "rate_limit".into(),
            table([
                ("rate", format!("{n}/{unit}").into()),
                ("burst", i64::from(n * mult + 1).into()),
            ]),
        );
        diff(ctx, keys, name, status);
    }
    if keys.has("limit-connections") {
        refuse(
            ctx,
            keys,
            "limit-connections",
            "veloxy has no per-client limit of concurrent connections (max_concurrency bounds \
             the route's total)",
        );
    }
    for name in ["limit-whitelist", "limit-allowlist"] {
        if keys.has(name) {
            refuse(
                ctx,
                keys,
                name,
                "veloxy's rate_limit cannot exempt client addresses",
            );
        }
    }
    for name in ["limit-rate", "limit-rate-after"] {
        if keys.has(name) {
            refuse(
                ctx,
                keys,
                name,
                "veloxy does not throttle response bandwidth",
            );
        }
    }
}

/// affinity and session-cookie-*.
pub(crate) fn affinity(ctx: &mut Ctx, keys: &mut Keys, ann: &mut Ann) {
    const FAMILY: &[&str] = &[
        "session-cookie-name",
        "session-cookie-max-age",
        "session-cookie-expires",
        "session-cookie-path",
        "session-cookie-secure",
        "session-cookie-samesite",
        "session-cookie-conditional-samesite-none",
        "session-cookie-domain",
        "session-cookie-change-on-failure",
        "affinity-mode",
        "affinity-canary-behavior",
    ];
    match keys.get("affinity").map(|(_, v)| v) {
        Some(v) if v.trim() == "cookie" => {}
        Some(_) => {
            bad(ctx, keys, "affinity");
            return;
        }
        None => {
            for name in FAMILY {
                ignore(
                    ctx,
                    keys,
                    name,
                    "no affinity: cookie, ingress-nginx ignores it",
                );
            }
            return;
        }
    }
    let mut s = toml::Table::new();
    let name = keys
        .get("session-cookie-name")
        .map(|(_, v)| v)
        .unwrap_or_else(|| "INGRESSCOOKIE".into());
    s.insert("cookie".into(), name.into());
    let ttl = keys
        .get("session-cookie-max-age")
        .or_else(|| keys.get("session-cookie-expires"))
        .and_then(|(_, v)| v.trim().parse::<u64>().ok());
    s.insert("ttl".into(), format!("{}s", ttl.unwrap_or(0)).into());
    if let Some(b) = keys.bool("session-cookie-secure") {
        s.insert("secure".into(), b.into());
    }
    ann.sticky = Some(Value::Table(s));
    diff(
        ctx,
        keys,
        "affinity",
        "the cookie holds veloxy's own token of the backend (ingress-nginx: a hash of the \
         endpoint), Path=/ (ingress-nginx: the location's path) and Secure only when \
         session-cookie-secure says so (ingress-nginx: also on HTTPS requests); with the \
         Service's DNS name as the only server, kube-proxy picks the pod and the affinity \
         holds only if --service maps the Service to its pods' addresses",
    );
    for n in [
        "session-cookie-name",
        "session-cookie-max-age",
        "session-cookie-expires",
        "session-cookie-secure",
    ] {
        ok(ctx, keys, n);
    }
    ignore(
        ctx,
        keys,
        "affinity-mode",
        "veloxy keeps a client on its backend while that backend is up (as \"persistent\"); \
         \"balanced\" only differs when backends are added",
    );
    for n in [
        "session-cookie-path",
        "session-cookie-samesite",
        "session-cookie-conditional-samesite-none",
        "session-cookie-domain",
    ] {
        refuse(
            ctx,
            keys,
            n,
            "veloxy's sticky cookie has no Path, SameSite or Domain setting",
        );
    }
    ignore(
        ctx,
        keys,
        "session-cookie-change-on-failure",
        "veloxy always moves a client whose backend is down to a new one (and resets the cookie)",
    );
    ignore(
        ctx,
        keys,
        "affinity-canary-behavior",
        "canary groups are separate in veloxy",
    );
}

/// app-root, permanent-redirect, temporal-redirect, from-to-www-redirect.
pub(crate) fn redirects(ctx: &mut Ctx, keys: &mut Keys, ann: &mut Ann) {
    if let Some((_, v)) = keys.get("app-root") {
        if v.starts_with('/') && !v.contains('$') {
            ann.app_root = Some(v);
            ok(ctx, keys, "app-root");
        } else {
            bad(ctx, keys, "app-root");
        }
    }
    for (name, code_name, default) in [
        ("permanent-redirect", "permanent-redirect-code", 301u16),
        ("temporal-redirect", "temporal-redirect-code", 302),
    ] {
        let Some((_, to)) = keys.get(name) else {
            ignore(
                ctx,
                keys,
                code_name,
                format!("no {name}: ingress-nginx ignores it"),
            );
            continue;
        };
        let code = keys
            .get(code_name)
            .and_then(|(_, c)| c.trim().parse::<u16>().ok())
            .filter(|c| [301, 302, 303, 307, 308].contains(c))
            .unwrap_or(default);
        if ann.redirect.is_some() {
            ignore(
                ctx,
                keys,
                name,
                "permanent-redirect takes precedence in ingress-nginx",
            );
            ignore(ctx, keys, code_name, "part of the ignored redirect");
            continue;
        }
        match util::nginx_template(&to) {
            Ok(t) => {
                ann.redirect = Some((t, code));
                ok(ctx, keys, name);
                ok(ctx, keys, code_name);
            }
            Err(e) => refuse(ctx, keys, name, format!("{e} has no veloxy template")),
        }
    }
    match keys.bool("from-to-www-redirect") {
        Some(b) => {
            ann.from_to_www = b;
            diff(
                ctx,
                keys,
                "from-to-www-redirect",
                "ingress-nginx drops a trailing '/' from the redirect's URI; veloxy keeps it",
            );
        }
        None => bad(ctx, keys, "from-to-www-redirect"),
    }
}

/// canary and canary-*.
pub(crate) fn canary(ctx: &mut Ctx, keys: &mut Keys, ann: &mut Ann) {
    const FAMILY: &[&str] = &[
        "canary-by-header",
        "canary-by-header-value",
        "canary-by-header-pattern",
        "canary-by-cookie",
        "canary-weight",
        "canary-weight-total",
    ];
    if keys.bool("canary") != Some(true) {
        if keys.has("canary") {
            ok(ctx, keys, "canary");
        }
        for n in FAMILY {
            ignore(
                ctx,
                keys,
                n,
                "canary is not \"true\": ingress-nginx ignores it",
            );
        }
        return;
    }
    let mut c = Canary {
        total: 100,
        ..Default::default()
    };
    ok(ctx, keys, "canary");
    if let Some((_, h)) = keys.get("canary-by-header") {
        c.header = Some(h.trim().to_string());
        ok(ctx, keys, "canary-by-header");
        if let Some((_, v)) = keys.get("canary-by-header-value") {
            c.header_value = Some(v);
            ok(ctx, keys, "canary-by-header-value");
        }
    }
    for n in ["canary-by-header-pattern", "canary-by-cookie"] {
        refuse(
            ctx,
            keys,
            n,
            "veloxy's route conditions compare a header's whole value (no regex, no single \
             cookie)",
        );
    }
    if let Some((_, t)) = keys.get("canary-weight-total") {
        match t.trim().parse::<u32>() {
            Ok(t) if t > 0 => {
                c.total = t;
                ok(ctx, keys, "canary-weight-total");
            }
            _ => bad(ctx, keys, "canary-weight-total"),
        }
    }
    if let Some((_, w)) = keys.get("canary-weight") {
        match w.trim().parse::<u32>() {
            Ok(w) if w <= c.total => {
                c.weight = w;
                if w == 0 || w == c.total {
                    ok(ctx, keys, "canary-weight");
                } else {
                    diff(
                        ctx,
                        keys,
                        "canary-weight",
                        "the main and canary Services share one weighted group: smooth \
                         weighted round robin sends exactly WEIGHT of every TOTAL requests \
                         to the canary, where ingress-nginx draws each request at random",
                    );
                }
            }
            _ => bad(ctx, keys, "canary-weight"),
        }
    }
    ann.canary = Some(c);
}
