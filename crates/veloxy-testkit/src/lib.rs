//! # veloxy-testkit: what veloxy's integration tests run against
//!
//! Not part of the product (`publish = false`; `cargo install --path crates/veloxy` does not
//! install anything from here). It holds:
//!
//! * the **`veloxy-upstream` binary** (`src/bin/veloxy-upstream/`): the fast HTTP/1.1 origin
//!   server used by the integration tests and by the benchmarks (`bench/` runs
//!   `target/release/veloxy-upstream`, which a plain `cargo build --release` at the workspace
//!   root builds). Its command line, routes and protocol behaviour are documented at the top of
//!   its `main.rs`.
//! * the **test helpers**, this library, used by every file in `crates/veloxy/tests/` with
//!   `use veloxy_testkit::*;` (everything is re-exported at the root):
//!   * [`bins`]: [`VELOXY`] and [`UPSTREAM`], the two executables, and how they are found
//!     (read this before running the helpers from another package);
//!   * [`proc`]: [`veloxy`] / [`upstream`] start real processes on 127.0.0.1 ephemeral
//!     ports and wait for their `listening` line; [`Proc`] kills the child on drop;
//!     [`reload_with`] rewrites the config and sends SIGHUP;
//!   * [`config`]: [`simple_config`] and [`group_config`], one listener and one upstream group;
//!   * [`client`]: [`Client`], a raw HTTP/1.1 client (exact bytes on the wire), and the
//!     one-shot [`request`] / [`get`];
//!   * [`origin`](mod@origin): [`origin`](origin()), a threaded origin scripted per request;
//!   * [`script_origin`](mod@script_origin): [`script_origin`](script_origin()), a keep-alive
//!     origin answering each request with what the test computes from all of it (status,
//!     headers, body, delay), with a request log and a `stop` that makes it refuse connections;
//!   * [`tls`]: [`Pki`], a throwaway CA issuing leaf certificates, rustls client configs and
//!     [`tls_connect`] / [`https1`];
//!   * [`http2`]: an HTTP/2 client ([`h2_connect`], [`h2_send`], [`h2_get`]) over TLS or h2c
//!     on a current-thread [`runtime`];
//!   * [`site`]: [`Site`], a veloxy with a TLS and a plain listener, spoken to over HTTP/1.1
//!     and HTTP/2; [`Nginx`], a real nginx as an upstream;
//!   * [`dns`]: [`Dns`], a real dnsmasq whose A and SRV records a test changes;
//!   * [`bind`]: [`Bind`], a real BIND 9 primary taking TSIG-signed RFC 2136 updates;
//!   * [`kube`](mod@kube): a real kube-apiserver and etcd in a test's own network namespace;
//!   * [`otel`]: [`Collector`], a real OpenTelemetry Collector writing the spans it receives
//!     to a file the tests read back;
//!   * [`skip`] (report a test that cannot run here) and [`eventually`] (poll a condition).
//!
//! ## How the binaries are located and built
//!
//! No set-up call is needed. [`VELOXY`] is `$CARGO_BIN_EXE_veloxy` (which cargo sets when it
//! runs the integration tests of the `veloxy` package, after building that binary), or else
//! `veloxy` next to the running test's `deps/` directory (`target/<profile>/`). [`UPSTREAM`]
//! is built on first use in each test process with `$CARGO build -p veloxy-testkit --bin
//! veloxy-upstream` in the test's profile (a no-op when it is fresh), because cargo never
//! builds a dependency's binaries for a test; `VELOXY_TEST_UPSTREAM_BIN` overrides it. See
//! [`bins`] for the details.
//!
//! ## Converting a test file that still uses `mod common`
//!
//! Replace `mod common; use common::*;` and `use common::tls::*;` with `use veloxy_testkit::*;`,
//! and paths such as `common::tls::h2_connect` / `common::VELOXY` with
//! `veloxy_testkit::h2_connect` / `veloxy_testkit::VELOXY`.

use std::time::{Duration, Instant};

pub mod auth;
pub mod bind;
pub mod bins;
pub mod client;
pub mod config;
pub mod dns;
pub mod golden;
pub mod http2;
pub mod http3;
pub mod kube;
pub mod opensearch;
pub mod origin;
pub mod otel;
pub mod pebble;
pub mod proc;
pub mod redis;
pub mod script_origin;
pub mod site;
pub mod tls;
pub mod ws;

pub use auth::*;
pub use bind::Bind;
pub use bins::*;
pub use client::*;
pub use config::*;
pub use dns::*;
pub use golden::*;
pub use http2::*;
pub use http3::*;
pub use opensearch::OpenSearch;
pub use origin::*;
pub use otel::Collector;
pub use pebble::*;
pub use proc::*;
pub use redis::RedisServer;
pub use script_origin::*;
pub use site::*;
pub use tls::*;
pub use ws::*;

/// A peer the import tests run (Envoy, Traefik): `$ENV_VAR`, else `~/.cache/veloxy/bin/NAME`
/// (where `.ci/run` installs it), else `NAME` on `PATH` when `NAME VERSION_ARG` runs.
pub fn peer_binary(env_var: &str, name: &str, version_arg: &str) -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os(env_var) {
        return Some(p.into());
    }
    if let Some(home) = std::env::var_os("HOME") {
        let p = std::path::Path::new(&home)
            .join(".cache/veloxy/bin")
            .join(name);
        if p.exists() {
            return Some(p);
        }
    }
    let on_path = std::process::Command::new(name)
        .arg(version_arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    on_path.then(|| name.into())
}

/// Reports the running test as skipped; the caller returns right after (`return skip(...)`).
///
/// libtest has no runtime skip, so a test that cannot run here still shows as `ok`. The line
/// `SKIPPED: <test>: <reason>` is written through `std::io::stderr()` rather than `eprintln!`
/// because libtest captures only the print macros: this way it shows in `cargo test` output
/// even though the test passes, and `.ci/run` lists every such line at the end of its run.
pub fn skip(reason: &str) {
    use std::io::Write;
    let current = std::thread::current();
    let test = current.name().unwrap_or("(unnamed test)");
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {reason}");
}

/// A Python that imports every module of `imports` (e.g. `"h2, wsproto"`): the one named by
/// the environment variable `env_var`, else the venv `.ci/run` prepares under the
/// repository's `target/` (`venv`, e.g. `py-aioquic`), else the system's `python3`.
pub fn python_with(env_var: &str, venv: &str, imports: &str) -> Option<String> {
    let local = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .join(venv)
        .join("bin/python");
    let candidates = [
        std::env::var(env_var).ok(),
        Some(local.to_string_lossy().into_owned()),
        Some("python3".to_owned()),
    ];
    candidates.into_iter().flatten().find(|p| {
        std::process::Command::new(p)
            .args(["-c", &format!("import {imports}")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Whether `program` runs here (probed with `probe`, e.g. `--version`); when it does not, the
/// running test is reported skipped with `why` (the caller then returns).
pub fn require(program: &str, probe: &str, why: &str) -> bool {
    let found = std::process::Command::new(program)
        .arg(probe)
        .output()
        .is_ok();
    if !found {
        skip(why);
    }
    found
}

/// A loopback address that refuses connections for as long as the returned socket lives: the
/// socket is bound but never listens. A port bound and then closed is not enough: another
/// test running at the same time may be given it and answer there.
pub fn refusing_addr() -> (std::net::SocketAddr, socket2::Socket) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a TCP socket");
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    s.bind(&any.into()).expect("bind 127.0.0.1:0");
    let addr = s
        .local_addr()
        .unwrap()
        .as_socket()
        .expect("an IPv4 address");
    (addr, s)
}

/// Whether something listens at `addr`: a TCP connect that reached another socket.
///
/// A bare `connect().is_ok()` is not enough while a server is still starting on a port picked
/// in advance: when nothing listens yet, the kernel may give the probe that same port as its
/// source, and the SYN then meets itself (a TCP simultaneous open) and "connects". The server
/// then fails to bind, and the test talks to nobody.
pub fn listening(addr: impl std::net::ToSocketAddrs) -> bool {
    std::net::TcpStream::connect(addr)
        .is_ok_and(|s| matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l != p))
}

/// Polls `f` until it returns true or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
