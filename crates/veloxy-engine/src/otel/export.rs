//! The span exporter: one thread with its own single-threaded runtime, fed by a bounded queue.
//!
//! Workers hand each sampled exchange's finished spans to [`Exporter::send`], which keeps
//! them in the worker thread's own batch ([`LOCAL_BATCH`] spans, or [`LOCAL_WAIT`] at most, a
//! timer on the worker's runtime flushing a batch that stops growing) and hands whole batches
//! on with a `try_send` that never waits: one wake-up of the exporter thread per batch rather
//! than per exchange (a futex call per request cost more than the spans themselves). A full
//! queue (a slow or dead collector) drops them, counted in
//! `veloxy_tracing_spans_dropped_total`. The thread batches what arrives (up to
//! [`BATCH`] spans, or what came within [`FLUSH`]), encodes it ([`super::proto`]) and sends
//! it ([`super::send`]): OTLP/HTTP protobuf POSTed to `ENDPOINT/v1/traces`, or OTLP/gRPC for
//! a `grpc://` endpoint, on one kept-alive connection. A batch the collector refuses or does not take within
//! [`TIMEOUT`] is dropped and counted too ([`EXPORT_DROPPED`]). The thread ends when the last
//! handle is dropped (a reload that changed the endpoint, the service name or the resource
//! made a new exporter), after sending what it holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use super::span::Spans;
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
    tx: SyncSender<Vec<Spans>>,
    /// What it was made from (a reload with the same keeps it).
    pub settings: TracingSettings,
}

/// Why the exporter could not be started.
#[derive(Debug, thiserror::Error)]
#[error("tracing: cannot start the exporter thread: {0}")]
pub struct ExporterError(#[source] std::io::Error);

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
    pub(crate) fn send(self: &std::sync::Arc<Self>, spans: Spans) {
        let timer = PENDING.with_borrow_mut(|p| {
            if p.to
                .as_ref()
                .is_some_and(|to| !std::sync::Arc::ptr_eq(to, self))
            {
                p.flush(); // a reload made a new exporter: the old one takes its spans
                p.to = None;
            }
            let started = p.spans.is_empty();
            if p.to.is_none() {
                p.to = Some(self.clone());
            }
            p.count += spans.count();
            p.spans.push(spans);
            if p.count >= LOCAL_BATCH {
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

    fn hand_over(&self, spans: Vec<Spans>, n: usize) {
        let n = n as u64;
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
    /// The exchanges' spans, and how many spans that is.
    spans: Vec<Spans>,
    count: usize,
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
        let spans = std::mem::replace(&mut self.spans, Vec::with_capacity(self.count));
        let n = std::mem::take(&mut self.count);
        if let Some(to) = &self.to {
            to.hand_over(spans, n);
        }
    }
}

thread_local! {
    static PENDING: std::cell::RefCell<Pending> = std::cell::RefCell::default();
}

/// The exporter thread: batches from `rx`, exports each, until every sender is gone.
fn run(s: &TracingSettings, rx: Receiver<Vec<Spans>>) {
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
    let mut client = match super::send::Client::new(&s.otlp_endpoint) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, endpoint = %s.otlp_endpoint, "tracing: cannot make the OTLP exporter");
            return;
        }
    };
    let resource = super::proto::Resource {
        service_name: &s.service_name,
        attributes: &s.resource,
    };
    let mut batch: Vec<Spans> = Vec::new();
    let mut buf = Vec::new();
    let mut open = true;
    let take = |batch: &mut Vec<Spans>, mut spans: Vec<Spans>| {
        let n = spans.iter().map(Spans::count).sum::<usize>();
        batch.append(&mut spans);
        n
    };
    while open {
        let mut got = 1;
        let mut n = match rx.recv() {
            Ok(spans) => take(&mut batch, spans),
            Err(_) => break,
        };
        let deadline = std::time::Instant::now() + FLUSH;
        while n < BATCH {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(spans) => {
                    got += 1;
                    n += take(&mut batch, spans);
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let n = n as u64;
        buf.clear();
        super::proto::encode(&mut buf, &resource, &batch);
        batch.clear();
        let sent = rt.block_on(async { tokio::time::timeout(TIMEOUT, client.send(&buf)).await });
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                EXPORT_DROPPED.fetch_add(n, Ordering::Relaxed);
                tracing::debug!(error = %e, spans = n, "tracing: export failed");
            }
            Err(_) => {
                EXPORT_DROPPED.fetch_add(n, Ordering::Relaxed);
                client.reset();
                tracing::debug!(spans = n, "tracing: export timed out");
            }
        }
        DONE.fetch_add(got, Ordering::AcqRel);
    }
}
