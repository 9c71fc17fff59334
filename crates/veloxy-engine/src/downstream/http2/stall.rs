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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::ProxyBody;
use crate::clock;
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
    /// When hyper last polled the body ([`clock::now_ms`]).
    last_ms: Cell<u64>,
    /// The body's last poll returned `Pending`: it waits for its upstream until `flag` fires.
    waiting: Cell<bool>,
    /// The waker handed to the body, kept across polls while hyper's waker stays the same.
    flag: RefCell<Option<Arc<WakeFlag>>>,
}

/// Wraps the waker hyper gave the body, recording when it fired.
pub(crate) struct WakeFlag {
    /// [`clock::now_ms`] of the first wake since the last poll; 0: not woken.
    woken_ms: AtomicU64,
    inner: Waker,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.woken_ms.compare_exchange(
            0,
            clock::now_ms(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
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
            last_ms: Cell::new(clock::now_ms()),
            waiting: Cell::new(false),
            flag: RefCell::new(None),
        });
        self.slots.borrow_mut().push(Rc::downgrade(&slot));
        Watched::Slot(slot)
    }

    /// Cuts every body stalled for `limit`; returns how many were cut.
    pub(crate) fn sweep(&self, limit: Duration) -> usize {
        let now = clock::now_ms();
        let limit = limit.as_millis() as u64;
        let mut cut = Vec::new();
        self.slots.borrow_mut().retain(|weak| {
            let Some(slot) = weak.upgrade() else {
                return false;
            };
            if slot.body.borrow().is_none() {
                return false;
            }
            // Stalled since its last poll, or, if it was waiting for its upstream, since that
            // wait ended.
            let since = if slot.waiting.get() {
                let woken = slot
                    .flag
                    .borrow()
                    .as_ref()
                    .map_or(0, |f| f.woken_ms.load(Ordering::Relaxed));
                if woken == 0 {
                    // Still waiting for the upstream: not the client's stall.
                    return true;
                }
                woken
            } else {
                slot.last_ms.get()
            };
            if now.saturating_sub(since) < limit {
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
        let flag = {
            let mut kept = slot.flag.borrow_mut();
            match &*kept {
                Some(f) if f.inner.will_wake(cx.waker()) => f.clone(),
                _ => {
                    let f = Arc::new(WakeFlag {
                        woken_ms: AtomicU64::new(0),
                        inner: cx.waker().clone(),
                    });
                    *kept = Some(f.clone());
                    f
                }
            }
        };
        flag.woken_ms.store(0, Ordering::Relaxed);
        let waker = Waker::from(flag);
        let r = Pin::new(b).poll_frame(&mut Context::from_waker(&waker));
        slot.last_ms.set(clock::now_ms());
        slot.waiting.set(r.is_pending());
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
