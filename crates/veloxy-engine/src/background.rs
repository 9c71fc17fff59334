//! The process's background threads (admin endpoint, health checks, ACME, DNS discovery,
//! the Redis client): each a named thread with its own current-thread runtime, off the
//! workers' cores' hot path.

/// Runs `task` to completion on a new thread named `name` with its own runtime. A runtime
/// that cannot be built is logged (the thread then ends at once).
pub(crate) fn spawn<F, Fut>(name: &str, task: F) -> std::io::Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let thread = name.to_owned();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(task()),
                Err(e) => tracing::error!(thread = %thread, error = %e, "no runtime"),
            }
        })?;
    Ok(())
}

/// The nice value of threads doing bulk work beside the workers (bcrypt checks, the
/// Kubernetes provider's translations): when they share a core, a worker's wake-up preempts
/// them and it gets most of the core, so the work does not show in the requests' tail.
pub const NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority to [`NICE`] (Linux sets nice per thread;
/// elsewhere nothing happens).
pub fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take no pointers; failure only leaves the priority.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, NICE);
    }
}

/// The calling thread's CPU time so far, in milliseconds (`CLOCK_THREAD_CPUTIME_ID`; 0 where
/// that clock is not there): what a step of a lowered-priority thread cost, apart from the
/// time the workers preempted it.
pub fn thread_cpu_ms() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given; on failure it stays zero.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
    }
    #[cfg(not(unix))]
    0.0
}

/// The scheduler slice a worker asks for, in nanoseconds: the kernel's minimum.
pub const WORKER_SLICE_NS: u64 = 100_000;

/// Asks the kernel for a short time slice for the calling thread (a worker): Linux 6.12 and
/// later (EEVDF with custom slices) let a waking task with a shorter slice preempt the one
/// running, so a worker woken by a request preempts a background thread on its core at once
/// (the Kubernetes provider's build, a bcrypt check) instead of waiting out that thread's
/// slice of about 3 ms: each such wait held a dozen requests at 3,000 a second, the p99 under
/// EndpointSlice churn. The share of the CPU is unchanged (that is the nice value's); only
/// when it is handed out changes. Older kernels take the call and ignore the slice; where
/// the call fails (seccomp, non-Linux), nothing changes.
pub fn short_slice() {
    #[cfg(target_os = "linux")]
    {
        /// The kernel's `struct sched_attr` (the first version, 48 bytes, is enough; the
        /// libc crate does not define it).
        #[repr(C)]
        struct SchedAttr {
            size: u32,
            policy: u32,
            flags: u64,
            nice: i32,
            priority: u32,
            runtime: u64,
            deadline: u64,
            period: u64,
        }
        // SAFETY: getpriority takes no pointer.
        let nice = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::getpriority(libc::PRIO_PROCESS, tid)
        };
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: libc::SCHED_OTHER as u32,
            flags: 0,
            nice,
            priority: 0,
            runtime: WORKER_SLICE_NS,
            deadline: 0,
            period: 0,
        };
        // SAFETY: `attr` is a valid sched_attr of the size it declares, read by the kernel
        // during the call; pid 0 is the calling thread. A failure changes nothing.
        unsafe {
            libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The calling thread's scheduler slice as the kernel reports it (`se.slice` in
    /// `/proc/thread-self/sched`, Linux 6.6 and later), if it does.
    fn slice() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        let line = text.lines().find(|l| l.starts_with("se.slice"))?;
        line.split(':').nth(1)?.trim().parse().ok()
    }

    #[test]
    fn a_worker_asks_for_the_shortest_slice() {
        std::thread::spawn(|| {
            let Some(before) = slice() else {
                eprintln!("skipped: this kernel reports no se.slice");
                return;
            };
            // Custom slices came with Linux 6.12.
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
            let mut v = release
                .split(['.', '-'])
                .map(|p| p.parse::<u32>().unwrap_or(0));
            if (v.next().unwrap_or(0), v.next().unwrap_or(0)) < (6, 12) {
                eprintln!("skipped: Linux {} has no custom slices", release.trim());
                return;
            }
            super::short_slice();
            let after = slice().unwrap();
            assert_eq!(after, super::WORKER_SLICE_NS, "before: {before}");
        })
        .join()
        .unwrap();
    }
}
