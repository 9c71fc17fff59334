//! `[[routes]]`: matching (listener, host, path), the target (an upstream group or a
//! directory of files) and the route's limits, compiled into each listener's router.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::dur;
use crate::config::error::{ConfigError, Source};
use crate::config::file::RouteSection;
use crate::config::ListenerSpec;
use crate::limits::{parse_rate, ConcurrencyLimit, RateKey, RateLimiter, RouteLimits};
use crate::router::{HostMatch, Route, RouteTarget};
use crate::static_files::StaticRoute;
use crate::template::PathRule;

/// Default memory for a file route's cache of contents and compressed variants.
const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Adds every route to the routers of its listeners, then sorts the routers. With a reuse
/// `plan`, the routes of unchanged entries are taken from the previous snapshot at their
/// place in file order (`routes` then holds the parsed ones only, `origin` their ordinals);
/// returns the groups those name, or `Stale` when one cannot be taken as it is.
pub(super) fn compile_routes(
    src: &Source,
    (routes, origin): (&[Box<Spanned<RouteSection>>], &[usize]),
    groups: Groups,
    caches: Caches,
    listeners: &mut [ListenerSpec],
    plan: Option<&super::reuse::Plan>,
) -> Result<Result<Vec<usize>, super::reuse::Stale>, ConfigError> {
    let mut reused = plan.into_iter().flat_map(|p| p.reused()).peekable();
    let mut named = Vec::new();
    for (route, &i) in routes.iter().zip(origin) {
        while let Some(entry) = reused.next_if(|e| e.0 < i) {
            if let Err(stale) = take_reused(src, plan, entry, groups, listeners, &mut named)? {
                return Ok(Err(stale));
            }
        }
        compile_route(src, i, route, groups, caches, listeners)?;
    }
    for entry in reused {
        if let Err(stale) = take_reused(src, plan, entry, groups, listeners, &mut named)? {
            return Ok(Err(stale));
        }
    }
    for l in listeners {
        let prev = plan.and_then(|p| p.router(&l.name));
        std::sync::Arc::make_mut(&mut l.router).finish_after(prev);
    }
    Ok(Ok(named))
}

/// The upstream groups routes are compiled against: by name, and in order.
pub(super) type Groups<'a> = (
    &'a HashMap<String, usize>,
    &'a [crate::config::UpstreamGroup],
);

/// The cache stores and the Redis slot routes are compiled against.
pub(super) type Caches<'a> = (
    &'a HashMap<String, super::cache::CacheSpec>,
    Option<&'a crate::late::Late<crate::fleet::redis::RedisClient>>,
);

/// Adds the routes of reused entry `(ordinal, previous ordinal, span)` to their routers, and
/// the groups they name to `named`.
pub(super) fn take_reused(
    src: &Source,
    plan: Option<&super::reuse::Plan>,
    (ordinal, old, span): (usize, u32, std::ops::Range<usize>),
    groups: Groups,
    listeners: &mut [ListenerSpec],
    named: &mut Vec<usize>,
) -> Result<Result<(), super::reuse::Stale>, ConfigError> {
    let Some(plan) = plan else {
        return Ok(Err(super::reuse::Stale));
    };
    let taken = match plan.routes(old, ordinal, groups) {
        Ok(t) => t,
        Err(stale) => return Ok(Err(stale)),
    };
    for (listener, route) in taken {
        named.extend(route.proxied());
        if !attach_reused(src, ordinal, span.clone(), listener, route, listeners)? {
            return Ok(Err(super::reuse::Stale));
        }
    }
    Ok(Ok(()))
}

/// Adds a reused route to the router of the listener it was in (false: there is none).
fn attach_reused(
    src: &Source,
    ordinal: usize,
    span: std::ops::Range<usize>,
    listener: &str,
    route: Route,
    listeners: &mut [ListenerSpec],
) -> Result<bool, ConfigError> {
    // The listeners are the same as before (the text that makes them is).
    let Some(l) = listeners.iter_mut().find(|l| l.name == listener) else {
        return Ok(false);
    };
    if l.router.has(&route) {
        return Err(src.error(
            span,
            format!("routes[{ordinal}]"),
            "duplicate route: same host, path and conditions as an earlier route",
        ));
    }
    std::sync::Arc::make_mut(&mut l.router).add(route);
    Ok(true)
}

pub(super) fn compile_route(
    src: &Source,
    i: usize,
    route: &Spanned<RouteSection>,
    (upstream_index, groups): Groups,
    caches: Caches,
    listeners: &mut [ListenerSpec],
) -> Result<(), ConfigError> {
    let key = format!("routes[{i}]");
    let r = route.get_ref();
    let upstream = route_upstream(src, &key, route, upstream_index)?;
    let host = match &r.host {
        None => HostMatch::Any,
        Some(h) => HostMatch::parse(h.get_ref())
            .map_err(|m| src.error(h.span(), format!("{key}.host"), m))?,
    };
    let m = super::rules::compile_match(src, &key, r)?;
    let regex = m.regex.as_ref();
    let (path, exact) = (m.path.clone(), m.exact);
    // A path_regex file route serves the whole request path under root (nginx's
    // `location ~* \.(css|js)$` under a `root`); prefix and exact routes remove their path.
    let file_prefix = if regex.is_some() { "/" } else { path.as_str() };
    let files = match &r.root {
        Some(root) => Some(Arc::new(compile_files(src, &key, r, root, file_prefix)?)),
        None => {
            file_only_keys(src, &key, r, r.fastcgi.is_some())?;
            None
        }
    };
    let target = match (files, upstream) {
        (Some(files), _) => RouteTarget::Files(files),
        (None, Some(upstream)) => RouteTarget::Proxy {
            upstream,
            compress: r.compress.as_ref().is_some_and(|c| *c.get_ref()),
            target: path_rule(src, &key, r, &m)?,
        },
        (None, None) => answer_target(src, &key, r, regex)?,
    };
    let h2_proxy = |g: &crate::config::UpstreamGroup| {
        g.proxy_protocol > 0 && g.protocol != crate::config::UpstreamProtocol::Http1
    };
    if let Some(u) = upstream.filter(|&u| h2_proxy(&groups[u])) {
        return Err(src.error(
            r.upstream.as_ref().map_or(0..0, |s| s.span()),
            format!("{key}.upstream"),
            format!(
                "upstream {:?} sends PROXY headers over HTTP/2: one HTTP/2 connection carries \
                 every client's requests, so it cannot name one client (use protocol = \"http1\")",
                groups[u].name
            ),
        ));
    }
    let group_rewrites = upstream.is_some_and(|u| groups[u].location_rewrite);
    let mut rules = super::rules::compile_rules(src, &key, r, regex, group_rewrites)?;
    if let Some(fa) = &r.forward_auth {
        if upstream.is_none() {
            return Err(src.error(
                fa.span(),
                format!("{key}.forward_auth"),
                "is for proxied routes (with upstream)",
            ));
        }
        let fa = super::rules::forward_auth(src, &key, fa, upstream_index, groups)?;
        let mut r = rules.map(|r| (*r).clone()).unwrap_or_default();
        r.forward_auth = Some(fa);
        rules = Some(Arc::new(r));
    }
    if let Some(m) = &r.mirror {
        if upstream.is_none() {
            return Err(src.error(
                m.span(),
                format!("{key}.mirror"),
                "is for proxied routes (with upstream)",
            ));
        }
        let m = super::mirror::mirrors(src, &key, m, upstream_index, groups)?;
        let mut r = rules.map(|r| (*r).clone()).unwrap_or_default();
        r.mirror = Some(m);
        rules = Some(Arc::new(r));
    }
    if let Some(c) = &r.cache {
        let http1 = match (&target, upstream) {
            (RouteTarget::Proxy { .. }, Some(u)) => {
                Some(groups[u].protocol == crate::config::UpstreamProtocol::Http1)
            }
            _ => None,
        };
        let compress = r.compress.as_ref().is_some_and(|c| *c.get_ref());
        let c = super::cache::route_cache(src, &key, c, caches.0, http1, compress)?;
        let mut r = rules.map(|r| (*r).clone()).unwrap_or_default();
        r.cache = Some(c);
        rules = Some(Arc::new(r));
    }
    match (&r.fastcgi, upstream.map(|u| &groups[u])) {
        (Some(f), Some(g)) if g.protocol == crate::config::UpstreamProtocol::Fastcgi => {
            let f = super::fastcgi::fastcgi(src, &key, f, r.try_files.as_deref())?;
            let mut r = rules.map(|r| (*r).clone()).unwrap_or_default();
            r.fastcgi = Some(f);
            rules = Some(Arc::new(r));
        }
        (Some(f), _) => {
            return Err(src.error(
                f.span(),
                format!("{key}.fastcgi"),
                "is for routes to a FastCGI group (an upstream with protocol = \"fastcgi\")",
            ))
        }
        (None, Some(g)) if g.protocol == crate::config::UpstreamProtocol::Fastcgi => {
            return Err(src.error(
                r.upstream.as_ref().map_or(0..0, |s| s.span()),
                format!("{key}.upstream"),
                format!(
                    "{:?} is a FastCGI group: the route needs fastcgi = {{ root = \"/var/www/app\" }}",
                    g.name
                ),
            ))
        }
        _ => {}
    }
    let group = upstream.map(|u| &groups[u]);
    rules = super::grpc_web::grpc_web(src, &key, r, group, rules)?;
    rules = super::early_hints::early_hints(src, &key, r, group, rules)?;
    if let Some(t) = super::tracing::route_tracing(src, &key, r)? {
        let mut r = rules.map(|r| (*r).clone()).unwrap_or_default();
        r.tracing = Some(t);
        rules = Some(Arc::new(r));
    }
    if let Some(s) = &r.search {
        let s = super::search::route_search(src, &key, s, upstream.map(|u| &groups[u]), caches.0)?;
        let mut r = rules.map(|r| (*r).clone()).unwrap_or_default();
        r.search = Some(s);
        rules = Some(Arc::new(r));
    }
    let compiled = Route {
        index: i,
        host,
        path,
        exact,
        captures: m.regex.is_some() && uses_captures(r),
        regex: m.regex,
        conditions: m.conditions,
        rules,
        target,
        limits: compile_limits(src, &key, r, caches.1)?,
    };
    attach(src, &key, route, compiled, listeners)
}

/// `strip_prefix` / `rewrite` of a proxied route (at most one of them).
fn path_rule(
    src: &Source,
    key: &str,
    r: &RouteSection,
    m: &super::rules::Matching,
) -> Result<Option<Arc<PathRule>>, ConfigError> {
    let strip = r.strip_prefix.as_ref().filter(|s| *s.get_ref());
    match (strip, &r.rewrite) {
        (Some(s), Some(_)) => Err(src.error(
            s.span(),
            format!("{key}.strip_prefix"),
            "a route has one of strip_prefix and rewrite, not both",
        )),
        (Some(s), None) if m.exact || m.regex.is_some() => Err(src.error(
            s.span(),
            format!("{key}.strip_prefix"),
            "strips a `path` prefix: use rewrite on a path_exact or path_regex route",
        )),
        (Some(_), None) => Ok(Some(Arc::new(PathRule::StripPrefix(m.path.clone())))),
        (None, Some(t)) => {
            let template = super::rules::template(
                src,
                t.span(),
                &format!("{key}.rewrite"),
                t.get_ref(),
                m.regex.as_ref(),
            )?;
            if !t.get_ref().starts_with(['/', '{']) {
                return Err(src.error(
                    t.span(),
                    format!("{key}.rewrite"),
                    "must start with '/' (or a variable)",
                ));
            }
            Ok(Some(Arc::new(PathRule::Rewrite(template))))
        }
        (None, None) => Ok(None),
    }
}

/// The target of a route with neither `upstream` nor `root`: its `redirect` or `respond`.
fn answer_target(
    src: &Source,
    key: &str,
    r: &RouteSection,
    regex: Option<&crate::rules::PathRegex>,
) -> Result<RouteTarget, ConfigError> {
    if let Some(rd) = &r.redirect {
        let rd = rd.get_ref();
        let status = rd.status.as_ref().map_or(308, |s| *s.get_ref());
        if ![301, 302, 303, 307, 308].contains(&status) {
            let span = rd.status.as_ref().map(|s| s.span()).unwrap_or(0..0);
            return Err(src.error(
                span,
                format!("{key}.redirect.status"),
                format!("{status} is not a redirect status: use 301, 302, 303, 307 or 308"),
            ));
        }
        let to = super::rules::template(
            src,
            rd.to.span(),
            &format!("{key}.redirect.to"),
            rd.to.get_ref(),
            regex,
        )?;
        return Ok(RouteTarget::Redirect { to, status });
    }
    let rs = r
        .respond
        .as_ref()
        .expect("route_upstream checked that one target is set")
        .get_ref();
    let status = rs.status.as_ref().map_or(200, |s| *s.get_ref());
    if !(200..=599).contains(&status) {
        let span = rs.status.as_ref().map(|s| s.span()).unwrap_or(0..0);
        return Err(src.error(
            span,
            format!("{key}.respond.status"),
            "must be a final status, 200 to 599",
        ));
    }
    let content_type = rs
        .content_type
        .as_ref()
        .map_or("text/plain; charset=utf-8", |c| c.get_ref().as_str());
    if content_type.contains(['\r', '\n', '\0']) || content_type.is_empty() {
        let span = rs.content_type.as_ref().map(|s| s.span()).unwrap_or(0..0);
        return Err(src.error(
            span,
            format!("{key}.respond.content_type"),
            "must be a non-empty header value",
        ));
    }
    Ok(RouteTarget::Respond {
        status,
        body: rs
            .body
            .as_ref()
            .map_or_else(Default::default, |b| b.get_ref().clone().into()),
        content_type: content_type.to_owned(),
    })
}

/// The route's upstream group index; `None` for a file route or an answer. Exactly one of
/// `upstream`, `root`, `redirect` and `respond` must be set.
fn route_upstream(
    src: &Source,
    key: &str,
    route: &Spanned<RouteSection>,
    upstream_index: &HashMap<String, usize>,
) -> Result<Option<usize>, ConfigError> {
    let r = route.get_ref();
    let answers = usize::from(r.redirect.is_some()) + usize::from(r.respond.is_some());
    let targets = answers + usize::from(r.upstream.is_some()) + usize::from(r.root.is_some());
    if targets > 1 && answers > 0 {
        return Err(src.error(
            route.span(),
            key,
            "a route has one of upstream (proxy), root (files), redirect and respond",
        ));
    }
    match (&r.upstream, &r.root) {
        (Some(_), Some(root)) => Err(src.error(
            root.span(),
            format!("{key}.root"),
            "a route has either upstream (proxy) or root (files), not both",
        )),
        (None, None) if answers == 1 => Ok(None),
        (None, None) => Err(src.error(
            route.span(),
            key,
            "needs upstream = \"NAME\" (proxy), root = \"DIR\" (files), redirect or respond",
        )),
        (Some(up), None) => match upstream_index.get(up.get_ref()) {
            Some(&index) => Ok(Some(index)),
            None => Err(src.error(
                up.span(),
                format!("{key}.upstream"),
                format!(
                    "upstream {:?} is not defined (add [upstreams.{}])",
                    up.get_ref(),
                    up.get_ref()
                ),
            )),
        },
        (None, Some(_)) => Ok(None),
    }
}

/// Adds the route to its listener's router, or to every router without `listener`, refusing
/// a second route with the same host and path on one listener.
fn attach(
    src: &Source,
    key: &str,
    route: &Spanned<RouteSection>,
    compiled: Route,
    listeners: &mut [ListenerSpec],
) -> Result<(), ConfigError> {
    match &route.get_ref().listener {
        None => {
            if listeners.iter().any(|l| l.router.has(&compiled)) {
                return Err(src.error(
                    route.span(),
                    key,
                    "duplicate route: same host, path and conditions as an earlier route",
                ));
            }
            // Routes are HTTP: TCP listeners (`protocol = "tcp"`) take none.
            listeners
                .iter_mut()
                .filter(|l| !l.tcp)
                .for_each(|l| std::sync::Arc::make_mut(&mut l.router).add(compiled.clone()));
        }
        Some(name) => {
            let l = listeners
                .iter_mut()
                .find(|l| l.name == name.get_ref().as_str())
                .ok_or_else(|| {
                    src.error(
                        name.span(),
                        format!("{key}.listener"),
                        format!("listener {:?} is not defined", name.get_ref().as_str()),
                    )
                })?;
            if l.tcp {
                return Err(src.error(
                    name.span(),
                    format!("{key}.listener"),
                    format!(
                        "listener {:?} is a tcp listener: it takes [[streams]], not routes",
                        name.get_ref().as_str()
                    ),
                ));
            }
            if l.router.has(&compiled) {
                return Err(src.error(
                    route.span(),
                    key,
                    "duplicate route: same listener, host, path and conditions as an earlier route",
                ));
            }
            std::sync::Arc::make_mut(&mut l.router).add(compiled);
        }
    }
    Ok(())
}
/// Compiles the file-serving keys of a route with `root`. A relative root is taken from the
/// config file's directory; it must exist and be a directory now.
fn compile_files(
    src: &Source,
    key: &str,
    r: &RouteSection,
    root: &Spanned<String>,
    prefix: &str,
) -> Result<StaticRoute, ConfigError> {
    let configured = root.get_ref();
    let base = src.file.parent().unwrap_or(Path::new(""));
    let dir = base.join(configured);
    let root_err = |m: String| src.error(root.span(), format!("{key}.root"), m);
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(root_err(format!("{configured:?} is not a directory"))),
        Err(e) => return Err(root_err(format!("{configured:?}: {}", io_reason(&e)))),
    }
    let cache_bytes = r
        .cache_bytes
        .as_ref()
        .map_or(DEFAULT_CACHE_BYTES, |c| *c.get_ref());
    let mut files = StaticRoute::new(prefix, &dir, cache_bytes)
        .map_err(|e| root_err(format!("{configured:?}: {}", io_reason(&e))))?;
    let names = |v: &crate::config::file::Opt<Vec<String>>,
                 k: &str|
     -> Result<Option<Vec<String>>, ConfigError> {
        let Some(list) = v else { return Ok(None) };
        for name in list.get_ref() {
            if name.is_empty() || name.split('/').any(|s| s == "..") || name.contains('\\') {
                return Err(src.error(
                    list.span(),
                    format!("{key}.{k}"),
                    format!("{name:?}: use a relative name without \"..\""),
                ));
            }
        }
        Ok(Some(list.get_ref().clone()))
    };
    if let Some(index) = names(&r.index, "index")? {
        if index.iter().any(|n| n.contains('/')) {
            let span = r.index.as_ref().map_or(0..0, |i| i.span());
            return Err(src.error(
                span,
                format!("{key}.index"),
                "index names are file names, without '/'",
            ));
        }
        files.index = index;
    }
    if let Some(t) = names(&r.try_files, "try_files")? {
        files.try_files = t;
    }
    if let Some(cc) = &r.cache_control {
        let v = cc.get_ref();
        if v.is_empty() || v.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err(src.error(
                cc.span(),
                format!("{key}.cache_control"),
                "must be a non-empty header value without control characters",
            ));
        }
        files.cache_control = Some(bytes::Bytes::from(v.clone()));
    }
    let flag = |v: &crate::config::file::Opt<bool>, default: bool| {
        v.as_ref().map_or(default, |b| *b.get_ref())
    };
    files.browse = flag(&r.browse, false);
    files.follow_symlinks = flag(&r.follow_symlinks, false);
    files.allow_hidden = flag(&r.allow_hidden, false);
    files.compress = flag(&r.compress, true);
    files.precompressed = flag(&r.precompressed, true);
    Ok(files)
}

/// Refuses file-route keys on a proxied route (they would silently do nothing).
/// `try_files` is one of them but on a FastCGI route (`fastcgi`).
fn file_only_keys(
    src: &Source,
    key: &str,
    r: &RouteSection,
    fastcgi: bool,
) -> Result<(), ConfigError> {
    let try_files = r.try_files.as_ref().filter(|_| !fastcgi);
    let spans = [
        ("index", r.index.as_ref().map(|v| v.span())),
        ("try_files", try_files.map(|v| v.span())),
        ("cache_control", r.cache_control.as_ref().map(|v| v.span())),
        ("browse", r.browse.as_ref().map(|v| v.span())),
        (
            "follow_symlinks",
            r.follow_symlinks.as_ref().map(|v| v.span()),
        ),
        ("allow_hidden", r.allow_hidden.as_ref().map(|v| v.span())),
        ("precompressed", r.precompressed.as_ref().map(|v| v.span())),
        ("cache_bytes", r.cache_bytes.as_ref().map(|v| v.span())),
    ];
    match spans.into_iter().find_map(|(k, s)| s.map(|s| (k, s))) {
        Some((k, span)) => Err(src.error(
            span,
            format!("{key}.{k}"),
            if k == "try_files" {
                "only applies to a route with root (file serving) or fastcgi"
            } else {
                "only applies to a route with root (file serving)"
            },
        )),
        None => Ok(()),
    }
}

/// An I/O error's reason without the OS error number (stable across systems, for messages).
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such directory".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    }
}

/// `scope = "global"` (and `on_store_error`) of a route's rate limit.
fn global_limit(
    src: &Source,
    key: &str,
    s: &crate::config::file::RateLimitSection,
    redis: Option<&crate::late::Late<crate::fleet::redis::RedisClient>>,
    (per_second, burst): (f64, u32),
) -> Result<Option<Arc<crate::fleet::global_limit::GlobalLimit>>, ConfigError> {
    use crate::fleet::global_limit::{GlobalLimit, OnStoreError};
    let k = |name: &str| format!("{key}.rate_limit.{name}");
    let on_error = match s
        .on_store_error
        .as_ref()
        .map(|v| (v.get_ref().as_str(), v.span()))
    {
        None | Some(("local", _)) => OnStoreError::Local,
        Some(("allow", _)) => OnStoreError::Allow,
        Some(("deny", _)) => OnStoreError::Deny,
        Some((_, span)) => {
            return Err(src.error(
                span,
                k("on_store_error"),
                "use \"local\", \"allow\" or \"deny\"",
            ))
        }
    };
    match s.scope.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        None | Some(("local", _)) => Ok(None),
        Some(("global", span)) => {
            let redis = redis.ok_or_else(|| {
                src.error(span, k("scope"), "a global limit needs [server.redis]")
            })?;
            let burst = f64::from(burst.max(1));
            Ok(Some(Arc::new(GlobalLimit {
                name: key.to_owned(),
                per_second,
                burst,
                lease: GlobalLimit::lease_for(per_second, burst),
                on_error,
                redis: redis.clone(),
            })))
        }
        Some((_, span)) => Err(src.error(span, k("scope"), "use \"local\" or \"global\"")),
    }
}

fn compile_limits(
    src: &Source,
    key: &str,
    r: &RouteSection,
    redis: Option<&crate::late::Late<crate::fleet::redis::RedisClient>>,
) -> Result<RouteLimits, ConfigError> {
    let mut limits = RouteLimits::default();
    if let Some(max) = &r.max_concurrency {
        if *max.get_ref() == 0 || *max.get_ref() > 1 << 30 {
            return Err(src.error(
                max.span(),
                format!("{key}.max_concurrency"),
                "must be between 1 and 2^30",
            ));
        }
        let queue = r.queue.as_ref().map_or(0, |q| *q.get_ref());
        let timeout = dur(&r.queue_timeout, Duration::from_secs(1));
        limits.concurrency = Some(Arc::new(ConcurrencyLimit::new(
            *max.get_ref(),
            queue,
            timeout,
        )));
    } else if let Some(q) = &r.queue {
        return Err(src.error(q.span(), format!("{key}.queue"), "needs max_concurrency"));
    }
    if let Some(rl) = &r.rate_limit {
        let s = rl.get_ref();
        let per_second = parse_rate(s.rate.get_ref())
            .map_err(|m| src.error(s.rate.span(), format!("{key}.rate_limit.rate"), m))?;
        let rate_key = match s.key.as_ref().map(|k| (k.get_ref().as_str(), k.span())) {
            None | Some(("client_ip", _)) => RateKey::ClientIp,
            Some(("route", _)) => RateKey::Route,
            Some(("index", _)) => RateKey::Index,
            Some((k, span)) => match k.strip_prefix("header:") {
                Some(h) if !h.is_empty() => RateKey::Header(h.to_ascii_lowercase()),
                _ => {
                    return Err(src.error(
                        span,
                        format!("{key}.rate_limit.key"),
                        format!(
                            "invalid key {k:?}: use \"client_ip\", \"route\", \"index\" or \"header:NAME\""
                        ),
                    ))
                }
            },
        };
        let burst = s
            .burst
            .as_ref()
            .map_or_else(|| per_second.ceil().max(1.0) as u32, |b| *b.get_ref());
        let max_keys = s.max_keys.as_ref().map_or(100_000, |m| *m.get_ref());
        limits.global = global_limit(src, key, s, redis, (per_second, burst))?;
        limits.rate = Some(Arc::new(RateLimiter::new(
            per_second, burst, rate_key, max_keys,
        )));
    }
    Ok(limits)
}

/// The route's templates use `{re.*}` (checked against its regex at compile time).
fn uses_captures(r: &RouteSection) -> bool {
    let header_values = |h: &crate::config::file::Opt<crate::config::file::HeaderRulesSection>| {
        h.as_ref().is_some_and(|h| {
            let h = h.get_ref();
            h.set
                .values()
                .chain(h.add.values())
                .any(|v| v.contains("{re."))
        })
    };
    r.rewrite
        .as_ref()
        .is_some_and(|t| t.get_ref().contains("{re."))
        || r.redirect
            .as_ref()
            .is_some_and(|t| t.get_ref().to.get_ref().contains("{re."))
        || header_values(&r.request_headers)
        || header_values(&r.response_headers)
}
