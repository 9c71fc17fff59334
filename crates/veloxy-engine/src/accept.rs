//! What an accept loop does when `accept` fails.
//!
//! Out of descriptors (EMFILE, ENFILE) or kernel memory (ENOBUFS, ENOMEM), `accept` fails
//! while the connection stays queued, and the listener stays readable, until something
//! closes. The condition passes, so a loop must never give up on it: it backs off briefly
//! and tries again. And it must not log every retry: [`LogLimiter`] lets one line a second
//! through and counts the rest.

use std::time::{Duration, Instant};

/// Pause after a failed accept: short, because a shortage often ends as soon as one
/// connection closes; long enough not to spin on a listener that stays readable.
pub(crate) const BACKOFF: Duration = Duration::from_millis(10);

/// How often a persisting accept failure is logged.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Lets one event a `interval` through to the log and counts the ones it holds back.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    pub(crate) const fn new(interval: Duration) -> Self {
        LogLimiter {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)` when the event at `now` should be logged, `n` events having been held back
    /// since the last logged one; `None` when it is held back.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let mut l = LogLimiter::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(l.allow(t0), Some(0));
        for ms in (10..1000).step_by(10) {
            assert_eq!(l.allow(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(l.allow(t0 + Duration::from_millis(1000)), Some(99));
        assert_eq!(l.allow(t0 + Duration::from_millis(1500)), None);
        assert_eq!(l.allow(t0 + Duration::from_millis(5000)), Some(1));
    }
}
