//! A time limit for an I/O step that costs nothing when the step is ready at once.
//!
//! `tokio::time::timeout` reads the clock and builds a timer entry before it first polls its
//! future, and unlinks the entry when dropped. Most writes on the request path complete in
//! their first poll (the socket buffer has room), so that work was spent per write for a
//! deadline that could never fire: 2-3 clock reads and timer entries per proxied request,
//! about 1-2% of its CPU (`perf`, timer entry drop, `Sleep` and `Timeout` polls).
//!
//! [`timeout`] polls the step first and starts the clock only if the step has to wait, so the
//! limit counts from the first wait instead of from the call: later by the length of one poll
//! that did not block.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

/// The step did not finish within its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Elapsed;

/// Runs `step`, failing with [`Elapsed`] if it is still waiting `limit` after its first wait.
pub(crate) fn timeout<F: Future>(limit: Duration, step: F) -> Timeout<F> {
    Timeout {
        step,
        limit,
        sleep: None,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`timeout`].
    pub(crate) struct Timeout<F> {
        #[pin]
        step: F,
        limit: Duration,
        // Set at the first `Pending` of `step`.
        #[pin]
        sleep: Option<Sleep>,
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut me = self.project();
        if let Poll::Ready(out) = me.step.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if me.sleep.is_none() {
            me.sleep.set(Some(tokio::time::sleep(*me.limit)));
        }
        match me.sleep.as_pin_mut().map(|s| s.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(Elapsed)),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ready_step_never_starts_the_clock_and_a_stuck_one_times_out() {
        let mut t = std::pin::pin!(timeout(Duration::from_secs(1), async { 7 }));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert_eq!(t.as_mut().poll(&mut cx), Poll::Ready(Ok(7)));
        assert!(t.sleep.is_none(), "a ready step made a timer");

        let started = std::time::Instant::now();
        let stuck = timeout(Duration::from_millis(50), std::future::pending::<()>()).await;
        assert_eq!(stuck, Err(Elapsed));
        assert!(started.elapsed() >= Duration::from_millis(50));

        let slow = timeout(
            Duration::from_secs(5),
            tokio::time::sleep(Duration::from_millis(20)),
        );
        assert_eq!(slow.await, Ok(()));
    }
}
