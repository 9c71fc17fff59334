//! TLS with rustls: certificate loading and checks, SNI selection, the downstream (server)
//! and upstream (client) configurations, and the downstream stream type that is either plain
//! TCP or TLS.
//!
//! Certificates are loaded and checked when the config is compiled, so a missing or unreadable
//! file, a key that does not match its certificate, or an expired certificate refuses the
//! config (and a reload) with an error that names the file. The crypto provider is aws-lc-rs:
//! its AES-GCM and P-256/X25519 code is assembly-optimised, like OpenSSL's.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::late::Late;

/// Why a certificate, key or CA file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no PEM private key found (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: PathBuf },
    #[error("{path}: unsupported private key: {message}")]
    BadKey { path: PathBuf, message: String },
    #[error("{key}: the private key does not match the certificate in {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("{path}: certificate is not valid: {message}")]
    BadCertificate { path: PathBuf, message: String },
    #[error("{path}: certificate expired on {when}")]
    Expired { path: PathBuf, when: String },
    #[error("{path}: certificate is not valid before {when}")]
    NotYetValid { path: PathBuf, when: String },
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsError {
    /// True when the error is about the private key rather than the certificate, so a config
    /// error can point at the line naming the key. A key that does not match its certificate
    /// counts as the key's problem: the certificate was read and checked before the
    /// comparison. `key` tells a failed read of the key file from one of the certificate.
    pub fn is_about_key(&self, cert: &Path, key: &Path) -> bool {
        match self {
            TlsError::NoKey { .. } | TlsError::BadKey { .. } | TlsError::KeyMismatch { .. } => true,
            // The certificate is read first: a read error naming a file that is both
            // (a combined PEM) came from reading it as the certificate.
            TlsError::Read { path, .. } => path == key && path != cert,
            _ => false,
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads every certificate of a PEM file (a chain: leaf first).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::BadCertificate {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Loads a certificate chain and its key, and checks that they match and that the leaf is
/// valid now.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let certs = load_certs(cert)?;
    check_validity(cert, &certs[0])?;
    let key_pem = read(key)?;
    let der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::NoKey {
        path: key.to_path_buf(),
    })?;
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| TlsError::BadKey {
            path: key.to_path_buf(),
            message: e.to_string(),
        })?;
    let ck = CertifiedKey::new(certs, signing);
    match ck.keys_match() {
        Ok(()) => Ok(ck),
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        }),
        // Keys whose public half cannot be derived cannot be compared; rustls then checks
        // them at the first handshake.
        Err(_) => Ok(ck),
    }
}

/// A chain and its key (DER) as a rustls key, for certificates made in memory (ACME).
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, rustls::Error> {
    let signing = provider().key_provider.load_private_key(key)?;
    Ok(CertifiedKey::new(chain, signing))
}

/// What `/certificates` shows of a leaf certificate.
#[derive(Debug, Clone)]
pub struct LeafInfo {
    pub not_before: std::time::SystemTime,
    pub not_after: std::time::SystemTime,
    /// The issuer's common name, or its whole name when it has none.
    pub issuer: String,
    /// The subject alternative names (DNS).
    pub names: Vec<String>,
}

/// Reads a leaf certificate's validity, issuer and names.
pub fn leaf_info(leaf: &CertificateDer<'_>) -> Option<LeafInfo> {
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf).ok()?;
    let at = |t: x509_parser::time::ASN1Time| {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.timestamp().max(0) as u64)
    };
    let issuer = parsed
        .issuer()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok().map(str::to_owned))
        .unwrap_or_else(|| parsed.issuer().to_string());
    let names = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(LeafInfo {
        not_before: at(parsed.validity().not_before),
        not_after: at(parsed.validity().not_after),
        issuer,
        names,
    })
}

fn check_validity(path: &Path, leaf: &CertificateDer<'_>) -> Result<(), TlsError> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::BadCertificate {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let validity = parsed.validity();
    let now = x509_parser::time::ASN1Time::now();
    if validity.not_after < now {
        return Err(TlsError::Expired {
            path: path.to_path_buf(),
            when: validity.not_after.to_string(),
        });
    }
    if validity.not_before > now {
        return Err(TlsError::NotYetValid {
            path: path.to_path_buf(),
            when: validity.not_before.to_string(),
        });
    }
    Ok(())
}

/// A certificate chain and key of a TLS listener, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// SNI names it is chosen for (exact or `*.domain`); empty for the default certificate.
    pub hosts: Vec<String>,
    /// Absolute path of the PEM chain.
    pub cert: PathBuf,
    /// Absolute path of the PEM key.
    pub key: PathBuf,
}

/// One certificate of a listener, with the host names it is chosen for.
pub struct CertEntry {
    /// Exact names (`api.example.com`) or wildcards (`*.example.com`); empty: only as default.
    pub hosts: Vec<String>,
    pub key: Arc<CertifiedKey>,
}

/// The ALPN protocol of tls-alpn-01 validation connections (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Certificates that change while a listener runs, asked on every handshake: the ACME
/// certificates by name, the pending tls-alpn-01 validation certificates, and the OCSP
/// staples of any certificate. The runtime's ACME store implements it
/// (`crate::acme::CertStore`); the listener's config holds it through the snapshot's
/// `Late` slot, so this layer needs no ACME.
pub trait LiveCerts: Send + Sync {
    /// The tls-alpn-01 validation certificate for `name` (lowercase), when pending.
    fn alpn_cert(&self, name: &str) -> Option<Arc<CertifiedKey>>;
    /// The ACME certificate held for `name` (lowercase), if any.
    fn cert(&self, name: &str) -> Option<Arc<CertifiedKey>>;
    /// The local CA's leaf for `name` (lowercase), on `local_ca` listeners.
    fn local_cert(&self, name: &str) -> Option<Arc<CertifiedKey>>;
    /// `key` with its OCSP staple, when one is held for its leaf.
    fn stapled(&self, key: Arc<CertifiedKey>) -> Arc<CertifiedKey>;
}

/// Picks the certificate by SNI: a tls-alpn-01 validation certificate for ACME's validation
/// handshakes, the ACME certificate of the name (on listeners with `acme`), the exact name,
/// then a wildcard (one label), then the first entry for any name (`*`), then the default
/// (the listener's `cert`, or its first `certs` entry). Clients without SNI get the default. With no certificate at all (an ACME name
/// before its first issuance, on a listener without files) the handshake fails with an alert.
/// Every certificate chosen gets its OCSP staple from `live`. Until the runtime binds `live`
/// (a config compiled but not run), handshakes get no ACME certificate and no staple.
struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// The first entry with the host `*`: any name no exact or wildcard entry has.
    any: Option<Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    acme: bool,
    /// `local_ca = true`: the local CA's leaves, this name's for clients without SNI (or
    /// asking for a name the listener does not have).
    local: Option<String>,
    live: Late<dyn LiveCerts>,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniResolver")
            .field("exact", &self.exact)
            .field("wildcard", &self.wildcard)
            .field("any", &self.any)
            .field("default", &self.default)
            .field("acme", &self.acme)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.acme
            && hello
                .alpn()
                .is_some_and(|mut p| p.any(|p| p == ACME_TLS_ALPN))
        {
            // A tls-alpn-01 validation: its own certificate, or none.
            return self
                .live
                .try_get()?
                .alpn_cert(&hello.server_name()?.to_ascii_lowercase());
        }
        let key = self.choose(hello.server_name())?;
        Some(match self.live.try_get() {
            Some(live) => live.stapled(key),
            None => key,
        })
    }
}

impl SniResolver {
    fn choose(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let Some(name) = name else {
            return self.default.clone().or_else(|| self.local_default());
        };
        let name = name.to_ascii_lowercase();
        if self.acme {
            if let Some(k) = self.live.try_get().and_then(|l| l.cert(&name)) {
                return Some(k);
            }
        }
        if self.local.is_some() {
            if let Some(k) = self.live.try_get().and_then(|l| l.local_cert(&name)) {
                return Some(k);
            }
        }
        if let Some(k) = self.exact.get(&name) {
            return Some(k.clone());
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(k) = self.wildcard.get(parent) {
                return Some(k.clone());
            }
        }
        if let Some(k) = &self.any {
            return Some(k.clone());
        }
        self.default.clone().or_else(|| self.local_default())
    }

    /// The local CA's leaf of the listener's first name.
    fn local_default(&self) -> Option<Arc<CertifiedKey>> {
        let name = self.local.as_deref()?;
        self.live.try_get()?.local_cert(name)
    }
}

/// Builds a listener's server config. `certs[0]` is the default certificate; `acme`: the
/// listener also serves ACME certificates (and answers tls-alpn-01), so `certs` may be empty.
/// `live`: where ACME certificates and OCSP staples are looked up (the snapshot's slot for the
/// runtime's ACME store, empty until the runtime binds it).
pub fn server_config(
    certs: Vec<CertEntry>,
    http2: bool,
    acme: bool,
    local: Option<String>,
    live: Late<dyn LiveCerts>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut exact = HashMap::new();
    let mut wildcard = HashMap::new();
    let mut any = None;
    let default = certs.first().map(|c| c.key.clone());
    for c in &certs {
        for h in &c.hosts {
            let h = h.to_ascii_lowercase();
            if h == "*" {
                any.get_or_insert_with(|| c.key.clone());
                continue;
            }
            match h.strip_prefix("*.") {
                Some(parent) => wildcard.insert(parent.to_string(), c.key.clone()),
                None => exact.insert(h, c.key.clone()),
            };
        }
    }
    let resolver = SniResolver {
        exact,
        wildcard,
        any,
        default,
        acme,
        local,
        live,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    if acme {
        // Offered only by ACME validation clients; the connection closes after the handshake.
        config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
    }
    // Resumption: stateless tickets (TLS 1.2 and 1.3) plus a session-id cache for TLS 1.2
    // clients without ticket support. One TLS 1.3 ticket per handshake is enough for clients
    // that reconnect one connection at a time, and halves the ticket work of rustls' default.
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
    config.send_tls13_tickets = 1;
    Ok(Arc::new(config))
}

/// The QUIC (HTTP/3) server config of a TLS listener: the same certificate choice as
/// `tcp` (its resolver and session tickets), TLS 1.3 only, ALPN `h3`, 0-RTT only when
/// `zero_rtt`, and the stream and idle limits.
pub fn quic_server_config(
    tcp: &rustls::ServerConfig,
    max_streams: u32,
    idle: std::time::Duration,
    zero_rtt: bool,
) -> Result<quinn::ServerConfig, String> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(tcp.cert_resolver.clone());
    tls.alpn_protocols = vec![b"h3".to_vec()];
    // QUIC requires the maximum (0xffffffff) when early data is on: its own flow control
    // bounds what 0-RTT may carry.
    tls.max_early_data_size = if zero_rtt { u32::MAX } else { 0 };
    if zero_rtt {
        // rustls accepts early data only with stateful resumption: tickets are kept in memory
        // and each can be used once, so a captured 0-RTT flight replayed to this listener
        // finds its ticket gone and gets a full handshake.
        tls.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
        tls.send_tls13_tickets = 1;
    } else {
        tls.ticketer = tcp.ticketer.clone();
    }
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls))
        .map_err(|e| e.to_string())?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(max_streams.into())
        // A client needs a control stream and two QPACK streams (plus grease): a few.
        .max_concurrent_uni_streams(8u32.into())
        // Flow-control windows as for HTTP/2 (256 KiB per stream, 1 MiB per connection):
        // what a client may send ahead (quinn's default connection window is unbounded), and
        // what veloxy keeps unacknowledged per connection (quinn's default is 10 MB).
        .stream_receive_window((256u32 * 1024).into())
        .receive_window((1024u32 * 1024).into())
        .send_window(2 * 1024 * 1024)
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(idle).map_err(|e| e.to_string())?,
        ));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// A client config for `https://` upstreams: the system's roots, or only the CA file's.
pub fn client_config(
    ca_file: Option<&Path>,
    alpn_h2: bool,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for c in load_certs(path)? {
                roots.add(c).map_err(|e| TlsError::BadCertificate {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
            }
        }
        None => {
            // Unreadable system certificates are skipped, like every TLS client does.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = if alpn_h2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(Arc::new(config))
}

/// A client config for `https://` upstreams of a group with `tls_verify = false`: any
/// certificate is accepted (the handshake's signatures are still checked, so the session
/// is with the holder of the certificate's key, whoever that is). For backends with
/// self-signed certificates on a network the operator trusts, as HAProxy's `verify none`,
/// Caddy's `tls_insecure_skip_verify` and Traefik's `insecureSkipVerify`.
pub fn client_config_unverified(alpn_h2: bool) -> Arc<rustls::ClientConfig> {
    let provider = provider();
    let verifier = Arc::new(AnyCertificate(provider.clone()));
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the provider supports TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = if alpn_h2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Arc::new(config)
}

/// Accepts every server certificate; verifies handshake signatures with the provider's
/// algorithms.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Writes all of `data`, then flushes. A TLS stream may still hold encrypted bytes after
/// `write_all` returns (when the socket was full): only a later write, a flush or a shutdown
/// sends them, and a read never does. On plain TCP the flush costs nothing.
pub(crate) async fn send_all<S>(stream: &mut S, data: &[u8]) -> io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    stream.write_all(data).await?;
    stream.flush().await
}

/// A downstream connection's byte stream: plain TCP or TLS over TCP.
///
/// An enum rather than a boxed trait object: the plain case, the common one behind a TLS
/// terminating load balancer, stays a direct call.
pub enum DownstreamIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl DownstreamIo {
    /// The TCP socket underneath (socket options, linger).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            DownstreamIo::Plain(s) => s,
            DownstreamIo::Tls(s) => s.get_ref().0,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, DownstreamIo::Tls(_))
    }
}

macro_rules! delegate_io {
    ($t:ident, $($variant:ident),+) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($t::$variant(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }

        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($t::$variant(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($t::$variant(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $($t::$variant(s) => s.is_write_vectored(),)+
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($t::$variant(s) => Pin::new(s).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($t::$variant(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate_io!(DownstreamIo, Plain, Tls);

/// An upstream connection's byte stream: plain TCP or TLS over TCP.
pub enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// A unix-socket backend (`unix:/path`).
    Unix(tokio::net::UnixStream),
}

delegate_io!(UpstreamIo, Plain, Tls, Unix);

/// A stream with bytes already read from it put back in front (an HTTP/2 preface found
/// while looking for an HTTP/1 request head).
pub struct Prefixed<S> {
    prefix: bytes::Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: bytes::Bytes, inner: S) -> Self {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(name: &str) -> Arc<CertifiedKey> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        Arc::new(certified_key(vec![cert.der().clone()], der).unwrap())
    }

    /// Whether the server picks a certificate for a ClientHello naming `sni` and offering
    /// `alpn` (the resolver runs when the server reads the hello).
    fn answers(config: &Arc<rustls::ServerConfig>, sni: &str, alpn: &[u8]) -> bool {
        let mut client_config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        client_config.alpn_protocols = vec![alpn.to_vec()];
        let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();
        let mut server = rustls::ServerConnection::new(config.clone()).unwrap();
        let mut hello = Vec::new();
        client.write_tls(&mut hello).unwrap();
        server.read_tls(&mut hello.as_slice()).unwrap();
        server.process_new_packets().is_ok()
    }

    /// `*` is chosen for a name no exact or wildcard entry has, before the default; clients
    /// without SNI still get the default.
    #[test]
    fn the_any_name_entry_comes_after_exact_and_wildcard_names() {
        let (default, exact, wild, any) = (
            self_signed("default.test"),
            self_signed("a.test"),
            self_signed("b.wild.test"),
            self_signed("any.test"),
        );
        let mut r = SniResolver {
            exact: HashMap::from([("a.test".to_owned(), exact.clone())]),
            wildcard: HashMap::from([("wild.test".to_owned(), wild.clone())]),
            any: Some(any.clone()),
            default: Some(default.clone()),
            acme: false,
            local: None,
            live: Late::empty(),
        };
        let is = |got: Option<Arc<CertifiedKey>>, want: &Arc<CertifiedKey>| {
            got.is_some_and(|g| Arc::ptr_eq(&g, want))
        };
        assert!(is(r.choose(Some("A.test")), &exact));
        assert!(is(r.choose(Some("b.wild.test")), &wild));
        assert!(is(r.choose(Some("other.example")), &any));
        assert!(is(r.choose(None), &default));
        r.any = None;
        assert!(is(r.choose(Some("other.example")), &default));
        // server_config takes `*` from the entries' hosts, the first such entry winning.
        let entry = |hosts: &[&str], key: &Arc<CertifiedKey>| CertEntry {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            key: key.clone(),
        };
        let entries = vec![
            entry(&[], &default),
            entry(&["*"], &any),
            entry(&["*"], &exact),
        ];
        let config = server_config(entries, false, false, None, Late::empty()).unwrap();
        assert!(answers(&config, "other.example", b"http/1.1"));
    }

    #[test]
    fn an_unbound_store_serves_files_only_and_never_panics() {
        let slot = Late::<dyn LiveCerts>::empty();
        let files = vec![CertEntry {
            hosts: vec!["files.test".into()],
            key: self_signed("files.test"),
        }];
        let with_files = server_config(files, false, true, None, slot.clone()).unwrap();
        let acme_only = server_config(Vec::new(), false, true, None, slot.clone()).unwrap();
        // Unbound (a config compiled, not run): the files' default, no ACME certificate, no
        // tls-alpn-01 certificate.
        assert!(answers(&with_files, "acme.test", b"http/1.1"));
        assert!(!answers(&with_files, "acme.test", ACME_TLS_ALPN));
        assert!(!answers(&acme_only, "acme.test", b"http/1.1"));

        // Bound: the store's certificates reach every config holding the slot.
        let store = Arc::new(crate::acme::CertStore::new());
        store.install("acme.test", self_signed("acme.test"));
        store.add_alpn("acme.test", self_signed("acme.test"));
        slot.set(store as Arc<dyn LiveCerts>);
        assert!(answers(&acme_only, "acme.test", b"http/1.1"));
        assert!(answers(&acme_only, "acme.test", ACME_TLS_ALPN));
        assert!(answers(&with_files, "acme.test", ACME_TLS_ALPN));
        assert!(!answers(&acme_only, "other.test", b"http/1.1"));
    }
}
