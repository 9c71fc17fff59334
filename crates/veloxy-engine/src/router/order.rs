//! The precedence order of a router's routes, built host by host so that a reload reuses
//! the order of every exact host whose routes did not change.
//!
//! A request matches the routes of one exact host at most, so the order among the routes of
//! different exact hosts never decides anything: each exact host's routes are sorted among
//! themselves (regex routes sharing a pattern grouped at its first appearance *in that
//! host*), and the result is kept as a permutation of the host's routes in file order
//! ([`HostOrder`]). It depends only on the host's own routes' kinds, paths and condition
//! counts in file order, not on their file positions ([`Route::index`]) nor on any other
//! host, so the next build reuses it as it is when those are the same. The `*.suffix` and
//! host-less routes, which a request may meet from several buckets, are sorted together as
//! one list each (they are few in large configs).

use std::collections::HashMap;
use std::sync::Arc;

use super::{HostMatch, Route, Router};

/// An exact host's routes in precedence order: `order[p]` is the position, among the host's
/// routes in file order, of the route that comes `p`-th.
pub(super) type HostOrder = Arc<[u32]>;

/// Exact host name to its [`HostOrder`]; FxHash as for the host tables.
pub(super) type HostOrders = rustc_hash::FxHashMap<Box<str>, HostOrder>;

fn kind(r: &Route) -> u8 {
    match (r.exact, &r.regex) {
        (true, _) => 0,
        (false, Some(_)) => 1,
        (false, None) => 2,
    }
}

/// The precedence order of `at` (positions in `routes`, in file order, of one host or one
/// list): exact paths, then regexes in file order (those sharing a pattern grouped at its
/// first appearance in `at`), then prefixes longest first; more conditions first among the
/// same path, then file order.
pub(super) fn sort(routes: &[Route], at: &[u32]) -> Vec<u32> {
    let route = |k: u32| &routes[at[k as usize] as usize];
    let mut first_of: HashMap<&str, u32> = HashMap::new();
    let first: Vec<u32> = (0..at.len() as u32)
        .map(|k| match &route(k).regex {
            Some(_) => *first_of.entry(route(k).path.as_str()).or_insert(k),
            None => 0,
        })
        .collect();
    let mut order: Vec<u32> = (0..at.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (route(a), route(b));
        kind(ra)
            .cmp(&kind(rb))
            .then_with(|| match kind(ra) {
                1 => first[a as usize].cmp(&first[b as usize]),
                _ => rb
                    .path
                    .len()
                    .cmp(&ra.path.len())
                    .then(ra.path.cmp(&rb.path)),
            })
            .then(rb.conditions.count().cmp(&ra.conditions.count()))
            .then(a.cmp(&b))
    });
    order
}

/// What [`sort`] reads of a route: two hosts whose routes are alike in file order sort alike.
fn sorts_alike(a: &Route, b: &Route) -> bool {
    a.exact == b.exact
        && a.regex.is_some() == b.regex.is_some()
        && a.path == b.path
        && a.conditions.count() == b.conditions.count()
}

impl Router {
    /// `prev`'s order of exact host `host`, when its routes there sorted alike to `at`
    /// (positions in `routes`, in file order).
    fn same_order(&self, host: &str, routes: &[Route], at: &[u32]) -> Option<HostOrder> {
        let order = self.orders.get(host)?;
        let slots = self.hosts.exact.get(host.as_bytes())?;
        if order.len() != at.len() || slots.len() != at.len() {
            return None;
        }
        // The p-th slot is the route `order[p]`-th in file order, then and now.
        let alike = slots.iter().zip(order.iter()).all(|(s, &k)| {
            sorts_alike(
                &self.routes[s.at as usize],
                &routes[at[k as usize] as usize],
            )
        });
        alike.then(|| order.clone())
    }

    /// The precedence order of every route (positions in `self.routes`): each exact host's
    /// routes together (its order reused from `prev` when alike), then the `*.suffix`
    /// routes, then the host-less ones; and the exact hosts' orders, with how many of them
    /// came from `prev`.
    pub(super) fn precedence(&self, prev: Option<&Router>) -> (Vec<u32>, HostOrders, usize) {
        let mut exact: rustc_hash::FxHashMap<&str, Vec<u32>> = Default::default();
        let mut names = Vec::new();
        let (mut suffix, mut any) = (Vec::new(), Vec::new());
        for (i, r) in self.routes.iter().enumerate() {
            match &r.host {
                HostMatch::Exact(h) => exact
                    .entry(h.as_str())
                    .or_insert_with(|| {
                        names.push(h.as_str());
                        Vec::new()
                    })
                    .push(i as u32),
                HostMatch::Suffix(_) => suffix.push(i as u32),
                HostMatch::Any => any.push(i as u32),
            }
        }
        let mut out = Vec::with_capacity(self.routes.len());
        let mut orders = HostOrders::default();
        orders.reserve(names.len());
        let mut reused = 0;
        for name in names {
            let at = &exact[name];
            let order = match prev.and_then(|p| p.same_order(name, &self.routes, at)) {
                Some(order) => {
                    reused += 1;
                    order
                }
                None => sort(&self.routes, at).into(),
            };
            out.extend(order.iter().map(|&k| at[k as usize]));
            orders.insert(name.into(), order);
        }
        for list in [suffix, any] {
            out.extend(
                sort(&self.routes, &list)
                    .into_iter()
                    .map(|k| list[k as usize]),
            );
        }
        (out, orders, reused)
    }
}
