//! The exchange's side of tracing (`[server.tracing]`, [`crate::otel`]): the sampling decision
//! at admission with the exchange span's request attributes, and the spans of its steps
//! (forward_auth, the queue for the route's concurrency slot, each upstream attempt). Every
//! function here runs only for a sampled exchange (or, for [`admit`], with tracing on).

use opentelemetry::KeyValue;

use super::{Head, Peer, Record};
use crate::otel::{Incoming, Phase, Trace};
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
        traceparent: head.fields.get("traceparent"),
        tracestate: head.fields.get("tracestate"),
    };
    let name = || format!("{} {}", head.method, route.path);
    let Some(t) = crate::otel::start(settings, exporter, ratio, incoming, record.started, name)
    else {
        return;
    };
    let host = std::str::from_utf8(head.host).unwrap_or("");
    let (address, port) = split_host(host, peer.server_port);
    let version = match head.version {
        0 => "1.0",
        1 => "1.1",
        2 => "2",
        _ => "3",
    };
    t.set([
        KeyValue::new("http.request.method", head.method.to_owned()),
        KeyValue::new("url.path", head.path().to_owned()),
        KeyValue::new("url.scheme", if peer.tls { "https" } else { "http" }),
        KeyValue::new("http.route", route.path.clone()),
        KeyValue::new("server.address", address.to_owned()),
        KeyValue::new("server.port", i64::from(port)),
        KeyValue::new("client.address", client_ip.to_owned()),
        KeyValue::new("network.protocol.name", "http"),
        KeyValue::new("network.protocol.version", version),
    ]);
    if let Some(q) = head.target.split_once('?').map(|(_, q)| q) {
        t.set([KeyValue::new("url.query", q.to_owned())]);
    }
    record.trace = Some(t);
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

/// Names the current attempt in an HTTP/2 request's `traceparent` (a retry's request).
#[cold]
pub(crate) fn set_traceparent(t: &Trace, headers: &mut http::HeaderMap) {
    if headers.contains_key("traceparent") {
        if let Ok(v) = http::HeaderValue::try_from(t.traceparent()) {
            headers.insert("traceparent", v);
        }
    }
}

/// An event of the current upstream attempt: `connected` (with
/// `veloxy.connection.reused`: a pooled connection, or a new one whose time includes the
/// TCP connect and TLS handshake), `request sent`, `response head` (the time to first byte).
#[cold]
pub(crate) fn event(t: &Trace, name: &'static str, reused: Option<bool>) {
    let attributes = reused
        .map(|r| vec![KeyValue::new("veloxy.connection.reused", r)])
        .unwrap_or_default();
    t.event(name, attributes);
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
    let mut attributes = vec![KeyValue::new("veloxy.backend", backend.to_string())];
    if resend > 0 {
        attributes.push(KeyValue::new(
            "http.request.resend_count",
            i64::from(resend),
        ));
        attributes.push(KeyValue::new("veloxy.retry", true));
    }
    let error = match end {
        AttemptEnd::Status(s) => {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(s)));
            (s >= 500).then(|| s.to_string())
        }
        AttemptEnd::Failed(e) => Some(error_type(e)),
        AttemptEnd::Fatal(crate::error::Side::Upstream) => Some("upstream".to_owned()),
        AttemptEnd::Fatal(_) => Some("downstream".to_owned()),
    };
    t.end(phase, attributes, error);
}

/// `error.type` for a failure: the error kind's name, as the metrics label it.
pub(crate) fn error_type(e: &crate::error::ProxyError) -> String {
    format!("{:?}", e.kind)
        .split(['(', ' ', '{'])
        .next()
        .unwrap_or("error")
        .to_owned()
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
    t.set([KeyValue::new("veloxy.cache.status", status)]);
}

/// Records forward_auth's span: whether the auth service let the request pass.
#[cold]
pub(super) fn forward_auth(
    t: &Trace,
    phase: Phase,
    outcome: &Result<super::forward_auth::Outcome, crate::error::ProxyError>,
) {
    use super::forward_auth::Outcome;
    let (attributes, error) = match outcome {
        Ok(Outcome::Pass(_)) => (
            vec![KeyValue::new("veloxy.forward_auth.allowed", true)],
            None,
        ),
        Ok(Outcome::Deny(a)) => (
            vec![
                KeyValue::new("veloxy.forward_auth.allowed", false),
                KeyValue::new("http.response.status_code", i64::from(a.status)),
            ],
            None,
        ),
        Err(e) => (Vec::new(), Some(error_type(e))),
    };
    t.end(phase, attributes, error);
}

/// Starts the span of the wait for the route's concurrency slot, when the route has a limit
/// and the slot is not held yet.
pub(crate) fn queue(
    t: Option<&std::sync::Arc<Trace>>,
    limit: &Option<std::sync::Arc<crate::limits::ConcurrencyLimit>>,
    held: &super::Slot,
) -> Option<Phase> {
    match (t, limit, held) {
        (Some(t), Some(_), None) => Some(t.phase("queue wait")),
        _ => None,
    }
}

/// Ends the queue span [`queue`] started.
#[cold]
pub(crate) fn queued(t: &Trace, phase: Phase, r: &Result<(), crate::error::ProxyError>) {
    t.end(phase, Vec::new(), r.as_ref().err().map(error_type));
}
