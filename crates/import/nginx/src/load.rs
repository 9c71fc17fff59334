//! Reading the files: each command-line file is parsed, and every `include` is replaced by
//! the directives of the files it names (globs allowed, sorted as nginx's glob(3) sorts them),
//! relative paths taken from the prefix (nginx's conf directory: `--prefix`, default the
//! first file's directory).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use veloxy_import::{ImportError, ParseError};

use crate::parse::{parse, Directive};

/// How deep includes may nest (nginx has no limit, but a cycle must end).
const MAX_DEPTH: usize = 16;

/// What became of an `include` that was not expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// `mime.types`: a `types` table veloxy does not need.
    MimeTypes,
    /// The file cannot be read (the message says why).
    Unreadable(String),
}

/// The loaded configuration: every file's directives, includes expanded in place (an
/// `include` directive keeps its place and holds the included directives as its block).
#[derive(Debug, Default)]
pub struct Loaded {
    /// Top-level directives of every command-line file, in order.
    pub directives: Vec<Directive>,
    /// `include`s not expanded, by location (`loc.to_string()`), and why.
    pub skipped: Vec<(veloxy_import::Loc, Skipped)>,
}

/// Reads `files`, expanding includes relative to `prefix`.
pub fn load(files: &[PathBuf], prefix: &Path) -> Result<Loaded, ImportError> {
    let mut out = Loaded::default();
    for f in files {
        let list = read_file(f, prefix, 0, &mut out.skipped)?;
        out.directives.extend(list);
    }
    Ok(out)
}

fn read_file(
    path: &Path,
    prefix: &Path,
    depth: usize,
    skipped: &mut Vec<(veloxy_import::Loc, Skipped)>,
) -> Result<Vec<Directive>, ImportError> {
    let text = veloxy_import::source::read(path)?;
    let name: Arc<str> = path.display().to_string().into();
    let mut list = parse(&name, &text)?;
    expand(&mut list, prefix, depth, skipped)?;
    Ok(list)
}

fn expand(
    list: &mut [Directive],
    prefix: &Path,
    depth: usize,
    skipped: &mut Vec<(veloxy_import::Loc, Skipped)>,
) -> Result<(), ImportError> {
    for d in list.iter_mut() {
        if d.name == "include" && d.block.is_none() {
            let pattern = d.arg(0).to_string();
            if d.args.len() != 1 {
                return Err(ParseError::new(
                    d.loc.clone(),
                    "include takes one file name or pattern",
                )
                .into());
            }
            if pattern.ends_with("mime.types") {
                skipped.push((d.loc.clone(), Skipped::MimeTypes));
                d.block = Some(Vec::new());
                continue;
            }
            if depth >= MAX_DEPTH {
                return Err(
                    ParseError::new(d.loc.clone(), "includes nest too deep (a cycle?)").into(),
                );
            }
            let full = prefix.join(&pattern);
            let mut included = Vec::new();
            if pattern.contains(['*', '?', '[']) {
                let paths = glob::glob(&full.to_string_lossy()).map_err(|e| {
                    ParseError::new(d.loc.clone(), format!("bad include pattern: {e}"))
                })?;
                for p in paths.flatten().filter(|p| p.is_file()) {
                    included.extend(read_file(&p, prefix, depth + 1, skipped)?);
                }
            } else {
                match read_file(&full, prefix, depth + 1, skipped) {
                    Ok(l) => included = l,
                    Err(ImportError::Read { path, source }) => {
                        skipped.push((
                            d.loc.clone(),
                            Skipped::Unreadable(format!("{path}: {source}")),
                        ));
                    }
                    Err(e) => return Err(e),
                }
            }
            d.block = Some(included);
            continue;
        }
        if let Some(b) = d.block.as_mut() {
            if d.name != "types" {
                expand(b, prefix, depth, skipped)?;
            }
        }
    }
    Ok(())
}
