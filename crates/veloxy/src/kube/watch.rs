//! The watch caches: one reflector per kind and namespace (or one for all namespaces), each
//! driven by its own task. A watch that fails is retried with kube's default backoff while
//! its cache keeps the last objects it listed, so the served config stays. Every change (and
//! each completed list) wakes the provider's loop through one [`Notify`].

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::gateway::types::{
    Gateway, GatewayClass, GrpcRoute, HttpRoute, ReferenceGrant, TcpRoute, TlsRoute,
};
use super::objects::World;

/// The optional Gateway API kinds served (and allowed) besides the v1 core ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct GatewayKinds {
    /// TCPRoute.
    pub tcp: bool,
    /// TLSRoute.
    pub tls: bool,
    /// Namespaces (their labels, for listeners' `allowedRoutes.namespaces.selector`).
    pub namespaces: bool,
}

/// The caches of every watched kind.
pub struct Caches {
    ingresses: Vec<Store<Ingress>>,
    /// IngressClasses are cluster-wide: one store.
    classes: Vec<Store<IngressClass>>,
    services: Vec<Store<Service>>,
    slices: Vec<Store<EndpointSlice>>,
    secrets: Vec<Store<Secret>>,
    gateway_classes: Vec<Store<GatewayClass>>,
    gateways: Vec<Store<Gateway>>,
    http_routes: Vec<Store<HttpRoute>>,
    grpc_routes: Vec<Store<GrpcRoute>>,
    tcp_routes: Vec<Store<TcpRoute>>,
    tls_routes: Vec<Store<TlsRoute>>,
    grants: Vec<Store<ReferenceGrant>>,
    namespaces: Vec<Store<Namespace>>,
    /// One flag per watch: its first list is complete.
    listed: Vec<Arc<AtomicBool>>,
    /// Changes seen by the watches of every kind but EndpointSlice ([`World::others`]).
    others: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Caches {
    /// Starts the watches (on the current tokio runtime) in `namespaces` (empty: all); with
    /// `gateway`, those of the Gateway API too (TCPRoutes and TLSRoutes as it says).
    pub fn start(
        client: &Client,
        namespaces: &[String],
        gateway: Option<GatewayKinds>,
        changed: &Arc<Notify>,
    ) -> Caches {
        let mut c = Caches {
            ingresses: Vec::new(),
            classes: Vec::new(),
            services: Vec::new(),
            slices: Vec::new(),
            secrets: Vec::new(),
            gateway_classes: Vec::new(),
            gateways: Vec::new(),
            http_routes: Vec::new(),
            grpc_routes: Vec::new(),
            tcp_routes: Vec::new(),
            tls_routes: Vec::new(),
            grants: Vec::new(),
            namespaces: Vec::new(),
            listed: Vec::new(),
            others: Arc::default(),
            tasks: Vec::new(),
        };
        let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().map(|n| Some(n.as_str())).collect()
        };
        let all = watcher::Config::default();
        // Only the Secrets the provider reads (a cluster's Secrets are many): TLS ones, and
        // Opaque ones, where ingress-nginx's basic-auth users live (an htpasswd `auth` key,
        // or user -> hash with auth-secret-type: auth-map).
        let tls = watcher::Config::default().fields("type=kubernetes.io/tls");
        let opaque = watcher::Config::default().fields("type=Opaque");
        for ns in scopes {
            let store = c.watch(api(client, ns), all.clone(), "Ingress", changed);
            c.ingresses.push(store);
            let store = c.watch(api(client, ns), all.clone(), "Service", changed);
            c.services.push(store);
            let store = c.watch(api(client, ns), all.clone(), "EndpointSlice", changed);
            c.slices.push(store);
            let store = c.watch(api(client, ns), tls.clone(), "Secret", changed);
            c.secrets.push(store);
            let store = c.watch(api(client, ns), opaque.clone(), "Secret", changed);
            c.secrets.push(store);
            if let Some(kinds) = gateway {
                if kinds.tcp {
                    let store = c.watch(api(client, ns), all.clone(), "TCPRoute", changed);
                    c.tcp_routes.push(store);
                }
                if kinds.tls {
                    let store = c.watch(api(client, ns), all.clone(), "TLSRoute", changed);
                    c.tls_routes.push(store);
                }
                let store = c.watch(api(client, ns), all.clone(), "Gateway", changed);
                c.gateways.push(store);
                let store = c.watch(api(client, ns), all.clone(), "HTTPRoute", changed);
                c.http_routes.push(store);
                let store = c.watch(api(client, ns), all.clone(), "GRPCRoute", changed);
                c.grpc_routes.push(store);
                let store = c.watch(api(client, ns), all.clone(), "ReferenceGrant", changed);
                c.grants.push(store);
            }
        }
        if let Some(kinds) = gateway {
            let store = c.watch(
                Api::all(client.clone()),
                all.clone(),
                "GatewayClass",
                changed,
            );
            c.gateway_classes.push(store);
            if kinds.namespaces {
                let store = c.watch(Api::all(client.clone()), all.clone(), "Namespace", changed);
                c.namespaces.push(store);
            }
        }
        let store = c.watch(Api::all(client.clone()), all, "IngressClass", changed);
        c.classes.push(store);
        c
    }

    /// Whether every watch has completed its first list (a config built before would miss
    /// objects and drop their routes for a moment).
    pub fn listed(&self) -> bool {
        self.listed.iter().all(|f| f.load(Ordering::Acquire))
    }

    /// A copy of every cached object, each kind sorted by namespace and name (so that the
    /// same objects always translate into the same config).
    pub fn world(&self) -> World {
        // Read before the copies: a change between the two makes the next copy differ.
        let others = self.others.load(Ordering::Acquire);
        World {
            ingresses: sorted(&self.ingresses),
            classes: sorted(&self.classes),
            services: sorted(&self.services),
            slices: sorted(&self.slices),
            secrets: sorted(&self.secrets),
            gateway_classes: sorted(&self.gateway_classes),
            gateways: sorted(&self.gateways),
            http_routes: sorted(&self.http_routes),
            grpc_routes: sorted(&self.grpc_routes),
            tcp_routes: sorted(&self.tcp_routes),
            tls_routes: sorted(&self.tls_routes),
            grants: sorted(&self.grants),
            namespaces: sorted(&self.namespaces),
            slice_index: Default::default(),
            others,
        }
    }

    /// The EndpointSlices alone (unsorted: what is read of them does not depend on their
    /// order), with [`World::others`]: the input of an endpoint-only change.
    pub fn slices(&self) -> World {
        let others = self.others.load(Ordering::Acquire);
        World {
            slices: self.slices.iter().flat_map(Store::state).collect(),
            others,
            ..Default::default()
        }
    }

    /// Starts one reflector and the task that drives it.
    fn watch<K>(
        &mut self,
        api: Api<K>,
        config: watcher::Config,
        kind: &'static str,
        changed: &Arc<Notify>,
    ) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        let (reader, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
        let listed = Arc::new(AtomicBool::new(false));
        self.listed.push(listed.clone());
        let changed = changed.clone();
        let others = (kind != "EndpointSlice").then(|| self.others.clone());
        let bump = move || {
            if let Some(o) = &others {
                o.fetch_add(1, Ordering::AcqRel);
            }
        };
        self.tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut failing = false;
            while let Some(event) = stream.next().await {
                match event {
                    // The cache swaps in a new list when it is complete: one wake-up then.
                    Ok(Event::Init | Event::InitApply(_)) => {}
                    Ok(Event::InitDone) => {
                        if failing {
                            tracing::info!(kind, "kubernetes: watch resumed");
                            failing = false;
                        }
                        listed.store(true, Ordering::Release);
                        bump();
                        changed.notify_one();
                    }
                    Ok(Event::Apply(_) | Event::Delete(_)) => {
                        bump();
                        changed.notify_one();
                    }
                    Err(e) => {
                        // Logged once per outage, not at every retry.
                        if !failing {
                            tracing::warn!(kind, error = %e, "kubernetes: watch failed; retrying with backoff, the served config stays");
                        }
                        failing = true;
                    }
                }
            }
        }));
        reader
    }
}

impl Drop for Caches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Every object of `stores`, sorted by namespace and name.
fn sorted<K>(stores: &[Store<K>]) -> Vec<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    let mut all: Vec<Arc<K>> = stores.iter().flat_map(Store::state).collect();
    all.sort_by(|a, b| {
        let (a, b) = (a.meta(), b.meta());
        (a.namespace.as_deref(), a.name.as_deref())
            .cmp(&(b.namespace.as_deref(), b.name.as_deref()))
    });
    all
}

/// The API of `K` in `ns` (`None`: all namespaces).
fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}
