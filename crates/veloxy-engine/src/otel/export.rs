//! The span exporter: one thread with its own single-threaded runtime, fed by a bounded queue.
//!
//! Workers hand each sampled exchange's finished spans to [`Exporter::send`], which keeps
//! them in the worker thread's own batch ([`LOCAL_BATCH`] spans, or [`LOCAL_WAIT`] at most, a
//! timer on the worker's runtime flushing a batch that stops growing) and hands whole batches
//! on with a `try_send` that never waits: one wake-up of the exporter thread per batch rather
//! than per exchange (a futex call per request cost more than the spans themselves). A full
//! queue (a slow or dead collector) drops them, counted in
//! `veloxy_tracing_spans_dropped_total`. The thread batches what arrives (up to
//! [`BATCH`] spans, or what came within [`FLUSH`]) and exports it with `opentelemetry-otlp`'s
//! `SpanExporter`: OTLP/HTTP protobuf POSTed to `ENDPOINT/v1/traces`, or OTLP/gRPC for a
//! `grpc://` endpoint. A batch the collector refuses or does not take within
//! [`TIMEOUT`] is dropped and counted too ([`EXPORT_DROPPED`]). The thread ends when the last
//! handle is dropped (a reload that changed the endpoint, the service name or the resource
//! made a new exporter), after sending what it holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;

use super::TracingSettings;

/// Worker batches that may wait in the queue.
const QUEUE: usize = 256;
/// Spans a worker gathers before it hands them to the exporter thread.
const LOCAL_BATCH: usize = 128;
/// Longest a span waits in its worker's batch.
const LOCAL_WAIT: Duration = Duration::from_millis(100);
/// Spans per export request, at most.
const BATCH: usize = 512;
/// How long spans wait for a fuller batch.
const FLUSH: Duration = Duration::from_millis(200);
/// How long one export may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Spans the exporter thread could not deliver (the collector refused them, failed or timed
/// out), summed into `veloxy_tracing_spans_dropped_total` with the workers' queue drops.
pub(crate) static EXPORT_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Worker batches handed to an exporter thread, and those it has exported or dropped: equal
/// when nothing waits ([`drain`]).
static HANDED: AtomicU64 = AtomicU64::new(0);
static DONE: AtomicU64 = AtomicU64::new(0);

/// At shutdown, once the workers have ended (each hands its last batch on as its thread
/// ends): waits, up to `limit`, until the exporter threads have sent every batch they got.
pub(crate) fn drain(limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while DONE.load(Ordering::Acquire) < HANDED.load(Ordering::Acquire)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The handle workers send finished spans to.
#[derive(Debug)]
pub(crate) struct Exporter {
    tx: SyncSender<Vec<SpanData>>,
    /// What it was made from (a reload with the same keeps it).
    pub settings: TracingSettings,
}

/// Why the exporter could not be started.
#[derive(Debug, thiserror::Error)]
#[error("tracing: cannot start the exporter thread: {0}")]
pub struct ExporterError(#[source] std::io::Error);

/// The instrumentation scope of every span veloxy makes.
pub(crate) fn scope() -> InstrumentationScope {
    static SCOPE: OnceLock<InstrumentationScope> = OnceLock::new();
    SCOPE
        .get_or_init(|| {
            InstrumentationScope::builder("veloxy")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build()
        })
        .clone()
}

impl Exporter {
    /// Starts the exporter thread for `settings`.
    pub(crate) fn start(settings: &TracingSettings) -> Result<Exporter, ExporterError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let s = settings.clone();
        std::thread::Builder::new()
            .name("veloxy-otlp".into())
            .spawn(move || run(&s, rx))
            .map_err(ExporterError)?;
        Ok(Exporter {
            tx,
            settings: settings.clone(),
        })
    }

    /// Adds one exchange's spans to this worker thread's batch, handed to the exporter thread
    /// when full or [`LOCAL_WAIT`] after it started. Spans a full queue drops are counted in
    /// [`EXPORT_DROPPED`].
    pub(crate) fn send(self: &std::sync::Arc<Self>, spans: Vec<SpanData>) {
        let timer = PENDING.with_borrow_mut(|p| {
            if p.to
                .as_ref()
                .is_some_and(|to| !std::sync::Arc::ptr_eq(to, self))
            {
                p.flush(); // a reload made a new exporter: the old one takes its spans
            }
            let started = p.spans.is_empty();
            p.to = Some(self.clone());
            p.spans.extend(spans);
            if p.spans.len() >= LOCAL_BATCH {
                p.flush();
                return false;
            }
            started
        });
        if timer {
            // The batch's deadline, on the worker's own runtime (same thread, same batch).
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async {
                    tokio::time::sleep(LOCAL_WAIT).await;
                    PENDING.with_borrow_mut(Pending::flush);
                });
            }
        }
    }

    fn hand_over(&self, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        match self.tx.try_send(spans) {
            Ok(()) => {
                HANDED.fetch_add(1, Ordering::AcqRel);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                EXPORT_DROPPED.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// A worker thread's batch of finished spans, and the exporter it goes to.
#[derive(Default)]
struct Pending {
    to: Option<std::sync::Arc<Exporter>>,
    spans: Vec<SpanData>,
}

impl Drop for Pending {
    /// A worker thread that ends (shutdown) hands its last batch on.
    fn drop(&mut self) {
        self.flush();
    }
}

impl Pending {
    fn flush(&mut self) {
        if self.spans.is_empty() {
            return;
        }
        let spans = std::mem::replace(&mut self.spans, Vec::with_capacity(LOCAL_BATCH));
        if let Some(to) = &self.to {
            to.hand_over(spans);
        }
    }
}

thread_local! {
    static PENDING: std::cell::RefCell<Pending> = std::cell::RefCell::default();
}

fn resource(s: &TracingSettings) -> Resource {
    Resource::builder_empty()
        .with_service_name(s.service_name.clone())
        .with_attributes(
            s.resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

fn build(s: &TracingSettings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match s.otlp_endpoint.strip_prefix("grpc://") {
        Some(rest) => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(format!("http://{rest}"))
            .with_protocol(Protocol::Grpc)
            .with_timeout(TIMEOUT)
            .build(),
        None => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!(
                "{}/v1/traces",
                s.otlp_endpoint.trim_end_matches('/')
            ))
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(TIMEOUT)
            .build(),
    };
    built.map_err(|e| e.to_string())
}

/// The exporter thread: batches from `rx`, exports each, until every sender is gone.
fn run(s: &TracingSettings, rx: Receiver<Vec<SpanData>>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "tracing: cannot start the exporter's runtime");
            return;
        }
    };
    let mut exporter = match rt.block_on(async { build(s) }) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, endpoint = %s.otlp_endpoint, "tracing: cannot make the OTLP exporter");
            return;
        }
    };
    exporter.set_resource(&resource(s));
    let mut batch = Vec::with_capacity(BATCH);
    let mut open = true;
    while open {
        let mut got = 1;
        match rx.recv() {
            Ok(spans) => batch.extend(spans),
            Err(_) => break,
        }
        let deadline = std::time::Instant::now() + FLUSH;
        while batch.len() < BATCH {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(spans) => {
                    got += 1;
                    batch.extend(spans);
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let spans = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
        let n = spans.len() as u64;
        let sent = rt.block_on(async {
            tokio::time::timeout(TIMEOUT + Duration::from_secs(1), exporter.export(spans)).await
        });
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                EXPORT_DROPPED.fetch_add(n, Ordering::Relaxed);
                tracing::debug!(error = %e, spans = n, "tracing: export failed");
            }
            Err(_) => {
                EXPORT_DROPPED.fetch_add(n, Ordering::Relaxed);
                tracing::debug!(spans = n, "tracing: export timed out");
            }
        }
        DONE.fetch_add(got, Ordering::AcqRel);
    }
    let _ = exporter.shutdown();
}
