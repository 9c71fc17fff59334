//! `veloxy check` compiles a config and starts nothing (issue 34): with Redis, a disk cache,
//! ACME and a search cluster configured, it makes no more threads, sockets or directories
//! than it does for a minimal config (the Rust runtime and the allocator may make some of
//! their own before `main`), and the disk cache's directory is not created.

use std::path::Path;
use std::process::Command;

use veloxy_testkit::*;

/// The clone/clone3, socket and mkdir/mkdirat calls of `veloxy check` on `config`, counted
/// by strace over the process and any child it makes.
fn counted(dir: &Path, name: &str, config: &str) -> (usize, usize, usize) {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    let trace = dir.join(format!("{name}.strace"));
    let out = Command::new("strace")
        .args(["-f", "-e", "trace=clone,clone3,socket,mkdir,mkdirat", "-o"])
        .arg(&trace)
        .arg(VELOXY)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .expect("strace");
    assert!(out.status.success(), "{}", output_text(&out));
    let text = std::fs::read_to_string(&trace).unwrap();
    let calls = |names: &[&str]| {
        text.lines()
            .filter(|l| {
                // `PID name(` (with -f), or `name(` for a lone process.
                let call = l.split_once(' ').map_or(*l, |(_, rest)| rest).trim_start();
                names.iter().any(|n| call.starts_with(&format!("{n}(")))
            })
            .count()
    };
    (
        calls(&["clone", "clone3"]),
        calls(&["socket"]),
        calls(&["mkdir", "mkdirat"]),
    )
}

#[test]
fn check_makes_no_thread_socket_or_directory() {
    if !require("strace", "-V", "strace is not installed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let minimal = "[listeners.web]\naddr = \"127.0.0.1:0\"\n\
                   [[routes]]\nrespond = { body = \"hello\" }\n";
    let base = counted(dir.path(), "minimal", minimal);
    let cache = dir.path().join("cache");
    let storage = dir.path().join("acme");
    let full = format!(
        "[server]\nworkers = 2\n\
         [server.redis]\nurl = \"redis://127.0.0.1:1\"\n\
         [server.acme]\nemail = \"ops@example.test\"\n\
         directory = \"https://127.0.0.1:1/dir\"\nstorage = \"{}\"\n\
         [caches.c]\nmemory = \"16MiB\"\ndisk = {{ path = \"{}\" }}\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [listeners.web.tls]\nacme = [\"a.test\"]\n\
         [listeners.plain]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nlistener = \"plain\"\npath = \"/search\"\nupstream = \"es\"\n\
         search = {{}}\n\
         [[routes]]\nupstream = \"app\"\ncache = {{ store = \"c\" }}\n\
         rate_limit = {{ rate = \"10/s\", scope = \"global\" }}\n\
         [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n\
         [upstreams.es]\nservers = [\"127.0.0.1:1\"]\n\
         search = {{ kind = \"opensearch\" }}\n",
        storage.display(),
        cache.display(),
    );
    let seen = counted(dir.path(), "full", &full);
    assert_eq!(
        seen, base,
        "(threads, sockets, directories) made by check: with Redis, a disk cache, ACME and \
         a search group vs a minimal config"
    );
    assert!(!cache.exists(), "check created the disk cache's directory");
    assert!(!storage.exists(), "check created the ACME storage");
}
