//! The exchange core: what happens to a request between the downstream codec that parsed it
//! and the upstream client that forwards it, written once for every protocol.
//!
//! A downstream codec (HTTP/1 in [`crate::downstream::connection`], HTTP/2 in the `http2` module, HTTP/3
//! later) turns its request into a protocol-neutral [`Head`] and calls [`admit`]: listener
//! lookup, route match, rate limit, the `on_request` hook (file routes included), and for a
//! proxied route the first backend choice. The codec then either serves the file or runs the
//! [`attempt`] loop (attempts on backends, retries, outlier feedback), and ends with
//! [`Record::finish`] (access log, metrics, `on_done`). Each of those exists in one place, as
//! do the route's concurrency slot ([`hold_slot`]), the HTTP/2 upstream attempt ([`h2`]) and
//! the limits on a streamed HTTP/2 or HTTP/3 request body ([`body`]).

mod admit;
pub(crate) mod answer;
mod apply;
pub(crate) mod attempt;
pub(crate) mod body;
pub(crate) mod drive;
pub(crate) mod edit;
pub(crate) mod fastcgi;
pub(crate) mod fastcgi_body;
pub(crate) mod fill;
pub(crate) mod forward_auth;
pub(crate) mod framed;
pub(crate) mod framed_h1;
pub(crate) mod framed_h2;
pub(crate) mod grpc_web;
pub(crate) mod h1;
pub(crate) mod h1_body;
pub(crate) mod h1_head;
pub(crate) mod h2;
pub(crate) mod h2_head;
pub(crate) mod mirror;
pub(crate) mod record;
pub(crate) mod trace;

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) use crate::message::{Answer, Fields, Head};
pub(crate) use admit::admit;
pub(crate) use record::Record;

use crate::error::{ErrorKind, ProxyError};
use crate::limits::ConcurrencyLimit;
use crate::static_files::StaticRoute;
use crate::worker::Worker;

impl crate::rules::Request for Head<'_> {
    fn method(&self) -> &str {
        self.method
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields.get(name)
    }
    fn query(&self) -> &str {
        memchr::memchr(b'?', self.target.as_bytes()).map_or("", |i| &self.target[i + 1..])
    }
}

/// The downstream connection a request came on.
pub(crate) struct Peer<'a> {
    pub addr: SocketAddr,
    /// The address the client connected to, when some group sends PROXY headers.
    pub local: Option<SocketAddr>,
    /// `addr`'s IP, formatted once per connection.
    pub client_ip: &'a str,
    pub listener: &'a str,
    /// The listener's index in the current config, cached per generation.
    pub listener_index: &'a Cell<(u64, usize)>,
    /// The connection is TLS (`{scheme}` is https).
    pub tls: bool,
    /// The port the listener is bound to (`{server_port}`).
    pub server_port: u16,
}

/// Where an admitted request goes.
pub(crate) enum Admitted {
    /// A file route: the codec answers from the filesystem.
    Files(Arc<StaticRoute>),
    /// veloxy's own answer: a redirect or a fixed response.
    Answer(Answer),
    /// An answer from the route's cache (a fresh hit, or a purge).
    Cached(crate::static_files::Response),
    Proxy(ProxyTarget),
}

/// Adds a field line (`Name: value\r\n`) to the request's answer, whatever answers it.
pub(crate) fn add_answer_line(record: &mut Record, line: &[u8]) {
    if line.is_empty() {
        return;
    }
    match &mut record.edit {
        Some(e) => e.lines_mut().extend_from_slice(line),
        None => record.edit = Some(edit::ResponseEdit::with_lines(line.to_vec())),
    }
}

/// A proxied request's destination and the limits it runs under.
#[derive(Clone)]
pub(crate) struct ProxyTarget {
    pub upstream: usize,
    /// The first backend to try.
    pub backend: usize,
    /// Hash of the group's `hash_key` for this request (0 when the group does not hash).
    pub hash: u64,
    /// The route's concurrency limit; admission to it waits in the codec's task.
    pub concurrency: Option<Arc<ConcurrencyLimit>>,
    /// The route compresses eligible responses, in `encoding` when the client accepts one.
    pub compress: bool,
    pub encoding: Option<crate::compress::Encoding>,
    /// The request target to send upstream when the route rewrites it (`strip_prefix`,
    /// `rewrite`); `None`: the client's.
    pub path: Option<edit::UpstreamTarget>,
    /// `request_headers` and the request ID; `None` when neither is configured.
    pub edit: Option<edit::UpstreamEdit>,
    /// `max_body_bytes`: a body that grows past it gets 413 and the connection closes.
    pub max_body: Option<u64>,
    /// The client a PROXY header names, for groups that send one (their connections are
    /// opened and reused for this client only).
    pub origin: Option<crate::upstream::proxy_header::Origin>,
    /// `forward_auth`: the subrequest the codec runs before forwarding (see
    /// [`forward_auth`]); taken when run.
    pub forward_auth: Option<Box<forward_auth::AuthRequest>>,
    /// The route caches and the request goes upstream through the cache: the codec runs
    /// [`crate::cache::fill::run`] instead of forwarding (taken when run).
    pub cache: Option<Box<crate::cache::fill::Fill>>,
    /// The route is a search route and this request a bulk to split or a search body to
    /// clamp: the codec reads the body whole and runs it instead of forwarding (taken when
    /// run).
    pub search: Option<Box<crate::search::Job>>,
    /// A FastCGI route's request, prepared at admission (taken when run).
    pub fastcgi: Option<Box<fastcgi::Job>>,
    /// A gRPC-Web request on a `grpc_web` route: translated to gRPC and back
    /// ([`grpc_web`]). `None` for every other request.
    pub grpc_web: Option<grpc_web::Web>,
    /// A fresh cache hit on a route with `forward_auth`: held until the auth service lets
    /// the request pass, then answered instead of forwarding (taken when run). A hit is never
    /// served before every access rule of its route has run.
    pub hit: Option<Box<crate::static_files::Response>>,
    /// `early_hints` on a GET: where the path's Link fields are remembered
    /// ([`crate::hints`]). `None` for every other request.
    pub hints: Option<Box<crate::hints::HintKey>>,
    /// `mirror`: the copies of the request the driver starts before the attempts
    /// ([`mirror`]); taken when started. `None` off the route option.
    pub mirror: Option<Box<mirror::Copies>>,
}

impl ProxyTarget {
    /// Where an attempt on `backend` goes.
    pub(crate) fn to(&self, backend: usize) -> h1::Backend<'_> {
        h1::Backend {
            trace: self.edit.as_ref().and_then(|e| e.traced()),
            upstream: self.upstream,
            backend,
            origin: self.origin,
        }
    }

    /// forward_auth let the request pass: its copied fields (`lines`) go on every upstream
    /// request made for it, the cache fill's included.
    pub(crate) fn authorized(&mut self, lines: &[u8]) {
        if let Some(fill) = self.cache.as_mut() {
            fill.add_lines(lines);
        }
        if let Some(copies) = self.mirror.as_mut() {
            copies.add_lines(lines);
        }
    }
}

/// Why a request stops at [`verified`].
pub(crate) enum Denied {
    /// veloxy's answer (401 with the route's challenge).
    Answer(Answer),
    /// An error answer (429 over the rate of checks, 503 when the check pool is full).
    Error(ProxyError),
}

impl Denied {
    /// The refusal as an answer of veloxy's own (an error counted in the worker's metrics).
    pub(crate) fn into_answer(self, worker: &Worker) -> Answer {
        match self {
            Denied::Answer(a) => a,
            Denied::Error(e) => {
                worker.count_error(&e);
                let body = bytes::Bytes::from(format!("{}\n", e.kind));
                Answer::fixed(e.status(), &body, "text/plain; charset=utf-8")
            }
        }
    }
}

/// Runs the credential check admission left in the record (if any), off the worker: every
/// codec calls this right after [`admit`], before it answers anything, so nothing (a file, a
/// cache hit, a backend's answer) reaches a client whose credentials have not passed.
pub(crate) async fn verified(record: &mut Record) -> Result<(), Denied> {
    let Some(v) = record.verify.take() else {
        return Ok(());
    };
    let realm = v.realm.clone();
    v.run().await.map_err(|f| match f {
        crate::auth::Failed::Wrong => Denied::Answer(Answer::unauthorized(&realm)),
        crate::auth::Failed::TooMany => {
            Denied::Error(ProxyError::downstream(ErrorKind::RateLimited))
        }
        crate::auth::Failed::Busy => Denied::Error(ProxyError::downstream(
            ErrorKind::AuthUnavailable("basic_auth: the credential check pool is full"),
        )),
    })
}

/// How much of a request body is read before an upstream connection is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buffering {
    /// None: the body streams to the upstream as it arrives.
    Stream,
    /// The whole body (its declared length is within the limit).
    Whole,
    /// A body of unknown length, up to this many bytes; what is left streams.
    UpTo(usize),
}

/// The `request_buffering` decision, the same for every protocol. `length`: the body's
/// declared length (`None`: unknown). With `"auto"`, a body within the group's
/// `retry_body_limit` is read first (so a slow sender costs no upstream connection, and the
/// request stays retryable), and one of unknown length up to that limit; with `"off"`, only
/// the body of a retryable request (idempotent, small, retries on) is.
pub(crate) fn body_buffering(
    setting: crate::config::RequestBuffering,
    length: Option<u64>,
    idempotent: bool,
    group: &crate::config::UpstreamGroup,
) -> Buffering {
    use crate::config::RequestBuffering;
    let limit = group.retry_body_limit;
    let small = length.is_some_and(|n| n <= limit as u64);
    match setting {
        RequestBuffering::Auto if small => Buffering::Whole,
        RequestBuffering::Auto if length.is_none() => Buffering::UpTo(limit),
        RequestBuffering::Off if small && idempotent && group.retries > 0 => Buffering::Whole,
        _ => Buffering::Stream,
    }
}

/// A held slot of a route's `max_concurrency`, released when dropped.
pub(crate) type Slot = Option<crate::limits::OwnedAdmission>;

/// Takes a slot of the route's concurrency limit (if it has one) into `held`, unless it holds
/// one already: 503 when the queue is full or `queue_timeout` passes.
///
/// Every codec calls this at the same point of an exchange: after the part of the request
/// body read before anything goes upstream ([`body_buffering`]; a search job's whole body),
/// so a slow sender holds no slot, and before the search job, the cache fill (a collapsed
/// follower included: it is a request in flight on the route) or the first attempt. The
/// slot is held until the answer is complete; a fill that lets the request go upstream
/// hands its slot on to the forward, which does not take a second one.
/// A sampled exchange's wait for the slot is its `queue wait` span.
pub(crate) async fn hold_slot(
    limit: &Option<Arc<ConcurrencyLimit>>,
    held: &mut Slot,
    trace: Option<&crate::otel::TraceRef>,
) -> Result<(), ProxyError> {
    let (Some(l), None) = (limit, held.as_ref()) else {
        return Ok(());
    };
    let span = trace::queue(trace, limit, held);
    let r = match l.admit_owned().await {
        Ok(admission) => {
            *held = Some(admission);
            Ok(())
        }
        Err(_) => Err(ProxyError::downstream(ErrorKind::Overloaded)),
    };
    if let (Some(t), Some(span)) = (trace, span) {
        trace::queued(t, span, &r);
    }
    r
}

/// The `on_response` phase: what the route's response rules and the hooks do to a response
/// with `status`. `None` when nothing does anything (no rules, no hooks).
pub(crate) fn on_response<'c>(
    worker: &Worker,
    record: &'c mut Record,
    status: u16,
) -> Option<edit::ResponseView<'c>> {
    let hooks = match (worker.shared.hooks.as_ref(), record.ctx.as_deref_mut()) {
        (Some(hooks), Some(ctx)) => {
            hooks.on_response(status, ctx);
            Some(&ctx.response_headers[..])
        }
        _ => None,
    };
    if hooks.is_none() && record.edit.is_none() {
        return None;
    }
    Some(edit::ResponseView {
        edit: record.edit.as_ref(),
        hooks: hooks.unwrap_or(&[]),
        backend: record.backend.as_ref(),
    })
}

/// `early_hints`: the Link fields remembered for the path of `t` (the last 200 answer's
/// preload and preconnect links), for the codec to send as a `103 Early Hints` before the
/// upstream is asked. `None` off the route option, or when nothing is remembered.
pub(crate) fn early_hints(
    gen: &crate::worker::Generation,
    t: &ProxyTarget,
) -> Option<Vec<http::HeaderValue>> {
    let key = t.hints.as_deref()?;
    gen.hints.borrow_mut().get(key)
}

/// `early_hints`: once the upstream's response head is known, a 200's Link field values
/// (`links`) become what the path's next request is hinted with.
pub(crate) fn learn_early_hints<'h>(
    gen: &crate::worker::Generation,
    t: &ProxyTarget,
    status: u16,
    links: impl Iterator<Item = &'h [u8]>,
) {
    if let (Some(key), 200) = (t.hints.as_deref(), status) {
        gen.hints.borrow_mut().learn(key, links);
    }
}

/// An unsafe request's cache invalidation (RFC 9111 4.4), once the upstream's response head
/// is known: `field` finds its `Location` and `Content-Location`. Nothing when the request
/// invalidates nothing.
pub(crate) fn invalidate<'h>(
    record: &mut Record,
    status: u16,
    field: impl Fn(&str) -> Option<&'h [u8]>,
) {
    if let Some(p) = record.invalidate.take() {
        p.done(status, field("location"), field("content-location"));
    }
}

/// [`invalidate`] for a response head as a header map.
pub(crate) fn invalidate_map(record: &mut Record, status: u16, headers: &http::HeaderMap) {
    if record.invalidate.is_some() {
        invalidate(record, status, |n| headers.get(n).map(|v| v.as_bytes()));
    }
}

/// A static answer (a file route's, or veloxy's own) with its body replaced by the route's
/// error page for its status, if it has one.
pub(crate) fn with_error_page(
    record: &Record,
    r: crate::static_files::Response,
) -> crate::static_files::Response {
    match error_page(record, r.status) {
        None => r,
        Some(page) => {
            let head_only = matches!(r.body, crate::static_files::Body::Empty)
                && r.headers
                    .iter()
                    .any(|(n, v)| *n == "content-length" && &v[..] != b"0");
            Answer::page(r.status, page).into_response(head_only)
        }
    }
}

/// The route's error page for `status`, if it has one.
pub(crate) fn error_page(record: &Record, status: u16) -> Option<&crate::rules::ErrorPage> {
    if status < 400 {
        return None;
    }
    record.edit.as_ref()?.rules.as_ref()?.error_page(status)
}
