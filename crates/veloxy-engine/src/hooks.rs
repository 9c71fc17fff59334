//! Request/response hooks: the library's extension point, in the spirit of Pingora's phases.
//!
//! Every method has a no-op default, so a hook implements only the phases it needs. A
//! [`RequestCtx`] lives for one request and carries the hook's own state between phases.
//! When no hooks are installed the proxy skips all of this (no context is allocated).
//!
//! ```
//! use veloxy_engine::hooks::{Hooks, RequestCtx, RequestInfo};
//!
//! /// Refuses requests without an API key and tags every response.
//! struct ApiKey;
//! impl Hooks for ApiKey {
//!     fn on_request(&self, req: &RequestInfo, ctx: &mut RequestCtx) -> Result<(), u16> {
//!         if req.header("x-api-key").is_none() {
//!             return Err(401);
//!         }
//!         ctx.add_upstream_header("x-authenticated", "1");
//!         Ok(())
//!     }
//!     fn on_response(&self, _status: u16, ctx: &mut RequestCtx) {
//!         ctx.add_response_header("x-served-by", "veloxy");
//!     }
//! }
//! ```

use std::any::Any;
use std::net::SocketAddr;
use std::time::Duration;

/// Read-only view of a downstream request, given to [`Hooks::on_request`].
pub struct RequestInfo<'a> {
    /// The request method.
    pub method: &'a str,
    /// The request target: path and query.
    pub path: &'a str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1, 2 for HTTP/2, 3 for HTTP/3.
    pub version: u8,
    /// The client's address.
    pub client: SocketAddr,
    /// The name of the listener the request came in on.
    pub listener: &'a str,
    /// Name of the upstream group the router chose ("" on a file route).
    pub upstream: &'a str,
    pub(crate) headers: &'a [httparse::Header<'a>],
}

impl RequestInfo<'_> {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    /// All headers in order, as (name, value).
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.headers.iter().map(|h| (h.name, h.value))
    }
}

/// Per-request state for hooks.
#[derive(Default)]
pub struct RequestCtx {
    /// Free slot for the hook's own per-request data.
    pub data: Option<Box<dyn Any>>,
    pub(crate) upstream_headers: Vec<u8>,
    pub(crate) response_headers: Vec<u8>,
}

impl RequestCtx {
    /// Adds a header to the request sent upstream.
    pub fn add_upstream_header(&mut self, name: &str, value: &str) {
        push_header(&mut self.upstream_headers, name, value);
    }

    /// Adds a header to the response sent downstream.
    pub fn add_response_header(&mut self, name: &str, value: &str) {
        push_header(&mut self.response_headers, name, value);
    }
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &str) {
    // A hook must not inject headers (CR/LF), write invalid names, or touch the headers veloxy
    // owns: framing (Content-Length, Transfer-Encoding), hop-by-hop ones, Host, X-Forwarded-*.
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let owned = crate::http1::classify(name) != crate::http1::Special::None;
    let bad_value = value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0);
    if name.is_empty() || !name.bytes().all(token) || bad_value || owned {
        tracing::warn!(name, "hook header refused (invalid, or owned by the proxy)");
        return;
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// What [`Hooks::on_done`] learns about a finished request.
#[derive(Debug, Clone)]
pub struct RequestSummary {
    /// Status sent downstream (0 if none could be sent).
    pub status: u16,
    /// From the request head to the end of the exchange.
    pub duration: Duration,
    /// The backend of the last attempt (`None` for file routes and refusals).
    pub backend: Option<crate::upstream::addr::BackendAddr>,
}

/// Request/response hooks. Implementations must be cheap: they run on the request path.
pub trait Hooks: Send + Sync + 'static {
    /// After routing, before any upstream work. `Err(status)` answers the client directly.
    fn on_request(&self, _req: &RequestInfo, _ctx: &mut RequestCtx) -> Result<(), u16> {
        Ok(())
    }
    /// When the upstream response head arrives, before it is sent downstream.
    fn on_response(&self, _status: u16, _ctx: &mut RequestCtx) {}
    /// After the exchange ends, successfully or not.
    fn on_done(&self, _summary: &RequestSummary, _ctx: &mut RequestCtx) {}
}
