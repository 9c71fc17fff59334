//! One issuance with `instant-acme`: the account (created once, then loaded from storage),
//! an order for one name, its challenge served through the [`CertStore`], a CSR for a fresh
//! P-256 key, and the chain. Every network step has a deadline (the crate has none of its
//! own).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, BodyWrapper, ChallengeType, HttpClient,
    Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use rustls::sign::CertifiedKey;

use super::shared::SharedStorage;
use super::{storage, AcmeSettings, CertStore, Challenge};

/// Why an issuance failed. `Display` is what the log and `/certificates` show.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OrderError {
    /// The CA answered with a problem document (a refused order, a failed validation, a rate
    /// limit): its detail and type.
    #[error("the CA refused: {0}")]
    Refused(String),
    /// The directory could not be reached or answered nonsense.
    #[error("ACME directory {directory} unreachable: {message}")]
    Unreachable { directory: String, message: String },
    #[error("no answer from the ACME server within {0:?}")]
    Timeout(Duration),
    #[error("ACME: {0}")]
    Other(String),
    /// An RFC 2136 update failed (the server's RCODE and TSIG error named).
    #[error("dns-01 rfc2136: {0}")]
    DnsUpdate(Box<super::rfc2136::UpdateError>),
}

impl From<super::rfc2136::UpdateError> for OrderError {
    fn from(e: super::rfc2136::UpdateError) -> Self {
        OrderError::DnsUpdate(Box::new(e))
    }
}

impl OrderError {
    /// Counts against the CA's failed-validation limits (retry slowly), as opposed to a
    /// network failure (retry soon).
    pub fn is_refusal(&self) -> bool {
        // A stale anti-replay nonce is not a refusal: RFC 8555 6.5 has the client simply try
        // again (Pebble rejects 5% of nonces on purpose to exercise this).
        matches!(self, OrderError::Refused(d) if !d.contains("acme:error:badNonce"))
    }

    /// The CA said to slow down.
    pub fn is_rate_limit(&self) -> bool {
        matches!(self, OrderError::Refused(m) if m.contains("rateLimited"))
    }

    /// The stored account is unknown to the CA (a test CA restarted, or the account was
    /// deactivated): a new one is created on the next attempt.
    pub fn lost_account(&self) -> bool {
        matches!(self, OrderError::Refused(m) if m.contains("accountDoesNotExist"))
    }
}

fn classify(directory: &str, e: instant_acme::Error) -> OrderError {
    match e {
        instant_acme::Error::Api(p) => OrderError::Refused(p.to_string()),
        instant_acme::Error::Timeout(_) => OrderError::Timeout(STEP_TIMEOUT),
        instant_acme::Error::Http(_) | instant_acme::Error::Other(_) => OrderError::Unreachable {
            directory: directory.to_owned(),
            message: error_chain(&e),
        },
        other => OrderError::Other(error_chain(&other)),
    }
}

/// The error and its sources, joined (hyper's errors say little on their own).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Deadline of each request to the CA.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

async fn step<T>(
    directory: &str,
    f: impl std::future::Future<Output = Result<T, instant_acme::Error>>,
) -> Result<T, OrderError> {
    match tokio::time::timeout(STEP_TIMEOUT, f).await {
        Err(_) => Err(OrderError::Timeout(STEP_TIMEOUT)),
        Ok(r) => r.map_err(|e| classify(directory, e)),
    }
}

/// The HTTP client for the CA: rustls with the system's roots, or `ca_file`'s.
fn http_client(settings: &AcmeSettings) -> Result<Box<dyn HttpClient>, OrderError> {
    let tls = crate::tls::client_config(settings.ca_file.as_deref(), false)
        .map_err(|e| OrderError::Other(e.to_string()))?;
    let mut tls = rustls::ClientConfig::clone(&tls);
    // hyper-rustls sets ALPN itself (and panics on a config that has some).
    tls.alpn_protocols.clear();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let client: hyper_util::client::legacy::Client<_, BodyWrapper<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https);
    Ok(Box::new(client))
}

/// Loads the account stored for the directory, or creates one and stores it. With shared
/// storage the fleet's account is used (copied locally), and created under a lock.
pub(crate) async fn account(
    settings: &AcmeSettings,
    shared: Option<&SharedStorage>,
) -> Result<Account, OrderError> {
    let folder = storage::directory_folder(&settings.storage, &settings.directory);
    let path = folder.join("account.json");
    let Some(sh) = shared else {
        if let Some(a) = load_account(settings, &path, std::fs::read(&path).ok()).await? {
            return Ok(a);
        }
        return create_account(settings, &path).await;
    };
    if let Some(a) = load_account(settings, &path, sh.account().await?).await? {
        return Ok(a);
    }
    let Some(lock) = sh.lock("account").await? else {
        return Err(OrderError::Other(
            "another instance is creating the ACME account".into(),
        ));
    };
    let made = async {
        if let Some(a) = load_account(settings, &path, sh.account().await?).await? {
            return Ok(a);
        }
        let a = create_account(settings, &path).await?;
        let json = std::fs::read(&path).map_err(|e| OrderError::Other(e.to_string()))?;
        sh.put_account(&json).await?;
        Ok(a)
    }
    .await;
    let _ = sh.unlock(lock).await;
    made
}

/// The account from stored credentials, when there are readable ones (also kept in `path`).
async fn load_account(
    settings: &AcmeSettings,
    path: &Path,
    bytes: Option<Vec<u8>>,
) -> Result<Option<Account>, OrderError> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    match serde_json::from_slice::<AccountCredentials>(&bytes) {
        Ok(creds) => {
            if std::fs::read(path).ok().as_deref() != Some(&bytes[..]) {
                let _ = storage::write_private(path, &bytes);
            }
            let builder = Account::builder_with_http(http_client(settings)?);
            step(&settings.directory, builder.from_credentials(creds))
                .await
                .map(Some)
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "ACME account unreadable: creating a new account");
            Ok(None)
        }
    }
}

async fn create_account(settings: &AcmeSettings, path: &Path) -> Result<Account, OrderError> {
    let dir = &settings.directory;
    let contact = settings.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let new = NewAccount {
        contact: &contacts,
        terms_of_service_agreed: true,
        only_return_existing: false,
    };
    let builder = Account::builder_with_http(http_client(settings)?);
    let (account, creds) = step(dir, builder.create(&new, dir.clone(), None)).await?;
    let json = serde_json::to_vec(&creds).map_err(|e| OrderError::Other(e.to_string()))?;
    storage::write_private(path, &json)
        .map_err(|e| OrderError::Other(format!("{}: {e}", path.display())))?;
    tracing::info!(directory = %dir, account = %account.id(), "ACME account created");
    Ok(account)
}

/// Removes the stored account (the CA no longer knows it).
pub(crate) async fn forget_account(settings: &AcmeSettings, shared: Option<&SharedStorage>) {
    let folder = storage::directory_folder(&settings.storage, &settings.directory);
    let _ = std::fs::remove_file(folder.join("account.json"));
    if let Some(sh) = shared {
        let _ = sh.forget_account().await;
    }
}

/// Challenges published for one order; withdrawn when it ends, however it ends.
struct Published<'a> {
    store: &'a CertStore,
    tokens: Vec<String>,
    alpn: Vec<String>,
    /// Fields published in shared storage: withdrawn after the validation, or on their own
    /// when the hash expires if the order failed before.
    fleet: Vec<String>,
}

impl Drop for Published<'_> {
    fn drop(&mut self) {
        self.tokens.iter().for_each(|t| self.store.remove_token(t));
        self.alpn.iter().for_each(|n| self.store.remove_alpn(n));
    }
}

/// Orders a certificate for `name` proving control by `challenge`; returns the chain and
/// key as PEM.
pub(crate) async fn issue(
    account: &Account,
    settings: &AcmeSettings,
    store: &CertStore,
    name: &str,
    challenge: Challenge,
    shared: Option<&SharedStorage>,
) -> Result<(String, String), OrderError> {
    let dir = settings.directory.as_str();
    let ids = [Identifier::Dns(name.to_owned())];
    let mut order = step(dir, account.new_order(&NewOrder::new(&ids))).await?;
    let mut published = Published {
        store,
        tokens: Vec::new(),
        alpn: Vec::new(),
        fleet: Vec::new(),
    };
    let kind = match challenge {
        Challenge::Http01 => ChallengeType::Http01,
        Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        Challenge::Dns01 => ChallengeType::Dns01,
    };
    // DNS-01 records set for this order, cleared whatever the outcome.
    let mut records: Vec<(String, String)> = Vec::new();
    let mut authzs = order.authorizations();
    while let Some(authz) = step(dir, async { authzs.next().await.transpose() }).await? {
        let mut authz = authz;
        if authz.status == AuthorizationStatus::Valid {
            continue;
        }
        let mut ch = authz.challenge(kind.clone()).ok_or_else(|| {
            OrderError::Other(format!("the CA offers no {} challenge", challenge.as_str()))
        })?;
        let ka = ch.key_authorization();
        let field = match challenge {
            Challenge::Http01 => {
                store.add_token(&ch.token, ka.as_str());
                published.tokens.push(ch.token.clone());
                (format!("http:{}", ch.token), ka.as_str().to_owned())
            }
            Challenge::TlsAlpn01 => {
                store.add_alpn(name, validation_cert(name, ka.digest().as_ref())?);
                published.alpn.push(name.to_owned());
                let digest = super::shared::hex(ka.digest().as_ref());
                (format!("alpn:{name}"), digest)
            }
            Challenge::Dns01 => {
                let (fqdn, value) = (super::dns::record_name(name), ka.dns_value());
                let set = settings.dns.run("set", &fqdn, &value).await;
                records.push((fqdn.clone(), value.clone()));
                if let Err(e) = set {
                    clear_records(settings, &records).await;
                    return Err(e);
                }
                let limit = settings.propagation_timeout;
                let witnesses = settings.dns.witnesses(&settings.resolvers);
                let answered =
                    super::dns::wait_until_answered(&witnesses, &fqdn, &value, limit).await;
                if let Err(e) = answered {
                    clear_records(settings, &records).await;
                    return Err(e);
                }
                // DNS is already shared by every instance of a fleet.
                step(dir, ch.set_ready()).await?;
                continue;
            }
        };
        if let Some(sh) = shared {
            // The CA may reach any instance: publish the answer to all of them, and give
            // them a few copies' time to take it before asking the CA to look.
            sh.publish(&field.0, &field.1).await?;
            published.fleet.push(field.0);
            tokio::time::sleep(super::shared::SYNC_EVERY * 3).await;
        }
        step(dir, ch.set_ready()).await?;
    }
    let retry = RetryPolicy::new().timeout(Duration::from_secs(90));
    let status = step_long(dir, order.poll_ready(&retry)).await;
    clear_records(settings, &records).await;
    let status = status?;
    if let Some(sh) = shared {
        for field in std::mem::take(&mut published.fleet) {
            let _ = sh.withdraw(&field).await;
        }
    }
    if status != OrderStatus::Ready {
        return Err(OrderError::Refused(format!("order ended {status:?}")));
    }
    drop(published);
    let key = rcgen::KeyPair::generate().map_err(|e| OrderError::Other(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()])
        .map_err(|e| OrderError::Other(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .map_err(|e| OrderError::Other(e.to_string()))?;
    step(dir, order.finalize_csr(csr.der())).await?;
    let chain = step_long(dir, order.poll_certificate(&retry)).await?;
    Ok((chain, key.serialize_pem()))
}

/// Clears the DNS-01 records of an order (a failure to clear is logged: the record is
/// harmless, and the next order sets its own value).
async fn clear_records(settings: &AcmeSettings, records: &[(String, String)]) {
    for (fqdn, value) in records {
        if let Err(e) = settings.dns.run("clear", fqdn, value).await {
            tracing::warn!(record = %fqdn, error = %e, "ACME dns-01: clearing the TXT record failed");
        }
    }
}

/// A polling step, bounded by its retry policy (plus a margin) rather than [`STEP_TIMEOUT`].
async fn step_long<T>(
    directory: &str,
    f: impl std::future::Future<Output = Result<T, instant_acme::Error>>,
) -> Result<T, OrderError> {
    match tokio::time::timeout(Duration::from_secs(120), f).await {
        Err(_) => Err(OrderError::Timeout(Duration::from_secs(120))),
        Ok(r) => r.map_err(|e| classify(directory, e)),
    }
}

/// The tls-alpn-01 validation certificate (RFC 8737): self-signed, the one name, and the
/// critical acmeIdentifier extension holding the key authorization's SHA-256.
pub(crate) fn validation_cert(name: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, OrderError> {
    let other = |e: rcgen::Error| OrderError::Other(e.to_string());
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(other)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate().map_err(other)?;
    let cert = params.self_signed(&key).map_err(other)?;
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| OrderError::Other(e.to_string()))?;
    crate::tls::certified_key(vec![cert.der().clone()], der)
        .map(Arc::new)
        .map_err(|e| OrderError::Other(e.to_string()))
}

/// Parses a stored or issued chain and key into a rustls key (checked to match).
pub(crate) fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, crate::tls::TlsError> {
    crate::tls::load_certified_key(cert, key)
}
