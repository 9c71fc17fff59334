//! What a loaded config holds in memory, by kind of object: `GET /memory` on the admin
//! endpoint (issue 36: bounded memory per route, per host, per backend).
//!
//! The bytes are counted from the compiled snapshot, not sampled from the allocator: each
//! route's struct, its path and host text, and its places in the router's indexes; each
//! host's index entry; each backend's struct and address text. Shared pieces (a rule set's
//! rules behind an `Arc`, a group's policy) and allocator overhead are not counted, so the
//! figures are a floor; the process's resident size is reported beside them.

use super::Snapshot;
use crate::heap::Counted;

/// A snapshot's objects and their bytes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Footprint {
    /// Routes over every listener (a route on two listeners counts twice).
    pub routes: Counted,
    /// Distinct exact and `*.suffix` hosts in the routers' indexes.
    pub hosts: Counted,
    /// Backends over every upstream group.
    pub backends: Counted,
}

impl Snapshot {
    /// The memory of the compiled routes, hosts and backends.
    pub(crate) fn footprint(&self) -> Footprint {
        let mut f = Footprint::default();
        for l in &self.listeners {
            let (routes, hosts) = l.router.footprint();
            f.routes.add(routes);
            f.hosts.add(hosts);
        }
        for g in &self.upstreams {
            f.backends.add(g.footprint());
        }
        f
    }
}

impl Footprint {
    /// The admin endpoint's JSON, with the process's resident bytes when known.
    pub(crate) fn to_json(self, resident: Option<u64>) -> String {
        let one = |c: &Counted| serde_json::json!({"count": c.count, "bytes": c.bytes, "bytes_each": c.each()});
        serde_json::json!({
            "routes": one(&self.routes),
            "hosts": one(&self.hosts),
            "backends": one(&self.backends),
            "resident_bytes": resident,
        })
        .to_string()
            + "\n"
    }
}

/// The process's resident set (VmRSS), in bytes.
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
