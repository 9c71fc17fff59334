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

/// nginx's conventional configuration directories: an absolute include under one of them is
/// looked for in the prefix first (the tree being imported), then on this machine.
const CONVENTIONAL: &[&str] = &[
    "/etc/nginx/",
    "/usr/local/nginx/conf/",
    "/usr/local/etc/nginx/",
];

/// Debian's stock `proxy_params` (Debian and Ubuntu packages ship it in /etc/nginx).
const PROXY_PARAMS: &str = "proxy_set_header Host $http_host;
proxy_set_header X-Real-IP $remote_addr;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Forwarded-Proto $scheme;
";

/// The file name the stock `proxy_params` is reported under.
pub const PROXY_PARAMS_NAME: &str = "proxy_params (stock Debian file, not in the input)";

/// What became of an `include` that was not expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// `mime.types`: a `types` table veloxy does not need.
    MimeTypes,
    /// A stock file of another protocol's parameters (`fastcgi_params`, `fastcgi.conf`,
    /// `uwsgi_params`, `scgi_params`) that is not in the input.
    Params(&'static str),
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

fn is_glob(p: &str) -> bool {
    p.contains(['*', '?', '['])
}

/// An absolute path under a conventional directory, taken from the prefix when the file
/// (for a pattern, its directory) exists there, or when the prefix is a whole configuration
/// directory (it holds nginx.conf): what it lacks is then missing, not this machine's.
fn in_tree(abs: &str, prefix: &Path) -> Option<PathBuf> {
    let rest = CONVENTIONAL.iter().find_map(|c| abs.strip_prefix(c))?;
    let cand = prefix.join(rest);
    let there = if is_glob(rest) {
        let fixed: PathBuf = Path::new(rest)
            .components()
            .take_while(|c| !is_glob(&c.as_os_str().to_string_lossy()))
            .collect();
        prefix.join(fixed).is_dir()
    } else {
        cand.exists() || cand.is_symlink()
    };
    (there || prefix.join("nginx.conf").is_file()).then_some(cand)
}

/// What an include's argument names: relative to the prefix; an absolute path under nginx's
/// conventional directory is taken from the prefix when it is there (the tree being imported
/// wins over this machine's own /etc/nginx).
fn locate(pattern: &str, prefix: &Path) -> PathBuf {
    in_tree(pattern, prefix).unwrap_or_else(|| prefix.join(pattern))
}

/// The file to read for `p`: a symbolic link to an absolute path under a conventional
/// directory (`sites-enabled/x -> /etc/nginx/sites-available/x`) is followed into the prefix
/// when the target is there.
fn follow(p: &Path, prefix: &Path) -> PathBuf {
    match std::fs::read_link(p) {
        Ok(t) if t.is_absolute() => {
            in_tree(&t.to_string_lossy(), prefix).unwrap_or_else(|| p.to_path_buf())
        }
        _ => p.to_path_buf(),
    }
}

/// A stock file nginx packages ship, when the input does not have it: `proxy_params` as its
/// well-known content, the other protocols' parameter files as skipped.
fn stock(pattern: &str, prefix: &Path) -> Option<Result<Vec<Directive>, Skipped>> {
    let relative_or_conventional =
        !pattern.starts_with('/') || CONVENTIONAL.iter().any(|c| pattern.starts_with(c));
    let base = Path::new(pattern).file_name()?.to_str()?;
    if !relative_or_conventional || locate(pattern, prefix).exists() {
        return None;
    }
    Some(match base {
        "proxy_params" => {
            let name: Arc<str> = PROXY_PARAMS_NAME.into();
            Ok(parse(&name, PROXY_PARAMS).expect("the stock proxy_params parses"))
        }
        "fastcgi_params" | "fastcgi.conf" => Err(Skipped::Params("FastCGI")),
        "uwsgi_params" => Err(Skipped::Params("uwsgi")),
        "scgi_params" => Err(Skipped::Params("SCGI")),
        _ => return None,
    })
}

fn read_file(
    path: &Path,
    prefix: &Path,
    depth: usize,
    skipped: &mut Vec<(veloxy_import::Loc, Skipped)>,
) -> Result<Vec<Directive>, ImportError> {
    read_file_as(&follow(path, prefix), path, prefix, depth, skipped)
}

/// Reads `path`, naming its directives' locations after `shown` (a link's own name, as
/// nginx's messages do).
fn read_file_as(
    path: &Path,
    shown: &Path,
    prefix: &Path,
    depth: usize,
    skipped: &mut Vec<(veloxy_import::Loc, Skipped)>,
) -> Result<Vec<Directive>, ImportError> {
    let text = veloxy_import::source::read(path)?;
    let name: Arc<str> = shown.display().to_string().into();
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
            let mut included = Vec::new();
            if let Some(st) = stock(&pattern, prefix) {
                match st {
                    Ok(list) => included = list,
                    Err(why) => skipped.push((d.loc.clone(), why)),
                }
            } else if is_glob(&pattern) {
                let full = locate(&pattern, prefix);
                let paths = glob::glob(&full.to_string_lossy()).map_err(|e| {
                    ParseError::new(d.loc.clone(), format!("bad include pattern: {e}"))
                })?;
                for p in paths.flatten() {
                    let file = follow(&p, prefix);
                    if file.is_file() {
                        included.extend(read_file_as(&file, &p, prefix, depth + 1, skipped)?);
                    }
                }
            } else {
                let full = locate(&pattern, prefix);
                let file = follow(&full, prefix);
                match read_file_as(&file, &full, prefix, depth + 1, skipped) {
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
