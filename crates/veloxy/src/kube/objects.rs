//! From the watched objects to the ingress importer's input: which Ingresses are ours (by
//! class), the documents the importer reads (Ingresses with their class fields removed, the
//! Services and TLS Secrets they name) and each Service port's ready endpoints as the
//! importer's `services` map (`NAME.NAMESPACE:PORT` -> `ADDR:PORT,...`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde::Serialize;

use super::gateway::types::{
    Gateway, GatewayClass, GrpcRoute, HttpRoute, ReferenceGrant, TcpRoute, TlsRoute,
};
use veloxy_engine::config::KubernetesSpec;
use veloxy_import::tree::{self, Node};

/// The legacy class annotation, read before `spec.ingressClassName` existed.
pub const LEGACY_CLASS: &str = "kubernetes.io/ingress.class";
/// The `spec.controller` of an IngressClass whose Ingresses veloxy serves.
pub const CONTROLLER: &str = "veloxy.dev/ingress-controller";
/// The annotation that makes an IngressClass the default one.
const DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
/// The label that ties an EndpointSlice to its Service.
pub(super) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Everything the translation reads, copied out of the watch caches.
#[derive(Default)]
pub struct World {
    pub ingresses: Vec<Arc<Ingress>>,
    pub classes: Vec<Arc<IngressClass>>,
    pub services: Vec<Arc<Service>>,
    pub slices: Vec<Arc<EndpointSlice>>,
    pub secrets: Vec<Arc<Secret>>,
    /// Gateway API objects (empty when the API server does not serve its CRDs).
    pub gateway_classes: Vec<Arc<GatewayClass>>,
    pub gateways: Vec<Arc<Gateway>>,
    pub http_routes: Vec<Arc<HttpRoute>>,
    pub grpc_routes: Vec<Arc<GrpcRoute>>,
    /// TCPRoutes and TLSRoutes (empty when their CRDs are not served).
    pub tcp_routes: Vec<Arc<TcpRoute>>,
    pub tls_routes: Vec<Arc<TlsRoute>>,
    pub grants: Vec<Arc<ReferenceGrant>>,
    /// Namespaces (their labels), when Gateway API is served.
    pub namespaces: Vec<Arc<k8s_openapi::api::core::v1::Namespace>>,
    /// `slices` by (namespace, Service name), built on first use: each Service's lookup
    /// reads its own slices, not all of them (1,000 Services: a million label reads before).
    pub slice_index: std::sync::OnceLock<HashMap<(String, String), Vec<usize>>>,
    /// How many changes the watches of every kind but EndpointSlice had seen when this copy
    /// was made: equal in two copies, only EndpointSlices changed between them.
    pub others: u64,
}

impl World {
    /// The EndpointSlices labelled as the Service `ns/name`'s.
    pub fn slices_of(&self, ns: &str, name: &str) -> impl Iterator<Item = &EndpointSlice> {
        let index = self.slice_index.get_or_init(|| {
            let mut index: HashMap<(String, String), Vec<usize>> = HashMap::new();
            for (i, slice) in self.slices.iter().enumerate() {
                let m = &slice.metadata;
                let Some(svc) = m.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
                    continue;
                };
                let ns = m.namespace.as_deref().unwrap_or("default");
                index.entry((ns.into(), svc.clone())).or_default().push(i);
            }
            index
        });
        index
            .get(&(ns.to_string(), name.to_string()))
            .into_iter()
            .flatten()
            .map(|&i| &*self.slices[i])
    }
}

/// `NAMESPACE/NAME` of an object.
pub fn id(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// Whether veloxy serves `ing`: its class (`spec.ingressClassName`, else the legacy
/// annotation) is `ingress_class`, `nginx` with `ingress_nginx`, or an IngressClass whose
/// controller is veloxy's; an Ingress without a class is served when the IngressClass named
/// `ingress_class` is the cluster's default.
pub fn ours(ing: &Ingress, spec: &KubernetesSpec, classes: &[Arc<IngressClass>]) -> bool {
    let class = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEGACY_CLASS).cloned())
        });
    let named = |name: &str| {
        classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
    };
    match class {
        Some(c) => {
            c == spec.ingress_class
                || (spec.ingress_nginx && c == "nginx")
                || named(&c)
                    .and_then(|k| k.spec.as_ref()?.controller.as_deref())
                    .is_some_and(|ctl| ctl == CONTROLLER)
        }
        None => named(&spec.ingress_class).is_some_and(|k| {
            k.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS))
                .is_some_and(|v| v == "true")
        }),
    }
}

/// The documents of the last build by kind and `NS/NAME`, with the resourceVersion they were
/// made from: an object that did not change is not serialized and parsed again (a third of
/// a translation's time at 1,000 Ingresses, which EndpointSlice churn repeats every half
/// second).
#[derive(Default)]
pub struct DocCache {
    nodes: HashMap<(&'static str, String), (String, Option<Node>)>,
}

impl DocCache {
    /// The importer's input for `ingresses`: their documents, then those of the Services and
    /// Secrets of their namespaces. Class fields are removed (the class was decided here, and
    /// the importer would otherwise skip classes it takes for another controller's). What this
    /// cache made for unchanged objects is reused; it then holds this call's documents only.
    pub fn documents(&mut self, world: &World, ingresses: &[Arc<Ingress>]) -> Vec<Node> {
        let mut next = HashMap::with_capacity(self.nodes.len());
        let mut docs = Vec::new();
        let mut take = |kind: &'static str, meta: &ObjectMeta, make: &dyn Fn() -> Option<Node>| {
            let key = (kind, id(meta));
            let version = meta.resource_version.clone().unwrap_or_default();
            let node = match self.nodes.remove(&key) {
                Some((v, node)) if !version.is_empty() && v == version => node,
                _ => make(),
            };
            docs.extend(node.clone());
            next.insert(key, (version, node));
        };
        documents_with(world, ingresses, &mut take);
        self.nodes = next;
        docs
    }
}

type ObjectMeta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// What [`documents_with`] hands each object to: its kind, metadata and document maker.
type Take<'t> = &'t mut dyn FnMut(&'static str, &ObjectMeta, &dyn Fn() -> Option<Node>);

/// Calls `take` with each object's kind, metadata and a maker of its document.
fn documents_with(world: &World, ingresses: &[Arc<Ingress>], take: Take<'_>) {
    let namespaces: std::collections::HashSet<&str> = ingresses
        .iter()
        .map(|i| i.metadata.namespace.as_deref().unwrap_or("default"))
        .collect();
    let in_scope = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        namespaces.contains(&m.namespace.as_deref().unwrap_or("default"))
    };
    for ing in ingresses {
        take("Ingress", &ing.metadata, &|| {
            let mut ing = (**ing).clone();
            ing.metadata.managed_fields = None;
            ing.status = None;
            if let Some(s) = ing.spec.as_mut() {
                s.ingress_class_name = None;
            }
            if let Some(a) = ing.metadata.annotations.as_mut() {
                a.remove(LEGACY_CLASS);
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
            }
            document("Ingress", &ing.metadata, &ing)
        });
    }
    for s in world.services.iter().filter(|s| in_scope(&s.metadata)) {
        take("Service", &s.metadata, &|| {
            let mut s = (**s).clone();
            s.metadata.managed_fields = None;
            document("Service", &s.metadata, &s)
        });
    }
    for s in world.secrets.iter().filter(|s| in_scope(&s.metadata)) {
        take("Secret", &s.metadata, &|| {
            let mut s = (**s).clone();
            s.metadata.managed_fields = None;
            document("Secret", &s.metadata, &s)
        });
    }
}

/// One object as a located document (its report lines name `KIND NS/NAME`).
fn document<T: Serialize>(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    obj: &T,
) -> Option<Node> {
    let name: Arc<str> = format!("{kind} {}", id(meta)).into();
    let text = serde_json::to_string(obj).ok()?;
    match tree::parse_yaml(&name, &text) {
        Ok(mut d) => d.pop(),
        Err(e) => {
            tracing::warn!(object = %name, error = %e, "kubernetes: object left out: its JSON does not read back");
            None
        }
    }
}

/// For every port of every Service of `world`: its ready endpoints, under the keys the
/// importer looks up: `NAME.NAMESPACE:PORT` and, for a named port, `NAME.NAMESPACE:PORTNAME`.
/// A port with no ready endpoint, and a Service port an Ingress of `ingresses` names that does
/// not exist, map to an empty list (their routes answer 503). ExternalName Services are left
/// to the importer (their DNS name).
pub fn endpoints(world: &World, ingresses: &[Arc<Ingress>]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for svc in &world.services {
        if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            continue;
        }
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let Some(name) = svc.metadata.name.as_deref() else {
            continue;
        };
        let ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref());
        for port in ports.into_iter().flatten() {
            let addrs = ready_addresses(world, ns, name, port).join(",");
            out.insert(format!("{name}.{ns}:{}", port.port), addrs.clone());
            if let Some(pn) = port.name.as_deref().filter(|n| !n.is_empty()) {
                out.insert(format!("{name}.{ns}:{pn}"), addrs);
            }
        }
    }
    let services: std::collections::HashSet<(&str, &str)> = (world.services.iter())
        .filter_map(|s| {
            let ns = s.metadata.namespace.as_deref().unwrap_or("default");
            Some((ns, s.metadata.name.as_deref()?))
        })
        .collect();
    for ing in ingresses {
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        for b in backends(ing) {
            let Some(port) = b.port.as_ref() else {
                continue;
            };
            let port = match (&port.name, port.number) {
                (Some(n), _) if !n.is_empty() => n.clone(),
                (_, Some(n)) => n.to_string(),
                _ => continue,
            };
            if !services.contains(&(ns, b.name.as_str())) {
                out.entry(format!("{}.{ns}:{port}", b.name)).or_default();
            }
        }
    }
    out
}

/// The Service backends an Ingress names (its default backend and each path's).
fn backends(ing: &Ingress) -> Vec<&k8s_openapi::api::networking::v1::IngressServiceBackend> {
    let Some(spec) = ing.spec.as_ref() else {
        return Vec::new();
    };
    let paths = spec
        .rules
        .iter()
        .flatten()
        .filter_map(|r| r.http.as_ref())
        .flat_map(|h| h.paths.iter());
    spec.default_backend
        .iter()
        .chain(paths.map(|p| &p.backend))
        .filter_map(|b| b.service.as_ref())
        .collect()
}

/// `ADDR:PORT` of each ready endpoint of the Service `ns/name` for `port`: the EndpointSlices
/// labelled with the Service's name, their port of the same name (the resolved targetPort).
pub fn ready_addresses(world: &World, ns: &str, name: &str, port: &ServicePort) -> Vec<String> {
    let want = port.name.as_deref().unwrap_or("");
    let mut out = Vec::new();
    for slice in world.slices_of(ns, name) {
        let number = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or("") == want)
            .and_then(|p| p.port);
        let Some(number) = number else { continue };
        for e in &slice.endpoints {
            let c = e.conditions.as_ref();
            // ready unset means ready (the API's documented default); terminating ones are
            // not sent new requests.
            if c.and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for a in &e.addresses {
                let hostport = if a.contains(':') {
                    format!("[{a}]:{number}")
                } else {
                    format!("{a}:{number}")
                };
                if !out.contains(&hostport) {
                    out.push(hostport);
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nginx: bool) -> KubernetesSpec {
        KubernetesSpec {
            ingress_nginx: nginx,
            ..crate::kube::test_spec()
        }
    }

    fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn ing(class: Option<&str>, legacy: Option<&str>) -> Ingress {
        let mut v = serde_json::json!({"metadata": {"name": "i", "namespace": "ns"},
            "spec": {"rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix",
              "backend": {"service": {"name": "web", "port": {"name": "http"}}}}]}}]}});
        if let Some(c) = class {
            v["spec"]["ingressClassName"] = c.into();
        }
        if let Some(c) = legacy {
            v["metadata"]["annotations"] = serde_json::json!({ LEGACY_CLASS: c });
        }
        serde_json::from_value(v).unwrap()
    }

    fn class(name: &str, controller: &str, default: bool) -> Arc<IngressClass> {
        from_json(serde_json::json!({"metadata": {"name": name, "annotations":
            { DEFAULT_CLASS: default.to_string() }}, "spec": {"controller": controller}}))
    }

    #[test]
    fn ingresses_are_ours_by_class_name_annotation_controller_or_default() {
        let none: &[Arc<IngressClass>] = &[];
        assert!(ours(&ing(Some("veloxy"), None), &spec(false), none));
        assert!(ours(&ing(None, Some("veloxy")), &spec(false), none));
        assert!(!ours(
            &ing(Some("traefik"), Some("veloxy")),
            &spec(false),
            none
        ));
        assert!(!ours(&ing(Some("nginx"), None), &spec(false), none));
        assert!(ours(&ing(Some("nginx"), None), &spec(true), none));
        let mine = [class("edge", CONTROLLER, false)];
        assert!(ours(&ing(Some("edge"), None), &spec(false), &mine));
        assert!(!ours(&ing(None, None), &spec(false), none));
        let default = [class("veloxy", CONTROLLER, true)];
        assert!(ours(&ing(None, None), &spec(false), &default));
    }

    #[test]
    fn endpoints_are_the_ready_addresses_of_the_named_slice_port() {
        let svc = from_json(
            serde_json::json!({"metadata": {"name": "web", "namespace": "ns"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "web"}]}}),
        );
        let slice = from_json(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "ns",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "other", "port": 9}],
            "endpoints": [
                {"addresses": ["192.0.2.11"], "conditions": {"ready": true}},
                {"addresses": ["192.0.2.10"]},
                {"addresses": ["192.0.2.12"], "conditions": {"ready": false}}]}));
        let world = World {
            services: vec![svc],
            slices: vec![slice],
            ..Default::default()
        };
        let ings = [Arc::new(ing(Some("veloxy"), None))];
        let map = endpoints(&world, &ings);
        let want = "192.0.2.10:8080,192.0.2.11:8080";
        assert_eq!(map.get("web.ns:80").map(String::as_str), Some(want));
        assert_eq!(map.get("web.ns:http").map(String::as_str), Some(want));
        let missing = endpoints(&World::default(), &ings);
        assert_eq!(missing.get("web.ns:http").map(String::as_str), Some(""));
    }
}
