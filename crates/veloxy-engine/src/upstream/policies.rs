//! Built-in balancing policies beyond round robin. Each worker owns its pickers, so the state
//! here (in-flight counts, latency averages, random state) is per worker and lock-free.

use std::time::Duration;

use super::balancer::{BackendInfo, PickContext, Picker, Policy};
use crate::clock;

/// xorshift64*: a fast, good-enough generator for picking backends.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn seeded() -> Self {
        let seed = clock::now_us()
            ^ (std::thread::current().id().as_u64_fallback() << 32)
            ^ 0x9E37_79B9_7F4A_7C15;
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next() >> 32) * n as u64) >> 32) as usize
    }
}

trait ThreadIdExt {
    fn as_u64_fallback(&self) -> u64;
}
impl ThreadIdExt for std::thread::ThreadId {
    fn as_u64_fallback(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// Indices of backends that may be picked.
fn candidates(n: usize, ctx: &PickContext) -> impl Iterator<Item = usize> + '_ {
    (0..n).filter(move |&i| !ctx.is_excluded(i))
}

/// Groups up to this size are scanned whole on each pick (a few nanoseconds); larger ones
/// are sampled, so that picking costs the same in a group of 10,000 as in one of 4.
pub(crate) const SCAN_UP_TO: usize = 64;

/// Random draws a sampled pick makes before it falls back to a scan (when most of a large
/// group is excluded: down, ejected or tried).
const DRAWS: usize = 16;

/// A uniformly drawn backend that may be picked, in at most [`DRAWS`] draws.
fn draw(n: usize, ctx: &PickContext, rng: &mut Rng) -> Option<usize> {
    (0..DRAWS)
        .map(|_| rng.below(n))
        .find(|&i| !ctx.is_excluded(i))
}

/// `least_conn`: the backend with the fewest requests in flight from this worker, weighted
/// (in-flight / weight); ties go round robin so idle groups still spread load. In groups of
/// more than [`SCAN_UP_TO`] backends, the less loaded of two backends drawn at random (the
/// power of two choices, as Envoy's `LEAST_REQUEST` does), so a pick costs the same at any
/// size.
pub struct LeastConn;

struct LeastConnPicker {
    weights: Vec<u32>,
    in_flight: Vec<u32>,
    next: usize,
    rng: Rng,
}

impl LeastConnPicker {
    /// in_flight / weight as a fixed-point ratio: plenty for weights up to 2^16.
    fn load(&self, i: usize) -> u64 {
        (u64::from(self.in_flight[i]) << 16) / u64::from(self.weights[i].max(1))
    }
}

impl Policy for LeastConn {
    fn name(&self) -> &str {
        "least_conn"
    }
    fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker> {
        Box::new(LeastConnPicker {
            weights: backends.iter().map(|b| b.weight).collect(),
            in_flight: vec![0; backends.len()],
            next: 0,
            rng: Rng::seeded(),
        })
    }
}

impl Picker for LeastConnPicker {
    fn pick(&mut self, ctx: &PickContext) -> Option<usize> {
        let n = self.weights.len();
        if n > SCAN_UP_TO {
            if let Some(a) = draw(n, ctx, &mut self.rng) {
                let b = draw(n, ctx, &mut self.rng).unwrap_or(a);
                return Some(if self.load(b) < self.load(a) { b } else { a });
            }
        }
        let mut best: Option<(usize, u64)> = None;
        for k in 0..n {
            let i = (self.next + k) % n;
            if ctx.is_excluded(i) {
                continue;
            }
            let load = self.load(i);
            if best.is_none_or(|(_, l)| load < l) {
                best = Some((i, load));
            }
        }
        self.next = (self.next + 1) % n.max(1);
        best.map(|(i, _)| i)
    }
    fn on_start(&mut self, b: usize) {
        self.in_flight[b] += 1;
    }
    fn on_end(&mut self, b: usize, _latency: Duration, _ok: bool) {
        self.in_flight[b] = self.in_flight[b].saturating_sub(1);
    }
}

/// `p2c_ewma`: power of two random choices over a peak-EWMA latency estimate times
/// (in-flight + 1), as in Finagle and Linkerd. Slow or failing backends get little traffic;
/// a backend's estimate decays back when it is not picked (time constant 10 s).
pub struct P2cEwma;

/// Decay time constant of the latency average.
const EWMA_TAU_US: f64 = 10_000_000.0;
/// Penalty latency recorded for a failed request.
const FAILURE_PENALTY_US: f64 = 1_000_000.0;

struct P2cPicker {
    ewma_us: Vec<f64>,
    stamp_us: Vec<u64>,
    in_flight: Vec<u32>,
    rng: Rng,
}

impl Policy for P2cEwma {
    fn name(&self) -> &str {
        "p2c_ewma"
    }
    fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker> {
        let n = backends.len();
        Box::new(P2cPicker {
            ewma_us: vec![0.0; n],
            stamp_us: vec![clock::now_us(); n],
            in_flight: vec![0; n],
            rng: Rng::seeded(),
        })
    }
}

impl P2cPicker {
    fn cost(&self, i: usize, now: u64) -> f64 {
        let age = now.saturating_sub(self.stamp_us[i]) as f64;
        let decayed = self.ewma_us[i] * (-age / EWMA_TAU_US).exp();
        (decayed + 1.0) * f64::from(self.in_flight[i] + 1)
    }
}

impl Picker for P2cPicker {
    fn pick(&mut self, ctx: &PickContext) -> Option<usize> {
        let n = self.ewma_us.len();
        if n > SCAN_UP_TO {
            if let Some(a) = draw(n, ctx, &mut self.rng) {
                let b = draw(n, ctx, &mut self.rng).unwrap_or(a);
                let now = clock::now_us();
                return Some(if self.cost(b, now) < self.cost(a, now) {
                    b
                } else {
                    a
                });
            }
        }
        let avail: u32 = candidates(n, ctx).count() as u32;
        match avail {
            0 => return None,
            1 => return candidates(n, ctx).next(),
            _ => {}
        }
        let a = candidates(n, ctx).nth(self.rng.below(avail as usize))?;
        let mut b = a;
        while b == a {
            b = candidates(n, ctx).nth(self.rng.below(avail as usize))?;
        }
        let now = clock::now_us();
        Some(if self.cost(a, now) <= self.cost(b, now) {
            a
        } else {
            b
        })
    }
    fn on_start(&mut self, b: usize) {
        self.in_flight[b] += 1;
    }
    fn on_end(&mut self, b: usize, latency: Duration, ok: bool) {
        self.in_flight[b] = self.in_flight[b].saturating_sub(1);
        let now = clock::now_us();
        let sample = if ok {
            latency.as_micros() as f64
        } else {
            FAILURE_PENALTY_US
        };
        let age = now.saturating_sub(self.stamp_us[b]) as f64;
        let w = (-age / EWMA_TAU_US).exp();
        let prev = self.ewma_us[b] * w;
        // Peak-sensitive: a slower sample takes over at once, faster ones blend in.
        self.ewma_us[b] = if sample > prev {
            sample
        } else {
            prev * w + sample * (1.0 - w)
        };
        self.stamp_us[b] = now;
    }
}

/// `random`: uniformly random among usable backends, weighted.
pub struct Random;

struct RandomPicker {
    weights: Vec<u32>,
    /// For groups over [`SCAN_UP_TO`] with unequal weights: the running sums of the weights,
    /// searched by bisection. Empty otherwise.
    sums: Vec<u64>,
    uniform: bool,
    rng: Rng,
}

impl Policy for Random {
    fn name(&self) -> &str {
        "random"
    }
    fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker> {
        let weights: Vec<u32> = backends.iter().map(|b| b.weight).collect();
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        let sums = if weights.len() > SCAN_UP_TO && !uniform {
            weights
                .iter()
                .scan(0u64, |acc, &w| {
                    *acc += u64::from(w);
                    Some(*acc)
                })
                .collect()
        } else {
            Vec::new()
        };
        Box::new(RandomPicker {
            weights,
            sums,
            uniform,
            rng: Rng::seeded(),
        })
    }
}

impl Picker for RandomPicker {
    fn pick(&mut self, ctx: &PickContext) -> Option<usize> {
        let n = self.weights.len();
        if n > SCAN_UP_TO {
            let drawn = if self.uniform {
                draw(n, ctx, &mut self.rng)
            } else {
                let total = *self.sums.last().unwrap_or(&0);
                (0..DRAWS).find_map(|_| {
                    let r = self.rng.next() % total.max(1);
                    let i = self.sums.partition_point(|&s| s <= r);
                    (i < n && !ctx.is_excluded(i)).then_some(i)
                })
            };
            if drawn.is_some() {
                return drawn;
            }
        }
        let total: u64 = candidates(self.weights.len(), ctx)
            .map(|i| u64::from(self.weights[i]))
            .sum();
        if total == 0 {
            return None;
        }
        let mut r = self.rng.next() % total;
        for i in candidates(self.weights.len(), ctx) {
            let w = u64::from(self.weights[i]);
            if r < w {
                return Some(i);
            }
            r -= w;
        }
        None
    }
}

/// `consistent_hash`: Maglev hashing of the group's `hash_key` (client IP by default). Every
/// key maps to the same backend while the set is stable; removing one of N backends moves
/// about 1/N of the keys; a key whose backend is down falls through to the next table entry,
/// so only that backend's keys move. Weights give a backend proportionally more table slots.
pub struct ConsistentHash;

/// Maglev lookup table size for small groups: a prime well above 100 x backends. Larger
/// groups get the first prime above 100 x backends ([`maglev_size`]).
const MAGLEV_SIZE: usize = 65_537;

/// The table size for `n` backends: a prime of at least 100 slots a backend, so each gets
/// its share within about 1% (Maglev's rule), and at least [`MAGLEV_SIZE`].
fn maglev_size(n: usize) -> usize {
    let is_prime = |m: usize| {
        m > 1
            && (2..)
                .take_while(|d| d * d <= m)
                .all(|d| !m.is_multiple_of(d))
    };
    let mut m = (100 * n).max(MAGLEV_SIZE);
    while !is_prime(m) {
        m += 1;
    }
    m
}

struct MaglevPicker {
    table: Vec<u16>,
    backends: usize,
}

impl Policy for ConsistentHash {
    fn name(&self) -> &str {
        "consistent_hash"
    }
    fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker> {
        Box::new(MaglevPicker {
            table: maglev_table(backends),
            backends: backends.len(),
        })
    }
}

/// Builds the Maglev permutation table (Eisenbud et al., NSDI 2016), keyed by backend address
/// so a backend keeps its slots when others come or go.
pub(crate) fn maglev_table(backends: &[BackendInfo]) -> Vec<u16> {
    let n = backends.len();
    if n == 0 {
        return Vec::new();
    }
    let size = maglev_size(n);
    let m = size as u64;
    let perms: Vec<(u64, u64)> = backends
        .iter()
        .map(|b| {
            let name = b.addr.to_string();
            let offset = hash_bytes(name.as_bytes(), 0x5151) % m;
            let skip = hash_bytes(name.as_bytes(), 0xABCD) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; n];
    let mut table = vec![u16::MAX; size];
    let mut filled = 0;
    'outer: loop {
        for i in 0..n {
            for _ in 0..backends[i].weight.max(1) {
                let (offset, skip) = perms[i];
                let mut c = (offset + next[i] * skip) % m;
                while table[c as usize] != u16::MAX {
                    next[i] += 1;
                    c = (offset + next[i] * skip) % m;
                }
                table[c as usize] = i as u16;
                next[i] += 1;
                filled += 1;
                if filled == size {
                    break 'outer;
                }
            }
        }
    }
    table
}

impl Picker for MaglevPicker {
    fn pick(&mut self, ctx: &PickContext) -> Option<usize> {
        if self.table.is_empty() {
            return None;
        }
        let size = self.table.len();
        let start = (ctx.hash % size as u64) as usize;
        // Fall through to later slots (a deterministic sequence per key) when the owner is out.
        for k in 0..size {
            let b = self.table[(start + k * 7919) % size] as usize;
            if !ctx.is_excluded(b) {
                return Some(b);
            }
            if k > 4096 {
                break;
            }
        }
        // Nearly every backend is out: the first usable one after the key's owner, in index
        // order (still the same for the same key while the set does not change).
        let owner = self.table[start] as usize;
        (1..=self.backends)
            .map(|k| (owner + k) % self.backends)
            .find(|&b| !ctx.is_excluded(b))
    }
}

/// 64-bit FNV-1a with a final avalanche; keys are short (IPs, header values, paths).
pub fn hash_bytes(data: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infos(n: usize) -> Vec<BackendInfo> {
        (0..n)
            .map(|i| BackendInfo {
                addr: format!("10.0.0.{}:80", i + 1).parse().unwrap(),
                weight: 1,
            })
            .collect()
    }

    fn ctx(hash: u64, excluded: u64) -> PickContext {
        PickContext {
            client: "127.0.0.1:1".parse().unwrap(),
            excluded: super::super::balancer::BackendSet::from_word(excluded),
            hash,
        }
    }

    #[test]
    fn maglev_moves_about_one_nth_of_keys_when_a_backend_goes() {
        let five = infos(5);
        let four: Vec<_> = five[..4].to_vec();
        let mut a = ConsistentHash.new_picker(&five);
        let mut b = ConsistentHash.new_picker(&four);
        let keys = 20_000u64;
        let mut moved = 0;
        let mut moved_between_survivors = 0;
        let mut per_backend = [0u32; 5];
        for k in 0..keys {
            let h = hash_bytes(&k.to_le_bytes(), 1);
            let before = a.pick(&ctx(h, 0)).unwrap();
            per_backend[before] += 1;
            let after = b.pick(&ctx(h, 0)).unwrap();
            // Compare by address: indices are stable here because the removed one is last.
            if before != after {
                moved += 1;
                if before != 4 {
                    moved_between_survivors += 1;
                }
            }
        }
        let share = moved as f64 / keys as f64;
        assert!((0.15..0.27).contains(&share), "moved {share}");
        // Maglev's disruption is near-minimal: almost every moved key was on the removed one.
        let extra = moved_between_survivors as f64 / keys as f64;
        assert!(
            extra < 0.03,
            "keys moved between surviving backends: {extra}"
        );
        assert!(
            per_backend.iter().all(|&c| (3000..5000).contains(&c)),
            "{per_backend:?}"
        );
    }

    #[test]
    fn maglev_falls_through_for_excluded_backend_only() {
        let mut p = ConsistentHash.new_picker(&infos(3));
        for k in 0..1000u64 {
            let h = hash_bytes(&k.to_le_bytes(), 2);
            let owner = p.pick(&ctx(h, 0)).unwrap();
            let other = p.pick(&ctx(h, 1 << ((owner + 1) % 3))).unwrap();
            assert_eq!(
                owner, other,
                "excluding another backend does not move this key"
            );
            let moved = p.pick(&ctx(h, 1 << owner)).unwrap();
            assert_ne!(moved, owner);
        }
    }

    #[test]
    fn least_conn_prefers_idle_backend() {
        let mut p = LeastConn.new_picker(&infos(3));
        p.on_start(0);
        p.on_start(0);
        p.on_start(1);
        assert_eq!(p.pick(&ctx(0, 0)), Some(2));
        assert_eq!(p.pick(&ctx(0, 0b100)), Some(1));
    }

    #[test]
    fn p2c_avoids_slow_backend() {
        let mut p = P2cEwma.new_picker(&infos(2));
        for _ in 0..20 {
            p.on_start(0);
            p.on_end(0, Duration::from_millis(200), true);
            p.on_start(1);
            p.on_end(1, Duration::from_millis(1), true);
        }
        let picks = (0..1000).filter(|_| p.pick(&ctx(0, 0)) == Some(1)).count();
        assert!(picks > 950, "{picks}");
    }

    #[test]
    fn random_respects_exclusion_and_weights() {
        let mut bs = infos(3);
        bs[2].weight = 3;
        let mut p = Random.new_picker(&bs);
        let mut counts = [0; 3];
        for _ in 0..10_000 {
            counts[p.pick(&ctx(0, 0b001)).unwrap()] += 1;
        }
        assert_eq!(counts[0], 0);
        assert!(
            (2000..3000).contains(&counts[1]) && (7000..8000).contains(&counts[2]),
            "{counts:?}"
        );
    }

    /// Addresses for a large group: 10.A.B.C:80.
    fn many(n: usize) -> Vec<BackendInfo> {
        (0..n)
            .map(|i| BackendInfo {
                addr: format!("10.{}.{}.{}:80", i >> 16, (i >> 8) & 255, i & 255)
                    .parse()
                    .unwrap(),
                weight: 1 + (i % 3) as u32,
            })
            .collect()
    }

    #[test]
    fn every_policy_picks_in_a_group_of_ten_thousand() {
        let backends = many(10_000);
        let registry = super::super::balancer::PolicyRegistry::with_builtins();
        for name in registry.names() {
            let mut picker = registry.get(name).unwrap().new_picker(&backends);
            // Only two backends left, one of them past the first 64.
            let mut excluded = super::super::balancer::BackendSet::default();
            (0..10_000)
                .filter(|&i| i != 7 && i != 9_999)
                .for_each(|i| excluded.insert(i));
            let mut seen = std::collections::BTreeSet::new();
            for h in 0..200u64 {
                let c = PickContext {
                    client: "127.0.0.1:1".parse().unwrap(),
                    excluded: excluded.clone(),
                    hash: hash_bytes(&h.to_le_bytes(), 0),
                };
                let b = picker.pick(&c).unwrap_or_else(|| panic!("{name}: no pick"));
                assert!(b == 7 || b == 9_999, "{name} picked excluded {b}");
                picker.on_start(b);
                picker.on_end(b, Duration::from_millis(1), true);
                seen.insert(b);
            }
            assert!(
                seen.contains(&9_999),
                "{name} never picked the high backend"
            );
            excluded.insert(7);
            excluded.insert(9_999);
            let c = PickContext {
                client: "127.0.0.1:1".parse().unwrap(),
                excluded,
                hash: 1,
            };
            assert_eq!(picker.pick(&c), None, "{name}: all excluded");
        }
    }

    #[test]
    fn a_pick_in_a_group_of_ten_thousand_looks_at_a_few_backends() {
        use super::super::balancer::{BackendSet, PolicyRegistry, PROBES};
        let registry = PolicyRegistry::with_builtins();
        for weighted in [false, true] {
            let backends: Vec<BackendInfo> = many(10_000)
                .into_iter()
                .map(|b| BackendInfo {
                    weight: if weighted { b.weight } else { 1 },
                    ..b
                })
                .collect();
            // A few backends down, spread over the group.
            let mut excluded = BackendSet::default();
            [3, 64, 5_000, 9_999]
                .into_iter()
                .for_each(|i| excluded.insert(i));
            for name in registry.names() {
                let mut picker = registry.get(name).unwrap().new_picker(&backends);
                PROBES.with(|p| p.set(0));
                let picks = 2_000u64;
                let mut most = 0;
                for h in 0..picks {
                    let before = PROBES.with(|p| p.get());
                    let c = PickContext {
                        client: "127.0.0.1:1".parse().unwrap(),
                        excluded: excluded.clone(),
                        hash: hash_bytes(&h.to_le_bytes(), 3),
                    };
                    let b = picker.pick(&c).expect("a pick");
                    assert!(!excluded.contains(b), "{name} picked excluded {b}");
                    picker.on_start(b);
                    picker.on_end(b, Duration::from_millis(1), true);
                    most = most.max(PROBES.with(|p| p.get()) - before);
                }
                let mean = PROBES.with(|p| p.get()) as f64 / picks as f64;
                // One exclusion check per candidate drawn: a scan of the group would be 10,000.
                assert!(
                    mean < 4.0 && most <= 64,
                    "{name} (weighted {weighted}): {mean} backends looked at per pick, {most} at most"
                );
            }
        }
    }

    fn free() -> PickContext {
        PickContext {
            client: "127.0.0.1:1".parse().unwrap(),
            excluded: super::super::balancer::BackendSet::default(),
            hash: 0,
        }
    }

    #[test]
    fn large_groups_keep_their_weights_and_balance() {
        let registry = super::super::balancer::PolicyRegistry::with_builtins();
        // Weights 1, 2, 3 over 300 backends: one round-robin cycle (600 picks) gives each
        // exactly its weight.
        let backends = many(300);
        let mut rr = registry.get("round_robin").unwrap().new_picker(&backends);
        let mut counts = vec![0u32; 300];
        for _ in 0..600 * 3 {
            counts[rr.pick(&free()).unwrap()] += 1;
        }
        for (i, c) in counts.iter().enumerate() {
            assert_eq!(*c, 3 * backends[i].weight, "round_robin, backend {i}");
        }
        // Random draws follow the weights: the weight-3 third gets about half the picks.
        let mut random = registry.get("random").unwrap().new_picker(&backends);
        let heavy = (0..120_000)
            .filter(|_| backends[random.pick(&free()).unwrap()].weight == 3)
            .count();
        assert!(
            (55_000..65_000).contains(&heavy),
            "random: {heavy} of 120000 to weight 3"
        );
        // least_conn by two choices keeps in-flight counts close in a group of 1,000.
        let equal: Vec<BackendInfo> = many(1_000)
            .into_iter()
            .map(|b| BackendInfo { weight: 1, ..b })
            .collect();
        let mut lc = registry.get("least_conn").unwrap().new_picker(&equal);
        let mut in_flight = vec![0u32; 1_000];
        for _ in 0..10_000 {
            let b = lc.pick(&free()).unwrap();
            lc.on_start(b);
            in_flight[b] += 1;
        }
        let max = *in_flight.iter().max().unwrap();
        assert!(
            max <= 16,
            "least_conn: {max} in flight on one backend, 10 on average"
        );
    }
}
