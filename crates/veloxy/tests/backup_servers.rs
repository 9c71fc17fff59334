//! `backup = true` servers (nginx's and HAProxy's `backup`, Envoy's priority 1): picked only
//! while every other server of the group is down, ejected or already tried.

use veloxy_testkit::*;

fn config(servers: &str, group_keys: &str) -> String {
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [{servers}]\n{group_keys}\n"
    )
}

#[test]
fn backups_serve_only_when_no_primary_can() {
    let a = upstream(&["--name", "a"]);
    let b = upstream(&["--name", "b"]);
    let c = upstream(&["--name", "c"]);
    // Two primaries and a backup: the backup gets nothing while they answer.
    let v = veloxy(&config(
        &format!(
            "\"{}\", \"{}\", {{ addr = \"{}\", backup = true }}",
            a.addr, c.addr, b.addr
        ),
        "",
    ));
    for _ in 0..20 {
        let r = get(v.addr, "/");
        assert_eq!(r.status, 200);
        assert_ne!(
            r.header("x-upstream"),
            Some("b"),
            "a backup while primaries answer"
        );
    }
    drop(v);
    // The only primary refuses connections: the retry goes to the backup, every time.
    let (dead_addr, _held) = veloxy_testkit::refusing_addr();
    let v = veloxy(&config(
        &format!(
            "\"{dead_addr}\", {{ addr = \"{}\", backup = true }}",
            b.addr
        ),
        "retries = 1",
    ));
    for _ in 0..5 {
        let r = get(v.addr, "/");
        assert_eq!((r.status, r.header("x-upstream")), (200, Some("b")));
    }
    // Marked down by an active check: the backup is picked first, no retry needed.
    drop(v);
    let v = veloxy(&config(
        &format!(
            "\"{dead_addr}\", {{ addr = \"{}\", backup = true }}",
            b.addr
        ),
        "retries = 0\n[upstreams.app.health]\ninterval = \"100ms\"\nunhealthy = 1\n",
    ));
    assert!(
        eventually(std::time::Duration::from_secs(5), || {
            let r = get(v.addr, "/");
            r.status == 200 && r.header("x-upstream") == Some("b")
        }),
        "the backup serves once the primary is down"
    );
}

#[test]
fn a_group_of_only_backups_is_refused_and_backup_is_printed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.toml");
    std::fs::write(
        &path,
        config("{ addr = \"127.0.0.1:9001\", backup = true }", ""),
    )
    .unwrap();
    let out = std::process::Command::new(VELOXY)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("every server is a backup"),
        "{err}"
    );
    std::fs::write(
        &path,
        config(
            "\"127.0.0.1:9001\", { addr = \"127.0.0.1:9002\", backup = true }",
            "",
        ),
    )
    .unwrap();
    let out = std::process::Command::new(VELOXY)
        .args(["check", "--print", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("{ addr = \"127.0.0.1:9002\", weight = 1, backup = true }"),
        "{printed}"
    );
}
