//! Downstream codecs: the client side of the proxy, one per protocol.
//!
//! * [`setup`]: a new client connection: PROXY header, SNI passthrough, TLS termination and
//!   protocol detection.
//! * [`connection`]: the HTTP/1 codec (request heads, keep-alive, pipelining); [`idle`]: its
//!   waits between requests, which hold no buffer.
//! * [`proxy`] and [`relay`]: forwarding an admitted HTTP/1 request to an HTTP/1 upstream and
//!   streaming bodies both ways; [`files`]: writing a file route's answer to an HTTP/1 client
//!   (with `sendfile`).
//! * [`proxy_protocol`]: the PROXY protocol header a trusted L4 balancer sends first.
//! * [`sni`]: SNI passthrough of TLS connections named by `[[streams]] sni`; [`peek`]: how it
//!   and the PROXY header reader look at first bytes, waiting by readiness.
//! * [`stream`]: L4 streams of `protocol = "tcp"` listeners, relayed byte for byte.
//! * [`http2`]: HTTP/2 clients (hyper's server), each stream admitted through the same core.
//!
//! Every codec admits requests through [`crate::exchange`] and records them there; they call
//! downward only (exchange, upstream, the HTTP/1 codec, IO).

pub(crate) mod codec;
pub(crate) mod connection;
pub(crate) mod files;
pub(crate) mod http2;
pub(crate) mod http3;
pub(crate) mod idle;
pub(crate) mod peek;
pub(crate) mod proxy;
pub(crate) mod proxy_protocol;
pub(crate) mod relay;
pub(crate) mod setup;
pub(crate) mod sni;
pub(crate) mod stream;
