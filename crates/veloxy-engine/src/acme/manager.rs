//! The ACME thread: one task per name keeps that name's certificate. It installs the stored
//! certificate when there is a usable one, orders one when there is none or renewal is due,
//! retries failures with backoff, and sleeps until the next renewal. Reloads add and remove
//! names: a name kept by a reload keeps its task (no new order); a new name starts one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{watch, Mutex};

use super::order::{self, OrderError};
use super::shared::SharedStorage;
use super::{storage, AcmeSettings, CertStore, Challenge, ListenerCerts};

/// What the ACME thread is asked to keep: sent at start and after every reload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// `[server.acme]`; `None` when no listener uses ACME.
    pub settings: Option<Arc<AcmeSettings>>,
    /// Every ACME name of every TLS listener.
    pub names: BTreeSet<String>,
    /// The names of listeners with their own ACME settings (`[listeners.NAME.tls.acme]` with
    /// a `challenge`), and those settings; the other names use `settings`.
    pub own: BTreeMap<String, Arc<AcmeSettings>>,
    /// Every certificate (chain, key) whose OCSP staple is kept: the listeners' files and
    /// the ACME certificates in storage.
    pub staple: BTreeSet<(PathBuf, PathBuf)>,
}

impl Plan {
    /// The plan of a config: its `[server.acme]` and its listeners' certificates.
    pub(crate) fn of(settings: Option<Arc<AcmeSettings>>, listeners: &[ListenerCerts<'_>]) -> Plan {
        let names: BTreeSet<String> = listeners
            .iter()
            .flat_map(|l| l.acme.iter().cloned())
            .collect();
        let mut staple: BTreeSet<(PathBuf, PathBuf)> = listeners
            .iter()
            .flat_map(|l| l.files.iter().map(|f| (f.cert.clone(), f.key.clone())))
            .collect();
        if let Some(s) = &settings {
            let folder = storage::directory_folder(&s.storage, &s.directory);
            staple.extend(names.iter().map(|n| storage::cert_paths(&folder, n)));
        }
        let own = listeners
            .iter()
            .filter_map(|l| Some((l.acme, l.acme_settings?)))
            .flat_map(|(names, s)| names.iter().map(|n| (n.clone(), s.clone())))
            .collect();
        Plan {
            settings,
            names,
            own,
            staple,
        }
    }
}

/// Installs the stored certificates of `plan`'s names that are still valid, before listeners
/// accept (at start) or before a reloaded config is swapped in: a restart serves them from its
/// first handshake, without waiting for the ACME thread.
pub(crate) fn preload(store: &CertStore, plan: &Plan) {
    let Some(settings) = &plan.settings else {
        return;
    };
    let folder = storage::directory_folder(&settings.storage, &settings.directory);
    for name in &plan.names {
        if store.cert(name).is_none() {
            let (crt, key) = storage::cert_paths(&folder, name);
            install_stored(store, name, &crt, &key, settings);
        }
    }
}

/// The account, created or loaded by the first task that needs it and shared by all.
type AccountSlot = Arc<Mutex<Option<instant_acme::Account>>>;

/// Starts the ACME thread, which keeps `store` (the runtime's); it follows `plans` until the
/// sender is dropped.
pub(crate) fn spawn_thread(
    store: Arc<CertStore>,
    mut plans: watch::Receiver<Plan>,
) -> std::io::Result<()> {
    crate::background::spawn("veloxy-acme", move || async move {
        let mut tasks: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
        // The settings each name's task runs with.
        let mut running: HashMap<String, Arc<AcmeSettings>> = HashMap::new();
        let mut staples: HashMap<(PathBuf, PathBuf), tokio::task::JoinHandle<()>> = HashMap::new();
        let mut current: Option<Arc<AcmeSettings>> = None;
        let mut account: AccountSlot = Arc::default();
        let mut shared: Option<Arc<SharedStorage>> = None;
        let mut syncing: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let plan = plans.borrow_and_update().clone();
            if plan.settings != current {
                // Another CA, account or storage: every name starts over.
                tasks.drain().for_each(|(_, t)| t.abort());
                current = plan.settings.clone();
                account = Arc::default();
                if let Some(t) = syncing.take() {
                    t.abort();
                }
                shared = current.as_deref().and_then(shared_storage);
                syncing = shared
                    .clone()
                    .map(|sh| tokio::spawn(super::shared::sync_challenges(sh, store.clone())));
            }
            let wanted: HashSet<String> = plan.names.iter().cloned().collect();
            store.retain(&wanted);
            sync(&mut staples, &plan.staple, |(cert, key)| {
                super::ocsp::keep(store.clone(), cert.clone(), key.clone())
            });
            let none = BTreeSet::new();
            let names = if current.is_some() {
                &plan.names
            } else {
                &none
            };
            // A name whose listener now proves it another way starts over.
            let effective = |name: &String| plan.own.get(name).or(current.as_ref()).cloned();
            tasks.retain(|name, t| {
                let same = running.get(name) == effective(name).as_ref();
                if !same {
                    t.abort();
                }
                same
            });
            running = names
                .iter()
                .filter_map(|n| Some((n.clone(), effective(n)?)))
                .collect();
            sync(&mut tasks, names, |name| {
                let settings = effective(name).expect("names only with settings");
                keep(
                    store.clone(),
                    name.clone(),
                    settings,
                    account.clone(),
                    shared.clone(),
                )
            });
            if plans.changed().await.is_err() {
                return;
            }
        }
    })?;
    Ok(())
}

/// The shared storage of `settings`, when it says `storage = "redis"`.
fn shared_storage(settings: &AcmeSettings) -> Option<Arc<SharedStorage>> {
    let spec = settings.redis.as_ref()?;
    let folder = storage::directory_folder(&settings.storage, &settings.directory);
    let folder = folder.file_name()?.to_string_lossy().into_owned();
    match SharedStorage::new(spec, &folder) {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::error!(error = %e, "ACME: shared storage unusable");
            None
        }
    }
}

/// Makes `tasks` one task per key of `wanted`: aborts the others, spawns the missing ones
/// (keys kept keep their running task).
fn sync<K, F>(
    tasks: &mut HashMap<K, tokio::task::JoinHandle<()>>,
    wanted: &BTreeSet<K>,
    spawn: impl Fn(&K) -> F,
) where
    K: Ord + std::hash::Hash + Clone,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tasks.retain(|k, t| {
        let keep = wanted.contains(k);
        if !keep {
            t.abort();
        }
        keep
    });
    for k in wanted {
        if !tasks.contains_key(k) {
            tasks.insert(k.clone(), tokio::spawn(spawn(k)));
        }
    }
}

/// How often an instance using shared storage looks for a certificate another instance
/// renewed.
const SHARED_POLL: Duration = Duration::from_secs(5);

/// Keeps `name`'s certificate for as long as the name is configured. With shared storage
/// (`storage = "redis"`) the copy in Redis wins over the local one, and an order is placed
/// only under the name's lock, after looking once more whether another instance just got one.
async fn keep(
    store: Arc<CertStore>,
    name: String,
    settings: Arc<AcmeSettings>,
    account: AccountSlot,
    shared: Option<Arc<SharedStorage>>,
) {
    let store = &*store;
    let folder = storage::directory_folder(&settings.storage, &settings.directory);
    let (crt, key) = storage::cert_paths(&folder, &name);
    let mut failures = 0u32;
    let mut challenge = settings.challenge.unwrap_or(Challenge::TlsAlpn01);
    let mut renew: Option<SystemTime> = None;
    loop {
        let pulled = match &shared {
            Some(sh) => pull(sh, &name, &crt, &key).await,
            None => false,
        };
        if pulled || renew.is_none() {
            renew = install_stored(store, &name, &crt, &key, &settings);
        }
        if let Some(renew_at) = renew {
            if let Ok(wait) = renew_at.duration_since(SystemTime::now()) {
                store.set_status(&name, |s| s.next_attempt = Some(renew_at));
                let nap = if shared.is_some() {
                    wait.min(SHARED_POLL)
                } else {
                    wait
                };
                tokio::time::sleep(nap).await;
                continue;
            }
        }
        let lock = match &shared {
            None => None,
            Some(sh) => match sh.lock(&name).await {
                Ok(Some(lock)) => {
                    // Another instance may have stored one just before we locked.
                    if pull(sh, &name, &crt, &key).await {
                        renew = None;
                        let _ = sh.unlock(lock).await;
                        continue;
                    }
                    Some(lock)
                }
                Ok(None) => {
                    // Another instance is ordering: its certificate will be in Redis.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    failures += 1;
                    fail(store, &name, &e.to_string());
                    tokio::time::sleep(backoff(&e, failures)).await;
                    continue;
                }
            },
        };
        store.set_status(&name, |s| s.orders += 1);
        tracing::info!(name = %name, challenge = challenge.as_str(), directory = %settings.directory, "ACME: ordering a certificate");
        let outcome = obtain(
            &settings,
            &account,
            store,
            &name,
            challenge,
            shared.as_deref(),
        )
        .await;
        let outcome = match outcome {
            Ok((chain, key_pem)) => save(shared.as_deref(), &name, (&crt, &key), &chain, &key_pem)
                .await
                .map_err(|e| OrderError::Other(format!("storing the certificate: {e}"))),
            Err(e) => Err(e),
        };
        if let (Some(sh), Some(lock)) = (&shared, lock) {
            let _ = sh.unlock(lock).await;
        }
        match outcome {
            Ok(()) => {
                failures = 0;
                renew = None;
                store.set_status(&name, |s| s.last_error = None);
                tracing::info!(name = %name, "ACME: certificate obtained");
            }
            Err(e) => {
                failures += 1;
                fail(store, &name, &e.to_string());
                if e.lost_account() {
                    order::forget_account(&settings, shared.as_deref()).await;
                    *account.lock().await = None;
                }
                // The default: tls-alpn-01, and http-01 when it fails and a plain listener
                // can answer.
                if settings.challenge.is_none() && settings.plain_listener && e.is_refusal() {
                    challenge = match challenge {
                        Challenge::TlsAlpn01 => Challenge::Http01,
                        Challenge::Http01 => Challenge::TlsAlpn01,
                        Challenge::Dns01 => Challenge::Dns01,
                    };
                }
                let delay = if matches!(e, OrderError::Other(ref m) if m.starts_with("storing")) {
                    Duration::from_secs(60)
                } else {
                    backoff(&e, failures)
                };
                store.set_status(&name, |s| {
                    s.next_attempt = Some(SystemTime::now() + delay);
                });
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Writes a new certificate to the local folder and, with shared storage, to Redis (first:
/// the fleet's copy is the one that counts).
async fn save(
    shared: Option<&SharedStorage>,
    name: &str,
    (crt, key): (&std::path::Path, &std::path::Path),
    chain: &str,
    key_pem: &str,
) -> Result<(), String> {
    if let Some(sh) = shared {
        sh.put_cert(name, chain.as_bytes(), key_pem.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
    }
    storage::write_private(key, key_pem.as_bytes())
        .and_then(|()| storage::write_private(crt, chain.as_bytes()))
        .map_err(|e| e.to_string())
}

/// Copies `name`'s certificate from Redis into the local files when it differs from them;
/// says whether it did. A Redis failure keeps the local copy (logged).
async fn pull(
    sh: &SharedStorage,
    name: &str,
    crt: &std::path::Path,
    key: &std::path::Path,
) -> bool {
    let (chain, pem) = match sh.cert(name).await {
        Ok(Some(c)) => c,
        Ok(None) => return false,
        Err(e) => {
            tracing::debug!(name = %name, error = %e, "ACME: shared storage unreachable");
            return false;
        }
    };
    if std::fs::read(crt).is_ok_and(|local| local == chain) {
        return false;
    }
    let written =
        storage::write_private(key, &pem).and_then(|()| storage::write_private(crt, &chain));
    match written {
        Ok(()) => {
            tracing::info!(name = %name, "ACME: certificate taken from shared storage");
            true
        }
        Err(e) => {
            tracing::warn!(name = %name, error = %e, "ACME: cannot keep a local copy");
            false
        }
    }
}

fn fail(store: &CertStore, name: &str, error: &str) {
    store
        .failures
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(name = %name, error = %error, "ACME: issuance failed");
    store.set_status(name, |s| s.last_error = Some(error.to_owned()));
}

/// Installs the stored certificate of `name` when it is valid; returns when to renew it.
fn install_stored(
    store: &CertStore,
    name: &str,
    crt: &std::path::Path,
    key: &std::path::Path,
    settings: &AcmeSettings,
) -> Option<SystemTime> {
    if !crt.exists() {
        return None;
    }
    let certified = match order::load(crt, key) {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(name = %name, error = %e, "ACME: stored certificate not usable");
            return None;
        }
    };
    let info = crate::tls::leaf_info(certified.cert.first()?)?;
    store.install(name, Arc::new(certified));
    store.set_status(name, |s| {
        s.issuer = Some(info.issuer.clone());
        s.not_after = Some(info.not_after);
    });
    Some(renewal_time(
        info.not_before,
        info.not_after,
        settings.renew_before,
    ))
}

/// `renew_before` ahead of expiry, but never before a third of the lifetime has passed (a
/// short-lived certificate with the default 30 days would otherwise renew at once, forever).
fn renewal_time(not_before: SystemTime, not_after: SystemTime, before: Duration) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let by_setting = not_after.checked_sub(before).unwrap_or(not_before);
    by_setting.max(not_before + lifetime / 3)
}

/// The account (loaded or created once), then one order.
async fn obtain(
    settings: &AcmeSettings,
    account: &AccountSlot,
    store: &CertStore,
    name: &str,
    challenge: Challenge,
    shared: Option<&SharedStorage>,
) -> Result<(String, String), OrderError> {
    let acct = {
        let mut slot = account.lock().await;
        if slot.is_none() {
            *slot = Some(order::account(settings, shared).await?);
        }
        slot.clone().expect("set above")
    };
    order::issue(&acct, settings, store, name, challenge, shared).await
}

/// When to try again: a network failure soon (1 s, doubling to 5 minutes: it costs the CA
/// nothing); a refusal slowly (1 minute, doubling to a day: CAs limit failed validations,
/// Let's Encrypt to 5 per name and hour); a rate limit no sooner than an hour.
fn backoff(e: &OrderError, failures: u32) -> Duration {
    let exp = |base: u64, cap: u64| {
        Duration::from_secs(
            base.saturating_mul(1u64 << failures.saturating_sub(1).min(20))
                .min(cap),
        )
    };
    if e.is_rate_limit() {
        exp(3600, 86400)
    } else if e.is_refusal() {
        exp(60, 86400)
    } else {
        exp(1, 300)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listeners_own_settings_go_with_its_names_only() {
        let server = Arc::new(AcmeSettings {
            email: None,
            directory: "https://ca.test/dir".into(),
            storage: "/tmp/acme".into(),
            ca_file: None,
            challenge: Some(Challenge::Http01),
            renew_before: Duration::from_secs(86400),
            plain_listener: true,
            redis: None,
            dns: super::super::DnsProvider::None,
            propagation_timeout: Duration::from_secs(60),
            resolvers: Vec::new(),
        });
        let own = Arc::new(AcmeSettings {
            challenge: Some(Challenge::Dns01),
            dns: super::super::DnsProvider::Command(vec!["/bin/true".into()]),
            ..AcmeSettings::clone(&server)
        });
        let (web, wild) = (["a.test".to_owned()], ["*.b.test".to_owned()]);
        let listeners = [
            ListenerCerts {
                name: "web",
                files: &[],
                acme: &web,
                acme_settings: None,
            },
            ListenerCerts {
                name: "wild",
                files: &[],
                acme: &wild,
                acme_settings: Some(&own),
            },
        ];
        let plan = Plan::of(Some(server), &listeners);
        assert_eq!(plan.names.len(), 2);
        assert_eq!(plan.own.len(), 1);
        assert_eq!(plan.own["*.b.test"].challenge, Some(Challenge::Dns01));
    }

    #[test]
    fn renewal_leaves_a_third_of_the_lifetime_at_least() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let day = Duration::from_secs(86400);
        // Let's Encrypt: 90 days, renew 30 days before.
        assert_eq!(renewal_time(t0, t0 + day * 90, day * 30), t0 + day * 60);
        // A 60 s test certificate with the default 30 days: after 20 s, not at once.
        let r = renewal_time(t0, t0 + Duration::from_secs(60), day * 30);
        assert_eq!(r, t0 + Duration::from_secs(20));
    }

    #[test]
    fn refusals_back_off_slower_than_network_failures() {
        let net = OrderError::Timeout(Duration::from_secs(1));
        let refused = OrderError::Refused("unauthorized".into());
        let limited = OrderError::Refused("urn:ietf:params:acme:error:rateLimited".into());
        assert_eq!(backoff(&net, 1), Duration::from_secs(1));
        assert_eq!(backoff(&net, 4), Duration::from_secs(8));
        assert_eq!(backoff(&net, 30), Duration::from_secs(300));
        assert_eq!(backoff(&refused, 1), Duration::from_secs(60));
        let nonce = OrderError::Refused(
            "API error: JWS has an invalid anti-replay nonce (urn:ietf:params:acme:error:badNonce)"
                .into(),
        );
        assert_eq!(
            backoff(&nonce, 1),
            Duration::from_secs(1),
            "badNonce: retry at once"
        );
        assert_eq!(backoff(&limited, 1), Duration::from_secs(3600));
    }
}
