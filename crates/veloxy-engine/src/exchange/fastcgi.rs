//! FastCGI routes (`fastcgi = { ... }` to a `protocol = "fastcgi"` group), the driver's step
//! for them: the CGI parameters rendered at admission ([`Job::new`]), the body read whole, the
//! route's concurrency slot, then attempts through the retry loop ([`super::attempt`]) on
//! pooled connections (`FCGI_KEEP_CONN`) until a response head comes, and the CGI response
//! answered as a static response (so the route's response rules, error pages and hooks
//! apply, over every client protocol): whole when it was complete with its head, else with
//! its body streamed ([`super::fastcgi_body`]). What the FastCGI server writes to stderr is
//! logged.

use std::rc::Rc;

use bytes::Bytes;

use super::attempt::{self, AttemptFail, Plan};
use super::fastcgi_body::FcgiStream;
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
        script: Option<&str>,
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
            script,
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
    /// nothing was answered, for idempotent methods) and answers the CGI response: whole when
    /// its end came with its head (a Content-Length, one write), else streamed.
    pub(crate) async fn run(
        mut self,
        worker: &Rc<Worker>,
        gen: &Rc<Generation>,
        t: &ProxyTarget,
        body: Bytes,
        trace: Option<crate::otel::TraceRef>,
    ) -> Result<Answer, ProxyError> {
        let method = self.params.iter().find(|(k, _)| k == "REQUEST_METHOD");
        let method = method.map_or(&b""[..], |(_, m)| &m[..]);
        let idempotent = matches!(method, b"GET" | b"HEAD" | b"OPTIONS" | b"QUERY");
        let is_head = method == b"HEAD";
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
            trace,
        };
        let mut last = None;
        let (head, mut stream) = attempt::run(&plan, t.backend, &mut last, async |backend, _| {
            let trace = plan.trace.as_deref();
            let a = attempt_on(worker, gen, (t.upstream, backend), &request, trace).await?;
            Ok((a, 200))
        })
        .await?;
        let cgi = crate::fastcgi::parse_head(&head).map_err(bad)?;
        let mut r = static_response(cgi);
        match stream.whole() {
            None => Ok(Answer::Stream(r, stream)),
            Some(Err(e)) => Err(bad(e)),
            Some(Ok(body)) => {
                if !is_head {
                    r.headers
                        .push(("content-length", body.len().to_string().into()));
                }
                if !body.is_empty() && !is_head {
                    r.body = crate::static_files::Body::Bytes(body);
                }
                Ok(Answer::Whole(r))
            }
        }
    }
}

/// A FastCGI route's answer.
pub(crate) enum Answer {
    /// The response was complete with its head (most answers of a short script).
    Whole(crate::static_files::Response),
    /// The head (its body empty); the body follows from the stream.
    Stream(crate::static_files::Response, Box<FcgiStream>),
}

fn bad(e: FastcgiError) -> ProxyError {
    ProxyError::upstream(ErrorKind::BadResponse("invalid FastCGI response")).because(e)
}

/// One attempt on `backend`: a pooled connection (a stale one is replaced by a fresh one
/// once), the request, the response's head; the connection goes back to the pool once the
/// stream has read the response's end.
async fn attempt_on(
    worker: &Rc<Worker>,
    gen: &Rc<Generation>,
    (upstream, backend): (usize, usize),
    request: &[u8],
    trace: Option<&crate::otel::Trace>,
) -> Result<(Bytes, Box<FcgiStream>), AttemptFail<ProxyError>> {
    let pooled = gen.group(upstream).pool.take(backend, None);
    let (mut conn, mut fresh) = match pooled {
        Some(c) => (c, false),
        None => (connect(worker, gen, upstream, backend).await?, true),
    };
    loop {
        if let Some(t) = trace {
            super::trace::connected(t, &conn, !fresh);
        }
        let mut stream = Box::new(FcgiStream::new(worker, gen, (upstream, backend), conn));
        let no_response = |kind| Err(AttemptFail::NoResponse(ProxyError::upstream(kind)));
        match stream.head(request).await {
            Ok(head) => {
                // The request goes out whole before the head is read (one write).
                if let Some(t) = trace {
                    super::trace::event(t, crate::otel::span::EventName::ResponseHead, None);
                }
                return Ok((head, stream));
            }
            // A pooled connection the server had closed: once more on a fresh one.
            Err(FastcgiError::Closed) if !fresh => {
                conn = connect(worker, gen, upstream, backend).await?;
                fresh = true;
            }
            Err(FastcgiError::Closed) => return no_response(ErrorKind::UpstreamClosed),
            Err(FastcgiError::Io(e)) => return no_response(ErrorKind::Io(e)),
            Err(FastcgiError::TimedOut) => return no_response(ErrorKind::ReadTimeout),
            Err(e) => return Err(AttemptFail::Fatal(bad(e))),
        }
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

/// The CGI response head as a static response (no body yet): its fields serialized as
/// they came, but framing, which is veloxy's.
fn static_response(cgi: crate::fastcgi::CgiHead) -> crate::static_files::Response {
    let mut raw = Vec::new();
    let mut has_type = false;
    for (name, value) in &cgi.fields {
        let lower = name.to_ascii_lowercase();
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
    if !has_type && !matches!(cgi.status, 204 | 304) {
        raw.extend_from_slice(b"Content-Type: text/html; charset=UTF-8\r\n");
    }
    crate::static_files::Response {
        status: cgi.status,
        headers: Vec::new(),
        body: crate::static_files::Body::Empty,
        raw: [Bytes::from(raw), Bytes::new()],
    }
}
