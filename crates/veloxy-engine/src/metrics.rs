//! Metrics: per-worker counters merged when scraped, rendered in Prometheus text format.
//!
//! Each worker is the only writer of its own [`WorkerMetrics`], so an increment is a relaxed
//! load and store (no locked instruction, no shared cache line); the admin thread sums all
//! workers on scrape. Values a scrape reads may be a few increments stale, never torn.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Routes tracked separately; later routes share the last slot.
pub const MAX_ROUTES: usize = 256;

/// Histogram bucket upper bounds in microseconds: fine below a millisecond (for p99s under
/// 1 ms), coarser up to 10 s.
pub const BUCKETS_US: [u64; 24] = [
    50, 100, 150, 200, 300, 400, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000, 7_500, 10_000,
    25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// A counter with a single writer.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        // Single writer: load + store is enough and avoids a locked read-modify-write.
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A latency histogram with a single writer.
#[derive(Debug)]
pub struct Histogram {
    buckets: [Counter; BUCKETS_US.len() + 1],
    sum_us: Counter,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| Counter::default()),
            sum_us: Counter::default(),
        }
    }
}

impl Histogram {
    #[inline]
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = BUCKETS_US.partition_point(|&b| b < us);
        self.buckets[i].inc();
        self.sum_us.add(us);
    }
}

/// Status classes counted per route: 1xx..5xx, and 0 for "no response sent".
const CLASSES: usize = 6;

/// The class slot of a status: 1..=5 for 1xx..5xx, 0 for anything else (no response).
#[inline]
fn class(status: u16) -> usize {
    if (100..600).contains(&status) {
        (status / 100) as usize
    } else {
        0
    }
}

/// One worker's counters.
#[derive(Debug)]
pub struct WorkerMetrics {
    /// `requests[route][class]`.
    requests: Vec<[Counter; CLASSES]>,
    pub request_duration: Histogram,
    pub upstream_duration: Histogram,
    /// Requests started and finished; their difference is the in-flight gauge.
    pub in_flight: Counter,
    pub in_flight_done: Counter,
    pub downstream_connections: Counter,
    pub pool_hits: Counter,
    pub upstream_connects: Counter,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub retries: Counter,
    pub shed_503: Counter,
    pub rate_limited_429: Counter,
    pub access_log_dropped: Counter,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_errors: Counter,
    /// HTTP/2 streams opened by clients.
    pub h2_streams: Counter,
    /// HTTP/3 request streams opened by clients.
    pub h3_streams: Counter,
    /// WebSocket (and other HTTP/1.1 Upgrade) tunnels established.
    pub upgrades: Counter,
    /// Requests copied to a route's `mirror` group (sent; the shadow's answer is dropped).
    pub mirrored: Counter,
    /// Mirror copies not made: the worker had its most mirrors in flight already.
    pub mirror_dropped: Counter,
    /// Mirror copies not made: the request body could not be copied (too large, or of unknown
    /// length and not at hand).
    pub mirror_skipped: Counter,
    /// Mirror copies that failed (no shadow backend up, connect, write or read error, deadline).
    pub mirror_failed: Counter,
    /// Responses cut because the client accepted no bytes for `send_timeout`.
    pub send_timeouts: Counter,
    /// Requests refused (408) or cut because their body stalled for `body_timeout`.
    pub body_timeouts: Counter,
    /// Times the allocator was asked to return freed memory to the OS after a burst.
    pub memory_trims: Counter,
    /// Idle keep-alive connections parked off the runtime, and taken out again (woken or
    /// closed); their difference is the parked gauge.
    pub parked: Counter,
    pub unparked: Counter,
    /// Requests refused before routing completed (404, 400, 429, ...), by status class.
    unrouted: [Counter; CLASSES],
    /// Failed accepts on the listeners (out of descriptors, mostly).
    pub accept_errors: Counter,
    /// Upstream connects that failed for want of local resources (descriptors, ports, memory).
    pub upstream_local_errors: Counter,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        WorkerMetrics {
            requests: (0..MAX_ROUTES)
                .map(|_| std::array::from_fn(|_| Counter::default()))
                .collect(),
            request_duration: Histogram::default(),
            upstream_duration: Histogram::default(),
            in_flight: Counter::default(),
            in_flight_done: Counter::default(),
            downstream_connections: Counter::default(),
            pool_hits: Counter::default(),
            upstream_connects: Counter::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            retries: Counter::default(),
            shed_503: Counter::default(),
            rate_limited_429: Counter::default(),
            access_log_dropped: Counter::default(),
            tls_handshake_errors: Counter::default(),
            h2_streams: Counter::default(),
            h3_streams: Counter::default(),
            upgrades: Counter::default(),
            mirrored: Counter::default(),
            mirror_dropped: Counter::default(),
            mirror_skipped: Counter::default(),
            mirror_failed: Counter::default(),
            send_timeouts: Counter::default(),
            body_timeouts: Counter::default(),
            memory_trims: Counter::default(),
            parked: Counter::default(),
            unparked: Counter::default(),
            unrouted: std::array::from_fn(|_| Counter::default()),
            accept_errors: Counter::default(),
            upstream_local_errors: Counter::default(),
        }
    }
}

impl WorkerMetrics {
    /// Counts a finished request on route index `route` (file order) with `status` (0: none).
    #[inline]
    pub fn request(&self, route: usize, status: u16) {
        self.requests[route.min(MAX_ROUTES - 1)][class(status)].inc();
    }

    /// Counts a request answered before it was routed (malformed, no route, refused).
    #[inline]
    pub fn unrouted(&self, status: u16) {
        self.unrouted[class(status)].inc();
    }
}

impl crate::upstream::connect::ConnectCounts for WorkerMetrics {
    #[inline]
    fn connected(&self) {
        self.upstream_connects.inc();
    }

    #[inline]
    fn local_error(&self) {
        self.upstream_local_errors.inc();
    }
}

/// The `mirror` counters: name, help, field.
#[allow(clippy::type_complexity)]
const MIRROR: [(&str, &str, fn(&WorkerMetrics) -> &Counter); 4] = [
    (
        "veloxy_mirrored_total",
        "Requests copied to a route's mirror group.",
        |w| &w.mirrored,
    ),
    (
        "veloxy_mirror_dropped_total",
        "Mirror copies not made: the worker's limit of mirrors in flight was reached.",
        |w| &w.mirror_dropped,
    ),
    (
        "veloxy_mirror_skipped_total",
        "Mirror copies not made: the request body was too large or of unknown length.",
        |w| &w.mirror_skipped,
    ),
    (
        "veloxy_mirror_failed_total",
        "Mirror copies that failed (no shadow backend, connect, write, read or deadline).",
        |w| &w.mirror_failed,
    ),
];

/// All workers' metrics, shared with the admin thread.
#[derive(Debug, Default)]
pub struct Metrics {
    pub workers: Vec<Arc<WorkerMetrics>>,
    /// Failed accepts on the admin endpoint (its thread is the only writer).
    pub admin_accept_errors: Counter,
}

fn sum(m: &Metrics, f: impl Fn(&WorkerMetrics) -> u64) -> u64 {
    m.workers.iter().map(|w| f(w)).sum()
}

fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    m: &Metrics,
    pick: impl Fn(&WorkerMetrics) -> &Histogram,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (i, bound) in BUCKETS_US.iter().enumerate() {
        cumulative += sum(m, |w| pick(w).buckets[i].get());
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"{}\"}} {cumulative}",
            *bound as f64 / 1e6
        );
    }
    cumulative += sum(m, |w| pick(w).buckets[BUCKETS_US.len()].get());
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(
        out,
        "{name}_sum {}",
        sum(m, |w| pick(w).sum_us.get()) as f64 / 1e6
    );
    let _ = writeln!(out, "{name}_count {cumulative}");
}

fn counter(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// Renders everything in Prometheus text exposition format.
/// The config-side labels `/metrics` needs, gathered by the admin endpoint (this module knows
/// counters only, nothing of the config).
pub struct Labels<'a> {
    /// (listener, route index, upstream group or "" for a file route), per route per listener.
    pub routes: Vec<(&'a str, usize, &'a str)>,
    /// (listener, open connections).
    pub listeners: Vec<(&'a str, u64)>,
    pub backends: Vec<BackendLabels<'a>>,
}

/// One backend's live figures.
pub struct BackendLabels<'a> {
    pub upstream: &'a str,
    pub addr: crate::upstream::addr::BackendAddr,
    pub open_connections: u64,
    pub up: bool,
    pub checks_passed: u64,
    pub checks_failed: u64,
}

/// Renders every counter in the Prometheus text format.
pub fn render(m: &Metrics, labels: &Labels) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let _ = writeln!(
        out,
        "# HELP veloxy_requests_total Requests answered, by listener, route, upstream group and status class.\n# TYPE veloxy_requests_total counter"
    );
    for &(listener, route, up) in &labels.routes {
        for (class, label) in ["none", "1xx", "2xx", "3xx", "4xx", "5xx"]
            .iter()
            .enumerate()
        {
            let n = sum(m, |w| w.requests[route.min(MAX_ROUTES - 1)][class].get());
            if n > 0 || class == 2 {
                let _ = writeln!(
                    out,
                    "veloxy_requests_total{{listener=\"{listener}\",route=\"{route}\",upstream=\"{up}\",status=\"{label}\"}} {n}",
                );
            }
        }
    }
    for (class, label) in ["none", "1xx", "2xx", "3xx", "4xx", "5xx"]
        .iter()
        .enumerate()
    {
        let n = sum(m, |w| w.unrouted[class].get());
        if n > 0 {
            let _ = writeln!(out, "veloxy_requests_total{{listener=\"\",route=\"none\",upstream=\"\",status=\"{label}\"}} {n}");
        }
    }
    histogram(
        &mut out,
        "veloxy_request_duration_seconds",
        "Time from request head to the end of the response.",
        m,
        |w| &w.request_duration,
    );
    histogram(
        &mut out,
        "veloxy_upstream_duration_seconds",
        "Time from sending upstream to the response head.",
        m,
        |w| &w.upstream_duration,
    );
    let in_flight =
        sum(m, |w| w.in_flight.get()).saturating_sub(sum(m, |w| w.in_flight_done.get()));
    counter(
        &mut out,
        "veloxy_requests_in_flight",
        "gauge",
        "Requests being served.",
        in_flight,
    );
    let _ = writeln!(out, "# HELP veloxy_downstream_connections Open client connections per listener.\n# TYPE veloxy_downstream_connections gauge");
    for (l, n) in &labels.listeners {
        let _ = writeln!(out, "veloxy_downstream_connections{{listener=\"{l}\"}} {n}");
    }
    counter(
        &mut out,
        "veloxy_downstream_connections_total",
        "counter",
        "Client connections accepted.",
        sum(m, |w| w.downstream_connections.get()),
    );
    let _ = writeln!(out, "# HELP veloxy_upstream_connections Open upstream connections per backend.\n# TYPE veloxy_upstream_connections gauge");
    let _ = writeln!(out, "# HELP veloxy_backend_up Backend usable (1) or down/ejected (0).\n# TYPE veloxy_backend_up gauge");
    let _ = writeln!(out, "# HELP veloxy_health_checks_total Active health check results.\n# TYPE veloxy_health_checks_total counter");
    for b in &labels.backends {
        let l = format!("upstream=\"{}\",backend=\"{}\"", b.upstream, b.addr);
        let _ = writeln!(
            out,
            "veloxy_upstream_connections{{{l}}} {}",
            b.open_connections
        );
        let _ = writeln!(out, "veloxy_backend_up{{{l}}} {}", u8::from(b.up));
        let _ = writeln!(
            out,
            "veloxy_health_checks_total{{{l},result=\"pass\"}} {}",
            b.checks_passed
        );
        let _ = writeln!(
            out,
            "veloxy_health_checks_total{{{l},result=\"fail\"}} {}",
            b.checks_failed
        );
    }
    counter(
        &mut out,
        "veloxy_pool_hits_total",
        "counter",
        "Requests sent on a pooled upstream connection.",
        sum(m, |w| w.pool_hits.get()),
    );
    counter(
        &mut out,
        "veloxy_upstream_connects_total",
        "counter",
        "New upstream connections opened.",
        sum(m, |w| w.upstream_connects.get()),
    );
    counter(
        &mut out,
        "veloxy_downstream_bytes_received_total",
        "counter",
        "Bytes read from clients.",
        sum(m, |w| w.bytes_in.get()),
    );
    counter(
        &mut out,
        "veloxy_downstream_bytes_sent_total",
        "counter",
        "Bytes written to clients.",
        sum(m, |w| w.bytes_out.get()),
    );
    counter(
        &mut out,
        "veloxy_retries_total",
        "counter",
        "Requests retried on another backend.",
        sum(m, |w| w.retries.get()),
    );
    counter(
        &mut out,
        "veloxy_shed_total",
        "counter",
        "503s from overload protection (limits, no backend).",
        sum(m, |w| w.shed_503.get()),
    );
    counter(
        &mut out,
        "veloxy_rate_limited_total",
        "counter",
        "429s from rate limits.",
        sum(m, |w| w.rate_limited_429.get()),
    );
    counter(
        &mut out,
        "veloxy_access_log_dropped_total",
        "counter",
        "Access log lines dropped because the log buffer was full.",
        sum(m, |w| w.access_log_dropped.get()),
    );
    counter(
        &mut out,
        "veloxy_tracing_spans_dropped_total",
        "counter",
        "Spans not exported: the exporter's queue was full, or the collector refused them, failed or timed out.",
        crate::otel::export::EXPORT_DROPPED.load(std::sync::atomic::Ordering::Relaxed),
    );
    counter(
        &mut out,
        "veloxy_tls_handshake_errors_total",
        "counter",
        "TLS handshakes that failed or timed out.",
        sum(m, |w| w.tls_handshake_errors.get()),
    );
    counter(
        &mut out,
        "veloxy_http2_streams_total",
        "counter",
        "HTTP/2 streams opened by clients.",
        sum(m, |w| w.h2_streams.get()),
    );
    counter(
        &mut out,
        "veloxy_http3_streams_total",
        "counter",
        "HTTP/3 request streams opened by clients.",
        sum(m, |w| w.h3_streams.get()),
    );
    counter(
        &mut out,
        "veloxy_accept_errors_total",
        "counter",
        "Failed accepts (listeners and admin endpoint): out of descriptors or memory, mostly.",
        sum(m, |w| w.accept_errors.get()) + m.admin_accept_errors.get(),
    );
    counter(
        &mut out,
        "veloxy_upstream_local_errors_total",
        "counter",
        "Upstream connects that failed for want of local descriptors, ports or memory (answered 503, not counted against the backend).",
        sum(m, |w| w.upstream_local_errors.get()),
    );
    counter(
        &mut out,
        "veloxy_upgrades_total",
        "counter",
        "Upgraded (WebSocket) connections established.",
        sum(m, |w| w.upgrades.get()),
    );
    for (name, help, pick) in MIRROR {
        counter(&mut out, name, "counter", help, sum(m, |w| pick(w).get()));
    }
    counter(
        &mut out,
        "veloxy_send_timeouts_total",
        "counter",
        "Responses cut because the client accepted no bytes for send_timeout.",
        sum(m, |w| w.send_timeouts.get()),
    );
    counter(
        &mut out,
        "veloxy_body_timeouts_total",
        "counter",
        "Requests whose body stalled for body_timeout (408).",
        sum(m, |w| w.body_timeouts.get()),
    );
    counter(
        &mut out,
        "veloxy_memory_trims_total",
        "counter",
        "Times freed memory was returned to the OS after a burst of connections closed.",
        sum(m, |w| w.memory_trims.get()),
    );
    counter(
        &mut out,
        "veloxy_downstream_parked_connections",
        "gauge",
        "Idle keep-alive client connections parked off the runtime (park_idle_after).",
        sum(m, |w| w.parked.get()).saturating_sub(sum(m, |w| w.unparked.get())),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(40));
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(51));
        h.observe(Duration::from_secs(60));
        assert_eq!(h.buckets[0].get(), 2, "le 50us");
        assert_eq!(h.buckets[1].get(), 1, "le 100us");
        assert_eq!(h.buckets[BUCKETS_US.len()].get(), 1, "+Inf");
    }
}
