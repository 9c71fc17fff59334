//! OCSP stapling for every certificate that names an OCSP responder (file and ACME
//! certificates alike): fetched by the certificate thread, refreshed halfway through each
//! response's validity, and handed to rustls by the SNI resolver. The handshake never waits
//! on a responder: until a good response arrives, the certificate goes out unstapled.
//!
//! Hand-written rather than taken from a crate: the OCSP crates are either unfinished
//! (`x509-ocsp`) or pull in a second ASN.1 stack (`rasn-ocsp`), while what a stapler needs is
//! small: build one fixed-shape request (RFC 6960 4.1, SHA-1 CertID as every CA expects) and
//! read four fields of the response (status, the CertID's serial, the certificate status and
//! the update times). The response's signature is not checked here: clients check the staple
//! themselves, and one that does not match is ignored by them, never trusted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::sign::CertifiedKey;
use sha1::{Digest, Sha1};

use super::CertStore;

/// What asking for a certificate's status takes.
pub(crate) struct Target {
    pub url: String,
    pub request: Vec<u8>,
    serial: Vec<u8>,
}

/// A good response, with its validity.
#[derive(Debug)]
pub(crate) struct Good {
    pub der: Vec<u8>,
    pub this_update: SystemTime,
    pub next_update: Option<SystemTime>,
}

/// Why no staple.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OcspError {
    #[error("OCSP responder {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("OCSP response: {0}")]
    Bad(&'static str),
    #[error("OCSP: the certificate is {0}")]
    Status(&'static str),
}

/// The request for `chain`'s leaf (its issuer is the next certificate), when the leaf names
/// an http:// OCSP responder.
pub(crate) fn target(chain: &[rustls::pki_types::CertificateDer<'_>]) -> Option<Target> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    let (_, leaf) = x509_parser::parse_x509_certificate(chain.first()?).ok()?;
    let (_, issuer) = x509_parser::parse_x509_certificate(chain.get(1)?).ok()?;
    let url =
        leaf.extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityInfoAccess(aia) => aia.accessdescs.iter().find_map(|d| {
                    match (&d.access_method, &d.access_location) {
                        (m, GeneralName::URI(u))
                            if m.to_id_string() == "1.3.6.1.5.5.7.48.1"
                                && u.starts_with("http://") =>
                        {
                            Some(u.to_string())
                        }
                        _ => None,
                    }
                }),
                _ => None,
            })?;
    let serial = leaf.raw_serial().to_vec();
    let name_hash = Sha1::digest(issuer.tbs_certificate.subject.as_raw());
    let key_hash = Sha1::digest(&*issuer.public_key().subject_public_key.data);
    // AlgorithmIdentifier { id-sha1, NULL }
    let alg = der(
        0x30,
        &[
            der(0x06, &[vec![0x2b, 0x0e, 0x03, 0x02, 0x1a]]),
            vec![0x05, 0x00],
        ],
    );
    let cert_id = der(
        0x30,
        &[
            alg,
            der(0x04, &[name_hash.to_vec()]),
            der(0x04, &[key_hash.to_vec()]),
            der(0x02, std::slice::from_ref(&serial)),
        ],
    );
    // OCSPRequest { TBSRequest { requestList { Request { reqCert } } } }
    let request = der(0x30, &[der(0x30, &[der(0x30, &[der(0x30, &[cert_id])])])]);
    Some(Target {
        url,
        request,
        serial,
    })
}

/// A DER element: tag, definite length, the parts concatenated.
fn der(tag: u8, parts: &[Vec<u8>]) -> Vec<u8> {
    let len: usize = parts.iter().map(Vec::len).sum();
    let mut out = vec![tag];
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    parts.iter().for_each(|p| out.extend_from_slice(p));
    out
}

/// One DER element of `b`: (tag, content, the rest).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &x| a << 8 | x as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// Reads the response to `target`'s request.
pub(crate) fn parse(target: &Target, der: &[u8]) -> Result<Good, OcspError> {
    let bad = OcspError::Bad;
    let (_, resp, _) = tlv(der)
        .filter(|t| t.0 == 0x30)
        .ok_or(bad("not a DER sequence"))?;
    let (tag, status, rest) = tlv(resp).ok_or(bad("no status"))?;
    if tag != 0x0a || status != [0] {
        return Err(bad("the responder did not answer successfully"));
    }
    // responseBytes [0] { responseType, response OCTET STRING { BasicOCSPResponse } }
    let (_, bytes, _) = tlv(rest).filter(|t| t.0 == 0xa0).ok_or(bad("no body"))?;
    let (_, bytes, _) = tlv(bytes).ok_or(bad("no body"))?;
    let (_, _oid, rest) = tlv(bytes).ok_or(bad("no type"))?;
    let (_, basic, _) = tlv(rest)
        .filter(|t| t.0 == 0x04)
        .ok_or(bad("no basic response"))?;
    let (_, basic, _) = tlv(basic).ok_or(bad("no basic response"))?;
    let (_, mut data, _) = tlv(basic).ok_or(bad("no response data"))?;
    // ResponseData: [0] version?, responderID, producedAt, responses, ...
    let responses = loop {
        let (tag, content, rest) = tlv(data).ok_or(bad("no responses"))?;
        if tag == 0x30 {
            break content;
        }
        data = rest;
    };
    let (_, single, _) = tlv(responses).ok_or(bad("no single response"))?;
    let (_, cert_id, rest) = tlv(single).ok_or(bad("no CertID"))?;
    let mut id = cert_id;
    for _ in 0..3 {
        id = tlv(id).ok_or(bad("short CertID"))?.2;
    }
    let (_, serial, _) = tlv(id).ok_or(bad("no serial"))?;
    if serial != target.serial.as_slice() {
        return Err(bad("the response is about another certificate"));
    }
    let (status, _, rest) = tlv(rest).ok_or(bad("no certificate status"))?;
    match status {
        0x80 => {}
        0xa1 => return Err(OcspError::Status("revoked")),
        _ => return Err(OcspError::Status("unknown to its responder")),
    }
    let (_, this_update, rest) = tlv(rest)
        .filter(|t| t.0 == 0x18)
        .ok_or(bad("no thisUpdate"))?;
    let next_update = tlv(rest)
        .filter(|t| t.0 == 0xa0)
        .and_then(|(_, n, _)| tlv(n))
        .and_then(|(_, t, _)| generalized_time(t));
    Ok(Good {
        der: der.to_vec(),
        this_update: generalized_time(this_update).ok_or(bad("bad thisUpdate"))?,
        next_update,
    })
}

/// `YYYYMMDDHHMMSS[.fff]Z`.
fn generalized_time(t: &[u8]) -> Option<SystemTime> {
    let s = std::str::from_utf8(t).ok()?;
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (h, mi, sec) = (n(8..10)?, n(10..12)?, n(12..14)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86400 + h * 3600 + mi * 60 + sec;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// POSTs the request (10 s deadline, 64 KiB answer at most).
pub(crate) async fn fetch(target: &Target) -> Result<Vec<u8>, OcspError> {
    use http_body_util::BodyExt;
    let fail = |message: String| OcspError::Fetch {
        url: target.url.clone(),
        message,
    };
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = http::Request::post(&target.url)
        .header("content-type", "application/ocsp-request")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            target.request.clone(),
        )))
        .map_err(|e| fail(e.to_string()))?;
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| fail(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(fail(format!("status {}", resp.status())));
        }
        let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024);
        let bytes = body
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        Ok(bytes.to_vec())
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| fail("no answer within 10s".into()))?
}

/// Keeps the staple of the certificate in `cert`/`key` (re-read when the files change, so a
/// renewed or replaced certificate gets its own staple), in `store`.
pub(crate) async fn keep(store: Arc<CertStore>, cert: PathBuf, key: PathBuf) {
    let mut failures = 0u32;
    loop {
        let stamp = modified(&cert);
        let Ok(ck) = crate::tls::load_certified_key(&cert, &key) else {
            // Not there yet (an ACME certificate before its first issuance).
            wait_for_change(&cert, stamp, Duration::from_secs(3600)).await;
            continue;
        };
        let Some(target) = target(&ck.cert) else {
            wait_for_change(&cert, stamp, Duration::from_secs(86400)).await;
            continue;
        };
        let result = match fetch(&target).await {
            Ok(der) => parse(&target, &der),
            Err(e) => Err(e),
        };
        let wait = match result {
            Ok(good) => {
                failures = 0;
                let now = SystemTime::now();
                let refresh = good
                    .next_update
                    .map_or(Duration::from_secs(12 * 3600), |n| {
                        n.duration_since(good.this_update).unwrap_or_default() / 2
                    });
                let wait = (good.this_update + refresh)
                    .duration_since(now)
                    .unwrap_or_default()
                    .max(Duration::from_secs(60));
                let mut stapled = CertifiedKey::clone(&ck);
                stapled.ocsp = Some(good.der);
                store.staple(Arc::new(stapled), good.next_update);
                tracing::info!(cert = %cert.display(), "OCSP response stapled");
                wait
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(cert = %cert.display(), error = %e, "OCSP: no staple");
                store.expire_staples();
                Duration::from_secs(1u64 << failures.min(12)).min(Duration::from_secs(3600))
            }
        };
        wait_for_change(&cert, stamp, wait).await;
    }
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Sleeps `limit`, or less when the file at `p` changes.
async fn wait_for_change(p: &Path, stamp: Option<SystemTime>, limit: Duration) {
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        let step = (end - tokio::time::Instant::now()).min(Duration::from_secs(2));
        tokio::time::sleep(step).await;
        if modified(p) != stamp {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_round_trip() {
        for len in [0usize, 5, 127, 128, 255, 256, 70000] {
            let e = der(0x04, &[vec![7u8; len]]);
            let (tag, content, rest) = tlv(&e).unwrap();
            assert_eq!((tag, content.len(), rest.len()), (0x04, len, 0));
        }
    }

    #[test]
    fn generalized_times() {
        let t = generalized_time(b"20261123145000Z").unwrap();
        assert_eq!(httpdate::fmt_http_date(t), "Mon, 23 Nov 2026 14:50:00 GMT");
        assert!(generalized_time(b"2026").is_none());
    }
}
