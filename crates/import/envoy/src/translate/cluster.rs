//! `static_resources.clusters` -> `[upstreams.NAME]`.
//!
//! A cluster is read first (servers, policy, checks, TLS) and written at the end: Envoy sets
//! timeouts, retries and hash keys on routes, veloxy on groups, so each distinct set of those
//! that routes ask of one cluster becomes one group (the first keeps the cluster's name).

use toml::Value;
use veloxy_import::tree::Node;
use veloxy_import::{Config, Loc, Section};

use super::Ctx;
use crate::util::{dur, duration_ms, enum_name, seq, socket_address, typed, Fields};

/// What routes ask of a cluster's group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Variant {
    /// The route timeout (Envoy's default 15 s); `None`: disabled.
    pub timeout_ms: Option<u64>,
    /// `retry_policy.num_retries` (0: none).
    pub retries: u32,
    /// The statuses retried.
    pub retry_on: Vec<u16>,
    /// The consistent hash key (`hash_policy`).
    pub hash_key: Option<String>,
}

/// One cluster, read.
pub struct Cluster {
    /// Envoy's name.
    pub name: String,
    /// The group's keys as the cluster alone gives them.
    pub section: Section,
    /// The DNS name of its endpoints (one name), for `auto_host_rewrite`.
    pub dns_host: Option<String>,
    /// Whether the policy hashes (RING_HASH, MAGLEV).
    pub hashing: bool,
    /// The variants routes asked for, with their group names.
    pub uses: Vec<(Variant, String)>,
    /// Whether a stream or an auth check uses it (any variant).
    pub plain_use: bool,
}

impl Cluster {
    /// Whether the cluster has servers veloxy can use (else it is not written).
    pub fn usable(&self) -> bool {
        matches!(self.section.get("servers"), Some(Value::Array(a)) if !a.is_empty())
    }
}

impl Ctx<'_> {
    /// The group for `cluster` with what a route asks of it; `None` when no such cluster.
    pub fn group(&mut self, cluster: &str, mut v: Variant) -> Option<String> {
        let i = self
            .clusters
            .iter()
            .position(|c| c.name == cluster && c.usable())?;
        if !self.clusters[i].hashing {
            v.hash_key = None;
        }
        if let Some((_, n)) = self.clusters[i].uses.iter().find(|(u, _)| *u == v) {
            return Some(n.clone());
        }
        let base = veloxy_import::model::sanitize(cluster);
        let name = if self.clusters[i].uses.is_empty() {
            base
        } else {
            let taken: Vec<(String, Section)> = self
                .clusters
                .iter()
                .flat_map(|c| c.uses.iter().map(|(_, n)| (n.clone(), Section::default())))
                .collect();
            Config::unique(&taken, &base)
        };
        self.clusters[i].uses.push((v, name.clone()));
        Some(name)
    }

    /// The group for a stream or an auth check (any variant: the first, or the defaults).
    pub fn plain_group(&mut self, cluster: &str) -> Option<String> {
        let c = self
            .clusters
            .iter_mut()
            .find(|c| c.name == cluster && c.usable())?;
        c.plain_use = true;
        match c.uses.first() {
            Some((_, n)) => Some(n.clone()),
            None => Some(veloxy_import::model::sanitize(cluster)),
        }
    }

    /// The cluster named `name`.
    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.name == name)
    }
}

/// Writes every cluster's groups, in source order.
pub fn write_all(ctx: &mut Ctx) {
    for c in std::mem::take(&mut ctx.clusters) {
        if !c.usable() {
            continue;
        }
        let mut uses = c.uses.clone();
        let http = !uses.is_empty();
        if uses.is_empty() {
            uses.push((
                Variant {
                    timeout_ms: Some(15_000),
                    ..Default::default()
                },
                veloxy_import::model::sanitize(&c.name),
            ));
        }
        for (i, (v, name)) in uses.iter().enumerate() {
            let mut s = c.section.clone();
            if i > 0 {
                s.comments.push(format!(
                    "cluster {} again, for the routes with this timeout, retry policy or hash key",
                    c.name
                ));
            }
            if http {
                s.set("read_timeout", dur(v.timeout_ms.unwrap_or(86_400_000)));
            }
            s.set("retries", i64::from(v.retries));
            if !v.retry_on.is_empty() {
                let codes: Vec<Value> = v
                    .retry_on
                    .iter()
                    .map(|c| Value::Integer(i64::from(*c)))
                    .collect();
                s.set("retry_on", Value::Array(codes));
            }
            if let Some(k) = &v.hash_key {
                s.set("hash_key", k.as_str());
            }
            // Blocks (health, outlier) last, as they are written after the plain keys anyway.
            for k in ["health", "outlier"] {
                if let Some(b) = s.remove(k) {
                    s.set(k, b);
                }
            }
            ctx.cfg.upstreams.push((name.clone(), s));
        }
    }
}

/// Reads one cluster.
pub fn read(ctx: &mut Ctx, c: &Node) {
    let mut f = Fields::new(c, "cluster");
    let name = f
        .take("name")
        .and_then(|(_, n)| n.scalar())
        .unwrap_or_else(|| format!("cluster_{}", ctx.clusters.len() + 1));
    let mut s = Section::from(&c.loc);
    let mut dns = false;
    let mut hashing = false;
    if let Some((loc, t)) = f.take("type") {
        match enum_name(t).unwrap_or_default().as_str() {
            "STATIC" => ctx.r.translated(loc, "cluster.type"),
            "STRICT_DNS" => {
                dns = true;
                ctx.r.translated(loc, "cluster.type")
            }
            "LOGICAL_DNS" => {
                dns = true;
                ctx.r.different(
                    loc,
                    "cluster.type",
                    "LOGICAL_DNS connects to the first address of the name; veloxy balances \
                     over every address it resolves",
                )
            }
            other => ctx.r.refused(
                loc,
                "cluster.type",
                format!("{other}: veloxy's groups list their servers or DNS names"),
            ),
        }
    }
    f.refuse(
        &mut ctx.r,
        "cluster_type",
        "a custom cluster type (dynamic forward proxy, aggregate...): veloxy lacks it",
    );
    f.refuse(
        &mut ctx.r,
        "eds_cluster_config",
        "endpoints from EDS (xDS): veloxy reads static servers",
    );
    let refresh = f.take("dns_refresh_rate").and_then(|(loc, d)| {
        ctx.r.translated(loc, "cluster.dns_refresh_rate");
        duration_ms(d)
    });
    f.ignore(
        &mut ctx.r,
        "respect_dns_ttl",
        "veloxy resolves again every `resolve`",
    );
    let matches = f.take("transport_socket_matches");
    let fallback = f.take("transport_socket");
    let tls = match matches {
        Some((loc, m)) => super::sockets::socket_matches(ctx, loc, m, c, fallback, &mut s),
        None => fallback
            .map(|(loc, t)| super::sockets::socket(ctx, loc, "cluster.transport_socket", t, &mut s))
            .unwrap_or(false),
    };
    let checked = c.get("health_checks").is_some() || c.get("outlier_detection").is_some();
    let (servers, dns_host) = endpoints(ctx, &mut f, dns, tls, refresh, checked);
    s.set("servers", Value::Array(servers));
    lb_policy(ctx, &mut f, &mut s, &mut hashing);
    let connect = f.take("connect_timeout").and_then(|(loc, d)| {
        ctx.r.translated(loc, "cluster.connect_timeout");
        duration_ms(d)
    });
    s.set("connect_timeout", dur(connect.unwrap_or(5000)));
    protocol(ctx, &mut f, &mut s, tls);
    if let Some((loc, hc)) = f.take("health_checks") {
        super::filters::health_checks(ctx, loc, hc, &mut s);
    }
    match f.take("outlier_detection") {
        Some((loc, od)) => outlier(ctx, loc, od, &mut s),
        None => {
            let mut t = toml::Table::new();
            t.insert("consecutive_failures".into(), Value::Integer(0));
            s.set("outlier", Value::Table(t));
        }
    }
    if let Some((loc, cb)) = f.take("circuit_breakers") {
        circuit_breakers(ctx, loc, cb, &mut s);
    }
    f.ignore(
        &mut ctx.r,
        "common_lb_config",
        "panic threshold and zone-aware balancing: veloxy keeps to the healthy backends",
    );
    f.ignore(
        &mut ctx.r,
        "close_connections_on_host_health_failure",
        "veloxy stops sending new requests to a backend marked down",
    );
    f.finish(&mut ctx.r);
    ctx.clusters.push(Cluster {
        name,
        section: s,
        dns_host,
        hashing,
        uses: Vec::new(),
        plain_use: false,
    });
}

/// `load_assignment` (or the v2 `hosts`): the servers.
fn endpoints(
    ctx: &mut Ctx,
    f: &mut Fields,
    dns: bool,
    tls: bool,
    refresh: Option<u64>,
    checked: bool,
) -> (Vec<Value>, Option<String>) {
    let mut servers = Vec::new();
    let mut names = Vec::new();
    if let Some((loc, _)) = f.take("hosts") {
        ctx.r.refused(
            loc,
            "cluster.hosts",
            "the v2 API's hosts field: write load_assignment (v3)",
        );
    }
    let Some((_, la)) = f.take("load_assignment") else {
        return (servers, None);
    };
    for group in seq(la.get("endpoints").unwrap_or(la)) {
        let mut backup = false;
        if let Some(p) = group
            .get("priority")
            .and_then(|p| p.as_i64())
            .filter(|p| *p > 0)
        {
            let d = "cluster.load_assignment.endpoints";
            if checked {
                ctx.r.different(
                    &group.loc,
                    d,
                    format!(
                        "endpoints at priority {p} become backup servers: veloxy sends them \
                         traffic only once every priority-0 endpoint is down or ejected (Envoy \
                         spills a share as soon as priority 0 is below its overprovisioning \
                         threshold; all priorities above 0 are one backup tier)"
                    ),
                );
                backup = true;
            } else {
                ctx.r.ignored(
                    &group.loc,
                    d,
                    format!(
                        "endpoints at priority {p} take traffic only when priority 0 is marked \
                         unhealthy; without health_checks or outlier_detection nothing marks \
                         it, so Envoy never sends them a request"
                    ),
                );
                continue;
            }
        }
        for e in seq(group.get("lb_endpoints").unwrap_or(group)) {
            let addr = e.get("endpoint").and_then(|ep| ep.get("address"));
            let addr = match addr.map(socket_address) {
                Some(Ok((host, Some(port), is_ip))) => (host, port, is_ip),
                Some(Ok(_)) => {
                    ctx.r
                        .refused(&e.loc, "lb_endpoint", "an endpoint without port_value");
                    continue;
                }
                Some(Err(m)) => {
                    ctx.r.refused(&e.loc, "lb_endpoint", m);
                    continue;
                }
                None => {
                    ctx.r
                        .refused(&e.loc, "lb_endpoint", "an endpoint without an address");
                    continue;
                }
            };
            let (host, port, is_ip) = addr;
            let weight = e.get("load_balancing_weight").and_then(|w| w.as_i64());
            let scheme = if tls { "https://" } else { "" };
            let target = format!("{scheme}{host}:{port}");
            let mut t = toml::Table::new();
            if dns && !is_ip {
                names.push(host.clone());
                t.insert("dns".into(), target.clone().into());
                t.insert("resolve".into(), dur(refresh.unwrap_or(5000)).into());
            } else if weight.is_some() {
                t.insert("addr".into(), target.clone().into());
            }
            if let Some(w) = weight {
                t.insert("weight".into(), Value::Integer(w));
            }
            if backup {
                if !t.contains_key("dns") && !t.contains_key("addr") {
                    t.insert("addr".into(), target.clone().into());
                }
                t.insert("backup".into(), Value::Boolean(true));
            }
            let status = e.get("health_status").and_then(enum_name);
            if matches!(
                status.as_deref(),
                Some("DRAINING" | "UNHEALTHY" | "TIMEOUT")
            ) {
                ctx.r.refused(
                    &e.loc,
                    "lb_endpoint.health_status",
                    "an endpoint marked unhealthy or draining: veloxy drains through its \
                     runtime API, not the file",
                );
                continue;
            }
            servers.push(if t.is_empty() {
                Value::String(target)
            } else {
                Value::Table(t)
            });
            ctx.r.translated(&e.loc, "lb_endpoint");
        }
    }
    names.dedup();
    let dns_host = (names.len() == 1).then(|| names.remove(0));
    (servers, dns_host)
}

/// `lb_policy` / `load_balancing_policy`.
fn lb_policy(ctx: &mut Ctx, f: &mut Fields, s: &mut Section, hashing: &mut bool) {
    let mut set = |ctx: &mut Ctx, loc: &Loc, d: &str, p: &str| {
        let policy = match p {
            "ROUND_ROBIN" | "round_robin" => None,
            "LEAST_REQUEST" | "least_request" => Some("least_conn"),
            "RANDOM" | "random" => Some("random"),
            "RING_HASH" | "MAGLEV" | "ring_hash" | "maglev" => Some("consistent_hash"),
            other => {
                ctx.r
                    .refused(loc, d, format!("{other}: veloxy lacks this policy"));
                return;
            }
        };
        if let Some(p) = policy {
            s.set("policy", p);
        }
        if policy == Some("consistent_hash") {
            *hashing = true;
            ctx.r.different(
                loc,
                d,
                "veloxy's consistent hash is Maglev: the same key goes to one backend, not \
                 necessarily the one Envoy picks; without a route hash_policy the key is the \
                 client address (Envoy picks at random)",
            );
        } else if policy == Some("least_conn") {
            ctx.r.different(
                loc,
                d,
                "least_conn counts in-flight requests per worker; Envoy's picks the less \
                 loaded of two random backends",
            );
        } else {
            ctx.r.translated(loc, d);
        }
    };
    if let Some((loc, p)) = f.take("lb_policy") {
        set(
            ctx,
            loc,
            "cluster.lb_policy",
            &p.scalar().unwrap_or_default(),
        );
    }
    if let Some((loc, p)) = f.take("load_balancing_policy") {
        let first = p
            .get("policies")
            .and_then(|ps| ps.as_seq()?.first().cloned());
        let ty = first
            .as_ref()
            .and_then(|x| {
                x.get("typed_extension_config")?
                    .get("typed_config")
                    .cloned()
            })
            .map(|t| typed(&t).0)
            .unwrap_or_default();
        let short = ty.split('.').rev().nth(2).unwrap_or_default().to_string();
        set(ctx, loc, "cluster.load_balancing_policy", &short);
    }
    for k in [
        "ring_hash_lb_config",
        "maglev_lb_config",
        "least_request_lb_config",
        "round_robin_lb_config",
    ] {
        f.ignore(
            &mut ctx.r,
            k,
            "tuning of Envoy's balancer (table sizes, slow start): veloxy's is fixed",
        );
    }
}

/// HTTP/2 to the backends: `http2_protocol_options` or `typed_extension_protocol_options`.
fn protocol(ctx: &mut Ctx, f: &mut Fields, s: &mut Section, tls: bool) {
    let h2 = if tls { "h2" } else { "h2c" };
    if let Some((loc, _)) = f.take("http2_protocol_options") {
        s.set("protocol", h2);
        ctx.r.translated(loc, "cluster.http2_protocol_options");
    }
    f.ignore(
        &mut ctx.r,
        "common_http_protocol_options",
        "idle limits of Envoy's upstream connections (veloxy's idle_timeout is 60s)",
    );
    f.ignore(
        &mut ctx.r,
        "http_protocol_options",
        "HTTP/1.1 codec options of Envoy's",
    );
    let Some((loc, opts)) = f.take("typed_extension_protocol_options") else {
        return;
    };
    for (k, v) in opts.as_map().unwrap_or(&[]) {
        let (_, body) = typed(v);
        let Some(body) = body else { continue };
        let d = format!("typed_extension_protocol_options.{}", k.name);
        if let Some(explicit) = body.get("explicit_http_config") {
            if explicit.get("http2_protocol_options").is_some() {
                s.set("protocol", h2);
                ctx.r.translated(&k.loc, d);
            } else {
                ctx.r.translated(&k.loc, d);
            }
        } else if body.get("auto_config").is_some() {
            ctx.r.different(
                &k.loc,
                d,
                "Envoy negotiates HTTP/2 by ALPN with each backend; veloxy speaks HTTP/1.1 to \
                 this group",
            );
        } else if body.get("use_downstream_protocol_config").is_some() {
            ctx.r.different(
                &k.loc,
                d,
                "Envoy uses the client's HTTP version upstream; veloxy speaks HTTP/1.1 to this \
                 group",
            );
        } else {
            ctx.r.ignored(&k.loc, d, "protocol tuning of Envoy's");
        }
    }
    let _ = loc;
}

/// `transport_socket` with an `UpstreamTlsContext`: https servers, SNI, CA.
pub fn upstream_tls(ctx: &mut Ctx, loc: &Loc, d: &str, t: &Node, s: &mut Section) -> bool {
    let (ty, body) = typed(t.get("typed_config").unwrap_or(t));
    if !ty.ends_with("UpstreamTlsContext") {
        ctx.r.refused(
            loc,
            d,
            format!("{ty}: veloxy speaks plain TCP or TLS to backends"),
        );
        return false;
    }
    let body = body.unwrap_or(t);
    if let Some(sni) = body.get("sni").and_then(|x| x.scalar()) {
        s.set("tls_server_name", sni);
    }
    let common = body.get("common_tls_context");
    let vc = common.and_then(|c| c.get("validation_context"));
    let ca = vc
        .and_then(|v| v.get("trusted_ca"))
        .and_then(|c| c.get("filename"))
        .and_then(|c| c.scalar());
    if common.and_then(|c| c.get("tls_certificates")).is_some() {
        ctx.r.refused(
            loc,
            d,
            "a client certificate for the backends (mTLS): veloxy presents none",
        );
        return true;
    }
    match ca {
        Some(ca) => {
            s.set("ca_file", ctx.path(&ca));
            ctx.r.translated(loc, d);
        }
        None => ctx.r.different(
            loc,
            d,
            "without validation_context Envoy does not verify the backend's certificate; \
             veloxy verifies it against the system roots (a self-signed backend answers 502 \
             until ca_file names its CA)",
        ),
    }
    true
}

/// `outlier_detection` -> `[upstreams.NAME.outlier]`.
fn outlier(ctx: &mut Ctx, loc: &Loc, od: &Node, s: &mut Section) {
    let mut t = toml::Table::new();
    let n = od
        .get("consecutive_5xx")
        .and_then(|n| n.as_i64())
        .unwrap_or(5);
    t.insert("consecutive_failures".into(), Value::Integer(n));
    let base = od
        .get("base_ejection_time")
        .and_then(duration_ms)
        .unwrap_or(30_000);
    t.insert("base_ejection".into(), dur(base).into());
    let max = od
        .get("max_ejection_time")
        .and_then(duration_ms)
        .unwrap_or(300_000);
    t.insert("max_ejection".into(), dur(max).into());
    let pct = od
        .get("max_ejection_percent")
        .and_then(|n| n.as_i64())
        .unwrap_or(10);
    t.insert("max_ejected_percent".into(), Value::Integer(pct));
    s.set("outlier", Value::Table(t));
    ctx.r.different(
        loc,
        "cluster.outlier_detection",
        "veloxy counts connect errors, resets, timeouts and 5xx answers together and has no \
         success-rate or gateway-failure detection; Envoy's ejection time grows linearly with \
         each ejection, veloxy's doubles",
    );
}

/// `circuit_breakers`: `max_connections` per backend.
fn circuit_breakers(ctx: &mut Ctx, loc: &Loc, cb: &Node, s: &mut Section) {
    let first = cb
        .get("thresholds")
        .and_then(|t| t.as_seq()?.first().cloned());
    match first.and_then(|t| t.get("max_connections").and_then(|m| m.as_i64())) {
        Some(n) => {
            s.set("max_connections", n);
            ctx.r.different(
                loc,
                "cluster.circuit_breakers",
                "veloxy's max_connections bounds each backend, Envoy's the whole cluster; \
                 max_pending_requests, max_requests and max_retries have no equivalent",
            );
        }
        None => ctx.r.different(
            loc,
            "cluster.circuit_breakers",
            "max_pending_requests, max_requests and max_retries have no equivalent: veloxy \
             does not bound requests per group",
        ),
    }
}
