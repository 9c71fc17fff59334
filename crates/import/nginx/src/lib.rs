//! `veloxy import --from nginx`.

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The nginx importer.
pub struct Nginx;

impl Importer for Nginx {
    fn name(&self) -> &'static str {
        "nginx"
    }

    fn detect(&self, _path: &Path, _text: &str) -> bool {
        false
    }

    fn import(&self, _files: &[PathBuf], _opts: &Options) -> Result<Imported, ImportError> {
        Err(ImportError::Usage("nginx import: not built yet".into()))
    }
}
