//! `veloxy import --from envoy`.

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The envoy importer.
pub struct Envoy;

impl Importer for Envoy {
    fn name(&self) -> &'static str {
        "envoy"
    }

    fn detect(&self, _path: &Path, _text: &str) -> bool {
        false
    }

    fn import(&self, _files: &[PathBuf], _opts: &Options) -> Result<Imported, ImportError> {
        Err(ImportError::Usage("envoy import: not built yet".into()))
    }
}
