//! Endpoint-only changes without a translation. Under EndpointSlice churn (pods starting,
//! stopping, turning unready) nothing but the servers of some groups changes, yet a full
//! build translates every Ingress and route again (tens of milliseconds at a thousand
//! Ingresses, every half second). A full build therefore leaves a [`Plan`]: for each group
//! whose servers are a function of EndpointSlices, how to make them again (the ingress
//! importer's [`GroupSource`] with the Service ports its keys name, or a Gateway API rule's
//! backendRefs), and the slices of each Service as seen. When the watches say that only
//! EndpointSlices changed since (see [`World::others`]), the groups of the Services whose
//! slices changed get their servers recomputed and, when only plain sets changed, applied in
//! place ([`super::in_place`]). Anything else — a Service whose endpoints the translation
//! reads for more than a group's servers (an auth service, a rule or group left out for
//! having none), a set becoming empty, a server entry that is not plain — takes the full
//! build, so the result is the one a full build would give.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hasher as _;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use toml::Value;
use veloxy_import_ingress::groups::{GroupSource, Sources};

use super::gateway::backends::{self, ServiceRef};
use super::in_place::{self, Servers, Sets};
use super::merge::PREFIX;
use super::objects::{ready_addresses, World, SERVICE_NAME_LABEL};

/// A Service: (namespace, name).
type Svc = (String, String);

/// How one group's servers are made from the EndpointSlices.
enum Recipe {
    /// An Ingress group: the importer's source, with the Service port each of its keys
    /// names (`None`: no such Service, an empty list).
    Ingress(GroupSource, Vec<Option<(Svc, ServicePort)>>),
    /// A Gateway API rule's group.
    Gateway(Vec<ServiceRef>),
}

impl Recipe {
    fn servers(&self, world: &World) -> Vec<Value> {
        match self {
            Recipe::Ingress(source, ports) => source.servers(|key| {
                let at = source.keys.iter().position(|(k, _)| k == key);
                match at.and_then(|i| ports[i].as_ref()) {
                    Some(((ns, name), port)) => ready_addresses(world, ns, name, port).join(","),
                    None => String::new(),
                }
            }),
            Recipe::Gateway(refs) => backends::servers_of(world, refs),
        }
    }
}

/// What a full build leaves for endpoint-only changes.
pub(super) struct Plan {
    /// The fingerprint's hasher after the structure (the servers are fed to a clone).
    structure: DefaultHasher,
    /// The servers of the config applied.
    pub(super) servers: Servers,
    recipes: BTreeMap<String, Recipe>,
    /// The groups made from each Service's endpoints.
    by_service: HashMap<Svc, Vec<String>>,
    /// Services whose endpoints the translation read for more than a group's servers.
    opaque: BTreeSet<Svc>,
    /// Each Service's slices as last seen: (name, resourceVersion), sorted.
    versions: HashMap<Svc, Vec<(String, String)>>,
    /// [`World::others`] at the build.
    others: u64,
}

/// What a full build's translation says about where servers come from.
pub(super) struct Origins {
    pub structure: DefaultHasher,
    /// The ingress importer's sources (`None`: no Ingress translated).
    pub ingress: Option<Sources>,
    /// The Gateway API groups and their backendRefs.
    pub gateway: Vec<(String, Vec<ServiceRef>)>,
    /// Services of Gateway API rules left without a group.
    pub gateway_opaque: BTreeSet<Svc>,
}

impl Plan {
    /// The plan of a full build of `world` that applied `servers`.
    pub fn new(world: &World, origins: Origins, servers: Servers) -> Plan {
        let mut recipes = BTreeMap::new();
        let mut opaque = origins.gateway_opaque;
        if let Some(sources) = origins.ingress {
            let services: HashMap<(&str, &str), &Service> = (world.services.iter())
                .filter_map(|s| {
                    let ns = s.metadata.namespace.as_deref().unwrap_or("default");
                    Some(((ns, s.metadata.name.as_deref()?), &**s))
                })
                .collect();
            opaque.extend(sources.opaque.iter().filter_map(|k| service_of(k)));
            for source in sources.groups {
                let name = format!("{PREFIX}{}", source.group);
                let ports: Vec<_> = (source.keys.iter())
                    .map(|(k, _)| service_port(&services, k))
                    .collect();
                if !servers.plain.contains_key(&name) {
                    // Left out for having no server: a change adds a group.
                    let keys = source.keys.iter();
                    opaque.extend(keys.filter_map(|(k, _)| service_of(k)));
                    continue;
                }
                recipes.insert(name, Recipe::Ingress(source, ports));
            }
        }
        for (group, refs) in origins.gateway {
            recipes.insert(group, Recipe::Gateway(refs));
        }
        let mut by_service: HashMap<Svc, Vec<String>> = HashMap::new();
        for (group, recipe) in &recipes {
            let services: Vec<Svc> = match recipe {
                Recipe::Ingress(_, ports) => {
                    ports.iter().flatten().map(|(s, _)| s.clone()).collect()
                }
                Recipe::Gateway(refs) => refs
                    .iter()
                    .map(|r| (r.ns.clone(), r.name.clone()))
                    .collect(),
            };
            for s in services {
                let groups = by_service.entry(s).or_default();
                if !groups.contains(group) {
                    groups.push(group.clone());
                }
            }
        }
        Plan {
            structure: origins.structure,
            servers,
            recipes,
            by_service,
            opaque,
            versions: versions(world),
            others: world.others,
        }
    }

    /// The new sets for `world` (which holds the EndpointSlices), and the fingerprint of the
    /// config they make, when only EndpointSlices changed and only plain sets follow;
    /// `None` when a full build is needed. The plan takes the new state when
    /// [`Plan::commit`] is called with what this returns.
    pub fn changes(&self, world: &World) -> Option<Update> {
        if world.others != self.others {
            return None;
        }
        let now = versions(world);
        let mut changed: BTreeSet<Svc> = BTreeSet::new();
        for (svc, v) in &now {
            if self.versions.get(svc) != Some(v) {
                changed.insert(svc.clone());
            }
        }
        let gone = self.versions.keys().filter(|s| !now.contains_key(*s));
        changed.extend(gone.cloned());
        if changed.iter().any(|s| self.opaque.contains(s)) {
            return None;
        }
        let groups: BTreeSet<&String> = (changed.iter())
            .filter_map(|s| self.by_service.get(s))
            .flatten()
            .collect();
        let mut values = Vec::new();
        let mut sets = Sets::new();
        for group in groups {
            let next = Value::Array(self.recipes[group].servers(world));
            if self.servers.value(group) == Some(&next) {
                continue;
            }
            let have = self.servers.plain.get(group)?;
            let want = in_place::plain(&next);
            match (have, want) {
                (_, w) if *have == w => {}
                (Some(_), Some(w)) if !w.is_empty() => sets.push((group.clone(), w)),
                _ => return None,
            }
            values.push((group.clone(), next));
        }
        Some(Update {
            sets,
            values,
            versions: now,
            services: changed.len(),
        })
    }

    /// Takes `update` (applied) as the running state; returns the config's new fingerprint.
    pub fn commit(&mut self, update: Update) -> u64 {
        for (group, value) in update.values {
            self.servers.set(&group, value);
        }
        self.versions = update.versions;
        let mut h = self.structure.clone();
        self.servers.hash(&mut h);
        h.finish()
    }
}

/// The result of [`Plan::changes`].
pub(super) struct Update {
    /// The groups whose plain sets change.
    pub sets: Sets,
    /// Every group whose servers value changes.
    values: Vec<(String, Value)>,
    versions: HashMap<Svc, Vec<(String, String)>>,
    /// How many Services' slices changed.
    pub services: usize,
}

/// Each Service's slices: (name, resourceVersion), sorted.
fn versions(world: &World) -> HashMap<Svc, Vec<(String, String)>> {
    let mut out: HashMap<Svc, Vec<(String, String)>> = HashMap::new();
    for slice in &world.slices {
        let m = &slice.metadata;
        let Some(svc) = m.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
            continue;
        };
        let ns = m.namespace.as_deref().unwrap_or("default");
        let v = (
            m.name.clone().unwrap_or_default(),
            m.resource_version.clone().unwrap_or_default(),
        );
        out.entry((ns.to_string(), svc.clone()))
            .or_default()
            .push(v);
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// The Service of an importer key `NAME.NAMESPACE:PORT`.
fn service_of(key: &str) -> Option<Svc> {
    let (svc, _) = key.rsplit_once(':')?;
    let (name, ns) = svc.split_once('.')?;
    Some((ns.to_string(), name.to_string()))
}

/// The Service port an importer key names (by number or name), as
/// [`super::objects::endpoints`] made the key.
fn service_port(
    services: &HashMap<(&str, &str), &Service>,
    key: &str,
) -> Option<(Svc, ServicePort)> {
    let (ns, name) = service_of(key)?;
    let port = key.rsplit_once(':')?.1;
    let svc = services.get(&(ns.as_str(), name.as_str()))?;
    let ports = svc.spec.as_ref()?.ports.as_ref()?;
    // The last port of that number, as `endpoints` kept it (its later insert wins the key:
    // 53/TCP and 53/UDP may map to different target ports).
    let p = ports.iter().rfind(|p| {
        p.port.to_string() == port
            || p.name
                .as_deref()
                .is_some_and(|n| !n.is_empty() && n == port)
    })?;
    Some(((ns, name), p.clone()))
}
