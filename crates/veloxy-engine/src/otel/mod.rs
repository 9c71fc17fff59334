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

mod b3;
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
    /// Propagation formats (`"tracecontext"`, `"b3"`), in the order a client's are read.
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
    /// The `propagate` formats written upstream ([`TRACECONTEXT`], [`B3`]).
    formats: u8,
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

/// What a sampling decision needs from the request: its fields by (lowercase) name.
pub(crate) struct Incoming<F> {
    pub field: F,
}

/// `propagate` formats, as bits.
const TRACECONTEXT: u8 = 1;
const B3: u8 = 2;

fn formats(settings: &TracingSettings) -> u8 {
    settings.propagate.iter().fold(0, |f, p| match p.as_str() {
        "tracecontext" => f | TRACECONTEXT,
        "b3" => f | B3,
        _ => f,
    })
}

/// A client's trace context: its trace and span ids, and its sampling decision (`None`:
/// deferred to veloxy). A B3 header may carry the decision alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Parent {
    pub ids: Option<(u128, u64)>,
    pub sampled: Option<bool>,
    /// Read from `traceparent` (so `tracestate` goes with it).
    pub w3c: bool,
}

/// The client's trace context in the first of the `propagate` formats it sent.
fn incoming<'a>(
    settings: &TracingSettings,
    field: impl Fn(&str) -> Option<&'a [u8]>,
) -> Option<Parent> {
    settings.propagate.iter().find_map(|p| match p.as_str() {
        "tracecontext" => field("traceparent")
            .and_then(parse_traceparent)
            .map(|(t, s, f)| Parent {
                ids: Some((t, s)),
                sampled: Some(f),
                w3c: true,
            }),
        "b3" => b3::read(&field),
        _ => None,
    })
}

/// Decides whether an exchange is sampled; `Some` with its trace when it is. `ratio`: the
/// route's own `sample_ratio`, if it has one.
pub(crate) fn start<'a>(
    settings: &TracingSettings,
    exporter: &Arc<Exporter>,
    ratio: Option<f64>,
    incoming: Incoming<impl Fn(&str) -> Option<&'a [u8]>>,
    started: Instant,
) -> Option<TraceRef> {
    let ratio = ratio.unwrap_or(settings.sample_ratio);
    let parent = match settings.trust_incoming {
        true => self::incoming(settings, &incoming.field),
        false => None,
    };
    let sampled = match parent.and_then(|p| p.sampled) {
        Some(flag) if settings.parent_based => flag,
        _ => ratio >= 1.0 || (ratio > 0.0 && fastrand::f64() < ratio),
    };
    if !sampled {
        return None;
    }
    let (trace_id, parent_id, state) = match parent {
        Some(Parent {
            ids: Some((t, s)),
            w3c,
            ..
        }) => {
            let state = w3c.then(|| (incoming.field)("tracestate")).flatten();
            (t, s, state.and_then(parse_state))
        }
        _ => (new_trace_id(), 0, None),
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let span_id = new_span_id();
    Some(Rc::new(Trace {
        trace_id,
        span_id,
        formats: formats(settings),
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
/// 32 + `-` + 16 + `-1`.
const B3_LEN: usize = 51;

impl Trace {
    fn offset(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_nanos() as u64
    }

    /// The trace context lines for the upstream request, naming the first attempt's span as
    /// the parent: `traceparent` (and `tracestate`) for `tracecontext`, `b3` for `b3`.
    pub(crate) fn upstream_lines(&self, out: &mut Vec<u8>) {
        if self.formats & TRACECONTEXT != 0 {
            out.extend_from_slice(b"traceparent: ");
            out.extend_from_slice(&self.traceparent());
            out.extend_from_slice(b"\r\n");
            if let Some(state) = &self.spans.borrow().state {
                out.extend_from_slice(b"tracestate: ");
                out.extend_from_slice(state.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
        if self.formats & B3 != 0 {
            out.extend_from_slice(b"b3: ");
            out.extend_from_slice(&self.b3());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Whether the client's field `name` is left out of the upstream request: veloxy writes
    /// its own context in that format.
    pub(crate) fn replaces(&self, name: &str) -> bool {
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        (self.formats & TRACECONTEXT != 0 && (is("traceparent") || is("tracestate")))
            || (self.formats & B3 != 0 && (is("b3") || b3::MULTI.iter().any(|m| is(m))))
    }

    /// The single `b3` value naming the current upstream attempt's span: `TRACE-SPAN-1`.
    pub(crate) fn b3(&self) -> [u8; B3_LEN] {
        let mut v = *b"________________________________-________________-1";
        span::hex(&self.trace_id.to_be_bytes(), &mut v[..32]);
        span::hex(&self.attempt.get().to_be_bytes(), &mut v[33..49]);
        v
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
        let head_end = memchr::memmem::find(buf, b"\r\n\r\n").unwrap_or(buf.len());
        let id = self.attempt.get().to_be_bytes();
        for (name, on) in [
            (&b"\r\ntraceparent: 00-"[..], TRACECONTEXT),
            (b"\r\nb3: ", B3),
        ] {
            if self.formats & on == 0 {
                continue;
            }
            let Some(at) = memchr::memmem::find(&buf[..head_end], name) else {
                continue;
            };
            // 32 hex digits of the trace id and a dash, then the 16 of the parent span id.
            let from = at + name.len() + 33;
            if let Some(span) = buf.get_mut(from..from + 16) {
                span::hex(&id, span);
            }
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
        self.event_at(name, Instant::now(), reused);
    }

    /// Records an event of the current upstream attempt that happened `at`.
    pub(crate) fn event_at(&self, name: EventName, at: Instant, reused: Option<bool>) {
        let at = self.offset(at);
        self.events.borrow_mut().push(Event { name, at, reused });
    }

    /// Ends the exchange's span (`status` 0: nothing was answered) and hands every span to
    /// the exporter (drops are counted there).
    pub(crate) fn finish(&self, status: u16) {
        let mut spans = self.spans.take();
        spans.end = self.offset(Instant::now());
        spans.server.status = status;
        spans.server.error = match status {
            // A stream that reached a backend; one that reached none is `incomplete`.
            0 if spans.server.stream.is_some() && spans.server.backend.is_some() => None,
            0 => Some(span::ErrorType::Static("incomplete")),
            s if s >= 500 => Some(span::ErrorType::Status(s)),
            _ => None,
        };
        self.exporter.send(spans);
    }
}

#[cfg(test)]
mod tests;
