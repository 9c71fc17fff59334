//! The server: binds listeners, starts one worker thread per core, reloads and shuts down.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::config::Snapshot;
use crate::hooks::Hooks;
use crate::worker::Worker;

/// Failures starting or changing a running server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listener {name:?}: cannot listen on {addr}: {source}")]
    Bind {
        name: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("access log {path:?}: {source}")]
    AccessLog {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start worker thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(
        "reload cannot change listeners yet (had {had:?}, new config has {new:?}); restart instead"
    )]
    ListenersChanged { had: Vec<String>, new: Vec<String> },
}

/// State shared by all workers: read-mostly.
pub(crate) struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    /// Bumped after each snapshot swap; workers compare it to their cached generation.
    pub generation: AtomicU64,
    pub shutdown: AtomicBool,
    pub hooks: Option<Arc<dyn Hooks>>,
    /// Open downstream connections per listener (index), across workers.
    pub listener_connections: Vec<AtomicUsize>,
    /// Feeds the health thread the snapshot to check.
    health_tx: watch::Sender<Arc<Snapshot>>,
    /// Every worker's counters, summed by the admin endpoint.
    pub metrics: crate::metrics::Metrics,
    pub access_log: Option<crate::access_log::AccessLog>,
}

/// A configured server, not yet started.
pub struct Server {
    snapshot: Snapshot,
    hooks: Option<Arc<dyn Hooks>>,
}

impl Server {
    pub fn new(snapshot: Snapshot) -> Self {
        Server {
            snapshot,
            hooks: None,
        }
    }

    /// Installs request/response hooks (see [`crate::hooks`]).
    pub fn with_hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// Binds every listener once per worker, then starts the workers. Returns when all sockets
    /// are listening, so connections made after this succeed.
    pub fn start(self) -> Result<Running, ServerError> {
        let workers = self.snapshot.settings.workers;
        let shutdown_timeout = self.snapshot.settings.shutdown_timeout;
        // per_worker[w] = the sockets worker w accepts on, with their listener index.
        let mut per_worker: Vec<Vec<(usize, std::net::TcpListener)>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut bound = Vec::new();
        for (idx, spec) in self.snapshot.listeners.iter().enumerate() {
            let sockets =
                crate::listener::bind_reuseport(spec.addr, workers).map_err(|source| {
                    ServerError::Bind {
                        name: spec.name.clone(),
                        addr: spec.addr,
                        source,
                    }
                })?;
            let addr = sockets[0].local_addr().unwrap_or(spec.addr);
            bound.push((spec.name.clone(), addr));
            for (w, s) in sockets.into_iter().enumerate() {
                per_worker[w].push((idx, s));
            }
        }
        let listener_connections = self
            .snapshot
            .listeners
            .iter()
            .map(|_| AtomicUsize::new(0))
            .collect();
        let admin_listener = match self.snapshot.settings.admin {
            None => None,
            Some(addr) => {
                Some(
                    std::net::TcpListener::bind(addr).map_err(|source| ServerError::Bind {
                        name: "admin".into(),
                        addr,
                        source,
                    })?,
                )
            }
        };
        let admin_addr = admin_listener.as_ref().and_then(crate::admin::local_addr);
        let worker_metrics: Vec<Arc<crate::metrics::WorkerMetrics>> =
            (0..workers).map(|_| Arc::default()).collect();
        let access_log = match &self.snapshot.settings.access_log {
            None => None,
            Some(cfg) => Some(crate::access_log::AccessLog::start(cfg).map_err(|source| {
                ServerError::AccessLog {
                    path: cfg.path.clone().unwrap_or_else(|| "stdout".into()),
                    source,
                }
            })?),
        };
        let snapshot = Arc::new(self.snapshot);
        let (health_tx, health_rx) = watch::channel(snapshot.clone());
        crate::upstream::health::spawn_thread(health_rx).map_err(ServerError::Thread)?;
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::new(snapshot),
            generation: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            hooks: self.hooks,
            listener_connections,
            health_tx,
            metrics: crate::metrics::Metrics {
                workers: worker_metrics.clone(),
            },
            access_log,
        });
        let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(4);
        if let Some(l) = admin_listener {
            l.set_nonblocking(true).map_err(ServerError::Thread)?;
            crate::admin::spawn(l, shared.clone(), reload_tx).map_err(ServerError::Thread)?;
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut threads = Vec::with_capacity(workers);
        for (id, listeners) in per_worker.into_iter().enumerate() {
            let shared = shared.clone();
            let stop = stop_rx.clone();
            let metrics = worker_metrics[id].clone();
            let t = std::thread::Builder::new()
                .name(format!("veloxy-w{id}"))
                .spawn(move || run_worker(id, shared, metrics, listeners, stop, shutdown_timeout))
                .map_err(ServerError::Thread)?;
            threads.push(t);
        }
        Ok(Running {
            shared,
            threads,
            bound,
            stop_tx,
            admin_addr,
            reloads: std::sync::Mutex::new(Some(reload_rx)),
        })
    }
}

/// A started server.
pub struct Running {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    bound: Vec<(String, SocketAddr)>,
    stop_tx: watch::Sender<bool>,
    admin_addr: Option<SocketAddr>,
    reloads: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<crate::admin::ReloadRequest>>>,
}

impl Running {
    /// Reopens the access log file (SIGUSR1, for logrotate).
    pub fn reopen_access_log(&self) {
        if let Some(log) = &self.shared.access_log {
            log.reopen();
        }
    }

    /// The admin endpoint's address, if `[server] admin` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Reload requests from `POST /reload`, to be answered by whoever owns the config file.
    /// Returns `None` after the first call. Dropping the receiver makes `POST /reload` a 501.
    pub fn take_reload_requests(
        &self,
    ) -> Option<tokio::sync::mpsc::Receiver<crate::admin::ReloadRequest>> {
        self.reloads.lock().ok()?.take()
    }

    /// The address each listener is bound to (ports resolved when the config said 0).
    pub fn local_addrs(&self) -> &[(String, SocketAddr)] {
        &self.bound
    }

    /// Swaps in a new snapshot: new requests use it, requests in flight finish on the old one.
    pub fn reload(&self, mut snapshot: Snapshot) -> Result<(), ServerError> {
        // Same listener names, each at its configured address or at the address it is bound to
        // (a config that said port 0 may be reloaded with the port it got).
        let current = self.shared.snapshot.load();
        let same = current.listeners.len() == snapshot.listeners.len()
            && current
                .listeners
                .iter()
                .zip(&self.bound)
                .zip(&snapshot.listeners)
                .all(|((old, (_, bound)), new)| {
                    old.name == new.name && (new.addr == old.addr || new.addr == *bound)
                });
        if !same {
            return Err(ServerError::ListenersChanged {
                had: current.listeners.iter().map(|l| l.name.clone()).collect(),
                new: snapshot.listeners.iter().map(|l| l.name.clone()).collect(),
            });
        }
        crate::upstream::health::adopt(&current, &mut snapshot);
        let snapshot = Arc::new(snapshot);
        self.shared.snapshot.store(snapshot.clone());
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        let _ = self.shared.health_tx.send(snapshot);
        Ok(())
    }

    /// Stops accepting, lets in-flight requests finish (up to `shutdown_timeout`), and joins
    /// the workers.
    pub fn shutdown(self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        let _ = self.stop_tx.send(true);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn run_worker(
    id: usize,
    shared: Arc<Shared>,
    metrics: Arc<crate::metrics::WorkerMetrics>,
    listeners: Vec<(usize, std::net::TcpListener)>,
    mut stop: watch::Receiver<bool>,
    shutdown_timeout: Duration,
) {
    let main = async move {
        let worker = Rc::new(Worker::new(id, shared, metrics));
        tokio::task::spawn_local(heartbeat(worker.clone()));
        for (idx, l) in listeners {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => {
                    tokio::task::spawn_local(accept_loop(worker.clone(), l, idx, stop.clone()));
                }
                Err(e) => tracing::error!(worker = id, error = %e, "cannot register listener"),
            }
        }
        let _ = stop.wait_for(|s| *s).await;
        let deadline = tokio::time::Instant::now() + shutdown_timeout;
        // Accepted connections still owe an answer: requests in flight, and connections whose
        // first request has not been read yet.
        while (worker.in_flight.get() > 0 || worker.fresh.get() > 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    // LocalRuntime schedules local tasks straight onto its run queue; a LocalSet would wake the
    // runtime through its eventfd on every wake-up (an extra syscall per request or so).
    #[cfg(tokio_unstable)]
    match builder.build_local(Default::default()) {
        Ok(rt) => rt.block_on(main),
        Err(e) => tracing::error!(worker = id, error = %e, "cannot build runtime"),
    }
    #[cfg(not(tokio_unstable))]
    match builder.build() {
        Ok(rt) => tokio::task::LocalSet::new().block_on(&rt, main),
        Err(e) => tracing::error!(worker = id, error = %e, "cannot build runtime"),
    }
}

/// A 50 ms tick that keeps the timer driver's next wake-up near. tokio unparks the driver (an
/// eventfd write, i.e. a syscall) whenever a timer is registered earlier than the planned
/// wake-up, which without this happened for about one request in five (each request arms a
/// read timeout). With the tick, every request timeout lies beyond the next wake-up.
///
/// Every second it also sweeps expired idle upstream connections.
async fn heartbeat(worker: Rc<Worker>) {
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0u64.. {
        tick.tick().await;
        if n % 20 == 0 {
            worker.sweep();
        }
    }
}

/// On shutdown, accepts what is already queued on this socket, so those clients are served
/// rather than reset when it closes. (With `net.ipv4.tcp_migrate_req = 1`, connections still
/// in the handshake move to another process's socket on the same port: see the README's
/// zero-downtime upgrade.)
fn drain_backlog(worker: &Rc<Worker>, listener: &tokio::net::TcpListener, idx: usize) {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    while let std::task::Poll::Ready(Ok((stream, peer))) = listener.poll_accept(&mut cx) {
        worker.shared.listener_connections[idx].fetch_add(1, Ordering::Relaxed);
        let w = worker.clone();
        tokio::task::spawn_local(async move {
            crate::connection::serve(w.clone(), stream, peer, idx).await;
            w.shared.listener_connections[idx].fetch_sub(1, Ordering::Relaxed);
        });
    }
}

async fn accept_loop(
    worker: Rc<Worker>,
    listener: tokio::net::TcpListener,
    idx: usize,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => {
                drain_backlog(&worker, &listener, idx);
                break;
            }
            accepted = listener.accept() => match accepted {
                // TCP_NODELAY is inherited from the listening socket: no setsockopt per accept.
                Ok((stream, peer)) => {
                    let max = worker.current().snapshot.listeners.get(idx).map_or(0, |l| l.max_connections);
                    let open = &worker.shared.listener_connections[idx];
                    if max > 0 && open.load(Ordering::Relaxed) >= max {
                        // Accepted and answered rather than left to time out in the backlog.
                        tokio::task::spawn_local(crate::connection::refuse(worker.clone(), stream));
                        continue;
                    }
                    open.fetch_add(1, Ordering::Relaxed);
                    let w = worker.clone();
                    tokio::task::spawn_local(async move {
                        crate::connection::serve(w.clone(), stream, peer, idx).await;
                        w.shared.listener_connections[idx].fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(worker = worker.id, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}
