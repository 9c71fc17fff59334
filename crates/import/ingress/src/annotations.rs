//! The annotations of one Ingress (`nginx.ingress.kubernetes.io/*`) read into [`Ann`], one
//! report line each: what ingress-nginx does with them, as veloxy route, group and listener
//! settings. Groups of annotations are read together (the CORS, auth, affinity and canary
//! families), so each key's line says what became of it in context.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Loc, Outcome};

use crate::objects::Object;
use crate::util;
use crate::Ctx;

/// The annotation prefix ingress-nginx reads.
pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// The upstream protocol (`backend-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Proto {
    /// HTTP/1.1 (the default).
    #[default]
    Http,
    /// HTTPS (HTTP/1.1 over TLS).
    Https,
    /// gRPC over cleartext HTTP/2.
    Grpc,
    /// gRPC over TLS.
    Grpcs,
}

/// Canary settings of an Ingress marked `canary: "true"`.
#[derive(Debug, Clone, Default)]
pub struct Canary {
    /// `canary-by-header`.
    pub header: Option<String>,
    /// `canary-by-header-value`.
    pub header_value: Option<String>,
    /// `canary-weight` out of `canary-weight-total`.
    pub weight: u32,
    /// `canary-weight-total` (default 100).
    pub total: u32,
}

/// What one Ingress's annotations ask for.
#[derive(Debug, Clone, Default)]
pub struct Ann {
    /// `use-regex`.
    pub use_regex: bool,
    /// `rewrite-target`, as written.
    pub rewrite: Option<String>,
    /// `ssl-redirect`.
    pub ssl_redirect: Option<bool>,
    /// `force-ssl-redirect`.
    pub force_ssl_redirect: bool,
    /// `backend-protocol`.
    pub proto: Proto,
    /// `proxy-body-size` (`Some(None)`: no limit).
    pub body_size: Option<Option<String>>,
    /// `proxy-connect-timeout`, `proxy-read-timeout`, `proxy-send-timeout`.
    pub timeouts: [Option<String>; 3],
    /// `proxy-next-upstream-tries`.
    pub tries: Option<u32>,
    /// Route rule keys (cors, basic_auth, forward_auth, mirror, allow, deny, rate_limit).
    pub rules: toml::Table,
    /// Request fields set (`upstream-vhost`, `x-forwarded-prefix` with a rewrite).
    pub request_set: BTreeMap<String, String>,
    /// Request fields removed (Authorization after basic auth).
    pub request_remove: Vec<String>,
    /// `affinity: cookie` as a group's `sticky`.
    pub sticky: Option<Value>,
    /// `load-balance` / `upstream-hash-by`: (policy, hash_key).
    pub policy: Option<(String, Option<String>)>,
    /// `app-root`.
    pub app_root: Option<String>,
    /// `permanent-redirect` / `temporal-redirect`: target template and status.
    pub redirect: Option<(String, u16)>,
    /// `from-to-www-redirect`.
    pub from_to_www: bool,
    /// `x-forwarded-prefix`.
    pub x_forwarded_prefix: Option<String>,
    /// `canary: "true"` and its settings.
    pub canary: Option<Canary>,
    /// `ssl-passthrough`.
    pub ssl_passthrough: bool,
    /// `server-alias`.
    pub aliases: Vec<String>,
    /// `cert-manager.io/*` annotations (the certificates come from an ACME issuer).
    pub cert_manager: Vec<(Loc, String)>,
    /// `kubernetes.io/ingress.class`.
    pub legacy_class: Option<(Loc, String)>,
}

/// The annotations of an Ingress, each reported once.
pub(crate) struct Keys {
    pub(crate) items: Vec<(String, Loc, String, bool)>,
}

impl Keys {
    /// The value of `name` (not yet reported).
    pub(crate) fn get(&self, name: &str) -> Option<(Loc, String)> {
        self.items
            .iter()
            .find(|(n, _, _, done)| n == name && !done)
            .map(|(_, l, v, _)| (l.clone(), v.clone()))
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub(crate) fn bool(&self, name: &str) -> Option<bool> {
        self.get(name).and_then(|(_, v)| match v.trim() {
            "true" | "True" | "TRUE" => Some(true),
            "false" | "False" | "FALSE" => Some(false),
            _ => None,
        })
    }
}

/// Reports `name` (when present) with `outcome`.
pub(crate) fn say(ctx: &mut Ctx, keys: &mut Keys, name: &str, outcome: Outcome) {
    if let Some(item) = keys.items.iter_mut().find(|i| i.0 == name && !i.3) {
        item.3 = true;
        let directive = format!("{PREFIX}{name}");
        ctx.report.add(&item.1, directive, outcome);
    }
}

pub(crate) fn ok(ctx: &mut Ctx, keys: &mut Keys, name: &str) {
    say(ctx, keys, name, Outcome::Translated);
}

pub(crate) fn diff(ctx: &mut Ctx, keys: &mut Keys, name: &str, why: impl Into<String>) {
    say(ctx, keys, name, Outcome::Different(why.into()));
}

pub(crate) fn refuse(ctx: &mut Ctx, keys: &mut Keys, name: &str, why: impl Into<String>) {
    say(ctx, keys, name, Outcome::Refused(why.into()));
}

pub(crate) fn ignore(ctx: &mut Ctx, keys: &mut Keys, name: &str, why: impl Into<String>) {
    say(ctx, keys, name, Outcome::Ignored(why.into()));
}

pub(crate) fn bad(ctx: &mut Ctx, keys: &mut Keys, name: &str) {
    let v = keys.get(name).map(|(_, v)| v).unwrap_or_default();
    refuse(
        ctx,
        keys,
        name,
        format!("{v:?} is not a value ingress-nginx accepts (it would ignore the annotation)"),
    );
}

/// Annotations that change nothing a client or backend sees, with why.
const NO_EFFECT: &[(&str, &str)] = &[
    ("enable-access-log", "logging"),
    ("enable-rewrite-log", "logging"),
    ("enable-opentelemetry", "tracing"),
    ("opentelemetry-trust-incoming-span", "tracing"),
    (
        "proxy-buffering",
        "response buffering (veloxy streams answers through fixed buffers)",
    ),
    ("proxy-buffer-size", "response buffering"),
    ("proxy-buffers-number", "response buffering"),
    ("proxy-busy-buffers-size", "response buffering"),
    ("proxy-max-temp-file-size", "response buffering"),
    ("proxy-request-buffering", "request buffering"),
    ("client-body-buffer-size", "request buffering"),
    (
        "http2-push-preload",
        "HTTP/2 server push, which browsers no longer accept",
    ),
    (
        "service-upstream",
        "veloxy sends to the Service's address already (its DNS name or --service)",
    ),
    (
        "proxy-http-version",
        "veloxy speaks HTTP/1.1 to HTTP backends",
    ),
];

/// Snippet annotations: raw nginx configuration.
const SNIPPETS: &[&str] = &[
    "configuration-snippet",
    "server-snippet",
    "auth-snippet",
    "stream-snippet",
    "modsecurity-snippet",
];

/// Reads the annotations of `ing`.
pub fn read(ctx: &mut Ctx, ing: &Object) -> Ann {
    let mut ann = Ann::default();
    let mut keys = Keys { items: Vec::new() };
    for (k, v) in ing.annotations() {
        let value = v.scalar().unwrap_or_default();
        if let Some(name) = k.name.strip_prefix(PREFIX) {
            keys.items
                .push((name.to_string(), k.loc.clone(), value, false));
        } else if k.name == "kubernetes.io/ingress.class" {
            ann.legacy_class = Some((k.loc.clone(), value));
        } else if k.name.starts_with("cert-manager.io/") || k.name == "kubernetes.io/tls-acme" {
            ann.cert_manager.push((k.loc.clone(), k.name.clone()));
        } else {
            let owner = k.name.split('/').next().unwrap_or_default();
            ctx.report.ignored(
                &k.loc,
                &k.name,
                format!("an annotation of {owner}, not read by ingress-nginx"),
            );
        }
    }
    for name in SNIPPETS {
        let why = if ctx.g.snippets_allowed {
            "raw nginx configuration: veloxy cannot run nginx directives"
        } else {
            "raw nginx configuration: veloxy cannot run nginx directives (ingress-nginx itself \
             drops it unless the ConfigMap sets allow-snippet-annotations: \"true\")"
        };
        refuse(ctx, &mut keys, name, why);
    }
    paths(ctx, &mut keys, &mut ann);
    proxy(ctx, &mut keys, &mut ann);
    crate::families::cors(ctx, &mut keys, &mut ann);
    crate::auth::basic(ctx, ing, &mut keys_api(&mut keys), &mut ann);
    crate::auth::external(ctx, ing, &mut keys_api(&mut keys), &mut ann);
    crate::auth::client_certs(ctx, &mut keys_api(&mut keys));
    crate::mirror::mirror(ctx, ing, &mut keys_api(&mut keys), &mut ann);
    crate::families::access(ctx, &mut keys, &mut ann);
    crate::families::affinity(ctx, &mut keys, &mut ann);
    crate::families::redirects(ctx, &mut keys, &mut ann);
    crate::families::canary(ctx, &mut keys, &mut ann);
    refuse(
        ctx,
        &mut keys,
        "custom-http-errors",
        "ingress-nginx sends these statuses to its default backend's error pages, which the \
         input does not describe (veloxy's error_pages take files)",
    );
    for (name, why) in NO_EFFECT {
        ignore(ctx, &mut keys, name, *why);
    }
    for i in 0..keys.items.len() {
        if !keys.items[i].3 {
            let name = keys.items[i].0.clone();
            refuse(
                ctx,
                &mut keys,
                &name,
                "this ingress-nginx annotation has no veloxy translation",
            );
        }
    }
    ann
}

/// The report helpers as a value the auth module can use.
pub struct KeysApi<'k>(&'k mut Keys);

fn keys_api(k: &mut Keys) -> KeysApi<'_> {
    KeysApi(k)
}

impl KeysApi<'_> {
    /// The value of an annotation not yet reported.
    pub fn get(&self, name: &str) -> Option<(Loc, String)> {
        self.0.get(name)
    }
    /// Reports `name` translated.
    pub fn ok(&mut self, ctx: &mut Ctx, name: &str) {
        ok(ctx, self.0, name)
    }
    /// Reports `name` translated with a difference.
    pub fn diff(&mut self, ctx: &mut Ctx, name: &str, why: impl Into<String>) {
        diff(ctx, self.0, name, why)
    }
    /// Reports `name` refused.
    pub fn refuse(&mut self, ctx: &mut Ctx, name: &str, why: impl Into<String>) {
        refuse(ctx, self.0, name, why)
    }
    /// Reports `name` ignored.
    pub fn ignore(&mut self, ctx: &mut Ctx, name: &str, why: impl Into<String>) {
        ignore(ctx, self.0, name, why)
    }
    /// Reports `name` refused, and each of `family` (the keys that mean something only with
    /// it) ignored as part of it.
    pub fn refuse_family(
        &mut self,
        ctx: &mut Ctx,
        name: &str,
        family: &[&str],
        why: impl Into<String>,
    ) {
        self.refuse(ctx, name, why);
        self.ignore_family(ctx, name, family);
    }
    /// Reports each of `family` ignored as part of the refused `name`.
    pub fn ignore_family(&mut self, ctx: &mut Ctx, name: &str, family: &[&str]) {
        for n in family {
            self.ignore(ctx, n, format!("part of the refused {name}"));
        }
    }
}

/// use-regex, rewrite-target, x-forwarded-prefix, server-alias, ssl-passthrough, redirects to
/// HTTPS.
fn paths(ctx: &mut Ctx, keys: &mut Keys, ann: &mut Ann) {
    match keys.bool("use-regex") {
        Some(b) => {
            ann.use_regex = b;
            ok(ctx, keys, "use-regex");
        }
        None => bad(ctx, keys, "use-regex"),
    }
    if let Some((_, t)) = keys.get("rewrite-target") {
        match util::nginx_template(&t) {
            Ok(_) => {
                ann.rewrite = Some(t);
                diff(
                    ctx,
                    keys,
                    "rewrite-target",
                    "the upstream path is made from the route's case-insensitive regex \
                     (ingress-nginx's rewrite \"(?i)PATH\"); veloxy matches it against the \
                     normalized path, nginx against the decoded $uri",
                );
            }
            Err(e) => refuse(
                ctx,
                keys,
                "rewrite-target",
                format!("{e} has no veloxy template"),
            ),
        }
    }
    if let Some((_, p)) = keys.get("x-forwarded-prefix") {
        if keys.has("rewrite-target") || ann.rewrite.is_some() {
            ann.x_forwarded_prefix = Some(p);
            ok(ctx, keys, "x-forwarded-prefix");
        } else {
            ignore(
                ctx,
                keys,
                "x-forwarded-prefix",
                "ingress-nginx sends X-Forwarded-Prefix only with a rewrite-target",
            );
        }
    }
    if let Some((_, v)) = keys.get("server-alias") {
        let aliases = util::list(&v);
        let bad: Vec<String> = aliases
            .iter()
            .filter(|a| !util::dns_name(a))
            .map(|a| util::not_dns(a))
            .collect();
        if bad.is_empty() {
            ann.aliases = aliases;
            ok(ctx, keys, "server-alias");
        } else {
            refuse(ctx, keys, "server-alias", bad.join(", "));
        }
    }
    match keys.bool("ssl-passthrough") {
        Some(b) => {
            ann.ssl_passthrough = b;
            diff(
                ctx,
                keys,
                "ssl-passthrough",
                "TLS connections naming these hosts are relayed to the backend of the `/` \
                 path untouched (ingress-nginx needs --enable-ssl-passthrough for this; \
                 veloxy always does it); plain HTTP to them is routed as usual",
            );
        }
        None => bad(ctx, keys, "ssl-passthrough"),
    }
    match keys.bool("ssl-redirect") {
        Some(b) => {
            ann.ssl_redirect = Some(b);
            ok(ctx, keys, "ssl-redirect");
        }
        None => bad(ctx, keys, "ssl-redirect"),
    }
    match keys.bool("force-ssl-redirect") {
        Some(b) => {
            ann.force_ssl_redirect = b;
            ok(ctx, keys, "force-ssl-redirect");
        }
        None => bad(ctx, keys, "force-ssl-redirect"),
    }
    match keys.bool("preserve-trailing-slash") {
        Some(_) => ok(ctx, keys, "preserve-trailing-slash"),
        None => bad(ctx, keys, "preserve-trailing-slash"),
    }
}

/// backend-protocol, proxy-body-size, the timeouts, retries, upstream-vhost, load-balance,
/// upstream-hash-by.
fn proxy(ctx: &mut Ctx, keys: &mut Keys, ann: &mut Ann) {
    if let Some((_, p)) = keys.get("backend-protocol") {
        let verify = "veloxy verifies the backend's certificate (system roots; set the group's \
                      ca_file for a private CA), ingress-nginx does not by default \
                      (proxy-ssl-verify: off)";
        match p.trim().to_ascii_uppercase().as_str() {
            "HTTP" => ok(ctx, keys, "backend-protocol"),
            "HTTPS" => {
                ann.proto = Proto::Https;
                diff(ctx, keys, "backend-protocol", verify);
            }
            "GRPC" => {
                ann.proto = Proto::Grpc;
                ok(ctx, keys, "backend-protocol");
            }
            "GRPCS" => {
                ann.proto = Proto::Grpcs;
                diff(ctx, keys, "backend-protocol", verify);
            }
            "AUTO_HTTP" | "FCGI" | "AJP" => refuse(
                ctx,
                keys,
                "backend-protocol",
                format!("veloxy has no {p} upstream protocol (HTTP, HTTPS, h2c and h2 only)"),
            ),
            _ => bad(ctx, keys, "backend-protocol"),
        }
    }
    if let Some((_, v)) = keys.get("proxy-body-size") {
        match util::nginx_size(&v) {
            Some(s) => {
                ann.body_size = Some(s);
                ok(ctx, keys, "proxy-body-size");
            }
            None => bad(ctx, keys, "proxy-body-size"),
        }
    }
    for (i, name) in [
        "proxy-connect-timeout",
        "proxy-read-timeout",
        "proxy-send-timeout",
    ]
    .iter()
    .enumerate()
    {
        if let Some((_, v)) = keys.get(name) {
            match util::seconds(&v) {
                Some(s) => {
                    ann.timeouts[i] = Some(s);
                    ok(ctx, keys, name);
                }
                None => bad(ctx, keys, name),
            }
        }
    }
    if let Some((_, v)) = keys.get("proxy-next-upstream-tries") {
        match v.trim().parse::<u32>() {
            Ok(n) if n >= 1 => {
                ann.tries = Some(n);
                ok(ctx, keys, "proxy-next-upstream-tries");
            }
            _ => bad(ctx, keys, "proxy-next-upstream-tries"),
        }
    }
    if let Some((_, v)) = keys.get("upstream-vhost") {
        ann.request_set.insert("Host".into(), v);
        ok(ctx, keys, "upstream-vhost");
    }
    if let Some((_, v)) = keys.get("load-balance") {
        match v.trim() {
            "round_robin" => {
                ann.policy = Some(("round_robin".into(), None));
                ok(ctx, keys, "load-balance");
            }
            "ewma" => {
                ann.policy = Some(("p2c_ewma".into(), None));
                diff(
                    ctx,
                    keys,
                    "load-balance",
                    "veloxy's p2c_ewma picks the lower of two random backends by latency x \
                     in-flight requests; ingress-nginx's ewma scores every backend",
                );
            }
            _ => bad(ctx, keys, "load-balance"),
        }
    }
    if let Some((_, v)) = keys.get("upstream-hash-by") {
        let key = match v.trim() {
            "$remote_addr" | "$binary_remote_addr" => Some(("client_ip".to_string(), None)),
            "$uri" => Some(("path".to_string(), None)),
            "$request_uri" => Some((
                "path".to_string(),
                Some("veloxy hashes the path without the query ($request_uri has it)"),
            )),
            s if s.starts_with("$http_") && !s[1..].contains('$') => {
                Some((format!("header:{}", util::header_name(&s[6..])), None))
            }
            s if s.starts_with("$cookie_") && !s[1..].contains('$') => {
                Some((format!("cookie:{}", &s[8..]), None))
            }
            _ => None,
        };
        match key {
            Some((k, why)) => {
                ann.policy = Some(("consistent_hash".into(), Some(k)));
                match why {
                    Some(w) => diff(ctx, keys, "upstream-hash-by", w),
                    None => diff(
                        ctx,
                        keys,
                        "upstream-hash-by",
                        "veloxy's consistent hash (Maglev) maps keys to other backends than \
                         ingress-nginx's chash; each key still keeps its backend",
                    ),
                }
            }
            None => refuse(
                ctx,
                keys,
                "upstream-hash-by",
                format!(
                    "{v:?}: veloxy hashes one of the client address, the path, a header or a \
                     cookie"
                ),
            ),
        }
    }
}
