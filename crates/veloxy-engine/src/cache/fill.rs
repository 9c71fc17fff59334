//! Filling the cache: the upstream request of a miss, a revalidation or a refresh, run by the
//! codec after admission (the same code for every downstream protocol).
//!
//! One fill per key at a time: the first miss becomes the leader and registers a flight;
//! misses on the same key, in any worker, wait for its outcome (at most [`COLLAPSE_WAIT`])
//! and are answered from the stored object, or go upstream themselves when it was not
//! storable. The fill reads the whole response before answering. One larger than
//! `max_object` is answered from memory but not stored, and the key becomes a hit-for-pass
//! (later requests go straight upstream, streamed, for [`super::PASS_FOR`]); one larger than
//! [`super::fetch::SERVE_LIMIT`] as well is dropped and the request forwarded as usual, so
//! only that first request of a huge URL costs a second upstream request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::fetch::Upstream;
use super::lookup::{usable_on_error, ClientHead, RouteCache};
use super::object::{build, cookie_lines, revalidated, vary_names};
use super::{now_ms, Entry, Object, Stats};
use crate::error::ProxyError;
use crate::message::Head;
use crate::static_files::Response;

/// The longest a miss waits for another request's fill of the same key.
pub(crate) const COLLAPSE_WAIT: Duration = Duration::from_secs(10);

/// How a flight ended, for the misses that waited for it.
#[derive(Clone)]
pub(crate) enum Outcome {
    /// Stored (or revalidated): answer from it.
    Stored(Arc<Object>),
    /// The upstream failed and this stale object answers instead.
    Stale(Arc<Object>),
    /// Nothing to share: go upstream.
    NotStored,
}

/// A fill in progress; followers subscribe to its outcome.
pub(crate) type Flight = tokio::sync::watch::Sender<Option<Outcome>>;

/// Why the client asked.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Normal,
    /// The client sent `no-cache`: the stored object may not answer without revalidation.
    Refresh,
}

/// A request going upstream through the cache, with everything the fill needs (the request
/// head itself is gone by then on HTTP/1).
#[derive(Clone)]
pub(crate) struct Fill {
    pub(super) rc: Arc<RouteCache>,
    pub(super) primary: Arc<str>,
    pub(super) key: Arc<str>,
    pub(super) stale: Option<Arc<Object>>,
    pub(super) mode: Mode,
    pub(super) client: ClientHead,
    /// The request's fields, for the response's Vary and the storage rules.
    fields: Arc<[(Box<str>, Vec<u8>)]>,
    pub(super) authorization: bool,
    /// The upstream GET (or QUERY) head, without validators and the final blank line.
    head: Vec<u8>,
    /// A QUERY's body, sent after the head ([`super::query`]).
    pub(super) body: Bytes,
    /// A QUERY whose key waits for its body ([`super::query::with_body`]).
    needs_body: bool,
}

/// What the codec does after a fill.
pub(crate) enum Filled {
    Answer(Response),
    /// Forward the request as usual; the answer carries this status-header line.
    Forward(Bytes),
}

impl Fill {
    pub(crate) fn new(
        rc: Arc<RouteCache>,
        (primary, key): (Arc<str>, Arc<str>),
        stale: Option<Arc<Object>>,
        mode: Mode,
        (head, encoding): (&Head, Option<crate::compress::Encoding>),
    ) -> Fill {
        let fields: Vec<(Box<str>, Vec<u8>)> = head
            .fields
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase().into_boxed_str(), v.to_vec()))
            .collect();
        Fill {
            rc,
            primary,
            key,
            stale,
            mode,
            client: super::lookup::head_view(head, encoding),
            authorization: head.fields.get("authorization").is_some(),
            fields: fields.into(),
            head: Vec::new(),
            body: Bytes::new(),
            needs_body: false,
        }
    }

    /// Marks a QUERY's fill: the exchange reads the body, then [`super::query::with_body`]
    /// looks it up.
    pub(crate) fn awaiting_body(mut self) -> Fill {
        self.needs_body = true;
        self
    }

    /// A QUERY's fill (see [`Fill::awaiting_body`]).
    pub(crate) fn is_query(&self) -> bool {
        self.needs_body
    }

    /// Sets the upstream request head (written by the exchange, which knows the target).
    pub(crate) fn set_head(&mut self, head: Vec<u8>) {
        self.head = head;
    }

    /// Adds field lines (`Name: value\r\n`) to the upstream head: forward_auth's copied
    /// fields, known only once the auth service answered.
    pub(crate) fn add_lines(&mut self, lines: &[u8]) {
        self.head.extend_from_slice(lines);
    }

    /// The status-header line for a request forwarded past the cache.
    pub(crate) fn miss_line(&self) -> Bytes {
        self.rc.status_line("MISS")
    }

    /// The answer from `obj`, labelled in the status header.
    pub(super) fn answer(&self, obj: &Object, label: &str, now: u64) -> Filled {
        Filled::Answer(super::serve::respond(
            &self.rc,
            obj,
            self.client.clone(),
            label,
            now,
        ))
    }

    /// A stale answer (`stale-while-revalidate`, `stale-if-error`), counted.
    fn stale_answer(&self, obj: &Object, now: u64) -> Filled {
        Stats::inc(&self.rc.store().stats.stale);
        self.answer(obj, "STALE", now)
    }

    /// Requests for this key go straight upstream for a while (a hit-for-pass).
    fn pass(&self, now: u64) {
        let until = now + super::PASS_FOR.as_millis() as u64;
        self.rc
            .store()
            .entries
            .insert(self.primary.clone(), Entry::Pass(until));
    }

    /// The request's combined value of field `name` (every line, joined with ", "), as
    /// RFC 9111 section 4.1 compares Vary fields.
    pub(super) fn field(&self, name: &str) -> Option<Vec<u8>> {
        super::lookup::combined(
            self.fields
                .iter()
                .filter(|(n, _)| **n == *name)
                .map(|(_, v)| v.as_slice()),
        )
    }
}

/// Runs the fill for one request on `up`, the request's upstream.
pub(crate) async fn run(up: &impl Upstream, fill: Box<Fill>) -> Result<Filled, ProxyError> {
    let store = fill.rc.store().clone();
    let now = now_ms();
    if let (Some(obj), Mode::Normal) = (&fill.stale, fill.mode) {
        let swr = obj.life.stale_while_revalidate.as_millis() as u64;
        if swr > 0 && obj.staleness_ms(now) <= swr {
            let answer = fill.stale_answer(obj, now);
            if let Join::Lead(flight) = join(&store, &fill.key) {
                let (up, f) = (up.detach(), fill.clone());
                tokio::task::spawn_local(async move {
                    let _ = lead_fill(&up, &f, flight).await;
                });
            }
            return Ok(answer);
        }
    }
    let flight = match join(&store, &fill.key) {
        Join::Lead(flight) => flight,
        Join::Follow(rx) => return follow(&fill, rx).await,
    };
    Stats::inc(&store.stats.misses);
    lead_fill(up, &fill, flight).await
}

/// Either leads the key's fill, or follows the one under way (decided under one lock, so a
/// follower never misses the outcome of the flight it saw).
enum Join {
    Lead(FlightGuard),
    Follow(tokio::sync::watch::Receiver<Option<Outcome>>),
}

fn join(store: &Arc<super::Store>, key: &Arc<str>) -> Join {
    let mut flights = store.flights.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(tx) = flights.get(key) {
        return Join::Follow(tx.subscribe());
    }
    let (tx, _) = tokio::sync::watch::channel(None);
    flights.insert(key.clone(), tx);
    Join::Lead(FlightGuard {
        store: store.clone(),
        key: key.clone(),
    })
}

/// The leader's registration: ends the flight with an outcome, or, when the leader is
/// dropped (its client left), with none, so that its waiters go upstream themselves.
pub(crate) struct FlightGuard {
    store: Arc<super::Store>,
    key: Arc<str>,
}

impl FlightGuard {
    fn finish(self, outcome: Outcome) {
        self.end(outcome);
    }

    fn end(&self, outcome: Outcome) {
        let tx = self
            .store
            .flights
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
        if let Some(tx) = tx {
            let _ = tx.send(Some(outcome));
        }
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.end(Outcome::NotStored);
    }
}

/// Waits for the key's fill in progress.
async fn follow(
    fill: &Fill,
    mut rx: tokio::sync::watch::Receiver<Option<Outcome>>,
) -> Result<Filled, ProxyError> {
    let store = fill.rc.store();
    let outcome = tokio::time::timeout(COLLAPSE_WAIT, rx.wait_for(|o| o.is_some()))
        .await
        .ok()
        .and_then(|r| r.ok().and_then(|o| o.clone()));
    let now = now_ms();
    match outcome {
        Some(Outcome::Stored(obj)) => {
            Stats::inc(&store.stats.collapsed);
            Stats::inc(&store.stats.hits);
            Ok(fill.answer(&obj, "HIT", now))
        }
        Some(Outcome::Stale(obj)) => Ok(fill.stale_answer(&obj, now)),
        _ => Ok(Filled::Forward(fill.miss_line())),
    }
}

/// The leader's fill: fetch, store, answer (and tell the waiters).
async fn lead_fill(
    up: &impl Upstream,
    fill: &Fill,
    flight: FlightGuard,
) -> Result<Filled, ProxyError> {
    let store = fill.rc.store().clone();
    let mut stale = fill.stale.clone();
    if stale.is_none() && store.disk.is_some() {
        if let Some(obj) = from_disk(fill).await {
            let now = now_ms();
            if fill.mode == Mode::Normal && obj.is_fresh(now) {
                Stats::inc(&store.stats.hits);
                flight.finish(Outcome::Stored(obj.clone()));
                return Ok(fill.answer(&obj, "HIT", now));
            }
            stale = Some(obj);
        }
    }
    let head = upstream_head(fill, stale.as_deref());
    let requested = now_ms();
    let limit = fill.rc.max_object.max(super::fetch::SERVE_LIMIT);
    let fetched = up.fetch(&head, limit).await;
    let now = now_ms();
    // The upstream failed (no answer, or a 5xx): a stale object within its stale-if-error
    // window answers instead.
    let usable_stale = stale.as_ref().filter(|o| usable_on_error(o, now));
    let fetched = match fetched {
        Err(e) => {
            let Some(obj) = usable_stale else {
                flight.finish(Outcome::NotStored);
                return Err(e);
            };
            flight.finish(Outcome::Stale(obj.clone()));
            return Ok(fill.stale_answer(obj, now));
        }
        Ok(None) => {
            // Larger than the serve limit: not stored, and the request is forwarded again.
            fill.pass(now);
            flight.finish(Outcome::NotStored);
            return Ok(Filled::Forward(fill.miss_line()));
        }
        Ok(Some(f)) => f,
    };
    if let (500.., Some(obj)) = (fetched.status, usable_stale) {
        flight.finish(Outcome::Stale(obj.clone()));
        return Ok(fill.stale_answer(obj, now));
    }
    let (obj, label) = match (&stale, fetched.status) {
        (Some(old), 304) => {
            Stats::inc(&store.stats.revalidated);
            (
                revalidated(old, &fetched, fill, requested, now),
                "REVALIDATED",
            )
        }
        _ => (build(&fetched, fill, requested, now), "MISS"),
    };
    let too_big = fetched.body.len() as u64 > fill.rc.max_object;
    let stored = !too_big && obj.as_ref().is_some_and(|(_, life)| life.is_some());
    // Not a pass when only this request made it unstorable (its Authorization).
    if !stored && label == "MISS" && (too_big || !fill.authorization) {
        // Served from memory this once; not stored (too big, or not storable: no-store,
        // private, ...), and a hit-for-pass for a while, so that the next requests for the
        // key stream straight upstream instead of queueing behind one fill at a time.
        fill.pass(now);
    }
    let obj = match obj {
        Some((o, _)) => Arc::new(o),
        None => {
            // A 304 the client's own conditionals did not ask for, with nothing stored.
            flight.finish(Outcome::NotStored);
            return Ok(Filled::Forward(fill.miss_line()));
        }
    };
    if stored {
        insert(fill, &fetched.headers, obj.clone());
        flight.finish(Outcome::Stored(obj.clone()));
    } else {
        flight.finish(Outcome::NotStored);
    }
    let mut answer = fill.answer(&obj, label, now);
    add_cookies(&mut answer, &fetched.headers);
    Ok(answer)
}

/// The head of the fill's upstream request: the client's, made conditional on the stale
/// object's validators when there is one, with its final blank line.
pub(super) fn upstream_head(fill: &Fill, stale: Option<&Object>) -> Vec<u8> {
    let mut head = fill.head.clone();
    if let Some(obj) = stale {
        if let Some(etag) = &obj.etag {
            head.extend_from_slice(b"If-None-Match: ");
            head.extend_from_slice(etag);
            head.extend_from_slice(b"\r\n");
        }
        if let Some((lm, _)) = &obj.last_modified {
            head.extend_from_slice(b"If-Modified-Since: ");
            head.extend_from_slice(lm);
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(b"\r\n");
    // A QUERY's body (empty for GET): one buffer, sent again as is by a retry.
    head.extend_from_slice(&fill.body);
    head
}

/// The fetched response answered whole, not stored (`None`: a 304 nobody asked for).
pub(super) fn answer_fetched(
    fill: &Fill,
    fetched: &super::fetch::Fetched,
    requested: u64,
    label: &str,
) -> Option<Filled> {
    let now = now_ms();
    let (obj, _) = build(fetched, fill, requested, now)?;
    let mut answer = fill.answer(&obj, label, now);
    add_cookies(&mut answer, &fetched.headers);
    Some(answer)
}

/// This client's answer is the upstream's whole: its cookies too (only the stored copy,
/// shared, goes without them).
fn add_cookies(answer: &mut Filled, headers: &http::HeaderMap) {
    if let (Filled::Answer(r), Some(cookies)) = (answer, cookie_lines(headers)) {
        let mut lines = Vec::with_capacity(r.raw[0].len() + cookies.len());
        lines.extend_from_slice(&r.raw[0]);
        lines.extend_from_slice(&cookies);
        r.raw[0] = Bytes::from(lines);
    }
}

/// Stores `obj` under the request's key (its variant's, when the response varies).
fn insert(fill: &Fill, headers: &http::HeaderMap, obj: Arc<Object>) {
    let store = fill.rc.store();
    let put = |key: Arc<str>, e: Entry| {
        if let Some((disk, _)) = &store.disk {
            disk.save(key.clone(), e.clone());
        }
        store.entries.insert(key, e);
    };
    let vary = vary_names(headers);
    if vary.is_empty() {
        put(fill.primary.clone(), Entry::Object(obj));
        return;
    }
    let key = super::lookup::variant_key_with(&fill.primary, &vary, |n| fill.field(n));
    put(fill.primary.clone(), Entry::Vary(vary.into()));
    put(Arc::from(key), Entry::Object(obj));
}

/// The request's entry in the disk tier (a memory miss), put back in memory.
async fn from_disk(fill: &Fill) -> Option<Arc<Object>> {
    let store = fill.rc.store();
    let (disk, _) = store.disk.as_ref()?;
    let entry = disk.load(fill.key.clone()).await?;
    let (key, entry) = match entry {
        Entry::Vary(names) if fill.key == fill.primary => {
            store
                .entries
                .insert(fill.primary.clone(), Entry::Vary(names.clone()));
            let v = super::lookup::variant_key_with(&fill.primary, &names, |n| fill.field(n));
            let v: Arc<str> = Arc::from(v);
            (v.clone(), disk.load(v).await?)
        }
        e => (fill.key.clone(), e),
    };
    let Entry::Object(obj) = entry else {
        return None;
    };
    store.entries.insert(key, Entry::Object(obj.clone()));
    Some(obj)
}
