//! Sampling, trace context parsing and propagation.

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
    sample_with(s, |n| match n {
        "traceparent" => parent,
        "tracestate" => Some(b"a=1,b=2"),
        _ => None,
    })
}

fn sample_with<'a>(
    s: &TracingSettings,
    field: impl Fn(&str) -> Option<&'a [u8]>,
) -> Option<TraceRef> {
    let exporter = Arc::new(Exporter::start(s).unwrap());
    start(s, &exporter, None, Incoming { field }, Instant::now())
}

#[test]
fn b3_is_read_and_written_when_listed() {
    let mut s = settings(0.0, true, true);
    s.propagate = vec!["b3".into()];
    let b3 = b"4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1";
    let t = sample_with(&s, |n| (n == "b3").then_some(&b3[..])).unwrap();
    assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
    assert_eq!(t.spans.borrow().parent, 0x00f067aa0ba902b7);
    let mut head = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    t.upstream_lines(&mut head);
    head.extend_from_slice(b"\r\n");
    let first = t.attempt();
    t.patch_head(&mut head);
    let text = String::from_utf8(head.clone()).unwrap();
    let want = format!("\r\nb3: {:032x}-{:016x}-1\r\n", t.trace_id, first.id);
    assert!(text.contains(&want), "{text}");
    assert!(!text.contains("traceparent"), "{text}");
    let second = t.attempt();
    t.patch_head(&mut head);
    let text = String::from_utf8(head).unwrap();
    let want = format!("\r\nb3: {:032x}-{:016x}-1\r\n", t.trace_id, second.id);
    assert!(text.contains(&want), "{text}");
    assert!(t.replaces("X-B3-TraceId") && t.replaces("b3"));
    assert!(!t.replaces("traceparent"));
    // b3's own decision: not sampled.
    let no = b"4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0";
    assert!(sample_with(&s, |n| (n == "b3").then_some(&no[..])).is_none());
    // Not listed: b3 is not read.
    let s = settings(0.0, true, true);
    assert!(sample_with(&s, |n| (n == "b3").then_some(&b3[..])).is_none());
    // Both listed: the first listed format the client sent wins.
    let mut s = settings(0.0, true, true);
    s.propagate = vec!["tracecontext".into(), "b3".into()];
    let t = sample_with(&s, |n| match n {
        "b3" => Some(&b3[..]),
        "traceparent" => Some(b"00-11111111111111111111111111111111-2222222222222222-01"),
        _ => None,
    })
    .unwrap();
    assert_eq!(t.trace_id, 0x11111111111111111111111111111111);
    assert!(t.replaces("traceparent") && t.replaces("b3"));
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
        parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx").is_some()
    );
}
