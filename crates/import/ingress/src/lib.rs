//! `veloxy import --from ingress`.

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The ingress importer.
pub struct Ingress;

impl Importer for Ingress {
    fn name(&self) -> &'static str {
        "ingress"
    }

    fn detect(&self, _path: &Path, _text: &str) -> bool {
        false
    }

    fn import(&self, _files: &[PathBuf], _opts: &Options) -> Result<Imported, ImportError> {
        Err(ImportError::Usage("ingress import: not built yet".into()))
    }
}
