//! Automatic certificates (ACME, RFC 8555): names listed by `[listeners.NAME.tls] acme` get
//! certificates from the `[server.acme]` directory, kept on disk, renewed, and swapped into
//! the listeners' SNI selection without a restart.
//!
//! # Layout
//! * [`CertStore`]: the live state every listener's SNI resolver and the exchange read: the
//!   ACME certificates by name, the pending challenges, the OCSP staples, and each name's
//!   status for `GET /certificates`. There is no process-global one: the runtime owns one
//!   (`runtime::live::Live`, made with the runtime), binds it into every snapshot's
//!   `certs` slot (which the listeners' resolvers read) and hands it to the ACME thread, the
//!   OCSP tasks and the admin reports. It survives reloads: a reload that keeps a name keeps
//!   its certificate and its renewal schedule.
//! * [`storage`]: the account and certificates on disk (0600, written atomically, reused
//!   across restarts).
//! * [`order`]: one issuance with `instant-acme` (account, order, challenges, CSR, chain).
//! * [`manager`]: the background thread: one task per name, which loads or orders its
//!   certificate, retries with backoff, and sleeps until the renewal time. It never runs on a
//!   worker, so issuance adds nothing to the data path.
//!
//! * [`ocsp`]: OCSP staples for every certificate that names a responder (files too), kept
//!   by the same thread.
//!
//! Challenges: `http-01` is answered by the exchange on every listener, before routes and
//! redirects (a pending-challenge counter keeps that check to one atomic load when nothing
//! is pending); `tls-alpn-01` by the TLS listeners' certificate resolver (ALPN `acme-tls/1`),
//! after which the connection closes.

mod dns;
pub mod local;
pub(crate) mod manager;
pub(crate) mod ocsp;
mod order;
pub(crate) mod report;
pub mod rfc2136;
pub(crate) mod shared;
pub mod storage;
mod tsig_key;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::sign::CertifiedKey;

pub use crate::tls::ACME_TLS_ALPN;
pub use dns::DnsProvider;

/// One TLS listener's certificates, as the ACME thread ([`manager::Plan`]) and the
/// certificate report read them (the config builds them from its listeners).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListenerCerts<'a> {
    pub name: &'a str,
    /// The certificate files, in the config's order.
    pub files: &'a [crate::tls::TlsFiles],
    /// The names served with ACME certificates.
    pub acme: &'a [String],
    /// The listener's own ACME settings (`[listeners.NAME.tls.acme]` with a `challenge`);
    /// `None`: `[server.acme]`'s.
    pub acme_settings: Option<&'a Arc<AcmeSettings>>,
}

/// The path prefix of http-01 challenges (RFC 8555 section 8.3).
pub const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

/// Let's Encrypt's production directory, the default.
pub const DEFAULT_DIRECTORY: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// How a name proves control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    /// A file under `/.well-known/acme-challenge/` on port 80 (or the CA's HTTP port).
    Http01,
    /// A special certificate on port 443 for ALPN `acme-tls/1`.
    TlsAlpn01,
    /// A TXT record `_acme-challenge.NAME`, set through the `dns` provider; the only one
    /// that proves wildcard names.
    Dns01,
}

impl Challenge {
    /// The name used in the config and in `/certificates`.
    pub fn as_str(self) -> &'static str {
        match self {
            Challenge::Http01 => "http-01",
            Challenge::TlsAlpn01 => "tls-alpn-01",
            Challenge::Dns01 => "dns-01",
        }
    }
}

/// `[server.acme]`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeSettings {
    /// The account's contact (`mailto:`); `None`: an account without contact.
    pub email: Option<String>,
    /// The directory URL.
    pub directory: String,
    /// Where the account and certificates are kept.
    pub storage: PathBuf,
    /// Extra CAs trusted for the directory's HTTPS (a private or test CA); `None`: the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// The challenge to use; `None`: tls-alpn-01 first, http-01 when a plain listener exists
    /// and tls-alpn-01 failed.
    pub challenge: Option<Challenge>,
    /// Renew this long before expiry (at least a third of the lifetime is always left).
    pub renew_before: Duration,
    /// A plain HTTP listener exists (http-01 can be answered).
    pub plain_listener: bool,
    /// `storage = "redis"`: the `[server.redis]` the account, certificates, locks and
    /// challenges are shared through (`storage` then holds the local copies).
    pub redis: Option<crate::fleet::redis::RedisSpec>,
    /// DNS-01: how the TXT records are set and cleared (`dns = { command }` or
    /// `dns = { rfc2136 }`).
    pub dns: DnsProvider,
    /// DNS-01: how long to wait for the TXT record to be answered (`propagation_timeout`).
    pub propagation_timeout: Duration,
    /// DNS-01: the servers asked whether the record is answered (`[server] resolvers`;
    /// empty: the system's).
    pub resolvers: Vec<std::net::SocketAddr>,
}

/// One name's state, for `GET /certificates` and the metrics.
#[derive(Debug, Clone, Default)]
pub struct CertStatus {
    /// The issuer's common name (or full DN), once a certificate is held.
    pub issuer: Option<String>,
    /// When the held certificate expires.
    pub not_after: Option<SystemTime>,
    /// When the next renewal (or retry) is due.
    pub next_attempt: Option<SystemTime>,
    /// The last failure, as the CA or the network said it; cleared on success.
    pub last_error: Option<String>,
    /// Orders placed by this process for the name.
    pub orders: u64,
}

/// A stapled key and when its OCSP response goes stale (`nextUpdate`).
type Staple = (Arc<CertifiedKey>, Option<SystemTime>);

/// The runtime's ACME state (see the module doc).
pub struct CertStore {
    certs: ArcSwap<HashMap<String, Arc<CertifiedKey>>>,
    /// http-01 tokens -> key authorizations.
    tokens: Mutex<HashMap<String, String>>,
    /// tls-alpn-01 validation certificates by name.
    alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// Challenges being served: when 0, no request or handshake looks any further.
    pending: AtomicUsize,
    status: Mutex<BTreeMap<String, CertStatus>>,
    /// Issuance failures since start (`veloxy_acme_failures_total`).
    pub failures: AtomicUsize,
    /// Stapled keys by leaf certificate (DER), with the response's `nextUpdate`.
    staples: ArcSwap<HashMap<Vec<u8>, Staple>>,
    /// Any staple held: when false, handshakes skip the lookup.
    stapling: AtomicBool,
    /// The local CA's leaves (`local_ca = true` listeners) by name, replaced at each bind.
    local: ArcSwap<HashMap<String, Arc<CertifiedKey>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for CertStore {
    fn default() -> Self {
        CertStore::new()
    }
}

impl CertStore {
    /// An empty store: no certificate, challenge, status or staple. The runtime makes one
    /// (`runtime::live::Live`); compiling a config makes none.
    pub fn new() -> CertStore {
        CertStore {
            certs: ArcSwap::from_pointee(HashMap::new()),
            tokens: Mutex::default(),
            alpn: Mutex::default(),
            pending: AtomicUsize::new(0),
            status: Mutex::default(),
            failures: AtomicUsize::new(0),
            staples: ArcSwap::from_pointee(HashMap::new()),
            stapling: AtomicBool::new(false),
            local: ArcSwap::from_pointee(HashMap::new()),
        }
    }

    /// The local CA's leaf for `name` (lowercase), if a `local_ca` listener serves it.
    pub fn local_cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.local.load().get(name).cloned()
    }

    /// Replaces the local CA's leaves (each of a leaf's names maps to it).
    pub(crate) fn set_local(&self, leaves: HashMap<String, Arc<CertifiedKey>>) {
        self.local.store(Arc::new(leaves));
    }

    /// The ACME certificate held for `name` (lowercase), if any.
    pub fn cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.certs.load().get(name).cloned()
    }

    /// The certificate a handshake for `name` gets: the name's own, else a wildcard's
    /// (`*.example.com` for `www.example.com`, one label).
    pub fn serving(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let certs = self.certs.load();
        if let Some(k) = certs.get(name) {
            return Some(k.clone());
        }
        let parent = name.split_once('.')?.1;
        certs.get(&format!("*.{parent}")).cloned()
    }

    /// Installs (or replaces) `name`'s certificate: new handshakes use it at once.
    pub(crate) fn install(&self, name: &str, key: Arc<CertifiedKey>) {
        self.certs.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(name.to_owned(), key.clone());
            m
        });
    }

    /// Forgets names no longer configured (after a reload).
    pub(crate) fn retain(&self, names: &std::collections::HashSet<String>) {
        self.certs.rcu(|m| {
            m.iter()
                .filter(|(n, _)| names.contains(*n))
                .map(|(n, k)| (n.clone(), k.clone()))
                .collect::<HashMap<_, _>>()
        });
        lock(&self.status).retain(|n, _| names.contains(n));
    }

    /// The key authorization for an http-01 request `target`, when that challenge is
    /// pending. One atomic load when nothing is.
    #[inline]
    pub fn http01(&self, target: &str) -> Option<String> {
        if self.pending.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let token = target.strip_prefix(HTTP01_PREFIX)?;
        let token = token.split('?').next().unwrap_or("");
        lock(&self.tokens).get(token).cloned()
    }

    /// The tls-alpn-01 validation certificate for `name`, when pending.
    pub fn alpn_cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        if self.pending.load(Ordering::Relaxed) == 0 {
            return None;
        }
        lock(&self.alpn).get(name).cloned()
    }

    pub(crate) fn add_token(&self, token: &str, key_auth: &str) {
        lock(&self.tokens).insert(token.to_owned(), key_auth.to_owned());
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn remove_token(&self, token: &str) {
        if lock(&self.tokens).remove(token).is_some() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_alpn(&self, name: &str, cert: Arc<CertifiedKey>) {
        lock(&self.alpn).insert(name.to_owned(), cert);
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn remove_alpn(&self, name: &str) {
        if lock(&self.alpn).remove(name).is_some() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Updates `name`'s status.
    pub(crate) fn set_status(&self, name: &str, f: impl FnOnce(&mut CertStatus)) {
        f(lock(&self.status).entry(name.to_owned()).or_default());
    }

    /// `key` with its OCSP staple, when one is held for its leaf. One atomic load when no
    /// staple is held at all.
    #[inline]
    pub fn stapled(&self, key: Arc<CertifiedKey>) -> Arc<CertifiedKey> {
        if !self.stapling.load(Ordering::Relaxed) {
            return key;
        }
        let Some(leaf) = key.cert.first() else {
            return key;
        };
        match self.staples.load().get(leaf.as_ref()) {
            Some((stapled, _)) => stapled.clone(),
            None => key,
        }
    }

    /// Holds `key` (which carries its OCSP response) for its leaf until `until`.
    pub(crate) fn staple(&self, key: Arc<CertifiedKey>, until: Option<SystemTime>) {
        let Some(leaf) = key.cert.first().map(|c| c.as_ref().to_vec()) else {
            return;
        };
        self.staples.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(leaf.clone(), (key.clone(), until));
            m
        });
        self.stapling.store(true, Ordering::Relaxed);
    }

    /// Drops staples whose `nextUpdate` has passed (a stale response is worse than none).
    pub(crate) fn expire_staples(&self) {
        let now = SystemTime::now();
        self.staples.rcu(|m| {
            m.iter()
                .filter(|(_, (_, until))| until.is_none_or(|u| u > now))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>()
        });
    }

    /// Every name's status, by name.
    pub fn statuses(&self) -> BTreeMap<String, CertStatus> {
        lock(&self.status).clone()
    }
}

/// What the listeners' SNI resolver asks on each handshake.
impl crate::tls::LiveCerts for CertStore {
    fn alpn_cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        CertStore::alpn_cert(self, name)
    }

    fn cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        CertStore::serving(self, name)
    }

    fn local_cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        CertStore::local_cert(self, name)
    }

    #[inline]
    fn stapled(&self, key: Arc<CertifiedKey>) -> Arc<CertifiedKey> {
        CertStore::stapled(self, key)
    }
}

/// veloxy's folder `sub` for data it keeps (ACME storage, the local CA of
/// `--tls-self-signed`): `$XDG_DATA_HOME/veloxy/SUB`, else `$HOME/.local/share/veloxy/SUB`,
/// else `./.veloxy/SUB`.
pub fn data_dir(sub: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("veloxy").join(sub);
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".local/share/veloxy").join(sub);
    }
    PathBuf::from(".veloxy").join(sub)
}
