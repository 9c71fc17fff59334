//! `veloxy import --from nginx`: nginx.conf (with its includes) as a veloxy config.
//!
//! * [`parse`]: the syntax (directives, blocks, quotes, comments) with `FILE:LINE:COL`.
//! * [`load`]: files and `include`s (globs, relative to the prefix).
//! * [`vars`]: variables as veloxy templates, sizes and durations.
//! * `translate`: the semantics, server by server and location by location.

pub mod load;
pub mod parse;
mod translate;
pub mod vars;

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The nginx importer.
pub struct Nginx;

impl Importer for Nginx {
    fn name(&self) -> &'static str {
        "nginx"
    }

    fn detect(&self, path: &Path, text: &str) -> bool {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == "nginx.conf" {
            return true;
        }
        // Code lines only (comments can say anything).
        let code: Vec<&str> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .collect();
        let block = |kw: &str| {
            code.iter().any(|l| {
                l.strip_prefix(kw)
                    .is_some_and(|r| r.trim_start().starts_with('{'))
                    || (kw == "upstream" && l.starts_with("upstream ") && l.ends_with('{'))
                    || (kw == "location" && l.starts_with("location ") && l.ends_with('{'))
            })
        };
        let directive = |kw: &str| code.iter().any(|l| l.starts_with(kw) && l.ends_with(';'));
        (block("http")
            || block("server")
            || block("upstream")
            || block("location")
            || block("events"))
            && (directive("listen ")
                || directive("proxy_pass ")
                || directive("server_name ")
                || directive("root ")
                || directive("worker_processes ")
                || block("http")
                || block("events"))
    }

    fn import(&self, files: &[PathBuf], opts: &Options) -> Result<Imported, ImportError> {
        let first = files
            .first()
            .ok_or_else(|| ImportError::Usage("no file to import".into()))?;
        let prefix = opts
            .prefix
            .clone()
            .unwrap_or_else(|| first.parent().map(Path::to_path_buf).unwrap_or_default());
        let loaded = load::load(files, &prefix)?;
        let (config, report) = translate::translate(&loaded, opts, prefix);
        Ok(Imported { config, report })
    }
}
