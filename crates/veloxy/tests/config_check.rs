//! Golden tests for `veloxy check`: each `golden/NAME.toml` is checked and the output compared
//! with `golden/NAME.out` (`$FILE` stands for the config's path). Set `VELOXY_BLESS=1` to
//! rewrite the expected files after an intended change, then review the diff.

use std::path::Path;
use std::process::Command;

#[test]
fn check_output_matches_golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let cases = veloxy_testkit::golden_cases(&dir);
    assert!(cases.len() >= 10);
    veloxy_testkit::assert_golden(cases.into_iter().map(|case| {
        let out = Command::new(veloxy_testkit::VELOXY)
            .args(["check", "--config"])
            .arg(&case)
            .output()
            .unwrap();
        let text = veloxy_testkit::output_text(&out).replace(case.to_str().unwrap(), "$FILE");
        (case, without_load_time(&text))
    }));
}

/// `..., in 0.02 s)` on the `ok` line becomes `..., in $TIME s)`: the time varies.
fn without_load_time(text: &str) -> String {
    text.lines()
        .map(|l| match (l.contains(": ok ("), l.rfind(", in ")) {
            (true, Some(i)) if l.ends_with(" s)") => format!("{}, in $TIME s)", &l[..i]),
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + if text.ends_with('\n') { "\n" } else { "" }
}

#[test]
fn run_refuses_a_bad_config_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"x\"\n",
    )
    .unwrap();
    let out = Command::new(veloxy_testkit::VELOXY)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:4:12: routes[0].upstream"), "{err}");
}

/// Issue 32, item 1: the nginx idiom `listen 80; listen [::]:80;` as two listeners on one port
/// starts and serves both families (IPv6 listeners are IPv6-only), where it failed at start
/// with "already in use by another process".
#[test]
fn ipv4_and_ipv6_wildcards_share_a_port() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        veloxy_testkit::skip("no IPv6 loopback on this machine");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let v = veloxy_testkit::veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.v4]\naddr = \"0.0.0.0:{port}\"\n\
         [listeners.v6]\naddr = \"[::]:{port}\"\n[[routes]]\nrespond = {{ body = \"ok\" }}\n"
    ));
    for addr in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        let r = veloxy_testkit::get(addr.parse().unwrap(), "/");
        assert_eq!((r.status, r.body_str().as_str()), (200, "ok"), "{addr}");
    }
    drop(v);
}
