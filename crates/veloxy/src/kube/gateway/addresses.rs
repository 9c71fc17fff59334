//! Gateway addresses (`gateway_addresses` in `[providers.kubernetes]`): each Gateway gets one
//! address of the pool and is served on copies of the file's listeners bound to it, so that
//! a route attached to one Gateway is not reachable through another's address (the spec's
//! "a Gateway is its own network endpoint"). The copies are plain `[listeners.NAME]` tables:
//! the engine binds, reloads and routes them as any listener, so the feature costs nothing
//! on the request path, and nothing at all without a pool.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use toml::{Table, Value};

use super::types::Gateway;
use super::Translation;
use crate::kube::objects::id;

/// Each Gateway's address from `pool` (`None`: the pool is empty or used up; the Gateway is
/// served on the file's listeners and publishes `status_address`). Gateways are served
/// oldest first, in three passes: the address its status already has, unless its
/// `spec.addresses` asks for others (so an assignment survives restarts and other Gateways
/// coming and going: a newer Gateway asking for a held address does not take it), then the
/// address its `spec.addresses` asks for, then the first free one.
pub(super) fn assign(gateways: &[Arc<Gateway>], pool: &[IpAddr]) -> Vec<Option<IpAddr>> {
    let mut out = vec![None; gateways.len()];
    if pool.is_empty() {
        return out;
    }
    let mut order: Vec<usize> = (0..gateways.len()).collect();
    order.sort_by_key(|&i| {
        let m = &gateways[i].metadata;
        (m.creation_timestamp.clone().map(|c| c.0), id(m))
    });
    let mut taken = BTreeSet::new();
    for pass in 0..3 {
        for &i in &order {
            if out[i].is_some() {
                continue;
            }
            let gw = &gateways[i];
            let asked: Vec<IpAddr> = gw
                .spec
                .addresses
                .iter()
                .filter(|a| a.r#type.as_deref().unwrap_or("IPAddress") == "IPAddress")
                .filter_map(|a| a.value.parse().ok())
                .collect();
            let wanted: Vec<IpAddr> = match pass {
                0 => gw
                    .status
                    .as_ref()
                    .and_then(|s| s["addresses"].as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a["value"].as_str()?.parse().ok())
                    .filter(|a| asked.is_empty() || asked.contains(a))
                    .collect(),
                1 => asked,
                _ => pool.to_vec(),
            };
            if let Some(a) = wanted
                .into_iter()
                .find(|a| pool.contains(a) && !taken.contains(a))
            {
                taken.insert(a);
                out[i] = Some(a);
            }
        }
    }
    out
}

/// The veloxy listener serving a Gateway of address `addr` where the file's listener `on`
/// would: `on` itself without an address, when `addr` is `on`'s own, or when `on` binds every
/// address (it cannot be split by address; a note says so); else a copy of `on` bound to
/// `addr` on the same port, added to `t.listeners` once.
pub(super) fn on_address(
    file: &Table,
    on: String,
    addr: Option<IpAddr>,
    t: &mut Translation,
) -> String {
    let Some(addr) = addr else { return on };
    let Some(l) = file
        .get("listeners")
        .and_then(Value::as_table)
        .and_then(|ls| ls.get(&on))
        .and_then(Value::as_table)
    else {
        return on;
    };
    let bound = l.get("addr").and_then(Value::as_str).unwrap_or_default();
    let Ok(bound) = bound.parse::<SocketAddr>() else {
        let note = format!(
            "listener {on} (addr {bound:?}) is not bound to one IP address: Gateways served on \
             it share it (gateway_addresses needs listeners bound to an address)"
        );
        if !t.notes.contains(&note) {
            t.notes.push(note);
        }
        return on;
    };
    if bound.ip() == addr {
        return on;
    }
    if bound.ip().is_unspecified() {
        let note = format!(
            "listener {on} binds every address ({bound}): Gateways served on it share it \
             (gateway_addresses needs listeners bound to an address)"
        );
        if !t.notes.contains(&note) {
            t.notes.push(note);
        }
        return on;
    }
    let name = copy_name(&on, addr);
    if !t.listeners.contains_key(&name) {
        let mut copy = l.clone();
        let at = SocketAddr::new(addr, bound.port()).to_string();
        copy.insert("addr".into(), at.into());
        t.listeners.insert(name.clone(), Value::Table(copy));
    }
    name
}

/// The name of the copy of listener `on` bound to `addr`: `k8s-gw-ADDR-ON` (`:` of IPv6 as
/// `_`; listener names take letters, digits, `_`, `-` and `.`).
fn copy_name(on: &str, addr: IpAddr) -> String {
    format!("k8s-gw-{}-{on}", addr.to_string().replace(':', "_"))
}
