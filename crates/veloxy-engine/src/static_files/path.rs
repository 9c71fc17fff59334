//! Safe path resolution: request target -> a file under the route's root, or a refusal.
//!
//! Two layers, so that one mistake is not enough to escape the root:
//!
//! 1. [`clean`] works on the request alone: it percent-decodes the path once and refuses
//!    anything that could mean something other than a plain relative name: `.` and `..`
//!    segments (encoded or not, so `%2e%2e` too), an encoded `/` (`%2f`) or any backslash
//!    (`\`, `%5c`), NUL and control bytes, malformed escapes and invalid UTF-8 (overlong
//!    encodings like `%c0%ae`). Double encoding (`%252e`) decodes once to a literal `%2e`, an
//!    ordinary (and almost surely missing) file name. Dot files are reported separately so the
//!    route can refuse them (`allow_hidden`).
//! 2. [`open`] canonicalizes the joined path (resolving every symlink) and, unless
//!    `follow_symlinks` is on, refuses a result outside the root's canonical path; the hidden
//!    check is repeated on the canonical path (a symlink named `x` pointing at `.env`). The
//!    file is then opened by its canonical name with `O_NOFOLLOW` (no symlink swapped in for
//!    the last component since) and `O_NONBLOCK` (opening a FIFO must not hang the worker).

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// Why a request path was refused before touching the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Traversal, encoded separators, NUL, malformed escapes: answered 400.
    #[error("invalid path")]
    Invalid,
    /// A dot-file segment on a route without `allow_hidden`: answered 404.
    #[error("hidden file")]
    Hidden,
}

/// Why resolving a cleaned path on disk failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Missing (or not a directory where one was needed): 404.
    #[error("not found")]
    NotFound,
    /// Unreadable, outside the root through a symlink, or not a regular file: 403.
    #[error("forbidden")]
    Forbidden,
    /// A hidden file reached through a symlink: 404, like a requested one.
    #[error("hidden file")]
    Hidden,
}

/// A cleaned request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanPath {
    /// Decoded, `/`-separated, with a leading `/` and no empty, `.` or `..` segment.
    pub path: String,
    /// The request path ended with `/` (a directory was asked for).
    pub trailing_slash: bool,
}

/// Decodes and validates the path part of a request target (query and fragment dropped).
pub fn clean(target: &str, allow_hidden: bool) -> Result<CleanPath, PathError> {
    let raw = target.split(['?', '#']).next().unwrap_or("");
    if !raw.starts_with('/') {
        return Err(PathError::Invalid);
    }
    let mut path = String::with_capacity(raw.len());
    let mut hidden = false;
    for seg in raw.split('/') {
        if seg.is_empty() {
            continue;
        }
        let bytes = percent_decode(seg.as_bytes()).ok_or(PathError::Invalid)?;
        if bytes == b"." || bytes == b".." {
            return Err(PathError::Invalid);
        }
        if bytes
            .iter()
            .any(|&b| b == b'/' || b == b'\\' || b < 0x20 || b == 0x7f)
        {
            return Err(PathError::Invalid);
        }
        let seg = String::from_utf8(bytes).map_err(|_| PathError::Invalid)?;
        if is_hidden(&seg) {
            hidden = true;
        }
        path.push('/');
        path.push_str(&seg);
    }
    if hidden && !allow_hidden {
        return Err(PathError::Hidden);
    }
    if path.is_empty() {
        path.push('/');
    }
    Ok(CleanPath {
        trailing_slash: raw.ends_with('/'),
        path,
    })
}

/// Dot files and directories are hidden, except `.well-known` (RFC 8615: ACME challenges,
/// security.txt), which exists to be served.
pub fn is_hidden(segment: &str) -> bool {
    segment.starts_with('.') && segment != ".well-known"
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes `%XX` escapes once; `None` for a malformed escape.
pub fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let h = hex(*s.get(i + 1)?)?;
            let l = hex(*s.get(i + 2)?)?;
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Percent-encodes a path for a URL (`Location`, listing links): everything but unreserved
/// characters and `/`.
pub fn percent_encode(s: &str) -> String {
    percent_encode_keeping(s, b"/")
}

/// Percent-encodes everything in `s` but unreserved characters and the bytes of `keep`.
pub fn percent_encode_keeping(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How [`open`] treats symlinks and dot files.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub follow_symlinks: bool,
    pub allow_hidden: bool,
}

/// An opened file or directory under the root.
#[derive(Debug)]
pub struct Opened {
    pub canonical: PathBuf,
    pub file: File,
    pub meta: std::fs::Metadata,
}

/// Resolves `rel` (a cleaned path, relative to `root`) and opens it. `root` must be canonical.
pub fn open(root: &Path, rel: &str, rules: Rules) -> Result<Opened, OpenError> {
    let joined = root.join(rel.trim_start_matches('/'));
    let canonical = std::fs::canonicalize(&joined).map_err(io_error)?;
    match canonical.strip_prefix(root) {
        Ok(inside) => {
            let hidden = inside.components().any(|c| match c {
                // A name that is not UTF-8 cannot be requested: treat it as hidden.
                Component::Normal(n) => match n.to_str() {
                    Some(name) => is_hidden(name),
                    None => true,
                },
                _ => false,
            });
            if hidden && !rules.allow_hidden {
                return Err(OpenError::Hidden);
            }
        }
        Err(_) if !rules.follow_symlinks => return Err(OpenError::Forbidden),
        Err(_) => {}
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&canonical)
        .map_err(io_error)?;
    let meta = file.metadata().map_err(io_error)?;
    if !meta.is_file() && !meta.is_dir() {
        return Err(OpenError::Forbidden);
    }
    Ok(Opened {
        canonical,
        file,
        meta,
    })
}

fn io_error(e: io::Error) -> OpenError {
    match e.kind() {
        io::ErrorKind::PermissionDenied => OpenError::Forbidden,
        // ELOOP: a symlink where O_NOFOLLOW forbids one, or a symlink loop.
        _ if e.raw_os_error() == Some(libc::ELOOP) => OpenError::Forbidden,
        _ => OpenError::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(t: &str) -> String {
        clean(t, false).unwrap().path
    }

    #[test]
    fn cleans_ordinary_paths() {
        assert_eq!(ok("/"), "/");
        assert_eq!(ok("/a/b.css?x=1"), "/a/b.css");
        assert_eq!(ok("//a///b"), "/a/b");
        assert_eq!(ok("/caf%C3%A9.txt"), "/café.txt");
        assert_eq!(ok("/a%20b"), "/a b");
        assert_eq!(ok("/.well-known/x"), "/.well-known/x");
        assert_eq!(ok("/%252e%252e/x"), "/%2e%2e/x", "decoded once only");
        assert_eq!(
            clean("/..;/x", true).unwrap().path,
            "/..;/x",
            "a literal name"
        );
        assert!(clean("/a/", false).unwrap().trailing_slash);
        assert!(!clean("/a", false).unwrap().trailing_slash);
    }

    #[test]
    fn refuses_traversal_and_encodings() {
        for t in [
            "/../etc/passwd",
            "/a/../../x",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/.%2e/x",
            "/%2e./x",
            "/a/%2e",
            "/..%2fx",
            "/a%2f..%2fx",
            "/..%5cx",
            "/a\\..\\x",
            "/%00",
            "/a%00.html",
            "/%c0%ae%c0%ae/x",
            "/%e0%80%ae/x",
            "/%zz",
            "/%2",
            "/a%0d%0aX: y",
            "x/y",
            "*",
        ] {
            assert_eq!(clean(t, true), Err(PathError::Invalid), "{t}");
        }
    }

    #[test]
    fn hidden_segments() {
        assert_eq!(clean("/.env", false), Err(PathError::Hidden));
        assert_eq!(clean("/.git/config", false), Err(PathError::Hidden));
        assert_eq!(clean("/%2egit/config", false), Err(PathError::Hidden));
        assert_eq!(clean("/.env", true).unwrap().path, "/.env");
    }

    #[test]
    fn open_confines_to_root() {
        let dir = tempfile_dir();
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f.txt"), "x").unwrap();
        std::fs::write(root.join(".secret"), "x").unwrap();
        std::fs::write(dir.join("outside.txt"), "x").unwrap();
        std::os::unix::fs::symlink(dir.join("outside.txt"), root.join("out")).unwrap();
        std::os::unix::fs::symlink(root.join("sub/f.txt"), root.join("in")).unwrap();
        std::os::unix::fs::symlink(root.join(".secret"), root.join("shown")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let strict = Rules {
            follow_symlinks: false,
            allow_hidden: false,
        };
        let follow = Rules {
            follow_symlinks: true,
            allow_hidden: false,
        };
        assert!(open(&root, "/sub/f.txt", strict).unwrap().meta.is_file());
        assert!(open(&root, "/sub", strict).unwrap().meta.is_dir());
        assert!(
            open(&root, "/in", strict).is_ok(),
            "a symlink inside the root"
        );
        assert_eq!(
            open(&root, "/out", strict).unwrap_err(),
            OpenError::Forbidden
        );
        assert!(open(&root, "/out", follow).is_ok());
        assert_eq!(
            open(&root, "/shown", strict).unwrap_err(),
            OpenError::Hidden
        );
        assert_eq!(
            open(&root, "/nope", strict).unwrap_err(),
            OpenError::NotFound
        );
        assert_eq!(
            open(&root, "/sub/f.txt/x", strict).unwrap_err(),
            OpenError::NotFound
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "veloxy-path-test-{}-{}",
            std::process::id(),
            crate::clock::now_us()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
