//! Hardening at the edges (issue #10): running out of file descriptors, local connect
//! failures, an admin endpoint on a public address, and ports held by another process.
//!
//! Descriptor exhaustion is provoked cheaply: veloxy runs with RLIMIT_NOFILE lowered to
//! [`NOFILE`] (set between fork and exec), and the test fills its table with idle client
//! connections, counting veloxy's open descriptors in /proc to know exactly when it is full.

use veloxy_testkit::*;

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// veloxy's descriptor limit in these tests: room for its own descriptors (about 20 with one
/// worker and the admin endpoint) plus a few dozen connections.
const NOFILE: usize = 64;

/// Runs veloxy on `config` with RLIMIT_NOFILE = [`NOFILE`].
fn veloxy_limited(config: &str) -> Veloxy {
    let mut cmd = Command::new(VELOXY);
    // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: NOFILE as libc::rlim_t,
                rlim_max: NOFILE as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    veloxy_with(cmd, config, &[])
}

/// Descriptors `pid` has open below [`NOFILE`]: the slots the limit allows. (Descriptors
/// inherited with higher numbers, e.g. from the test harness, show in /proc but take no slot.)
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<usize>().ok())
                .filter(|&fd| fd < NOFILE)
                .count()
        })
        .unwrap_or(0)
}

/// Polls `f` every millisecond until it holds or `limit` passes.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

/// veloxy's descriptor count once it has held still for 100 ms: a connection the test just
/// finished with may take a moment to close on veloxy's side.
fn settled_fds(pid: u32) -> usize {
    let start = Instant::now();
    let (mut last, mut since) = (open_fds(pid), Instant::now());
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "fd count never settled"
        );
        std::thread::sleep(Duration::from_millis(5));
        let n = open_fds(pid);
        if n != last {
            (last, since) = (n, Instant::now());
        } else if since.elapsed() >= Duration::from_millis(100) {
            return n;
        }
    }
}

/// Opens idle connections to `v` until veloxy has `target` descriptors open, waiting for each
/// to be accepted; returns them (dropping them gives the descriptors back).
fn hold_fds(v: &Veloxy, target: usize) -> Vec<TcpStream> {
    let pid = v.proc.pid();
    let base = settled_fds(pid);
    let mut held = Vec::new();
    while base + held.len() < target {
        held.push(TcpStream::connect(v.addr).expect("connect (kernel backlog)"));
        let want = base + held.len();
        assert!(
            within(Duration::from_secs(5), || open_fds(pid) >= want),
            "connection {} never accepted: veloxy has {} fds, {want} expected",
            held.len(),
            open_fds(pid)
        );
    }
    held
}

/// Fills veloxy's descriptor table, then queues `backlog` more connections it cannot accept:
/// from then on every accept fails with EMFILE.
fn exhaust_fds(v: &Veloxy, backlog: usize) -> Vec<TcpStream> {
    let mut held = hold_fds(v, NOFILE);
    for _ in 0..backlog {
        held.push(TcpStream::connect(v.addr).expect("connect (kernel backlog)"));
    }
    held
}

/// One admin request, or `None` if it cannot connect or gets no answer within `wait`.
fn try_admin(addr: SocketAddr, method: &str, path: &str, wait: Duration) -> Option<Response> {
    let mut c = Client::try_connect(addr).ok()?;
    c.stream.set_read_timeout(Some(wait)).unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    std::io::Write::write_all(&mut c.stream, req.as_bytes()).ok()?;
    c.try_read_response(false)
}

fn admin_get(addr: SocketAddr, path: &str) -> Response {
    try_admin(addr, "GET", path, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("admin {path} did not answer"))
}

/// One worker, the admin endpoint on an ephemeral loopback port, one group over `servers`.
fn limited_config(servers: &[SocketAddr], group_keys: &str) -> String {
    group_config(servers, group_keys, "")
        .replace("workers = 1", "workers = 1\nadmin = \"127.0.0.1:0\"")
}

/// Issue #10, 1: an accept error (here EMFILE) used to end the admin thread for good. Issue
/// 31, item 7: while the flood holds every descriptor, the admin endpoint still answers, again
/// and again, from the descriptors it keeps in reserve.
#[test]
fn admin_endpoint_survives_running_out_of_fds() {
    let up = upstream(&[]);
    let v = veloxy_limited(&limited_config(&[up.addr], ""));
    let admin = admin_addr(&v);
    assert_eq!(admin_get(admin, "/healthz").status, 200);

    let flood = exhaust_fds(&v, 4);
    // Accepting fails with EMFILE for the listeners; the admin endpoint gives up a reserved
    // descriptor for each of its connections and takes it back after.
    for path in ["/healthz", "/metrics", "/healthz", "/upstreams", "/healthz"] {
        let r = try_admin(admin, "GET", path, Duration::from_secs(5));
        assert_eq!(
            r.map(|r| r.status),
            Some(200),
            "admin {path} with no descriptor to spare: {}",
            v.proc.log_text()
        );
    }
    let pid = v.proc.pid();
    assert!(
        within(Duration::from_secs(5), || open_fds(pid) == NOFILE),
        "the flood (and the reserve) hold every slot: {}",
        open_fds(pid)
    );
    drop(flood);

    assert!(
        eventually(Duration::from_secs(5), || try_admin(
            admin,
            "GET",
            "/healthz",
            Duration::from_secs(1)
        )
        .is_some_and(|r| r.status == 200)),
        "admin /healthz never answered again after the descriptors came back: {}",
        v.proc.log_text()
    );
    assert_eq!(admin_get(admin, "/upstreams").status, 200);
}

/// The value of the first metric line starting with `prefix`, if any.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Issue #10, 5: out of descriptors, each worker used to log "accept failed" every 10 ms and
/// no metric showed it. Now: at most one line a second per worker, and a counter.
#[test]
fn accept_errors_are_logged_once_a_second_and_counted() {
    let up = upstream(&[]);
    let v = veloxy_limited(&limited_config(&[up.addr], ""));
    let admin = admin_addr(&v);
    let lines = |v: &Veloxy| v.proc.log_text().matches("accept failed").count();
    assert_eq!(lines(&v), 0);

    let flood = exhaust_fds(&v, 4);
    // The measurement window: accept keeps failing for this long.
    let window = Duration::from_secs(2);
    std::thread::sleep(window);
    let logged = lines(&v);
    drop(flood);
    eprintln!("{logged} \"accept failed\" lines in {window:?} with one worker out of descriptors");
    assert!(
        logged >= 1,
        "the condition is logged: {}",
        v.proc.log_text()
    );
    // One at the start, then at most one per second (one more for timing slack).
    assert!(
        logged <= 4,
        "{logged} \"accept failed\" lines in {window:?}"
    );

    let mut text = String::new();
    assert!(eventually(Duration::from_secs(5), || {
        text = try_admin(admin, "GET", "/metrics", Duration::from_secs(1))
            .map(|r| r.body_str())
            .unwrap_or_default();
        !text.is_empty()
    }));
    let counted = metric(&text, "veloxy_accept_errors_total ").unwrap_or(0.0);
    eprintln!("veloxy_accept_errors_total = {counted}");
    assert!(
        counted >= 10.0,
        "accept errors counted: {counted}, metrics:\n{text}"
    );
    let log = v.proc.log_text();
    assert!(
        log.lines()
            .filter(|l| l.contains("accept failed"))
            .skip(1)
            .all(|l| l.contains("suppressed=")),
        "later lines say how many were not logged:\n{log}"
    );
}

/// A backend as `/upstreams` shows it.
#[derive(Debug)]
struct BackendView {
    // Read through Debug, in assertion messages.
    #[allow(dead_code)]
    addr: String,
    usable: bool,
    consecutive_failures: u64,
    checks_passed: u64,
    checks_failed: u64,
}

/// The backends of the first group, from `/upstreams`.
fn backends(admin: SocketAddr) -> Vec<BackendView> {
    let body = admin_get(admin, "/upstreams").body_str();
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    json["upstreams"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| BackendView {
            addr: b["addr"].as_str().unwrap().to_owned(),
            usable: b["usable"].as_bool().unwrap(),
            consecutive_failures: b["consecutive_failures"].as_u64().unwrap(),
            checks_passed: b["checks_passed"].as_u64().unwrap(),
            checks_failed: b["checks_failed"].as_u64().unwrap(),
        })
        .collect()
}

/// Every backend usable, with no failure on record.
fn assert_spared(admin: SocketAddr) {
    for b in backends(admin) {
        assert!(b.usable, "backend taken out of rotation: {b:?}");
        assert_eq!(b.consecutive_failures, 0, "failures counted: {b:?}");
        assert_eq!(b.checks_failed, 0, "failed checks counted: {b:?}");
    }
}

/// Holds all but one of veloxy's descriptors, so each request takes the last one and its
/// upstream connect fails with EMFILE; checks the answers (503 with Retry-After), that
/// nothing counted against the backends, and that the local errors were counted. Returns
/// the held connections.
fn requests_without_a_descriptor_to_connect_with(v: &Veloxy, admin: SocketAddr) -> Vec<TcpStream> {
    let pid = v.proc.pid();
    let held = hold_fds(v, NOFILE - 1);
    for _ in 0..4 {
        let r = get(v.addr, "/");
        assert_eq!(r.status, 503, "local EMFILE answers 503: {}", r.body_str());
        assert_eq!(r.header("retry-after"), Some("1"));
        // The request's descriptor is back before the next request is sent.
        assert!(within(Duration::from_secs(5), || open_fds(pid) < NOFILE));
    }
    assert_spared(admin);
    let text = admin_get(admin, "/metrics").body_str();
    let local = metric(&text, "veloxy_upstream_local_errors_total ").unwrap_or(0.0);
    assert!(
        local >= 4.0,
        "local connect errors counted: {local}\n{text}"
    );
    held
}

/// Issue #10, 4: a local EMFILE on connect used to count as a backend failure (ejecting a
/// healthy backend) and answer 502.
#[test]
fn local_fd_exhaustion_answers_503_and_spares_the_backends() {
    let (a, b) = (upstream(&["--name", "a"]), upstream(&["--name", "b"]));
    // One failure would eject a backend if local errors still counted.
    let keys = "[upstreams.app.outlier]\nconsecutive_failures = 1\n";
    let v = veloxy_limited(&limited_config(&[a.addr, b.addr], keys));
    let admin = admin_addr(&v);
    let held = requests_without_a_descriptor_to_connect_with(&v, admin);
    drop(held);
    // Nothing was ejected, so requests work again at once, on both backends.
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = get(v.addr, "/");
        assert_eq!(r.status, 200, "{}", r.body_str());
        seen.push(r.header("x-upstream").unwrap().to_owned());
    }
    assert!(seen.contains(&"a".to_owned()) && seen.contains(&"b".to_owned()));
}

/// The same through the HTTP/1 -> HTTP/2 bridge (`protocol = "h2c"`), whose connect path must
/// classify local errors the same way. The backends are never reached.
#[test]
fn local_fd_exhaustion_on_an_h2c_upstream_answers_503_and_spares_the_backends() {
    let (a, b) = (upstream(&[]), upstream(&[]));
    let keys = "protocol = \"h2c\"\n[upstreams.app.outlier]\nconsecutive_failures = 1\n";
    let v = veloxy_limited(&limited_config(&[a.addr, b.addr], keys));
    let admin = admin_addr(&v);
    drop(requests_without_a_descriptor_to_connect_with(&v, admin));
}

/// Active health checks run in the same process: a probe that cannot even open a socket says
/// nothing about the backend and must not mark it down.
#[test]
fn active_checks_skip_probes_that_fail_locally() {
    let up = upstream(&[]);
    // A check every 50 ms; one failure marks a backend down and it takes 1000 passes to
    // come back, so a single wrongly counted probe shows.
    let keys = "[upstreams.app.health]\ninterval = \"50ms\"\nunhealthy = 1\nhealthy = 1000\n";
    let v = veloxy_limited(&limited_config(&[up.addr], keys));
    let admin = admin_addr(&v);
    assert!(eventually(Duration::from_secs(5), || backends(admin)[0]
        .checks_passed
        >= 2));
    let flood = exhaust_fds(&v, 2);
    // Several check intervals with no descriptor to probe with.
    std::thread::sleep(Duration::from_millis(500));
    drop(flood);
    assert!(eventually(Duration::from_secs(5), || try_admin(
        admin,
        "GET",
        "/healthz",
        Duration::from_secs(1)
    )
    .is_some_and(|r| r.status == 200)));
    assert_spared(admin);
    assert_eq!(get(v.addr, "/").status, 200);
}

/// Issue #10, 12, 17: an admin endpoint on a non-loopback address (backend addresses,
/// `POST /reload`, the runtime API) is refused without `admin_token_file`.
#[test]
fn admin_on_a_public_address_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("veloxy.toml");
    let public = simple_config(&["127.0.0.1:9".parse().unwrap()], "")
        .replace("workers = 1", "workers = 1\nadmin = \"0.0.0.0:0\"");
    std::fs::write(&path, &public).unwrap();
    let check = |path: &std::path::Path| {
        Command::new(VELOXY)
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("server.admin") && stderr.contains("admin_token_file"),
        "{stderr}"
    );

    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token-0123456789\n").unwrap();
    let with_token = public.replace(
        "workers = 1",
        &format!("workers = 1\nadmin_token_file = \"{}\"", token.display()),
    );
    std::fs::write(&path, &with_token).unwrap();
    let out = check(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let private = public.replace("0.0.0.0:0", "127.0.0.1:0");
    std::fs::write(&path, &private).unwrap();
    let out = check(&path);
    assert!(out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "no warning on loopback"
    );
}

use veloxy_testkit::pebble::free_port;

/// Runs `veloxy ARGS` until it exits (returns its status and stderr) or prints "listening"
/// (it started: killed, `None`), within 20 s.
fn run_until_exit_or_listening(args: &[&str]) -> Option<(std::process::ExitStatus, String)> {
    use std::io::BufRead;
    let mut child = Command::new(VELOXY)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("listening") => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
            }
            // Stderr closed: the process is exiting.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Some((child.wait().unwrap(), text))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("veloxy neither exited nor listened within 20 s: {text}");
            }
        }
    }
}

/// New-user friction: a second veloxy used to join a port held by another one (SO_REUSEPORT)
/// and silently split its traffic. Now it is refused unless `--upgrade` says it is meant.
#[test]
fn second_veloxy_on_a_held_port_is_refused_unless_upgrading() {
    let up = upstream(&[]);
    let port = free_port();
    let config = simple_config(&[up.addr], "").replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let first = veloxy(&config);
    let path = first.dir.path().join("veloxy.toml");
    let path = path.to_str().unwrap();

    let (status, stderr) = run_until_exit_or_listening(&["run", "--config", path])
        .expect("the second veloxy must not start on a held port");
    assert!(!status.success());
    let want = format!(
        "listener \"web\": 127.0.0.1:{port} is already in use by another process (another veloxy? use --upgrade for a zero-downtime binary upgrade)"
    );
    assert!(stderr.contains(&want), "clear error: {stderr}");

    let second = veloxy_with(Command::new(VELOXY), &config, &["--upgrade"]);
    assert_eq!(second.addr, first.addr, "--upgrade joins the port");
    assert_eq!(get(first.addr, "/").status, 200);
}

/// The admin endpoint follows the same rule, and shares its port under `--upgrade` (it used
/// to be bound without SO_REUSEPORT: the documented upgrade failed with "Address already in
/// use" whenever `admin` was set).
#[test]
fn admin_port_is_refused_when_held_and_shared_when_upgrading() {
    let up = upstream(&[]);
    let port = free_port();
    let config = simple_config(&[up.addr], "").replace(
        "workers = 1",
        &format!("workers = 1\nadmin = \"127.0.0.1:{port}\""),
    );
    let first = veloxy(&config);
    let admin = admin_addr(&first);
    let path = first.dir.path().join("veloxy.toml");

    let (status, stderr) =
        run_until_exit_or_listening(&["run", "--config", path.to_str().unwrap()])
            .expect("the second veloxy must not start on a held admin port");
    assert!(!status.success());
    assert!(
        stderr.contains(&format!(
            "admin endpoint: 127.0.0.1:{port} is already in use by another process"
        )),
        "clear error: {stderr}"
    );

    let second = veloxy_with(Command::new(VELOXY), &config, &["--upgrade"]);
    assert_eq!(admin_addr(&second), admin);
    drop(first);
    assert_eq!(
        admin_get(admin, "/healthz").status,
        200,
        "the new process answers"
    );
}

/// A reload that adds a listener probes its port the same way.
#[test]
fn reload_refuses_a_new_listener_on_a_port_held_by_another_process() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    // Another process's socket, with SO_REUSEPORT: a reuseport bind would silently join it.
    let other = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    other.set_reuse_port(true).unwrap();
    other
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    other.listen(16).unwrap();
    let held = other.local_addr().unwrap().as_socket().unwrap();

    let config = format!(
        "{}[listeners.extra]\naddr = \"{held}\"\n",
        simple_config(&[up.addr], "").replace("127.0.0.1:0", &v.addr.to_string())
    );
    reload_with(&v, &config, "reload refused");
    assert!(
        v.proc.log_text().contains(&format!(
            "listener \"extra\": {held} is already in use by another process"
        )),
        "{}",
        v.proc.log_text()
    );
    assert_eq!(get(v.addr, "/").status, 200, "the old config keeps serving");
}
