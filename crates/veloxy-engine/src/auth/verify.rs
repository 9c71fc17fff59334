//! Credential checks off the workers: a bcrypt verification costs tens to hundreds of
//! milliseconds by design, and on a worker thread it would stall every other request that
//! worker serves. A check that the per-worker memory of verified credentials does not answer
//! becomes a [`Verify`] job, run on a small process-wide pool of low-priority threads.
//!
//! The pool is bounded three ways, so a flood of wrong passwords from many addresses (the
//! per-address limit of [`super::FAILED_PER_MINUTE`] does not stop one) costs at most the
//! pool's threads, at a lower priority than the workers:
//! - half the cores in threads (at least one), each at nice [`crate::background::NICE`];
//! - at most [`QUEUE`] checks waiting: one more is refused at once with 503;
//! - at most [`PER_SECOND`] checks started a second across the process: more get 429.
//!
//! The pool starts on the first check, not at config load (`veloxy check` starts nothing).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::Duration;

use super::Hash;

/// Checks that may wait for a thread; past this, 503 at once.
pub const QUEUE: usize = 64;
/// Checks started per second, process-wide; past this, 429.
pub const PER_SECOND: u64 = 200;
/// How long a request waits for its check (queue and run) before 503.
pub const WAIT: Duration = Duration::from_secs(10);

/// The pool's thread count: half the cores, at least one.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// One credential check, to run off the worker.
pub struct Verify {
    pub(super) key: u64,
    pub(super) password: String,
    pub(super) hash: Hash,
    /// The realm of the route's challenge, for a refusal.
    pub realm: String,
}

/// Why a check did not pass.
#[derive(Debug, PartialEq, Eq)]
pub enum Failed {
    /// Wrong credentials: 401 with the route's challenge.
    Wrong,
    /// Over the process-wide rate of checks: 429.
    TooMany,
    /// The pool's queue is full, or the check did not finish within [`WAIT`]: 503.
    Busy,
}

type Job = (Verify, tokio::sync::oneshot::Sender<bool>);

struct Pool {
    queue: SyncSender<Job>,
    /// (second, checks started in it), packed as second << 20 | count.
    window: AtomicU64,
}

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        for i in 0..threads() {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("veloxy-auth-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        // The lock is held only to take the next job, never while hashing.
                        let job = rx.lock().map(|r| r.recv());
                        let Ok(Ok((verify, done))) = job else { return };
                        let _ = done.send(verify.matches());
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a credential check thread");
            }
        }
        Pool {
            queue: tx,
            window: AtomicU64::new(0),
        }
    })
}

use crate::background::lower_priority;

impl Pool {
    /// Counts one check against the process-wide rate; false when over it.
    fn admit(&self) -> bool {
        let now = crate::clock::now_ms() / 1000;
        let mut cur = self.window.load(Ordering::Relaxed);
        loop {
            let (sec, n) = (cur >> 20, cur & 0xF_FFFF);
            let next = if sec == now {
                if n >= PER_SECOND {
                    return false;
                }
                cur + 1
            } else {
                (now << 20) | 1
            };
            match self
                .window
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }
}

impl Verify {
    /// Whether the password matches the hash (a dummy hash for an unknown user: the same
    /// cost, and never a match).
    fn matches(&self) -> bool {
        self.hash.matches(&self.password)
    }

    /// Runs the check on the pool; on a match the credentials are remembered by the calling
    /// worker, so its next requests with them cost no check.
    pub async fn run(self) -> Result<(), Failed> {
        let p = pool();
        if !p.admit() {
            return Err(Failed::TooMany);
        }
        let key = self.key;
        let (tx, rx) = tokio::sync::oneshot::channel();
        match p.queue.try_send((self, tx)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                return Err(Failed::Busy)
            }
        }
        match tokio::time::timeout(WAIT, rx).await {
            Ok(Ok(true)) => {
                super::remember(key);
                Ok(())
            }
            Ok(Ok(false)) => Err(Failed::Wrong),
            Ok(Err(_)) | Err(_) => Err(Failed::Busy),
        }
    }
}
