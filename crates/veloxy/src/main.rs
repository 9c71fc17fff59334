//! The `veloxy` command: composes the engine from a config file or from one-line CLI modes.
//!
//! * `veloxy run [--config FILE]`: run from a file; without one, the built-in demo (see
//!   [`demo`]): a listener on 127.0.0.1:8080 balancing over two in-process demo backends.
//!   A port another process holds is refused unless `--upgrade` (also on `proxy` and `serve`)
//!   says this is a zero-downtime binary upgrade.
//! * `veloxy check --config FILE [--print]`: validate and exit (0 ok, 1 with
//!   `file:line:column: key: ...`); `--print` writes the compiled config as TOML.
//! * `veloxy proxy --listen ADDR --to ADDR [--to ADDR ...] [--workers N]`: round robin proxy.
//! * `veloxy serve [--listen ADDR] [--root DIR] [--browse] [--fallback FILE]`: file server.
//! * `veloxy completions SHELL`, and the hidden `veloxy manpage`: see [`manual`].

mod cli;
mod demo;
mod import;
mod kube;
mod local_ca;
mod manual;

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use veloxy_engine::config::{compile::compile_str, Snapshot};
use veloxy_engine::upstream::balancer::PolicyRegistry;
use veloxy_engine::Server;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("veloxy: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `context: cause: cause`, like anyhow's `{:#}`, but each cause once. The engine's errors
/// put their cause in their own message (so `to_string()`, used in logs and `POST /reload`
/// answers, is complete) and also return it from `source()`; `{:#}` would print it twice
/// (`Address already in use (os error 98): Address already in use (os error 98)`).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// rustls warns once per handshake when a client sends an IP address as SNI (wrk and some
/// HTTP libraries do; RFC 6066 allows only host names) and then serves it as if it had sent
/// none. One line and one write per handshake is log spam and CPU nobody asked for, so that
/// module logs only errors, unless `RUST_LOG` or the config's `log` filter names rustls.
/// The Kubernetes client's own lines (several per failed watch, each retry) are left out
/// too: the provider logs each watch failure once, with its cause, and its recovery.
const QUIET_TARGETS: &str =
    "rustls::msgs::handshake=error,kube_client=off,kube_runtime=off,hyper_util=off";

fn init_logging(default_level: &str) {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| default_level.to_string());
    let filter = if spec.contains("rustls") {
        tracing_subscriber::EnvFilter::new(spec)
    } else {
        tracing_subscriber::EnvFilter::new(format!("{spec},{QUIET_TARGETS}"))
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn run(cli: Cli) -> Result<ExitCode> {
    let policies = PolicyRegistry::with_builtins();
    match cli.command {
        Command::Check { config, print } => {
            let started = std::time::Instant::now();
            match veloxy_engine::config::load_file_with(&config, &policies) {
                Ok(s) => {
                    for w in &s.warnings {
                        eprintln!("{w}");
                    }
                    // With --print, stdout is only the config, so it can be redirected to a
                    // file and used as one.
                    if print {
                        print!("{}", veloxy_engine::config::print::render(&s));
                    } else {
                        let took = started.elapsed().as_secs_f64();
                        println!("{}: ok ({}, in {took:.2} s)", config.display(), summary(&s));
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("{e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Run {
            config: Some(path),
            upgrade,
        } => {
            let snapshot = veloxy_engine::config::load_file_with(&path, &policies)?;
            serve(snapshot, Some(&path), &policies, upgrade, None)
        }
        Command::Run {
            config: None,
            upgrade,
        } => {
            let backends =
                demo::start_backends(2).context("starting the built-in demo backends")?;
            let toml = demo::default_config(&backends);
            let snapshot = compile_str(Path::new("<built-in default>"), &toml, &policies)?;
            eprintln!("veloxy: no --config given: running the built-in default.");
            eprintln!(
                "  http://127.0.0.1:8080/ is load-balanced (round robin) over two demo backends:"
            );
            for b in &backends {
                eprintln!("    {b}");
            }
            eprintln!(
                "  try: curl -i http://127.0.0.1:8080/   (twice, and watch x-upstream change)"
            );
            serve(snapshot, None, &policies, upgrade, None)
        }
        Command::Import(args) => import::run(args),
        Command::Completions { shell } => {
            manual::completions(shell, &mut std::io::stdout().lock())
                .context("writing the completion script")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Trust { install, dir } => local_ca::trust(dir.as_deref(), install),
        Command::Manpage => {
            manual::manpage(&mut std::io::stdout().lock()).context("writing the man page")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Proxy(args) => {
            let tls = args.tls.resolve()?;
            let toml = cli::proxy_config(&args, tls.as_ref());
            let snapshot = compile_str(Path::new("<command line>"), &toml, &policies)?;
            let local_ca = tls.as_ref().and_then(|t| t.local_ca.as_deref());
            serve(snapshot, None, &policies, args.upgrade, local_ca)
        }
        Command::Serve(args) => {
            let tls = args.tls.resolve()?;
            let toml = cli::serve_config(&args, tls.as_ref());
            let snapshot = compile_str(Path::new("<command line>"), &toml, &policies)?;
            let local_ca = tls.as_ref().and_then(|t| t.local_ca.as_deref());
            serve(snapshot, None, &policies, args.upgrade, local_ca)
        }
    }
}

/// `1 listener, 3 routes, 1 upstream group`: what `check` found, counted as written in the
/// file. A route without `listener` is compiled into every listener's router, so routes are
/// counted by their position in the file, not by router entries.
fn summary(s: &Snapshot) -> String {
    let routes: std::collections::BTreeSet<usize> = s
        .listeners
        .iter()
        .flat_map(|l| l.router.routes().iter().map(|r| r.index))
        .collect();
    let count =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    format!(
        "{}, {}, {}",
        count(s.listeners.len(), "listener", "listeners"),
        count(routes.len(), "route", "routes"),
        count(s.upstreams.len(), "upstream group", "upstream groups")
    )
}

/// Starts the server and blocks until SIGTERM/SIGINT; SIGHUP reloads `config` when there is one.
/// Ports another process holds are refused unless `upgrade` (`--upgrade`) says it is meant.
/// `local_ca`: the CA of `--tls-self-signed`, for a `curl --cacert` hint with the bound port.
fn serve(
    snapshot: Snapshot,
    config: Option<&Path>,
    policies: &PolicyRegistry,
    upgrade: cli::UpgradeArg,
    local_ca: Option<&Path>,
) -> Result<ExitCode> {
    init_logging(&snapshot.settings.log_level);
    for w in &snapshot.warnings {
        tracing::warn!("{w}");
    }
    let workers = snapshot.settings.workers;
    // The access log is set up at start only (a reload cannot add one), so this holds for the
    // life of the process.
    let has_access_log = snapshot.settings.access_log.is_some();
    // Signal handlers go in before anything is bound: SIGHUP, SIGUSR1 and SIGTERM terminate a
    // process by default, so one sent as soon as `listening` is logged (by a supervisor, a
    // logrotate run, a test) must already find them.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the signal runtime")?;
    let (term, int, hup, usr1) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _runtime = rt.enter();
        let listen = |kind| signal(kind).context("installing signal handlers");
        (
            listen(SignalKind::terminate())?,
            listen(SignalKind::interrupt())?,
            listen(SignalKind::hangup())?,
            listen(SignalKind::user_defined1())?,
        )
    };
    let kubernetes = snapshot.settings.kubernetes.clone();
    let running = Server::new(snapshot).upgrade(upgrade.upgrade).start()?;
    for (name, addr) in running.local_addrs() {
        tracing::info!(listener = %name, %addr, workers, "listening");
        if let Some(ca) = local_ca {
            // The certificate names localhost, 127.0.0.1 and ::1; the port is the bound one
            // (`--listen 127.0.0.1:0` picks it only now).
            eprintln!(
                "  trust it with e.g.: curl --cacert {} https://localhost:{}/",
                ca.display(),
                addr.port()
            );
        }
    }
    if let Some(addr) = running.admin_addr() {
        tracing::info!(%addr, "admin endpoint ready (/metrics, /healthz, /upstreams, POST /reload)");
    }
    let signals = Signals {
        term,
        int,
        hup,
        usr1,
    };
    let served = std::thread::scope(|scope| -> Result<()> {
        // The Kubernetes provider runs beside the server on its own thread and applies its
        // configs itself; SIGHUP and POST /reload go through it (it owns the merged config).
        let provider = match (kubernetes, config) {
            (Some(spec), Some(path)) => Some(
                kube::start(scope, spec, path, &running)
                    .context("starting the Kubernetes provider")?,
            ),
            _ => None,
        };
        let result = rt.block_on(wait(
            &running,
            config,
            policies,
            provider.as_ref(),
            has_access_log,
            signals,
        ));
        if let Some(p) = provider {
            p.stop();
        }
        result
    });
    if let Err(e) = served {
        running.shutdown();
        return Err(e);
    }
    tracing::info!("shutting down: finishing in-flight requests");
    running.shutdown();
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// The signals the main loop reacts to.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

/// How long SIGHUP or `POST /reload` waits for the Kubernetes provider's rebuild.
const PROVIDER_RELOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves until SIGTERM/SIGINT: SIGUSR1 reopens the access log; SIGHUP and `POST /reload`
/// reload `config` (through `provider` when there is one).
async fn wait(
    running: &veloxy_engine::Running,
    config: Option<&Path>,
    policies: &PolicyRegistry,
    provider: Option<&kube::Provider<'_>>,
    has_access_log: bool,
    mut sig: Signals,
) -> Result<()> {
    // SIGHUP and POST /reload share one path: parse and validate the file first, swap only a
    // good config, keep the running one otherwise.
    let reload = |path: &Path| -> Result<String, String> {
        let t = std::time::Instant::now();
        let current = running.snapshot();
        let snapshot = veloxy_engine::config::load_file_after(path, policies, &current)
            .map_err(|e| e.to_string())?;
        drop(current);
        for w in &snapshot.warnings {
            tracing::warn!("{w}");
        }
        let reused = snapshot.reused_routes();
        let (hosts, of_hosts) = snapshot.reused_hosts();
        running.reload(snapshot).map_err(|e| e.to_string())?;
        let took = t.elapsed().as_secs_f64();
        Ok(match reused {
            Some((taken, of)) => format!(
                "reloaded {} in {took:.2} s ({taken} of {of} route entries unchanged, \
                 {hosts} of {of_hosts} hosts' routing tables reused)",
                path.display()
            ),
            None => format!("reloaded {} in {took:.2} s", path.display()),
        })
    };
    let reload_any = |path: &Path| {
        let pending = provider.map(|p| p.reload_file());
        let direct = pending.is_none().then(|| reload(path));
        async move {
            match (direct, pending) {
                (Some(result), _) => result,
                (None, Some(rx)) => match tokio::time::timeout(PROVIDER_RELOAD_TIMEOUT, rx).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(_)) => Err("the Kubernetes provider has stopped".to_owned()),
                    Err(_) => Err("the Kubernetes provider did not answer within 30 s".to_owned()),
                },
                (None, None) => Err("nothing to reload".to_owned()),
            }
        }
    };
    let report = |result: &Result<String, String>| match result {
        // A reload only succeeds with a config file, so `config` is set here; a `None`
        // would leave the field out rather than print `Some(...)`.
        Ok(msg) => tracing::info!(
            config = config.map(|p| tracing::field::display(p.display())),
            "{msg}"
        ),
        Err(e) => tracing::error!(error = %e, "reload refused; the running config stays"),
    };
    let mut admin_reloads = running.take_reload_requests();
    loop {
        tokio::select! {
            _ = sig.term.recv() => break,
            _ = sig.int.recv() => break,
            _ = sig.usr1.recv() => {
                if has_access_log {
                    running.reopen_access_log();
                    tracing::info!("access log reopened");
                } else {
                    tracing::info!("SIGUSR1 ignored: no access log configured");
                }
            }
            _ = sig.hup.recv() => match config {
                None => tracing::warn!("SIGHUP ignored: no config file to reload"),
                Some(path) => report(&reload_any(path).await),
            },
            Some(req) = async { match admin_reloads.as_mut() { Some(rx) => rx.recv().await, None => None } } => {
                let result = match config {
                    None => Err("no config file to reload (started without --config)".to_owned()),
                    Some(path) => reload_any(path).await,
                };
                report(&result);
                let _ = req.reply.send(result);
            }
        }
    }
    Ok(())
}
