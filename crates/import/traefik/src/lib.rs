//! `veloxy import --from traefik`.

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The traefik importer.
pub struct Traefik;

impl Importer for Traefik {
    fn name(&self) -> &'static str {
        "traefik"
    }

    fn detect(&self, _path: &Path, _text: &str) -> bool {
        false
    }

    fn import(&self, _files: &[PathBuf], _opts: &Options) -> Result<Imported, ImportError> {
        Err(ImportError::Usage("traefik import: not built yet".into()))
    }
}
