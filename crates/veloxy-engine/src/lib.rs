//! veloxy's engine: a thread-per-core HTTP/1.1 and HTTP/2 reverse proxy, load balancer and
//! static file server.
//!
//! # Layout
//!
//! One request's path through the crate, each step a module. Layers call downward only, in
//! this order (top to bottom): entry (`server`, `admin`) -> downstream codecs
//! (`downstream`) -> the exchange driver (`exchange`) -> state and config (`worker`, `park`,
//! `runtime`, `config`) -> the exchange's steps (`router`, `rules`, `hooks`, `auth`, `cors`,
//! `search`, `cache`, `static_files`, `access_log`, `metrics`, `otel`, `acme`, `message`,
//! `hints`) ->
//! upstream clients, TLS and listener sockets (`upstream`, `tls`, `listener`) -> primitives
//! (`limits`, `fleet`, `http1`, `error`, `late`, `clock`, `deadline`, `background`,
//! `template`, `accept`, `compress`, `access`, `heap`). `python3 dev/modgraph.py` prints the module graph,
//! the layers, upward edges and cycles (none of either); `--check`, in CI, fails on an
//! upward edge, a cycle, or a module in no layer. Where a lower layer needs something of a
//! higher one, the higher passes it down: a small trait the lower defines
//! (`tls::LiveCerts`, `upstream::connect::ConnectCounts`, `http1::DropsFields`,
//! `cache::fetch::Upstream`) or plain data (`acme::ListenerCerts`).
//!
//! 1. **listener** (`listener`, `accept`): every worker binds its own `SO_REUSEPORT` socket
//!    per listener, so the kernel spreads connections and no accept lock is shared. The
//!    [`server`] starts the workers and reloads; each **worker** (`worker`) runs a
//!    single-threaded tokio runtime that owns its sockets, upstream pools and pickers, and
//!    reads the config **generation** it runs on. `runtime` holds what all workers share.
//!    An HTTP/1 client idle past `park_idle_after` is **parked** (`park`): its task ends
//!    and its socket waits in the worker's own epoll instance until its next request.
//! 2. **downstream codecs** (`downstream`): `connection` terminates TLS, detects HTTP/2 (ALPN
//!    `h2` or the h2c preface) and reads HTTP/1 request heads, parsed by `http1::request`
//!    (nothing that could smuggle a request gets through); `downstream::http2` serves HTTP/2
//!    with hyper. Each codec turns its request into a protocol-neutral view (`message::Head`;
//!    veloxy's own answers are `message::Answer`). `tls` picks a listener's certificate by
//!    SNI; ACME's certificates and OCSP staples reach it through `tls::LiveCerts` (the
//!    runtime's store, in the snapshot's `Late` slot).
//! 3. **exchange** (`exchange`): admission, once for every protocol (`exchange::admit`):
//!    route match (`router`), access rules, rate limit (`limits`), the `on_request` hook
//!    ([`hooks`]), the cache lookup, the first backend choice. Then one driver,
//!    `exchange::drive`, runs every later step in one order for every protocol, over the
//!    codec's side of `exchange::drive::Codec`: the `basic_auth` check (on the
//!    `auth::verify` pool, off the workers) before anything is answered; a file route's or
//!    veloxy's own answer; forward_auth; a hit held for it; the search job; the cache fill
//!    (`exchange::fill`); the route's `mirror` copies, each a task of its own
//!    (`exchange::mirror`); the attempts (`exchange::attempt`: retries under the retry budget,
//!    outlier feedback) with the response rules, hooks and compression on the answer. Every
//!    exchange ends in `exchange::record` (access log, metrics, `on_done`). With
//!    `[server.tracing]`, admission decides sampling (`exchange::trace`); a sampled exchange
//!    carries its spans in its record and hands them to the exporter thread (`otel`) at its end.
//! 4. **upstream** ([`upstream`]): `connect` (TCP, TLS, `max_connections`), the per-worker
//!    keep-alive `pool`, the `balancer` (a policy's picker per worker), active and passive
//!    `health`. One client per upstream protocol, each used by every caller: the HTTP/1
//!    attempt `exchange::h1` (pool or connect, head, body, response head with interims and
//!    the stale-connection replay; HTTP/1 clients parse and rewrite the head in one pass,
//!    the others read it into a header map) and the HTTP/2 attempt `exchange::h2` (one
//!    multiplexed sender per backend per worker). HTTP/2 and HTTP/3 clients share one relay
//!    per upstream protocol, `exchange::framed_h1` and `exchange::framed_h2`, over the
//!    codec's `exchange::framed::FramedClient` and the protocol-neutral response body
//!    `exchange::framed::ResponseBody`. A `grpc_web` route's gRPC-Web requests are translated
//!    to gRPC and back in one place, `exchange::grpc_web`, used by both paths to h2 groups
//!    (the HTTP/1 bridge and `framed_h2`). Bodies stream through bounded buffers
//!    (`downstream::relay`, framing in `http1::body`); `compress` encodes on the fly.
//!    Every wait on the way has a deadline: `deadline::timeout` starts its timer only when a
//!    step has to wait, and `clock` has the cheap clocks the exchange stamps with.
//! 5. **search gateway** (`search`): on routes with `search = { ... }`, admission refuses
//!    denied APIs and clamps searches, and a `_bulk` is split by shard (`search::bulk`,
//!    `search::routing`) and sent to the nodes with the primaries, which the discovery
//!    thread finds (`upstream::search_cluster`).
//!
//! Configuration goes file -> `config::file` (serde structs, `deny_unknown_fields`) ->
//! `config::compile` (validation, one file per section) -> [`config::Snapshot`], plain data
//! read through an atomic pointer, so a reload swaps it without pausing traffic. Compiling
//! starts, binds and creates nothing (`veloxy check` makes no thread, socket or directory):
//! the cache stores, the Redis client, search cluster views and the ACME certificate store a
//! snapshot names are empty `late::Late` slots that `runtime::live` fills before the snapshot
//! is installed, keeping the objects of the same name across reloads (they live in the
//! runtime, not in process-global statics); other live state (backend health, limiters,
//! file caches, idle connections) is carried over by name too.
//! `config::print` renders a snapshot back as TOML (`veloxy check --print`).
//!
//! # Lexicon
//!
//! * **downstream**: the client side of the proxy. **upstream**: the server side.
//! * **listener**: an address veloxy accepts connections on, with a name.
//! * **route**: a rule (listener, host, path prefix) and its target: an upstream group, or a
//!   root directory (a **file route**).
//! * **upstream group**: a named set of backends plus a policy, pool size and timeouts.
//! * **backend**: one server (address, weight) of an upstream group.
//! * **exchange**: one request and its response, from admission to the record of its end.
//! * **attempt**: one try of an exchange on one backend; a **retry** is a further attempt on
//!   another backend, allowed by the group's **retry budget** (retries per request, Envoy's).
//! * **policy**: a balancing algorithm (round robin, least connections, p2c EWMA, consistent
//!   hash, or a library user's); its **picker** is the per-worker state that picks backends.
//! * **outlier**: a backend ejected by passive health checks after consecutive failures.
//! * **worker**: one thread with its own runtime; owns its listener sockets and pools.
//! * **snapshot**: the immutable compiled config; a **generation** is a worker's state built
//!   for one snapshot (pickers, pools), replaced on reload.
//! * **stream**: one request/response exchange on an HTTP/2 or HTTP/3 connection, and only
//!   that. A TCP connection relayed byte for byte (the config's `[[streams]]` and
//!   `protocol = "tcp"` listeners; the config's name is kept, it is a contract) is an **L4
//!   relay** (`downstream::l4`).
//! * **tunnel**: an upgraded (WebSocket) connection relayed as raw bytes both ways; also an
//!   HTTP/2 stream opened by a WebSocket's extended CONNECT (RFC 8441,
//!   `downstream::http2::websocket`).
//! * **parked**: an idle HTTP/1 client connection whose task has ended; its socket waits in
//!   the worker's own epoll instance until its next request (`park`).

#![warn(missing_docs)]

pub(crate) mod accept;
pub(crate) mod access;
pub(crate) mod access_log;
pub mod acme;
pub(crate) mod admin;
pub(crate) mod auth;
pub mod background;
pub(crate) mod cache;
pub(crate) mod clock;
pub(crate) mod compress;
pub mod config;
pub(crate) mod cors;
pub(crate) mod deadline;
pub(crate) mod downstream;
pub mod error;
pub(crate) mod exchange;
pub(crate) mod fastcgi;
pub(crate) mod fleet;
pub(crate) mod heap;
pub(crate) mod hints;
pub mod hooks;
pub(crate) mod http1;
pub(crate) mod late;
pub(crate) mod limits;
pub(crate) mod listener;
pub(crate) mod message;
pub(crate) mod metrics;
pub(crate) mod otel;
pub(crate) mod park;
pub(crate) mod router;
pub(crate) mod rules;
pub(crate) mod runtime;
pub(crate) mod search;
pub mod server;
pub(crate) mod static_files;
pub(crate) mod template;
pub(crate) mod tls;
pub mod upstream;
pub(crate) mod worker;

pub use config::{load_file, ConfigError, Snapshot};
pub use server::{Running, Server, ServerError};
