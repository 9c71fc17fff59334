//! QUERY in the cache (draft-ietf-httpbis-safe-method-w-body, section 2.7): a route whose
//! `cache.methods` names QUERY stores QUERY answers under a key that adds the request's body
//! (its SHA-256) and its Content-Type to the route's key, so two QUERYs with different bodies
//! are two entries and the same body hits. The key is known only once the body is read: the
//! lookup of [`super::lookup::admit`] is deferred to [`with_body`], which the exchange calls
//! after reading the whole body (bounded by [`BODY_LIMIT`]: a QUERY that does not declare a
//! length at most that large bypasses the cache). The fill's upstream request is the QUERY
//! with its body; when the fill cannot answer (a hit-for-pass, a collapse that stored
//! nothing), [`forward`] sends the same request once more and answers it whole, since the
//! client's body is already read.

use std::sync::Arc;

use bytes::Bytes;

use super::fetch::Upstream;
use super::fill::{Fill, Filled, Mode};
use super::{now_ms, Stats};
use crate::error::{ErrorKind, ProxyError};
use crate::message::Head;

/// The largest QUERY body whose answer is cached: 64 KiB (the default `retry_body_limit`).
pub(crate) const BODY_LIMIT: u64 = 64 * 1024;

/// Separates the route's key from the body's digest (no template renders it).
const MARK: char = '\u{1e}';

/// The declared length of a QUERY's body when its answer may be cached: a `Content-Length`
/// of at most [`BODY_LIMIT`].
pub(crate) fn cacheable_length(head: &Head) -> Option<u64> {
    let v = head.fields.get("content-length")?;
    crate::http1::parse_content_length(v).filter(|n| *n <= BODY_LIMIT)
}

/// The key of a QUERY's answer: the route's key, the body's SHA-256 (hex), its Content-Type.
pub(crate) fn key(primary: &str, content_type: Option<&[u8]>, body: &[u8]) -> String {
    use std::fmt::Write;
    let suite = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let digest = suite
        .tls13()
        .expect("a TLS 1.3 suite")
        .common
        .hash_provider
        .hash(body);
    let mut k = String::with_capacity(primary.len() + 100);
    k.push_str(primary);
    k.push(MARK);
    for b in digest.as_ref() {
        let _ = write!(k, "{b:02x}");
    }
    k.push(MARK);
    k.push_str(String::from_utf8_lossy(content_type.unwrap_or_default()).trim());
    k
}

/// What a QUERY's lookup found once its body was read.
pub(crate) enum Keyed {
    /// A fresh stored answer.
    Hit(crate::static_files::Response),
    /// A hit-for-pass: go upstream once with [`forward`], storing nothing.
    Pass(Box<Fill>),
    /// A miss or a stale object: run the fill.
    Fill(Box<Fill>),
}

/// Looks the QUERY up under the key its body makes, and readies the fill to send the body.
pub(crate) fn with_body(mut fill: Box<Fill>, body: Bytes) -> Keyed {
    let store = fill.rc.store().clone();
    let ct = fill.field("content-type");
    let primary: Arc<str> = Arc::from(key(&fill.primary, ct.as_deref(), &body));
    fill.body = body;
    let now = now_ms();
    let found = super::lookup::find(&store, &primary, now, |names| {
        super::lookup::variant_key_with(&primary, names, |n| fill.field(n))
    });
    let Some((key, found)) = found else {
        return Keyed::Pass(fill);
    };
    if let Some(obj) = found
        .as_ref()
        .filter(|o| fill.mode == Mode::Normal && o.is_fresh(now))
    {
        Stats::inc(&store.stats.hits);
        let client = fill.client.clone();
        return Keyed::Hit(super::serve::respond(&fill.rc, obj, client, "HIT", now));
    }
    fill.primary = primary;
    fill.key = key;
    fill.stale = found;
    Keyed::Fill(fill)
}

/// Sends the QUERY (its body included) once more and answers the response whole, stored
/// nowhere, labelled `label` in the status header.
pub(crate) async fn forward(
    up: &impl Upstream,
    fill: &Fill,
    label: &str,
) -> Result<Filled, ProxyError> {
    let head = super::fill::upstream_head(fill, None);
    let requested = now_ms();
    let fetched = up.fetch(&head, super::fetch::SERVE_LIMIT).await?;
    let too_big = || ProxyError::upstream(ErrorKind::BadResponse("QUERY answer too large"));
    let fetched = fetched.ok_or_else(too_big)?;
    super::fill::answer_fetched(fill, &fetched, requested, label)
        .ok_or_else(|| ProxyError::upstream(ErrorKind::BadResponse("unasked 304")))
}
