//! A route's `early_hints`: `103 Early Hints` from the Link fields of the path's last answer
//! ([`crate::hints`]). Proxied routes to HTTP/1.1 groups without `cache` only: the answer
//! whose fields are learned comes through the HTTP/1.1 client, not through a cache fill.

use std::sync::Arc;

use super::super::error::{ConfigError, Source};
use super::super::file::RouteSection;
use crate::config::{UpstreamGroup, UpstreamProtocol};
use crate::rules::RouteRules;

/// Adds the route's `early_hints` to its rules; `group`: the route's upstream group, if it
/// is proxied.
pub(super) fn early_hints(
    src: &Source,
    key: &str,
    r: &RouteSection,
    group: Option<&UpstreamGroup>,
    rules: Option<Arc<RouteRules>>,
) -> Result<Option<Arc<RouteRules>>, ConfigError> {
    let Some(flag) = &r.early_hints else {
        return Ok(rules);
    };
    if !*flag.get_ref() {
        return Ok(rules);
    }
    let error = |m: &str| Err(src.error(flag.span(), format!("{key}.early_hints"), m));
    match group {
        None => return error("is for proxied routes (with upstream)"),
        Some(g) if g.protocol != UpstreamProtocol::Http1 => {
            return error("is for routes to an HTTP/1.1 group (protocol = \"http1\")")
        }
        Some(_) => {}
    }
    if r.cache.is_some() {
        // A fill fetches and stores the answer itself: it neither sends the hints nor
        // teaches them, so the pair would be on in name only.
        return error("is not for routes with cache (answers come through the cache)");
    }
    let mut r = rules.map(|r| (*r).clone()).unwrap_or_default();
    r.early_hints = true;
    Ok(Some(Arc::new(r)))
}
