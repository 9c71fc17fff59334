//! Process-wide monotonic clocks, cheap to read and to store in atomics: [`now_us`] for
//! latencies and token buckets, [`now_ms`] for deadlines of a second or more.
//!
//! Both count from the same epoch (the first read in the process) on `CLOCK_MONOTONIC`.
//! [`now_ms`] reads `CLOCK_MONOTONIC_COARSE`, the time of the kernel's last timer tick (1 to
//! 4 ms behind, never ahead): through the vDSO it is a plain memory read, where the precise
//! clock also reads and scales the TSC. A proxied request reads the millisecond clock
//! several times (pool idle times, retry budget windows, stream stall watches), and the
//! precise clock was about 3% of the CPU per HTTP/2 request (`perf`).

use std::sync::OnceLock;

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clock IDs exist on every Linux veloxy
    // supports (2.6.32+), so the call cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds on `CLOCK_MONOTONIC` at the first read, minus a tick: the coarse clock may
/// lag the precise one by up to a tick, and must not read before the epoch.
fn epoch_ns() -> u64 {
    static EPOCH: OnceLock<u64> = OnceLock::new();
    *EPOCH.get_or_init(|| read(libc::CLOCK_MONOTONIC_COARSE).saturating_sub(10_000_000))
}

/// Microseconds since the process's clock epoch (precise).
pub fn now_us() -> u64 {
    let epoch = epoch_ns();
    (read(libc::CLOCK_MONOTONIC) - epoch) / 1000
}

/// Milliseconds since the process's clock epoch, from the coarse clock: up to a timer tick
/// (4 ms) behind [`now_us`]. Never 0, so 0 can mean "unset".
pub fn now_ms() -> u64 {
    let epoch = epoch_ns();
    read(libc::CLOCK_MONOTONIC_COARSE).saturating_sub(epoch) / 1_000_000 + 1
}

/// An [`Instant`](std::time::Instant) from the coarse clock, for code that wants an `Instant`
/// but no precision (hyper's keep-alive ping, which reads the time on every frame it
/// receives). It never goes back, and stays within a timer tick of `Instant::now()` on
/// either side: its base pairs one reading of each clock, and the coarse one may have lagged
/// by up to a tick at that moment.
pub fn coarse_instant() -> std::time::Instant {
    static BASE: OnceLock<(std::time::Instant, u64)> = OnceLock::new();
    let (at, coarse_ns) = *BASE.get_or_init(|| {
        (
            std::time::Instant::now(),
            read(libc::CLOCK_MONOTONIC_COARSE),
        )
    });
    at + std::time::Duration::from_nanos(
        read(libc::CLOCK_MONOTONIC_COARSE).saturating_sub(coarse_ns),
    )
}

/// The time from `stamp_ms` to `now_ms`, both [`now_ms`] readings (zero if `stamp_ms` is
/// later, as a stamp taken after `now_ms` was read can be).
pub fn since_ms(stamp_ms: u64, now_ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(now_ms.saturating_sub(stamp_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_clocks_share_an_epoch_and_move_forward() {
        let (ms, us) = (now_ms(), now_us());
        // The coarse clock is at most a few ticks behind the precise one, never ahead.
        assert!(
            ms <= us / 1000 + 1,
            "coarse {ms} ms ahead of precise {us} us"
        );
        assert!(
            us / 1000 < ms + 50,
            "coarse {ms} ms too far behind precise {us} us"
        );
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(now_ms() >= ms + 20, "the coarse clock did not advance");
        assert!(now_us() >= us + 30_000);
    }

    #[test]
    fn the_coarse_instant_follows_the_precise_one() {
        let first = coarse_instant();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let (coarse, precise) = (coarse_instant(), std::time::Instant::now());
        assert!(coarse >= first + std::time::Duration::from_millis(20));
        // Within a few ticks of the precise clock, on either side (see the doc).
        let lag = precise.saturating_duration_since(coarse);
        assert!(lag < std::time::Duration::from_millis(50), "{lag:?} behind");
        assert!(coarse <= precise + std::time::Duration::from_millis(10));
    }
}
