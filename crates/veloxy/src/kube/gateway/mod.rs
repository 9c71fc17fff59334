//! Gateway API v1 (GatewayClass, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant) to veloxy
//! routes, upstream groups and certificates, merged into the file's config like the
//! Ingresses' (see `docs/src/guides/kubernetes.md`, "Gateway API").
//!
//! A GatewayClass is ours when its `controllerName` is [`CONTROLLER`] (and, with
//! `gateway_class` set, its name is that); a Gateway is ours when its class is. Each Gateway
//! listener is served on a veloxy listener of the file: one of the same port and kind (TLS or
//! not), else `http_listener` (HTTP) or `https_listener` (HTTPS); the file's listeners bind
//! the sockets, the Gateway's ports are what clients were told (a Service maps them). Routes
//! are translated oldest first (the spec's tie-break), so of two routes with the same
//! listener, host, path and conditions the older one is served. [`translate`] also returns
//! the facts [`status`] writes.

mod backends;
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

/// The route kinds a listener of each protocol takes.
pub(crate) const KINDS: &[&str] = &["HTTPRoute", "GRPCRoute"];

/// The Gateway objects as config, and the facts their status needs.
#[derive(Default)]
pub struct Translation {
    /// `[[routes]]` tables, in precedence order.
    pub routes: Vec<Value>,
    /// The object each of `routes` comes from: (kind, namespace, name).
    pub origins: Vec<(&'static str, String, String)>,
    /// `[upstreams.NAME]` tables.
    pub upstreams: Table,
    /// (veloxy listener, `tls.certs` entry).
    pub certs: Vec<(String, Value)>,
    /// (file name under the private directory, contents): the Secrets' PEMs.
    pub files: Vec<(String, String)>,
    /// Lines for the log: what was refused and why.
    pub notes: Vec<String>,
    /// The same, by object, for Events.
    pub problems: Vec<Problem>,
    pub report: Report,
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

/// One HTTPRoute or GRPCRoute naming one of our Gateways.
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
}

impl AnyRoute<'_> {
    fn meta(&self) -> &ObjectMeta {
        match self {
            AnyRoute::Http(r) => &r.metadata,
            AnyRoute::Grpc(r) => &r.metadata,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            AnyRoute::Http(_) => "HTTPRoute",
            AnyRoute::Grpc(_) => "GRPCRoute",
        }
    }
    fn parent_refs(&self) -> &[ParentRef] {
        match self {
            AnyRoute::Http(r) => &r.spec.parent_refs,
            AnyRoute::Grpc(r) => &r.spec.parent_refs,
        }
    }
    fn status(&self) -> Option<serde_json::Value> {
        match self {
            AnyRoute::Http(r) => r.status.clone(),
            AnyRoute::Grpc(r) => r.status.clone(),
        }
    }
    fn hostnames(&self) -> &[String] {
        match self {
            AnyRoute::Http(r) => &r.spec.hostnames,
            AnyRoute::Grpc(r) => &r.spec.hostnames,
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
    for gw in &world.gateways {
        let ours = t
            .report
            .classes
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(gw.spec.gateway_class_name.as_str()));
        if ours {
            let listeners: Vec<ListenerReport> = gw
                .spec
                .listeners
                .iter()
                .map(|l| listeners::listener(world, spec, file, gw, l, &mut t))
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
                listeners,
            });
        }
    }
    let mut all: Vec<AnyRoute<'_>> = world
        .http_routes
        .iter()
        .map(|r| AnyRoute::Http(r))
        .collect();
    all.extend(world.grpc_routes.iter().map(|r| AnyRoute::Grpc(r)));
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

/// `listener`'s hostname intersected with a route's: `None` when they share none; an empty
/// list: any host.
fn hosts(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    let covers = |wild: &str, h: &str| {
        wild.strip_prefix("*.")
            .is_some_and(|s| h.len() > s.len() + 1 && h.ends_with(&format!(".{s}")))
    };
    match (listener, route.is_empty()) {
        (None, true) => Some(Vec::new()),
        (None, false) => Some(route.to_vec()),
        (Some(l), true) => Some(vec![l.to_owned()]),
        (Some(l), false) => {
            let mut out: Vec<String> = Vec::new();
            for h in route {
                let m = if h.eq_ignore_ascii_case(l) || covers(l, h) {
                    Some(h.as_str())
                } else if covers(h, l) {
                    Some(l)
                } else {
                    None
                };
                if let Some(m) = m.filter(|m| !out.iter().any(|o| o == m)) {
                    out.push(m.to_owned());
                }
            }
            (!out.is_empty()).then_some(out)
        }
    }
}

/// Which route (`KIND NS/NAME`) each match key (see [`match_key`]) was emitted for.
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
        let accepted = attach(t, gi, r, pr, ns, &targets, seen);
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
    };
    let mut out = Vec::new();
    for (i, refs) in refs.into_iter().enumerate() {
        let b = backends::resolve(world, r.kind(), ns, refs);
        let target = if !b.servers.is_empty() {
            let group = format!("k8s-gw-{}-{ns}-{name}-{i}", r.kind().to_ascii_lowercase());
            let mut g = Table::new();
            g.insert("servers".into(), Value::Array(b.servers));
            if matches!(r, AnyRoute::Grpc(_)) {
                g.insert("protocol".into(), "h2c".into());
            }
            t.upstreams.insert(group.clone(), Value::Table(g));
            Target::Upstream(group)
        } else if b.any_valid {
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
        };
        out.push((b.resolved, check.map(|()| target)));
    }
    out
}

/// Attaches route `r` to the listeners of Gateway `gi` that `pr` selects and allow it:
/// its veloxy routes on each. Accepted, or why not.
fn attach(
    t: &mut Translation,
    gi: usize,
    r: &AnyRoute<'_>,
    pr: &ParentRef,
    ns: &str,
    targets: &[(Cond, Result<Target, String>)],
    seen: &mut Seen,
) -> Cond {
    let gw = &t.report.gateways[gi];
    let gw_ns = gw
        .gateway
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default")
        .to_owned();
    let selected: Vec<usize> = (0..gw.listeners.len())
        .filter(|&i| {
            let l = &gw.listeners[i];
            pr.section_name.as_deref().is_none_or(|s| s == l.name)
                && pr.port.is_none_or(|p| p == l.spec.port)
        })
        .collect();
    if selected.is_empty() {
        return Err((
            "NoMatchingParent",
            "no listener matches sectionName/port".into(),
        ));
    }
    let allowed: Vec<usize> = selected
        .into_iter()
        .filter(|&i| {
            let l = &gw.listeners[i];
            let from = l
                .spec
                .allowed_routes
                .as_ref()
                .and_then(|a| a.namespaces.as_ref());
            let ns_ok = match from.and_then(|f| f.from.as_deref()).unwrap_or("Same") {
                "All" => true,
                "Same" => ns == gw_ns,
                _ => false, // Selector: namespaces' labels are not watched.
            };
            ns_ok && l.kinds.contains(&r.kind()) && l.accepted.is_ok() && l.veloxy.is_some()
        })
        .collect();
    if allowed.is_empty() {
        return Err((
            "NotAllowedByListeners",
            "no listener allows this route".into(),
        ));
    }
    let mut matched = false;
    for i in allowed {
        let l = &t.report.gateways[gi].listeners[i];
        let Some(hosts) = hosts(l.spec.hostname.as_deref(), r.hostnames()) else {
            continue;
        };
        matched = true;
        let on = l.veloxy.clone().unwrap_or_default();
        let via = Via {
            port: l.spec.port,
            https: l.spec.protocol == "HTTPS",
        };
        let routes = emit(r, targets, via);
        let l = &mut t.report.gateways[gi].listeners[i];
        l.attached += 1;
        l.hosts.extend(hosts.iter().cloned());
        let one_host: Vec<Option<&String>> = if hosts.is_empty() {
            vec![None]
        } else {
            hosts.iter().map(Some).collect()
        };
        for route in &routes {
            for h in &one_host {
                let mut route = route.clone();
                route.insert("listener".into(), on.as_str().into());
                if let Some(h) = h {
                    route.insert("host".into(), h.as_str().into());
                }
                let me = format!("{} {}", r.kind(), id(r.meta()));
                let first = match claim(seen, &mut route, &me) {
                    Claim::New => true,
                    // The same route through another Gateway listener served on this
                    // listener: once is enough.
                    Claim::Mine => continue,
                    Claim::Older => false,
                };
                if first {
                    t.routes.push(Value::Table(route));
                    let m = r.meta();
                    let ns = m.namespace.clone().unwrap_or_else(|| "default".into());
                    t.origins
                        .push((r.kind(), ns, m.name.clone().unwrap_or_default()));
                } else {
                    let note = format!(
                        "a match on listener {on}, host {} is an older route's: not served",
                        h.map_or("(any)", |h| h.as_str())
                    );
                    t.notes
                        .push(format!("{} {}: {note}", r.kind(), id(r.meta())));
                    let m = r.meta();
                    let name = m.name.as_deref().unwrap_or_default();
                    let p = Problem::new(
                        r.kind(),
                        m.namespace.as_deref(),
                        name,
                        "RouteConflict",
                        note,
                    );
                    if !t.problems.contains(&p) {
                        t.problems.push(p);
                    }
                }
            }
        }
    }
    if matched {
        Ok(())
    } else {
        Err((
            "NoMatchingListenerHostname",
            "no listener hostname matches the route's".into(),
        ))
    }
}

/// The routes of each rule that is not refused, through a listener `via`.
fn emit(r: &AnyRoute<'_>, targets: &[(Cond, Result<Target, String>)], via: Via) -> Vec<Table> {
    let mut out = Vec::new();
    for (i, (_, target)) in targets.iter().enumerate() {
        let Ok(target) = target else { continue };
        let routes = match r {
            AnyRoute::Http(h) => rules::http_rule(&h.spec.rules[i], target, via),
            AnyRoute::Grpc(g) => rules::grpc_rule(&g.spec.rules[i], target),
        };
        out.extend(routes.unwrap_or_default());
    }
    out
}

/// What [`claim`] found.
enum Claim {
    /// All or part of the route is new: served (less the part an older route has).
    New,
    /// This route was served already (through another Gateway listener).
    Mine,
    /// An older route has all of it.
    Older,
}

/// Claims the router's entries of `route` for `me`. A route with `path_exact` and `path` (a
/// PathPrefix match) is two entries to the router (the exact path and the prefix under it):
/// when an older route has one of them (an Exact match of the same path, for instance), the
/// route keeps the other, as the spec's precedence serves the older one for that part.
fn claim(seen: &mut Seen, route: &mut Table, me: &str) -> Claim {
    let parts: Vec<(String, Option<&str>)> =
        if route.contains_key("path_exact") && route.contains_key("path") {
            ["path_exact", "path"]
                .into_iter()
                .map(|drop| {
                    let mut one = route.clone();
                    one.remove(drop);
                    (match_key(&one), Some(drop))
                })
                .collect()
        } else {
            vec![(match_key(route), None)]
        };
    let total = parts.len();
    let mut fresh = Vec::new();
    let mut mine = false;
    for (key, drop) in parts {
        match seen.get(&key) {
            None => fresh.push((key, drop)),
            Some(o) => mine |= o == me,
        }
    }
    if fresh.is_empty() {
        return if mine { Claim::Mine } else { Claim::Older };
    }
    if fresh.len() < total {
        // One part is an older route's: this route keeps the other (the route less `drop`).
        if let Some(drop) = fresh[0].1 {
            route.remove(drop);
        }
    }
    for (key, _) in fresh {
        seen.insert(key, me.to_string());
    }
    Claim::New
}

/// What makes two routes the same to the router: listener, host, path and conditions.
fn match_key(t: &Table) -> String {
    let keys = [
        "listener",
        "host",
        "path",
        "path_exact",
        "path_regex",
        "methods",
        "headers",
        "query",
    ];
    keys.iter()
        .map(|k| {
            format!(
                "{k}={}",
                t.get(*k).map(Value::to_string).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
