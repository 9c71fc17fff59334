//! `--tls-self-signed`: a local certificate authority kept on disk, and a fresh leaf
//! certificate for localhost at every start, like Caddy's internal issuer.
//!
//! The CA (`ca.pem`, `ca-key.pem`) is made once and reused, so a client told to trust it once
//! (`curl --cacert ca.pem`, or the system trust store) keeps trusting every later leaf. The
//! leaf (`localhost.pem` with the chain, `localhost-key.pem`) covers `localhost`, `127.0.0.1`
//! and `::1`. Keys are ECDSA P-256 and written with mode 0600.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Where the local CA lives unless `--tls-dir` says otherwise:
/// `$XDG_DATA_HOME/veloxy/pki`, else `~/.local/share/veloxy/pki`, else `./.veloxy/pki`.
pub fn default_dir() -> PathBuf {
    veloxy_engine::acme::data_dir("pki")
}

/// Paths of a leaf certificate issued by the local CA.
pub struct Issued {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Keys are written like ACME's: mode 0600, atomically.
fn write_private(path: &Path, data: &str) -> Result<()> {
    veloxy_engine::acme::storage::write_private(path, data.as_bytes())
        .with_context(|| format!("{}: cannot write", path.display()))
}

/// Makes the CA in `dir` if there is none, and issues a new localhost leaf from it.
pub fn issue(dir: &Path) -> Result<Issued> {
    fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let ca_path = dir.join("ca.pem");
    let ca_key_path = dir.join("ca-key.pem");
    if !ca_path.exists() || !ca_key_path.exists() {
        let key = KeyPair::generate().context("generating the CA key")?;
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
        let cert = params.self_signed(&key).context("signing the CA")?;
        write_private(&ca_key_path, &key.serialize_pem())?;
        fs::write(&ca_path, cert.pem())
            .with_context(|| format!("{}: cannot write", ca_path.display()))?;
    }
    let ca_pem = fs::read_to_string(&ca_path)
        .with_context(|| format!("{}: cannot read", ca_path.display()))?;
    let ca_key_pem = fs::read_to_string(&ca_key_path)
        .with_context(|| format!("{}: cannot read", ca_key_path.display()))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .with_context(|| format!("{}: not a usable key", ca_key_path.display()))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .with_context(|| format!("{}: not a usable CA certificate", ca_path.display()))?;

    let leaf_key = KeyPair::generate().context("generating the leaf key")?;
    let mut params = CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ])
    .context("leaf parameters")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "localhost");
    params.distinguished_name = dn;
    let leaf = params
        .signed_by(&leaf_key, &issuer)
        .context("signing the leaf certificate")?;
    let cert_path = dir.join("localhost.pem");
    let key_path = dir.join("localhost-key.pem");
    write_private(&key_path, &leaf_key.serialize_pem())?;
    fs::write(&cert_path, format!("{}{}", leaf.pem(), ca_pem))
        .with_context(|| format!("{}: cannot write", cert_path.display()))?;
    Ok(Issued {
        ca: ca_path,
        cert: cert_path,
        key: key_path,
    })
}
