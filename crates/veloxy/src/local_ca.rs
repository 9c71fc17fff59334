//! `--tls-self-signed` and `veloxy trust`: the engine's local certificate authority
//! (`veloxy_engine::acme::local`, the same CA as `local_ca = true` listeners) from the command
//! line: a fresh localhost leaf written to files at every start, and the CA printed (or
//! installed in the system's trust store) for clients to trust.
//!
//! The CA (`ca.pem`, `ca-key.pem`) is made once and reused, so a client told to trust it once
//! (`curl --cacert ca.pem`, or the system trust store) keeps trusting every later leaf. The
//! leaf (`localhost.pem` with the chain, `localhost-key.pem`) covers `localhost`, `127.0.0.1`
//! and `::1`. Keys are ECDSA P-256 and written with mode 0600.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use veloxy_engine::acme::local::LocalCa;

/// Where the local CA lives unless `--tls-dir` says otherwise:
/// `$XDG_DATA_HOME/veloxy/pki`, else `~/.local/share/veloxy/pki`, else `./.veloxy/pki`.
pub fn default_dir() -> PathBuf {
    veloxy_engine::acme::local::default_dir()
}

/// Paths of a leaf certificate issued by the local CA.
pub struct Issued {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Makes the CA in `dir` if there is none, and issues a new localhost leaf from it (written
/// as `localhost.pem` with the chain and `localhost-key.pem`, mode 0600).
pub fn issue(dir: &Path) -> Result<Issued> {
    let ca = LocalCa::open(dir)?;
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from);
    let (chain, key) = ca.issue_pem(&names)?;
    let cert_path = dir.join("localhost.pem");
    let key_path = dir.join("localhost-key.pem");
    veloxy_engine::acme::storage::write_private(&key_path, key.as_bytes())
        .with_context(|| format!("{}: cannot write", key_path.display()))?;
    fs::write(&cert_path, chain)
        .with_context(|| format!("{}: cannot write", cert_path.display()))?;
    Ok(Issued {
        ca: ca.cert_path,
        cert: cert_path,
        key: key_path,
    })
}

/// Where `veloxy trust --install` puts the CA for Debian's `update-ca-certificates`.
const SYSTEM_ANCHOR: &str = "/usr/local/share/ca-certificates/veloxy-local-ca.crt";

/// `veloxy trust [--install]`: prints the local CA's certificate (making the CA if there is
/// none), so that a client can be told to trust it; `--install` also adds it to the system's
/// trust store (Debian and derivatives: `update-ca-certificates`).
pub fn trust(dir: Option<&Path>, install: bool) -> Result<ExitCode> {
    let dir = dir.map_or_else(default_dir, Path::to_path_buf);
    let ca = LocalCa::open(&dir)?;
    eprintln!("veloxy: the local CA: {}", ca.cert_path.display());
    print!("{}", ca.cert_pem);
    if !install {
        return Ok(ExitCode::SUCCESS);
    }
    fs::write(SYSTEM_ANCHOR, &ca.cert_pem)
        .with_context(|| format!("{SYSTEM_ANCHOR}: cannot write"))?;
    let status = std::process::Command::new("update-ca-certificates")
        .status()
        .context("running update-ca-certificates")?;
    anyhow::ensure!(status.success(), "update-ca-certificates failed: {status}");
    eprintln!("veloxy: installed as {SYSTEM_ANCHOR}");
    Ok(ExitCode::SUCCESS)
}
