//! OpenTelemetry tracing (`[server.tracing]`): a span per sampled exchange, its phases as
//! child spans, W3C trace context read from the client and written upstream, and the finished
//! spans exported over OTLP by one thread off the workers ([`export`]).
//!
//! Sampling is decided once, at admission ([`start`]): a client's `traceparent` is continued
//! when `trust_incoming` (its sampled flag decides when `parent_based`), otherwise
//! `sample_ratio` decides with the worker thread's own random generator. Only a sampled
//! exchange carries a [`Trace`] (in its record); an unsampled one costs the `Option` check,
//! and with `[server.tracing]` absent nothing at all is looked at. A sampled exchange's spans
//! are built as it goes and handed to the exporter's bounded queue when it ends
//! ([`Trace::finish`]); a full queue drops them and counts
//! `veloxy_tracing_spans_dropped_total`.

pub(crate) mod export;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use tokio::time::Instant;

pub(crate) use export::Exporter;

/// `[server.tracing]`, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector: `http://host:port` (OTLP/HTTP protobuf to `/v1/traces`) or
    /// `grpc://host:port` (OTLP/gRPC).
    pub otlp_endpoint: String,
    /// `service.name` of the resource. Default "veloxy".
    pub service_name: String,
    /// Head sampling for requests with no sampled parent. Default 0.01.
    pub sample_ratio: f64,
    /// Follow an incoming `traceparent`'s sampled flag. Default true.
    pub parent_based: bool,
    /// Continue a client's trace context. Default true.
    pub trust_incoming: bool,
    /// Propagation formats (`"tracecontext"`).
    pub propagate: Vec<String>,
    /// Resource attributes, in name order.
    pub resource: Vec<(String, String)>,
}

impl TracingSettings {
    /// What the exporter is made from: a change to any of it starts a new exporter on reload.
    pub(crate) fn exporter_key(&self) -> (&str, &str, &[(String, String)]) {
        (&self.otlp_endpoint, &self.service_name, &self.resource)
    }
}

/// A sampled exchange's trace: its ids, and the spans finished so far.
pub(crate) struct Trace {
    /// The exchange's span's name (`GET /api`: the method and the route's path).
    name: String,
    pub trace_id: TraceId,
    /// The exchange's own (server) span.
    pub span_id: SpanId,
    /// The client's span, when the trace continues the client's.
    parent: SpanId,
    state: TraceState,
    /// The wall clock at `start`, to turn the exchange's `Instant`s into times.
    wall: SystemTime,
    start: Instant,
    /// The span id of the current upstream attempt; before the first, the id the first
    /// takes (written in the upstream request's `traceparent` at admission).
    attempt: AtomicU64,
    /// Attempts started so far.
    attempts: AtomicU64,
    /// Finished child spans and the server span's attributes.
    spans: Mutex<Vec<SpanData>>,
    /// Events of the current upstream attempt (connected, request sent, response head).
    events: Mutex<Vec<opentelemetry::trace::Event>>,
    attributes: Mutex<Vec<KeyValue>>,
    exporter: Arc<Exporter>,
}

/// What a sampling decision needs from the request.
pub(crate) struct Incoming<'a> {
    pub traceparent: Option<&'a [u8]>,
    pub tracestate: Option<&'a [u8]>,
}

/// Decides whether an exchange is sampled; `Some` with its trace when it is. `ratio`: the
/// route's own `sample_ratio`, if it has one.
pub(crate) fn start(
    settings: &TracingSettings,
    exporter: &Arc<Exporter>,
    ratio: Option<f64>,
    incoming: Incoming,
    started: Instant,
    name: impl FnOnce() -> String,
) -> Option<Arc<Trace>> {
    let ratio = ratio.unwrap_or(settings.sample_ratio);
    let parent = match settings.trust_incoming {
        true => incoming.traceparent.and_then(parse_traceparent),
        false => None,
    };
    let sampled = match parent {
        Some((_, _, flag)) if settings.parent_based => flag,
        _ => ratio >= 1.0 || (ratio > 0.0 && fastrand::f64() < ratio),
    };
    if !sampled {
        return None;
    }
    let (trace_id, parent_id, state) = match parent {
        Some((t, s, _)) => {
            let state = incoming
                .tracestate
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| TraceState::from_key_value(parse_state(v)).ok())
                .unwrap_or_default();
            (t, s, state)
        }
        None => (new_trace_id(), SpanId::INVALID, TraceState::default()),
    };
    Some(Arc::new(Trace {
        name: name(),
        trace_id,
        span_id: new_span_id(),
        parent: parent_id,
        state,
        wall: SystemTime::now() - started.elapsed(),
        start: started,
        attempt: AtomicU64::new(u64::from_be_bytes(new_span_id().to_bytes())),
        attempts: AtomicU64::new(0),
        spans: Mutex::new(Vec::new()),
        events: Mutex::new(Vec::new()),
        attributes: Mutex::new(Vec::new()),
        exporter: exporter.clone(),
    }))
}

fn parse_state(v: &str) -> Vec<(String, String)> {
    v.split(',')
        .filter_map(|m| m.trim().split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A W3C `traceparent` (version 00, or a later version read as 00): trace id, parent span
/// id, sampled flag. Invalid ids (all zeros) and malformed values give `None`.
pub(crate) fn parse_traceparent(v: &[u8]) -> Option<(TraceId, SpanId, bool)> {
    let v = std::str::from_utf8(v).ok()?.trim();
    let mut parts = v.split('-');
    let version = parts.next()?;
    let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
    let exact = version == "00" && parts.next().is_none();
    if version.len() != 2 || version == "ff" || !(exact || version != "00") {
        return None;
    }
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let lower = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !(lower(trace) && lower(span) && lower(flags)) {
        return None;
    }
    let t = TraceId::from_hex(trace).ok()?;
    let s = SpanId::from_hex(span).ok()?;
    let f = u8::from_str_radix(flags, 16).ok()?;
    (t != TraceId::INVALID && s != SpanId::INVALID).then_some((t, s, f & 1 == 1))
}

fn new_trace_id() -> TraceId {
    loop {
        let id = fastrand::u128(..);
        if id != 0 {
            return TraceId::from_bytes(id.to_be_bytes());
        }
    }
}

fn new_span_id() -> SpanId {
    loop {
        let id = fastrand::u64(..);
        if id != 0 {
            return SpanId::from_bytes(id.to_be_bytes());
        }
    }
}

/// A phase's span being timed: made when it starts, recorded by [`Trace::end`].
pub(crate) struct Phase {
    id: SpanId,
    name: &'static str,
    start: Instant,
    kind: SpanKind,
}

impl Trace {
    /// The `traceparent` line (`traceparent: 00-...\r\n`) and `tracestate` for the upstream
    /// request, naming the first attempt's span as the parent.
    pub(crate) fn upstream_lines(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        let _ = write!(out, "traceparent: {}\r\n", self.traceparent());
        let state = self.state.header();
        if !state.is_empty() {
            let _ = write!(out, "tracestate: {state}\r\n");
        }
    }

    /// The `traceparent` value naming the current upstream attempt's span.
    pub(crate) fn traceparent(&self) -> String {
        let attempt = self.attempt.load(Ordering::Relaxed);
        format!("00-{}-{attempt:016x}-01", self.trace_id)
    }

    /// Rewrites the `traceparent` line of an HTTP/1.1 request head in `buf` (written by
    /// [`Self::upstream_lines`]; the body may follow the head) to name the current attempt:
    /// a retry sends the same head bytes under its own span. The id's width is fixed, so
    /// the bytes are overwritten in place.
    pub(crate) fn patch_head(&self, buf: &mut [u8]) {
        const NAME: &[u8] = b"\r\ntraceparent: 00-";
        let head_end = memchr::memmem::find(buf, b"\r\n\r\n").unwrap_or(buf.len());
        let Some(at) = memchr::memmem::find(&buf[..head_end], NAME) else {
            return;
        };
        // 32 hex digits of the trace id and a dash, then the 16 of the parent span id.
        let from = at + NAME.len() + 33;
        if let Some(span) = buf.get_mut(from..from + 16) {
            let id = format!("{:016x}", self.attempt.load(Ordering::Relaxed));
            span.copy_from_slice(id.as_bytes());
        }
    }

    /// The trace id and the exchange's span id, as the access log writes them.
    pub(crate) fn ids(&self) -> (String, String) {
        (self.trace_id.to_string(), self.span_id.to_string())
    }

    /// Starts a child span of the exchange's: `name`, internal.
    pub(crate) fn phase(&self, name: &'static str) -> Phase {
        Phase {
            id: new_span_id(),
            name,
            start: Instant::now(),
            kind: SpanKind::Internal,
        }
    }

    /// Starts an upstream attempt's span (a client span) and makes it the current attempt:
    /// the first takes the id the upstream request's `traceparent` names at admission, a
    /// retry a new one (its request's `traceparent` is rewritten: [`Self::patch_head`],
    /// [`Self::traceparent`]).
    pub(crate) fn attempt(&self) -> Phase {
        let id = match self.attempts.fetch_add(1, Ordering::Relaxed) {
            0 => self.attempt.load(Ordering::Relaxed),
            _ => {
                let id = u64::from_be_bytes(new_span_id().to_bytes());
                self.attempt.store(id, Ordering::Relaxed);
                id
            }
        };
        Phase {
            id: SpanId::from_bytes(id.to_be_bytes()),
            name: "upstream attempt",
            start: Instant::now(),
            kind: SpanKind::Client,
        }
    }

    /// Records a finished phase with its attributes; `error`: what failed (`error.type`).
    pub(crate) fn end(&self, p: Phase, mut attributes: Vec<KeyValue>, error: Option<String>) {
        let status = match error {
            Some(e) => {
                attributes.push(KeyValue::new("error.type", e.clone()));
                Status::error(e)
            }
            None => Status::Unset,
        };
        let name = Cow::Borrowed(p.name);
        let client = p.kind == SpanKind::Client;
        let mut span = self.span(
            p.id,
            self.span_id,
            p.kind,
            name,
            p.start,
            attributes,
            status,
        );
        if client {
            let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
            span.events.events = std::mem::take(&mut *events);
        }
        self.spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(span);
    }

    /// Records an event of the current upstream attempt, now.
    pub(crate) fn event(&self, name: &'static str, attributes: Vec<KeyValue>) {
        let at = self.wall + self.start.elapsed();
        let e = opentelemetry::trace::Event::new(name, at, attributes, 0);
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }

    /// Adds attributes to the exchange's span.
    pub(crate) fn set(&self, attributes: impl IntoIterator<Item = KeyValue>) {
        let mut a = self.attributes.lock().unwrap_or_else(|e| e.into_inner());
        a.extend(attributes);
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        id: SpanId,
        parent: SpanId,
        kind: SpanKind,
        name: Cow<'static, str>,
        start: Instant,
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        let at = |i: Instant| self.wall + i.saturating_duration_since(self.start);
        SpanData {
            span_context: SpanContext::new(
                self.trace_id,
                id,
                TraceFlags::SAMPLED,
                false,
                self.state.clone(),
            ),
            parent_span_id: parent,
            parent_span_is_remote: parent == self.parent && parent != SpanId::INVALID,
            span_kind: kind,
            name,
            start_time: at(start),
            end_time: at(Instant::now()),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: export::scope(),
        }
    }

    /// Ends the exchange's span (`status` 0: nothing was answered) and hands every span to
    /// the exporter (drops are counted there).
    pub(crate) fn finish(&self, status: u16) {
        let mut attributes =
            std::mem::take(&mut *self.attributes.lock().unwrap_or_else(|e| e.into_inner()));
        let error = match status {
            0 => Some("incomplete".to_owned()),
            s if s >= 500 => Some(s.to_string()),
            _ => None,
        };
        if status != 0 {
            attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        let status = match error {
            Some(e) => {
                if !attributes.iter().any(|a| a.key.as_str() == "error.type") {
                    attributes.push(KeyValue::new("error.type", e.clone()));
                }
                Status::error(e)
            }
            None => Status::Unset,
        };
        let server = self.span(
            self.span_id,
            self.parent,
            SpanKind::Server,
            Cow::Owned(self.name.clone()),
            self.start,
            attributes,
            status,
        );
        let mut spans = std::mem::take(&mut *self.spans.lock().unwrap_or_else(|e| e.into_inner()));
        spans.push(server);
        self.exporter.send(spans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ratio: f64, parent_based: bool, trust_incoming: bool) -> TracingSettings {
        TracingSettings {
            otlp_endpoint: "http://127.0.0.1:1".into(),
            service_name: "test".into(),
            sample_ratio: ratio,
            parent_based,
            trust_incoming,
            propagate: vec!["tracecontext".into()],
            resource: Vec::new(),
        }
    }

    const PARENT: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const UNSAMPLED: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

    fn sample(s: &TracingSettings, parent: Option<&[u8]>) -> Option<Arc<Trace>> {
        let exporter = Arc::new(Exporter::start(s).unwrap());
        let incoming = Incoming {
            traceparent: parent,
            tracestate: Some(b"a=1,b=2"),
        };
        start(s, &exporter, None, incoming, Instant::now(), || {
            "GET /".into()
        })
    }

    #[test]
    fn sampling_decisions() {
        assert!(sample(&settings(0.0, true, true), None).is_none());
        assert!(sample(&settings(1.0, true, true), None).is_some());
        // parent_based: the client's flag decides, whatever the ratio.
        let t = sample(&settings(0.0, true, true), Some(PARENT)).unwrap();
        assert_eq!(t.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent.to_string(), "00f067aa0ba902b7");
        assert_eq!(t.state.header(), "a=1,b=2");
        assert!(sample(&settings(1.0, true, true), Some(UNSAMPLED)).is_none());
        // Not parent_based: the ratio decides, the trace is still continued.
        let t = sample(&settings(1.0, false, true), Some(UNSAMPLED)).unwrap();
        assert_eq!(t.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        // Not trusted: a new trace, no parent, no state.
        let t = sample(&settings(1.0, true, false), Some(PARENT)).unwrap();
        assert_ne!(t.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent, SpanId::INVALID);
        assert_eq!(t.state.header(), "");
    }

    #[test]
    fn a_retry_rewrites_the_head_not_the_body() {
        let t = sample(&settings(1.0, true, true), Some(PARENT)).unwrap();
        let mut head = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        t.upstream_lines(&mut head);
        head.extend_from_slice(b"\r\n");
        let body = b"\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-01";
        head.extend_from_slice(body);
        let first = t.attempt();
        t.patch_head(&mut head);
        let text = String::from_utf8(head.clone()).unwrap();
        assert!(
            text.contains(&format!(
                "traceparent: 00-{}-{}-01\r\n",
                t.trace_id, first.id
            )),
            "{text}"
        );
        let second = t.attempt();
        assert_ne!(first.id, second.id);
        t.patch_head(&mut head);
        let text = String::from_utf8(head.clone()).unwrap();
        assert!(
            text.contains(&format!(
                "traceparent: 00-{}-{}-01\r\n",
                t.trace_id, second.id
            )),
            "{text}"
        );
        assert!(head.ends_with(body), "the body is not touched: {text}");
        assert!(text.contains("tracestate: a=1,b=2\r\n"), "{text}");
    }

    #[test]
    fn traceparent_parsing() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (t, s, sampled) = parse_traceparent(ok).unwrap();
        assert_eq!(t.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s.to_string(), "00f067aa0ba902b7");
        assert!(sampled);
        assert!(
            !parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .unwrap()
                .2
        );
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"garbage",
        ] {
            assert!(
                parse_traceparent(bad).is_none(),
                "{:?}",
                std::str::from_utf8(bad)
            );
        }
        // A later version may carry more fields.
        assert!(
            parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx")
                .is_some()
        );
    }
}
