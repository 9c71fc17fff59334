//! OpenTelemetry tracing (`[server.tracing]`): a span per sampled exchange, its phases as
//! child spans, W3C trace context read from the client and written upstream, and the finished
//! spans exported over OTLP by one thread off the workers ([`export`]).
//!
//! Sampling is decided once, at admission ([`start`]): a client's `traceparent` is continued
//! when `trust_incoming` (its sampled flag decides when `parent_based`), otherwise
//! `sample_ratio` decides with the worker thread's own random generator. Only a sampled
//! exchange carries a [`Trace`] (in its record); an unsampled one costs the `Option` check,
//! and with `[server.tracing]` absent nothing at all is looked at.
//!
//! A sampled exchange's spans are compact records ([`span`]): integer ids, nanosecond
//! offsets from one wall clock reading, enum names, typed attribute values and short texts
//! copied inline. The [`Trace`] holding them is shared by the exchange's parts on its one
//! worker thread (an `Rc` with `Cell`/`RefCell` inside: no lock, no atomic). When the exchange
//! ends ([`Trace::finish`]) its [`span::Spans`] move whole into the worker's batch, which is
//! handed to the exporter's bounded queue; the exporter thread encodes the OTLP protobuf
//! straight from them ([`proto`]). A full queue drops them and counts
//! `veloxy_tracing_spans_dropped_total`.
//!
//! The `opentelemetry` SDK crates are not used: their data model (`SpanData`, `KeyValue` with
//! `String` values, an SDK-to-protobuf conversion) cost about 3.5 us of worker time and
//! 2.7 us of exporter time per exchange at `sample_ratio = 1.0` (48% more CPU per request
//! than tracing off), where this design allocates two small blocks per exchange.

#[cfg(test)]
mod cost;
pub(crate) mod export;
pub(crate) mod proto;
mod send;
pub(crate) mod span;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

pub(crate) use export::Exporter;
use span::{Child, Event, EventName, Events, HexIds, Server, Spans, Step};

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

/// How the parts of a sampled exchange hold its trace (all on its worker thread).
pub(crate) type TraceRef = Rc<Trace>;

/// A sampled exchange's trace: its ids, and the spans finished so far.
pub(crate) struct Trace {
    pub trace_id: u128,
    /// The exchange's own (server) span.
    pub span_id: u64,
    /// When the exchange started: span times are offsets from it.
    start: Instant,
    /// The span id of the current upstream attempt; before the first, the id the first
    /// takes (written in the upstream request's `traceparent` at admission).
    attempt: Cell<u64>,
    /// Attempts started so far.
    attempts: Cell<u32>,
    /// Events of the current upstream attempt (connected, request sent, response head).
    events: RefCell<Events>,
    /// The server span's attributes and the finished child spans.
    spans: RefCell<Spans>,
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
) -> Option<TraceRef> {
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
        Some((t, s, _)) => (t, s, incoming.tracestate.and_then(parse_state)),
        None => (new_trace_id(), 0, None),
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let span_id = new_span_id();
    Some(Rc::new(Trace {
        trace_id,
        span_id,
        start: started,
        attempt: Cell::new(new_span_id()),
        attempts: Cell::new(0),
        events: RefCell::default(),
        spans: RefCell::new(Spans {
            trace_id,
            span_id,
            parent: parent_id,
            state,
            wall: now.saturating_sub(started.elapsed().as_nanos() as u64),
            ..Spans::default()
        }),
        exporter: exporter.clone(),
    }))
}

/// Members a `tracestate` may have (W3C Trace Context).
const MAX_STATE_MEMBERS: usize = 32;

/// A `tracestate` value, normalized (members trimmed, empty ones left out); `None` when it
/// is empty or malformed (it is then not forwarded).
fn parse_state(v: &[u8]) -> Option<Box<str>> {
    let v = std::str::from_utf8(v).ok()?;
    let key_ok = |k: &str| {
        !k.is_empty()
            && k.len() <= 256
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/@".contains(&b))
    };
    let value_ok = |v: &str| {
        !v.is_empty()
            && v.len() <= 256
            && !v.ends_with(' ')
            && v.bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
    };
    let mut out = String::with_capacity(v.len());
    let mut n = 0;
    for m in v.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let (k, val) = m.split_once('=')?;
        if !key_ok(k) || !value_ok(val) {
            return None;
        }
        n += 1;
        if n > MAX_STATE_MEMBERS {
            return None;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(m);
    }
    (!out.is_empty()).then(|| out.into_boxed_str())
}

/// A W3C `traceparent` (version 00, or a later version read as 00): trace id, parent span
/// id, sampled flag. Invalid ids (all zeros) and malformed values give `None`.
pub(crate) fn parse_traceparent(v: &[u8]) -> Option<(u128, u64, bool)> {
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
    if !(lower(trace) && lower(span) && lower(flags) && lower(version)) {
        return None;
    }
    let t = u128::from_str_radix(trace, 16).ok()?;
    let s = u64::from_str_radix(span, 16).ok()?;
    let f = u8::from_str_radix(flags, 16).ok()?;
    (t != 0 && s != 0).then_some((t, s, f & 1 == 1))
}

fn new_trace_id() -> u128 {
    loop {
        let id = fastrand::u128(..);
        if id != 0 {
            return id;
        }
    }
}

fn new_span_id() -> u64 {
    loop {
        let id = fastrand::u64(..);
        if id != 0 {
            return id;
        }
    }
}

/// A phase's span being timed: made when it starts, recorded by [`Trace::end`].
pub(crate) struct Phase {
    id: u64,
    step: Step,
    start: Instant,
}

/// `00-` + 32 + `-` + 16 + `-01`.
const TRACEPARENT_LEN: usize = 55;

impl Trace {
    fn offset(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_nanos() as u64
    }

    /// The `traceparent` line (`traceparent: 00-...\r\n`) and `tracestate` for the upstream
    /// request, naming the first attempt's span as the parent.
    pub(crate) fn upstream_lines(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"traceparent: ");
        out.extend_from_slice(&self.traceparent());
        out.extend_from_slice(b"\r\n");
        if let Some(state) = &self.spans.borrow().state {
            out.extend_from_slice(b"tracestate: ");
            out.extend_from_slice(state.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The `traceparent` value naming the current upstream attempt's span.
    pub(crate) fn traceparent(&self) -> [u8; TRACEPARENT_LEN] {
        let mut v = *b"00-________________________________-________________-01";
        span::hex(&self.trace_id.to_be_bytes(), &mut v[3..35]);
        span::hex(&self.attempt.get().to_be_bytes(), &mut v[36..52]);
        v
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
            span::hex(&self.attempt.get().to_be_bytes(), span);
        }
    }

    /// The trace id and the exchange's span id, as the access log writes them.
    pub(crate) fn ids(&self) -> HexIds {
        HexIds::new(self.trace_id, self.span_id)
    }

    /// Sets attributes of the exchange's span.
    pub(crate) fn server(&self, set: impl FnOnce(&mut Server)) {
        set(&mut self.spans.borrow_mut().server);
    }

    /// Starts a child span of the exchange's (internal).
    pub(crate) fn phase(&self, step: Step) -> Phase {
        Phase {
            id: new_span_id(),
            step,
            start: Instant::now(),
        }
    }

    /// Starts an upstream attempt's span (a client span) and makes it the current attempt:
    /// the first takes the id the upstream request's `traceparent` names at admission, a
    /// retry a new one (its request's `traceparent` is rewritten: [`Self::patch_head`],
    /// [`Self::traceparent`]).
    pub(crate) fn attempt(&self) -> Phase {
        let n = self.attempts.get();
        self.attempts.set(n + 1);
        if n > 0 {
            self.attempt.set(new_span_id());
        }
        Phase {
            id: self.attempt.get(),
            step: Step::Attempt,
            start: Instant::now(),
        }
    }

    /// Records a finished phase; `set` fills its attributes. An attempt takes the events
    /// recorded since it started.
    pub(crate) fn end(&self, p: Phase, set: impl FnOnce(&mut Child)) {
        let mut child = Child {
            id: p.id,
            step: p.step,
            start: self.offset(p.start),
            end: self.offset(Instant::now()),
            backend: None,
            resend: 0,
            status: 0,
            allowed: None,
            error: None,
            events: match p.step {
                Step::Attempt => self.events.take(),
                _ => Events::default(),
            },
        };
        set(&mut child);
        self.spans.borrow_mut().children.push(child);
    }

    /// Records an event of the current upstream attempt, now.
    pub(crate) fn event(&self, name: EventName, reused: Option<bool>) {
        let at = self.offset(Instant::now());
        self.events.borrow_mut().push(Event { name, at, reused });
    }

    /// Ends the exchange's span (`status` 0: nothing was answered) and hands every span to
    /// the exporter (drops are counted there).
    pub(crate) fn finish(&self, status: u16) {
        let mut spans = self.spans.take();
        spans.end = self.offset(Instant::now());
        spans.server.status = status;
        spans.server.error = match status {
            0 => Some(span::ErrorType::Static("incomplete")),
            s if s >= 500 => Some(span::ErrorType::Status(s)),
            _ => None,
        };
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

    fn sample(s: &TracingSettings, parent: Option<&[u8]>) -> Option<TraceRef> {
        let exporter = Arc::new(Exporter::start(s).unwrap());
        let incoming = Incoming {
            traceparent: parent,
            tracestate: Some(b"a=1,b=2"),
        };
        start(s, &exporter, None, incoming, Instant::now())
    }

    #[test]
    fn sampling_decisions() {
        assert!(sample(&settings(0.0, true, true), None).is_none());
        assert!(sample(&settings(1.0, true, true), None).is_some());
        // parent_based: the client's flag decides, whatever the ratio.
        let t = sample(&settings(0.0, true, true), Some(PARENT)).unwrap();
        assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(t.spans.borrow().parent, 0x00f067aa0ba902b7);
        assert_eq!(t.spans.borrow().state.as_deref(), Some("a=1,b=2"));
        assert!(sample(&settings(1.0, true, true), Some(UNSAMPLED)).is_none());
        // Not parent_based: the ratio decides, the trace is still continued.
        let t = sample(&settings(1.0, false, true), Some(UNSAMPLED)).unwrap();
        assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        // Not trusted: a new trace, no parent, no state.
        let t = sample(&settings(1.0, true, false), Some(PARENT)).unwrap();
        assert_ne!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(t.spans.borrow().parent, 0);
        assert_eq!(t.spans.borrow().state, None);
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
                "traceparent: 00-{:032x}-{:016x}-01\r\n",
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
                "traceparent: 00-{:032x}-{:016x}-01\r\n",
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
        assert_eq!(t, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(s, 0x00f067aa0ba902b7);
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
