//! `rate_limit = { ..., scope = "global" }`: one token bucket per key in Redis, shared by every
//! instance, without a Redis round trip per request.
//!
//! Each worker takes tokens from Redis in small **leases** (about 50 ms of the rate, at most
//! the burst) and spends them locally; when half a lease is left it asks for the next one in
//! the background. While a lease is on the way, requests borrow from it (up to one lease), so
//! no request is refused for want of an answer from Redis, unless the last lease came back
//! empty (the bucket is dry). So the limit is exceeded by at most one lease per key per
//! worker per instance, each time the shared bucket runs dry (or at a key's first requests),
//! and leased tokens a worker does not spend are lost (the limit errs on the strict side). When Redis fails or is slower than `timeout`,
//! `on_store_error` decides for the next second: `local` (the default) applies the same limit
//! per instance, `allow` lets everything through, `deny` refuses everything;
//! `veloxy_ratelimit_store_fallbacks_total` counts those requests.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::redis::RedisClient;

/// What to do while the store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    Local,
    Allow,
    Deny,
}

/// A route's global limit.
#[derive(Debug)]
pub struct GlobalLimit {
    /// The Redis key prefix: the route's limit, so routes do not share buckets.
    pub name: String,
    pub per_second: f64,
    pub burst: f64,
    /// Tokens asked per lease.
    pub lease: u32,
    pub on_error: OnStoreError,
    /// `[server.redis]`'s client, bound by the runtime.
    pub(crate) redis: crate::late::Late<RedisClient>,
}

/// Requests decided by `on_store_error` because the store was unreachable.
pub(crate) static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// One worker's tokens for one key.
pub(crate) struct Slot {
    /// Tokens left; below zero while requests borrow from a lease on its way.
    tokens: AtomicI64,
    /// The size of the last lease granted (-1: none asked yet); 0 means the bucket was dry.
    last_grant: AtomicI64,
    inflight: AtomicBool,
    /// [`crate::clock::now_ms`] of the last lease request.
    asked_ms: AtomicU64,
    /// Until when the store counts as failed.
    failed_until_ms: AtomicU64,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            tokens: AtomicI64::new(0),
            last_grant: AtomicI64::new(-1),
            inflight: AtomicBool::new(false),
            asked_ms: AtomicU64::new(0),
            failed_until_ms: AtomicU64::new(0),
        }
    }
}

impl Slot {
    pub(crate) fn granted(&self, n: i64) {
        self.last_grant.store(n, Ordering::Release);
        self.tokens.fetch_add(n, Ordering::AcqRel);
        self.failed_until_ms.store(0, Ordering::Release);
        self.inflight.store(false, Ordering::Release);
    }

    pub(crate) fn failed(&self) {
        // What was borrowed from the lease that never came is forgiven: the fallback decides
        // for now, and a later lease must not start in debt.
        self.tokens.fetch_max(0, Ordering::AcqRel);
        let until = crate::clock::now_ms() + 1000;
        self.failed_until_ms.store(until, Ordering::Release);
        self.inflight.store(false, Ordering::Release);
    }
}

thread_local! {
    /// This worker's slots, by (limit, key).
    static SLOTS: RefCell<HashMap<(usize, u64), Arc<Slot>>> = RefCell::new(HashMap::new());
}

/// Keys remembered per worker before the map is cleared (their leases are then forgotten).
const MAX_SLOTS: usize = 100_000;

impl GlobalLimit {
    /// The lease size for a rate: about 50 ms of it, at least 1, at most the burst.
    pub fn lease_for(per_second: f64, burst: f64) -> u32 {
        (per_second / 20.0).ceil().clamp(1.0, burst.max(1.0)) as u32
    }

    /// Admits one request of `key` (its hash) or refuses it. `local` is the per-instance
    /// limit (the route's `RateLimiter` for this key), asked while the store is failing
    /// under `on_store_error = "local"`.
    pub(crate) fn check(
        &self,
        key: u64,
        local: impl FnOnce() -> Result<(), Duration>,
    ) -> Result<(), Duration> {
        let id = (self as *const GlobalLimit as usize, key);
        SLOTS.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() >= MAX_SLOTS && !s.contains_key(&id) {
                s.clear();
            }
            self.decide(s.entry(id).or_default(), key, local)
        })
    }

    /// [`GlobalLimit::check`] on the worker's slot for the key.
    fn decide(
        &self,
        slot: &Arc<Slot>,
        key: u64,
        local: impl FnOnce() -> Result<(), Duration>,
    ) -> Result<(), Duration> {
        let now = crate::clock::now_ms();
        // A lease unanswered for longer than `timeout` is a failure, whatever the client
        // thread is doing (connecting at start, a stuck connection): the fallback decides
        // rather than the debt of a lease that may never come.
        if slot.inflight.load(Ordering::Acquire)
            && now >= slot.asked_ms.load(Ordering::Relaxed) + self.redis.get().timeout_ms()
        {
            slot.failed();
        }
        if slot.failed_until_ms.load(Ordering::Acquire) > now {
            FALLBACKS.fetch_add(1, Ordering::Relaxed);
            if !slot.inflight.load(Ordering::Acquire)
                && now >= slot.asked_ms.load(Ordering::Relaxed) + 1000
            {
                self.ask(slot, key, now); // a probe: is the store back?
            }
            return match self.on_error {
                OnStoreError::Local => local(),
                OnStoreError::Allow => Ok(()),
                OnStoreError::Deny => Err(Duration::from_secs(1)),
            };
        }
        let left = slot.tokens.fetch_sub(1, Ordering::AcqRel);
        let mut inflight = slot.inflight.load(Ordering::Acquire);
        if left > 0 {
            if left - 1 < i64::from(self.lease / 2).max(1) && !inflight {
                self.ask(slot, key, now);
            }
            return Ok(());
        }
        // No token of our own: ask (at once while the bucket answered with tokens, so a burst
        // is served at one lease per round trip; after an empty answer, once the bucket may
        // have refilled a lease's worth), and borrow from the lease on its way unless the last
        // one came back empty.
        let refill_ms = (f64::from(self.lease) * 1000.0 / self.per_second).max(5.0) as u64;
        let asked = slot.asked_ms.load(Ordering::Relaxed);
        let dry = slot.last_grant.load(Ordering::Acquire) == 0;
        if !inflight && (asked == 0 || !dry || now >= asked + refill_ms) {
            self.ask(slot, key, now);
            inflight = true;
        }
        let debt = 1 - left;
        if inflight && slot.last_grant.load(Ordering::Acquire) != 0 && debt <= i64::from(self.lease)
        {
            return Ok(());
        }
        slot.tokens.fetch_add(1, Ordering::AcqRel);
        Err(Duration::from_millis(refill_ms.max(1000)))
    }

    fn ask(&self, slot: &Arc<Slot>, key: u64, now: u64) {
        slot.inflight.store(true, Ordering::Release);
        slot.asked_ms.store(now, Ordering::Relaxed);
        let rkey = format!("veloxy:rl:{}:{key:016x}", self.name);
        self.redis.get().lease(
            rkey,
            (self.per_second, self.burst),
            self.lease,
            slot.clone(),
        );
    }
}
