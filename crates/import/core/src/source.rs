//! What every importer shares about its input: where a directive is ([`Loc`]), why a file
//! does not parse ([`ParseError`]), the command line's [`Options`], environment placeholders
//! and paths.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// A place in a source file: `FILE:LINE:COL`, 1-based. `file` is the path as the user gave
/// it (or as an `include` named it, joined to its base), so report lines can be opened.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    /// The source file, as displayed.
    pub file: Arc<str>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl Loc {
    /// A location in `file`.
    pub fn new(file: &Arc<str>, line: u32, col: u32) -> Self {
        Loc {
            file: file.clone(),
            line,
            col,
        }
    }

    /// The line and column of byte `offset` in `text`.
    pub fn at_offset(file: &Arc<str>, text: &str, offset: usize) -> Self {
        let before = &text[..offset.min(text.len())];
        let line = before.matches('\n').count() as u32 + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
        Loc::new(file, line, col)
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// A source file that does not parse.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{loc}: {message}")]
pub struct ParseError {
    /// Where the parser stopped.
    pub loc: Loc,
    /// What it expected.
    pub message: String,
}

impl ParseError {
    /// An error at `loc`.
    pub fn new(loc: Loc, message: impl Into<String>) -> Self {
        ParseError {
            loc,
            message: message.into(),
        }
    }
}

/// The command line's options, as one importer sees them.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--env`: placeholders (`{$VAR}`, `${VAR}`, `{env.VAR}`) are resolved from these
    /// variables; `None`: each placeholder is refused by name.
    pub env: Option<BTreeMap<String, String>>,
    /// `--prefix DIR`: nginx's prefix (relative `include`s and paths are taken from it;
    /// default: the directory of the first file).
    pub prefix: Option<PathBuf>,
    /// `--service NAME.NAMESPACE:PORT=ADDR` (ingress): a Service port's address. Without an
    /// entry, `NAME.NAMESPACE.svc:PORT` (a DNS name).
    pub services: BTreeMap<String, String>,
    /// The directory the output TOML is written to: relative paths in the output are
    /// relative to it (veloxy reads them from the config file's directory).
    pub out_dir: PathBuf,
}

impl Options {
    /// Resolves placeholders in `value`: `{$VAR}` and `{$VAR:default}` (Caddy), `${VAR}` and
    /// `${VAR:-default}` (shell, Traefik, Envoy). With `--env`, from the environment, else the
    /// default; without `--env`, the default. A variable with neither is an error that names
    /// it, for a `refused` line.
    pub fn expand_env(&self, value: &str) -> Result<String, String> {
        let mut out = String::with_capacity(value.len());
        let mut rest = value;
        loop {
            let start = match (rest.find("{$"), rest.find("${")) {
                (None, None) => break,
                (Some(x), None) | (None, Some(x)) => x,
                (Some(x), Some(y)) => x.min(y),
            };
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return Ok(out);
            };
            let inner = &after[..end];
            let (name, default) = match inner.split_once(":-").or_else(|| inner.split_once(':')) {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            let value = match (&self.env, default) {
                (Some(env), d) => match (env.get(name), d) {
                    (Some(v), _) => v.clone(),
                    (None, Some(d)) => d.to_string(),
                    (None, None) => return Err(format!("environment variable {name} is not set")),
                },
                // The default the config gives is what the tool runs with when the variable
                // is unset: without --env, that is the value.
                (None, Some(d)) => d.to_string(),
                (None, None) => {
                    return Err(format!(
                        "environment placeholder {name} (run with --env to resolve it from the \
                         environment)"
                    ))
                }
            };
            out.push_str(&value);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// A path named in a source file (relative to `base`, the directory the source tool
    /// resolves it from), as written in the output: absolute paths stay as they are, relative
    /// ones become relative to [`Options::out_dir`] when both are under one tree, else
    /// absolute.
    pub fn out_path(&self, base: &Path, p: &str) -> String {
        let path = Path::new(p);
        if path.is_absolute() {
            return p.to_string();
        }
        let full = normalize(&base.join(path));
        match relative_to(&full, &normalize(&self.out_dir)) {
            Some(rel) => rel.to_string_lossy().into_owned(),
            None => full.to_string_lossy().into_owned(),
        }
    }
}

/// Removes `.` and resolves `..` lexically (no filesystem access).
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// `path` relative to `dir` when both are relative or both absolute.
fn relative_to(path: &Path, dir: &Path) -> Option<PathBuf> {
    if path.is_absolute() != dir.is_absolute() {
        return None;
    }
    let p: Vec<_> = path.components().collect();
    let d: Vec<_> = dir.components().collect();
    let common = p.iter().zip(&d).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..d.len() {
        out.push("..");
    }
    for c in &p[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Some(out)
}

/// Reads a source file, naming it in the error.
pub fn read(path: &Path) -> Result<String, crate::ImportError> {
    std::fs::read_to_string(path).map_err(|source| crate::ImportError::Read {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders() {
        let mut o = Options::default();
        assert!(o.expand_env("a{$X}b").unwrap_err().contains("X"));
        o.env = Some([("X".to_string(), "1".to_string())].into());
        assert_eq!(o.expand_env("a{$X}b${X}c").unwrap(), "a1b1c");
        assert_eq!(o.expand_env("${Y:-d}").unwrap(), "d");
        assert!(o.expand_env("${Y}").is_err());
        assert_eq!(o.expand_env("plain").unwrap(), "plain");
        let o = Options::default();
        assert_eq!(o.expand_env("{$PORT:8080}/${P:-x}").unwrap(), "8080/x");
    }

    #[test]
    fn paths() {
        let o = Options {
            out_dir: "/x/out".into(),
            ..Default::default()
        };
        assert_eq!(o.out_path(Path::new("/x/src"), "a/b.pem"), "../src/a/b.pem");
        assert_eq!(o.out_path(Path::new("/x/src"), "/etc/k.pem"), "/etc/k.pem");
        let o = Options {
            out_dir: "case".into(),
            ..Default::default()
        };
        assert_eq!(o.out_path(Path::new("case/input"), "c.pem"), "input/c.pem");
    }

    #[test]
    fn offsets() {
        let f: Arc<str> = "f".into();
        assert_eq!(Loc::at_offset(&f, "ab\ncd", 4).to_string(), "f:2:2");
    }
}
