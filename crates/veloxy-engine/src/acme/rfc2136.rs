//! DNS-01 through RFC 2136 dynamic updates signed with TSIG (RFC 8945):
//! `dns = { rfc2136 = { server, zone, key_name, key_file, algorithm } }`, what BIND, Knot and
//! PowerDNS accept.
//!
//! `set` adds the TXT record (TTL [`TXT_TTL`]) to the RRset at `_acme-challenge.NAME`; `clear`
//! deletes that one record by its rdata, so two orders sharing the name (`example.test` and
//! `*.example.test`) do not erase each other's value. The messages are built and signed with
//! hickory-proto (`update_message`, `TSigner`, the answer checked with its `TSigVerifier`),
//! sent over TCP (no truncation, no retransmission to manage), each exchange bounded by
//! [`UPDATE_TIMEOUT`]. The key file is read when the config is compiled
//! ([`super::tsig_key`]), so `veloxy check` reports a bad one. hickory's TSIG signs
//! hmac-sha256/384/512 only, hence no hmac-sha1 (RFC 8945 still allows it).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hickory_proto::op::{update_message, Message};
use hickory_proto::rr::rdata::tsig::{TsigAlgorithm, TsigError};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{Name, RData, Record, RecordSet, TSigner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tsig_key::{parse_key_file, KeyFileError};

/// The TXT record's TTL: short, so a resolver never holds a stale challenge for long.
pub(crate) const TXT_TTL: u32 = 60;
/// The longest one update (connect, send, answer) may take.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(10);
/// The clock skew the server may accept between its time and the signature's (RFC 8945
/// recommends 300 seconds).
const FUDGE: u16 = 300;

/// A TSIG algorithm veloxy signs with (hickory-proto's HMACs; hmac-sha1 and hmac-md5 are not
/// among them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsigAlg {
    /// `hmac-sha256` (the default, and `tsig-keygen`'s).
    HmacSha256,
    /// `hmac-sha384`.
    HmacSha384,
    /// `hmac-sha512`.
    HmacSha512,
}

impl TsigAlg {
    /// From its name as BIND and the config write it (`hmac-sha256`), any case.
    pub fn parse(s: &str) -> Option<TsigAlg> {
        match s.trim_end_matches('.').to_ascii_lowercase().as_str() {
            "hmac-sha256" => Some(TsigAlg::HmacSha256),
            "hmac-sha384" => Some(TsigAlg::HmacSha384),
            "hmac-sha512" => Some(TsigAlg::HmacSha512),
            _ => None,
        }
    }

    /// The name as BIND writes it.
    pub fn name(self) -> &'static str {
        match self {
            TsigAlg::HmacSha256 => "hmac-sha256",
            TsigAlg::HmacSha384 => "hmac-sha384",
            TsigAlg::HmacSha512 => "hmac-sha512",
        }
    }

    fn hickory(self) -> TsigAlgorithm {
        match self {
            TsigAlg::HmacSha256 => TsigAlgorithm::HmacSha256,
            TsigAlg::HmacSha384 => TsigAlgorithm::HmacSha384,
            TsigAlg::HmacSha512 => TsigAlgorithm::HmacSha512,
        }
    }
}

/// `rfc2136 = { ... }`, compiled: the key is read and decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Rfc2136Settings {
    /// The primary server the updates go to (and the propagation check asks).
    pub server: SocketAddr,
    /// The zone updated, lowercase, without the trailing dot.
    pub zone: String,
    /// The TSIG key's name, as the server knows it.
    pub key_name: String,
    /// The key's HMAC.
    pub algorithm: TsigAlg,
    /// The key file, for messages.
    pub key_file: std::path::PathBuf,
    secret: Vec<u8>,
}

impl std::fmt::Debug for Rfc2136Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rfc2136Settings")
            .field("server", &self.server)
            .field("zone", &self.zone)
            .field("key_name", &self.key_name)
            .field("algorithm", &self.algorithm)
            .field("key_file", &self.key_file)
            .field("secret", &"(redacted)")
            .finish()
    }
}

impl Rfc2136Settings {
    /// Reads `key_file` for `key_name`; `algorithm` is the config's (`None`: the file's, else
    /// hmac-sha256).
    pub(crate) fn load(
        server: SocketAddr,
        zone: &str,
        key_name: &str,
        key_file: &Path,
        algorithm: Option<TsigAlg>,
    ) -> Result<Rfc2136Settings, KeyFileError> {
        let text = std::fs::read_to_string(key_file)
            .map_err(|e| KeyFileError::Unreadable(e.to_string()))?;
        let (algorithm, secret) = parse_key_file(&text, key_name, algorithm)?;
        Ok(Rfc2136Settings {
            server,
            zone: zone.trim_end_matches('.').to_ascii_lowercase(),
            key_name: key_name.to_owned(),
            algorithm,
            key_file: key_file.to_owned(),
            secret,
        })
    }
}

/// Why an update failed; `Display` is what the log and `/certificates` show.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpdateError {
    #[error("{fqdn} is not in zone {zone} (rfc2136 zone)")]
    NotInZone { fqdn: String, zone: String },
    #[error("{0}")]
    Message(String),
    #[error("cannot reach {server}: {error}")]
    Io {
        server: SocketAddr,
        error: std::io::Error,
    },
    #[error("no answer from {server} within {limit:?}")]
    Timeout { server: SocketAddr, limit: Duration },
    /// The server's RCODE (and the TSIG error it gave, if any).
    #[error("{server} rejected {update}: {rcode}{tsig}{hint}")]
    Rejected {
        server: SocketAddr,
        /// "the update of FQDN in zone ZONE".
        update: String,
        rcode: String,
        tsig: String,
        hint: &'static str,
    },
    #[error("{server}'s answer is not signed with key {key:?}: {why}")]
    AnswerNotAuthentic {
        server: SocketAddr,
        key: String,
        why: String,
    },
}

/// The RCODE's mnemonic (RFC 1035, 2136), or its number.
pub(crate) fn rcode_name(code: u16) -> String {
    const NAMES: [&str; 11] = [
        "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN", "YXRRSET",
        "NXRRSET", "NOTAUTH", "NOTZONE",
    ];
    NAMES
        .get(usize::from(code))
        .map_or_else(|| format!("RCODE {code}"), |n| (*n).to_owned())
}

fn tsig_error_name(e: TsigError) -> String {
    match e {
        TsigError::BadSig => "BADSIG".into(),
        TsigError::BadKey => "BADKEY".into(),
        TsigError::BadTime => "BADTIME".into(),
        TsigError::BadTrunc => "BADTRUNC".into(),
        TsigError::Unknown(n) => format!("TSIG error {n}"),
    }
}

/// What to do about a rejection.
fn hint(rcode: u16, tsig: Option<TsigError>) -> &'static str {
    match (rcode, tsig) {
        (_, Some(TsigError::BadSig)) => {
            " (the key's secret or algorithm differs from the server's)"
        }
        (_, Some(TsigError::BadKey)) => " (the server has no key by this name and algorithm)",
        (_, Some(TsigError::BadTime)) => " (this host's clock and the server's differ)",
        (5, _) => {
            " (the zone's update policy does not allow this key: allow-update / update-policy)"
        }
        (9, _) => " (the server is not the primary of this zone, or refused the key)",
        (10, _) => " (the record is not in this zone: check `zone`)",
        _ => "",
    }
}

impl Rfc2136Settings {
    /// Adds the TXT `value` at `fqdn` (`add`), or deletes that one record.
    pub(crate) async fn update(
        &self,
        fqdn: &str,
        value: &str,
        add: bool,
    ) -> Result<(), UpdateError> {
        let bad = |e: &dyn std::fmt::Display| UpdateError::Message(format!("{fqdn}: {e}"));
        let name = Name::from_ascii(format!("{fqdn}.")).map_err(|e| bad(&e))?;
        let zone = Name::from_ascii(format!("{}.", self.zone)).map_err(|e| bad(&e))?;
        if !zone.zone_of(&name) {
            return Err(UpdateError::NotInZone {
                fqdn: fqdn.to_owned(),
                zone: self.zone.clone(),
            });
        }
        let txt = RData::TXT(TXT::new(vec![value.to_owned()]));
        let rrset = RecordSet::from(Record::from_rdata(name, TXT_TTL, txt));
        let mut message = if add {
            update_message::append(rrset, zone, false, false)
        } else {
            update_message::delete_by_rdata(rrset, zone, false)
        };
        let signer = TSigner::new(
            self.secret.clone(),
            self.algorithm.hickory(),
            Name::from_ascii(&self.key_name).map_err(|e| bad(&e))?,
            FUDGE,
        )
        .map_err(|e| bad(&e))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let verifier = message.finalize(&signer, now).map_err(|e| bad(&e))?;
        let bytes = message.to_vec().map_err(|e| bad(&e))?;
        let answer = self.send(&bytes, UPDATE_TIMEOUT).await?;
        self.check_answer(fqdn, message.metadata.id, &answer, verifier)
    }

    /// One exchange with the server, within `limit`.
    async fn send(&self, request: &[u8], limit: Duration) -> Result<Vec<u8>, UpdateError> {
        let server = self.server;
        tokio::time::timeout(limit, exchange(server, request))
            .await
            .map_err(|_| UpdateError::Timeout { server, limit })?
            .map_err(|error| UpdateError::Io { server, error })
    }

    /// The answer's RCODE and TSIG: the error the server gave, or whether its signature is ours.
    fn check_answer(
        &self,
        fqdn: &str,
        id: u16,
        answer: &[u8],
        verifier: Option<hickory_proto::rr::TSigVerifier>,
    ) -> Result<(), UpdateError> {
        let server = self.server;
        let not_authentic = |why: String| UpdateError::AnswerNotAuthentic {
            server,
            key: self.key_name.clone(),
            why,
        };
        let parsed = Message::from_vec(answer).map_err(|e| not_authentic(e.to_string()))?;
        if parsed.metadata.id != id {
            return Err(not_authentic("the answer's id is not the request's".into()));
        }
        let rcode = u16::from(parsed.metadata.response_code);
        let tsig_error = parsed.signature().and_then(|s| s.data.error);
        if rcode != 0 || tsig_error.is_some() {
            return Err(UpdateError::Rejected {
                server,
                update: format!("the update of {fqdn} in zone {}", self.zone),
                rcode: rcode_name(rcode),
                tsig: tsig_error.map_or(String::new(), |e| {
                    format!(", {} (key {:?})", tsig_error_name(e), self.key_name)
                }),
                hint: hint(rcode, tsig_error),
            });
        }
        let Some(mut verifier) = verifier else {
            return Err(not_authentic("the request was not signed".into()));
        };
        verifier
            .verify(answer)
            .map(|_| ())
            .map_err(|e| not_authentic(e.to_string()))
    }
}

/// One DNS exchange over TCP (RFC 1035 4.2.2: each message prefixed by its length).
async fn exchange(server: SocketAddr, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = tokio::net::TcpStream::connect(server).await?;
    let len = u16::try_from(request.len())
        .map_err(|_| std::io::Error::other("update message too long"))?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(request);
    s.write_all(&framed).await?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut answer).await?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rcodes_are_named() {
        assert_eq!(rcode_name(5), "REFUSED");
        assert_eq!(rcode_name(9), "NOTAUTH");
        assert_eq!(rcode_name(23), "RCODE 23");
    }

    /// A one-shot DNS server over TCP: reads one request, answers what `reply` makes of it.
    async fn fake_server(
        reply: impl FnOnce(&[u8]) -> Option<Message> + Send + 'static,
    ) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut len = [0u8; 2];
            s.read_exact(&mut len).await.unwrap();
            let mut req = vec![0u8; usize::from(u16::from_be_bytes(len))];
            s.read_exact(&mut req).await.unwrap();
            let Some(answer) = reply(&req) else {
                // Say nothing, keep the connection open: the client's deadline must end it.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            };
            let bytes = answer.to_vec().unwrap();
            s.write_all(&(bytes.len() as u16).to_be_bytes())
                .await
                .unwrap();
            s.write_all(&bytes).await.unwrap();
        });
        addr
    }

    fn settings(server: SocketAddr) -> Rfc2136Settings {
        Rfc2136Settings {
            server,
            zone: "example.test".into(),
            key_name: "acme".into(),
            algorithm: TsigAlg::HmacSha256,
            key_file: "tsig.key".into(),
            secret: b"0123456789abcdef0123456789abcdef".to_vec(),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn an_unsigned_answer_is_not_taken_for_a_success() {
        runtime().block_on(async {
            let server = fake_server(|req| {
                let req = Message::from_vec(req).unwrap();
                // The request is an update of the zone, signed with the key.
                assert_eq!(req.metadata.op_code, hickory_proto::op::OpCode::Update);
                assert_eq!(req.signature().unwrap().name.to_ascii(), "acme.");
                let mut ok = Message::response(req.metadata.id, req.metadata.op_code);
                ok.metadata.response_code = hickory_proto::op::ResponseCode::NoError;
                Some(ok)
            })
            .await;
            let e = settings(server)
                .update("_acme-challenge.example.test", "v", true)
                .await
                .unwrap_err();
            assert!(matches!(e, UpdateError::AnswerNotAuthentic { .. }), "{e}");
        });
    }

    #[test]
    fn a_refusal_names_the_rcode_and_a_silent_server_the_deadline() {
        runtime().block_on(async {
            let server = fake_server(|req| {
                let req = Message::from_vec(req).unwrap();
                let mut no = Message::response(req.metadata.id, req.metadata.op_code);
                no.metadata.response_code = hickory_proto::op::ResponseCode::Refused;
                Some(no)
            })
            .await;
            let e = settings(server)
                .update("_acme-challenge.example.test", "v", false)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(": REFUSED (the zone's update policy"), "{e}");
            let e = settings(server)
                .update("_acme-challenge.other.test", "v", true)
                .await
                .unwrap_err();
            assert!(matches!(e, UpdateError::NotInZone { .. }), "{e}");
        });
        // A server that says nothing: the exchange ends at its deadline.
        runtime().block_on(async {
            let server = fake_server(|_| None).await;
            let e = settings(server)
                .send(b"\0\0", Duration::from_millis(200))
                .await
                .unwrap_err();
            assert!(matches!(e, UpdateError::Timeout { .. }), "{e}");
        });
    }
}
