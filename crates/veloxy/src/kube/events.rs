//! Events (`events.k8s.io/v1`) about the objects the provider skips or refuses: an Ingress
//! annotation refused or an Ingress left out, a Gateway listener or route rule refused, a
//! reference not permitted or not found, a route that conflicts with an older one.
//!
//! Deduplicated: a problem is reported when it appears, not at every rebuild (a resync finds
//! the same problems and writes nothing). Each problem has one Event, named after the object
//! and a hash of the problem; when it goes away and comes back, or another replica (or a
//! restart) reports it again, the Event's `series.count` is increased instead of a new one
//! made. Written by the replica that writes status (the Lease holder).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash as _, Hasher as _};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// How long one Event write may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The `reportingController` of the Events.
const CONTROLLER: &str = "veloxy.dev/controller";
/// The longest `note` the API server takes.
const NOTE_MAX: usize = 1024;

/// Something wrong with one object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    /// The object's `apiVersion` and kind.
    pub api_version: String,
    pub kind: String,
    /// `None`: a cluster-wide object (its Events go to `default`).
    pub namespace: Option<String>,
    pub name: String,
    /// A CamelCase reason (`Refused`, `RefNotPermitted`...).
    pub reason: String,
    pub note: String,
}

impl Problem {
    /// A problem of the object `kind` `ns/name` (an Ingress, a Service: the kinds the
    /// ingress translation names) or of a Gateway API object.
    pub fn new(kind: &str, ns: Option<&str>, name: &str, reason: &str, note: String) -> Self {
        let api_version = match kind {
            "Ingress" | "IngressClass" => "networking.k8s.io/v1".to_owned(),
            "Service" | "Secret" | "ConfigMap" => "v1".to_owned(),
            _ => format!("{}/v1", super::gateway::types::GROUP),
        };
        Problem {
            api_version,
            kind: kind.to_owned(),
            namespace: ns.map(str::to_owned),
            name: name.to_owned(),
            reason: reason.to_owned(),
            note,
        }
    }

    /// From an importer report's location, `KIND NAMESPACE/NAME`.
    pub fn from_loc(loc: &str, reason: &str, note: String) -> Option<Self> {
        let (kind, id) = loc.split_once(' ')?;
        let (ns, name) = id.split_once('/')?;
        Some(Problem::new(kind, Some(ns), name, reason, note))
    }

    /// The name of its Event: the object's, and a hash of the problem.
    fn event_name(&self) -> String {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        format!("{}.veloxy-{:016x}", self.name, h.finish())
    }
}

/// The Events written, by problem.
pub struct Recorder {
    client: Client,
    identity: String,
    /// The problems of the last report (reported already).
    active: BTreeSet<Problem>,
    /// How often each problem appeared in this process.
    counts: HashMap<Problem, i32>,
}

impl Recorder {
    /// A recorder whose Events name `identity` as `reportingInstance`.
    pub fn new(client: &Client, identity: String) -> Self {
        Recorder {
            client: client.clone(),
            identity,
            active: BTreeSet::new(),
            counts: HashMap::new(),
        }
    }

    /// Reports each problem of `problems` that was not in the last report.
    pub async fn publish(&mut self, problems: &[Problem]) {
        let now: BTreeSet<Problem> = problems.iter().cloned().collect();
        for p in now.difference(&self.active) {
            let count = self.counts.entry(p.clone()).or_insert(0);
            *count += 1;
            let first = *count == 1;
            match tokio::time::timeout(CALL_TIMEOUT, self.emit(p, first)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    super::status::failed();
                    tracing::warn!(object = %format!("{} {}", p.kind, p.name), error = %e, "kubernetes: Event not written")
                }
                Err(_) => {
                    super::status::failed();
                    tracing::warn!("kubernetes: Event not written: timed out")
                }
            }
        }
        self.active = now;
    }

    /// Creates the problem's Event (`first` in this process), or adds one to its series.
    async fn emit(&self, p: &Problem, first: bool) -> Result<(), kube::Error> {
        let ns = p.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), ns);
        let name = p.event_name();
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        if first {
            let ev = self.event(p, &name, ns, now.clone());
            match api.create(&PostParams::default(), &ev).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        let Some(current) = api.get_opt(&name).await? else {
            let ev = self.event(p, &name, ns, now);
            return api.create(&PostParams::default(), &ev).await.map(drop);
        };
        let count = current.series.map_or(1, |s| s.count) + 1;
        let series = EventSeries {
            count,
            last_observed_time: now,
        };
        let patch = serde_json::json!({ "series": series });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        api.patch(&name, &params, &patch).await.map(drop)
    }

    fn event(&self, p: &Problem, name: &str, ns: &str, now: MicroTime) -> Event {
        let mut note = p.note.clone();
        if note.len() > NOTE_MAX {
            let mut end = NOTE_MAX - 3;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
            note.push_str("...");
        }
        Event {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(ns.to_owned()),
                ..Default::default()
            },
            event_time: Some(now),
            action: Some("Translate".into()),
            reason: Some(p.reason.clone()),
            note: Some(note),
            type_: Some("Warning".into()),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.identity.clone()),
            regarding: Some(ObjectReference {
                api_version: Some(p.api_version.clone()),
                kind: Some(p.kind.clone()),
                namespace: p.namespace.clone(),
                name: Some(p.name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
