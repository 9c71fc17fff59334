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

/// A set of backends of a group, by index: one bit each. Backends 0 to 63 (all of most
/// groups) are one word that never allocates; beyond, only the words with a member are kept
/// (sorted by word index, the first two inline), so the few down or tried backends of a
/// group of 10,000 cost a few words, not the group's 157.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendSet {
    first: u64,
    /// `(w, bits)`: bit i is backend 64 w + i; w >= 1, bits never 0, w ascending.
    rest: smallvec::SmallVec<[(u32, u64); 2]>,
}

#[cfg(test)]
thread_local! {
    /// Calls of [`BackendSet::contains`] on this thread: the backends a pick looked at.
    pub(crate) static PROBES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl BackendSet {
    /// The set whose members are the set bits of `word` (backends 0 to 63).
    pub fn from_word(word: u64) -> Self {
        BackendSet {
            first: word,
            rest: smallvec::SmallVec::new(),
        }
    }

    /// The set of these words (bit i of word w: backend 64 w + i).
    pub fn from_words(words: impl IntoIterator<Item = u64>) -> Self {
        let mut it = words.into_iter();
        let mut set = BackendSet::from_word(it.next().unwrap_or(0));
        for (w, bits) in it.enumerate() {
            set.push_word(w + 1, bits);
        }
        set
    }

    /// Adds word `w` (bits of backends 64 w to 64 w + 63), `w` above every word added so far.
    pub(crate) fn push_word(&mut self, w: usize, bits: u64) {
        match w {
            _ if bits == 0 => {}
            0 => self.first |= bits,
            w => {
                debug_assert!(self.rest.last().is_none_or(|&(l, _)| (l as usize) < w));
                self.rest.push((w as u32, bits));
            }
        }
    }

    /// Word `w` of the set (0 when it has no member there).
    #[inline]
    fn word(&self, w: usize) -> u64 {
        match w {
            0 => self.first,
            w => match self.rest.binary_search_by_key(&(w as u32), |&(k, _)| k) {
                Ok(at) => self.rest[at].1,
                Err(_) => 0,
            },
        }
    }

    /// Whether backend `i` is in the set.
    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        #[cfg(test)]
        PROBES.with(|p| p.set(p.get() + 1));
        let word = if i < 64 {
            self.first
        } else if self.rest.is_empty() {
            0
        } else {
            self.word(i / 64)
        };
        word & (1 << (i % 64)) != 0
    }

    /// Adds backend `i`.
    #[inline]
    pub fn insert(&mut self, i: usize) {
        let (w, bit) = (i / 64, 1u64 << (i % 64));
        if w == 0 {
            self.first |= bit;
            return;
        }
        match self.rest.binary_search_by_key(&(w as u32), |&(k, _)| k) {
            Ok(at) => self.rest[at].1 |= bit,
            Err(at) => self.rest.insert(at, (w as u32, bit)),
        }
    }

    /// Adds every member of `other`.
    pub fn union_with(&mut self, other: &BackendSet) {
        self.first |= other.first;
        if other.rest.is_empty() {
            return;
        }
        if self.rest.is_empty() {
            self.rest.clone_from(&other.rest);
            return;
        }
        let mut merged = smallvec::SmallVec::with_capacity(self.rest.len() + other.rest.len());
        let (mut a, mut b) = (self.rest.iter().peekable(), other.rest.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&(wa, x)), Some(&&(wb, y))) if wa == wb => {
                    a.next();
                    b.next();
                    (wa, x | y)
                }
                (Some(&&(wa, x)), Some(&&(wb, _))) if wa < wb => {
                    a.next();
                    (wa, x)
                }
                (_, Some(&&y)) => {
                    b.next();
                    y
                }
                (Some(&&x), None) => {
                    a.next();
                    x
                }
                (None, None) => break,
            };
            merged.push(next);
        }
        self.rest = merged;
    }

    /// The members, ascending.
    pub fn members(&self) -> impl Iterator<Item = usize> + '_ {
        let words = std::iter::once((0, self.first)).chain(self.rest.iter().map(|&(w, b)| (w, b)));
        words.flat_map(|(w, bits)| {
            (0..64)
                .filter(move |k| bits & (1 << k) != 0)
                .map(move |k| 64 * w as usize + k)
        })
    }

    /// Whether the set has no member.
    pub fn is_empty(&self) -> bool {
        self.first == 0 && self.rest.is_empty()
    }

    /// Whether every backend of a group of `n` is in the set (word by word).
    pub fn covers(&self, n: usize) -> bool {
        let full = |bits: usize| {
            if bits >= 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            }
        };
        (0..n.div_ceil(64).max(1)).all(|w| {
            let bits = n.saturating_sub(64 * w).min(64);
            self.word(w) & full(bits) == full(bits)
        })
    }

    /// Words held beyond the first (a measure of the set's size, for tests).
    #[cfg(test)]
    pub(crate) fn extra_words(&self) -> usize {
        self.rest.len()
    }
}

/// Per-request input to [`Picker::pick`].
#[derive(Debug, Clone)]
pub struct PickContext {
    /// The downstream client's address.
    pub client: SocketAddr,
    /// Backends that must not be picked (down, ejected, at its connection limit, or already
    /// tried by this request).
    pub excluded: BackendSet,
    /// Hash of the group's `hash_key` for this request (client IP by default); 0 if unused.
    pub hash: u64,
}

impl PickContext {
    /// True when backend `i` must not be picked.
    #[inline]
    pub fn is_excluded(&self, i: usize) -> bool {
        self.excluded.contains(i)
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
    /// Unequal weights in a group of more than `SCAN_UP_TO` backends: the order of one cycle,
    /// computed once ([`schedule`]), walked by `next`; empty otherwise.
    table: Vec<u32>,
}

/// One cycle of weighted round robin for a large group, by stride scheduling (each backend's
/// turns spaced by 1 / weight, earliest first): picking walks it at a constant cost, where
/// the smooth algorithm scans the whole group on each pick. The cycle has at most four
/// turns a backend: larger weight sums are scaled down to that, each backend keeping at
/// least one turn (so shares are exact within that rounding).
fn schedule(weights: &[i64]) -> Vec<u32> {
    use std::cmp::Reverse;
    const STRIDE: u64 = 1 << 40;
    let n = weights.len();
    let sum: i64 = weights.iter().sum();
    let cap = 4 * n as i64;
    let turns: Vec<u64> = weights
        .iter()
        .map(|&w| {
            let w = if sum <= cap {
                w
            } else {
                (w * cap / sum).max(1)
            };
            w.max(1) as u64
        })
        .collect();
    let len: u64 = turns.iter().sum();
    let mut heap: std::collections::BinaryHeap<Reverse<(u64, usize)>> = turns
        .iter()
        .enumerate()
        .map(|(i, &t)| Reverse((STRIDE / t, i)))
        .collect();
    let mut out = Vec::with_capacity(len as usize);
    while out.len() < len as usize {
        let Some(Reverse((pass, i))) = heap.pop() else {
            break;
        };
        out.push(i as u32);
        heap.push(Reverse((pass + STRIDE / turns[i], i)));
    }
    out
}

impl SmoothWeighted {
    fn new(weights: Vec<u32>) -> Self {
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        let n = weights.len();
        let weights: Vec<i64> = weights.into_iter().map(i64::from).collect();
        let table = if !uniform && n > super::policies::SCAN_UP_TO {
            schedule(&weights)
        } else {
            Vec::new()
        };
        SmoothWeighted {
            weights,
            current: vec![0; n],
            uniform,
            next: 0,
            table,
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
        if !self.table.is_empty() {
            let len = self.table.len();
            for _ in 0..len {
                let i = self.table[self.next] as usize;
                self.next = (self.next + 1) % len;
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
            excluded: BackendSet::from_word(excluded),
            hash: 0,
        }
    }

    #[test]
    fn backend_sets_of_any_size() {
        let mut s = BackendSet::default();
        assert!(s.is_empty() && s.covers(0) && !s.covers(1));
        for i in [0, 63, 64, 9_999] {
            s.insert(i);
            assert!(s.contains(i));
        }
        assert!(!s.contains(1) && !s.contains(10_000) && !s.contains(128));
        let mut all = BackendSet::default();
        (0..130).for_each(|i| all.insert(i));
        assert!(all.covers(130) && all.covers(64) && !all.covers(131));
        let mut u = BackendSet::from_word(0b10);
        u.union_with(&s);
        assert!(u.contains(1) && u.contains(9_999) && !u.contains(2));
        assert_eq!(BackendSet::from_words([5, 0, 0]), BackendSet::from_word(5));
        // Sparse beyond the first word: two members far apart hold two words, in order.
        let mut far = BackendSet::default();
        far.insert(9_999);
        far.insert(640);
        far.insert(641);
        assert_eq!(far.extra_words(), 2);
        assert!(far.contains(640) && far.contains(641) && far.contains(9_999));
        let mut merged = BackendSet::from_words([0, 1, 0, 4]);
        merged.union_with(&far);
        assert_eq!(merged.extra_words(), 4);
        for i in [64, 194, 640, 641, 9_999] {
            assert!(merged.contains(i), "{i}");
        }
        assert!(!merged.contains(65) && !merged.contains(193));
        assert_eq!(
            merged.members().collect::<Vec<_>>(),
            vec![64, 194, 640, 641, 9_999]
        );
        assert_eq!(BackendSet::from_word(0b101).members().count(), 2);
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
