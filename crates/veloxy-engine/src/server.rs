//! The server: binds listeners, starts one worker thread per core, reloads and shuts down.

use std::collections::HashMap;
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
use crate::runtime::{ListenerState, Shared};
use crate::worker::Worker;

/// Failures starting or changing a running server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener (or the admin endpoint) could not bind its address.
    #[error("listener {name:?}: cannot listen on {addr}: {source}")]
    Bind {
        /// The listener's name (`admin` for the admin endpoint).
        name: String,
        /// The address it asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Someone else holds the port and this is not an upgrade: joining it with SO_REUSEPORT
    /// would silently split its traffic between two processes (and two configs).
    #[error("{what}: {addr} is already in use by another process (another veloxy? use --upgrade for a zero-downtime binary upgrade)")]
    InUse {
        /// What wanted the port (`listener "web"`, `admin`).
        what: String,
        /// The address held by the other process.
        addr: SocketAddr,
    },
    /// The access log file could not be opened.
    #[error("access log {path:?}: {source}")]
    AccessLog {
        /// The configured path.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A worker, admin or health thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A live object the config names could not be made (a cache's disk directory).
    #[error(transparent)]
    Live(#[from] crate::runtime::live::BindError),
}

/// Orders sent to a worker when a reload adds or removes listeners.
enum WorkerCommand {
    /// Start accepting on this socket (one of the listener's per-worker sockets).
    Listen(Arc<ListenerState>, std::net::TcpListener),
    /// Stop accepting on the named listener (after taking what is already queued).
    Close(Arc<str>),
    /// Serve HTTP/3 on this UDP socket (a reload turned `http3` on).
    Quic(Quic),
}

/// A configured server, not yet started.
pub struct Server {
    snapshot: Snapshot,
    hooks: Option<Arc<dyn Hooks>>,
    upgrade: bool,
}

impl Server {
    /// A server for this compiled config, with no hooks.
    pub fn new(snapshot: Snapshot) -> Self {
        Server {
            snapshot,
            hooks: None,
            upgrade: false,
        }
    }

    /// A zero-downtime binary upgrade: join ports another process (the old veloxy) holds,
    /// instead of refusing them with [`ServerError::InUse`]. Applies to `start` only; a reload
    /// always refuses a new listener on a port held elsewhere.
    pub fn upgrade(mut self, upgrade: bool) -> Self {
        self.upgrade = upgrade;
        self
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
        // per_worker[w] = the sockets worker w accepts on.
        let mut per_worker: Vec<Vec<(Arc<ListenerState>, std::net::TcpListener)>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut bound = Vec::new();
        let mut states = Vec::new();
        let mut quic: Vec<Vec<Quic>> = (0..workers).map(|_| Vec::new()).collect();
        let probe = !self.upgrade;
        for spec in &self.snapshot.listeners {
            let (addr, sockets) = bind(&spec.name, spec.addr, workers, probe)?;
            let state = Arc::new(ListenerState {
                name: spec.name.as_str().into(),
                open: AtomicUsize::new(0),
                port: addr.port(),
            });
            bound.push((spec.name.clone(), addr));
            states.push(state.clone());
            for (w, s) in sockets.into_iter().enumerate() {
                per_worker[w].push((state.clone(), s));
            }
            if let Some(h3) = &spec.http3 {
                // The same port number over UDP (the TCP port, when it was chosen at bind).
                let udp = bind_quic(&spec.name, addr, workers)?;
                for (w, s) in udp.into_iter().enumerate() {
                    quic[w].push((state.clone(), s, h3.clone()));
                }
            }
        }
        let admin_listener = match self.snapshot.settings.admin {
            None => None,
            Some(addr) => Some(bind_admin(addr, probe)?),
        };
        let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
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
        let live = crate::runtime::live::Live::default();
        live.bind(&self.snapshot)?;
        let found = Arc::new(crate::upstream::discovery::Found::default());
        let snapshot = Arc::new(self.snapshot);
        let (health_tx, health_rx) = watch::channel(snapshot.upstreams.clone().into());
        crate::upstream::health::spawn_thread(health_rx).map_err(ServerError::Thread)?;
        let plan = crate::acme::manager::Plan::of(
            snapshot.settings.acme.clone(),
            &snapshot.listener_certs(),
        );
        crate::acme::manager::preload(live.certs(), &plan);
        let (acme_tx, acme_rx) = watch::channel(plan);
        crate::acme::manager::spawn_thread(live.certs().clone(), acme_rx)
            .map_err(ServerError::Thread)?;
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::new(snapshot),
            generation: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            hooks: self.hooks,
            listeners: std::sync::Mutex::new(states),
            health_tx,
            acme_tx,
            metrics: crate::metrics::Metrics {
                workers: worker_metrics.clone(),
                admin_accept_errors: Default::default(),
            },
            access_log,
            live,
            found: found.clone(),
            swap: std::sync::Mutex::new(()),
        });
        crate::runtime::start_discovery(&shared, found).map_err(ServerError::Thread)?;
        let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(4);
        if let Some(l) = admin_listener {
            l.set_nonblocking(true).map_err(ServerError::Thread)?;
            crate::admin::spawn(l, shared.clone(), reload_tx).map_err(ServerError::Thread)?;
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut threads = Vec::with_capacity(workers);
        let mut commands = Vec::with_capacity(workers);
        for (id, (listeners, quic)) in per_worker.into_iter().zip(quic).enumerate() {
            let shared = shared.clone();
            let stop = stop_rx.clone();
            let metrics = worker_metrics[id].clone();
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            commands.push(tx);
            let t = std::thread::Builder::new()
                .name(format!("veloxy-w{id}"))
                .spawn(move || {
                    crate::background::short_slice();
                    run_worker(
                        id,
                        shared,
                        metrics,
                        (listeners, quic),
                        rx,
                        stop,
                        shutdown_timeout,
                    )
                })
                .map_err(ServerError::Thread)?;
            threads.push(t);
        }
        Ok(Running {
            shared,
            threads,
            bound: std::sync::Mutex::new(bound),
            commands,
            stop_tx,
            admin_addr,
            reloads: std::sync::Mutex::new(Some(reload_rx)),
        })
    }
}

/// Refuses `addr` if another process holds its port (see [`crate::listener::probe_free`]).
/// Port 0 is always free: the kernel picks an unused port.
fn check_free(addr: SocketAddr, what: impl FnOnce() -> String) -> Result<(), ServerError> {
    if addr.port() == 0 {
        return Ok(());
    }
    match crate::listener::probe_free(addr) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            Err(ServerError::InUse { what: what(), addr })
        }
        // Anything else (no permission, address not local) the real bind reports too.
        Err(_) => Ok(()),
    }
}

/// Binds the admin endpoint's socket. SO_REUSEPORT and the probe as for listeners: in an
/// upgrade, the old process holds the admin port too.
fn bind_admin(addr: SocketAddr, probe: bool) -> Result<std::net::TcpListener, ServerError> {
    if probe {
        check_free(addr, || "admin endpoint".to_owned())?;
    }
    let failed = |source| ServerError::Bind {
        name: "admin".into(),
        addr,
        source,
    };
    let mut sockets = crate::listener::bind_reuseport(addr, 1).map_err(failed)?;
    sockets
        .pop()
        .ok_or_else(|| failed(std::io::ErrorKind::AddrNotAvailable.into()))
}

/// Binds a listener's per-worker sockets, first checking that no other process holds the
/// port when `probe` is set; returns the address they are bound to.
fn bind(
    name: &str,
    addr: SocketAddr,
    workers: usize,
    probe: bool,
) -> Result<(SocketAddr, Vec<std::net::TcpListener>), ServerError> {
    if probe {
        check_free(addr, || format!("listener {name:?}"))?;
    }
    let sockets =
        crate::listener::bind_reuseport(addr, workers).map_err(|source| ServerError::Bind {
            name: name.to_owned(),
            addr,
            source,
        })?;
    let bound = sockets[0].local_addr().unwrap_or(addr);
    Ok((bound, sockets))
}

/// Binds a listener's per-worker UDP sockets for HTTP/3 on `addr` (the TCP port's number).
fn bind_quic(
    name: &str,
    addr: SocketAddr,
    workers: usize,
) -> Result<Vec<std::net::UdpSocket>, ServerError> {
    crate::listener::bind_udp_reuseport(addr, workers).map_err(|source| ServerError::Bind {
        name: format!("{name} (HTTP/3, UDP)"),
        addr,
        source,
    })
}

/// A started server.
pub struct Running {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    bound: std::sync::Mutex<Vec<(String, SocketAddr)>>,
    commands: Vec<tokio::sync::mpsc::UnboundedSender<WorkerCommand>>,
    stop_tx: watch::Sender<bool>,
    admin_addr: Option<SocketAddr>,
    reloads: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<crate::admin::ReloadRequest>>>,
}

impl Running {
    /// Gives upstream groups new sets of servers in place, as the runtime API's
    /// `PUT /upstreams/NAME/servers` does, in one swap: each `(group, servers)` names a group
    /// and its servers as `([https://]host:port, weight)`, listed as a config's `servers`
    /// would be (an address listed twice counts twice). Backends that stay keep their health
    /// and pooled connections; nothing is compiled. Refused whole, before anything changes,
    /// when a group is unknown, a list is empty or too long, an address does not resolve or
    /// a server's scheme differs from its group's. The sets hold until the next reload (the
    /// Kubernetes provider's endpoint changes use this; its next full build carries the same
    /// sets in the config).
    pub fn set_servers(&self, changes: &[(String, Vec<(String, u32)>)]) -> Result<(), String> {
        let current = self.shared.snapshot.load_full();
        let mut sets = Vec::with_capacity(changes.len());
        for (name, servers) in changes {
            let group =
                (current.upstream(name)).ok_or_else(|| format!("no upstream group {name:?}"))?;
            if servers.is_empty() || servers.len() > crate::upstream::health::MAX_BACKENDS {
                return Err(format!(
                    "upstream group {name:?}: give 1 to {} servers",
                    crate::upstream::health::MAX_BACKENDS
                ));
            }
            let mut backends = Vec::with_capacity(servers.len());
            for (addr, weight) in servers {
                let b = crate::config::runtime_backend(group, addr, (*weight).max(1))
                    .map_err(|m| format!("upstream group {name:?}: {addr}: {m}"))?;
                backends.push(b);
            }
            sets.push((name.as_str(), backends));
        }
        let names: Vec<&str> = sets.iter().map(|(n, _)| *n).collect();
        for (name, backends) in sets {
            self.shared.found.set_override(name, backends);
        }
        self.shared.republish_many(&names);
        Ok(())
    }

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

    /// The snapshot being served: a reload compiles against it
    /// ([`crate::config::load_file_after`]) to reuse what did not change.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    /// Reload requests from `POST /reload`, to be answered by whoever owns the config file.
    /// Returns `None` after the first call. Dropping the receiver makes `POST /reload` a 501.
    pub fn take_reload_requests(
        &self,
    ) -> Option<tokio::sync::mpsc::Receiver<crate::admin::ReloadRequest>> {
        self.reloads.lock().ok()?.take()
    }

    /// The address each listener is bound to (ports resolved when the config said 0).
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.bound.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// Swaps in a new snapshot: new requests use it, requests in flight finish on the old one.
    ///
    /// Listeners are matched by name. One whose address is unchanged (or equals the address it
    /// got when the config said port 0) keeps its sockets and connections; new ones are bound
    /// first (a bind failure refuses the whole reload, nothing changes); removed ones stop
    /// accepting after taking what is already queued, and their open connections are answered
    /// 404 from then on (their routes are gone).
    pub fn reload(&self, mut snapshot: Snapshot) -> Result<(), ServerError> {
        let _swap = self.shared.swap.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.shared.snapshot.load();
        let mut bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        let workers = current.settings.workers;
        let keeps = |name: &str, addr: SocketAddr| {
            current
                .listeners
                .iter()
                .zip(bound.iter())
                .any(|(old, (_, at))| old.name == name && (addr == old.addr || addr == *at))
        };
        let removed: Vec<String> = current
            .listeners
            .iter()
            .filter(|old| {
                !snapshot
                    .listeners
                    .iter()
                    .any(|n| n.name == old.name && keeps(&n.name, n.addr))
            })
            .map(|old| old.name.clone())
            .collect();
        let mut added = Vec::new();
        for spec in snapshot
            .listeners
            .iter()
            .filter(|n| !keeps(&n.name, n.addr))
        {
            // A port this process holds itself (a listener renamed, or moving to an address
            // another one leaves) is no other process's: no probe, or it would refuse us.
            let ours = bound.iter().any(|(_, at)| *at == spec.addr);
            let (addr, sockets) = bind(&spec.name, spec.addr, workers, !ours)?;
            added.push((spec.name.clone(), addr, sockets));
        }
        // HTTP/3 turned on (a new listener, or one that had none): its UDP sockets, bound
        // before anything is swapped so a failure refuses the reload.
        let mut quic_added = Vec::new();
        for spec in &snapshot.listeners {
            let Some(h3) = &spec.http3 else { continue };
            let had = current
                .listeners
                .iter()
                .any(|o| o.name == spec.name && o.http3.is_some() && keeps(&spec.name, spec.addr));
            if had {
                continue;
            }
            let addr = added
                .iter()
                .find(|(n, _, _)| *n == spec.name)
                .map(|(_, a, _)| *a)
                .or_else(|| bound.iter().find(|(n, _)| *n == spec.name).map(|(_, a)| *a))
                .unwrap_or(spec.addr);
            let udp = bind_quic(&spec.name, addr, workers)?;
            quic_added.push((spec.name.clone(), udp, h3.clone()));
        }
        // Cache stores (and their directories), the Redis client, search views: made or kept
        // before anything is swapped, so a failure refuses the reload.
        self.shared.live.bind(&snapshot)?;

        let workers = snapshot.settings.workers;
        // Discovered and runtime sets carry over, as the groups' live state does.
        self.shared.found.reset_overrides(&snapshot.upstreams);
        for g in &mut snapshot.upstreams {
            let live = self.shared.found.live_set(g);
            crate::upstream::discovery::set_backends(Arc::make_mut(g), live);
        }
        crate::upstream::health::adopt(&current.upstreams, &mut snapshot.upstreams, workers);
        crate::runtime::carry_over(&current, &mut snapshot);
        let snapshot = Arc::new(snapshot);
        let plan = crate::acme::manager::Plan::of(
            snapshot.settings.acme.clone(),
            &snapshot.listener_certs(),
        );
        crate::acme::manager::preload(self.shared.live.certs(), &plan);
        self.shared.snapshot.store(snapshot.clone());
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        let _ = self
            .shared
            .health_tx
            .send(snapshot.upstreams.clone().into());
        // Only a changed plan wakes the ACME thread (names kept keep their certificates).
        self.shared.acme_tx.send_if_modified(|current| {
            let changed = *current != plan;
            *current = plan;
            changed
        });

        let mut states = self
            .shared
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for name in removed {
            let name: Arc<str> = name.as_str().into();
            for tx in &self.commands {
                let _ = tx.send(WorkerCommand::Close(name.clone()));
            }
            bound.retain(|(n, _)| **n != *name);
            states.retain(|s| s.name != name);
            tracing::info!(listener = %name, "listener closed");
        }
        for (name, addr, sockets) in added {
            let state = Arc::new(ListenerState {
                name: name.as_str().into(),
                open: AtomicUsize::new(0),
                port: addr.port(),
            });
            for (tx, socket) in self.commands.iter().zip(sockets) {
                let _ = tx.send(WorkerCommand::Listen(state.clone(), socket));
            }
            states.push(state);
            tracing::info!(listener = %name, %addr, "listening");
            bound.push((name, addr));
        }
        for (name, sockets, h3) in quic_added {
            let Some(state) = states.iter().find(|s| *s.name == *name) else {
                continue;
            };
            for (tx, socket) in self.commands.iter().zip(sockets) {
                let _ = tx.send(WorkerCommand::Quic((state.clone(), socket, h3.clone())));
            }
            tracing::info!(listener = %name, "HTTP/3 on");
        }
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
        // The workers' last spans, handed on as their threads ended, reach the collector.
        crate::otel::export::drain(Duration::from_secs(3));
    }
}

/// A worker's HTTP/3 endpoint: its listener, UDP socket and settings.
type Quic = (
    Arc<ListenerState>,
    std::net::UdpSocket,
    Arc<crate::config::Http3Spec>,
);

fn run_worker(
    id: usize,
    shared: Arc<Shared>,
    metrics: Arc<crate::metrics::WorkerMetrics>,
    (listeners, quic): (Vec<(Arc<ListenerState>, std::net::TcpListener)>, Vec<Quic>),
    mut commands: tokio::sync::mpsc::UnboundedReceiver<WorkerCommand>,
    mut stop: watch::Receiver<bool>,
    shutdown_timeout: Duration,
) {
    let main = async move {
        let worker = Rc::new_cyclic(|me| Worker::new(id, shared, metrics, me.clone()));
        tokio::task::spawn_local(heartbeat(worker.clone()));
        // Per listener name, the switch that closes this worker's accept loop for it.
        let mut closers: HashMap<Arc<str>, watch::Sender<bool>> = HashMap::new();
        let loops_stop = stop.clone();
        let listen = |state: Arc<ListenerState>,
                      l: std::net::TcpListener,
                      closers: &mut HashMap<Arc<str>, watch::Sender<bool>>| {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => {
                    let (close_tx, close_rx) = watch::channel(false);
                    closers.insert(state.name.clone(), close_tx);
                    tokio::task::spawn_local(accept_loop(
                        worker.clone(),
                        l,
                        state,
                        loops_stop.clone(),
                        close_rx,
                    ));
                }
                Err(e) => tracing::error!(worker = id, error = %e, "cannot register listener"),
            }
        };
        for (state, l) in listeners {
            listen(state, l, &mut closers);
        }
        for (state, socket, spec) in quic {
            tokio::task::spawn_local(crate::downstream::http3::serve_endpoint(
                worker.clone(),
                socket,
                state,
                spec,
                stop.clone(),
            ));
        }
        let mut commands_open = true;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                cmd = commands.recv(), if commands_open => match cmd {
                    Some(WorkerCommand::Listen(state, l)) => listen(state, l, &mut closers),
                    Some(WorkerCommand::Quic((state, socket, spec))) => {
                        tokio::task::spawn_local(crate::downstream::http3::serve_endpoint(
                            worker.clone(),
                            socket,
                            state,
                            spec,
                            loops_stop.clone(),
                        ));
                    }
                    Some(WorkerCommand::Close(name)) => {
                        if let Some(tx) = closers.remove(&name) {
                            let _ = tx.send(true);
                        }
                    }
                    None => commands_open = false,
                },
            }
        }
        let deadline = tokio::time::Instant::now() + shutdown_timeout;
        // Accepted connections still owe an answer: requests in flight, and connections whose
        // first request has not been read yet.
        while (worker.in_flight() > 0 || worker.fresh.get() > 0 || worker.h2_connections.get() > 0)
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
/// Each tick it publishes the worker's per-backend figures for `/upstreams` (what requests
/// touched since, and a twentieth of the groups in full) and sweeps that twentieth's expired
/// idle upstream connections; every second, after a burst, it also returns memory.
async fn heartbeat(worker: Rc<Worker>) {
    use crate::worker::TICKS_PER_SECOND;
    let period = Duration::from_millis(1000 / TICKS_PER_SECOND);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0u64.. {
        tick.tick().await;
        worker.publish(n);
        worker.sweep(n);
        if n % TICKS_PER_SECOND == 0 {
            worker.trim_memory();
        }
    }
}

/// Serves one accepted connection, counted in its listener's open connections.
fn spawn_connection(
    worker: &Rc<Worker>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    state: &Arc<ListenerState>,
) {
    state.open.fetch_add(1, Ordering::Relaxed);
    worker.connection_opened();
    // The first steps are a task of their own, which starts the connection's long-lived
    // task when they are done: see `setup::start`.
    let start = crate::downstream::setup::start(worker.clone(), stream, peer, state.clone());
    tokio::task::spawn_local(start);
}

/// On shutdown (or when a reload removes the listener), accepts what is already queued on
/// this socket, so those clients are served rather than reset when it closes. (With
/// `net.ipv4.tcp_migrate_req = 1`, connections still in the handshake move to another
/// socket on the same port: see the README's zero-downtime upgrade.)
fn drain_backlog(
    worker: &Rc<Worker>,
    listener: &tokio::net::TcpListener,
    state: &Arc<ListenerState>,
) {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    while let std::task::Poll::Ready(Ok((stream, peer))) = listener.poll_accept(&mut cx) {
        spawn_connection(worker, stream, peer, state);
    }
}

async fn accept_loop(
    worker: Rc<Worker>,
    listener: tokio::net::TcpListener,
    state: Arc<ListenerState>,
    mut stop: watch::Receiver<bool>,
    mut close: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            _ = close.wait_for(|s| *s) => break,
            accepted = listener.accept() => match accepted {
                // TCP_NODELAY is inherited from the listening socket: no setsockopt per accept.
                Ok((stream, peer)) => {
                    let (max, tls) = worker
                        .current()
                        .snapshot
                        .listeners
                        .iter()
                        .find(|l| *l.name == *state.name)
                        .map_or((0, false), |l| (l.max_connections, l.tls.is_some()));
                    if max > 0 && state.open.load(Ordering::Relaxed) >= max {
                        // Accepted and answered rather than left to time out in the backlog.
                        tokio::task::spawn_local(crate::downstream::connection::refuse(worker.clone(), stream, tls));
                        continue;
                    }
                    spawn_connection(&worker, stream, peer, &state);
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning, and log the
                    // condition, not every retry (it used to be 100 lines a second per worker).
                    worker.metrics.accept_errors.inc();
                    let logged = worker.accept_log.borrow_mut().allow(std::time::Instant::now());
                    if let Some(suppressed) = logged {
                        tracing::warn!(worker = worker.id, listener = %state.name, error = %e, suppressed, "accept failed");
                    }
                    tokio::time::sleep(crate::accept::BACKOFF).await;
                }
            }
        }
    }
    drain_backlog(&worker, &listener, &state);
}
