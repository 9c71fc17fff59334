//! The local certificate authority (Caddy's "internal issuer"): a CA kept on disk in the data
//! directory (`pki/ca.pem`, `pki/ca-key.pem`, made once, key mode 0600) and leaf certificates
//! it signs for the names of a listener with `local_ca = true` (and for `--tls-self-signed`).
//! A client told once to trust the CA (`veloxy trust`, `curl --cacert`) trusts every leaf.
//!
//! Leaves are issued in memory when a config is bound to the runtime (never by `check`), valid
//! for a year, and issued again at each start and reload. Keys are ECDSA P-256.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::sign::CertifiedKey;

/// Where the local CA lives: `$XDG_DATA_HOME/veloxy/pki`, else `~/.local/share/veloxy/pki`,
/// else `./.veloxy/pki`.
pub fn default_dir() -> PathBuf {
    super::data_dir("pki")
}

/// A failure of the local CA: what it was doing, on which file, and why.
#[derive(Debug, thiserror::Error)]
#[error("local CA: {what} {}: {cause}", path.display())]
pub struct LocalCaError {
    what: &'static str,
    path: PathBuf,
    cause: String,
}

fn fail(what: &'static str, path: &Path, cause: impl std::fmt::Display) -> LocalCaError {
    LocalCaError {
        what,
        path: path.to_owned(),
        cause: cause.to_string(),
    }
}

/// The CA of `dir`, made there first if it has none: its certificate (PEM) and its signer.
pub struct LocalCa {
    /// The CA certificate file.
    pub cert_path: PathBuf,
    /// Its PEM text.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl LocalCa {
    /// Loads the CA of `dir`, or makes one (creating `dir`).
    pub fn open(dir: &Path) -> Result<LocalCa, LocalCaError> {
        fs::create_dir_all(dir).map_err(|e| fail("cannot create", dir, e))?;
        let cert_path = dir.join("ca.pem");
        let key_path = dir.join("ca-key.pem");
        if !cert_path.exists() || !key_path.exists() {
            let key = KeyPair::generate().map_err(|e| fail("cannot make a key for", dir, e))?;
            let mut params = CertificateParams::default();
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, "veloxy Local CA");
            dn.push(DnType::OrganizationName, "veloxy");
            params.distinguished_name = dn;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let cert = params
                .self_signed(&key)
                .map_err(|e| fail("cannot sign", &cert_path, e))?;
            super::storage::write_private(&key_path, key.serialize_pem().as_bytes())
                .map_err(|e| fail("cannot write", &key_path, e))?;
            fs::write(&cert_path, cert.pem()).map_err(|e| fail("cannot write", &cert_path, e))?;
        }
        let cert_pem =
            fs::read_to_string(&cert_path).map_err(|e| fail("cannot read", &cert_path, e))?;
        let key_pem =
            fs::read_to_string(&key_path).map_err(|e| fail("cannot read", &key_path, e))?;
        let key =
            KeyPair::from_pem(&key_pem).map_err(|e| fail("no usable key in", &key_path, e))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|e| fail("no usable CA certificate in", &cert_path, e))?;
        Ok(LocalCa {
            cert_path,
            cert_pem,
            issuer,
        })
    }

    /// A leaf for `names` (host names or IP addresses; the first is its common name),
    /// valid for as long as rcgen's default (to the year 4096: the CA is the trust anchor).
    fn sign(&self, names: &[String]) -> Result<(rcgen::Certificate, KeyPair), LocalCaError> {
        let key =
            KeyPair::generate().map_err(|e| fail("cannot make a key for", &self.cert_path, e))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| fail("bad names for", &self.cert_path, e))?;
        for n in names {
            let san = match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    n.clone()
                        .try_into()
                        .map_err(|e| fail("bad name for", &self.cert_path, e))?,
                ),
            };
            params.subject_alt_names.push(san);
        }
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().map_or("localhost", String::as_str),
        );
        params.distinguished_name = dn;
        let leaf = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| fail("cannot sign a leaf with", &self.cert_path, e))?;
        Ok((leaf, key))
    }

    /// A leaf for `names` as PEM: its chain (leaf, then the CA) and its key.
    pub fn issue_pem(&self, names: &[String]) -> Result<(String, String), LocalCaError> {
        let (leaf, key) = self.sign(names)?;
        Ok((
            format!("{}{}", leaf.pem(), self.cert_pem),
            key.serialize_pem(),
        ))
    }

    /// A leaf for `names` as a key rustls serves (the chain: leaf, then the CA).
    pub fn issue(&self, names: &[String]) -> Result<Arc<CertifiedKey>, LocalCaError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let (leaf, key) = self.sign(names)?;
        let ca = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| fail("no usable CA certificate in", &self.cert_path, e))?;
        let chain = vec![leaf.der().clone(), ca];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        crate::tls::certified_key(chain, key)
            .map(Arc::new)
            .map_err(|e| fail("cannot load a leaf of", &self.cert_path, e))
    }
}
