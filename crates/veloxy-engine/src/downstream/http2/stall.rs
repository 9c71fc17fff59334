//! The send-stall deadline for HTTP/2 responses (`[server] send_timeout`).
//!
//! hyper polls a response body only while the stream has flow-control window. A client that
//! never opens its window (initial window 0, or never sends WINDOW_UPDATE) therefore parks the
//! body, and with it whatever the body holds: an upstream connection, a route's concurrency
//! slot, an open file. Nothing inside the body can notice, since it is not polled.
//!
//! So every response whose body is still streaming is registered with its connection, and the
//! connection's 100 ms tick looks for bodies that have not been polled for `send_timeout` even
//! though they have something to send. Those are cut: the body is dropped (the upstream
//! connection is closed, not pooled; the exchange is recorded), and the next poll, should the
//! client ever open the window, answers an error so hyper resets the stream. A body waiting
//! for its upstream (an SSE stream with sparse events) is not stalled: it returned `Pending`
//! and its waker has not fired; the upstream's own `read_timeout` governs it.

use std::cell::{Cell, RefCell};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::ProxyBody;
use crate::error::{ErrorKind, ProxyError};

/// A response body as handed to hyper: either not worth watching (complete, or veloxy's own
/// short answer), or shared with the connection's stall sweep.
pub(crate) enum Watched {
    Direct(ProxyBody),
    Slot(Rc<Slot>),
}

/// A streaming body and when it last made progress.
pub(crate) struct Slot {
    body: RefCell<Option<ProxyBody>>,
    /// When hyper last polled the body (or, when it waits for its upstream, when that wait
    /// ended: see `woken_seen`).
    last: Cell<Instant>,
    /// Set when the body's last poll returned `Pending`: it waits for its upstream, and the
    /// flag inside says whether that wait is over.
    waiting: RefCell<Option<Arc<WakeFlag>>>,
    /// The sweep that first saw the upstream wait over.
    woken_seen: Cell<Option<Instant>>,
}

/// Wraps the waker hyper gave the body, recording that it fired.
pub(crate) struct WakeFlag {
    woken: AtomicBool,
    inner: Waker,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Relaxed);
        self.inner.wake_by_ref();
    }
}

/// The responses of one connection under watch.
#[derive(Default)]
pub(crate) struct Watch {
    slots: RefCell<Vec<Weak<Slot>>>,
}

impl Watch {
    /// Wraps `body`; a body that may still stream is registered for the stall sweep.
    pub(crate) fn wrap(&self, body: ProxyBody) -> Watched {
        if body.is_end_stream() || matches!(body, ProxyBody::Full(..)) {
            return Watched::Direct(body);
        }
        let slot = Rc::new(Slot {
            body: RefCell::new(Some(body)),
            last: Cell::new(Instant::now()),
            waiting: RefCell::new(None),
            woken_seen: Cell::new(None),
        });
        self.slots.borrow_mut().push(Rc::downgrade(&slot));
        Watched::Slot(slot)
    }

    /// Cuts every body stalled for `limit`; returns how many were cut.
    pub(crate) fn sweep(&self, limit: Duration) -> usize {
        let now = Instant::now();
        let mut cut = Vec::new();
        self.slots.borrow_mut().retain(|weak| {
            let Some(slot) = weak.upgrade() else {
                return false;
            };
            if slot.body.borrow().is_none() {
                return false;
            }
            let since = match &*slot.waiting.borrow() {
                None => slot.last.get(),
                Some(flag) if flag.woken.load(Ordering::Relaxed) => {
                    let seen = slot.woken_seen.get().unwrap_or(now);
                    slot.woken_seen.set(Some(seen));
                    seen
                }
                // Waiting for the upstream: not the client's stall.
                Some(_) => return true,
            };
            if now.saturating_duration_since(since) < limit {
                return true;
            }
            cut.push(slot.body.borrow_mut().take());
            false
        });
        // Dropped outside the borrow: dropping a body records its exchange.
        let n = cut.len();
        drop(cut);
        n
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = ProxyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>> {
        let slot = match self.get_mut() {
            Watched::Direct(b) => return Pin::new(b).poll_frame(cx),
            Watched::Slot(slot) => slot,
        };
        let mut body = slot.body.borrow_mut();
        let Some(b) = body.as_mut() else {
            // Cut by the sweep: an error makes hyper reset the stream.
            return Poll::Ready(Some(Err(ProxyError::downstream(ErrorKind::SendTimeout))));
        };
        let mut waiting = slot.waiting.borrow_mut();
        let flag = match waiting.take() {
            Some(f) if f.inner.will_wake(cx.waker()) => {
                f.woken.store(false, Ordering::Relaxed);
                f
            }
            _ => Arc::new(WakeFlag {
                woken: AtomicBool::new(false),
                inner: cx.waker().clone(),
            }),
        };
        let waker = Waker::from(flag.clone());
        let r = Pin::new(b).poll_frame(&mut Context::from_waker(&waker));
        slot.last.set(Instant::now());
        slot.woken_seen.set(None);
        if r.is_pending() {
            *waiting = Some(flag);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Watched::Direct(b) => b.is_end_stream(),
            Watched::Slot(s) => s.body.borrow().as_ref().is_some_and(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Watched::Direct(b) => b.size_hint(),
            Watched::Slot(s) => s
                .body
                .borrow()
                .as_ref()
                .map(|b| b.size_hint())
                .unwrap_or_default(),
        }
    }
}
