//! # `veloxy-upstream`: a small, fast HTTP/1.1 origin server
//!
//! This binary is the backend used by veloxy's integration tests and by the
//! benchmarks. It is hand-rolled on tokio + `httparse` (no hyper): every worker
//! thread runs its own `current_thread` runtime, accepted sockets get
//! `TCP_NODELAY`, and the hot path (keep-alive `GET /`) copies one precomputed
//! response, formats two small per-request headers and issues one `write`.
//!
//! ## Command line
//!
//! ```text
//! veloxy-upstream --listen 127.0.0.1:0 [--name NAME] [--threads N]
//!                 [--body-size BYTES] [--close-after N]
//!                 [--also N --ports-file PATH]
//! ```
//!
//! * `--listen ADDR` (default `127.0.0.1:0`): address to bind; port 0 picks an
//!   ephemeral port. With `--threads N > 1` every worker binds its own socket
//!   with `SO_REUSEPORT` on the port actually chosen by the first one.
//! * `--name NAME` (default `upstream`): echoed as `x-upstream: NAME` on every
//!   response so tests can tell backends apart.
//! * `--threads N` (default 1): number of worker threads.
//! * `--body-size BYTES`: replaces the default body (see below) with `BYTES`
//!   bytes of the `/size` pattern, content-type `application/octet-stream`.
//! * `--close-after N`: after writing the N-th response on a connection, close
//!   it silently: the response carries normal keep-alive framing and no
//!   `Connection: close`; the socket is then shut down. This simulates an
//!   upstream that drops idle pooled connections (stale-connection tests).
//! * `--also N`: listens on N more ephemeral ports of the `--listen` address,
//!   served by the first worker thread alongside its own socket: one process
//!   is then many backends (`bench/run --backends` makes groups of 10,000).
//!   Needs `--ports-file`.
//! * `--ports-file PATH`: writes every port listened on (the first one first),
//!   one a line, before the readiness line.
//!
//! Once all sockets listen, exactly one line `listening IP:PORT` is printed to
//! stdout and flushed; tests use it as the readiness signal. SIGTERM and
//! SIGINT make the process exit with status 0.
//!
//! ## Protocol behaviour
//!
//! * Request heads are parsed with `httparse` and may be up to 64 KiB (larger:
//!   `431`, then close). Malformed requests (bad syntax, bad `Content-Length`,
//!   both `Content-Length` and `Transfer-Encoding`, a `Transfer-Encoding` whose
//!   last coding is not `chunked`, bad chunk framing) get `400 Bad Request`
//!   with `connection: close`, and the connection is closed.
//! * Request bodies are always read completely according to their framing
//!   (`Content-Length` or chunked, chunk extensions and trailers accepted) and
//!   discarded unless a route needs them; they are never buffered whole.
//! * `Expect: 100-continue` on an HTTP/1.1 request that has a body gets an
//!   interim `HTTP/1.1 100 Continue` before the body is read (not on `/drop`
//!   and `/hang`).
//! * Keep-alive: HTTP/1.1 stays open unless the request says
//!   `Connection: close`; HTTP/1.0 is closed after the response unless the
//!   request says `Connection: keep-alive` (then the response says so too).
//!   Pipelined requests are supported; their responses are batched into one
//!   write when they arrive together.
//! * Every response is `HTTP/1.1` and carries `x-upstream: NAME`,
//!   `x-conn-id: C` (per-process counter of accepted connections, from 1) and
//!   `x-conn-seq: K` (1-based index of this request on its connection), plus
//!   `content-length` or chunked framing unless stated otherwise. Responses
//!   that end the connection carry `connection: close` (except with
//!   `--close-after`). The server closes by shutting down its write side and
//!   draining input for up to one second, so the last response is not lost to
//!   a TCP reset.
//! * `HEAD` on any route sends the headers the `GET` would have (same
//!   `content-length` / `transfer-encoding`) and no body.
//!
//! ## Routes
//!
//! Routing looks at the path only; a query string `?a=b&c=d` is split on `&`
//! and `=`. An absolute-form target (`http://host/path`) is reduced to its
//! path. Methods are not checked unless stated.
//!
//! * `/echo`: body is the exact raw request head as received (request line,
//!   headers and the blank line), `text/plain`. Extra headers
//!   `x-body-bytes: N` (request body bytes read) and `x-body-sum: S` (wrapping
//!   `u64` sum of all request body bytes).
//! * `/sink`: reads the body streaming with a fixed 64 KiB buffer (1 GiB is
//!   fine) and answers `{"bytes":N,"sum":S}` (`application/json`), S as above.
//! * `/size/N`: exactly N bytes (any `u64`) of the pattern
//!   `b'a' + (i % 26)` where `i` is the byte offset (`abc…xyzabc…`),
//!   `application/octet-stream`, generated from a fixed buffer (never held in
//!   memory). `?chunked=1` sends it `Transfer-Encoding: chunked` in chunks of
//!   at most 16 KiB followed by `0\r\n\r\n` (for an HTTP/1.0 request it falls
//!   back to close-delimited). `?close=1` sends it with neither
//!   `content-length` nor chunking, with `connection: close`, delimited by
//!   closing the connection (`close` wins over `chunked`). A non-numeric N
//!   gets `400` with body `bad path parameter\n` (connection kept). `?text=1`
//!   labels it `text/plain` instead (compressible, for compression tests).
//! * `/delay/MS`: reads the request, waits MS milliseconds, then answers like
//!   `/`. A non-numeric MS gets `400` as above.
//! * `/status/CODE`: answers with status CODE (200..=999, otherwise `400` as
//!   above) and body `status CODE\n` (`text/plain`); `204` and `304` have no
//!   body and no `content-length`; `205` has `content-length: 0`.
//! * `/drop`: closes the connection immediately after the request head,
//!   without reading the body or writing anything.
//! * `/hang`: reads the request and never answers; the socket stays open
//!   (input is drained and discarded) until the client closes it.
//! * `/close`: answers like `/` with `connection: close`, then closes.
//! * `/health`: `200` with body `ok\n` (`text/plain`).
//! * `/_search` or any path ending in `/_search`: a fixed ~500-byte JSON body
//!   shaped like an Elasticsearch search response (`took`, `timed_out`,
//!   `_shards`, `hits` with three small documents), `application/json`.
//! * `/_bulk` or any path ending in `/_bulk`: reads the whole body (streaming),
//!   counts its newline-delimited lines (a non-empty final line without `\n`
//!   counts too) and answers `{"took":1,"errors":false,"items":N}` with
//!   N = lines / 2, `application/json`.
//! * anything else (e.g. `/`): `200` with the default body, exactly 100 bytes
//!   of JSON
//!   `{"status":"ok","service":"veloxy-upstream","message":"hello from the upstream","padding":"xxxxxxxx"}`
//!   (`application/json`), or the `--body-size` pattern body.

mod conn;
mod request;
mod routes;

use std::io::Write as _;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Parser;
use tokio::net::{TcpListener, TcpSocket};
use tokio::runtime::{Builder, Runtime};
use tokio::signal::unix::{signal, SignalKind};

use crate::routes::Shared;

/// Listen backlog requested for every socket (the kernel caps it at somaxconn).
const LISTEN_BACKLOG: u32 = 4096;

/// Fast HTTP/1.1 origin server for veloxy integration tests and benchmarks.
#[derive(Parser, Debug)]
#[command(name = "veloxy-upstream", version)]
struct Args {
    /// Address to listen on; port 0 picks an ephemeral port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,

    /// Name echoed in the `x-upstream` header of every response.
    #[arg(long, default_value = "upstream")]
    name: String,

    /// Number of worker threads (each with its own SO_REUSEPORT socket).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,

    /// Size of the default response body in bytes (pattern `abc...`), instead
    /// of the built-in 100-byte JSON document.
    #[arg(long)]
    body_size: Option<u64>,

    /// Silently close each connection after it has served this many responses.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    close_after: Option<u64>,

    /// Listen on this many more ephemeral ports of the `--listen` address.
    #[arg(long, default_value_t = 0, requires = "ports_file")]
    also: usize,

    /// Write every port listened on to this file, one a line.
    #[arg(long)]
    ports_file: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let shared: &'static Shared = Box::leak(Box::new(Shared::new(
        &args.name,
        args.body_size,
        args.close_after,
    )?));

    // Install the signal handlers before announcing readiness, so a test that
    // sends SIGTERM right after the `listening` line gets a clean exit.
    let signal_rt = Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the signal runtime")?;
    let (mut sigterm, mut sigint) = {
        let _guard = signal_rt.enter();
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        )
    };

    let (addr, workers) = bind_workers(args.listen, usize::from(args.threads))?;
    let mut also = Vec::with_capacity(args.also);
    for _ in 0..args.also {
        let at = SocketAddr::new(addr.ip(), 0);
        also.push(new_socket(at, false).with_context(|| format!("binding {at}"))?);
    }
    if let Some(path) = &args.ports_file {
        let mut ports = format!("{}\n", addr.port());
        for s in &also {
            ports += &format!(
                "{}\n",
                s.local_addr().context("reading a bound address")?.port()
            );
        }
        std::fs::write(path, ports).with_context(|| format!("writing {}", path.display()))?;
    }
    for (i, (rt, listener)) in workers.into_iter().enumerate() {
        let extra = if i == 0 {
            std::mem::take(&mut also)
        } else {
            Vec::new()
        };
        let extra = {
            let _guard = rt.enter();
            extra
                .into_iter()
                .map(|s| s.listen(128).context("listening on an extra port"))
                .collect::<Result<Vec<_>>>()?
        };
        std::thread::Builder::new()
            .name(format!("upstream-{i}"))
            .spawn(move || {
                rt.block_on(async move {
                    for l in extra {
                        tokio::spawn(conn::serve(l, shared));
                    }
                    conn::serve(listener, shared).await
                })
            })
            .context("spawning a worker thread")?;
    }

    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening {addr}").context("writing the readiness line")?;
        stdout.flush().context("flushing stdout")?;
    }

    signal_rt.block_on(async {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
    });
    // Returning from `main` exits the process, worker threads included.
    Ok(())
}

/// Binds and listens one socket per worker, each registered with its own
/// `current_thread` runtime. Returns the actual bound address.
fn bind_workers(
    listen: SocketAddr,
    threads: usize,
) -> Result<(SocketAddr, Vec<(Runtime, TcpListener)>)> {
    let reuseport = threads > 1;
    let mut addr = listen;
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        let socket = new_socket(addr, reuseport).with_context(|| format!("binding {addr}"))?;
        if i == 0 {
            addr = socket.local_addr().context("reading the bound address")?;
        }
        let rt = Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building a worker runtime")?;
        let listener = {
            let _guard = rt.enter();
            socket
                .listen(LISTEN_BACKLOG)
                .with_context(|| format!("listening on {addr}"))?
        };
        workers.push((rt, listener));
    }
    Ok((addr, workers))
}

fn new_socket(addr: SocketAddr, reuseport: bool) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if reuseport {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    Ok(socket)
}
