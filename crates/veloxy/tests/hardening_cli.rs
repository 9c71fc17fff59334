//! What a new user sees first: `check`'s summary, where config errors point, error and log
//! text, signals, `--help`, the one-line modes' TLS options and their start-up hints.

use veloxy_testkit::*;

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to completion within 20 s (killed and reported otherwise), collecting its output.
/// Output is read on threads so a chatty child cannot block on a full pipe.
fn run_bounded(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not exit within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn veloxy_output(args: &[&str]) -> Output {
    let mut cmd = Command::new(VELOXY);
    cmd.args(args);
    run_bounded(cmd)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `veloxy check` on `config` written to a temp file: (exit success, stdout + stderr, path).
fn check(config: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("veloxy.toml");
    std::fs::write(&path, config).unwrap();
    let path = path.to_str().unwrap().to_owned();
    let out = veloxy_output(&["check", "--config", &path]);
    let all = text(&out.stdout) + &text(&out.stderr);
    (out.status.success(), all, path)
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

#[test]
fn check_counts_routes_as_written_and_pluralizes() {
    // Two routes without `listener` apply to both listeners; they still count once each.
    let (ok, out, path) = check(
        "[listeners.a]\naddr = \"127.0.0.1:8080\"\n[listeners.b]\naddr = \"127.0.0.1:8081\"\n\
         [[routes]]\npath = \"/x/\"\nupstream = \"app\"\n\
         [[routes]]\npath = \"/y/\"\nupstream = \"app\"\n\
         [[routes]]\nlistener = \"b\"\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"127.0.0.1:9001\"]\n",
    );
    assert!(ok, "{out}");
    assert_eq!(
        without_time(out.trim()),
        format!("{path}: ok (2 listeners, 3 routes, 1 upstream group)")
    );

    let (ok, out, path) = check(
        "[listeners.web]\naddr = \"127.0.0.1:8080\"\n[[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"127.0.0.1:9001\"]\n",
    );
    assert!(ok, "{out}");
    assert_eq!(
        without_time(out.trim()),
        format!("{path}: ok (1 listener, 1 route, 1 upstream group)")
    );
}

/// The `ok` line without its load time (`, in 0.01 s)` at the end), which must be there.
fn without_time(line: &str) -> String {
    let (head, time) = line.rsplit_once(", in ").expect("the load time");
    let secs = time.strip_suffix(" s)").expect("seconds");
    assert!(secs.parse::<f64>().is_ok(), "{line}");
    format!("{head})")
}

#[test]
fn tls_key_mismatch_is_reported_at_the_key_line() {
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (a_cert, _) = pki.leaf("a", &["a.test"], KeyKind::Ecdsa);
    let (b_cert, b_key) = pki.leaf("b", &["b.test"], KeyKind::Ecdsa);
    let (_, c_key) = pki.leaf("c", &["c.test"], KeyKind::Ecdsa);
    // Line 4: key of the default certificate; line 9: key of the [[certs]] entry.
    let config = format!(
        "[listeners.web]\naddr = \"127.0.0.1:8080\"\n[listeners.web.tls]\nkey = \"{}\"\ncert = \"{}\"\n\
         [[listeners.web.tls.certs]]\nhosts = [\"c.test\"]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"127.0.0.1:9001\"]\n",
        p(&b_key),
        p(&a_cert),
        p(&b_cert),
        p(&c_key),
    );
    let (ok, out, path) = check(&config);
    assert!(!ok);
    assert!(
        out.starts_with(&format!(
            "{path}:4:7: listeners.web.tls.key: {}: the private key does not match",
            p(&b_key)
        )),
        "{out}"
    );

    // With a matching default pair, the [[certs]] entry's key is the one reported.
    let (ok, out, path) = check(&config.replace(&p(&a_cert), &p(&b_cert)));
    assert!(!ok);
    assert!(
        out.starts_with(&format!(
            "{path}:9:7: listeners.web.tls.certs[0].key: {}: the private key does not match",
            p(&c_key)
        )),
        "{out}"
    );
}

#[test]
fn a_failed_bind_names_its_cause_once() {
    // An address no interface here has (TEST-NET-1): the bind itself fails with an OS error.
    // (A port held by another process is refused earlier, with its own message: see
    // hardening_fd.rs.)
    let listen = "192.0.2.1:8080";
    let out = veloxy_output(&["proxy", "--listen", listen, "--to", "127.0.0.1:9"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.matches("os error").count(), 1, "{err}");
    assert!(err.contains(&format!("cannot listen on {listen}")), "{err}");
}

#[test]
fn a_held_port_is_reported_once() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = held.local_addr().unwrap().to_string();
    let out = veloxy_output(&["proxy", "--listen", &listen, "--to", "127.0.0.1:9"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.matches("already in use").count(), 1, "{err}");
}

#[test]
fn a_missing_config_names_its_cause_once() {
    let out = veloxy_output(&["run", "--config", "/nonexistent/veloxy.toml"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn upstream_errors_log_the_backend_address_not_an_option() {
    let (dead, _held) = veloxy_testkit::refusing_addr();
    let v = veloxy(&simple_config(&[dead], "retries = 0"));
    assert_eq!(get(v.addr, "/").status, 502);
    assert!(
        eventually(Duration::from_secs(5), || v
            .proc
            .log_text()
            .contains("upstream error")),
        "no upstream error logged: {}",
        v.proc.log_text()
    );
    let log = v.proc.log_text();
    let line = log.lines().find(|l| l.contains("upstream error")).unwrap();
    assert!(line.contains(&format!("backend={dead}")), "{line}");
    assert!(!line.contains("Some("), "{line}");
}

#[test]
fn sigusr1_without_an_access_log_reopens_nothing() {
    let up = upstream(&[]);
    let v = veloxy(&simple_config(&[up.addr], ""));
    signal(v.proc.pid(), "-USR1");
    assert!(
        eventually(Duration::from_secs(5), || v
            .proc
            .log_text()
            .contains("SIGUSR1 ignored: no access log configured")),
        "{}",
        v.proc.log_text()
    );
    assert!(!v.proc.log_text().contains("reopened"));
    // Still serving.
    assert_eq!(get(v.addr, "/").status, 200);
}

#[test]
fn help_explains_config_https_backends_and_ca_file() {
    for cmd in ["run", "check"] {
        let out = veloxy_output(&[cmd, "--help"]);
        assert!(out.status.success());
        let help = text(&out.stdout);
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with("-c, --config <FILE>"))
            .unwrap_or_else(|| panic!("{help}"));
        assert!(line.contains("The TOML config file"), "{cmd}: {help}");
    }
    let help = text(&veloxy_output(&["proxy", "--help"]).stdout);
    assert!(help.contains("https://host:port"), "{help}");
    assert!(help.contains("--ca-file <FILE>"), "{help}");
}

#[test]
fn proxy_ca_file_verifies_https_backends() {
    // A TLS backend: a second veloxy terminating TLS in front of the test upstream, with a
    // certificate for 127.0.0.1 from a CA the system does not trust.
    let app = upstream(&["--name", "inner"]);
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("backend", &["127.0.0.1"], KeyKind::Ecdsa);
    let inner = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        p(&cert),
        p(&key),
        app.addr
    ));
    let to = format!("https://{}", inner.addr);
    let front = |extra: &[&str]| {
        let mut args = vec!["proxy", "--listen", "127.0.0.1:0", "--to", &to];
        args.extend_from_slice(&["--workers", "1"]);
        args.extend_from_slice(extra);
        veloxy_cmd(Command::new(VELOXY), &args, tempfile::tempdir().unwrap())
    };
    let ca = p(&pki.ca_pem);
    let trusted = front(&["--ca-file", &ca]);
    let r = get(trusted.addr, "/echo");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("x-upstream"), Some("inner"));
    // Without it the system roots are used, which do not know the test CA: 502.
    let untrusted = front(&[]);
    assert_eq!(get(untrusted.addr, "/echo").status, 502);
}

#[test]
fn self_signed_hint_prints_the_bound_port() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("index.html"), "hi").unwrap();
    let pki = tempfile::tempdir().unwrap();
    let v = veloxy_cmd(
        Command::new(VELOXY),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--root",
            site.path().to_str().unwrap(),
            "--tls-self-signed",
            "--tls-dir",
            pki.path().to_str().unwrap(),
            "--workers",
            "1",
        ],
        tempfile::tempdir().unwrap(),
    );
    let want = format!(
        "curl --cacert {} https://localhost:{}/",
        p(&pki.path().join("ca.pem")),
        v.addr.port()
    );
    assert!(
        eventually(Duration::from_secs(5), || v.proc.log_text().contains(&want)),
        "no {want:?} in:\n{}",
        v.proc.log_text()
    );
    assert!(!v.proc.log_text().contains(":PORT/"));
}

#[test]
fn toml_syntax_errors_keep_file_line_column_and_add_a_hint() {
    let (ok, out, path) =
        check("[listeners.web]\naddr = \"127.0.0.1:8080\"\n[[routes]]\nroot = \"C:\\\"\n");
    assert!(!ok);
    assert!(
        out.starts_with(&format!(
            "{path}:4:13: routes[0].root: invalid basic string; hint: "
        )),
        "{out}"
    );
    assert!(
        out.contains("use single quotes for Windows paths or regexes"),
        "{out}"
    );
}
