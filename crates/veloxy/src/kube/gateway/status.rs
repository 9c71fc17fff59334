//! Gateway API status, as the spec defines it: GatewayClass `Accepted`; Gateway `Accepted`
//! and `Programmed`, its listeners (supportedKinds, attachedRoutes, `Accepted`,
//! `Programmed`, `ResolvedRefs`) and addresses; each route's `parents[]` entry for our
//! Gateways (`Accepted`, `ResolvedRefs`, `PartiallyInvalid`), other controllers' entries
//! kept. Conditions carry the object's generation as `observedGeneration`; a condition
//! whose status did not change keeps its `lastTransitionTime`. A status is written only
//! when it differs from the object's (so the watch event of a write changes nothing).

use std::time::Duration;

use k8s_openapi::api::networking::v1::IngressLoadBalancerIngress;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::types::{Gateway, GatewayClass, GrpcRoute, HttpRoute, TcpRoute, TlsRoute, GROUP};
use super::{Cond, Report, CONTROLLER};
use crate::kube::objects::id;

/// How long one status write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes the status of `report`'s objects that differ; `addresses`: the Gateways'
/// (`status_address`, or the addresses of `publish_service`, as Ingresses get them).
pub async fn publish(client: &Client, report: &Report, addresses: &[IngressLoadBalancerIngress]) {
    let addresses: Vec<Value> = addresses.iter().filter_map(address_value).collect();
    for c in &report.classes {
        let old = c.status.clone().unwrap_or(Value::Null);
        let gen = c.metadata.generation;
        let want = json!({"conditions": [
            condition("Accepted", &Ok(()), "Accepted", gen, &old),
        ]});
        if !subset(&want, &old) {
            let api: Api<GatewayClass> = Api::all(client.clone());
            let name = c.metadata.name.clone().unwrap_or_default();
            write(api, &name, want, &format!("GatewayClass {name}")).await;
        }
    }
    for g in &report.gateways {
        let gw = &g.gateway;
        let old = gw.status.clone().unwrap_or(Value::Null);
        let own;
        let addresses = match g.address {
            Some(a) => {
                own = [json!({"type": "IPAddress", "value": a.to_string()})];
                &own[..]
            }
            None => &addresses[..],
        };
        let want = gateway(g, addresses, &old);
        if !subset(&want, &old) {
            let ns = gw.metadata.namespace.as_deref().unwrap_or("default");
            let api: Api<Gateway> = Api::namespaced(client.clone(), ns);
            let name = gw.metadata.name.clone().unwrap_or_default();
            write(api, &name, want, &format!("Gateway {}", id(&gw.metadata))).await;
        }
    }
    for r in &report.routes {
        route(client, r).await;
    }
}

/// Removes our `parents[]` entries from the routes of `world` that no longer name one of
/// our Gateways (other controllers' entries stay).
pub async fn clear_stale(client: &Client, report: &Report, world: &crate::kube::objects::World) {
    let reported = |uid: &Option<String>| report.routes.iter().any(|r| r.meta.uid == *uid);
    let http = world
        .http_routes
        .iter()
        .map(|r| ("HTTPRoute", &r.metadata, &r.status));
    let grpc = world
        .grpc_routes
        .iter()
        .map(|r| ("GRPCRoute", &r.metadata, &r.status));
    let tcp = world
        .tcp_routes
        .iter()
        .map(|r| ("TCPRoute", &r.metadata, &r.status));
    let tls = world
        .tls_routes
        .iter()
        .map(|r| ("TLSRoute", &r.metadata, &r.status));
    for (kind, meta, status) in http.chain(grpc).chain(tcp).chain(tls) {
        let parents = status.as_ref().and_then(|s| s["parents"].as_array());
        let Some(parents) = parents else { continue };
        if reported(&meta.uid) || !parents.iter().any(|p| p["controllerName"] == CONTROLLER) {
            continue;
        }
        let report = super::RouteReport {
            kind,
            meta: meta.clone(),
            status: status.clone(),
            parents: Vec::new(),
        };
        route(client, &report).await;
    }
}

/// A Gateway's status.
fn gateway(g: &super::GatewayReport, addresses: &[Value], old: &Value) -> Value {
    let gen = g.gateway.metadata.generation;
    let mut listeners = Vec::new();
    for (i, l) in g.listeners.iter().enumerate() {
        let old_l = &old["listeners"][i];
        let kinds: Vec<Value> = l
            .kinds
            .iter()
            .map(|k| json!({"group": GROUP, "kind": k}))
            .collect();
        let programmed: Cond = match &l.accepted {
            Ok(()) => l
                .resolved
                .clone()
                .map_err(|_| ("Invalid", "invalid references".into())),
            Err(_) => Err(("Invalid", "not accepted".into())),
        };
        listeners.push(json!({
            "name": l.name,
            "supportedKinds": kinds,
            "attachedRoutes": l.attached,
            "conditions": [
                condition("Accepted", &l.accepted, "Accepted", gen, old_l),
                condition("Programmed", &programmed, "Programmed", gen, old_l),
                condition("ResolvedRefs", &l.resolved, "ResolvedRefs", gen, old_l),
                condition("Conflicted", &Err(("NoConflicts", String::new())), "", gen, old_l),
            ],
        }));
    }
    let valid = g
        .listeners
        .iter()
        .all(|l| l.accepted.is_ok() && l.resolved.is_ok());
    let any = g.listeners.iter().any(|l| l.accepted.is_ok());
    let accepted: Cond = if valid || any {
        Ok(())
    } else {
        Err(("ListenersNotValid", "no listener is valid".into()))
    };
    let programmed: Cond = if any {
        Ok(())
    } else {
        Err(("Invalid", "no listener is served".into()))
    };
    let mut want = json!({
        "conditions": [
            // Accepted with some listeners invalid: the reason says so.
            condition("Accepted", &accepted, if valid { "Accepted" } else { "ListenersNotValid" }, gen, old),
            condition("Programmed", &programmed, "Programmed", gen, old),
        ],
        "listeners": listeners,
    });
    if !addresses.is_empty() {
        want["addresses"] = Value::Array(addresses.to_vec());
    }
    want
}

/// A `status.addresses[]` entry.
fn address_value(a: &IngressLoadBalancerIngress) -> Option<Value> {
    match (&a.ip, &a.hostname) {
        (Some(ip), _) => Some(json!({"type": "IPAddress", "value": ip})),
        (None, Some(h)) => Some(json!({"type": "Hostname", "value": h})),
        (None, None) => None,
    }
}

/// A route's `parents[]`: ours replaced, other controllers' kept.
async fn route(client: &Client, r: &super::RouteReport) {
    let gen = r.meta.generation;
    let ns = r.meta.namespace.as_deref().unwrap_or("default");
    let name = r.meta.name.clone().unwrap_or_default();
    // The current status, from the watch cache's copy carried in the report.
    let old = r.status.clone().unwrap_or(Value::Null);
    let old_parents = old["parents"].as_array().cloned().unwrap_or_default();
    let mut parents: Vec<Value> = old_parents
        .iter()
        .filter(|p| p["controllerName"] != CONTROLLER)
        .cloned()
        .collect();
    for p in &r.parents {
        let pref = serde_json::to_value(&p.parent).unwrap_or(Value::Null);
        let old_p = old_parents
            .iter()
            .find(|o| o["controllerName"] == CONTROLLER && subset(&pref, &o["parentRef"]))
            .cloned()
            .unwrap_or(Value::Null);
        let mut conditions = vec![
            condition("Accepted", &p.accepted, "Accepted", gen, &old_p),
            condition("ResolvedRefs", &p.resolved, "ResolvedRefs", gen, &old_p),
        ];
        if let Some(why) = &p.partially_invalid {
            conditions.push(condition(
                "PartiallyInvalid",
                &Err(("UnsupportedValue", why.clone())),
                "",
                gen,
                &old_p,
            ));
            // PartiallyInvalid is true: the rest of the route is served.
            if let Some(c) = conditions.last_mut() {
                c["status"] = "True".into();
            }
        }
        parents.push(json!({"parentRef": pref, "controllerName": CONTROLLER,
                            "conditions": conditions}));
    }
    let want = json!({"parents": parents});
    if subset(&want, &old) {
        return;
    }
    let what = format!("{} {ns}/{name}", r.kind);
    match r.kind {
        "HTTPRoute" => {
            let api: Api<HttpRoute> = Api::namespaced(client.clone(), ns);
            write(api, &name, want, &what).await;
        }
        "TCPRoute" => {
            let api: Api<TcpRoute> = Api::namespaced(client.clone(), ns);
            write(api, &name, want, &what).await;
        }
        "TLSRoute" => {
            let api: Api<TlsRoute> = Api::namespaced(client.clone(), ns);
            write(api, &name, want, &what).await;
        }
        _ => {
            let api: Api<GrpcRoute> = Api::namespaced(client.clone(), ns);
            write(api, &name, want, &what).await;
        }
    }
}

/// A condition of `type_`: true with `ok_reason`, or false with the reason and message of
/// `c`; its `lastTransitionTime` kept from `old`'s condition of that type when the status is
/// the same.
fn condition(type_: &str, c: &Cond, ok_reason: &str, gen: Option<i64>, old: &Value) -> Value {
    let (status, reason, message) = match c {
        Ok(()) => ("True", ok_reason, ""),
        Err((r, m)) => ("False", *r, m.as_str()),
    };
    let prev = old["conditions"].as_array().and_then(|cs| {
        cs.iter()
            .find(|c| c["type"] == type_ && c["status"] == status)
    });
    let since = prev
        .and_then(|p| p["lastTransitionTime"].as_str().map(str::to_owned))
        .unwrap_or_else(now);
    let mut v = json!({"type": type_, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": since});
    if let Some(g) = gen {
        v["observedGeneration"] = g.into();
    }
    v
}

/// Now as RFC 3339 (seconds).
fn now() -> String {
    let ts = k8s_openapi::jiff::Timestamp::now();
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Whether every value of `want` is in `have` (objects: each key; arrays: same length, each
/// element): what the API server adds (defaults) does not count as a difference.
fn subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| subset(v, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| subset(a, b))
        }
        (w, h) => w == h,
    }
}

/// Merge-patches `status` of `name` with `want`.
async fn write<K>(api: Api<K>, name: &str, want: Value, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"status": want});
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let result = api.patch_status(name, &params, &patch);
    match tokio::time::timeout(WRITE_TIMEOUT, result).await {
        Ok(Ok(_)) => tracing::debug!(object = %what, "kubernetes: status written"),
        Ok(Err(e)) => {
            crate::kube::status::failed();
            tracing::warn!(object = %what, error = %e, "kubernetes: status not written")
        }
        Err(_) => {
            crate::kube::status::failed();
            tracing::warn!(object = %what, "kubernetes: status not written: timed out")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_added_by_the_server_are_no_difference() {
        let want =
            json!({"parents": [{"parentRef": {"name": "gw"}, "conditions": [{"type": "A"}]}]});
        let have = json!({"parents": [{"parentRef": {"name": "gw", "group": "g"},
                          "conditions": [{"type": "A", "x": 1}]}]});
        assert!(subset(&want, &have));
        assert!(!subset(&have, &want));
        let longer = json!({"parents": [{"parentRef": {"name": "gw"}, "conditions": [{"type": "A"}, {"type": "B"}]}]});
        assert!(!subset(&longer, &have));
    }
}
