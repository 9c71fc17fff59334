//! Shorthand, expanded before anything reads the sections: `[upstream_defaults]` fills
//! every upstream group's unset keys. Routes: `use = ["SET"]` takes a
//! `[rule_sets.SET]`'s keys where the route sets none itself, and a route listing several
//! listeners, hosts or paths becomes one route per combination (same file position, so the
//! same precedence, logs and metrics as writing them out). `path` and `path_exact` on one
//! route are a union (`path_exact = "/p"` with `path = "/p/"`: `/p` and everything under it).

use toml::Spanned;

use super::Source;
use crate::config::file::{
    FileConfig, Names, RouteSection, RuleSetSection, UpstreamDefaultsSection, UpstreamSection,
};
use crate::config::ConfigError;

/// Applies rule sets and expands lists in `file.routes`, filling `file.route_origin`.
pub(super) fn expand(src: &Source, file: &mut FileConfig) -> Result<(), ConfigError> {
    if let Some(d) = &file.upstream_defaults {
        for g in file.upstreams.values_mut() {
            fill_group(g.get_mut(), d.get_ref());
        }
    }
    let routes = std::mem::take(&mut file.routes);
    (file.routes, file.route_origin) = expand_routes(src, routes, 0, file)?;
    Ok(())
}

/// Expanded routes, and each one's entry ordinal.
#[allow(clippy::vec_box)] // as FileConfig::routes
type Expanded = (Vec<Box<Spanned<RouteSection>>>, Vec<usize>);

/// The routes of `routes` expanded (rule sets applied, lists made one route each), with each
/// one's entry ordinal: `first` is the ordinal of `routes[0]` in the file.
#[allow(clippy::vec_box)] // as FileConfig::routes
pub(super) fn expand_routes(
    src: &Source,
    routes: Vec<Box<Spanned<RouteSection>>>,
    first: usize,
    file: &FileConfig,
) -> Result<Expanded, ConfigError> {
    let mut out = Vec::with_capacity(routes.len());
    let mut origin = Vec::with_capacity(routes.len());
    for (i, route) in routes.into_iter().enumerate() {
        let i = first + i;
        let span = route.span();
        let mut r = route.into_inner();
        apply_sets(src, i, &mut r, file)?;
        let listeners = names(src, i, "listener", r.listener.take())?;
        let hosts = names(src, i, "host", r.host.take())?;
        let paths = names(src, i, "path", r.path.take())?;
        let exacts = names(src, i, "path_exact", r.path_exact.take())?;
        // `path` and `path_exact` together are a union: the route matches any of them.
        let kinds: Vec<(OneName, OneName)> = match (paths.as_slice(), exacts.as_slice()) {
            ([None], _) => exacts.iter().map(|e| (None, e.clone())).collect(),
            (_, [None]) => paths.iter().map(|p| (p.clone(), None)).collect(),
            _ => paths
                .iter()
                .map(|p| (p.clone(), None))
                .chain(exacts.iter().map(|e| (None, e.clone())))
                .collect(),
        };
        if let ([l], [h], [(p, e)]) = (listeners.as_slice(), hosts.as_slice(), &kinds[..]) {
            // One combination (most routes): the section moves, no copy.
            (r.listener, r.host) = (l.clone(), h.clone());
            (r.path, r.path_exact) = (p.clone(), e.clone());
            out.push(Box::new(Spanned::new(span, r)));
            origin.push(i);
            continue;
        }
        for l in &listeners {
            for h in &hosts {
                for (p, e) in &kinds {
                    let mut one = r.clone();
                    one.listener = l.clone();
                    one.host = h.clone();
                    one.path = p.clone();
                    one.path_exact = e.clone();
                    out.push(Box::new(Spanned::new(span.clone(), one)));
                    origin.push(i);
                }
            }
        }
    }
    Ok((out, origin))
}

/// One name of an expanded list key, or the key absent.
type OneName = crate::config::file::Opt<Names>;

/// The names of a list key, one `Some` per name; `[None]` when the key is absent.
fn names(src: &Source, i: usize, key: &str, v: OneName) -> Result<Vec<OneName>, ConfigError> {
    let Some(v) = v else {
        return Ok(vec![None]);
    };
    let span = v.span();
    match v.into_inner() {
        Names::One(s) => Ok(vec![Some(Box::new(Spanned::new(span, Names::One(s))))]),
        Names::Many(list) if list.is_empty() => Err(src.error(
            span,
            format!("routes[{i}].{key}"),
            "an empty list: leave the key out instead",
        )),
        Names::Many(list) => Ok(list
            .into_iter()
            .map(|s| Some(Box::new(Spanned::new(s.span(), Names::One(s.into_inner())))))
            .collect()),
    }
}

/// Fills the route's unset rule keys from its sets, in the order listed.
fn apply_sets(
    src: &Source,
    i: usize,
    r: &mut RouteSection,
    file: &FileConfig,
) -> Result<(), ConfigError> {
    let Some(list) = r.use_sets.take() else {
        return Ok(());
    };
    for name in list.get_ref() {
        let set = file.rule_sets.get(name.get_ref()).ok_or_else(|| {
            src.error(
                name.span(),
                format!("routes[{i}].use"),
                format!(
                    "rule set {:?} is not defined ([rule_sets.NAME])",
                    name.get_ref()
                ),
            )
        })?;
        fill(r, set.get_ref());
    }
    Ok(())
}

/// Every key of a rule set, taken where the route has none.
fn fill(r: &mut RouteSection, s: &RuleSetSection) {
    macro_rules! take {
        ($($k:ident),*) => {$(
            if r.$k.is_none() {
                r.$k = s.$k.clone();
            }
        )*};
    }
    take!(
        request_headers,
        response_headers,
        error_pages,
        max_body_bytes,
        location_rewrite,
        allow,
        deny,
        basic_auth,
        cors,
        forward_auth,
        rate_limit,
        compress,
        max_concurrency,
        queue,
        queue_timeout,
        cache,
        early_hints
    );
}

/// Every key of `[upstream_defaults]`, taken where the group has none.
fn fill_group(g: &mut UpstreamSection, d: &UpstreamDefaultsSection) {
    macro_rules! take {
        ($($k:ident),*) => {$(
            if g.$k.is_none() {
                g.$k = d.$k.clone();
            }
        )*};
    }
    take!(
        policy,
        keepalive,
        pool_purge_delay,
        connect_timeout,
        read_timeout,
        write_timeout,
        idle_timeout,
        retries,
        retry_on,
        retry_budget,
        retry_body_limit,
        max_connections,
        hash_key,
        health,
        outlier,
        location_rewrite,
        runtime_overrides
    );
}
