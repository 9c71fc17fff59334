//! The `headers` middleware, field by field: custom request and response fields (`""`
//! removes), CORS (`accessControl*`), and the security fields (STS, frame options, nosniff,
//! XSS, CSP, referrer and permissions policies). Each field gets its own report line.

use std::collections::BTreeMap;

use veloxy_import::tree::Node;

use crate::input::Named;
use crate::node::{entries, flag, list};
use crate::route::{Action, Route};
use crate::translate::Ctx;

/// What a field did: differences, a refusal, or why it changes nothing.
#[derive(Default)]
struct Outcome {
    notes: Vec<String>,
    refused: Option<String>,
    ignored: Option<String>,
}

/// The middleware's effects, gathered field by field.
#[derive(Default)]
struct State {
    cors: toml::Table,
    cors_loc: Option<veloxy_import::Loc>,
    resp: BTreeMap<String, String>,
    sts: Option<(i64, bool, bool)>,
}

/// Applies the `headers` middleware `mw` (its config `cfg`) to `routes`.
pub fn apply(ctx: &mut Ctx, mw: &Named, cfg: &Node, routes: &mut Vec<Route>) {
    let base = format!("http.middlewares.{}.headers", mw.name);
    let mut st = State::default();
    let tls_only = routes.iter().all(|r| {
        r.listeners
            .iter()
            .all(|l| ctx.eps.iter().any(|e| &e.listener == l && e.tls))
    });
    for (k, v) in entries(cfg) {
        let key = format!("{base}.{}", k.name);
        let name = k.name.to_ascii_lowercase();
        let mut out = Outcome::default();
        match name.as_str() {
            "customrequestheaders" => {
                for (h, val) in entries(v) {
                    let val = val.scalar().unwrap_or_default();
                    for r in routes.iter_mut() {
                        r.req(&h.name, &template_text(&val));
                    }
                }
            }
            "customresponseheaders" => {
                for (h, val) in entries(v) {
                    let val = template_text(&val.scalar().unwrap_or_default());
                    st.resp.insert(h.name.clone(), val);
                }
            }
            "sslredirect" | "ssltemporaryredirect" => {
                if v.as_bool() == Some(true) {
                    let status = if name == "sslredirect" { 301 } else { 302 };
                    ssl_redirect(ctx, routes, status);
                    out.notes.push("Traefik v2 only (removed in v3); requests other than GET get the same status".into());
                }
            }
            "allowedhosts" => {
                let allowed: Vec<String> = list(v)
                    .into_iter()
                    .map(|(s, _)| s.to_ascii_lowercase())
                    .collect();
                let covered = routes.iter().all(|r| {
                    !r.m.hosts.is_empty() && r.m.hosts.iter().all(|h| allowed.contains(h))
                });
                if covered {
                    out.ignored = Some("every host of its routers is allowed".into());
                } else {
                    out.refused = Some("veloxy answers every host a route matches; Traefik answers 500 to hosts outside allowedHosts".into());
                }
            }
            _ => {
                if name.starts_with("accesscontrol") || name == "addvaryheader" {
                    cors_field(&name, &k.loc, v, &mut st, &mut out);
                } else {
                    security_field(&name, v, cfg, tls_only, &mut st, &mut out);
                }
            }
        }
        let line = ctx.lines.at(&key, &k.loc, &key);
        for n in out.notes {
            line.note(n);
        }
        if let Some(r) = out.refused {
            line.refuse(r);
        }
        if line.ignored.is_none() {
            line.ignored = out.ignored;
        }
    }
    if let Some((secs, sub, preload)) = st.sts {
        let mut v = format!("max-age={secs}");
        if sub {
            v.push_str("; includeSubDomains");
        }
        if preload {
            v.push_str("; preload");
        }
        st.resp.insert("Strict-Transport-Security".into(), v);
    }
    for r in routes.iter_mut() {
        for (k, v) in &st.resp {
            r.resp(k, v);
        }
    }
    if !st.cors.is_empty() {
        let loc = st.cors_loc.clone().unwrap_or_else(|| mw.loc.clone());
        finish_cors(ctx, &base, loc, st.cors, routes);
    }
}

/// `accessControl*` and `addVaryHeader`.
fn cors_field(name: &str, loc: &veloxy_import::Loc, v: &Node, st: &mut State, out: &mut Outcome) {
    let cors = &mut st.cors;
    match name {
        "accesscontrolalloworiginlist" | "accesscontrolalloworigin" => {
            let o: Vec<toml::Value> = list(v).into_iter().map(|(s, _)| s.into()).collect();
            cors.insert("origins".into(), toml::Value::Array(o));
            st.cors_loc.get_or_insert(loc.clone());
        }
        "accesscontrolalloworiginlistregex" => {
            out.refused = Some("veloxy's CORS origins are exact".into())
        }
        "accesscontrolallowmethods" => {
            cors.insert("methods".into(), strs(v));
        }
        "accesscontrolallowheaders" => {
            cors.insert("headers".into(), strs(v));
        }
        "accesscontrolexposeheaders" => {
            cors.insert("expose_headers".into(), strs(v));
        }
        "accesscontrolallowcredentials" => {
            cors.insert("credentials".into(), v.as_bool().unwrap_or(false).into());
        }
        "accesscontrolmaxage" => {
            let secs = v.as_i64().unwrap_or(0);
            cors.insert("max_age".into(), format!("{secs}s").into());
        }
        "addvaryheader" => {
            if v.as_bool() == Some(false) {
                out.notes
                    .push("veloxy always adds Vary: Origin to CORS answers".into());
            }
        }
        _ => out.refused = Some("unknown headers option".into()),
    }
}

/// The security fields (STS, frame options, nosniff, XSS, CSP, policies) and the rest.
fn security_field(
    name: &str,
    v: &Node,
    cfg: &Node,
    tls_only: bool,
    st: &mut State,
    out: &mut Outcome,
) {
    let text = v.scalar().unwrap_or_default();
    let on = v.as_bool() == Some(true);
    let resp = &mut st.resp;
    let field = match name {
        "stsseconds" => {
            st.sts = Some((
                v.as_i64().unwrap_or(0),
                flag(cfg, "stsIncludeSubdomains").unwrap_or(false),
                flag(cfg, "stsPreload").unwrap_or(false),
            ));
            if !tls_only && !flag(cfg, "forceSTSHeader").unwrap_or(false) {
                out.notes.push("Traefik sends Strict-Transport-Security on HTTPS answers only; veloxy on every answer of the route, plain ones too".into());
            }
            None
        }
        "stsincludesubdomains" | "stspreload" | "forcestsheader" => None,
        "framedeny" if on && !resp.contains_key("X-Frame-Options") => {
            Some(("X-Frame-Options", "DENY".to_string()))
        }
        "customframeoptionsvalue" => Some(("X-Frame-Options", text)),
        "contenttypenosniff" if on => Some(("X-Content-Type-Options", "nosniff".to_string())),
        "browserxssfilter" if on && !resp.contains_key("X-XSS-Protection") => {
            Some(("X-XSS-Protection", "1; mode=block".to_string()))
        }
        "framedeny" | "contenttypenosniff" | "browserxssfilter" => None,
        "custombrowserxssvalue" => Some(("X-XSS-Protection", text)),
        "contentsecuritypolicy" => Some(("Content-Security-Policy", text)),
        "contentsecuritypolicyreportonly" => Some(("Content-Security-Policy-Report-Only", text)),
        "referrerpolicy" => Some(("Referrer-Policy", text)),
        "permissionspolicy" => Some(("Permissions-Policy", text)),
        "featurepolicy" => Some(("Feature-Policy", text)),
        "publickey" => Some(("Public-Key-Pins", text)),
        "isdevelopment" => {
            out.ignored = Some("it only relaxes allowedHosts and the SSL checks".into());
            None
        }
        "hostsproxyheaders" => {
            out.ignored = Some("used with allowedHosts only".into());
            None
        }
        "sslhost" | "sslforcehost" | "sslproxyheaders" => {
            if flag(cfg, "sslRedirect") == Some(true)
                || flag(cfg, "sslTemporaryRedirect") == Some(true)
            {
                out.refused =
                    Some("an sslRedirect option (Traefik v2) veloxy does not have".into());
            } else {
                out.ignored = Some("used by sslRedirect only, which is not set".into());
            }
            None
        }
        _ => {
            out.refused = Some("unknown headers option".into());
            None
        }
    };
    if let Some((k, v)) = field {
        resp.insert(k.to_string(), v);
    }
}

fn finish_cors(
    ctx: &mut Ctx,
    base: &str,
    loc: veloxy_import::Loc,
    mut cors: toml::Table,
    routes: &mut [Route],
) {
    let key = format!("{base}.accessControlAllowOriginList");
    let line = ctx.lines.at(&key, &loc, &key);
    if !cors.contains_key("origins") {
        line.refuse("CORS fields without accessControlAllowOriginList");
        return;
    }
    if !cors.contains_key("methods") {
        // Traefik sends no Access-Control-Allow-Methods then: browsers allow the simple ones.
        cors.insert(
            "methods".into(),
            toml::Value::Array(vec!["GET".into(), "HEAD".into(), "POST".into()]),
        );
    }
    if !cors.contains_key("max_age") {
        cors.insert("max_age".into(), "0s".into());
    }
    let star = cors["origins"]
        .as_array()
        .is_some_and(|a| a.iter().any(|o| o.as_str() == Some("*")));
    if star && cors.get("credentials").and_then(|c| c.as_bool()) == Some(true) {
        line.refuse("origin * with credentials: veloxy refuses that combination (browsers do too)");
        return;
    }
    line.note("veloxy answers preflights itself with 204 (Traefik: 200) and does not pass them to the service");
    for r in routes.iter_mut() {
        r.set("cors", toml::Value::Table(cors.clone()));
    }
}

/// v2's `sslRedirect`: plain-listener routes redirect to HTTPS.
fn ssl_redirect(ctx: &Ctx, routes: &mut Vec<Route>, status: u16) {
    let mut out = Vec::new();
    for r in routes.drain(..) {
        let (tls, plain): (Vec<String>, Vec<String>) = r
            .listeners
            .iter()
            .cloned()
            .partition(|l| ctx.eps.iter().any(|e| &e.listener == l && e.tls));
        if !plain.is_empty() {
            let mut red = r.clone();
            red.listeners = plain;
            red.action = Action::Redirect("https://{host}{uri}".into(), status);
            out.push(red);
        }
        if !tls.is_empty() {
            let mut keep = r;
            keep.listeners = tls;
            out.push(keep);
        }
    }
    *routes = out;
}

fn strs(v: &Node) -> toml::Value {
    toml::Value::Array(list(v).into_iter().map(|(s, _)| s.into()).collect())
}

/// A fixed header value as template text (braces doubled).
fn template_text(s: &str) -> String {
    s.replace('{', "{{").replace('}', "}}")
}
