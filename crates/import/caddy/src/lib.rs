//! `veloxy import --from caddyfile`.

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The caddyfile importer.
pub struct Caddyfile;

impl Importer for Caddyfile {
    fn name(&self) -> &'static str {
        "caddyfile"
    }

    fn detect(&self, _path: &Path, _text: &str) -> bool {
        false
    }

    fn import(&self, _files: &[PathBuf], _opts: &Options) -> Result<Imported, ImportError> {
        Err(ImportError::Usage("caddyfile import: not built yet".into()))
    }
}
