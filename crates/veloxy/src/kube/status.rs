//! Ingress status: `status.loadBalancer.ingress` of each served Ingress is set to the
//! configured address (`status_address`, or the addresses of `publish_service`), written
//! only when it differs, so the watch event the write causes changes nothing; an Ingress no
//! longer served (moved to another class) has that address cleared again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use veloxy_engine::config::StatusAddress;

use super::objects::{id, World};

/// How long one status write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The `loadBalancer.ingress` entries for `status` (empty: nothing known to publish yet).
pub fn desired(status: &StatusAddress, world: &World) -> Vec<IngressLoadBalancerIngress> {
    let ip = |ip: String| IngressLoadBalancerIngress {
        ip: Some(ip),
        ..Default::default()
    };
    match status {
        StatusAddress::Ip(a) => vec![ip(a.to_string())],
        StatusAddress::Hostname(h) => vec![IngressLoadBalancerIngress {
            hostname: Some(h.clone()),
            ..Default::default()
        }],
        StatusAddress::Service { namespace, name } => {
            let Some(svc) = world.services.iter().find(|s| {
                s.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && s.metadata.name.as_deref() == Some(name.as_str())
            }) else {
                return Vec::new();
            };
            let lb = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref());
            let from_lb: Vec<_> = lb
                .into_iter()
                .flatten()
                .map(|i| IngressLoadBalancerIngress {
                    ip: i.ip.clone(),
                    hostname: i.hostname.clone(),
                    ..Default::default()
                })
                .collect();
            if !from_lb.is_empty() {
                return from_lb;
            }
            let spec = svc.spec.as_ref();
            let external = spec
                .and_then(|s| s.external_ips.clone())
                .unwrap_or_default();
            if !external.is_empty() {
                return external.into_iter().map(ip).collect();
            }
            spec.and_then(|s| s.cluster_ip.clone())
                .filter(|c| !c.is_empty() && c != "None")
                .map(ip)
                .into_iter()
                .collect()
        }
    }
}

/// Writes `want` into the status of each Ingress of `served` whose status differs, and
/// clears it from the Ingresses of `all` that are no longer served (moved to another class,
/// Set when a status or Event write failed. The endpoint-only path writes no status, so the
/// next rebuild after a failure takes the full path, which writes again: a failed write is
/// retried at the next change of any kind, EndpointSlices included.
static WRITE_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes a failed status or Event write (see [`WRITE_FAILED`]).
pub fn failed() {
    WRITE_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether a write failed since the last call.
pub fn take_failed() -> bool {
    WRITE_FAILED.swap(false, std::sync::atomic::Ordering::Relaxed)
}

/// or refused) but still carry exactly `want`: another controller's address is left alone.
pub async fn publish(
    client: &Client,
    served: &[Arc<Ingress>],
    all: &[Arc<Ingress>],
    want: &[IngressLoadBalancerIngress],
) {
    if want.is_empty() {
        return;
    }
    let current = |ing: &Ingress| {
        ing.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.clone())
            .unwrap_or_default()
    };
    for ing in served {
        if current(ing) != want {
            write(client, ing, serde_json::json!(want)).await;
        }
    }
    let is_served = |ing: &Ingress| served.iter().any(|s| s.metadata.uid == ing.metadata.uid);
    for ing in all {
        if current(ing) == want && !is_served(ing) {
            write(client, ing, serde_json::Value::Null).await;
        }
    }
}

/// Sets (or, with `null`, removes) `status.loadBalancer.ingress` of `ing`.
async fn write(client: &Client, ing: &Ingress, addresses: serde_json::Value) {
    let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
    let Some(name) = ing.metadata.name.as_deref() else {
        return;
    };
    let what = if addresses.is_null() {
        "cleared"
    } else {
        "written"
    };
    let api: Api<Ingress> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": addresses}}});
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let result = api.patch_status(name, &params, &patch);
    match tokio::time::timeout(WRITE_TIMEOUT, result).await {
        Ok(Ok(_)) => tracing::debug!(ingress = %id(&ing.metadata), "kubernetes: status {what}"),
        Ok(Err(e)) => {
            failed();
            tracing::warn!(ingress = %id(&ing.metadata), error = %e, "kubernetes: Ingress status not {what}")
        }
        Err(_) => {
            failed();
            tracing::warn!(ingress = %id(&ing.metadata), "kubernetes: Ingress status not {what}: timed out")
        }
    }
}
