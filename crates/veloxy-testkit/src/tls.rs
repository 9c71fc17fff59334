//! TLS for tests: a throwaway CA that issues leaf certificates, rustls client configs, and a
//! blocking rustls client for HTTP/1.1 over TLS. The HTTP/2 client is in [`crate::http2`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};

/// A test certificate authority writing PEM files into `dir`.
pub struct Pki {
    pub dir: PathBuf,
    pub ca_pem: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    ca_text: String,
}

pub enum KeyKind {
    Ecdsa,
    Rsa,
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "veloxy test CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, cert.pem()).unwrap();
        let ca_text = cert.pem();
        Pki {
            dir: dir.to_path_buf(),
            ca_pem,
            issuer: Issuer::new(params, key),
            ca_text,
        }
    }

    /// Issues a leaf for `names` (CN = first name); returns (cert chain path, key path).
    pub fn leaf(&self, file: &str, names: &[&str], kind: KeyKind) -> (PathBuf, PathBuf) {
        self.leaf_valid(file, names, kind, None)
    }

    /// Like [`Self::leaf`] with an explicit validity window (years).
    pub fn leaf_valid(
        &self,
        file: &str,
        names: &[&str],
        kind: KeyKind,
        years: Option<(i32, i32)>,
    ) -> (PathBuf, PathBuf) {
        let key = match kind {
            KeyKind::Ecdsa => KeyPair::generate().unwrap(),
            KeyKind::Rsa => KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap(),
        };
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, names[0]);
        params.distinguished_name = dn;
        if let Some((from, to)) = years {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(to, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_path = self.dir.join(format!("{file}.pem"));
        let key_path = self.dir.join(format!("{file}-key.pem"));
        std::fs::write(&cert_path, format!("{}{}", cert.pem(), self.ca_text)).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A client config trusting only `ca` (PEM file), offering `alpn`, limited to `versions`.
pub fn client_config(
    ca: &Path,
    alpn: &[&[u8]],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Arc::new(config)
}

pub fn default_client(ca: &Path, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    client_config(ca, alpn, rustls::ALL_VERSIONS)
}

/// What a TLS handshake settled on.
#[derive(Debug)]
pub struct Session {
    pub alpn: Option<Vec<u8>>,
    pub version: Option<rustls::ProtocolVersion>,
    /// Common name of the certificate the server sent.
    pub peer_cn: String,
    pub resumed: bool,
}

pub type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Connects and completes the handshake (blocking).
pub fn tls_connect(
    addr: SocketAddr,
    sni: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<(TlsStream, Session)> {
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut sock = TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    let peer_cn = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| common_name(c))
        .unwrap_or_default();
    let session = Session {
        alpn: conn.alpn_protocol().map(|a| a.to_vec()),
        version: conn.protocol_version(),
        peer_cn,
        resumed: matches!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed)),
    };
    Ok((rustls::StreamOwned::new(conn, sock), session))
}

/// The subject CN of a DER certificate (enough for tests: finds the CN attribute bytes).
fn common_name(der: &CertificateDer) -> String {
    // OID 2.5.4.3 = 55 04 03, then a string tag and length; the subject's CN follows the
    // issuer's, so take the last one.
    let d = der.as_ref();
    let mut found = String::new();
    for i in 0..d.len().saturating_sub(5) {
        if d[i] == 0x55 && d[i + 1] == 0x04 && d[i + 2] == 0x03 {
            let len = d[i + 4] as usize;
            if let Some(v) = d.get(i + 5..i + 5 + len) {
                found = String::from_utf8_lossy(v).into_owned();
            }
        }
    }
    found
}

/// GET / over HTTPS + HTTP/1.1 with SNI `name`, trusting only `root`: the body of a 200, or
/// why not (the handshake's error, or the raw answer).
pub fn get_verified(addr: SocketAddr, name: &str, root: &Path) -> Result<String, String> {
    let client = default_client(root, &[b"http/1.1"]);
    let (mut s, _) = tls_connect(addr, name, client).map_err(|e| e.to_string())?;
    let (status, raw) = https1(&mut s, name, "/");
    (status == 200)
        .then(|| crate::raw_body(&raw).to_owned())
        .ok_or(raw)
}

/// One HTTP/1.1 request over TLS with `Connection: close`; returns (status, raw response).
pub fn https1(stream: &mut TlsStream, host: &str, path: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    read_to_close(stream)
}

/// Reads a response to the end of the stream: (status, raw response; 0 without one).
pub fn read_to_close(stream: &mut impl Read) -> (u16, String) {
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}
