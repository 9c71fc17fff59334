//! Load-balancing policies: the public trait for custom ones, and the built-in ones.
//!
//! A [`Policy`] is shared by all workers and only builds pickers; each worker owns one
//! [`Picker`] per upstream group, so picking a backend never takes a lock shared across threads.
//!
//! ```
//! use veloxy_engine::upstream::balancer::{BackendInfo, PickContext, Picker, Policy, PolicyRegistry};
//!
//! /// Always the first backend not yet tried: a "primary with fallbacks" policy.
//! struct FirstAvailable;
//! struct FirstPicker(usize);
//! impl Picker for FirstPicker {
//!     fn pick(&mut self, ctx: &PickContext) -> Option<usize> {
//!         (0..self.0).find(|&i| !ctx.is_excluded(i))
//!     }
//! }
//! impl Policy for FirstAvailable {
//!     fn name(&self) -> &str { "first_available" }
//!     fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker> {
//!         Box::new(FirstPicker(backends.len()))
//!     }
//! }
//! let mut registry = PolicyRegistry::with_builtins();
//! registry.register(std::sync::Arc::new(FirstAvailable));
//! assert!(registry.get("first_available").is_some());
//! // `policy = "first_available"` in an [upstreams.NAME] table now selects it.
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// What a policy knows about a backend when it builds a picker.
#[derive(Debug, Clone)]
pub struct BackendInfo {
    /// The backend's address.
    pub addr: crate::upstream::addr::BackendAddr,
    /// Its `weight` (default 1).
    pub weight: u32,
}

/// Per-request input to [`Picker::pick`].
#[derive(Debug, Clone, Copy)]
pub struct PickContext {
    /// The downstream client's address.
    pub client: SocketAddr,
    /// Bit i set: backend i must not be picked (down, ejected, at its connection limit, or
    /// already tried by this request).
    pub excluded: u64,
    /// Hash of the group's `hash_key` for this request (client IP by default); 0 if unused.
    pub hash: u64,
}

impl PickContext {
    /// True when backend `i` must not be picked.
    pub fn is_excluded(&self, i: usize) -> bool {
        i < 64 && self.excluded & (1 << i) != 0
    }
}

/// A balancing policy, registered by name and selected with `policy = "NAME"`.
pub trait Policy: Send + Sync + 'static {
    /// The name used in the config file.
    fn name(&self) -> &str;
    /// Builds one worker's picker for a group with these backends (indices match).
    fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker>;
}

/// One worker's picking state for one upstream group. Not shared between threads.
pub trait Picker {
    /// Picks a backend index, or `None` when none may be used.
    fn pick(&mut self, ctx: &PickContext) -> Option<usize>;
    /// A request was sent to `backend` (after `pick`, possibly for a retry).
    fn on_start(&mut self, _backend: usize) {}
    /// The request to `backend` ended: `latency` until its response head (or failure).
    fn on_end(&mut self, _backend: usize, _latency: std::time::Duration, _ok: bool) {}
}

/// Policies known by name. [`PolicyRegistry::with_builtins`] has `round_robin`, `least_conn`,
/// `p2c_ewma`, `consistent_hash` and `random`.
#[derive(Clone)]
pub struct PolicyRegistry {
    policies: BTreeMap<String, Arc<dyn Policy>>,
}

impl PolicyRegistry {
    /// A registry with the built-in policies: `round_robin`, `least_conn`, `p2c_ewma`,
    /// `consistent_hash` and `random`.
    pub fn with_builtins() -> Self {
        let mut r = PolicyRegistry {
            policies: BTreeMap::new(),
        };
        r.register(Arc::new(RoundRobin));
        r.register(Arc::new(super::policies::LeastConn));
        r.register(Arc::new(super::policies::P2cEwma));
        r.register(Arc::new(super::policies::ConsistentHash));
        r.register(Arc::new(super::policies::Random));
        r
    }

    /// Adds (or replaces) a policy under its [`Policy::name`].
    pub fn register(&mut self, policy: Arc<dyn Policy>) {
        self.policies.insert(policy.name().to_owned(), policy);
    }

    /// The policy registered under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Policy>> {
        self.policies.get(name).cloned()
    }

    /// Every registered name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.policies.keys().map(String::as_str).collect()
    }
}

/// Smooth weighted round robin (the nginx algorithm): over any window of `sum(weights)` picks
/// each backend gets exactly its weight, spread out rather than in bursts.
pub struct RoundRobin;

impl Policy for RoundRobin {
    fn name(&self) -> &str {
        "round_robin"
    }
    fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker> {
        Box::new(SmoothWeighted::new(
            backends.iter().map(|b| b.weight).collect(),
        ))
    }
}

struct SmoothWeighted {
    weights: Vec<i64>,
    current: Vec<i64>,
    /// Equal weights reduce to a rotating index: the common case, kept branch-cheap.
    uniform: bool,
    next: usize,
}

impl SmoothWeighted {
    fn new(weights: Vec<u32>) -> Self {
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        let n = weights.len();
        SmoothWeighted {
            weights: weights.into_iter().map(i64::from).collect(),
            current: vec![0; n],
            uniform,
            next: 0,
        }
    }
}

impl Picker for SmoothWeighted {
    fn pick(&mut self, ctx: &PickContext) -> Option<usize> {
        let n = self.weights.len();
        if self.uniform {
            for _ in 0..n {
                let i = self.next;
                self.next = (self.next + 1) % n;
                if !ctx.is_excluded(i) {
                    return Some(i);
                }
            }
            return None;
        }
        let mut total = 0;
        let mut best: Option<usize> = None;
        for i in 0..n {
            if ctx.is_excluded(i) {
                continue;
            }
            self.current[i] += self.weights[i];
            total += self.weights[i];
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.current[b] -= total;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(excluded: u64) -> PickContext {
        PickContext {
            client: "127.0.0.1:1".parse().unwrap(),
            excluded,
            hash: 0,
        }
    }

    fn picker(weights: &[u32]) -> Box<dyn Picker> {
        let infos: Vec<_> = weights
            .iter()
            .map(|&w| BackendInfo {
                addr: "127.0.0.1:1".parse().unwrap(),
                weight: w,
            })
            .collect();
        RoundRobin.new_picker(&infos)
    }

    #[test]
    fn smooth_weighted_sequence() {
        let mut p = picker(&[5, 1, 1]);
        let seq: Vec<_> = (0..7).map(|_| p.pick(&ctx(0)).unwrap()).collect();
        // nginx's documented sequence for weights 5,1,1: a a b a c a a
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn uniform_rotates_and_skips_excluded() {
        let mut p = picker(&[1, 1, 1]);
        assert_eq!(
            (0..4).map(|_| p.pick(&ctx(0)).unwrap()).collect::<Vec<_>>(),
            vec![0, 1, 2, 0]
        );
        assert_eq!(p.pick(&ctx(0b010)), Some(2));
        assert_eq!(p.pick(&ctx(0b111)), None);
    }

    #[test]
    fn weights_two_to_one() {
        let mut p = picker(&[1, 2]);
        let mut counts = [0; 2];
        for _ in 0..300 {
            counts[p.pick(&ctx(0)).unwrap()] += 1;
        }
        assert_eq!(counts, [100, 200]);
    }
}
