//! Gateway API v1 (GatewayClass, Gateway, HTTPRoute, GRPCRoute, TCPRoute, TLSRoute,
//! ReferenceGrant) to veloxy routes, streams, upstream groups and certificates, merged into
//! the file's config like the Ingresses' (see `docs/src/guides/kubernetes.md`, "Gateway
//! API").
//!
//! A GatewayClass is ours when its `controllerName` is [`CONTROLLER`] (and, with
//! `gateway_class` set, its name is that); a Gateway is ours when its class is. Each Gateway
//! listener is served on a veloxy listener of the file: one of the same port and kind (TLS or
//! not; `protocol = "tcp"` for TCP), else `http_listener` (HTTP) or `https_listener` (HTTPS,
//! TLS passthrough); the file's listeners bind the sockets, the Gateway's ports are what
//! clients were told (a Service maps them). HTTPRoutes and GRPCRoutes become `[[routes]]`,
//! TCPRoutes and TLSRoutes `[[streams]]` (a TLSRoute's hostnames its `sni`). Routes are
//! translated oldest first (the spec's tie-break), so of two routes with the same listener,
//! host, path and conditions the older one is served. [`translate`] also returns the facts
//! [`status`] writes.

mod addresses;
mod attach;
pub mod backends;
mod listeners;
mod rules;
pub mod status;
pub mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use toml::{Table, Value};
use veloxy_engine::config::KubernetesSpec;

use super::events::Problem;
use super::objects::{id, World};
use rules::{Target, Via};
use types::{Gateway, GatewayClass, Listener, ParentRef, GROUP};

/// The `controllerName` of the GatewayClasses veloxy serves.
pub const CONTROLLER: &str = "veloxy.dev/gateway-controller";

/// A condition: true, or false with (reason, message).
pub type Cond = Result<(), (&'static str, String)>;

/// The route kinds a listener of `protocol` takes (none: the protocol is not served).
pub(crate) fn kinds(protocol: &str) -> &'static [&'static str] {
    match protocol {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TCP" => &["TCPRoute"],
        "TLS" => &["TLSRoute"],
        _ => &[],
    }
}

/// Whether routes of `kind` become `[[streams]]` (TCPRoute, TLSRoute), not `[[routes]]`.
pub fn is_stream(kind: &str) -> bool {
    matches!(kind, "TCPRoute" | "TLSRoute")
}

/// The Gateway objects as config, and the facts their status needs.
#[derive(Default)]
pub struct Translation {
    /// `[[routes]]` tables, in precedence order, and the `[[streams]]` tables of TCPRoutes
    /// and TLSRoutes (their origin's kind says which: [`is_stream`]).
    pub routes: Vec<Value>,
    /// The object each of `routes` comes from: (kind, namespace, name).
    pub origins: Vec<(&'static str, String, String)>,
    /// `[upstreams.NAME]` tables.
    pub upstreams: Table,
    /// (veloxy listener, `tls.certs` entry).
    pub certs: Vec<(String, Value)>,
    /// `[listeners.NAME]` tables: the file's listeners copied onto Gateway addresses
    /// (`gateway_addresses`).
    pub listeners: Table,
    /// (file name under the private directory, contents): the Secrets' PEMs.
    pub files: Vec<(String, String)>,
    /// Lines for the log: what was refused and why.
    pub notes: Vec<String>,
    /// The same, by object, for Events.
    pub problems: Vec<Problem>,
    pub report: Report,
    /// The groups made of backendRefs, for endpoint-only changes: (group, its references).
    pub sources: Vec<(String, Vec<backends::ServiceRef>)>,
    /// Services (namespace, name) of valid backendRefs whose rule has no group (no ready
    /// endpoint): a change of their endpoints changes more than servers.
    pub opaque: BTreeSet<(String, String)>,
}

/// What status reports.
#[derive(Default)]
pub struct Report {
    /// Our GatewayClasses (all Accepted).
    pub classes: Vec<Arc<GatewayClass>>,
    pub gateways: Vec<GatewayReport>,
    pub routes: Vec<RouteReport>,
}

/// One of our Gateways.
pub struct GatewayReport {
    pub gateway: Arc<Gateway>,
    /// Its address of `gateway_addresses` (`None`: it publishes `status_address`).
    pub address: Option<std::net::IpAddr>,
    pub listeners: Vec<ListenerReport>,
}

/// One Gateway listener.
pub struct ListenerReport {
    pub name: String,
    pub kinds: Vec<&'static str>,
    pub attached: i64,
    pub accepted: Cond,
    pub resolved: Cond,
    /// The veloxy listener serving it (`None`: not served).
    pub(super) veloxy: Option<String>,
    pub(super) spec: Listener,
    /// The hosts of the routes attached to it (the SNI names of its certificate when it has
    /// no hostname).
    pub(super) hosts: BTreeSet<String>,
    /// Its certificates: (cert path, key path).
    pub(super) certs: Vec<(String, String)>,
}

/// One route (HTTPRoute, GRPCRoute, TCPRoute, TLSRoute) naming one of our Gateways.
pub struct RouteReport {
    pub kind: &'static str,
    pub meta: ObjectMeta,
    /// Its status as last seen.
    pub status: Option<serde_json::Value>,
    pub parents: Vec<ParentReport>,
}

/// A route's status for one parentRef.
pub struct ParentReport {
    pub parent: ParentRef,
    pub accepted: Cond,
    pub resolved: Cond,
    /// Some rules were refused (the others are served).
    pub partially_invalid: Option<String>,
}

/// A route of either kind, for the shared steps.
enum AnyRoute<'a> {
    Http(&'a types::HttpRoute),
    Grpc(&'a types::GrpcRoute),
    Tcp(&'a types::TcpRoute),
    Tls(&'a types::TlsRoute),
}

impl AnyRoute<'_> {
    fn meta(&self) -> &ObjectMeta {
        match self {
            AnyRoute::Http(r) => &r.metadata,
            AnyRoute::Grpc(r) => &r.metadata,
            AnyRoute::Tcp(r) => &r.metadata,
            AnyRoute::Tls(r) => &r.metadata,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            AnyRoute::Http(_) => "HTTPRoute",
            AnyRoute::Grpc(_) => "GRPCRoute",
            AnyRoute::Tcp(_) => "TCPRoute",
            AnyRoute::Tls(_) => "TLSRoute",
        }
    }
    /// Whether it becomes streams (TCPRoute, TLSRoute).
    fn stream(&self) -> bool {
        is_stream(self.kind())
    }
    fn parent_refs(&self) -> &[ParentRef] {
        match self {
            AnyRoute::Http(r) => &r.spec.parent_refs,
            AnyRoute::Grpc(r) => &r.spec.parent_refs,
            AnyRoute::Tcp(r) => &r.spec.parent_refs,
            AnyRoute::Tls(r) => &r.spec.parent_refs,
        }
    }
    fn status(&self) -> Option<serde_json::Value> {
        match self {
            AnyRoute::Http(r) => r.status.clone(),
            AnyRoute::Grpc(r) => r.status.clone(),
            AnyRoute::Tcp(r) => r.status.clone(),
            AnyRoute::Tls(r) => r.status.clone(),
        }
    }
    fn hostnames(&self) -> &[String] {
        match self {
            AnyRoute::Http(r) => &r.spec.hostnames,
            AnyRoute::Grpc(r) => &r.spec.hostnames,
            AnyRoute::Tcp(r) => &r.spec.hostnames,
            AnyRoute::Tls(r) => &r.spec.hostnames,
        }
    }
}

/// Translates the Gateway objects of `world` for the config `file`; certificate files are
/// named relative to `dir`, where the caller writes them.
pub fn translate(world: &World, spec: &KubernetesSpec, file: &Table, dir: &Path) -> Translation {
    let mut t = Translation::default();
    t.report.classes = world
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == CONTROLLER)
        .filter(|c| {
            spec.gateway_class.is_none()
                || c.metadata.name.as_deref() == spec.gateway_class.as_deref()
        })
        .cloned()
        .collect();
    if t.report.classes.is_empty() {
        return t;
    }
    let ours: Vec<Arc<Gateway>> = world
        .gateways
        .iter()
        .filter(|gw| {
            t.report
                .classes
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some(gw.spec.gateway_class_name.as_str()))
        })
        .cloned()
        .collect();
    let addresses = addresses::assign(&ours, &spec.gateway_addresses);
    for (gw, address) in ours.iter().zip(addresses) {
        let listeners: Vec<ListenerReport> = gw
            .spec
            .listeners
            .iter()
            .map(|l| {
                let mut r = listeners::listener(world, spec, file, gw, l, &mut t);
                if let Some(on) = r.veloxy.take() {
                    r.veloxy = Some(addresses::on_address(file, on, address, &mut t));
                }
                r
            })
            .collect();
        for (l, r) in gw.spec.listeners.iter().zip(&listeners) {
            for e in [&r.accepted, &r.resolved]
                .into_iter()
                .filter_map(|c| c.as_ref().err())
            {
                t.problems.push(listeners::problem(gw, l, e));
            }
        }
        t.report.gateways.push(GatewayReport {
            gateway: gw.clone(),
            address,
            listeners,
        });
    }
    let mut all: Vec<AnyRoute<'_>> = world
        .http_routes
        .iter()
        .map(|r| AnyRoute::Http(r))
        .collect();
    all.extend(world.grpc_routes.iter().map(|r| AnyRoute::Grpc(r)));
    all.extend(world.tcp_routes.iter().map(|r| AnyRoute::Tcp(r)));
    all.extend(world.tls_routes.iter().map(|r| AnyRoute::Tls(r)));
    all.sort_by_key(|r| {
        let m = r.meta();
        (m.creation_timestamp.clone().map(|c| c.0), id(m))
    });
    let mut seen = BTreeMap::new();
    for r in &all {
        route(world, r, &mut t, &mut seen);
    }
    listeners::certs(&mut t, dir);
    t
}
/// Which route (`KIND NS/NAME`) each match key (see [`attach::match_key`]) was emitted for.
type Seen = BTreeMap<String, String>;
/// One route: its rules' groups, its parents' status, its veloxy routes on each listener it
/// attaches to.
fn route(world: &World, r: &AnyRoute<'_>, t: &mut Translation, seen: &mut Seen) {
    let meta = r.meta();
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let mut report = RouteReport {
        kind: r.kind(),
        meta: meta.clone(),
        status: r.status(),
        parents: Vec::new(),
    };
    let targets = targets(world, r, t);
    for pr in r.parent_refs() {
        if pr.group.as_deref().unwrap_or(GROUP) != GROUP
            || pr.kind.as_deref().unwrap_or("Gateway") != "Gateway"
        {
            continue;
        }
        let gw_ns = pr.namespace.as_deref().unwrap_or(ns);
        let Some(gi) = t.report.gateways.iter().position(|g| {
            g.gateway.metadata.namespace.as_deref() == Some(gw_ns)
                && g.gateway.metadata.name.as_deref() == Some(pr.name.as_str())
        }) else {
            continue; // Not one of our Gateways: another controller's status to write.
        };
        let mut parent = pr.clone();
        parent.namespace = Some(gw_ns.to_owned());
        let ns_labels = world
            .namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(ns))
            .and_then(|n| n.metadata.labels.as_ref());
        let accepted = attach::attach(t, gi, r, pr, (ns, ns_labels), &targets, seen);
        let refused: Vec<&String> = targets
            .iter()
            .filter_map(|(_, e)| e.as_ref().err())
            .collect();
        let all_refused = !refused.is_empty() && refused.len() == targets.len();
        let accepted = match accepted {
            Ok(()) if all_refused => Err(("UnsupportedValue", refused[0].clone())),
            other => other,
        };
        let resolved = targets
            .iter()
            .find_map(|(c, _)| c.clone().err())
            .map_or(Ok(()), Err);
        let partially_invalid = (!refused.is_empty() && !all_refused).then(|| {
            refused
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        });
        report.parents.push(ParentReport {
            parent,
            accepted,
            resolved,
            partially_invalid,
        });
    }
    for (_, e) in &targets {
        if let Err(e) = e {
            t.notes
                .push(format!("{} {}: rule not served: {e}", r.kind(), id(meta)));
        }
    }
    let name = meta.name.as_deref().unwrap_or_default();
    for p in &report.parents {
        let errors = [&p.accepted, &p.resolved];
        for (reason, msg) in errors.into_iter().filter_map(|c| c.as_ref().err()) {
            let note = format!("parent Gateway {}: {msg}", p.parent.name);
            t.problems
                .push(Problem::new(r.kind(), Some(ns), name, reason, note));
        }
        if let Some(why) = &p.partially_invalid {
            let note = format!("rules not served: {why}");
            let reason = "UnsupportedValue";
            t.problems
                .push(Problem::new(r.kind(), Some(ns), name, reason, note));
        }
    }
    if !report.parents.is_empty() {
        t.report.routes.push(report);
    }
}

/// Each rule's backends as a group (added to `t`) and its target, with ResolvedRefs, or the
/// reason the rule is refused (checked once here with a neutral listener).
fn targets(
    world: &World,
    r: &AnyRoute<'_>,
    t: &mut Translation,
) -> Vec<(Cond, Result<Target, String>)> {
    let meta = r.meta();
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let name = meta.name.as_deref().unwrap_or_default();
    let refs: Vec<&[types::ObjectRef]> = match r {
        AnyRoute::Http(h) => h.spec.rules.iter().map(|x| &x.backend_refs[..]).collect(),
        AnyRoute::Grpc(g) => g.spec.rules.iter().map(|x| &x.backend_refs[..]).collect(),
        AnyRoute::Tcp(l) => l.spec.rules.iter().map(|x| &x.backend_refs[..]).collect(),
        AnyRoute::Tls(l) => l.spec.rules.iter().map(|x| &x.backend_refs[..]).collect(),
    };
    let mut out = Vec::new();
    for (i, refs) in refs.into_iter().enumerate() {
        let mut b = backends::resolve(world, r.kind(), ns, refs);
        let target = if !b.servers.is_empty() {
            // `_` between the parts: Kubernetes names cannot hold it, so no other route's
            // namespace and name make the same group name (and take over its servers).
            let group = format!("k8s-gw-{}_{ns}_{name}_{i}", r.kind().to_ascii_lowercase());
            let mut g = Table::new();
            g.insert(
                "servers".into(),
                Value::Array(std::mem::take(&mut b.servers)),
            );
            if matches!(r, AnyRoute::Grpc(_)) {
                g.insert("protocol".into(), "h2c".into());
            }
            t.upstreams.insert(group.clone(), Value::Table(g));
            let mirrors = match r {
                AnyRoute::Http(h) => {
                    mirrors(world, ns, &group, &h.spec.rules[i], t, &mut b.resolved)
                }
                _ => Vec::new(),
            };
            t.sources.push((group.clone(), b.refs));
            Target::Upstream(group, mirrors)
        } else if b.any_valid {
            let refs = b.refs.into_iter();
            t.opaque.extend(refs.map(|r| (r.ns, r.name)));
            Target::Respond(503, "no ready endpoint\n")
        } else {
            Target::Respond(500, "no valid backend\n")
        };
        let check = match r {
            AnyRoute::Http(h) => rules::http_rule(
                &h.spec.rules[i],
                &target,
                Via {
                    port: 80,
                    https: false,
                },
            )
            .map(drop),
            AnyRoute::Grpc(g) => rules::grpc_rule(&g.spec.rules[i], &target).map(drop),
            // No matches or filters: nothing to refuse.
            AnyRoute::Tcp(_) | AnyRoute::Tls(_) => Ok(()),
        };
        out.push((b.resolved, check.map(|()| target)));
    }
    out
}
/// The groups of a rule's RequestMirror filters, in order, named after the rule's own group
/// (`None`: no ready endpoint); a refused mirror reference makes the rule's ResolvedRefs.
fn mirrors(
    world: &World,
    ns: &str,
    group: &str,
    rule: &types::HttpRule,
    t: &mut Translation,
    resolved: &mut Cond,
) -> Vec<Option<String>> {
    let filters = rule.filters.iter().filter(|f| f.type_ == "RequestMirror");
    let refs = filters.map(|f| f.request_mirror.as_ref().map(|m| &m.backend_ref));
    let mut out = Vec::new();
    for (j, r) in refs.enumerate() {
        let Some(r) = r else {
            out.push(None);
            continue;
        };
        let m = backends::resolve(world, "HTTPRoute", ns, std::slice::from_ref(r));
        if resolved.is_ok() {
            *resolved = m.resolved;
        }
        if m.servers.is_empty() {
            // A Service that gains endpoints gives the rule a mirror group: a full build.
            t.opaque.extend(m.refs.into_iter().map(|r| (r.ns, r.name)));
            out.push(None);
            continue;
        }
        let name = format!("{group}_mirror_{j}");
        let mut g = Table::new();
        g.insert("servers".into(), Value::Array(m.servers));
        t.upstreams.insert(name.clone(), Value::Table(g));
        t.sources.push((name.clone(), m.refs));
        out.push(Some(name));
    }
    out
}

#[cfg(test)]
mod tests;
