//! Running as a fleet: state shared by several veloxy instances through Redis
//! (`[server.redis]`). So far: global rate limits ([`global_limit`]).

pub(crate) mod global_limit;
pub(crate) mod redis;

/// `/metrics` lines: requests decided by `on_store_error`, failed Redis lease requests
/// (`errors`, summed over the runtime's clients).
pub(crate) fn metrics(out: &mut String, errors: u64) {
    use std::sync::atomic::Ordering;
    let fallbacks = global_limit::FALLBACKS.load(Ordering::Relaxed);
    out.push_str(&format!(
        "# HELP veloxy_ratelimit_store_fallbacks_total Global rate-limit decisions taken by on_store_error while Redis failed.\n\
         # TYPE veloxy_ratelimit_store_fallbacks_total counter\nveloxy_ratelimit_store_fallbacks_total {fallbacks}\n\
         # HELP veloxy_redis_errors_total Redis requests that failed or timed out.\n\
         # TYPE veloxy_redis_errors_total counter\nveloxy_redis_errors_total {errors}\n"
    ));
}
