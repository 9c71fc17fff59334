//! `veloxy import --from envoy`: an Envoy static bootstrap (v3 API, YAML or JSON) as a
//! veloxy config.
//!
//! Envoy's semantics are translated, not its spelling: its route timeout default (15 s), its
//! lack of retries and outlier detection unless configured, its first-match route order,
//! header edits applied at every level, the fields it adds (or does not add) upstream. What
//! still differs is named in the report. See `translate` for the layout.

#![warn(missing_docs)]

mod translate;
mod util;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use veloxy_import::{ImportError, Imported, Importer, Options};

/// The Envoy importer.
pub struct Envoy;

impl Importer for Envoy {
    fn name(&self) -> &'static str {
        "envoy"
    }

    fn detect(&self, _path: &Path, text: &str) -> bool {
        let bootstrap = text.contains("static_resources")
            && (text.contains("listeners") || text.contains("clusters"));
        bootstrap || text.contains("type.googleapis.com/envoy.")
    }

    fn import(&self, files: &[PathBuf], opts: &Options) -> Result<Imported, ImportError> {
        if files.is_empty() {
            return Err(ImportError::Usage("envoy: no file given".into()));
        }
        let mut ctx = translate::Ctx::new(opts);
        for path in files {
            let text = veloxy_import::source::read(path)?;
            let name: Arc<str> = path.display().to_string().into();
            let docs = veloxy_import::tree::parse_yaml(&name, &text)?;
            ctx.base = path.parent().map(Path::to_path_buf).unwrap_or_default();
            for doc in docs.iter().filter(|d| !d.is_null()) {
                translate::bootstrap(&mut ctx, doc);
            }
        }
        Ok(ctx.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_does_not_parse_names_its_place() {
        let dir = std::env::temp_dir().join(format!("veloxy-envoy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.yaml");
        std::fs::write(&f, "static_resources:\n  listeners: [\n    - name: x\n").unwrap();
        let err = Envoy.import(&[f], &Options::default()).unwrap_err();
        // Nothing left behind in the temporary directory, whatever the assertions say.
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(err, ImportError::Parse(_)), "{err}");
        assert!(err.to_string().contains("bad.yaml:"), "{err}");
    }

    #[test]
    fn detection() {
        let p = Path::new("x.yaml");
        assert!(Envoy.detect(p, "static_resources:\n  listeners: []\n"));
        assert!(!Envoy.detect(p, "http:\n  routers: {}\n"));
    }
}
