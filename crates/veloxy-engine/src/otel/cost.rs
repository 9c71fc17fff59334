//! What tracing costs, counted: allocations (a counting global allocator for this test
//! binary, counting per thread) through the whole life of a proxied HTTP/1.1 exchange's
//! trace on its worker, and in the exporter thread's encoding of a batch.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use super::span::{Child, Event, EventName, Events, Step, Text};
use super::*;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Admission, the upstream request's trace context, one attempt with its three events, the
/// end, and the access log's ids.
fn exchange(s: &TracingSettings, exporter: &Arc<Exporter>, head: &mut Vec<u8>) {
    let incoming = Incoming {
        field: |n: &str| {
            (n == "traceparent")
                .then_some(&b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"[..])
        },
    };
    let t = start(s, exporter, None, incoming, Instant::now()).unwrap();
    t.server(|s| {
        s.method = Text::new("GET");
        s.path = Text::new("/api/items/42");
        s.query = None;
        s.route = Text::new("/api");
        s.host = Text::new("app.example.com");
        s.port = 80;
        s.client = Text::new("203.0.113.7");
        s.version = 1;
    });
    head.clear();
    head.extend_from_slice(b"GET /api/items/42 HTTP/1.1\r\nHost: app.example.com\r\n");
    t.upstream_lines(head);
    head.extend_from_slice(b"\r\n");
    let backend: crate::upstream::addr::BackendAddr = "127.0.0.1:8080".parse().unwrap();
    let phase = t.attempt();
    t.patch_head(head);
    t.event(EventName::Connected, Some(true));
    t.event(EventName::RequestSent, None);
    t.event(EventName::ResponseHead, None);
    t.end(phase, |c| {
        c.backend = Some(backend.clone());
        c.status = 200;
    });
    let _ = t.phase(Step::QueueWait);
    t.server(|s| s.backend = Some(backend));
    t.finish(200);
    let ids = t.ids();
    assert_eq!(ids.trace(), "4bf92f3577b34da6a3ce929d0e0e4736");
}

#[test]
fn a_sampled_exchange_allocates_twice() {
    let s = TracingSettings {
        otlp_endpoint: "http://127.0.0.1:1".into(),
        service_name: "test".into(),
        sample_ratio: 1.0,
        parent_based: true,
        trust_incoming: true,
        propagate: vec!["tracecontext".into()],
        resource: Vec::new(),
    };
    let exporter = Arc::new(Exporter::start(&s).unwrap());
    let mut head = Vec::with_capacity(1024);
    // The worker's batch grows in the first exchanges; count in the steady state.
    for _ in 0..8 {
        exchange(&s, &exporter, &mut head);
    }
    let before = allocations();
    let n = 16;
    for _ in 0..n {
        exchange(&s, &exporter, &mut head);
    }
    let per_exchange = (allocations() - before) as f64 / f64::from(n);
    // The Rc'd trace and its list of child spans; the batch's growth, shared by 64
    // exchanges, adds a fraction.
    assert!(
        per_exchange <= 2.5,
        "{per_exchange} allocations per exchange"
    );
}

/// The exporter thread encodes a batch into its reused buffer with no allocation.
#[test]
fn encoding_a_batch_allocates_nothing_once_the_buffer_is_grown() {
    let mut spans = Spans {
        trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736,
        span_id: 7,
        parent: 9,
        wall: 1_700_000_000_000_000_000,
        end: 1_000,
        ..Spans::default()
    };
    spans.server.method = Text::new("GET");
    spans.server.route = Text::new("/api");
    spans.server.path = Text::new("/api/items/42");
    spans.server.backend = Some("127.0.0.1:8080".parse().unwrap());
    spans.server.status = 502;
    spans.server.error = Some(span::ErrorType::Status(502));
    let mut events = Events::default();
    events.push(Event {
        name: EventName::Connected,
        at: 10,
        reused: Some(false),
    });
    spans.children.push(Child {
        id: 8,
        step: Step::Attempt,
        start: 5,
        end: 900,
        backend: spans.server.backend.clone(),
        resend: 1,
        status: 502,
        allowed: None,
        error: Some(span::ErrorType::Status(502)),
        events,
    });
    let batch = vec![spans; 256];
    let resource = proto::Resource {
        service_name: "edge",
        attributes: &[("deployment.environment".into(), "test".into())],
    };
    let mut buf = Vec::new();
    proto::encode(&mut buf, &resource, &batch);
    let size = buf.len();
    buf.clear();
    let before = allocations();
    proto::encode(&mut buf, &resource, &batch);
    assert_eq!(allocations() - before, 0);
    assert_eq!(buf.len(), size);
}
