//! The Kubernetes provider (`[providers.kubernetes]`): Ingress objects watched on an API
//! server become routes of the running veloxy, without a restart.
//!
//! It runs on its own thread with its own tokio runtime, beside the server: [`watch`] keeps
//! caches of Ingresses, IngressClasses, Services, EndpointSlices and TLS Secrets (watches,
//! not polling; retried with backoff); after a change and 100 ms of quiet (1 s at most),
//! [`build`] translates the Ingresses of our class with the ingress importer (so
//! ingress-nginx's annotations keep their meaning), with each Service port's ready
//! endpoints as its servers ([`objects`]), merges that into the config file ([`merge`]),
//! compiles it and swaps it in through [`Running::reload`]; [`status`] then publishes the
//! address in each served Ingress's status. When only EndpointSlices changed, nothing is
//! translated: [`endpoints_only`] recomputes the servers of the groups they feed. SIGHUP and
//! `POST /reload` re-read the file and rebuild through [`Provider::reload_file`]. When the API server serves the Gateway API
//! CRDs, GatewayClasses, Gateways, HTTPRoutes, GRPCRoutes, ReferenceGrants (and TCPRoutes
//! and TLSRoutes when served) are watched too and translated by [`gateway`] into the same
//! config; their status is written by [`gateway::status`]. Objects skipped or refused are reported as Events ([`events`]).

mod build;
mod endpoints_only;
mod events;
mod gateway;
mod in_place;
mod lease;
mod merge;
mod objects;
mod status;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

use kube::Client;
use tokio::sync::{mpsc, oneshot, Notify};
use veloxy_engine::config::KubernetesSpec;
use veloxy_engine::Running;

use build::Builder;

/// Quiet time after a change before the config is rebuilt (changes in a burst are one
/// rebuild).
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Longest a rebuild waits for a burst of changes to end: under steady churn (a rolling
/// update of many Deployments) a change waits at most this plus one translation, within the
/// second the issue allows; a shorter one would translate every object more often.
const DEBOUNCE_MAX: Duration = Duration::from_millis(500);
/// Longest the first config waits for every watch's first list (a watch that cannot list,
/// for lack of RBAC rights or an API server, does not hold the others' Ingresses back).
const LIST_GRACE: Duration = Duration::from_secs(10);
/// Longest the start-up probe (one list of Ingresses) waits for the API server.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the provider cannot start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("reading the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(
        "no Kubernetes client configuration (the in-cluster service account, $KUBECONFIG or \
         ~/.kube/config; or set kubeconfig in [providers.kubernetes]): {0}"
    )]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error(
        "the API server denies listing Ingresses (check the RBAC rules of this identity): {0}"
    )]
    Forbidden(#[source] kube::Error),
    #[error("creating the private directory {path}: {source}")]
    PrivateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the config file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing the config file {path}: {source}")]
    ParseFile {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("starting the provider's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A reply to a file reload: what the log says, or why the running config stays.
type Reply = oneshot::Sender<Result<String, String>>;

/// The running provider.
pub struct Provider<'scope> {
    stop: Option<oneshot::Sender<()>>,
    reloads: mpsc::UnboundedSender<Reply>,
    thread: ScopedJoinHandle<'scope, ()>,
}

impl Provider<'_> {
    /// Asks the provider to re-read the config file and rebuild; the answer comes on the
    /// returned channel.
    pub fn reload_file(&self) -> oneshot::Receiver<Result<String, String>> {
        let (tx, rx) = oneshot::channel();
        // A provider that has stopped drops `tx`: the caller sees a closed channel.
        let _ = self.reloads.send(tx);
        rx
    }

    /// Stops the watches and waits for the provider's thread.
    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.thread.join();
    }
}

/// Starts the provider on a thread of `scope`: `spec` from the config file at `config`,
/// applying to `running`. Fails when the client cannot be configured or RBAC denies the
/// listing of Ingresses; an API server that does not answer yet is retried.
pub fn start<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    spec: KubernetesSpec,
    config: &'env Path,
    running: &'env Running,
) -> Result<Provider<'scope>, KubeError> {
    let text = std::fs::read_to_string(config).map_err(|source| KubeError::ReadFile {
        path: config.to_path_buf(),
        source,
    })?;
    let file: toml::Table = toml::from_str(&text).map_err(|e| KubeError::ParseFile {
        path: config.to_path_buf(),
        source: Box::new(e),
    })?;
    let dir = private_dir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubeError::Runtime)?;
    let client = rt.block_on(connect(&spec))?;
    let (stop_tx, stop_rx) = oneshot::channel();
    let (reload_tx, reload_rx) = mpsc::unbounded_channel();
    let thread = std::thread::Builder::new()
        .name("kubernetes".into())
        .spawn_scoped(scope, move || {
            // Translating a thousand Ingresses takes tens of milliseconds of CPU: at a lower
            // priority, a worker sharing the core preempts it (p99 under EndpointSlice churn).
            veloxy_engine::background::lower_priority();
            let builder = Builder::new(spec, config, file, dir.clone(), running);
            rt.block_on(run(client, builder, stop_rx, reload_rx));
            let _ = std::fs::remove_dir_all(&dir);
        })
        .map_err(KubeError::Runtime)?;
    Ok(Provider {
        stop: Some(stop_tx),
        reloads: reload_tx,
        thread,
    })
}

/// The client (from `kubeconfig`, else inferred), checked with one list of Ingresses: RBAC
/// denial is an error; an API server that does not answer is only logged (the watches retry).
async fn connect(spec: &KubernetesSpec) -> Result<Client, KubeError> {
    let config = match &spec.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeError::Kubeconfig {
                    path: path.clone(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(KubeError::Infer)?,
    };
    let client = Client::try_from(config).map_err(KubeError::Client)?;
    let api: kube::Api<k8s_openapi::api::networking::v1::Ingress> = match spec.namespaces.first() {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    };
    let params = kube::api::ListParams::default().limit(1);
    let probe = api.list_metadata(&params);
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(_)) => {}
        Ok(Err(kube::Error::Api(e))) if e.code == 401 || e.code == 403 => {
            return Err(KubeError::Forbidden(kube::Error::Api(e)))
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "kubernetes: the API server does not answer yet; retrying")
        }
        Err(_) => tracing::warn!("kubernetes: the API server does not answer yet; retrying"),
    }
    Ok(client)
}

/// The provider's loop: rebuild after changes, re-read the file on request, until stopped.
async fn run(
    client: Client,
    mut builder: Builder<'_>,
    mut stop: oneshot::Receiver<()>,
    mut reloads: mpsc::UnboundedReceiver<Reply>,
) {
    let changed = Arc::new(Notify::new());
    let gateway = gateway_served(&client).await;
    let caches = watch::Caches::start(&client, &builder.spec.namespaces, gateway, &changed);
    // With status to write (Ingress addresses, Gateway API conditions), one replica writes
    // it: the Lease's holder. Becoming the holder counts as a change (the status is written
    // at once).
    let status = builder.spec.status.is_some() || gateway.is_some();
    let elector = status.then(|| {
        let spec = &builder.spec;
        lease::Elector::new(
            &client,
            spec.lease.as_ref(),
            spec.lease_duration,
            changed.clone(),
        )
    });
    let writer = elector.as_ref().map(lease::Elector::flag);
    let (lease_stop, lease_stopped) = oneshot::channel::<()>();
    let elect = async {
        if let Some(e) = &elector {
            e.run(async {
                let _ = lease_stopped.await;
            })
            .await;
        }
    };
    let serve = serve(
        &client,
        &mut builder,
        &caches,
        &changed,
        writer.as_deref(),
        (&mut stop, &mut reloads),
    );
    tokio::join!(elect, async {
        serve.await;
        let _ = lease_stop.send(());
    });
}

/// The watch loop: rebuild after changes, re-read the file on request, until stopped.
async fn serve(
    client: &Client,
    builder: &mut Builder<'_>,
    caches: &watch::Caches,
    changed: &Notify,
    writer: Option<&AtomicBool>,
    (stop, reloads): (
        &mut oneshot::Receiver<()>,
        &mut mpsc::UnboundedReceiver<Reply>,
    ),
) {
    let mut recorder = events::Recorder::new(client, lease::identity());
    let grace = tokio::time::Instant::now() + LIST_GRACE;
    let mut grace_timer = std::pin::pin!(tokio::time::sleep_until(grace));
    loop {
        tokio::select! {
            _ = &mut *stop => break,
            () = changed.notified() => {
                debounce(changed).await;
                if caches.listed() || tokio::time::Instant::now() >= grace {
                    rebuild(client, builder, caches, writer, &mut recorder).await;
                }
            }
            () = &mut grace_timer, if !caches.listed() => {
                tracing::warn!("kubernetes: some watches have not listed their objects yet; serving what is known");
                rebuild(client, builder, caches, writer, &mut recorder).await;
                grace_timer.as_mut().reset(grace + Duration::from_secs(3600 * 24 * 365));
            }
            Some(reply) = reloads.recv() => {
                let result = reread(builder).and_then(|()| {
                    apply(builder, caches)
                        .map_err(|e| e.to_string())
                        .map(|()| format!("reloaded {}", builder.config_path.display()))
                });
                let _ = reply.send(result);
            }
        }
    }
}

/// Whether the API server serves the Gateway API v1 CRDs (GatewayClass, Gateway,
/// HTTPRoute, GRPCRoute, ReferenceGrant), and which of TCPRoute and TLSRoute (v1 in the
/// v1.6 CRDs) it serves too. Without the core ones only Ingresses are watched (installing
/// them later takes a restart); an API server that does not answer is taken to serve them
/// (their watches retry like the others).
async fn gateway_served(client: &Client) -> Option<watch::GatewayKinds> {
    const NEEDED: &[&str] = &[
        "gatewayclasses",
        "gateways",
        "httproutes",
        "grpcroutes",
        "referencegrants",
    ];
    let gv = format!("{}/v1", gateway::types::GROUP);
    match tokio::time::timeout(PROBE_TIMEOUT, client.list_api_group_resources(&gv)).await {
        Ok(Ok(list)) => {
            let served = |n: &str| list.resources.iter().any(|r| r.name == n);
            let missing: Vec<&str> = NEEDED.iter().filter(|n| !served(n)).copied().collect();
            if !missing.is_empty() {
                tracing::info!(
                    ?missing,
                    "kubernetes: Gateway API CRDs missing: serving Ingresses only"
                );
                return None;
            }
            if !gateway_allowed(client).await {
                return None;
            }
            let kinds = watch::GatewayKinds {
                tcp: served("tcproutes")
                    && may_list::<gateway::types::TcpRoute>(client, "TCPRoutes").await,
                tls: served("tlsroutes")
                    && may_list::<gateway::types::TlsRoute>(client, "TLSRoutes").await,
                namespaces: may_list::<k8s_openapi::api::core::v1::Namespace>(
                    client,
                    "Namespaces (listeners' allowedRoutes selectors then select no route)",
                )
                .await,
            };
            tracing::info!(
                tcp_routes = kinds.tcp,
                tls_routes = kinds.tls,
                "kubernetes: Gateway API v1 served: watching its objects"
            );
            Some(kinds)
        }
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
            tracing::info!("kubernetes: the API server serves no Gateway API CRDs: serving Ingresses only (restart after installing them)");
            None
        }
        _ => Some(watch::GatewayKinds {
            tcp: true,
            tls: true,
            namespaces: true,
        }),
    }
}

/// Whether this identity may list GatewayClasses: when RBAC denies it (a deployment made
/// before Gateway API support), Gateway API is left off with an error in the log, and
/// Ingresses are served.
async fn gateway_allowed(client: &Client) -> bool {
    let api: kube::Api<gateway::types::GatewayClass> = kube::Api::all(client.clone());
    let params = kube::api::ListParams::default().limit(1);
    match tokio::time::timeout(PROBE_TIMEOUT, api.list_metadata(&params)).await {
        Ok(Err(kube::Error::Api(e))) if e.code == 401 || e.code == 403 => {
            tracing::error!(error = %e, "kubernetes: the API server denies listing GatewayClasses (check the RBAC rules of this identity): Gateway API is off, Ingresses are served");
            false
        }
        _ => true,
    }
}

/// Whether this identity may list the cluster-wide kind `K` (TCPRoute, TLSRoute, Namespace):
/// a deployment whose RBAC rules predate them keeps the other kinds, with an error in the
/// log.
async fn may_list<K>(client: &Client, what: &str) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: kube::Api<K> = kube::Api::all(client.clone());
    let params = kube::api::ListParams::default().limit(1);
    match tokio::time::timeout(PROBE_TIMEOUT, api.list_metadata(&params)).await {
        Ok(Err(kube::Error::Api(e))) if e.code == 401 || e.code == 403 => {
            tracing::error!(error = %e, "kubernetes: the API server denies listing {what} (check the RBAC rules of this identity): not watched");
            false
        }
        _ => true,
    }
}

/// Waits until no change came for [`DEBOUNCE`], or [`DEBOUNCE_MAX`] passed.
async fn debounce(changed: &Notify) {
    let end = tokio::time::Instant::now() + DEBOUNCE_MAX;
    loop {
        let quiet = tokio::time::Instant::now() + DEBOUNCE;
        tokio::select! {
            () = changed.notified() => {
                if tokio::time::Instant::now() >= end { return; }
            }
            () = tokio::time::sleep_until(quiet.min(end)) => return,
        }
    }
}

/// Builds and applies the config from the caches, then writes the served Ingresses' status,
/// the Gateway API status and the Events about refused objects (when this replica is the
/// writer: it holds the Lease, or there is no Lease).
async fn rebuild(
    client: &Client,
    builder: &mut Builder<'_>,
    caches: &watch::Caches,
    writer: Option<&AtomicBool>,
    recorder: &mut events::Recorder,
) {
    let writes = writer.is_none_or(|w| w.load(std::sync::atomic::Ordering::SeqCst));
    // Only EndpointSlices changed (and this replica's part in writing status did not): no
    // translation, no status to write.
    if caches.listed()
        && builder.wrote_status == Some(writes)
        && builder.apply_endpoints(&caches.slices())
    {
        return;
    }
    let world = caches.world();
    match builder.apply(&world) {
        Ok(served) => {
            builder.wrote_status = Some(writes);
            if let Some(s) = builder.spec.status.as_ref().filter(|_| writes) {
                let want = status::desired(s, &world);
                status::publish(client, &served, &world.ingresses, &want).await;
            }
            if writes {
                let addresses = builder
                    .spec
                    .status
                    .as_ref()
                    .map(|s| status::desired(s, &world));
                let addresses = addresses.unwrap_or_default();
                gateway::status::publish(client, &builder.gateway, &addresses).await;
                gateway::status::clear_stale(client, &builder.gateway, &world).await;
                recorder.publish(&builder.problems).await;
            }
            if status::take_failed() {
                builder.wrote_status = None; // The next rebuild writes again.
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "kubernetes: config refused; the running config stays")
        }
    }
}

/// [`Builder::apply`] from the caches, forced (after a file change).
fn apply(builder: &mut Builder<'_>, caches: &watch::Caches) -> Result<(), build::BuildError> {
    builder.invalidate();
    builder.apply(&caches.world()).map(drop)
}

/// Re-reads and checks the config file (alone, so errors point into it). The
/// `[providers.kubernetes]` section itself is read at start only.
fn reread(builder: &mut Builder<'_>) -> Result<(), String> {
    let path = builder.config_path;
    let snapshot = veloxy_engine::config::load_file_with(path, &builder.policies)
        .map_err(|e| e.to_string())?;
    if snapshot.settings.kubernetes.as_ref() != Some(&builder.spec) {
        tracing::warn!("kubernetes: [providers.kubernetes] changed: it applies after a restart");
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    builder.file = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

/// The `[providers.kubernetes]` of the unit tests: class `veloxy`, Ingress routes on `web`,
/// no https listener, no status address, no Lease.
#[cfg(test)]
fn test_spec() -> KubernetesSpec {
    KubernetesSpec {
        kubeconfig: None,
        namespaces: Vec::new(),
        ingress_class: "veloxy".into(),
        ingress_nginx: false,
        gateway_class: None,
        http_listener: "web".into(),
        https_listener: None,
        status: None,
        lease: None,
        gateway_addresses: Vec::new(),
        lease_duration: std::time::Duration::from_secs(15),
    }
}

/// A fresh directory only this process may read, for the Secrets' certificates and keys.
fn private_dir() -> Result<PathBuf, KubeError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let path = std::env::temp_dir().join(format!("veloxy-kubernetes-{}", std::process::id()));
    let err = |source| KubeError::PrivateDir {
        path: path.clone(),
        source,
    };
    if path.exists() {
        std::fs::remove_dir_all(&path).map_err(err)?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(err)?;
    Ok(path)
}
