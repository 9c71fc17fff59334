//! The request body of an HTTP/2 or HTTP/3 client on its way to an HTTP/2 upstream, which
//! hyper pulls frame by frame: [`Guarded`] holds it to the limits the HTTP/1 upstream path
//! checks as it relays (`max_body_bytes` for a body of unknown length, `body_timeout`
//! between frames).
//!
//! A body that breaks a limit ends with an error, so hyper resets the upstream stream; the
//! codec then reads the reason from the [`Watch`] it kept (413 or 408 when no response has
//! started; a reset of the client's stream otherwise) and gets the rest of the body back to
//! drain it behind a 413.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::error::{ErrorKind, ProxyError};
use crate::metrics::WorkerMetrics;

/// A body error, as hyper's HTTP/2 client takes it.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the codec learns from a [`Guarded`] body after the exchange.
/// Shared through an `Arc` because hyper wants a `Send` body; nothing contends for it.
pub(crate) struct Watch<B> {
    /// A [`Fault`] as its `u8`, 0 while none.
    fault: AtomicU8,
    /// The client's body once a limit stopped it (unread rest included).
    rest: Mutex<Option<B>>,
}

/// Why a guarded body stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Fault {
    /// Longer than `max_body_bytes`.
    TooLarge = 1,
    /// No frame within `body_timeout`.
    Stalled = 2,
}

impl<B> Watch<B> {
    /// The error the exchange ends with when the body broke a limit (413 or 408).
    pub(crate) fn error(&self) -> Option<ProxyError> {
        let kind = match self.fault.load(Ordering::Acquire) {
            0 => return None,
            f if f == Fault::TooLarge as u8 => ErrorKind::BodyTooLarge,
            _ => ErrorKind::BodyTimeout,
        };
        Some(ProxyError::downstream(kind))
    }

    /// The client's body after a limit stopped it, for draining.
    pub(crate) fn take_rest(&self) -> Option<B> {
        self.rest.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A client's request body with a byte budget and a wait limit between frames; data bytes
/// are counted in the worker's `bytes_in`.
pub(crate) struct Guarded<B> {
    inner: Option<B>,
    /// Bytes still allowed (`u64::MAX`: no `max_body_bytes`).
    left: u64,
    wait: Duration,
    /// Armed at the first `Pending` after a frame: the limit counts time spent waiting on the
    /// client, not time hyper spends waiting for the upstream's flow-control window.
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
    watch: Arc<Watch<B>>,
    metrics: Arc<WorkerMetrics>,
}

/// Wraps `body` with the route's `max_body` and the server's `body_timeout`; returns the body
/// to send and the watch to read after the exchange.
pub(crate) fn guard<B>(
    body: B,
    max_body: Option<u64>,
    body_timeout: Duration,
    metrics: Arc<WorkerMetrics>,
) -> (Guarded<B>, Arc<Watch<B>>) {
    let watch = Arc::new(Watch {
        fault: AtomicU8::new(0),
        rest: Mutex::new(None),
    });
    let body = Guarded {
        inner: Some(body),
        left: max_body.unwrap_or(u64::MAX),
        wait: body_timeout,
        sleep: None,
        armed: false,
        watch: watch.clone(),
        metrics,
    };
    (body, watch)
}

impl<B> Guarded<B> {
    /// Stops the body for `fault`: the watch keeps the reason and the client's body.
    fn stop(&mut self, fault: Fault) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.watch.fault.store(fault as u8, Ordering::Release);
        *self.watch.rest.lock().unwrap_or_else(|e| e.into_inner()) = self.inner.take();
        let e = self.watch.error().expect("fault just set");
        Poll::Ready(Some(Err(Box::new(e))))
    }

    /// Whether the wait for the next frame has run past `body_timeout`.
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.armed {
            let deadline = Instant::now() + self.wait;
            match self.sleep.as_mut() {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.armed = true;
        }
        self.sleep
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }
}

impl<B> Body for Guarded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Pending => {
                if this.stalled(cx) {
                    this.metrics.body_timeouts.inc();
                    return this.stop(Fault::Stalled);
                }
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                this.armed = false;
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    this.metrics.bytes_in.add(n);
                    match this.left.checked_sub(n) {
                        Some(left) => this.left = left,
                        None => return this.stop(Fault::TooLarge),
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}
