//! A reload compiles only the routes whose text changed.
//!
//! Every compile of a file that [`chunks`](super::chunks) can cut leaves a [`Reuse`] in its
//! snapshot: the hash of the file's text outside routes and upstream groups (the *context*:
//! `[server]`, listeners, caches, rule sets, ...), the groups' names and the settings routes
//! read from them, and for each *plain* `[[routes]]` entry (see `chunks::PLAIN_KEYS`) the
//! hash of its text and where its compiled routes sit in the snapshot's routers.
//!
//! The next compile with that snapshot ([`super::compile_str_after`]) cuts the new text the
//! same way. When the context is unchanged, each plain entry whose text hashes to one of
//! the previous ones is blanked (its bytes but newlines become spaces, so every other span,
//! line and column stays where it is) before parsing: the entry is neither parsed nor
//! compiled, and its previous routes are cloned in at its place in file order, their group
//! index mapped by name. Everything else, the routers' sort and index included, is built as
//! on a first load; the server then carries live state over as for any reload.
//!
//! Anything unexpected makes it compile the whole file instead: a group a reused route
//! names gone or changed in what routes read, a parsed route count that does not match the
//! cut, ACME (which reads every route's host).

use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::path::Path;

use super::chunks::Kind;
use crate::config::{Snapshot, UpstreamGroup, UpstreamProtocol};
use crate::router::{Route, RouteTarget};

/// What routes read from their group (besides its name): a route compiled against a group
/// with the same values compiles the same.
type GroupSig = (UpstreamProtocol, bool, bool);

fn sig(g: &UpstreamGroup) -> GroupSig {
    (g.protocol, g.proxy_protocol > 0, g.location_rewrite)
}

/// The previous compile's routes, by the text they came from (kept in its [`Snapshot`]).
pub(crate) struct Reuse {
    /// The config file's path and the text of every chunk but routes and groups.
    context: u128,
    /// The groups by index, as the routes refer to them.
    groups: Vec<(String, GroupSig)>,
    /// Each plain route entry's text hash: its ordinal among the file's `[[routes]]`.
    entries: rustc_hash::FxHashMap<u128, u32>,
    /// Every compiled route as (entry ordinal, listener, position in its router), by ordinal.
    placed: Vec<(u32, u16, u32)>,
    /// The number of route entries in the file.
    ordinals: usize,
    /// How many of the file's route entries this compile took from the previous one.
    pub(crate) taken: usize,
}

impl std::fmt::Debug for Reuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reuse")
            .field("entries", &self.entries.len())
            .field("routes", &self.placed.len())
            .field("taken", &self.taken)
            .finish()
    }
}

/// Two SipHash runs with different prefixes: 128 bits, so that two texts of one config
/// sharing a hash is not a thing to plan for.
fn hash(parts: &[&[u8]]) -> u128 {
    let one = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        for p in parts {
            p.hash(&mut h);
        }
        h.finish()
    };
    (u128::from(one(1)) << 64) | u128::from(one(2))
}

/// The text cut into chunks, hashed once for the plan and for the next reuse record.
pub(super) struct Cut {
    /// The context's hash (see [`Reuse`]).
    context: u128,
    /// Each route entry's span, and its text's hash when it is plain.
    entries: Vec<(Range<usize>, Option<u128>)>,
}

/// `text` with the bytes of `spans` but newlines made spaces: the rest parses as before,
/// at the same offsets, lines and columns.
pub(super) fn blank(text: &str, spans: impl Iterator<Item = Range<usize>>) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for span in spans {
        for b in &mut bytes[span] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    // Whole entries are blanked, so no character is cut in two.
    String::from_utf8(bytes).unwrap_or_else(|_| text.to_owned())
}

impl Cut {
    /// Each route entry's span.
    pub(super) fn entries(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.entries.iter().map(|(span, _)| span.clone())
    }

    /// `None` when the text is not understood (see [`super::chunks`]).
    pub(super) fn of(file: &Path, text: &str) -> Option<Cut> {
        let chunks = super::chunks::chunks(text)?;
        let path = file.as_os_str().as_encoded_bytes();
        let mut parts = vec![path];
        parts.extend(
            (chunks.iter())
                .filter(|c| c.kind == Kind::Other)
                .map(|c| text[c.span.clone()].as_bytes()),
        );
        let entries = (chunks.iter())
            .filter(|c| c.kind == Kind::Route)
            .map(|c| {
                let h = c.plain.then(|| hash(&[text[c.span.clone()].as_bytes()]));
                (c.span.clone(), h)
            })
            .collect();
        Some(Cut {
            context: hash(&parts),
            entries,
        })
    }
}

impl Reuse {
    /// The number of route entries in the file.
    pub(crate) fn entries(&self) -> usize {
        self.ordinals
    }

    /// The reuse record of `snapshot`, compiled from the text of `cut`; `routes` is the
    /// number of `[[routes]]` entries the parse found (it must match the cut).
    pub(super) fn build(
        cut: &Cut,
        (routes, taken): (usize, usize),
        snapshot: &Snapshot,
    ) -> Option<Reuse> {
        if cut.entries.len() != routes || snapshot.settings.acme.is_some() {
            return None;
        }
        let entries = (cut.entries.iter().enumerate())
            .filter_map(|(k, (_, h))| Some(((*h)?, k as u32)))
            .collect();
        let mut placed = Vec::new();
        for (l, listener) in snapshot.listeners.iter().enumerate() {
            let l = u16::try_from(l).ok()?;
            for (pos, r) in listener.router.routes().iter().enumerate() {
                placed.push((u32::try_from(r.index).ok()?, l, pos as u32));
            }
        }
        placed.sort_unstable();
        Some(Reuse {
            context: cut.context,
            groups: (snapshot.upstreams.iter())
                .map(|g| (g.name.clone(), sig(g)))
                .collect(),
            entries,
            placed,
            ordinals: routes,
            taken,
        })
    }
}

/// Which route entries of a new text are taken from the previous snapshot.
pub(super) struct Plan<'a> {
    prev: &'a Snapshot,
    reuse: &'a Reuse,
    /// The new text's route entries: their span, and the previous ordinal when reused.
    entries: Vec<(Range<usize>, Option<u32>)>,
    /// Ordinals of the entries that are parsed, in file order.
    fresh: Vec<usize>,
}

/// A reused route a compile cannot take as it is: the whole file is compiled instead.
#[derive(Debug)]
pub(super) struct Stale;

impl<'a> Plan<'a> {
    /// The plan for `text`, or `None` when nothing can be reused.
    pub(super) fn new(prev: &'a Snapshot, cut: &Cut) -> Option<Plan<'a>> {
        let reuse = prev.reuse.as_deref()?;
        if cut.context != reuse.context {
            return None;
        }
        let entries: Vec<(Range<usize>, Option<u32>)> = (cut.entries.iter())
            .map(|(span, h)| (span.clone(), h.and_then(|h| reuse.entries.get(&h).copied())))
            .collect();
        if entries.iter().all(|(_, old)| old.is_none()) {
            return None;
        }
        let fresh = (entries.iter().enumerate())
            .filter(|(_, (_, old))| old.is_none())
            .map(|(k, _)| k)
            .collect();
        Some(Plan {
            prev,
            reuse,
            entries,
            fresh,
        })
    }

    /// The previous router of listener `name`: the new one reuses its hosts' orders.
    pub(super) fn router(&self, name: &str) -> Option<&'a crate::router::Router> {
        let l = self.prev.listeners.iter().find(|l| l.name == name)?;
        Some(&l.router)
    }

    /// The text to parse: reused entries blanked.
    pub(super) fn blanked(&self, text: &str) -> String {
        let reused = self.entries.iter().filter(|(_, old)| old.is_some());
        blank(text, reused.map(|(span, _)| span.clone()))
    }

    /// Every route entry: its span, and its previous ordinal when reused.
    pub(super) fn entries(&self) -> Vec<(Range<usize>, Option<u32>)> {
        self.entries.clone()
    }

    /// The number of entries the parse of the blanked text must find.
    pub(super) fn fresh_count(&self) -> usize {
        self.fresh.len()
    }

    /// The file ordinal of the `parsed`-th parsed entry.
    pub(super) fn ordinal(&self, parsed: usize) -> usize {
        self.fresh[parsed]
    }

    /// Reused entries in file order: (ordinal, previous ordinal, span in the new text).
    pub(super) fn reused(&self) -> impl Iterator<Item = (usize, u32, Range<usize>)> + '_ {
        (self.entries.iter().enumerate())
            .filter_map(|(k, (span, old))| Some((k, (*old)?, span.clone())))
    }

    /// The routes of the previous entry `old`, as entry `ordinal` with groups indexed as in
    /// `upstream_index`: each with the name of the listener it goes to.
    pub(super) fn routes(
        &self,
        old: u32,
        ordinal: usize,
        (upstream_index, groups): super::routes::Groups,
    ) -> Result<Vec<(&'a str, Route)>, Stale> {
        let placed = &self.reuse.placed;
        let from = placed.partition_point(|p| p.0 < old);
        let to = placed.partition_point(|p| p.0 <= old);
        let mut out = Vec::with_capacity(to - from);
        for &(_, l, pos) in &placed[from..to] {
            let listener = self.prev.listeners.get(usize::from(l)).ok_or(Stale)?;
            let mut route = (listener.router.routes())
                .get(pos as usize)
                .ok_or(Stale)?
                .clone();
            route.index = ordinal;
            if let RouteTarget::Proxy { upstream, .. } = &mut route.target {
                let (name, was) = self.reuse.groups.get(*upstream).ok_or(Stale)?;
                let &now = upstream_index.get(name).ok_or(Stale)?;
                if sig(&groups[now]) != *was {
                    return Err(Stale);
                }
                *upstream = now;
            }
            out.push((listener.name.as_str(), route));
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "reuse_tests.rs"]
mod tests;
