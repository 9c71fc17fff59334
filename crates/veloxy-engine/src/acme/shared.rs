//! `[server.acme] storage = "redis"`: the ACME account, the certificates, an issuance lock
//! and the pending challenges in `[server.redis]`, so a fleet orders each certificate once
//! and every instance serves (and renews with) the same one.
//!
//! Redis is the source of truth; each instance keeps a copy of what it uses in its local
//! storage folder (so a restart serves at once, and OCSP stapling reads files as before).
//! Keys, under `veloxy:acme:<directory folder>:` (one namespace per CA, as on disk):
//!
//! * `account`: the account's credentials (JSON);
//! * `cert:<name>`: a hash with `crt` (the chain) and `key` (PEM);
//! * `lock:<name>` / `lock:account`: `SET NX PX` with a random token, released only by its
//!   holder (compare and delete), expiring on its own after [`LOCK_TTL`] if the holder dies;
//! * `challenges`: a hash of pending challenges (`http:<token>` = key authorization,
//!   `alpn:<name>` = the hex SHA-256 digest), which every instance copies into its own
//!   challenge store every [`SYNC_EVERY`]: the CA's validation may reach any instance.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;

use super::order::OrderError;
use super::CertStore;

/// How long an issuance lock holds if its holder never releases it.
pub(crate) const LOCK_TTL: Duration = Duration::from_secs(300);
/// How often every instance copies the pending challenges.
pub(crate) const SYNC_EVERY: Duration = Duration::from_millis(250);
/// The deadline of one Redis command here (the rate limits' `timeout` is for the request
/// path; nothing waits on these but the ACME thread).
const TIMEOUT: Duration = Duration::from_secs(2);

/// The shared storage of one CA directory.
pub(crate) struct SharedStorage {
    client: redis::Client,
    prefix: String,
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
}

impl std::fmt::Debug for SharedStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStorage")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn err(e: impl std::fmt::Display) -> OrderError {
    OrderError::Other(format!("shared storage (Redis): {e}"))
}

impl SharedStorage {
    /// The storage in `spec`'s Redis for the CA whose local folder is named `folder`.
    pub fn new(spec: &crate::fleet::redis::RedisSpec, folder: &str) -> Result<Self, OrderError> {
        Ok(SharedStorage {
            client: crate::fleet::redis::open(spec).map_err(err)?,
            prefix: format!("veloxy:acme:{folder}:"),
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// Runs `f` on the cached connection (made on first use, dropped after a failure).
    async fn run<T, F, Fut>(&self, f: F) -> Result<T, OrderError>
    where
        F: FnOnce(redis::aio::MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let mut slot = self.conn.lock().await;
        let conn = match slot.as_ref() {
            Some(c) => c.clone(),
            None => {
                let c =
                    tokio::time::timeout(TIMEOUT, self.client.get_multiplexed_async_connection())
                        .await
                        .map_err(|_| err("connect timed out"))?
                        .map_err(err)?;
                *slot = Some(c.clone());
                c
            }
        };
        drop(slot);
        let out = tokio::time::timeout(TIMEOUT, f(conn)).await;
        match out {
            Ok(Ok(v)) => Ok(v),
            failed => {
                *self.conn.lock().await = None;
                Err(match failed {
                    Ok(Err(e)) => err(e),
                    _ => err("no answer in time"),
                })
            }
        }
    }

    /// The stored account credentials.
    pub async fn account(&self) -> Result<Option<Vec<u8>>, OrderError> {
        let key = format!("{}account", self.prefix);
        self.run(|mut c| async move { c.get(key).await }).await
    }

    /// Stores the account credentials.
    pub async fn put_account(&self, json: &[u8]) -> Result<(), OrderError> {
        let (key, json) = (format!("{}account", self.prefix), json.to_vec());
        self.run(|mut c| async move { c.set(key, json).await })
            .await
    }

    /// Forgets the account (the CA no longer knows it).
    pub async fn forget_account(&self) -> Result<(), OrderError> {
        let key = format!("{}account", self.prefix);
        self.run(|mut c| async move { c.del(key).await }).await
    }

    /// `name`'s stored certificate: (chain, key) as PEM.
    pub async fn cert(&self, name: &str) -> Result<Option<(Vec<u8>, Vec<u8>)>, OrderError> {
        let key = format!("{}cert:{name}", self.prefix);
        let (crt, pem): (Option<Vec<u8>>, Option<Vec<u8>>) = self
            .run(|mut c| async move { c.hget(key, &["crt", "key"]).await })
            .await?;
        Ok(crt.zip(pem))
    }

    /// Stores `name`'s certificate (both parts in one command: never half of one).
    pub async fn put_cert(&self, name: &str, chain: &[u8], pem: &[u8]) -> Result<(), OrderError> {
        let key = format!("{}cert:{name}", self.prefix);
        let fields = [("crt", chain.to_vec()), ("key", pem.to_vec())];
        self.run(|mut c| async move { c.hset_multiple(key, &fields).await })
            .await
    }

    /// Takes the lock `what` for [`LOCK_TTL`]; its token, or `None` when another holds it.
    pub async fn lock(&self, what: &str) -> Result<Option<Lock>, OrderError> {
        let key = format!("{}lock:{what}", self.prefix);
        let token = format!("{:016x}{:016x}", rand_u64(), rand_u64());
        let opts = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(LOCK_TTL.as_millis() as u64));
        let (k, t) = (key.clone(), token.clone());
        let set: Option<String> = self
            .run(|mut c| async move { c.set_options(k, t, opts).await })
            .await?;
        Ok(set.map(|_| Lock { key, token }))
    }

    /// Releases a lock this instance holds (never another's, even after it expired).
    pub async fn unlock(&self, lock: Lock) -> Result<(), OrderError> {
        let script = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        );
        self.run(|mut c| async move {
            script
                .key(lock.key)
                .arg(lock.token)
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }

    /// Publishes a pending challenge (`http:<token>` or `alpn:<name>`) for every instance.
    pub async fn publish(&self, field: &str, value: &str) -> Result<(), OrderError> {
        let key = format!("{}challenges", self.prefix);
        let (field, value) = (field.to_owned(), value.to_owned());
        self.run(|mut c| async move {
            redis::pipe()
                .hset(&key, field, value)
                .pexpire(&key, LOCK_TTL.as_millis() as i64)
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// Withdraws a published challenge.
    pub async fn withdraw(&self, field: &str) -> Result<(), OrderError> {
        let (key, field) = (format!("{}challenges", self.prefix), field.to_owned());
        self.run(|mut c| async move { c.hdel(key, field).await })
            .await
    }

    async fn challenges(&self) -> Result<HashMap<String, String>, OrderError> {
        let key = format!("{}challenges", self.prefix);
        self.run(|mut c| async move { c.hgetall(key).await }).await
    }
}

/// A held lock.
pub(crate) struct Lock {
    key: String,
    token: String,
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// Copies the pending challenges into this instance's challenge store for ever (the ACME
/// thread runs it while shared storage is configured): whichever instance the CA's
/// validation reaches can answer it.
pub(crate) async fn sync_challenges(shared: Arc<SharedStorage>, store: Arc<CertStore>) {
    let mut installed: HashSet<String> = HashSet::new();
    let mut tick = tokio::time::interval(SYNC_EVERY);
    loop {
        tick.tick().await;
        let Ok(now) = shared.challenges().await else {
            continue;
        };
        for (field, value) in &now {
            if installed.contains(field) {
                continue;
            }
            if let Some(token) = field.strip_prefix("http:") {
                store.add_token(token, value);
            } else if let Some(name) = field.strip_prefix("alpn:") {
                let Some(digest) = unhex(value) else { continue };
                match super::order::validation_cert(name, &digest) {
                    Ok(cert) => store.add_alpn(name, cert),
                    Err(_) => continue,
                }
            }
            installed.insert(field.clone());
        }
        installed.retain(|field| {
            let keep = now.contains_key(field);
            if !keep {
                if let Some(token) = field.strip_prefix("http:") {
                    store.remove_token(token);
                } else if let Some(name) = field.strip_prefix("alpn:") {
                    store.remove_alpn(name);
                }
            }
            keep
        });
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn digests_survive_hex() {
        let d = [0u8, 1, 0xab, 0xff];
        assert_eq!(super::unhex(&super::hex(&d)).unwrap(), d);
        assert!(super::unhex("zz").is_none());
    }
}
