//! Golden tests for `veloxy check`: each `golden/NAME.toml` is checked and the output compared
//! with `golden/NAME.out` (`$FILE` stands for the config's path). Set `VELOXY_BLESS=1` to
//! rewrite the expected files after an intended change, then review the diff.

use std::path::Path;
use std::process::Command;

#[test]
fn check_output_matches_golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var_os("VELOXY_BLESS").is_some();
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for case in cases {
        let out = Command::new(veloxy_testkit::VELOXY)
            .args(["check", "--config"])
            .arg(&case)
            .output()
            .unwrap();
        let text = format!(
            "exit: {}\n{}{}",
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .replace(case.to_str().unwrap(), "$FILE");
        let golden = case.with_extension("out");
        if bless {
            std::fs::write(&golden, &text).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        if want != text {
            failures.push(format!(
                "{}:\n--- want\n{want}--- got\n{text}",
                case.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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
