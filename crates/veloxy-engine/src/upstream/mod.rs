//! Upstream side: balancing policies, per-worker group state and connection pools.

pub mod balancer;
pub(crate) mod pool;

use balancer::{BackendInfo, Picker};
use pool::Pool;

use crate::config::UpstreamGroup;

/// One worker's state for one upstream group: its picker and its idle connections.
pub(crate) struct GroupState {
    pub picker: Box<dyn Picker>,
    pub pool: Pool,
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
        }
    }
}
