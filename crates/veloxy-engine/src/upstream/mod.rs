//! Upstream side: balancing policies, per-worker group state and connection pools.

pub mod balancer;
pub mod health;
pub mod policies;
pub(crate) mod pool;

use balancer::{BackendInfo, Picker};
use pool::Pool;

use crate::config::UpstreamGroup;

/// One worker's state for one upstream group: its picker and its idle connections.
pub(crate) struct GroupState {
    pub picker: Box<dyn Picker>,
    pub pool: Pool,
    pub budget: RetryBudget,
}

/// Envoy-style retry budget, per worker and group: every request earns `ratio` of a retry,
/// a retry spends one, and a small reserve lets a quiet service retry its first failures.
/// Under a full outage, retries therefore add at most `ratio` extra load.
pub(crate) struct RetryBudget {
    ratio: f64,
    tokens: f64,
}

/// Retries available with no traffic history (Envoy's `min_retry_concurrency` is 3).
const RETRY_RESERVE: f64 = 3.0;

impl RetryBudget {
    fn new(ratio: f64) -> Self {
        RetryBudget {
            ratio,
            tokens: RETRY_RESERVE,
        }
    }

    /// Called once per request routed to the group.
    #[inline]
    pub fn earn(&mut self) {
        self.tokens = (self.tokens + self.ratio).min(RETRY_RESERVE + 100.0 * self.ratio);
    }

    pub fn try_spend(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl GroupState {
    pub fn new(group: &UpstreamGroup) -> Self {
        let infos: Vec<BackendInfo> = group
            .backends
            .iter()
            .map(|b| BackendInfo {
                addr: b.addr,
                weight: b.weight,
            })
            .collect();
        GroupState {
            picker: group.policy.new_picker(&infos),
            pool: Pool::new(group.backends.len(), group.keepalive, group.idle_timeout),
            budget: RetryBudget::new(group.retry_budget),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_budget_caps_retries_at_the_ratio() {
        let mut b = RetryBudget::new(0.2);
        let mut retries = 0;
        for _ in 0..1000 {
            b.earn();
            if b.try_spend() {
                retries += 1;
            }
        }
        // 20% of 1000 plus the small reserve.
        assert!((200..=204).contains(&retries), "{retries}");
    }
}
