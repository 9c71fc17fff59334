//! One replica writes status, every replica serves: a `coordination.k8s.io/v1` Lease, as
//! Kubernetes' own controllers and ingress-nginx elect their status writer.
//!
//! Every replica runs [`Elector::run`]: each third of `lease_duration` it reads the Lease and
//! takes it when it is free (absent, released, or not renewed for `lease_duration`), or
//! renews it when it holds it. Writes carry the `resourceVersion` read, so of two replicas
//! taking a free Lease at once the API server accepts one (the other gets 409 and follows).
//! A holder that cannot renew within the duration steps down on its own, before another can
//! take over. On stop the holder releases the Lease, so a rolling update hands over at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::Notify;

/// The Lease's name when `lease` is not set.
const DEFAULT_NAME: &str = "veloxy-status";

/// How long one read or write of the Lease may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The Lease this replica competes for, and whether it holds it.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    namespace: String,
    identity: String,
    duration: Duration,
    leader: Arc<AtomicBool>,
    /// Told when this replica becomes the holder (its status writes start).
    became: Arc<Notify>,
}

impl Elector {
    /// The elector for `lease` (`None`: the default name in the pod's namespace).
    pub fn new(
        client: &Client,
        lease: Option<&(String, String)>,
        duration: Duration,
        became: Arc<Notify>,
    ) -> Elector {
        let (namespace, name) = match lease {
            Some((ns, n)) => (ns.clone(), n.clone()),
            None => (pod_namespace(), DEFAULT_NAME.to_owned()),
        };
        Elector {
            api: Api::namespaced(client.clone(), &namespace),
            name,
            namespace,
            identity: identity(),
            duration,
            leader: Arc::new(AtomicBool::new(false)),
            became,
        }
    }

    /// Whether this replica holds the Lease (it writes status).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.leader.clone()
    }

    /// Competes for the Lease until `stop` resolves, then releases it if held.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let period = self.duration / 3;
        let mut renewed = tokio::time::Instant::now();
        let mut reported_other = None;
        loop {
            match tokio::time::timeout(CALL_TIMEOUT, self.round()).await {
                Ok(Ok(None)) => {
                    renewed = tokio::time::Instant::now();
                    reported_other = None;
                    if !self.leader.swap(true, Ordering::SeqCst) {
                        tracing::info!(lease = %self.where_(), identity = %self.identity,
                            "kubernetes: this replica holds the lease: it writes status");
                        self.became.notify_one();
                    }
                }
                Ok(Ok(Some(holder))) => {
                    self.step_down("another replica holds the lease");
                    if reported_other.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.where_(), holder = %holder,
                            "kubernetes: another replica holds the lease: status is left to it");
                        reported_other = Some(holder);
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.where_(), error = %e, "kubernetes: lease");
                }
                Err(_) => tracing::warn!(lease = %self.where_(), "kubernetes: lease: no answer"),
            }
            // A holder that could not renew steps down before anyone may take over.
            if self.leader.load(Ordering::SeqCst) && renewed.elapsed() >= period * 2 {
                self.step_down("the lease could not be renewed");
            }
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(period) => {}
            }
        }
        if self.leader.swap(false, Ordering::SeqCst) {
            let release = tokio::time::timeout(CALL_TIMEOUT, self.release()).await;
            if !matches!(release, Ok(Ok(()))) {
                tracing::warn!(lease = %self.where_(), "kubernetes: the lease was not released");
            }
        }
    }

    fn where_(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn step_down(&self, why: &str) {
        if self.leader.swap(false, Ordering::SeqCst) {
            tracing::warn!(lease = %self.where_(), "kubernetes: {why}: status writes stop");
        }
    }

    /// One read and, when the Lease is ours to take or renew, one write: `None` when this
    /// replica holds it afterwards, else the holder's identity.
    async fn round(&self) -> Result<Option<String>, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let fresh = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(self.held_spec(now, now, 0)),
            };
            return match self.api.create(&PostParams::default(), &fresh).await {
                Ok(_) => Ok(None),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some("(just created)".into())),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.identity;
        if !ours && !holder.is_empty() && !expired(&spec, now) {
            return Ok(Some(holder));
        }
        let (acquired, transitions) = match ours {
            true => (
                spec.acquire_time.map_or(now, |t| t.0),
                spec.lease_transitions.unwrap_or(0),
            ),
            false => (now, spec.lease_transitions.unwrap_or(0) + 1),
        };
        lease.spec = Some(self.held_spec(now, acquired, transitions));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(None),
            // Another replica wrote first: it holds the Lease now.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(holder)),
            Err(e) => Err(e),
        }
    }

    fn held_spec(&self, now: Timestamp, acquired: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.duration.as_secs()).unwrap_or(15)),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Gives the Lease up: no holder, so the next replica to look takes it.
    async fn release(&self) -> Result<(), kube::Error> {
        let mut lease = self.api.get(&self.name).await?;
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(drop)
    }
}

/// The holder stopped renewing: its renew time (or acquire time) plus its duration is past.
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(last) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    last.0
        .checked_add(SignedDuration::from_secs(secs))
        .map_or(true, |end| end < now)
}

/// This replica's name in the Lease: `$POD_NAME` (else the host name) and the process id.
pub(super) fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "veloxy".into());
    format!("{host}_{}", std::process::id())
}

/// `$POD_NAMESPACE`, else the service account's namespace, else `default`.
fn pod_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into())
}
