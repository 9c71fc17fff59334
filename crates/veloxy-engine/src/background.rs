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
