//! A process-wide monotonic clock in microseconds, cheap to read and to store in atomics.

use std::sync::OnceLock;
use std::time::Instant;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Microseconds since the first call in this process.
pub fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
}

/// Milliseconds since the first call in this process (never 0, so 0 can mean "unset").
pub fn now_ms() -> u64 {
    now_us() / 1000 + 1
}
