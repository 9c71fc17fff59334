//! `transport_socket_matches`: Envoy picks each endpoint's transport socket (TLS or plain)
//! by the endpoint's `envoy.transport_socket_match` metadata. A veloxy group speaks one
//! protocol to all its servers, so the matches translate when every endpoint that takes
//! traffic picks the same socket.

use veloxy_import::tree::Node;
use veloxy_import::{Loc, Section};

use super::cluster::upstream_tls;
use super::Ctx;
use crate::util::{seq, typed};

const MATCH_KEY: &str = "envoy.transport_socket_match";

/// Whether a transport socket is Envoy's plain one (`raw_buffer`).
pub fn is_raw(t: &Node) -> bool {
    let name = t.get("name").and_then(|n| n.scalar()).unwrap_or_default();
    let ty = t
        .get("typed_config")
        .map(|c| typed(c).0)
        .unwrap_or_default();
    ty.ends_with("RawBuffer") || (ty.is_empty() && name.ends_with("raw_buffer"))
}

/// The `envoy.transport_socket_match` metadata of a node with `metadata`, as (key, text).
fn match_metadata(n: &Node) -> Vec<(String, String)> {
    n.get("metadata")
        .and_then(|m| m.get("filter_metadata"))
        .and_then(|m| m.get(MATCH_KEY))
        .and_then(|m| m.as_map())
        .unwrap_or(&[])
        .iter()
        .map(|(k, v)| (k.name.clone(), v.scalar().unwrap_or_default()))
        .collect()
}

/// The transport socket each endpoint that takes traffic (priority 0) picks: the index of
/// the first match whose criteria its metadata holds, `None` for the cluster's own socket.
fn choices(c: &Node, matches: &[Node]) -> Vec<Option<usize>> {
    let mut out = Vec::new();
    let la = c.get("load_assignment");
    for group in la
        .map(|la| seq(la.get("endpoints").unwrap_or(la)))
        .unwrap_or(&[])
    {
        if group.get("priority").and_then(|p| p.as_i64()).unwrap_or(0) > 0 {
            continue;
        }
        let locality = match_metadata(group);
        for e in seq(group.get("lb_endpoints").unwrap_or(group)) {
            let mut md = locality.clone();
            for (k, v) in match_metadata(e) {
                md.retain(|(x, _)| *x != k);
                md.push((k, v));
            }
            let pick = matches.iter().position(|m| {
                m.get("match")
                    .and_then(|c| c.as_map())
                    .unwrap_or(&[])
                    .iter()
                    .all(|(k, v)| {
                        let want = v.scalar().unwrap_or_default();
                        md.iter().any(|(x, y)| *x == k.name && *y == want)
                    })
            });
            out.push(pick);
        }
    }
    out.dedup();
    out
}

/// Translates `transport_socket_matches` (with the cluster's `transport_socket`, the
/// socket of endpoints no match picks); whether the group speaks TLS.
pub fn socket_matches(
    ctx: &mut Ctx,
    loc: &Loc,
    m: &Node,
    c: &Node,
    fallback: Option<(&Loc, &Node)>,
    s: &mut Section,
) -> bool {
    let d = "cluster.transport_socket_matches";
    let matches = seq(m);
    let mut picks = choices(c, matches);
    picks.sort();
    picks.dedup();
    let chosen = match picks.as_slice() {
        [] => None,
        [one] => *one,
        _ => {
            ctx.r.refused(
                loc,
                d,
                "the endpoints pick different transport sockets (TLS for some, plain for \
                 others): a veloxy group speaks one protocol to all its servers",
            );
            return fallback
                .map(|(l, t)| socket(ctx, l, "cluster.transport_socket", t, s))
                .unwrap_or(false);
        }
    };
    let Some(i) = chosen else {
        ctx.r.ignored(
            loc,
            d,
            "no endpoint that takes traffic matches one: they use the cluster's \
             transport_socket",
        );
        return fallback
            .map(|(l, t)| socket(ctx, l, "cluster.transport_socket", t, s))
            .unwrap_or(false);
    };
    if let Some((l, _)) = fallback {
        ctx.r.ignored(
            l,
            "cluster.transport_socket",
            "every endpoint that takes traffic picks a transport_socket_matches entry instead",
        );
    }
    match matches[i].get("transport_socket") {
        Some(t) => socket(ctx, loc, d, t, s),
        None => {
            ctx.r.translated(loc, d);
            false
        }
    }
}

/// A cluster's transport socket: plain (`raw_buffer`) or TLS; whether it is TLS.
pub fn socket(ctx: &mut Ctx, loc: &Loc, d: &str, t: &Node, s: &mut Section) -> bool {
    if is_raw(t) {
        ctx.r.translated(loc, d);
        return false;
    }
    upstream_tls(ctx, loc, d, t, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn node(text: &str) -> Node {
        let f: Arc<str> = "c.yaml".into();
        veloxy_import::tree::parse_yaml(&f, text).unwrap().remove(0)
    }

    #[test]
    fn each_endpoint_picks_the_first_match_its_metadata_holds() {
        let c = node(concat!(
            "transport_socket_matches:\n",
            "- {name: tls, match: {tls: true}}\n",
            "- {name: plain, match: {}}\n",
            "load_assignment:\n",
            "  endpoints:\n",
            "  - lb_endpoints:\n",
            "    - endpoint: {address: {socket_address: {address: a, port_value: 1}}}\n",
            "    - endpoint: {address: {socket_address: {address: b, port_value: 1}}}\n",
            "      metadata: {filter_metadata: {envoy.transport_socket_match: {tls: true}}}\n",
            "  - priority: 1\n",
            "    lb_endpoints:\n",
            "    - endpoint: {address: {socket_address: {address: c, port_value: 1}}}\n",
        ));
        let m = c.get("transport_socket_matches").unwrap();
        let mut got = choices(&c, seq(m));
        got.sort();
        assert_eq!(got, [Some(0), Some(1)]);
    }
}
