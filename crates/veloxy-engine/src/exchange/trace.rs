//! The exchange's side of tracing (`[server.tracing]`, [`crate::otel`]): the sampling decision
//! at admission with the exchange span's request attributes, and the spans of its steps
//! (forward_auth, the queue for the route's concurrency slot, each upstream attempt). Every
//! function here runs only for a sampled exchange (or, for [`admit`], with tracing on).

use super::{Head, Peer, Record};
use crate::otel::span::{ErrorType, EventName, Step, Text};
use crate::otel::{Incoming, Phase, Trace, TraceRef};
use crate::rules::RouteTracing;

/// Admission with `[server.tracing]` on: decides whether the exchange is sampled (the route's
/// `tracing`, the client's `traceparent`, the ratio) and starts its trace.
#[cold]
pub(super) fn admit(
    snapshot: &crate::config::Snapshot,
    route: &crate::router::Route,
    head: &Head,
    peer: &Peer,
    client_ip: &str,
    record: &mut Record,
) {
    let Some(settings) = &snapshot.settings.tracing else {
        return;
    };
    let ratio = match route.rules.as_ref().and_then(|r| r.tracing) {
        Some(RouteTracing::Off) => return,
        Some(RouteTracing::Ratio(r)) => Some(r),
        None => None,
    };
    let Some(exporter) = snapshot.live.tracer.as_ref().and_then(|l| l.try_get()) else {
        return;
    };
    let incoming = Incoming {
        field: |name: &str| head.fields.get(name),
    };
    let Some(t) = crate::otel::start(settings, exporter, ratio, incoming, record.started) else {
        return;
    };
    let host = std::str::from_utf8(head.host).unwrap_or("");
    let (address, port) = split_host(host, peer.server_port);
    t.server(|s| {
        s.method = Text::new(head.method);
        s.path = Text::new(head.path());
        s.query = head.target.split_once('?').map(|(_, q)| q.into());
        s.tls = peer.tls;
        s.route = Text::new(&route.path);
        s.host = Text::new(address);
        s.port = port;
        s.client = Text::new(client_ip);
        s.version = head.version.min(3);
    });
    record.trace = Some(t);
}

/// An L4 stream connection with `[server.tracing]` on: sampled by the ratio alone (no
/// trace context travels in a byte stream), its span named after the listener.
#[cold]
pub(crate) fn stream(
    snapshot: &crate::config::Snapshot,
    listener: &str,
    peer: std::net::SocketAddr,
    local_port: u16,
    started: tokio::time::Instant,
) -> Option<TraceRef> {
    let settings = snapshot.settings.tracing.as_ref()?;
    let exporter = snapshot.live.tracer.as_ref()?.try_get()?;
    let incoming = Incoming {
        field: |_: &str| None,
    };
    let t = crate::otel::start(settings, exporter, None, incoming, started)?;
    t.server(|s| {
        s.method = Text::new("TCP");
        s.route = Text::new(listener);
        s.port = local_port;
        s.client = Text::new(&peer.ip().to_string());
        s.stream = Some((0, 0));
    });
    Some(t)
}

/// Ends a stream's span: the backend it was relayed to, the bytes each way.
#[cold]
pub(crate) fn stream_end(
    t: &Trace,
    backend: &crate::upstream::addr::BackendAddr,
    received: u64,
    sent: u64,
) {
    t.server(|s| {
        s.backend = Some(backend.clone());
        s.stream = Some((received, sent));
    });
    t.finish(0);
}

/// `host[:port]` (or `[v6]:port`) and the port (the listener's when none is given).
fn split_host(host: &str, default_port: u16) -> (&str, u16) {
    if let Some(rest) = host.strip_prefix('[') {
        if let Some((addr, after)) = rest.split_once(']') {
            let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
            return (addr, port.unwrap_or(default_port));
        }
    }
    match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p.parse().unwrap_or(default_port)),
        _ => (host, default_port),
    }
}

/// Names the current attempt in an HTTP/2 request's `traceparent` and `b3` (a retry's
/// request).
#[cold]
pub(crate) fn set_traceparent(t: &Trace, headers: &mut http::HeaderMap) {
    if headers.contains_key("traceparent") {
        if let Ok(v) = http::HeaderValue::from_bytes(&t.traceparent()) {
            headers.insert("traceparent", v);
        }
    }
    if headers.contains_key("b3") {
        if let Ok(v) = http::HeaderValue::from_bytes(&t.b3()) {
            headers.insert("b3", v);
        }
    }
}

/// An event of the current upstream attempt: `connected` (with
/// `veloxy.connection.reused`), `tls handshake`, `request sent`, `response head` (the time to
/// first byte).
#[cold]
pub(crate) fn event(t: &Trace, name: EventName, reused: Option<bool>) {
    t.event(name, reused);
}

/// The `connected` event of a connection: reused, or new; a new TLS one is `connected` when
/// its TCP connect completed and `tls handshake` when its handshake did (now).
#[cold]
pub(crate) fn connected(t: &Trace, conn: &crate::upstream::pool::UpstreamConn, reused: bool) {
    match conn.tcp_connected.filter(|_| !reused) {
        Some(tcp) => {
            t.event_at(EventName::Connected, tcp, Some(false));
            t.event(EventName::TlsHandshake, None);
        }
        None => t.event(EventName::Connected, Some(reused)),
    }
}

/// How an upstream attempt ended, for its span.
pub(crate) enum AttemptEnd<'a> {
    /// A response with this status.
    Status(u16),
    /// No response: what failed.
    Failed(&'a crate::error::ProxyError),
    /// The exchange ended on the attempt (the side that failed).
    Fatal(crate::error::Side),
}

/// Records an upstream attempt's span: the backend, the resend count (a retry), the status
/// or the error.
#[cold]
pub(crate) fn attempt(
    t: &Trace,
    phase: Phase,
    backend: &crate::upstream::addr::BackendAddr,
    resend: u32,
    end: AttemptEnd,
) {
    t.end(phase, |c| {
        c.backend = Some(backend.clone());
        c.resend = resend;
        c.error = match end {
            AttemptEnd::Status(s) => {
                c.status = s;
                (s >= 500).then_some(ErrorType::Status(s))
            }
            AttemptEnd::Failed(e) => Some(error_type(e)),
            AttemptEnd::Fatal(crate::error::Side::Upstream) => Some(ErrorType::Static("upstream")),
            AttemptEnd::Fatal(_) => Some(ErrorType::Static("downstream")),
        };
    });
}

/// `error.type` for a failure: the error kind's name, as the metrics label it.
pub(crate) fn error_type(e: &crate::error::ProxyError) -> ErrorType {
    let name = format!("{:?}", e.kind);
    let name = name.split(['(', ' ', '{']).next().unwrap_or("error");
    ErrorType::Kind(name.into())
}

/// `veloxy.cache.status` of a route that caches: `HIT` (a fresh hit, also one held for
/// forward_auth), `MISS` (a fill: the cache asks the backend, or joins a fill in flight),
/// `BYPASS` (the request is not one the cache answers).
#[cold]
pub(super) fn cache_status(t: &Trace, step: &super::admit::CacheStep) {
    use super::admit::CacheStep;
    let status = match step {
        CacheStep::Hit(_) | CacheStep::Held(_) => "HIT",
        CacheStep::Fill(_) => "MISS",
        CacheStep::Pass => return,
    };
    t.server(|s| s.cache = Some(status));
}

/// Records forward_auth's span: whether the auth service let the request pass.
#[cold]
pub(super) fn forward_auth(
    t: &Trace,
    phase: Phase,
    outcome: &Result<super::forward_auth::Outcome, crate::error::ProxyError>,
) {
    use super::forward_auth::Outcome;
    t.end(phase, |c| match outcome {
        Ok(Outcome::Pass(_)) => c.allowed = Some(true),
        Ok(Outcome::Deny(a)) => {
            c.allowed = Some(false);
            c.status = a.status;
        }
        Err(e) => c.error = Some(error_type(e)),
    });
}

/// Starts the span of the wait for the route's concurrency slot, when the route has a limit
/// and the slot is not held yet.
pub(crate) fn queue(
    t: Option<&TraceRef>,
    limit: &Option<std::sync::Arc<crate::limits::ConcurrencyLimit>>,
    held: &super::Slot,
) -> Option<Phase> {
    match (t, limit, held) {
        (Some(t), Some(_), None) => Some(t.phase(Step::QueueWait)),
        _ => None,
    }
}

/// Ends the queue span [`queue`] started.
#[cold]
pub(crate) fn queued(t: &Trace, phase: Phase, r: &Result<(), crate::error::ProxyError>) {
    t.end(phase, |c| c.error = r.as_ref().err().map(error_type));
}
