//! `veloxy import --from haproxy`.

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The haproxy importer.
pub struct Haproxy;

impl Importer for Haproxy {
    fn name(&self) -> &'static str {
        "haproxy"
    }

    fn detect(&self, _path: &Path, _text: &str) -> bool {
        false
    }

    fn import(&self, _files: &[PathBuf], _opts: &Options) -> Result<Imported, ImportError> {
        Err(ImportError::Usage("haproxy import: not built yet".into()))
    }
}
