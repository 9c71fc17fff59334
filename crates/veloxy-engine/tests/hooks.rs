//! The library API end to end: an in-process server with hooks and a custom policy.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use veloxy_engine::config::compile::compile_str;
use veloxy_engine::hooks::{Hooks, RequestCtx, RequestInfo, RequestSummary};
use veloxy_engine::upstream::balancer::{BackendInfo, PickContext, Picker, Policy, PolicyRegistry};
use veloxy_engine::Server;

/// A one-thread origin that answers every request with its received head as the body.
fn echo_origin() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            std::thread::spawn(move || loop {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", head.len());
                if s.write_all(resp.as_bytes())
                    .and_then(|_| s.write_all(&head))
                    .is_err()
                {
                    return;
                }
            });
        }
    });
    addr
}

struct Gate {
    done: Arc<AtomicUsize>,
}

impl Hooks for Gate {
    fn on_request(&self, req: &RequestInfo, ctx: &mut RequestCtx) -> Result<(), u16> {
        if req.header("x-api-key") != Some(b"secret") {
            return Err(401);
        }
        ctx.add_upstream_header("x-authenticated", req.upstream);
        ctx.data = Some(Box::new(req.path.to_owned()));
        Ok(())
    }
    fn on_response(&self, status: u16, ctx: &mut RequestCtx) {
        let path = ctx
            .data
            .as_ref()
            .and_then(|d| d.downcast_ref::<String>())
            .cloned()
            .unwrap_or_default();
        ctx.add_response_header("x-hooked", &format!("{status} {path}"));
    }
    fn on_done(&self, summary: &RequestSummary, _ctx: &mut RequestCtx) {
        assert!(summary.backend.is_some());
        self.done.fetch_add(1, Ordering::SeqCst);
    }
}

/// Always the last backend: proves the configured custom policy is the one picking.
struct Last;
struct LastPicker(usize);
impl Picker for LastPicker {
    fn pick(&mut self, _ctx: &PickContext) -> Option<usize> {
        Some(self.0 - 1)
    }
}
impl Policy for Last {
    fn name(&self) -> &str {
        "last"
    }
    fn new_picker(&self, backends: &[BackendInfo]) -> Box<dyn Picker> {
        Box::new(LastPicker(backends.len()))
    }
}

fn roundtrip(addr: std::net::SocketAddr, raw: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn hooks_and_custom_policy() {
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let origin = echo_origin();
    let mut policies = PolicyRegistry::with_builtins();
    policies.register(Arc::new(Last));
    let toml = format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"{dead}\", \"{origin}\"]\npolicy = \"last\"\n"
    );
    let snapshot = compile_str(Path::new("test.toml"), &toml, &policies).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let running = Server::new(snapshot)
        .with_hooks(Arc::new(Gate { done: done.clone() }))
        .start()
        .unwrap();
    let addr = running.local_addrs()[0].1;

    let denied = roundtrip(
        addr,
        "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");

    let ok = roundtrip(
        addr,
        "GET /p HTTP/1.1\r\nHost: a\r\nX-Api-Key: secret\r\nConnection: close\r\n\r\n",
    );
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("x-hooked: 200 /p\r\n"), "{ok}");
    assert!(ok.contains("x-authenticated: app\r\n"), "{ok}");
    assert_eq!(done.load(Ordering::SeqCst), 1);
    running.shutdown();
}

/// Counts phases and refuses requests without a key, on any route.
struct FileGate {
    phases: Arc<AtomicUsize>,
}

impl Hooks for FileGate {
    fn on_request(&self, req: &RequestInfo, _ctx: &mut RequestCtx) -> Result<(), u16> {
        self.phases.fetch_add(1, Ordering::SeqCst);
        if req.header("x-api-key") != Some(b"secret") {
            return Err(403);
        }
        Ok(())
    }
    fn on_response(&self, status: u16, ctx: &mut RequestCtx) {
        self.phases.fetch_add(10, Ordering::SeqCst);
        ctx.add_response_header("x-hooked", &status.to_string());
    }
    fn on_done(&self, summary: &RequestSummary, _ctx: &mut RequestCtx) {
        assert!(summary.backend.is_none(), "a file route has no backend");
        self.phases.fetch_add(100, Ordering::SeqCst);
    }
}

/// Hooks run on file routes too: the exchange core admits every route the same way.
#[test]
fn hooks_run_on_file_routes() {
    let dir = std::env::temp_dir().join(format!("veloxy-hooks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.txt"), "hello").unwrap();
    let toml = format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\npath = \"/static/\"\nroot = {:?}\n",
        dir.to_str().unwrap()
    );
    let snapshot = compile_str(
        Path::new("test.toml"),
        &toml,
        &PolicyRegistry::with_builtins(),
    )
    .unwrap();
    let phases = Arc::new(AtomicUsize::new(0));
    let running = Server::new(snapshot)
        .with_hooks(Arc::new(FileGate {
            phases: phases.clone(),
        }))
        .start()
        .unwrap();
    let addr = running.local_addrs()[0].1;
    let denied = roundtrip(
        addr,
        "GET /static/a.txt HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    let ok = roundtrip(
        addr,
        "GET /static/a.txt HTTP/1.1\r\nHost: a\r\nX-Api-Key: secret\r\nConnection: close\r\n\r\n",
    );
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("x-hooked: 200\r\n"), "{ok}");
    assert!(ok.ends_with("hello"), "{ok}");
    // Two on_request, one on_response, one on_done.
    assert_eq!(phases.load(Ordering::SeqCst), 112);
    running.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
