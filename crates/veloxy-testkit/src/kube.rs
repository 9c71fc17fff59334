//! A real kube-apiserver and etcd for the Kubernetes provider's tests (issue 37), and the
//! network namespace they run in.
//!
//! The API server refuses loopback addresses in EndpointSlices, so a test runs in a network
//! namespace of its own: [`in_netns`] re-executes the running test binary under `unshare -n`
//! (filtered to the one test, with [`INNER`] set) and asserts on its exit status; inside,
//! the test puts TEST-NET addresses on `lo` with [`ip`] (192.0.2.1 for the API server,
//! 192.0.2.10 and up for backends). [`Cluster`] runs `dev/kube/start.sh` (binaries from
//! `bash .ci/kube.sh`) and speaks to the API server with curl and the admin token. Without
//! `unshare` rights or the binaries, the test is reported skipped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

/// Set in the re-executed test process, inside the network namespace.
pub const INNER: &str = "VELOXY_KUBE_TEST_NETNS";

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `~/.cache/veloxy/bin/NAME` (or under `$VELOXY_CACHE`), where `.ci/kube.sh` puts them.
pub fn kube_bin(name: &str) -> PathBuf {
    let cache = std::env::var_os("VELOXY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/veloxy")
        });
    cache.join("bin").join(name)
}

/// True inside the network namespace: the test goes on. Outside, runs the test `name` again
/// in a new network namespace and asserts that it passed (or reports the test skipped), then
/// returns false: the caller returns.
pub fn in_netns(name: &str) -> bool {
    if std::env::var_os(INNER).is_some() {
        return true;
    }
    for b in ["etcd", "kube-apiserver"] {
        if !kube_bin(b).exists() {
            crate::skip(&format!(
                "no {} (run `bash .ci/kube.sh`)",
                kube_bin(b).display()
            ));
            return false;
        }
    }
    if !Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        crate::skip("unshare -n is not permitted here (needs root or user namespaces)");
        return false;
    }
    // Built (when stale) out here; the inner run takes it as it is.
    let upstream_bin = crate::UPSTREAM.path();
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let out = Command::new("unshare")
        .arg("-n")
        .arg(&exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(INNER, "1")
        .env("VELOXY_TEST_UPSTREAM_BIN", upstream_bin)
        .output()
        .expect("running the test in a network namespace");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "--- inner run ({:.1} s) ---\n{text}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "the test failed inside its network namespace"
    );
    assert!(
        text.contains("1 passed"),
        "the inner run ran no test: {text}"
    );
    false
}

/// Whether the Gateway API CRDs are in the cache (`bash .ci/kube.sh` fetches them; a test
/// in its network namespace cannot). Reports the test skipped when not.
pub fn gateway_crds_cached() -> bool {
    let version = std::env::var("VELOXY_GATEWAY_API_VERSION").unwrap_or("v1.6.3".into());
    let bin = kube_bin("x");
    let cache = bin.parent().and_then(Path::parent).unwrap();
    let stamp = cache
        .join("gateway-api-crds")
        .join(version)
        .join(".complete");
    if !stamp.exists() {
        crate::skip(&format!(
            "no Gateway API CRDs at {} (run `bash .ci/kube.sh`)",
            stamp.display()
        ));
        return false;
    }
    true
}

/// Prints veloxy's log when the test fails (hold it while the test runs).
pub struct DumpLogOnPanic<'a>(pub &'a crate::Veloxy);

impl Drop for DumpLogOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- veloxy's log ---\n{}", self.0.proc.log_text());
        }
    }
}

/// Polls `f` every 10 ms until it holds; how long that took, or a panic naming `what`.
pub fn within(
    limit: std::time::Duration,
    what: &str,
    mut f: impl FnMut() -> bool,
) -> std::time::Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return start.elapsed();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{what}: not within {limit:?}");
}

/// `ip ARGS...`, which must succeed.
pub fn ip(args: &[&str]) {
    let ok = Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {args:?} failed");
}

/// The API server of `dev/kube/start.sh`, stopped on drop.
pub struct Cluster {
    /// The address etcd and the API server bind to.
    addr: String,
    dir: tempfile::TempDir,
    url: String,
    token: String,
    ca: PathBuf,
    /// A kubeconfig with the admin token, for the program under test.
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// Starts etcd and the API server on `addr` (which must be on an interface).
    pub fn start(addr: &str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cluster {
            addr: addr.to_string(),
            dir,
            url: String::new(),
            token: String::new(),
            ca: PathBuf::new(),
            kubeconfig: PathBuf::new(),
        };
        c.up();
        let env = std::fs::read_to_string(c.dir.path().join("env")).unwrap();
        for line in env.lines() {
            match line.split_once('=') {
                Some(("APISERVER_URL", v)) => c.url = v.into(),
                Some(("TOKEN", v)) => c.token = v.into(),
                Some(("CA_FILE", v)) => c.ca = v.into(),
                Some(("KUBECONFIG", v)) => c.kubeconfig = v.into(),
                _ => {}
            }
        }
        c
    }

    /// Starts etcd and the API server (or only the API server, when etcd runs).
    pub fn up(&self) {
        let out = Command::new("bash")
            .arg(repo().join("dev/kube/start.sh"))
            .arg(self.dir.path())
            .env("VELOXY_KUBE_ADDRESS", &self.addr)
            .env("VELOXY_KUBE_START_TIMEOUT", "60")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "start.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Installs the Gateway API CRDs (standard channel, from the cache that
    /// `dev/kube/gateway-crds.sh --fetch` fills; see [`gateway_crds_cached`]) and waits until
    /// they are served.
    pub fn gateway_crds(&self) {
        let out = Command::new("bash")
            .arg(repo().join("dev/kube/gateway-crds.sh"))
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gateway-crds.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops `which` (`kube-apiserver`) or everything.
    pub fn stop(&self, which: Option<&str>) {
        let _ = Command::new("bash")
            .arg(repo().join("dev/kube/stop.sh"))
            .arg(self.dir.path())
            .args(which)
            .output();
    }

    /// One API call: (status, JSON body).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-X", method, "--cacert"])
            .arg(&self.ca)
            .args(["-H", &format!("Authorization: Bearer {}", self.token)])
            .args(["-w", "\n%{http_code}"]);
        if let Some(b) = body {
            let ctype = if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            cmd.args([
                "-H",
                &format!("Content-Type: {ctype}"),
                "--data-binary",
                &b.to_string(),
            ]);
        }
        let out = cmd.arg(format!("{}{path}", self.url)).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (json, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (
            code.trim().parse().unwrap_or(0),
            serde_json::from_str(json).unwrap_or(Value::Null),
        )
    }

    /// POSTs a YAML document to `path` (`?dryRun=All` to only validate it): (status, JSON body).
    pub fn post_yaml(&self, path: &str, yaml: &str) -> (u16, Value) {
        let mut child = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-X", "POST", "--cacert"])
            .arg(&self.ca)
            .args(["-H", &format!("Authorization: Bearer {}", self.token)])
            .args([
                "-H",
                "Content-Type: application/yaml",
                "--data-binary",
                "@-",
            ])
            .args(["-w", "\n%{http_code}"])
            .arg(format!("{}{path}", self.url))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(yaml.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (json, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (
            code.trim().parse().unwrap_or(0),
            serde_json::from_str(json).unwrap_or(Value::Null),
        )
    }

    /// Creates an object, which must succeed.
    pub fn create(&self, path: &str, body: Value) {
        let (code, answer) = self.call("POST", path, Some(&body));
        assert_eq!(code, 201, "POST {path}: {answer}");
    }

    /// Merge-patches an object, which must succeed.
    pub fn patch(&self, path: &str, body: Value) {
        let (code, answer) = self.call("PATCH", path, Some(&body));
        assert_eq!(code, 200, "PATCH {path}: {answer}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop(None);
    }
}
