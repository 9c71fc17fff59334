//! A real OpenTelemetry Collector (the core OTLP receiver and the contrib file exporter, built
//! by `.ci/otelcol.sh` into `~/.cache/veloxy/bin/otelcol`) on loopback ports, for the tracing
//! tests: it receives OTLP/HTTP and OTLP/gRPC and writes every span it gets to a file as OTLP
//! JSON lines, which [`Collector::spans`] reads back.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running collector; killed on drop.
pub struct Collector {
    /// The OTLP/HTTP receiver.
    pub http: SocketAddr,
    /// The OTLP/gRPC receiver.
    pub grpc: SocketAddr,
    file: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

/// One span as the collector wrote it.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's SpanKind: 1 internal, 2 server, 3 client.
    pub kind: i64,
    /// Attribute values as strings (ints and bools printed).
    pub attributes: BTreeMap<String, String>,
    /// The resource's attributes (`service.name`, ...).
    pub resource: BTreeMap<String, String>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status: i64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The span's events: name and attributes, in order.
    pub events: Vec<(String, BTreeMap<String, String>)>,
}

impl Span {
    /// The attribute `key`, if set.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Collector {
    /// Starts one on free ports and waits until both receivers accept connections; `None`
    /// (and a SKIPPED line) when `.ci/otelcol.sh` has not built it.
    pub fn start() -> Option<Collector> {
        let bin = crate::kube::kube_bin("otelcol");
        if !bin.exists() {
            crate::skip(&format!(
                "{} is missing (built by .ci/otelcol.sh)",
                bin.display()
            ));
            return None;
        }
        // A port picked here may be taken by another test before the collector binds it:
        // then the collector exits, and a new pair of ports is tried.
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Collector::spawn(&bin) {
                Ok(c) => return Some(c),
                Err(e) => failures.push(e),
            }
        }
        panic!("otelcol did not start: {failures:#?}");
    }

    fn spawn(bin: &std::path::Path) -> Result<Collector, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("spans.jsonl");
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: {http}\n      grpc:\n        endpoint: {grpc}\n\
             exporters:\n  file:\n    path: {}\n    flush_interval: 50ms\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n    logs:\n      level: warn\n\
             \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
            file.display()
        );
        let config_path = dir.path().join("otelcol.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("otelcol.log")).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(format!("file:{}", config_path.display()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("otelcol starts");
        let mut c = Collector {
            http,
            grpc,
            file,
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let up = |a: &SocketAddr| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok();
        while !(up(&c.http) && up(&c.grpc)) {
            if let Ok(Some(status)) = c.child.try_wait() {
                return Err(format!("otelcol exited ({status}): {}", c.log()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "otelcol did not listen on {http} and {grpc}: {}",
                    c.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(c)
    }

    /// The collector's own log (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("otelcol.log")).unwrap_or_default()
    }

    /// `http://127.0.0.1:PORT`, the OTLP/HTTP endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Every span written so far.
    pub fn spans(&self) -> Vec<Span> {
        let text = std::fs::read_to_string(&self.file).unwrap_or_default();
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue; // a line being written
            };
            for rs in v["resourceSpans"].as_array().into_iter().flatten() {
                let resource = attributes(&rs["resource"]["attributes"]);
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for s in ss["spans"].as_array().into_iter().flatten() {
                        out.push(span(s, &resource));
                    }
                }
            }
        }
        out
    }

    /// Waits (up to 10 s) until `done(spans)` holds, and returns the spans then.
    pub fn wait(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; spans: {spans:#?}\ncollector log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Posts one span (OTLP/JSON over HTTP) as a backend's instrumentation would: `service`'s
    /// server span `name` in `trace_id` under `parent_id`.
    pub fn post_span(
        &self,
        service: &str,
        trace_id: &str,
        span_id: &str,
        parent_id: &str,
        name: &str,
    ) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let body = serde_json::json!({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
            "scopeSpans": [{"scope": {"name": "test-backend"}, "spans": [{
                "traceId": trace_id, "spanId": span_id, "parentSpanId": parent_id,
                "name": name, "kind": 2,
                "startTimeUnixNano": (now - 1_000_000).to_string(),
                "endTimeUnixNano": now.to_string(),
            }]}],
        }]})
        .to_string();
        let mut s = TcpStream::connect(self.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "POST /v1/traces HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.http,
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "the collector took the span: {answer}"
        );
    }
}

fn value(v: &serde_json::Value) -> String {
    for k in ["stringValue", "intValue", "boolValue", "doubleValue"] {
        match &v[k] {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) => return s.clone(),
            other => return other.to_string(),
        }
    }
    v.to_string()
}

fn attributes(list: &serde_json::Value) -> BTreeMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["key"].as_str().unwrap_or("").to_owned(),
                value(&a["value"]),
            )
        })
        .collect()
}

fn span(s: &serde_json::Value, resource: &BTreeMap<String, String>) -> Span {
    let text = |k: &str| s[k].as_str().unwrap_or("").to_owned();
    let ns = |k: &str| s[k].as_str().and_then(|v| v.parse().ok()).unwrap_or(0);
    Span {
        trace_id: text("traceId"),
        span_id: text("spanId"),
        parent_span_id: text("parentSpanId"),
        name: text("name"),
        kind: s["kind"].as_i64().unwrap_or(0),
        attributes: attributes(&s["attributes"]),
        resource: resource.clone(),
        status: s["status"]["code"].as_i64().unwrap_or(0),
        start_ns: ns("startTimeUnixNano"),
        end_ns: ns("endTimeUnixNano"),
        events: s["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let name = e["name"].as_str().unwrap_or("").to_owned();
                (name, attributes(&e["attributes"]))
            })
            .collect(),
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
