//! The golden-test harness every importer runs on its `tests/golden/` cases.
//!
//! A case is a directory:
//! * `input/`: the source files; the files passed to the importer are those listed in
//!   `args` (a line `files: a.conf b.conf`), else every file directly in `input/`, sorted;
//! * `args` (optional): lines `files: ...`, `service: NAME.NS:PORT=ADDR`, `env: K=V`
//!   (resolving placeholders, as `--env` does), `prefix: DIR` (relative to `input/`);
//! * `expected.toml`, `expected.report` (the text report) and, for generated files,
//!   `expected.files/NAME`.
//!
//! The case directory's own path is removed from the outputs, so they read `input/a.conf:3:1`.
//! Then the TOML goes through the engine's loader (`veloxy check`): an output that does not
//! load fails the case. `VELOXY_BLESS=1` writes the expected files instead of comparing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::{Importer, Options};

/// Runs every case under `dir` with `importer`; panics listing every failing case.
pub fn run_goldens(dir: &Path, importer: &dyn Importer) {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("input").is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no golden cases under {}", dir.display());
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| run_case(c, importer).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} golden cases failed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// One case: `Ok` when the outputs match and load.
pub fn run_case(case: &Path, importer: &dyn Importer) -> Result<(), String> {
    let case = std::fs::canonicalize(case).map_err(|e| format!("{}: {e}", case.display()))?;
    let name = case
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let input = case.join("input");
    let mut opts = Options {
        out_dir: case.clone(),
        ..Default::default()
    };
    let mut files = Vec::new();
    if let Ok(args) = std::fs::read_to_string(case.join("args")) {
        for line in args.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once(':')
                .ok_or(format!("{name}/args: {line:?}"))?;
            let v = v.trim();
            match k.trim() {
                "files" => files.extend(v.split_whitespace().map(|f| input.join(f))),
                "service" => {
                    let (s, a) = v.split_once('=').ok_or(format!("{name}/args: {line:?}"))?;
                    opts.services.insert(s.to_string(), a.to_string());
                }
                "env" => {
                    let (k, val) = v.split_once('=').ok_or(format!("{name}/args: {line:?}"))?;
                    opts.env
                        .get_or_insert_with(BTreeMap::new)
                        .insert(k.to_string(), val.to_string());
                }
                "prefix" => opts.prefix = Some(input.join(v)),
                other => return Err(format!("{name}/args: unknown key {other:?}")),
            }
        }
    }
    if files.is_empty() {
        let mut all: Vec<PathBuf> = std::fs::read_dir(&input)
            .map_err(|e| format!("{name}: {e}"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        all.sort();
        files = all;
    }
    let strip = |s: &str| s.replace(&format!("{}/", case.display()), "");
    let mut imported = importer
        .import(&files, &opts)
        .map_err(|e| format!("{name}: import failed: {}", strip(&e.to_string())))?;
    imported.config.finish();
    let toml = strip(&imported.config.to_toml());
    let report = strip(&imported.report.text());
    let bless = std::env::var_os("VELOXY_BLESS").is_some();
    let mut problems = Vec::new();
    let mut compare = |file: &str, got: &str| {
        let path = case.join(file);
        if bless {
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = std::fs::write(&path, got);
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != got {
            problems.push(format!("{file} differs:\n{}", diff(&want, got)));
        }
    };
    compare("expected.toml", &toml);
    compare("expected.report", &report);
    for f in &imported.config.files {
        compare(&format!("expected.files/{}", f.name), &f.contents);
    }
    if let Err(e) = check(&case, &toml, &imported.config.files) {
        problems.push(format!("the output does not load: {e}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("case {name}:\n{}", problems.join("\n")))
    }
}

/// Loads `toml` with the engine, in a directory where `input/` is the case's inputs and the
/// generated files are written beside the config.
fn check(case: &Path, toml: &str, files: &[crate::GeneratedFile]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::os::unix::fs::symlink(case.join("input"), dir.path().join("input"))
        .map_err(|e| e.to_string())?;
    for f in files {
        let p = dir.path().join(&f.name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&p, &f.contents).map_err(|e| e.to_string())?;
    }
    let path = dir.path().join("veloxy.toml");
    std::fs::write(&path, toml).map_err(|e| e.to_string())?;
    veloxy_engine::config::load_file(&path)
        .map(|_| ())
        .map_err(|e| {
            e.to_string()
                .replace(&format!("{}/", dir.path().display()), "")
        })
}

/// A line diff: the lines only in `want` (-) and only in `got` (+), in order.
fn diff(want: &str, got: &str) -> String {
    let w: Vec<&str> = want.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out = String::new();
    let (mut i, mut j) = (0, 0);
    while i < w.len() || j < g.len() {
        if i < w.len() && j < g.len() && w[i] == g[j] {
            i += 1;
            j += 1;
        } else if j < g.len() && !w[i..].contains(&g[j]) {
            out.push_str(&format!("+ {}\n", g[j]));
            j += 1;
        } else if i < w.len() {
            out.push_str(&format!("- {}\n", w[i]));
            i += 1;
        } else {
            out.push_str(&format!("+ {}\n", g[j]));
            j += 1;
        }
    }
    out
}
