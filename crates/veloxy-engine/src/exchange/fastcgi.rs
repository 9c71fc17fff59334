//! FastCGI routes (`fastcgi = { ... }` to a `protocol = "fastcgi"` group), the driver's step
//! for them: the CGI parameters rendered at admission ([`Job::new`]), the body read whole, the
//! route's concurrency slot, then attempts through the retry loop ([`super::attempt`]) on
//! pooled connections (`FCGI_KEEP_CONN`), and the CGI response answered as a static response
//! (so the route's response rules, error pages and hooks apply, over every client protocol).
//! What the FastCGI server writes to stderr is logged.

use std::time::Duration;

use bytes::Bytes;

use super::attempt::{self, AttemptFail, Plan};
use super::{Head, Peer, ProxyTarget};
use crate::error::{ErrorKind, ProxyError};
use crate::fastcgi::{FastcgiError, FastcgiRoute, RequestInfo};
use crate::worker::{Generation, Worker};

/// One FastCGI request, prepared at admission.
#[derive(Clone)]
pub(crate) struct Job {
    /// The parameters but CONTENT_LENGTH (known once the body is read).
    params: Vec<(String, Vec<u8>)>,
    /// The largest body read (`max_body_bytes`, else the default).
    pub body_limit: u64,
    /// The client (for a hash policy's pick on a retry).
    client: std::net::SocketAddr,
}

/// The body limit of a FastCGI route without `max_body_bytes` (nginx's default is 1 MiB;
/// PHP's `post_max_size` 8 MiB): larger bodies get 413.
const DEFAULT_BODY_LIMIT: u64 = 16 << 20;

impl Job {
    pub(crate) fn new(
        route: &FastcgiRoute,
        head: &Head,
        peer: &Peer,
        max_body: Option<u64>,
    ) -> Job {
        let info = RequestInfo {
            method: head.method,
            target: head.target,
            host: std::str::from_utf8(head.host).unwrap_or(""),
            fields: head.fields.iter().collect(),
            client: peer.addr,
            server_port: peer.server_port,
            tls: peer.tls,
            protocol: match head.version {
                0 => "HTTP/1.0",
                1 => "HTTP/1.1",
                2 => "HTTP/2.0",
                _ => "HTTP/3.0",
            },
            content_length: 0,
        };
        let mut params = crate::fastcgi::params(route, &info);
        params.retain(|(k, _)| k != "CONTENT_LENGTH");
        Job {
            params,
            body_limit: max_body.unwrap_or(DEFAULT_BODY_LIMIT),
            client: peer.addr,
        }
    }

    /// Sends the request with `body` to the group's backends (retried on another one while
    /// nothing was answered, for idempotent methods) and answers the CGI response.
    pub(crate) async fn run(
        mut self,
        worker: &Worker,
        gen: &Generation,
        t: &ProxyTarget,
        body: Bytes,
    ) -> Result<crate::static_files::Response, ProxyError> {
        let idempotent = self
            .params
            .iter()
            .find(|(k, _)| k == "REQUEST_METHOD")
            .is_some_and(|(_, m)| matches!(&m[..], b"GET" | b"HEAD" | b"OPTIONS" | b"QUERY"));
        self.params
            .push(("CONTENT_LENGTH".into(), body.len().to_string().into_bytes()));
        let request = crate::fastcgi::request_bytes(&self.params, &body);
        let plan = Plan {
            worker,
            gen,
            upstream: t.upstream,
            client: self.client,
            hash: t.hash,
            replayable: idempotent,
        };
        let mut last = None;
        let answered = attempt::run(&plan, t.backend, &mut last, async |backend, _| {
            let a = attempt_on(worker, gen, (t.upstream, backend), &request).await?;
            Ok((a, 200))
        })
        .await?;
        let group = &gen.snapshot.upstreams[t.upstream];
        if !answered.stderr.is_empty() {
            let text = String::from_utf8_lossy(&answered.stderr);
            tracing::warn!(upstream = %group.name, stderr = %text.trim_end(), "FastCGI stderr");
        }
        let cgi = crate::fastcgi::parse_response(answered.stdout).map_err(bad)?;
        Ok(static_response(cgi))
    }
}

fn bad(e: FastcgiError) -> ProxyError {
    ProxyError::upstream(ErrorKind::BadResponse("invalid FastCGI response")).because(e)
}

/// One attempt on `backend`: a pooled connection (a stale one is replaced by a fresh one
/// once), the request, the response to its end; the connection goes back to the pool.
async fn attempt_on(
    worker: &Worker,
    gen: &Generation,
    (upstream, backend): (usize, usize),
    request: &[u8],
) -> Result<crate::fastcgi::Answered, AttemptFail<ProxyError>> {
    let group = &gen.snapshot.upstreams[upstream];
    let pooled = gen.group(upstream).pool.take(backend, None);
    let (mut conn, mut fresh) = match pooled {
        Some(c) => (c, false),
        None => (connect(worker, gen, upstream, backend).await?, true),
    };
    loop {
        let sent = timeout(
            group.read_timeout,
            crate::fastcgi::exchange(&mut conn.stream, request),
        )
        .await;
        match sent {
            Ok(answered) => {
                worker.pool_upstream(gen, (upstream, backend), conn);
                return Ok(answered);
            }
            // A pooled connection the server had closed: once more on a fresh one.
            Err(Closed) if !fresh => {
                conn = connect(worker, gen, upstream, backend).await?;
                fresh = true;
            }
            Err(Closed) => {
                return Err(AttemptFail::NoResponse(ProxyError::upstream(
                    ErrorKind::UpstreamClosed,
                )))
            }
            Err(Failed(e)) => {
                return Err(AttemptFail::NoResponse(ProxyError::upstream(
                    ErrorKind::Io(e),
                )))
            }
            Err(TimedOut) => {
                return Err(AttemptFail::NoResponse(ProxyError::upstream(
                    ErrorKind::ReadTimeout,
                )))
            }
            Err(Broken(e)) => return Err(AttemptFail::Fatal(bad(e))),
        }
    }
}

use Outcome::*;

/// How an exchange on a connection ended, when it did not answer.
enum Outcome {
    /// Closed before the end of the response.
    Closed,
    /// An I/O error.
    Failed(std::io::Error),
    TimedOut,
    /// The server answered something that is not a FastCGI response, or too much.
    Broken(FastcgiError),
}

async fn timeout(
    limit: Duration,
    f: impl std::future::Future<Output = Result<crate::fastcgi::Answered, FastcgiError>>,
) -> Result<crate::fastcgi::Answered, Outcome> {
    match crate::deadline::timeout(limit, f).await {
        Err(_) => Err(TimedOut),
        Ok(Ok(a)) => Ok(a),
        Ok(Err(FastcgiError::Closed)) => Err(Closed),
        Ok(Err(FastcgiError::Io(e))) => Err(Failed(e)),
        Ok(Err(e)) => Err(Broken(e)),
    }
}

async fn connect(
    worker: &Worker,
    gen: &Generation,
    upstream: usize,
    backend: usize,
) -> Result<crate::upstream::pool::UpstreamConn, AttemptFail<ProxyError>> {
    let group = &gen.snapshot.upstreams[upstream];
    crate::upstream::connect::connect_backend(&*worker.metrics, group, backend, None)
        .await
        .map_err(|(error, health)| AttemptFail::NotSent { error, health })
}

/// The CGI response as a static response: its fields serialized as they came.
fn static_response(cgi: crate::fastcgi::CgiResponse) -> crate::static_files::Response {
    let mut raw = Vec::new();
    let mut has_type = false;
    for (name, value) in &cgi.fields {
        let lower = name.to_ascii_lowercase();
        // Framing is veloxy's; the rest is the script's.
        if matches!(
            lower.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            continue;
        }
        has_type |= lower == "content-type";
        raw.extend_from_slice(name.as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(value);
        raw.extend_from_slice(b"\r\n");
    }
    if !has_type && !cgi.body.is_empty() {
        raw.extend_from_slice(b"Content-Type: text/html; charset=UTF-8\r\n");
    }
    let body = if cgi.body.is_empty() {
        crate::static_files::Body::Empty
    } else {
        crate::static_files::Body::Bytes(cgi.body)
    };
    crate::static_files::Response {
        status: cgi.status,
        headers: Vec::new(),
        body,
        raw: [Bytes::from(raw), Bytes::new()],
    }
}
