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
