//! A route rule's `backendRefs` to one upstream group: each Service's ready endpoints (the
//! EndpointSlices, as for Ingresses), weighted so that each backendRef gets its `weight`'s
//! share whatever its number of endpoints; references across namespaces only with a
//! ReferenceGrant.

use k8s_openapi::api::core::v1::ServicePort;
use toml::{Table, Value};

use super::types::{ObjectRef, ReferenceGrant, GROUP};
use super::Cond;
use crate::kube::objects::{ready_addresses, World};

/// The Service backends of one rule, resolved.
pub struct Backends {
    /// The group's `servers` (empty: nothing to send to).
    pub servers: Vec<Value>,
    /// `ResolvedRefs` of the rule: the first refused reference.
    pub resolved: Cond,
    /// Some reference is valid (a Service that exists, allowed), ready endpoints or not.
    pub any_valid: bool,
    /// The valid references with a weight, whose endpoints make `servers`.
    pub refs: Vec<ServiceRef>,
}

/// A valid backendRef: the Service's namespace and name, its port, the weight.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceRef {
    pub ns: String,
    pub name: String,
    pub port: ServicePort,
    pub weight: u64,
}

/// The servers of `refs` from the EndpointSlices of `world`: what [`resolve`] gives.
pub fn servers_of(world: &World, refs: &[ServiceRef]) -> Vec<Value> {
    let usable: Vec<(u64, Vec<String>)> = refs
        .iter()
        .map(|r| (r.weight, ready_addresses(world, &r.ns, &r.name, &r.port)))
        .filter(|(_, addrs)| !addrs.is_empty())
        .collect();
    servers(&usable)
}

/// Whether a ReferenceGrant in `to_ns` lets a `from_kind` (of the Gateway API group) in
/// `from_ns` refer to the core object `to_kind` named `name`.
pub fn granted(
    grants: &[std::sync::Arc<ReferenceGrant>],
    from_kind: &str,
    from_ns: &str,
    to_kind: &str,
    to_ns: &str,
    name: &str,
) -> bool {
    grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(to_ns))
        .any(|g| {
            let from = g
                .spec
                .from
                .iter()
                .any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns);
            let to = g.spec.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == name)
            });
            from && to
        })
}

/// Resolves `refs` of a `kind` route in `ns`.
pub fn resolve(world: &World, kind: &str, ns: &str, refs: &[ObjectRef]) -> Backends {
    let mut resolved: Cond = Ok(());
    let mut refuse = |reason: &'static str, msg: String| {
        if resolved.is_ok() {
            resolved = Err((reason, msg));
        }
    };
    let mut valid = Vec::new();
    let mut any_valid = false;
    for r in refs {
        let group = r.group.as_deref().unwrap_or("");
        let rkind = r.kind.as_deref().unwrap_or("Service");
        if !group.is_empty() || rkind != "Service" {
            refuse(
                "InvalidKind",
                format!("backendRef {group}/{rkind} {}: only Services", r.name),
            );
            continue;
        }
        let to_ns = r.namespace.as_deref().unwrap_or(ns);
        if to_ns != ns && !granted(&world.grants, kind, ns, "Service", to_ns, &r.name) {
            refuse(
                "RefNotPermitted",
                format!(
                    "backendRef Service {to_ns}/{}: no ReferenceGrant in {to_ns} allows it",
                    r.name
                ),
            );
            continue;
        }
        let svc = world.services.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(to_ns)
                && s.metadata.name.as_deref() == Some(r.name.as_str())
        });
        let Some(svc) = svc else {
            refuse(
                "BackendNotFound",
                format!("Service {to_ns}/{} not found", r.name),
            );
            continue;
        };
        let port = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|ps| ps.iter().find(|p| Some(p.port) == r.port));
        let Some(port) = port else {
            refuse(
                "BackendNotFound",
                format!(
                    "Service {to_ns}/{} has no port {}",
                    r.name,
                    r.port.map_or("(none given)".into(), |p| p.to_string())
                ),
            );
            continue;
        };
        any_valid = true;
        let weight = u64::try_from(r.weight.unwrap_or(1)).unwrap_or(0);
        if weight > 0 {
            valid.push(ServiceRef {
                ns: to_ns.to_string(),
                name: r.name.clone(),
                port: port.clone(),
                weight,
            });
        }
    }
    Backends {
        servers: servers_of(world, &valid),
        resolved,
        any_valid,
        refs: valid,
    }
}

/// The group's servers: an endpoint of a reference with weight `w` and `n` endpoints weighs
/// `w * L / n` (`L`: the least common multiple of the `n`s), so each reference gets `w`'s
/// share. An address named by two references is listed twice (the group balances entries).
fn servers(usable: &[(u64, Vec<String>)]) -> Vec<Value> {
    let lcm = usable
        .iter()
        .fold(1u64, |l, (_, a)| lcm(l, a.len() as u64).min(1 << 20));
    let all_same = usable
        .iter()
        .all(|(w, a)| *w == usable[0].0 && a.len() == usable[0].1.len());
    let mut out = Vec::new();
    for (w, addrs) in usable {
        let each = (w * lcm / addrs.len() as u64).clamp(1, i64::MAX as u64);
        for a in addrs {
            if all_same {
                out.push(Value::from(a.as_str()));
            } else {
                let mut t = Table::new();
                t.insert("addr".into(), a.as_str().into());
                t.insert("weight".into(), Value::Integer(each as i64));
                out.push(Value::Table(t));
            }
        }
    }
    out
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    if a == 0 || b == 0 {
        a.max(b)
    } else {
        a / gcd(a, b) * b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_allows_its_from_kind_and_namespace_to_its_kind_and_name() {
        let g: ReferenceGrant = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "g", "namespace": "certs"},
            "spec": {"from": [{"group": GROUP, "kind": "Gateway", "namespace": "edge"}],
                     "to": [{"group": "", "kind": "Secret", "name": "wild"}]}}))
        .unwrap();
        let grants = [std::sync::Arc::new(g)];
        assert!(granted(
            &grants, "Gateway", "edge", "Secret", "certs", "wild"
        ));
        assert!(!granted(
            &grants, "Gateway", "edge", "Secret", "certs", "other"
        ));
        assert!(!granted(
            &grants,
            "HTTPRoute",
            "edge",
            "Secret",
            "certs",
            "wild"
        ));
        assert!(!granted(
            &grants, "Gateway", "shop", "Secret", "certs", "wild"
        ));
        assert!(!granted(
            &grants, "Gateway", "edge", "Service", "certs", "wild"
        ));
        assert!(!granted(
            &grants, "Gateway", "edge", "Secret", "edge", "wild"
        ));
    }

    #[test]
    fn each_reference_gets_its_weight_whatever_its_endpoints() {
        let s = servers(&[
            (3, vec!["a:1".into()]),
            (1, vec!["b:1".into(), "c:1".into()]),
        ]);
        let w: Vec<i64> = s
            .iter()
            .map(|v| v["weight"].as_integer().unwrap())
            .collect();
        // a: 3 * 2 / 1 = 6; b, c: 1 * 2 / 2 = 1 each: 6 to 2, i.e. 3 to 1.
        assert_eq!(w, [6, 1, 1]);
        let plain = servers(&[(1, vec!["a:1".into()]), (1, vec!["b:1".into()])]);
        assert_eq!(plain, [Value::from("a:1"), Value::from("b:1")]);
    }
}
