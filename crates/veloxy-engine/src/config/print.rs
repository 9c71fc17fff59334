//! `veloxy check --print`: a compiled [`Snapshot`] written back as TOML that veloxy accepts.
//!
//! The text is normalized: every key that has a default is written with its value (so the
//! output shows what veloxy actually runs with), sections come in a fixed order (server,
//! listeners, routes, upstream groups), durations use their shortest exact unit (`"1m"`, not
//! `"60s"`), and paths are absolute. Compiling the output again and printing it gives the same
//! text (pinned by the `config_print` golden tests).
//!
//! Written from the compiled values, not from the file, so it shows what was understood. A
//! few keys are left out on purpose, where writing a value would change the meaning:
//! `host` of a route that matches any host, `listener` of a route on every listener, `admin`
//! and `access_log` when off, `ca_file` of a group using the system's roots, `tls_server_name`
//! when each server's own host is used, `hash_key` when nothing is hashed (writing it turns
//! hashing on for custom policies), and health `path`/`host` when not set.
//!
//! Nothing secret is printed: the config holds no secrets today, only paths to key files.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::{
    HashKey, ListenerSpec, RequestBuffering, Settings, Snapshot, UpstreamGroup, UpstreamProtocol,
};
use crate::access_log::Format;
use crate::limits::{RateKey, RouteLimits};
use crate::router::RouteTarget;
use crate::router::{HostMatch, Route};
use crate::static_files::StaticRoute;
use crate::upstream::group::DiscoveryName;
use crate::upstream::health::{HealthCheck, Outlier};

/// Renders `snapshot` as a config file.
pub fn render(snapshot: &Snapshot) -> String {
    let mut out = Toml::default();
    out.comment("The compiled configuration, every default filled in (veloxy check --print).");
    settings(&mut out, &snapshot.settings);
    for l in &snapshot.listeners {
        listener(&mut out, l);
    }
    routes(&mut out, snapshot);
    caches(&mut out, snapshot);
    for l in &snapshot.listeners {
        if let Some(u) = l.stream {
            out.table("[[streams]]");
            out.str("listener", &l.name);
            out.str("upstream", &snapshot.upstreams[u].name);
        }
        // One entry per name (entries with several names print as several).
        for (host, u) in &l.sni_streams {
            let name = match host {
                HostMatch::Exact(h) => h.clone(),
                HostMatch::Suffix(s) => format!("*{s}"),
                HostMatch::Any => continue,
            };
            out.table("[[streams]]");
            out.str("listener", &l.name);
            out.raw("sni", &str_list(&[name]));
            out.str("upstream", &snapshot.upstreams[*u].name);
        }
    }
    for u in &snapshot.upstreams {
        upstream(&mut out, u);
    }
    if let Some(k) = &snapshot.settings.kubernetes {
        kubernetes(&mut out, k);
    }
    out.text
}

/// `[providers.kubernetes]`.
fn kubernetes(out: &mut Toml, k: &crate::config::KubernetesSpec) {
    use crate::config::StatusAddress;
    out.table("[providers.kubernetes]");
    if let Some(p) = &k.kubeconfig {
        out.str("kubeconfig", &p.display().to_string());
    }
    out.raw("namespaces", &str_list(&k.namespaces));
    out.str("ingress_class", &k.ingress_class);
    out.bool("ingress_nginx", k.ingress_nginx);
    if let Some(g) = &k.gateway_class {
        out.str("gateway_class", g);
    }
    out.str("http_listener", &k.http_listener);
    if let Some(l) = &k.https_listener {
        out.str("https_listener", l);
    }
    match &k.status {
        Some(StatusAddress::Ip(ip)) => out.str("status_address", &ip.to_string()),
        Some(StatusAddress::Hostname(h)) => out.str("status_address", h),
        Some(StatusAddress::Service { namespace, name }) => {
            out.str("publish_service", &format!("{namespace}/{name}"))
        }
        None => {}
    }
    if !k.gateway_addresses.is_empty() {
        let list: Vec<String> = k.gateway_addresses.iter().map(|a| a.to_string()).collect();
        out.raw("gateway_addresses", &str_list(&list));
    }
    if let Some((namespace, name)) = &k.lease {
        out.str("lease", &format!("{namespace}/{name}"));
    }
    out.str(
        "lease_duration",
        &format!("{}s", k.lease_duration.as_secs()),
    );
}

fn settings(out: &mut Toml, s: &Settings) {
    out.table("[server]");
    out.int("workers", s.workers);
    out.duration("header_timeout", s.header_timeout);
    out.duration("keepalive_timeout", s.keepalive_timeout);
    out.duration("park_idle_after", s.park_idle_after);
    out.int("max_header_bytes", s.max_header_bytes);
    out.int("max_uri_bytes", s.max_uri_bytes);
    out.bool("underscores_in_headers", s.underscores_in_headers);
    out.duration("shutdown_timeout", s.shutdown_timeout);
    out.duration("send_timeout", s.send_timeout);
    out.duration("body_timeout", s.body_timeout);
    let buffering = match s.request_buffering {
        RequestBuffering::Auto => "auto",
        RequestBuffering::Off => "off",
    };
    out.str("request_buffering", buffering);
    if let Some(id) = &s.request_id {
        out.str("request_id", id);
    }
    if let Some(r) = &s.real_ip {
        out.raw("trusted_proxies", &str_list(&r.trusted.entries()));
        out.str("client_ip_header", &r.header);
    }
    out.str("log_level", &s.log_level);
    if let Some(admin) = s.admin {
        out.str("admin", &admin.to_string());
    }
    if !s.resolvers.is_empty() {
        let list: Vec<String> = s.resolvers.iter().map(|r| r.to_string()).collect();
        out.raw("resolvers", &str_list(&list));
    }
    if let Some(a) = &s.access_log {
        out.table("[server.access_log]");
        match &a.path {
            // The access log is opened from the current directory (not the config file's),
            // so that is where a relative path is made absolute.
            Some(p) => out.path(
                "path",
                &std::path::absolute(p).unwrap_or_else(|_| p.clone()),
            ),
            None => out.str("path", "stdout"),
        }
        let format = match a.format {
            Format::Combined => "combined",
            Format::Json => "json",
        };
        out.str("format", format);
        out.int("buffer", a.buffer);
    }
    if let Some(r) = &s.redis {
        out.table("[server.redis]");
        out.str("url", &crate::fleet::redis::redacted(&r.url));
        out.duration("timeout", r.timeout);
        out.int("pool", r.pool);
        if let Some(c) = &r.ca_file {
            out.path("ca_file", c);
        }
    }
    if let Some(t) = &s.tracing {
        out.table("[server.tracing]");
        out.str("otlp_endpoint", &t.otlp_endpoint);
        out.str("service_name", &t.service_name);
        out.raw("sample_ratio", &format!("{:?}", t.sample_ratio));
        out.bool("parent_based", t.parent_based);
        out.bool("trust_incoming", t.trust_incoming);
        out.raw("propagate", &str_list(&t.propagate));
        if !t.resource.is_empty() {
            out.raw("resource", &table(&t.resource));
        }
    }
    if let Some(a) = &s.acme {
        out.table("[server.acme]");
        if let Some(e) = &a.email {
            out.str("email", e);
        }
        out.str("directory", &a.directory);
        if a.redis.is_some() {
            out.str("storage", "redis");
        } else {
            out.path("storage", &a.storage);
        }
        if let Some(c) = &a.ca_file {
            out.path("ca_file", c);
        }
        if let Some(c) = a.challenge {
            out.str("challenge", c.as_str());
        }
        out.duration("renew_before", a.renew_before);
        if let Some(dns) = dns_table(&a.dns) {
            out.raw("dns", &dns);
            out.duration("propagation_timeout", a.propagation_timeout);
        }
    }
}

/// `[server.acme] dns` (or a listener's) as an inline table; `None` without DNS-01.
fn dns_table(dns: &crate::acme::DnsProvider) -> Option<String> {
    match dns {
        crate::acme::DnsProvider::None => None,
        crate::acme::DnsProvider::Command(c) => Some(format!("{{ command = {} }}", str_list(c))),
        crate::acme::DnsProvider::Rfc2136(r) => Some(format!(
            "{{ rfc2136 = {{ server = {}, zone = {}, key_name = {}, key_file = {}, algorithm = {} }} }}",
            string(&r.server.to_string()),
            string(&r.zone),
            string(&r.key_name),
            string(&r.key_file.to_string_lossy()),
            string(r.algorithm.name()),
        )),
    }
}

/// A listener's `tls.acme`: the names it stood for (`acme = true` written as them), and, when
/// the listener proves them its own way, as a table with its challenge and provider.
fn listener_acme(out: &mut Toml, l: &ListenerSpec) {
    let Some(own) = &l.acme_settings else {
        out.raw("acme", &str_list(&l.acme));
        return;
    };
    let mut table = format!("{{ names = {}", str_list(&l.acme));
    if let Some(c) = own.challenge {
        table.push_str(&format!(", challenge = {}", string(c.as_str())));
    }
    if let Some(dns) = dns_table(&own.dns) {
        let timeout = string(&duration(own.propagation_timeout));
        table.push_str(&format!(", dns = {dns}, propagation_timeout = {timeout}"));
    }
    table.push_str(" }");
    out.raw("acme", &table);
}

fn listener(out: &mut Toml, l: &ListenerSpec) {
    let name = key(&l.name);
    out.table(&format!("[listeners.{name}]"));
    out.str("addr", &l.addr.to_string());
    out.int("max_connections", l.max_connections);
    out.bool("http2", l.http2);
    out.int("h2_max_concurrent_streams", l.h2_max_concurrent_streams);
    out.duration("upgrade_idle_timeout", l.upgrade_idle_timeout);
    if let Some(port) = l.redirect_https {
        out.bool("redirect_https", true);
        out.int("https_port", port);
    }
    if let Some(mode) = l.plain_http {
        out.str("plain_http", mode.name());
    }
    if l.proxy_protocol {
        out.bool("proxy_protocol", true);
    }
    if l.tcp {
        out.str("protocol", "tcp");
    }
    if let Some(h3) = &l.http3 {
        out.bool("http3", true);
        out.int("h3_max_concurrent_streams", h3.max_streams);
        out.duration("quic_idle_timeout", h3.idle_timeout);
        out.int("quic_max_connections", h3.max_connections);
        if h3.zero_rtt {
            out.bool("quic_0rtt", true);
        }
    }
    if l.tls.is_none() {
        return;
    }
    // Written even when empty (only SNI entries): it says at a glance that this is a TLS
    // listener, and an empty table is valid.
    out.table(&format!("[listeners.{name}.tls]"));
    for f in l.tls_files.iter().filter(|f| f.hosts.is_empty()) {
        out.path("cert", &f.cert);
        out.path("key", &f.key);
    }
    if !l.acme.is_empty() {
        listener_acme(out, l);
    }
    if !l.local_ca.is_empty() {
        out.bool("local_ca", true);
        out.raw("names", &str_list(&l.local_ca));
    }
    for f in l.tls_files.iter().filter(|f| !f.hosts.is_empty()) {
        out.table(&format!("[[listeners.{name}.tls.certs]]"));
        out.raw("hosts", &str_list(&f.hosts));
        out.path("cert", &f.cert);
        out.path("key", &f.key);
    }
}

/// The `[[routes]]` entries in file order. A route without `listener` was compiled into every
/// listener's router, so each route is written once, with `listener` only when it is on one
/// listener of several.
fn routes(out: &mut Toml, snapshot: &Snapshot) {
    // A route listing several hosts or paths was expanded into entries with one file
    // position: each is written as a route of its own.
    let mut by_index: BTreeMap<(usize, String), (&Route, Vec<&str>)> = BTreeMap::new();
    for l in &snapshot.listeners {
        for r in l.router.routes() {
            by_index
                .entry((r.index, format!("{:?} {} {}", r.host, r.path, r.exact)))
                .or_insert((r, Vec::new()))
                .1
                .push(&l.name);
        }
    }
    for (r, on) in by_index.values() {
        out.table("[[routes]]");
        if on.len() < snapshot.listeners.len() {
            out.str("listener", on[0]);
        }
        match &r.host {
            HostMatch::Any => {}
            HostMatch::Exact(h) => out.str("host", h),
            HostMatch::Suffix(s) => out.str("host", &format!("*{s}")),
        }
        let path_key = match (r.exact, &r.regex) {
            (true, _) => "path_exact",
            (false, Some(_)) => "path_regex",
            (false, None) => "path",
        };
        out.str(path_key, &r.path);
        conditions(out, &r.conditions);
        match &r.target {
            RouteTarget::Redirect { to, status } => out.raw(
                "redirect",
                &format!("{{ to = {}, status = {status} }}", string(&to.to_string())),
            ),
            RouteTarget::Respond {
                status,
                body,
                content_type,
            } => out.raw(
                "respond",
                &format!(
                    "{{ status = {status}, body = {}, content_type = {} }}",
                    string(&String::from_utf8_lossy(body)),
                    string(content_type)
                ),
            ),
            RouteTarget::Files(files) => file_route(out, files),
            RouteTarget::Proxy {
                upstream,
                compress,
                target,
            } => {
                out.str("upstream", &snapshot.upstreams[*upstream].name);
                out.bool("compress", *compress);
                match target.as_deref() {
                    Some(crate::template::PathRule::StripPrefix(_)) => {
                        out.bool("strip_prefix", true)
                    }
                    Some(crate::template::PathRule::Rewrite(t)) => {
                        out.str("rewrite", &t.to_string())
                    }
                    None => {}
                }
            }
        }
        limits(out, &r.limits);
        if let Some(rules) = &r.rules {
            route_rules(out, rules);
            if let Some(f) = &rules.forward_auth {
                out.raw(
                    "forward_auth",
                    &format!(
                        "{{ upstream = {}, path = {}, copy_headers = {}, timeout = {}, send_headers = {}, remove_headers = {}, trust_forward_header = {} }}",
                        string(&snapshot.upstreams[f.upstream].name),
                        string(&f.path),
                        str_list(&f.copy_headers),
                        string(&duration(f.timeout)),
                        match &f.send_headers {
                            None => string("all"),
                            Some(p) => str_list(&p.iter().map(|p| p.text()).collect::<Vec<_>>()),
                        },
                        str_list(&f.remove_headers.iter().map(|p| p.text()).collect::<Vec<_>>()),
                        f.trust_forward_header
                    ),
                );
            }
            if let Some(m) = &rules.mirror {
                let tables: Vec<String> = m
                    .iter()
                    .map(|m| {
                        format!(
                            "{{ upstream = {}, percent = {:?}, body = {}{} }}",
                            string(&snapshot.upstreams[m.upstream].name),
                            m.percent,
                            m.body,
                            m.host
                                .as_ref()
                                .map_or(String::new(), |h| format!(", host = {}", string(h)))
                        )
                    })
                    .collect();
                out.raw("mirror", &format!("[{}]", tables.join(", ")));
            }
            if let Some(c) = &rules.cache {
                out.raw("cache", &crate::cache::lookup::describe(c));
            }
            if let Some(s) = &rules.search {
                out.raw("search", &crate::search::describe_route(s));
            }
            if let Some(f) = &rules.fastcgi {
                let params: Vec<String> = f
                    .params
                    .iter()
                    .map(|(k, v)| format!("{} = {}", key(k), string(v)))
                    .collect();
                out.raw(
                    "fastcgi",
                    &format!(
                        "{{ root = {}, index = {}, split_path = {}, params = {{ {} }} }}",
                        string(&f.root.to_string_lossy()),
                        string(&f.index),
                        string(f.split_path_text.as_str()),
                        params.join(", ")
                    ),
                );
                if let Some(t) = &f.try_files {
                    out.raw("try_files", &str_list(&t.entries));
                }
            }
            if rules.early_hints {
                out.bool("early_hints", true);
            }
            match rules.tracing {
                Some(crate::rules::RouteTracing::Off) => out.bool("tracing", false),
                Some(crate::rules::RouteTracing::Ratio(r)) => {
                    out.raw("tracing", &format!("{{ sample_ratio = {r:?} }}"))
                }
                None => {}
            }
            if let Some(g) = &rules.grpc_web {
                match &g.cors_origins {
                    None => out.bool("grpc_web", true),
                    Some(o) => {
                        out.raw("grpc_web", &format!("{{ cors_origins = {} }}", str_list(o)))
                    }
                }
            }
        }
        // Written when on, or when the route turns its group's default off.
        let rewrites = r.rules.as_ref().is_some_and(|x| x.location_rewrite);
        let group_default = r
            .proxied()
            .is_some_and(|u| snapshot.upstreams[u].location_rewrite);
        if rewrites || group_default {
            out.bool("location_rewrite", rewrites);
        }
    }
}

/// An inline TOML table of string pairs.
fn table(pairs: &[(String, String)]) -> String {
    let items: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{} = {}", string(k), string(v)))
        .collect();
    format!("{{ {} }}", items.join(", "))
}

fn conditions(out: &mut Toml, c: &crate::rules::Conditions) {
    if !c.methods.is_empty() {
        out.raw("methods", &str_list(&c.methods));
    }
    if !c.headers.is_empty() {
        out.raw("headers", &table(&c.headers));
    }
    if !c.query.is_empty() {
        out.raw("query", &table(&c.query));
    }
}

fn route_rules(out: &mut Toml, r: &crate::rules::RouteRules) {
    for (key, rules) in [
        ("request_headers", &r.request),
        ("response_headers", &r.response),
    ] {
        let Some(h) = rules else { continue };
        let mut parts = Vec::new();
        if !h.set.is_empty() {
            parts.push(format!("set = {}", table(&h.set)));
        }
        if !h.add.is_empty() {
            parts.push(format!("add = {}", table(&h.add)));
        }
        if !h.remove.is_empty() {
            parts.push(format!("remove = {}", str_list(&h.remove)));
        }
        out.raw(key, &format!("{{ {} }}", parts.join(", ")));
    }
    if !r.error_pages.is_empty() {
        let pages: Vec<(String, String)> = r
            .error_pages
            .iter()
            .map(|p| (p.status.to_string(), p.file.clone()))
            .collect();
        out.raw("error_pages", &table(&pages));
    }
    if let Some(max) = r.max_body {
        out.int("max_body_bytes", max);
    }
    // The CORS `grpc_web` made is printed as `grpc_web`.
    let made = r.grpc_web.as_ref().is_some_and(|g| g.made_cors);
    if let Some(c) = r.cors.as_ref().filter(|_| !made) {
        let list = |s: &str| -> Vec<String> {
            s.split(", ")
                .filter(|x| !x.is_empty())
                .map(str::to_owned)
                .collect()
        };
        out.raw(
            "cors",
            &format!(
                "{{ origins = {}, methods = {}, headers = {}, expose_headers = {}, credentials = {}, max_age = \"{}s\" }}",
                str_list(&c.origins),
                str_list(&list(&c.methods)),
                str_list(&list(&c.headers)),
                str_list(&list(&c.expose_headers)),
                c.credentials,
                c.max_age
            ),
        );
    }
    if let Some(b) = &r.basic_auth {
        out.raw(
            "basic_auth",
            &format!(
                "{{ realm = {}, users_file = {} }}",
                string(&b.realm),
                string(&b.file)
            ),
        );
    }
    if let Some(a) = &r.access {
        if let Some(allow) = &a.allow {
            out.raw("allow", &str_list(&allow.entries()));
        }
        if !a.deny.entries().is_empty() {
            out.raw("deny", &str_list(&a.deny.entries()));
        }
    }
}

fn file_route(out: &mut Toml, f: &StaticRoute) {
    out.path("root", &f.root);
    out.raw("index", &str_list(&f.index));
    out.raw("try_files", &str_list(&f.try_files));
    if let Some(cc) = &f.cache_control {
        // Checked at load: a non-empty header value from a TOML string, so valid UTF-8.
        out.str("cache_control", &String::from_utf8_lossy(cc));
    }
    out.bool("browse", f.browse);
    out.bool("follow_symlinks", f.follow_symlinks);
    out.bool("allow_hidden", f.allow_hidden);
    out.bool("compress", f.compress);
    out.bool("precompressed", f.precompressed);
    out.int("cache_bytes", f.cache.max_bytes());
}

fn limits(out: &mut Toml, l: &RouteLimits) {
    if let Some(c) = &l.concurrency {
        out.int("max_concurrency", c.max);
        out.int("queue", c.queue);
        out.duration("queue_timeout", c.queue_timeout);
    }
    if let Some(r) = &l.rate {
        let key = match &r.key {
            RateKey::ClientIp => "client_ip".to_owned(),
            RateKey::Route => "route".to_owned(),
            RateKey::Index => "index".to_owned(),
            RateKey::Header(h) => format!("header:{h}"),
        };
        // `burst` is stored as f64 but was compiled from a u32, so the cast is exact.
        let global = l.global.as_ref().map_or(String::new(), |g| {
            use crate::fleet::global_limit::OnStoreError;
            let on = match g.on_error {
                OnStoreError::Local => "local",
                OnStoreError::Allow => "allow",
                OnStoreError::Deny => "deny",
            };
            format!(", scope = \"global\", on_store_error = \"{on}\"")
        });
        let table = format!(
            "{{ rate = {}, burst = {}, key = {}, max_keys = {}{global} }}",
            string(&rate(r.per_second)),
            r.burst as u64,
            string(&key),
            r.max_keys()
        );
        out.raw("rate_limit", &table);
    }
}

fn upstream(out: &mut Toml, u: &UpstreamGroup) {
    let name = key(&u.name);
    out.table(&format!("[upstreams.{name}]"));
    let servers = servers(u);
    out.raw("servers", &servers.list);
    out.str("policy", u.policy.name());
    out.int("keepalive", u.keepalive);
    out.duration("pool_purge_delay", u.pool_purge_delay);
    out.duration("connect_timeout", u.connect_timeout);
    out.duration("read_timeout", u.read_timeout);
    out.duration("write_timeout", u.write_timeout);
    out.duration("idle_timeout", u.idle_timeout);
    out.int("retries", u.retries);
    out.raw("retry_on", &format!("{:?}", u.retry_on));
    // Debug keeps a `.0` on whole numbers, so the value stays a TOML float.
    out.raw("retry_budget", &format!("{:?}", u.retry_budget));
    out.int("retry_body_limit", u.retry_body_limit);
    out.int("max_connections", u.max_connections);
    if u.uses_hash {
        let hash_key = match &u.hash_key {
            HashKey::ClientIp => "client_ip".to_owned(),
            HashKey::Path => "path".to_owned(),
            HashKey::Header(h) => format!("header:{h}"),
            HashKey::Cookie(c) => format!("cookie:{c}"),
        };
        out.str("hash_key", &hash_key);
    }
    let protocol = match u.protocol {
        UpstreamProtocol::Http1 => "http1",
        UpstreamProtocol::H2 => "h2",
        UpstreamProtocol::H2c => "h2c",
        UpstreamProtocol::Fastcgi => "fastcgi",
    };
    out.str("protocol", protocol);
    if u.location_rewrite {
        out.bool("location_rewrite", true);
    }
    if u.proxy_protocol > 0 {
        out.str("proxy_protocol", &format!("v{}", u.proxy_protocol));
    }
    if let Some(s) = &u.search {
        out.raw("search", &crate::search::describe_group(s));
    }
    if let Some(s) = &u.sticky {
        out.raw(
            "sticky",
            &format!(
                "{{ cookie = {}, ttl = {}, secure = {}, http_only = {} }}",
                string(&s.cookie),
                string(&duration(s.ttl)),
                s.secure,
                s.http_only
            ),
        );
    }
    if !u.tls_verify {
        out.raw("tls_verify", "false");
    }
    if let Some(ca) = &u.ca_file {
        out.path("ca_file", ca);
    }
    if let Some(name) = servers.tls_server_name {
        out.str("tls_server_name", &name);
    }
    if let Some(h) = &u.health_check {
        out.table(&format!("[upstreams.{name}.health]"));
        health(out, h);
    }
    out.table(&format!("[upstreams.{name}.outlier]"));
    outlier(out, &u.outlier);
}

/// A group's `servers` value, and the `tls_server_name` its TLS names need.
struct Servers {
    list: String,
    tls_server_name: Option<String>,
}

/// IP literals are written as parsed (normalized); names as written, since they are resolved
/// again on every load and are the default TLS name. Plain strings when every weight is 1.
fn servers(u: &UpstreamGroup) -> Servers {
    let mut tls_server_name = None;
    let entries: Vec<String> = u
        .file_backends
        .iter()
        .map(|b| {
            let hostport = match b.server.parse::<std::net::SocketAddr>() {
                Ok(_) => b.addr.to_string(),
                Err(_) => b.server.clone(),
            };
            if let Some(name) = &b.tls_name {
                // Every server's name is its own host unless `tls_server_name` set one name
                // for all; compared with the host as printed, so printing is a fixed point.
                let name = name.to_str();
                if name != host_of(&hostport) {
                    tls_server_name = Some(name.into_owned());
                }
                format!("https://{hostport}")
            } else {
                hostport
            }
        })
        .collect();
    // A search group's discovery is printed as its `search` key.
    let discovery: Vec<&crate::upstream::group::Discovery> = u
        .discovery
        .iter()
        .filter(|d| !matches!(d.name, DiscoveryName::Search { .. }))
        .collect();
    if let Some(name) = discovery.iter().find_map(|d| d.tls_name.as_ref()) {
        let host = match &discovery[0].name {
            DiscoveryName::Dns { host, .. } => host.clone(),
            DiscoveryName::Srv(name) => name.clone(),
            DiscoveryName::Search { .. } => String::new(),
        };
        if *name != host {
            tls_server_name = Some(name.clone());
        }
    }
    let plain = |b: &crate::config::Backend| b.weight == 1 && !b.backup;
    let backup = |on: bool| if on { ", backup = true" } else { "" };
    let list = if discovery.is_empty() && u.file_backends.iter().all(plain) {
        str_list(&entries)
    } else {
        // One server a line: inline tables make long lines.
        let mut tables: String = entries
            .iter()
            .zip(u.file_backends.iter())
            .map(|(e, b)| {
                format!(
                    "    {{ addr = {}, weight = {}{} }},\n",
                    string(e),
                    b.weight,
                    backup(b.backup)
                )
            })
            .collect();
        for d in &discovery {
            let scheme = if d.tls_name.is_some() { "https://" } else { "" };
            let (key, name) = match &d.name {
                DiscoveryName::Dns { host, port } => ("dns", format!("{scheme}{host}:{port}")),
                DiscoveryName::Srv(name) => ("srv", format!("{scheme}{name}")),
                DiscoveryName::Search { .. } => continue,
            };
            let weight = match d.name {
                DiscoveryName::Dns { .. } => format!(", weight = {}", d.weight),
                DiscoveryName::Srv(_) | DiscoveryName::Search { .. } => String::new(),
            };
            tables.push_str(&format!(
                "    {{ {key} = {}, resolve = {}{weight}{} }},\n",
                string(&name),
                string(&duration(d.every)),
                backup(d.backup)
            ));
        }
        format!("[\n{tables}]")
    };
    Servers {
        list,
        tls_server_name,
    }
}

/// The host part of `host:port` (brackets removed from an IPv6 literal), as the compiler
/// takes it for the default TLS name.
fn host_of(hostport: &str) -> &str {
    let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn health(out: &mut Toml, h: &HealthCheck) {
    if let Some(path) = &h.path {
        out.str("path", path);
    }
    out.duration("interval", h.interval);
    out.duration("timeout", h.timeout);
    out.int("healthy", h.healthy);
    out.int("unhealthy", h.unhealthy);
    let (lo, hi) = (h.expect_status.start(), h.expect_status.end());
    let status = if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    };
    out.str("expect_status", &status);
    if let Some(host) = &h.host {
        out.str("host", host);
    }
}

fn outlier(out: &mut Toml, o: &Outlier) {
    out.int("consecutive_failures", o.consecutive_failures);
    out.duration("base_ejection", o.base_ejection);
    out.duration("max_ejection", o.max_ejection);
    out.int("max_ejected_percent", o.max_ejected_percent);
    out.bool("on_5xx", o.on_5xx);
}

/// TOML text being written: tables separated by a blank line, one `key = value` per line.
#[derive(Default)]
struct Toml {
    text: String,
}

impl Toml {
    fn comment(&mut self, text: &str) {
        let _ = writeln!(self.text, "# {text}");
    }

    fn table(&mut self, header: &str) {
        if !self.text.is_empty() {
            self.text.push('\n');
        }
        self.text.push_str(header);
        self.text.push('\n');
    }

    fn raw(&mut self, key: &str, value: &str) {
        let _ = writeln!(self.text, "{key} = {value}");
    }

    fn str(&mut self, key: &str, value: &str) {
        self.raw(key, &string(value));
    }

    /// For integers (usize, u32, ...), which print as TOML integers.
    fn int(&mut self, key: &str, value: impl std::fmt::Display) {
        self.raw(key, &value.to_string());
    }

    fn bool(&mut self, key: &str, value: bool) {
        self.raw(key, if value { "true" } else { "false" });
    }

    fn duration(&mut self, key: &str, value: Duration) {
        self.str(key, &duration(value));
    }

    /// Paths that are not UTF-8 are written lossily: TOML strings are UTF-8.
    fn path(&mut self, key: &str, value: &Path) {
        self.str(key, &value.to_string_lossy());
    }
}

/// `[caches.NAME]` of every store a route uses, once each, in name order.
fn caches(out: &mut Toml, snapshot: &Snapshot) {
    let mut seen = std::collections::BTreeMap::new();
    for l in &snapshot.listeners {
        for r in l.router.routes() {
            let rules = r.rules.as_ref();
            let stores = rules
                .and_then(|x| x.cache.as_ref())
                .map(|c| (&c.slot, c.max_object))
                .into_iter()
                .chain(
                    rules
                        .and_then(|x| x.search.as_ref()?.query_cache.as_ref())
                        .map(|q| (&q.slot, q.max_object)),
                );
            for (slot, max_object) in stores {
                let Some(spec) = snapshot.live.caches.iter().find(|c| c.store.same(slot)) else {
                    continue;
                };
                let (name, keys) = crate::cache::lookup::describe_store(spec, max_object);
                seen.entry(name).or_insert(keys);
            }
        }
    }
    for (name, keys) in seen {
        out.table(&format!("[caches.{name}]"));
        for (k, v) in keys {
            out.raw(k, &v);
        }
    }
}

/// A TOML basic string, with the escapes it needs.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn str_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| string(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// A listener or upstream name as a table key: names may contain `.`, which a bare key would
/// read as nesting, so those are quoted.
fn key(name: &str) -> String {
    if !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        name.to_owned()
    } else {
        string(name)
    }
}

/// The largest unit that holds the duration exactly: `"1m"`, `"10s"`, `"500ms"`, `"250us"`.
/// Below a microsecond (only reachable with fractions such as `"0.0001ms"`) it is fractional
/// microseconds, which parse back to the same nanoseconds.
fn duration(d: Duration) -> String {
    const UNITS: [(&str, u128); 6] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ];
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in UNITS {
        if nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    let fraction = format!("{:03}", nanos % 1000);
    format!("{}.{}us", nanos / 1000, fraction.trim_end_matches('0'))
}

/// A rate as `N/s`, `N/m` or `N/h` with a whole N when one exists (`"6000/m"` was compiled to
/// 100 per second and prints as `"100/s"`), else the exact per-second value.
fn rate(per_second: f64) -> String {
    for (unit, per) in [("s", 1.0), ("m", 60.0), ("h", 3600.0)] {
        let n = per_second * per;
        if n.fract() == 0.0 && n < 9e15 && n / per == per_second {
            return format!("{n}/{unit}");
        }
    }
    format!("{per_second}/s")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_duration;
    use crate::limits::parse_rate;

    #[test]
    fn durations_use_the_largest_exact_unit_and_parse_back() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(60), "1m"),
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_nanos(100), "0.1us"),
            (Duration::from_nanos(1_000_250), "1000.25us"),
        ] {
            assert_eq!(duration(d), text);
            assert_eq!(parse_duration(text).unwrap(), d, "{text}");
        }
    }

    #[test]
    fn rates_print_whole_numbers_and_parse_back() {
        for (written, text) in [
            ("100/s", "100/s"),
            ("6000/m", "100/s"),
            ("1/m", "1/m"),
            ("90/m", "90/m"),
            ("1/h", "1/h"),
            ("7/h", "7/h"),
            ("0.5/s", "30/m"),
        ] {
            let per_second = parse_rate(written).unwrap();
            assert_eq!(rate(per_second), text, "{written}");
            assert_eq!(parse_rate(text).unwrap(), per_second, "{written}");
        }
    }

    #[test]
    fn strings_and_keys_are_quoted_when_needed() {
        assert_eq!(string("a\"b\\c\nd"), "\"a\\\"b\\\\c\\u000ad\"");
        assert_eq!(key("web-1_a"), "web-1_a");
        assert_eq!(key("api.v2"), "\"api.v2\"");
    }
}
