//! A large file's `[[routes]]` entries parsed and compiled a run at a time.
//!
//! Parsing 100,000 routes at once holds the TOML document and every route's section in
//! memory together, and the sections stay until the snapshot is built (about 200 MB at the
//! peak, for a snapshot of 60). So a file over `heap::TRIM_AFTER_CONFIG_BYTES` that
//! [`chunks`](super::chunks) can cut is parsed with its route entries blanked, and the
//! entries are parsed here in runs of up to [`RUN`] adjacent ones, each run expanded,
//! checked, compiled into the routers and dropped before the next. A run's spans count from
//! its start, so its errors go through a [`Source`] with that `base`: the same file, line,
//! column and key as a whole parse gives.

use std::collections::HashSet;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::reuse::{Plan, Stale};
use super::routes::{compile_route, take_reused, Caches, Groups};
use crate::config::error::{ConfigError, Source};
use crate::config::file::{FileConfig, RouteSection};
use crate::config::ListenerSpec;

/// Entries parsed at a time.
const RUN: usize = 512;

/// One run's text: `[[routes]]` entries only.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Run {
    #[serde(default)]
    #[allow(clippy::vec_box)] // as FileConfig::routes
    routes: Vec<Box<Spanned<RouteSection>>>,
}

/// The file's route entries: each one's span, and its previous ordinal when a reuse plan
/// takes it from the running snapshot.
pub(super) struct Runs {
    pub entries: Vec<(Range<usize>, Option<u32>)>,
}

/// Adds every entry's routes to the routers, in file order, then sorts the routers.
/// Returns the groups the routes name (for the unused-group warning), or `Stale` when a
/// reused one does not fit or a run does not parse into its number of entries.
pub(super) fn compile_runs(
    src: &Source,
    (runs, plan, file): (&Runs, Option<&Plan>, &FileConfig),
    groups: Groups,
    caches: Caches,
    listeners: &mut [ListenerSpec],
    tracing: Option<&crate::otel::TracingSettings>,
) -> Result<Result<Vec<usize>, Stale>, ConfigError> {
    let entries = &runs.entries;
    let mut named = Vec::new();
    let mut used: HashSet<usize> = HashSet::new();
    let mut k = 0;
    while k < entries.len() {
        if let (span, Some(old)) = &entries[k] {
            if let Err(stale) = take_reused(
                src,
                plan,
                (k, *old, span.clone()),
                groups,
                listeners,
                &mut named,
            )? {
                return Ok(Err(stale));
            }
            k += 1;
            continue;
        }
        let mut end = k + 1;
        while end < entries.len()
            && end - k < RUN
            && entries[end].1.is_none()
            && entries[end].0.start == entries[end - 1].0.end
        {
            end += 1;
        }
        let span = entries[k].0.start..entries[end - 1].0.end;
        let based = Source {
            file: src.file,
            text: src.text,
            base: span.start,
        };
        let run: Run = toml::from_str(&src.text[span]).map_err(|e| based.toml_error(&e))?;
        if run.routes.len() != end - k {
            return Ok(Err(Stale));
        }
        let (routes, origin) = super::expand::expand_routes(&based, run.routes, k, file)?;
        super::tracing::check_routes(&based, (&routes, &origin), tracing)?;
        for (route, &i) in routes.iter().zip(&origin) {
            let r = route.get_ref();
            let names = (r.upstream.iter().map(|u| u.get_ref().as_str()))
                .chain(
                    r.forward_auth
                        .iter()
                        .map(|f| f.get_ref().upstream.get_ref().as_str()),
                )
                .chain(
                    (r.mirror.iter().flat_map(|m| &m.get_ref().0))
                        .map(|m| m.upstream.get_ref().as_str()),
                );
            used.extend(names.filter_map(|n| groups.0.get(n).copied()));
            compile_route(&based, i, route, groups, caches, listeners)?;
        }
        k = end;
    }
    for l in listeners {
        let prev = plan.and_then(|p| p.router(&l.name));
        std::sync::Arc::make_mut(&mut l.router).finish_after(prev);
    }
    named.extend(used);
    Ok(Ok(named))
}
