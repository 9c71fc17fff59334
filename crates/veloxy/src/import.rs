//! `veloxy import`: picks the importer (`--from`, else by content), runs it and writes the
//! TOML, the generated files and the report.
//!
//! Exit codes: 0; 1 with `--strict` when a directive was refused; 2 when a source does not
//! parse (`FILE:LINE:COL: message`) or cannot be read.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use veloxy_import::{ImportError, Importer, Options};

use crate::cli::ImportArgs;

/// Every importer, in detection order (the more specific formats first).
fn importers() -> Vec<Box<dyn Importer>> {
    vec![
        Box::new(veloxy_import_ingress::Ingress),
        Box::new(veloxy_import_envoy::Envoy),
        Box::new(veloxy_import_traefik::Traefik),
        Box::new(veloxy_import_haproxy::Haproxy),
        Box::new(veloxy_import_nginx::Nginx),
        Box::new(veloxy_import_caddy::Caddyfile),
    ]
}

/// Runs `veloxy import`.
pub fn run(a: ImportArgs) -> Result<ExitCode> {
    let all = importers();
    let importer = match &a.from {
        Some(name) => all
            .iter()
            .find(|i| i.name() == name)
            .context("unknown --from")?,
        None => {
            let first = &a.files[0];
            let text = std::fs::read_to_string(first)
                .with_context(|| format!("{}: cannot read", first.display()))?;
            match all.iter().find(|i| i.detect(first, &text)) {
                Some(i) => i,
                None => {
                    eprintln!(
                        "{}: cannot tell which tool this config is for; name it with --from \
                         nginx|caddyfile|traefik|haproxy|envoy|ingress",
                        first.display()
                    );
                    return Ok(ExitCode::from(2));
                }
            }
        }
    };
    let out_dir = match &a.output {
        Some(o) => o
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf(),
        None => ".".into(),
    };
    let mut opts = Options {
        out_dir,
        prefix: a.prefix.clone(),
        ..Default::default()
    };
    if a.env {
        opts.env = Some(std::env::vars().collect());
    }
    for s in &a.service {
        let Some((name, addr)) = s.split_once('=') else {
            bail!("--service {s:?}: expected NAME.NAMESPACE:PORT=ADDR");
        };
        opts.services.insert(name.to_string(), addr.to_string());
    }
    let mut imported = match importer.import(&a.files, &opts) {
        Ok(i) => i,
        Err(e @ (ImportError::Parse(_) | ImportError::Read { .. })) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => {
            eprintln!("veloxy import: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    imported.config.finish();
    let toml = imported.config.to_toml();
    match &a.output {
        Some(path) => {
            if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::write(path, &toml).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stdout().write_all(toml.as_bytes())?,
    }
    for f in &imported.config.files {
        let path = opts.out_dir.join(&f.name);
        write_private(&path, &f.contents, f.mode)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let report = match a.format.as_str() {
        "json" => imported.report.json(),
        _ => imported.report.text(),
    };
    match &a.report {
        Some(path) => {
            std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stderr().write_all(report.as_bytes())?,
    }
    // Nothing that listens: the output cannot run (and `check` refuses it).
    let empty = imported.config.listeners.is_empty();
    if empty {
        eprintln!(
            "veloxy import: the result has no listener: nothing in the source was translated \
             into something that serves traffic (see the refused lines)"
        );
    }
    if a.strict && (imported.report.has_refused() || empty) {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes a generated file with its mode (0600 for secrets) from the start.
fn write_private(path: &Path, contents: &str, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    f.write_all(contents.as_bytes())
}
