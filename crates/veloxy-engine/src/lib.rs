//! veloxy's engine: a thread-per-core HTTP/1.1 and HTTP/2 reverse proxy and load balancer.
//!
//! # Layout
//!
//! One request's path through the crate, each step a module:
//!
//! 1. [`listener`]: every worker binds its own `SO_REUSEPORT` socket per listener, so the
//!    kernel spreads connections and no accept lock is shared.
//! 2. [`server`] starts the workers; each [`worker`] runs a single-threaded tokio runtime that
//!    owns its sockets, upstream pools and balancer state.
//! 3. [`connection`] terminates TLS ([`tls`]: rustls, certificates by SNI) and looks at the
//!    protocol: HTTP/2 (ALPN `h2`, or the h2c preface) goes to the private `http2` module,
//!    which runs hyper's HTTP/2 server and forwards each stream through the same router,
//!    limits, balancer and pools. HTTP/1 request heads are read here (keep-alive, pipelining,
//!    header timeout) and parsed by [`http1::request`], which refuses anything that could
//!    smuggle a request (conflicting framing, bare LF, obs-fold).
//! 4. The [`router`] picks a route by host and longest path prefix; [`hooks`] may inspect or
//!    refuse the request and add headers.
//! 5. [`upstream::balancer`] picks a backend of the route's upstream group; the upstream head
//!    is written with hop-by-hop headers removed and `X-Forwarded-*` set.
//! 6. [`proxy`] takes an idle connection from the worker's [`upstream`] pool (or connects),
//!    sends head and body, reads the response with [`http1::response`], streams bodies both
//!    ways through bounded buffers, and returns the connection to the pool. A `101` to an
//!    upgrade request (WebSocket) turns the exchange into a tunnel ([`relay`]). A route with
//!    `compress = true` runs the response body through a [`compress`] stream encoder. Groups
//!    with `protocol = "h2"`/`"h2c"` are reached over one multiplexed HTTP/2 connection per
//!    backend per worker instead (the `http2` module: `to_h2` for HTTP/2 clients, `bridge`
//!    for HTTP/1.1 clients).
//! 7. A route with a `root` is answered by [`static_files`] instead of steps 5 and 6: a
//!    version-independent decision (path safety, cache, conditionals, ranges, codings) and a
//!    thin HTTP/1 writer that uses `sendfile`.
//!
//! Configuration goes file -> [`config::file`] (serde structs) -> [`config::compile`]
//! (validation) -> [`config::Snapshot`], which workers read through an atomic pointer so a
//! reload swaps it without pausing traffic.
//!
//! # Lexicon
//!
//! * **downstream**: the client side of the proxy. **upstream**: the server side.
//! * **listener**: an address veloxy accepts connections on, with a name.
//! * **route**: a rule (listener, host, path prefix) that sends requests to an upstream group,
//!   or serves files from a root directory (a **file route**).
//! * **upstream group**: a named set of backends plus a policy, pool size and timeouts.
//! * **backend**: one server (address, weight) of an upstream group.
//! * **worker**: one thread with its own runtime; owns its listener sockets and pools.
//! * **snapshot**: the immutable compiled config a request runs on.
//! * **stream**: one request/response exchange on an HTTP/2 connection.
//! * **tunnel**: an upgraded (WebSocket) connection relayed as raw bytes both ways.

#![allow(missing_docs)] // to be turned to warn once every public item is documented

pub(crate) mod accept;
pub(crate) mod access_log;
pub(crate) mod admin;
pub(crate) mod clock;
pub(crate) mod compress;
pub mod config;
pub(crate) mod downstream;
pub mod error;
pub(crate) mod exchange;
pub mod hooks;
pub(crate) mod http1;
pub(crate) mod limits;
pub(crate) mod listener;
pub(crate) mod metrics;
pub(crate) mod router;
pub(crate) mod runtime;
pub mod server;
pub(crate) mod static_files;
pub(crate) mod tls;
pub mod upstream;
pub(crate) mod worker;

pub use config::{load_file, ConfigError, Snapshot};
pub use server::{Running, Server, ServerError};
