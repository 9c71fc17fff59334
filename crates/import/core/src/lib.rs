//! `veloxy import`: the parts every source format shares.
//!
//! An importer (one crate per source format: `veloxy-import-nginx`, `-caddy`, `-traefik`,
//! `-haproxy`, `-envoy`, `-ingress`) reads its tool's files and builds two things:
//!
//! * a [`Config`]: the veloxy config as sections of keys, each section remembering the source
//!   lines it came from ([`Loc`]); [`Config::to_toml`] writes it with a `# from FILE:LINE`
//!   comment above each section;
//! * a [`Report`]: one [`Entry`] per source directive, saying whether it was translated,
//!   translated with a named difference, ignored (with why it changes nothing a client or a
//!   backend sees) or refused (with what veloxy lacks).
//!
//! A source that does not parse is a [`ParseError`] naming `FILE:LINE:COL`. The `veloxy`
//! command picks the importer (`--from`, or [`Importer::detect`]) and writes the results.
//!
//! # Layout
//! * [`source`]: locations, the parse error, options, placeholders (`{$VAR}`, `${VAR}`) and
//!   path handling shared by every format.
//! * [`model`]: the output config ([`Config`], [`Section`], generated files).
//! * [`report`]: the per-directive report, as text or JSON.
//! * [`tree`]: YAML, JSON and TOML inputs as a tree whose nodes know their location.
//! * `golden` (feature `golden`): the golden-test harness every importer crate runs.

#![warn(missing_docs)]

pub mod model;
pub mod report;
pub mod source;
pub mod tree;

#[cfg(feature = "golden")]
pub mod golden;

pub use model::{Config, GeneratedFile, Section};
pub use report::{Entry, Outcome, Report};
pub use source::{Loc, Options, ParseError};

/// The result of one import: the config and the report of every source directive.
#[derive(Debug, Default)]
pub struct Imported {
    /// The veloxy config.
    pub config: Config,
    /// What became of each source directive.
    pub report: Report,
}

/// Why an import failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A source file does not parse: `FILE:LINE:COL: message` (exit 2).
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A source file (or an included one) cannot be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The inputs do not make an import of this format (no file, wrong kind of file...).
    #[error("{0}")]
    Usage(String),
}

/// One source format.
pub trait Importer {
    /// The `--from` name: `nginx`, `caddyfile`, `traefik`, `haproxy`, `envoy`, `ingress`.
    fn name(&self) -> &'static str;
    /// Whether this text (of a file named `path`) looks like this format. Used when `--from`
    /// is absent; the first importer that says yes takes the files.
    fn detect(&self, path: &std::path::Path, text: &str) -> bool;
    /// Reads `files` (the command line's, in order) and translates them.
    fn import(&self, files: &[std::path::PathBuf], opts: &Options)
        -> Result<Imported, ImportError>;
}
