//! Golden files: each `NAME.toml` of a directory gives an output that is compared with
//! `NAME.out` beside it. `VELOXY_BLESS=1` rewrites the `.out` files instead (then review the
//! diff).

use std::path::{Path, PathBuf};
use std::process::Output;

/// The `*.toml` inputs of `dir`, sorted.
pub fn golden_cases(dir: &Path) -> Vec<PathBuf> {
    let mut cases: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    cases.sort();
    cases
}

/// A command's outcome as golden files record it: `exit: N`, then stdout, then stderr.
pub fn output_text(out: &Output) -> String {
    format!(
        "exit: {}\n{}{}",
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Compares each case's output with its `.out` file (or rewrites it when blessing); fails
/// with every difference at once.
pub fn assert_golden(results: impl IntoIterator<Item = (PathBuf, String)>) {
    let bless = std::env::var_os("VELOXY_BLESS").is_some();
    let mut failures = Vec::new();
    for (case, text) in results {
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
