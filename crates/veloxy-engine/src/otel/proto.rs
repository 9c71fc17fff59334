//! The OTLP `ExportTraceServiceRequest` protobuf, written straight from the compact span
//! records ([`super::span`]) into one reused buffer.
//!
//! Hand-written rather than through `opentelemetry-proto`'s prost types: those hold every id
//! as a `Vec<u8>` and every attribute as a `KeyValue` with `String` key and value, so
//! building them costs some twenty allocations per span on the exporter thread, on top of
//! the encoding. The few messages OTLP traces need (field numbers from
//! `opentelemetry/proto/{collector/trace,trace,common,resource}/v1/*.proto`) are written
//! here with no allocation beyond the buffer's growth. A nested message reserves one byte
//! for its length and moves its body when the length needs more (a body of 128 bytes or
//! more: a server span, and the batch's two outer messages once per request).

use super::span::{Child, ErrorType, Server, Spans, Step};

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `Span.SpanKind`.
const KIND_INTERNAL: u64 = 1;
const KIND_SERVER: u64 = 2;
const KIND_CLIENT: u64 = 3;
/// `Status.StatusCode.STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;
/// `SpanFlags`: sampled, and "the context knows whether the parent is remote".
const FLAGS: u32 = 0x01 | 0x100;
/// `SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
const FLAG_REMOTE: u32 = 0x200;

/// A protobuf writer over a byte buffer.
pub(crate) struct Writer<'a> {
    buf: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn tag(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, v: &[u8]) {
        self.tag(field, LEN);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    fn string(&mut self, field: u32, v: &str) {
        self.bytes(field, v.as_bytes());
    }

    fn uint(&mut self, field: u32, v: u64) {
        self.tag(field, VARINT);
        self.varint(v);
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        self.tag(field, FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn fixed32(&mut self, field: u32, v: u32) {
        self.tag(field, FIXED32);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A nested message `field`, its body written by `body`.
    fn message(&mut self, field: u32, body: impl FnOnce(&mut Self)) {
        self.tag(field, LEN);
        let at = self.buf.len();
        self.buf.push(0);
        body(self);
        let len = self.buf.len() - at - 1;
        if len < 0x80 {
            self.buf[at] = len as u8;
            return;
        }
        let mut prefix = [0u8; 10];
        let mut n = 0;
        let mut v = len as u64;
        while v >= 0x80 {
            prefix[n] = (v as u8) | 0x80;
            v >>= 7;
            n += 1;
        }
        prefix[n] = v as u8;
        n += 1;
        let end = self.buf.len();
        self.buf.resize(end + n - 1, 0);
        self.buf.copy_within(at + 1..end, at + n);
        self.buf[at..at + n].copy_from_slice(&prefix[..n]);
    }

    /// A `KeyValue` attribute (`field`) with a string value.
    fn attr_str(&mut self, field: u32, key: &str, v: &str) {
        self.message(field, |w| {
            w.string(1, key);
            w.message(2, |w| w.string(1, v));
        });
    }

    /// A `KeyValue` attribute with an integer value.
    fn attr_int(&mut self, field: u32, key: &str, v: i64) {
        self.message(field, |w| {
            w.string(1, key);
            w.message(2, |w| w.uint(3, v as u64));
        });
    }

    /// A `KeyValue` attribute with a boolean value.
    fn attr_bool(&mut self, field: u32, key: &str, v: bool) {
        self.message(field, |w| {
            w.string(1, key);
            w.message(2, |w| w.uint(2, u64::from(v)));
        });
    }
}

/// The resource every span of an exporter shares: `service.name` and the configured
/// attributes.
pub(crate) struct Resource<'a> {
    pub service_name: &'a str,
    pub attributes: &'a [(String, String)],
}

/// Appends an `ExportTraceServiceRequest` carrying `batch` to `out`.
pub(crate) fn encode(out: &mut Vec<u8>, resource: &Resource, batch: &[Spans]) {
    let mut w = Writer { buf: out };
    // ExportTraceServiceRequest.resource_spans
    w.message(1, |w| {
        // ResourceSpans.resource
        w.message(1, |w| {
            w.attr_str(1, "service.name", resource.service_name);
            for (k, v) in resource.attributes {
                w.attr_str(1, k, v);
            }
        });
        // ResourceSpans.scope_spans
        w.message(2, |w| {
            w.message(1, |w| {
                w.string(1, "veloxy");
                w.string(2, env!("CARGO_PKG_VERSION"));
            });
            for spans in batch {
                for child in &spans.children {
                    w.message(2, |w| child_span(w, spans, child));
                }
                w.message(2, |w| server_span(w, spans));
            }
        });
    });
}

/// The fields every span of an exchange has: ids, trace state, parent, flags, name, kind
/// and times.
#[allow(clippy::too_many_arguments)]
fn common(
    w: &mut Writer,
    s: &Spans,
    id: u64,
    parent: u64,
    name: (&str, &str),
    kind: u64,
    (start, end): (u64, u64),
) {
    w.bytes(1, &s.trace_id.to_be_bytes());
    w.bytes(2, &id.to_be_bytes());
    if let Some(state) = &s.state {
        w.string(3, state);
    }
    if parent != 0 {
        w.bytes(4, &parent.to_be_bytes());
    }
    let remote = parent != 0 && parent == s.parent;
    w.fixed32(16, if remote { FLAGS | FLAG_REMOTE } else { FLAGS });
    // The name, in up to two parts joined by a space, without joining them in memory.
    w.tag(5, LEN);
    let len = name.0.len()
        + if name.1.is_empty() {
            0
        } else {
            1 + name.1.len()
        };
    w.varint(len as u64);
    w.buf.extend_from_slice(name.0.as_bytes());
    if !name.1.is_empty() {
        w.buf.push(b' ');
        w.buf.extend_from_slice(name.1.as_bytes());
    }
    w.uint(6, kind);
    w.fixed64(7, s.wall + start);
    w.fixed64(8, s.wall + end);
}

/// A span's `Status`: an error with its type as the message (nothing when unset).
fn status(w: &mut Writer, error: Option<&ErrorType>) {
    if let Some(e) = error {
        let mut buf = [0; 5];
        let text = e.as_str(&mut buf);
        w.attr_str(9, "error.type", text);
        w.message(15, |w| {
            w.string(2, text);
            w.uint(3, STATUS_ERROR);
        });
    }
}

fn server_span(w: &mut Writer, s: &Spans) {
    let a: &Server = &s.server;
    if let Some(bytes) = a.stream {
        return stream_span(w, s, bytes);
    }
    let route = a.route.as_str();
    let kind = KIND_SERVER;
    common(
        w,
        s,
        s.span_id,
        s.parent,
        (a.method.as_str(), route),
        kind,
        (0, s.end),
    );
    w.attr_str(9, "http.request.method", a.method.as_str());
    w.attr_str(9, "url.path", a.path.as_str());
    w.attr_str(9, "url.scheme", if a.tls { "https" } else { "http" });
    w.attr_str(9, "http.route", route);
    w.attr_str(9, "server.address", a.host.as_str());
    w.attr_int(9, "server.port", i64::from(a.port));
    w.attr_str(9, "client.address", a.client.as_str());
    w.attr_str(9, "network.protocol.name", "http");
    w.attr_str(9, "network.protocol.version", a.version());
    if let Some(q) = &a.query {
        w.attr_str(9, "url.query", q);
    }
    if let Some(c) = a.cache {
        w.attr_str(9, "veloxy.cache.status", c);
    }
    if let Some(b) = &a.backend {
        backend(w, b);
    }
    if a.status != 0 {
        w.attr_int(9, "http.response.status_code", i64::from(a.status));
    }
    status(w, a.error.as_ref());
}

/// An L4 stream's connection: `TCP LISTENER`, the transport, the client, the backend and
/// the bytes each way.
fn stream_span(w: &mut Writer, s: &Spans, (received, sent): (u64, u64)) {
    let a: &Server = &s.server;
    let listener = a.route.as_str();
    common(
        w,
        s,
        s.span_id,
        s.parent,
        ("TCP", listener),
        KIND_SERVER,
        (0, s.end),
    );
    w.attr_str(9, "network.transport", "tcp");
    w.attr_str(9, "veloxy.listener", listener);
    w.attr_int(9, "server.port", i64::from(a.port));
    w.attr_str(9, "client.address", a.client.as_str());
    w.attr_int(9, "veloxy.stream.bytes_received", received as i64);
    w.attr_int(9, "veloxy.stream.bytes_sent", sent as i64);
    if let Some(b) = &a.backend {
        backend(w, b);
    }
    status(w, a.error.as_ref());
}

/// `veloxy.backend`: the backend's address as the config and the access log write it.
fn backend(w: &mut Writer, b: &crate::upstream::addr::BackendAddr) {
    use std::io::Write as _;
    // An address fits the stack buffer; a longer unix path is cut (it is a label).
    let mut buf = [0u8; 128];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(cur, "{b}");
    let n = cur.position() as usize;
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    w.attr_str(9, "veloxy.backend", text);
}

fn child_span(w: &mut Writer, s: &Spans, c: &Child) {
    let kind = match c.step {
        Step::Attempt => KIND_CLIENT,
        _ => KIND_INTERNAL,
    };
    common(
        w,
        s,
        c.id,
        s.span_id,
        (c.step.name(), ""),
        kind,
        (c.start, c.end),
    );
    if let Some(b) = &c.backend {
        backend(w, b);
    }
    if c.resend > 0 {
        w.attr_int(9, "http.request.resend_count", i64::from(c.resend));
        w.attr_bool(9, "veloxy.retry", true);
    }
    if let Some(allowed) = c.allowed {
        w.attr_bool(9, "veloxy.forward_auth.allowed", allowed);
    }
    if c.status != 0 {
        w.attr_int(9, "http.response.status_code", i64::from(c.status));
    }
    for e in c.events.iter() {
        // Span.events: Event { time_unix_nano = 1, name = 2, attributes = 3 }
        w.message(11, |w| {
            w.fixed64(1, s.wall + e.at);
            w.string(2, e.name.name());
            if let Some(r) = e.reused {
                w.attr_bool(3, "veloxy.connection.reused", r);
            }
        });
    }
    status(w, c.error.as_ref());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_of_every_size() {
        for len in [0usize, 1, 127, 128, 300, 16_383, 16_384, 70_000] {
            let mut out = Vec::new();
            let mut w = Writer { buf: &mut out };
            let body = vec![7u8; len];
            w.message(1, |w| w.buf.extend_from_slice(&body));
            // tag, varint length, body
            assert_eq!(out[0], 0x0a);
            let (mut v, mut i, mut shift) = (0u64, 1, 0);
            loop {
                let b = out[i];
                v |= u64::from(b & 0x7f) << shift;
                i += 1;
                shift += 7;
                if b < 0x80 {
                    break;
                }
            }
            assert_eq!(v as usize, len);
            assert_eq!(&out[i..], &body[..]);
        }
    }
}
