//! Overload protection shared by all workers: per-route concurrency limits with a bounded wait
//! queue, and token-bucket rate limits.
//!
//! These are the only request-path structures shared across threads, and only routes that
//! configure them pay for them: an atomic add per request for concurrency, one short lock on
//! one of 32 shards for rate limits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, TryAcquireError};

use crate::clock;

/// `max_concurrency` + `queue` + `queue_timeout` on a route.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    pub max: usize,
    pub queue: usize,
    pub queue_timeout: Duration,
    permits: Semaphore,
    waiting: AtomicUsize,
}

/// Why admission was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// At the limit with a full queue, or waited `queue_timeout` in vain.
    Overloaded,
}

/// Holds one unit of a route's concurrency until dropped.
pub struct Admission<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl ConcurrencyLimit {
    pub fn new(max: usize, queue: usize, queue_timeout: Duration) -> Self {
        ConcurrencyLimit {
            max,
            queue,
            queue_timeout,
            permits: Semaphore::new(max),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Admits at once if under the limit; else waits in the bounded queue up to `queue_timeout`.
    pub async fn admit(&self) -> Result<Admission<'_>, Refused> {
        match self.permits.try_acquire() {
            Ok(p) => return Ok(Admission { _permit: p }),
            Err(TryAcquireError::Closed) => return Err(Refused::Overloaded),
            Err(TryAcquireError::NoPermits) => {}
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Overloaded);
        }
        // Leaves the queue on every exit, including a caller that is dropped while waiting
        // (an HTTP/2 stream the client resets): a leaked place would shrink the queue for good.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let waiting = Waiting(&self.waiting);
        let got = tokio::time::timeout(self.queue_timeout, self.permits.acquire()).await;
        drop(waiting);
        match got {
            Ok(Ok(p)) => Ok(Admission { _permit: p }),
            _ => Err(Refused::Overloaded),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Like [`Self::admit`], but the admission owns its share of the limit, so it can live
    /// as long as a streamed HTTP/2 response body.
    pub async fn admit_owned(self: &std::sync::Arc<Self>) -> Result<OwnedAdmission, Refused> {
        let admission = self.admit().await?;
        admission._permit.forget();
        Ok(OwnedAdmission {
            limit: self.clone(),
        })
    }
}

/// An [`Admission`] that keeps its limit alive; releases its unit when dropped.
pub struct OwnedAdmission {
    limit: std::sync::Arc<ConcurrencyLimit>,
}

impl Drop for OwnedAdmission {
    fn drop(&mut self) {
        self.limit.permits.add_permits(1);
    }
}

/// What a rate limit counts requests by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateKey {
    ClientIp,
    /// Lowercase header name; requests without it share one bucket.
    Header(String),
    /// One bucket for the whole route.
    Route,
    /// `key = "index"`: the index a search request names (the first path segment, unless it
    /// is an API such as `_bulk`); requests naming none share one bucket.
    Index,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated_us: u64,
}

const SHARDS: usize = 32;

/// Token buckets: `rate` tokens per second, up to `burst`, one bucket per key.
#[derive(Debug)]
pub struct RateLimiter {
    pub per_second: f64,
    pub burst: f64,
    pub key: RateKey,
    /// The configured `max_keys`, which `max_keys_per_shard` rounds.
    max_keys: usize,
    /// Keys kept per shard before idle (full) buckets are evicted.
    max_keys_per_shard: usize,
    shards: Vec<Mutex<HashMap<u64, Bucket>>>,
}

impl RateLimiter {
    /// Same rate, burst, key and size: the buckets of one can serve the other.
    pub(crate) fn same_settings(&self, other: &RateLimiter) -> bool {
        self.per_second == other.per_second
            && self.burst == other.burst
            && self.key == other.key
            && self.max_keys == other.max_keys
    }

    pub fn new(per_second: f64, burst: u32, key: RateKey, max_keys: usize) -> Self {
        RateLimiter {
            per_second,
            burst: f64::from(burst.max(1)),
            key,
            max_keys,
            max_keys_per_shard: (max_keys / SHARDS).max(16),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// Takes a token for `key`; `Err(wait)` is how long until one is available.
    pub fn check(&self, key: u64) -> Result<(), Duration> {
        let now = clock::now_us();
        let mut shard = self.shards[(key as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if shard.len() >= self.max_keys_per_shard && !shard.contains_key(&key) {
            evict(&mut shard, now, self.per_second, self.burst);
        }
        let b = shard.entry(key).or_insert(Bucket {
            tokens: self.burst,
            updated_us: now,
        });
        let elapsed = now.saturating_sub(b.updated_us) as f64 / 1e6;
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.burst);
        b.updated_us = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                ((1.0 - b.tokens) / self.per_second).min(3600.0),
            ))
        }
    }

    /// The `max_keys` it was made with (memory is bounded per shard, from this).
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum()
    }
}

/// Drops buckets that have refilled (their keys are idle); if none, the oldest half.
fn evict(shard: &mut HashMap<u64, Bucket>, now: u64, rate: f64, burst: f64) {
    let before = shard.len();
    shard.retain(|_, b| b.tokens + now.saturating_sub(b.updated_us) as f64 / 1e6 * rate < burst);
    if shard.len() == before {
        let mut ages: Vec<u64> = shard.values().map(|b| b.updated_us).collect();
        ages.sort_unstable();
        let cutoff = ages[ages.len() / 2];
        shard.retain(|_, b| b.updated_us > cutoff);
    }
}

/// Parses `"100/s"`, `"6000/m"`, `"10/h"` into tokens per second.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let (n, unit) = s
        .split_once('/')
        .ok_or_else(|| format!("invalid rate {s:?}: expected N/s, N/m or N/h"))?;
    let n: f64 = n
        .trim()
        .parse()
        .map_err(|_| format!("invalid rate {s:?}: {n:?} is not a number"))?;
    let per = match unit.trim() {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        u => {
            return Err(format!(
                "invalid rate {s:?}: unknown unit {u:?} (use s, m or h)"
            ))
        }
    };
    if !(n > 0.0 && n.is_finite()) {
        return Err(format!("invalid rate {s:?}: must be positive"));
    }
    if n / per < 1.0 / 3600.0 {
        return Err(format!("invalid rate {s:?}: the smallest rate is 1/h"));
    }
    Ok(n / per)
}

/// Route-level limits, compiled from a `[[routes]]` entry.
#[derive(Debug, Default, Clone)]
pub struct RouteLimits {
    pub concurrency: Option<Arc<ConcurrencyLimit>>,
    pub rate: Option<Arc<RateLimiter>>,
    /// `scope = "global"`: the limit is Redis' (`rate` is then the per-instance fallback).
    pub global: Option<Arc<crate::fleet::global_limit::GlobalLimit>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100/s").unwrap(), 100.0);
        assert_eq!(parse_rate("60/m").unwrap(), 1.0);
        assert!(parse_rate("100").is_err());
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("5/d").is_err());
        assert!(parse_rate("1e-20/s").is_err());
    }

    #[test]
    fn bucket_allows_burst_then_refuses() {
        let rl = RateLimiter::new(1.0, 3, RateKey::ClientIp, 1000);
        assert!((0..3).all(|_| rl.check(7).is_ok()));
        let wait = rl.check(7).unwrap_err();
        assert!(
            wait > Duration::from_millis(900) && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(rl.check(8).is_ok(), "keys are independent");
    }

    #[test]
    fn memory_is_bounded() {
        let rl = RateLimiter::new(1000.0, 1, RateKey::ClientIp, 1024);
        for k in 0..100_000u64 {
            let _ = rl.check(k);
        }
        assert!(rl.keys() <= 2 * 1024, "{}", rl.keys());
    }

    #[tokio::test]
    async fn concurrency_queue_bounds() {
        let l = ConcurrencyLimit::new(1, 0, Duration::from_millis(50));
        let a = l.admit().await.unwrap();
        assert_eq!(
            l.admit().await.err(),
            Some(Refused::Overloaded),
            "no queue: refused at once"
        );
        drop(a);
        let l = ConcurrencyLimit::new(1, 1, Duration::from_millis(50));
        let _a = l.admit().await.unwrap();
        let start = std::time::Instant::now();
        assert!(l.admit().await.is_err());
        assert!(
            start.elapsed() >= Duration::from_millis(45),
            "waited for queue_timeout"
        );
    }
}
