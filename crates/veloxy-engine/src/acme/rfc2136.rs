//! DNS-01 through RFC 2136 dynamic updates signed with TSIG (RFC 8945):
//! `dns = { rfc2136 = { server, zone, key_name, key_file, algorithm } }`, what BIND, Knot and
//! PowerDNS accept.
//!
//! `set` adds the TXT record (TTL [`TXT_TTL`]) to the RRset at `_acme-challenge.NAME`; `clear`
//! deletes that one record by its rdata, so two orders sharing the name (`example.test` and
//! `*.example.test`) do not erase each other's value. The messages are built and signed with
//! hickory-proto (`update_message`, `TSigner`, the answer checked with its `TSigVerifier`),
//! sent over TCP (no truncation, no retransmission to manage), each exchange bounded by
//! [`UPDATE_TIMEOUT`]. The key file is read when the config is compiled (BIND's
//! `tsig-keygen` format, or the base64 secret alone), so `veloxy check` reports a bad one.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hickory_proto::op::{update_message, Message};
use hickory_proto::rr::rdata::tsig::{TsigAlgorithm, TsigError};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{Name, RData, Record, RecordSet, TSigner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// Why a key file cannot be used (`Display` completes "key_file FILE: ...").
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum KeyFileError {
    #[error("cannot read it: {0}")]
    Unreadable(String),
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("line {line}: the secret is not base64")]
    BadBase64 { line: usize },
    #[error("line {line}: algorithm {name:?} is not supported: use hmac-sha256, hmac-sha384 or hmac-sha512")]
    UnknownAlgorithm { line: usize, name: String },
    #[error("no key {wanted:?} in it (it holds {found})")]
    NoSuchKey { wanted: String, found: String },
    #[error("line {line}: key {key:?} is {file}, but the config says algorithm = {config:?}")]
    AlgorithmMismatch {
        line: usize,
        key: String,
        file: String,
        config: String,
    },
    #[error("the secret is empty")]
    Empty,
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

/// One token of a BIND key file and its line.
fn tokens(text: &str) -> Result<Vec<(usize, String)>, KeyFileError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while let Some(c) = chars.next() {
        match c {
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            '#' => while chars.next_if(|&c| c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'/') => while chars.next_if(|&c| c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                loop {
                    let Some(c) = chars.next() else {
                        return Err(syntax(line, "unterminated /* comment"));
                    };
                    line += usize::from(c == '\n');
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '{' | '}' | ';' => out.push((line, c.to_string())),
            '"' => {
                let start = line;
                let mut s = String::from("\"");
                loop {
                    match chars.next() {
                        None => return Err(syntax(start, "unterminated string")),
                        Some('"') => break,
                        Some(c) => {
                            line += usize::from(c == '\n');
                            s.push(c);
                        }
                    }
                }
                out.push((start, s));
            }
            c => {
                let mut s = c.to_string();
                while let Some(c) = chars.next_if(|c| !c.is_whitespace() && !"{};\"".contains(*c)) {
                    s.push(c);
                }
                out.push((line, s));
            }
        }
    }
    Ok(out)
}

fn syntax(line: usize, message: &str) -> KeyFileError {
    KeyFileError::Syntax {
        line,
        message: message.to_owned(),
    }
}

/// A token's text (a quoted string without its quotes).
fn unquote(t: &str) -> &str {
    t.strip_prefix('"').unwrap_or(t)
}

/// A `key "NAME" { algorithm ALG; secret "BASE64"; };` statement, as read.
struct KeyStatement {
    line: usize,
    name: String,
    algorithm: Option<(usize, String)>,
    secret: Option<(usize, String)>,
}

/// The `key` statements of a BIND key file (other statements are an error: the file is meant
/// to hold keys only, as `tsig-keygen` writes it).
fn key_statements(text: &str) -> Result<Vec<KeyStatement>, KeyFileError> {
    let toks = tokens(text)?;
    let mut it = toks.iter().peekable();
    let mut out = Vec::new();
    let expect = |t: Option<&(usize, String)>, want: &str, line: usize| match t {
        Some((_, s)) if s == want => Ok(()),
        Some((l, s)) => Err(syntax(*l, &format!("expected {want:?}, found {s:?}"))),
        None => Err(syntax(line, &format!("expected {want:?} at the end"))),
    };
    while let Some((line, word)) = it.next() {
        if word != "key" {
            return Err(syntax(*line, &format!("expected `key`, found {word:?}")));
        }
        let Some((_, name)) = it.next() else {
            return Err(syntax(*line, "a key needs a name"));
        };
        expect(it.next(), "{", *line)?;
        let mut k = KeyStatement {
            line: *line,
            name: unquote(name).to_owned(),
            algorithm: None,
            secret: None,
        };
        loop {
            let Some((l, field)) = it.next() else {
                return Err(syntax(*line, "unterminated key statement"));
            };
            if field == "}" {
                break;
            }
            let Some((vl, value)) = it.next() else {
                return Err(syntax(*l, &format!("{field} needs a value")));
            };
            match field.as_str() {
                "algorithm" => k.algorithm = Some((*vl, unquote(value).to_owned())),
                "secret" => k.secret = Some((*vl, unquote(value).to_owned())),
                other => return Err(syntax(*l, &format!("unknown key field {other:?}"))),
            }
            expect(it.next(), ";", *vl)?;
        }
        expect(it.next(), ";", *line)?;
        out.push(k);
    }
    Ok(out)
}

fn same_name(a: &str, b: &str) -> bool {
    a.trim_end_matches('.')
        .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

fn decode(line: usize, b64: &str) -> Result<Vec<u8>, KeyFileError> {
    let clean: String = b64.split_whitespace().collect();
    let secret = base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|_| KeyFileError::BadBase64 { line })?;
    if secret.is_empty() {
        return Err(KeyFileError::Empty);
    }
    Ok(secret)
}

/// The algorithm and secret of `key_name` in a key file: BIND's format, or the base64 secret
/// alone (then `config` or hmac-sha256 is the algorithm).
pub(crate) fn parse_key_file(
    text: &str,
    key_name: &str,
    config: Option<TsigAlg>,
) -> Result<(TsigAlg, Vec<u8>), KeyFileError> {
    let first = tokens(text)?.into_iter().next();
    if first.as_ref().is_none_or(|(_, t)| t != "key") {
        let line = first.map_or(1, |(l, _)| l);
        let secret = decode(line, text)?;
        return Ok((config.unwrap_or(TsigAlg::HmacSha256), secret));
    }
    let keys = key_statements(text)?;
    let Some(k) = keys.iter().find(|k| same_name(&k.name, key_name)) else {
        let names: Vec<String> = keys.iter().map(|k| format!("{:?}", k.name)).collect();
        return Err(KeyFileError::NoSuchKey {
            wanted: key_name.to_owned(),
            found: names.join(", "),
        });
    };
    let file_alg = match &k.algorithm {
        None => None,
        Some((line, name)) => Some(TsigAlg::parse(name).ok_or(KeyFileError::UnknownAlgorithm {
            line: *line,
            name: name.clone(),
        })?),
    };
    let algorithm = match (file_alg, config) {
        (Some(f), Some(c)) if f != c => {
            return Err(KeyFileError::AlgorithmMismatch {
                line: k.algorithm.as_ref().map_or(k.line, |a| a.0),
                key: k.name.clone(),
                file: f.name().into(),
                config: c.name().into(),
            })
        }
        (f, c) => c.or(f).unwrap_or(TsigAlg::HmacSha256),
    };
    let Some((line, b64)) = &k.secret else {
        return Err(syntax(k.line, &format!("key {:?} has no secret", k.name)));
    };
    Ok((algorithm, decode(*line, b64)?))
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
    #[error("no answer from {server} within {UPDATE_TIMEOUT:?}")]
    Timeout { server: SocketAddr },
    /// The server's RCODE (and the TSIG error it gave, if any).
    #[error("{server} rejected {update}: {rcode}{tsig}{hint}")]
    Rejected {
        server: SocketAddr,
        /// "the update of FQDN in zone ZONE".
        update: String,
        rcode: &'static str,
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

/// The RCODE's mnemonic (RFC 1035, 2136, 8945).
pub(crate) fn rcode_name(code: u16) -> &'static str {
    const NAMES: [&str; 11] = [
        "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN", "YXRRSET",
        "NXRRSET", "NOTAUTH", "NOTZONE",
    ];
    NAMES.get(usize::from(code)).copied().unwrap_or("RCODE")
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
        let server = self.server;
        let answer = tokio::time::timeout(UPDATE_TIMEOUT, exchange(server, &bytes))
            .await
            .map_err(|_| UpdateError::Timeout { server })?
            .map_err(|error| UpdateError::Io { server, error })?;
        self.check_answer(fqdn, message.metadata.id, &answer, verifier)
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

    const KEYGEN: &str =
        "key \"veloxy-key\" {\n\talgorithm hmac-sha512;\n\tsecret \"c2VjcmV0\";\n};\n";

    #[test]
    fn reads_bind_key_files_and_bare_secrets() {
        let (alg, secret) = parse_key_file(KEYGEN, "veloxy-key.", None).unwrap();
        assert_eq!(
            (alg, secret.as_slice()),
            (TsigAlg::HmacSha512, &b"secret"[..])
        );
        let (alg, secret) = parse_key_file("c2VjcmV0\n", "any", None).unwrap();
        assert_eq!(
            (alg, secret.as_slice()),
            (TsigAlg::HmacSha256, &b"secret"[..])
        );
        let two = format!("# keys\nkey \"other\" {{ algorithm hmac-sha256; secret \"b3RoZXI=\"; }};\n/* x */ {KEYGEN}");
        let (_, secret) = parse_key_file(&two, "VELOXY-KEY", Some(TsigAlg::HmacSha512)).unwrap();
        assert_eq!(secret, b"secret");
    }

    #[test]
    fn key_file_errors_name_the_line() {
        let bad = KEYGEN.replace("c2VjcmV0", "not base64!");
        assert_eq!(
            parse_key_file(&bad, "veloxy-key", None),
            Err(KeyFileError::BadBase64 { line: 3 })
        );
        let md5 = KEYGEN.replace("hmac-sha512", "hmac-md5");
        assert!(matches!(
            parse_key_file(&md5, "veloxy-key", None),
            Err(KeyFileError::UnknownAlgorithm { line: 2, .. })
        ));
        assert!(matches!(
            parse_key_file(KEYGEN, "other", None),
            Err(KeyFileError::NoSuchKey { .. })
        ));
        assert!(matches!(
            parse_key_file(KEYGEN, "veloxy-key", Some(TsigAlg::HmacSha256)),
            Err(KeyFileError::AlgorithmMismatch { line: 2, .. })
        ));
        assert!(matches!(
            parse_key_file("key \"k\" { secret \"c2VjcmV0\" }", "k", None),
            Err(KeyFileError::Syntax { line: 1, .. })
        ));
        assert_eq!(
            parse_key_file("\n\n%%%\n", "k", None),
            Err(KeyFileError::BadBase64 { line: 3 })
        );
    }

    #[test]
    fn rcodes_are_named() {
        assert_eq!(rcode_name(5), "REFUSED");
        assert_eq!(rcode_name(9), "NOTAUTH");
    }
}
