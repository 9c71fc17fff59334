//! The upstream request of a fill, as the cache sees it: an [`Upstream`] sends a GET head
//! and reads the whole response into memory up to `max_object`. The codecs' layer implements
//! it (`downstream::cached::FillUpstream`: the group's HTTP/1.1 keep-alive pool, through the
//! same attempt loop as every request, with retries, outlier feedback and health), so the
//! cache needs nothing of the layers above it.

use bytes::Bytes;

use crate::error::ProxyError;

/// A complete upstream response.
pub(crate) struct Fetched {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// A fill reads a body this large into memory to answer it even when it is too large to
/// store (above `max_object`); only larger ones make the request go upstream a second time.
pub(crate) const SERVE_LIMIT: u64 = 16 << 20;

/// Where a fill sends its request.
pub(crate) trait Upstream {
    /// Sends `head` (complete, blank line included) and reads the response; `Ok(None)` when
    /// its body is larger than `max` (the connection is then closed, not pooled).
    async fn fetch(&self, head: &[u8], max: u64) -> Result<Option<Fetched>, ProxyError>;

    /// The same upstream, owned: for a refresh that outlives its request
    /// (`stale-while-revalidate`).
    fn detach(&self) -> impl Upstream + 'static;
}
