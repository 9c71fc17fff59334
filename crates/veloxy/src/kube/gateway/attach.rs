//! Attaching a route to the Gateway listeners its parentRef selects: the veloxy routes (or,
//! for TCPRoutes and TLSRoutes, streams) of its rules on the listener serving each, the
//! older of two identical matches served.

use toml::{Table, Value};

use super::rules::{self, Target, Via};
use super::types::ParentRef;
use super::{AnyRoute, Cond, Seen, Translation};
use crate::kube::events::Problem;
use crate::kube::objects::id;

/// `listener`'s hostname intersected with a route's: `None` when they share none; an empty
/// list: any host.
pub(super) fn hosts(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
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

/// Attaches route `r` to the listeners of Gateway `gi` that `pr` selects and allow it:
/// its veloxy routes (streams) on each. Accepted, or why not.
pub(super) fn attach(
    t: &mut Translation,
    gi: usize,
    r: &AnyRoute<'_>,
    pr: &ParentRef,
    (ns, ns_labels): (&str, Option<&Labels>),
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
                "Selector" => {
                    let selector = from.and_then(|f| f.selector.as_ref());
                    selector.is_some_and(|s| selects(s, ns_labels))
                }
                _ => false,
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
        let hosts = match r {
            // TCP has no hostnames (a listener's is ignored).
            AnyRoute::Tcp(_) => Some(Vec::new()),
            _ => hosts(l.spec.hostname.as_deref(), r.hostnames()),
        };
        // A stream without SNI names on a TLS listener would take every name.
        let Some(hosts) = hosts.filter(|h| !(matches!(r, AnyRoute::Tls(_)) && h.is_empty())) else {
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
                add(t, r, &on, route, *h, seen);
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

/// Adds `route` of `r` on the veloxy listener `on` for host `h` (a stream: SNI name), unless
/// an older route has its match (then reported).
fn add(
    t: &mut Translation,
    r: &AnyRoute<'_>,
    on: &str,
    route: &Table,
    h: Option<&String>,
    seen: &mut Seen,
) {
    let mut route = route.clone();
    route.insert("listener".into(), on.into());
    if let Some(h) = h {
        if r.stream() {
            route.insert("sni".into(), Value::Array(vec![h.as_str().into()]));
        } else {
            route.insert("host".into(), h.as_str().into());
        }
    }
    let me = format!("{} {}", r.kind(), id(r.meta()));
    let first = match claim(seen, &mut route, &me, r.stream()) {
        Claim::New => true,
        // The same route through another Gateway listener served on this listener: once is
        // enough.
        Claim::Mine => return,
        Claim::Older => false,
    };
    let m = r.meta();
    if first {
        t.routes.push(Value::Table(route));
        let ns = m.namespace.clone().unwrap_or_else(|| "default".into());
        t.origins
            .push((r.kind(), ns, m.name.clone().unwrap_or_default()));
        return;
    }
    let what = if r.stream() { "SNI name" } else { "host" };
    let note = format!(
        "a match on listener {on}, {what} {} is an older route's: not served",
        h.map_or("(any)", |h| h.as_str())
    );
    t.notes.push(format!("{} {}: {note}", r.kind(), id(m)));
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

/// The routes of each rule that is not refused, through a listener `via` (TCPRoute and
/// TLSRoute: the stream of their one rule, without `listener` and `sni` yet; none when no
/// backend is usable, so that connections are refused, as the spec wants).
fn emit(r: &AnyRoute<'_>, targets: &[(Cond, Result<Target, String>)], via: Via) -> Vec<Table> {
    let mut out = Vec::new();
    for (i, (_, target)) in targets.iter().enumerate() {
        let Ok(target) = target else { continue };
        let routes = match r {
            AnyRoute::Tcp(_) | AnyRoute::Tls(_) => match target {
                Target::Upstream(g, _) => {
                    let mut s = Table::new();
                    s.insert("upstream".into(), g.as_str().into());
                    Ok(vec![s])
                }
                Target::Respond(..) => Ok(Vec::new()),
            },
            AnyRoute::Http(h) => rules::http_rule(&h.spec.rules[i], target, via),
            AnyRoute::Grpc(g) => rules::grpc_rule(&g.spec.rules[i], target),
        };
        out.extend(routes.unwrap_or_default());
    }
    out
}

/// What makes two routes the same to the router: listener, host, path and conditions (for
/// streams: listener and SNI names).
pub(super) fn match_key(t: &Table) -> String {
    let keys = [
        "listener",
        "host",
        "path",
        "path_exact",
        "path_regex",
        "methods",
        "headers",
        "query",
        "sni",
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

/// What [`claim`] found.
enum Claim {
    /// All or part of the route is new: served (less the part an older route has).
    New,
    /// This route was served already (through another Gateway listener).
    Mine,
    /// An older route has all of it.
    Older,
}

/// Claims the router's entries of `route` (a stream's when `stream`) for `me`. A route with
/// `path_exact` and `path` (a PathPrefix match) is two entries to the router (the exact path
/// and the prefix under it): when an older route has one of them (an Exact match of the same
/// path, for instance), the route keeps the other, as the spec's precedence serves the older
/// one for that part.
fn claim(seen: &mut Seen, route: &mut Table, me: &str, stream: bool) -> Claim {
    let key = |t: &Table| match stream {
        true => format!("stream {}", match_key(t)),
        false => match_key(t),
    };
    let parts: Vec<(String, Option<&str>)> =
        if route.contains_key("path_exact") && route.contains_key("path") {
            ["path_exact", "path"]
                .into_iter()
                .map(|drop| {
                    let mut one = route.clone();
                    one.remove(drop);
                    (key(&one), Some(drop))
                })
                .collect()
        } else {
            vec![(key(route), None)]
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

/// A Namespace's labels.
pub(super) type Labels = std::collections::BTreeMap<String, String>;

/// Whether a Namespace with `labels` (`None`: not known, or none) is one `selector` selects:
/// every `matchLabels` pair and every `matchExpressions` requirement (In, NotIn, Exists,
/// DoesNotExist) holds; an unknown operator selects nothing.
pub(super) fn selects(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: Option<&Labels>,
) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k));
    let pairs = selector.match_labels.iter().flatten();
    let labels_hold = pairs.into_iter().all(|(k, v)| get(k) == Some(v));
    let expressions = selector.match_expressions.iter().flatten();
    labels_hold
        && expressions.into_iter().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => get(&e.key).is_some(),
                "DoesNotExist" => get(&e.key).is_none(),
                _ => false,
            }
        })
}
