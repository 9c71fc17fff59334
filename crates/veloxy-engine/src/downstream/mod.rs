//! Downstream codecs: the client side of the proxy, one per protocol. A codec reads
//! requests, admits each through [`crate::exchange::admit`], hands it to the exchange driver
//! ([`crate::exchange::drive`]) through its side of [`crate::exchange::drive::Codec`], and
//! moves the bytes: request bodies in, heads, bodies and trailers out.
//!
//! * [`setup`]: a new client connection: the PROXY header and SNI passthrough (read by
//!   [`crate::listener`]), TLS termination and protocol detection.
//! * [`connection`]: the HTTP/1 codec (request heads, keep-alive, pipelining); [`idle`]: its
//!   waits between requests, which hold no buffer; [`codec`]: its side of the driver.
//! * [`proxy`] and [`relay`]: the driver's attempts step for an HTTP/1 client and an HTTP/1
//!   group (the client is [`crate::exchange::h1`]), streaming bodies both ways; [`files`]:
//!   writing a file route's answer to an HTTP/1 client (with `sendfile`); [`streamed`]: a
//!   FastCGI response's, its body as it arrives.
//! * [`http2`]: HTTP/2 clients (hyper's server), and HTTP/1 clients of `h2`/`h2c` groups
//!   (`http2::bridge`); [`http3`]: HTTP/3 clients (quinn + h3), sharing HTTP/2's stream
//!   handler.
//! * [`l4`]: L4 relays (`[[streams]]`, `protocol = "tcp"` listeners), byte for byte.

pub(crate) mod codec;
pub(crate) mod connection;
pub(crate) mod files;
pub(crate) mod http2;
pub(crate) mod http3;
pub(crate) mod idle;
pub(crate) mod interim;
pub(crate) mod l4;
pub(crate) mod proxy;
pub(crate) mod relay;
pub(crate) mod setup;
pub(crate) mod streamed;
