//! HTTP/2 conformance: h2spec (github.com/summerwind/h2spec) against veloxy, over TLS (h2 by
//! ALPN) and h2c prior knowledge. `.ci/run` installs h2spec and sets `VELOXY_REQUIRE_H2SPEC`,
//! so CI fails rather than skips when it is missing; elsewhere the test skips without it.
//!
//! Expected: every case passes over TLS. On an h2c listener, which also serves HTTP/1.1 on the
//! same port, one case differs by design: "3.5/2 Sends invalid connection preface" sends
//! `INVALID CONNECTION PREFACE\r\n\r\n`, which is a malformed HTTP/1.1 request there, so veloxy
//! answers it `400` and closes (h2spec wants the close alone). A broken preface that starts
//! with `PRI ` is closed without an answer.

use veloxy_testkit::*;

use std::path::PathBuf;
use std::process::Command;

fn h2spec() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("H2SPEC") {
        return Some(PathBuf::from(p));
    }
    if Command::new("h2spec").arg("--version").output().is_ok() {
        return Some(PathBuf::from("h2spec"));
    }
    let home = PathBuf::from(std::env::var("HOME").ok()?).join("go/bin/h2spec");
    home.exists().then_some(home)
}

/// Runs h2spec; returns (passed, failed, failure descriptions).
fn run(bin: &PathBuf, port: u16, tls: bool) -> (u32, u32, String) {
    let mut cmd = Command::new(bin);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-o", "5"]);
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let out = cmd.output().expect("run h2spec");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = text
        .lines()
        .find(|l| l.contains(" tests, ") && l.contains(" passed"))
        .unwrap_or_else(|| panic!("no h2spec summary in:\n{text}"));
    let num = |word: &str| -> u32 {
        let words: Vec<&str> = summary
            .split([' ', ','])
            .filter(|w| !w.is_empty())
            .collect();
        words
            .iter()
            .position(|w| *w == word)
            .and_then(|i| words[i - 1].parse().ok())
            .unwrap_or(0)
    };
    let failures = text.split("Failures:").nth(1).unwrap_or("").to_owned();
    println!("h2spec ({}): {summary}", if tls { "TLS" } else { "h2c" });
    (num("passed"), num("failed"), failures)
}

#[test]
fn h2spec_conformance() {
    let Some(bin) = h2spec() else {
        assert!(
            std::env::var_os("VELOXY_REQUIRE_H2SPEC").is_none(),
            "VELOXY_REQUIRE_H2SPEC is set but h2spec was not found"
        );
        return skip(
            "h2spec not installed (go install github.com/summerwind/h2spec/cmd/h2spec@latest)",
        );
    };
    let up = upstream(&[]);
    let pki = tempfile::tempdir().unwrap();
    let tls = veloxy_cmd(
        Command::new(VELOXY),
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--to",
            &up.addr.to_string(),
            "--tls-self-signed",
            "--tls-dir",
            pki.path().to_str().unwrap(),
            "--workers",
            "1",
        ],
        tempfile::tempdir().unwrap(),
    );
    let (passed, failed, failures) = run(&bin, tls.addr.port(), true);
    assert!(passed >= 145, "TLS: {passed} passed");
    assert_eq!(failed, 0, "TLS failures:\n{failures}");

    let h2c = veloxy(&simple_config(&[up.addr], "").replace(
        "addr = \"127.0.0.1:0\"",
        "addr = \"127.0.0.1:0\"\nhttp2 = true",
    ));
    let (passed, failed, failures) = run(&bin, h2c.addr.port(), false);
    assert!(passed >= 144, "h2c: {passed} passed");
    assert!(failed <= 1, "h2c failures:\n{failures}");
    if failed == 1 {
        assert!(
            failures.contains("Sends invalid connection preface"),
            "only the documented case may fail on h2c:\n{failures}"
        );
    }
}
