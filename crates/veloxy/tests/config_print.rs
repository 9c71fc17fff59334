//! Golden tests for `veloxy check --print`: each `golden/print/NAME.toml` is printed and the
//! output compared with `golden/print/NAME.out`, where `$DIR` stands for `golden/print` (paths
//! are printed absolute) and, for inputs that leave `workers` out, `$CORES` for the default
//! worker count. Set `VELOXY_BLESS=1` to rewrite the expected files after an intended change,
//! then review the diff.
//!
//! The round-trip test checks that the printed text is a config veloxy accepts and that
//! printing it again gives the same text.
//!
//! The certificates in `golden/print/` (`default.pem`, `api.pem` and their keys) are
//! self-signed test files, valid from 2000 to 2999 so the goldens never expire; they protect
//! nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VELOXY: &str = env!("CARGO_BIN_EXE_veloxy");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/print")
}

fn cases() -> Vec<PathBuf> {
    let cases = veloxy_testkit::golden_cases(&golden_dir());
    assert!(cases.len() >= 6, "{cases:?}");
    cases
}

/// `veloxy check --print --config FILE`, run from the golden directory: a relative access log
/// path is taken from the current directory, so this pins where it points.
fn print(config: &Path) -> Output {
    Command::new(VELOXY)
        .current_dir(golden_dir())
        .args(["check", "--print", "--config"])
        .arg(config)
        .output()
        .unwrap()
}

#[test]
fn print_output_matches_golden_files() {
    let dir = golden_dir();
    let canonical = dir.canonicalize().unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    veloxy_testkit::assert_golden(cases().into_iter().map(|case| {
        let mut text = veloxy_testkit::output_text(&print(&case))
            // Roots are canonicalized, other paths only made absolute: replace both spellings.
            .replace(canonical.to_str().unwrap(), "$DIR")
            .replace(dir.to_str().unwrap(), "$DIR");
        let input = std::fs::read_to_string(&case).unwrap();
        if !input.lines().any(|l| l.trim_start().starts_with("workers")) {
            text = text.replace(&format!("\nworkers = {cores}\n"), "\nworkers = $CORES\n");
        }
        (case, text)
    }));
}

#[test]
fn printed_config_prints_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    for case in cases() {
        let first = print(&case);
        assert!(first.status.success(), "{}: {first:?}", case.display());
        let printed = tmp.path().join(case.file_name().unwrap());
        std::fs::write(&printed, &first.stdout).unwrap();
        let second = print(&printed);
        assert!(
            second.status.success(),
            "{}: the printed config is refused:\n{}",
            case.display(),
            String::from_utf8_lossy(&second.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&second.stdout),
            String::from_utf8_lossy(&first.stdout),
            "{}: printing the printed config changed it",
            case.display()
        );
    }
}

#[test]
fn print_leaves_warnings_on_stderr_and_errors_print_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("admin.toml");
    std::fs::write(
        &path,
        "[listeners.web]\naddr = \"127.0.0.1:0\"\n[listeners.web.tls]\n\
         acme = [\"example.com\", \"typo.example.com\"]\n\
         [[routes]]\nhost = \"example.com\"\nrespond = {}\n",
    )
    .unwrap();
    let out = print(&path);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("typo.example.com"), "{stdout}");
    assert!(!stdout.contains("warning"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listeners.web.tls.acme: warning:"),
        "{stderr}"
    );

    std::fs::write(&path, "[listeners.web]\naddr = \"nowhere\"\n").unwrap();
    let out = print(&path);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("listeners.web.addr"), "{stderr}");
}
