//! Static file serving for routes with a `root`.
//!
//! [`respond`] turns a request (method, raw target, a header lookup) into a [`Response`]
//! (status, headers, and a [`Body`] that is empty, bytes, a file region or a multipart list).
//! It knows nothing about the connection or the HTTP version, so the HTTP/1 path
//! ([`http1`]) and an HTTP/2 path can share it; writing the response (`sendfile` on plain
//! TCP) is the caller's part.
//!
//! Steps: method (GET/HEAD, else 405) -> [`path::clean`] (400 for traversal attempts, 404 for
//! dot files) -> strip the route's path prefix -> the [`cache`] (resolution, validators and
//! small files' content, revalidated at most once a second) or [`path::open`] -> index files,
//! redirect of a directory without its trailing slash, listing if `browse`, `try_files`
//! fallbacks -> content coding ([`crate::compress`]: sidecar file, or a cached variant) ->
//! preconditions ([`conditional`]: 304, 412) -> ranges ([`range`]: 206, multipart, 416).
//!
//! Errors are short `text/plain` bodies that never contain a filesystem path.

pub mod cache;
pub mod conditional;
pub mod listing;
pub mod mime;
pub mod path;
pub mod range;
mod serve;

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::compress::{self, Encoding};
use cache::{Entry, FileCache, Sidecar, Source, REVALIDATE_MS};
use path::{OpenError, PathError, Rules};

/// Request header lookup, implemented by each HTTP version's request type.
pub trait Headers {
    /// The first value of header `name` (lowercase), if present.
    fn get(&self, name: &str) -> Option<&[u8]>;
}

impl Headers for &[httparse::Header<'_>] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }
}

/// What [`respond`] needs from a request.
pub struct Request<'a> {
    pub method: &'a str,
    /// The raw origin-form target (path and query), as received.
    pub target: &'a str,
    pub headers: &'a dyn Headers,
}

/// A piece of a body: bytes in memory or a region of an open file.
#[derive(Debug, Clone)]
pub enum Part {
    Bytes(Bytes),
    File {
        file: Arc<File>,
        offset: u64,
        len: u64,
    },
}

impl Part {
    pub fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::File { len, .. } => *len,
        }
    }
}

/// A response body.
#[derive(Debug, Clone)]
pub enum Body {
    /// No body (HEAD, 304); `content-length` in the headers still tells the GET size.
    Empty,
    Bytes(Bytes),
    File {
        file: Arc<File>,
        offset: u64,
        len: u64,
    },
    /// `multipart/byteranges`: part headers and file regions, in order.
    Multipart(Vec<Part>),
}

/// A response description. `headers` names are lowercase and include `content-length`
/// whenever there is (or, for HEAD, would be) a body; connection-level headers are the
/// writer's business.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, Bytes)>,
    pub body: Body,
    /// More fields, already serialized as `name: value\r\n` lines (a cached response's
    /// stored fields, and its cache status line); empty for file routes.
    pub raw: [Bytes; 2],
}

impl Response {
    fn push(&mut self, name: &'static str, value: impl Into<Bytes>) {
        self.headers.push((name, value.into()));
    }
}

/// A compiled file route.
#[derive(Debug)]
pub struct StaticRoute {
    /// The route's path prefix, removed from the request path before joining with `root`.
    pub prefix: String,
    /// Canonical root directory.
    pub root: PathBuf,
    /// Index files tried for a directory, in order. Default `["index.html"]`.
    pub index: Vec<String>,
    /// Fallbacks when the requested file does not exist, relative to the root; `$uri` is
    /// replaced with the request path. Default none.
    pub try_files: Vec<String>,
    /// `Cache-Control` value for files. Default none.
    pub cache_control: Option<Bytes>,
    /// Directory listings. Default off.
    pub browse: bool,
    /// Serve symlinks that point outside the root. Default off.
    pub follow_symlinks: bool,
    /// Serve dot files. Default off.
    pub allow_hidden: bool,
    /// Compress compressible files on the fly. Default on.
    pub compress: bool,
    /// Use `FILE.br`/`.zst`/`.gz` sidecars. Default on.
    pub precompressed: bool,
    pub cache: FileCache,
}

impl StaticRoute {
    /// Same files, same answers: the cache of one is valid for the other.
    pub(crate) fn same_settings(&self, other: &StaticRoute) -> bool {
        self.prefix == other.prefix
            && self.root == other.root
            && self.index == other.index
            && self.try_files == other.try_files
            && self.cache_control == other.cache_control
            && self.browse == other.browse
            && self.follow_symlinks == other.follow_symlinks
            && self.allow_hidden == other.allow_hidden
            && self.compress == other.compress
            && self.precompressed == other.precompressed
            && self.cache.max_bytes() == other.cache.max_bytes()
    }

    /// A route serving `root` (canonicalized here) with default settings.
    pub fn new(prefix: &str, root: &Path, cache_bytes: usize) -> std::io::Result<StaticRoute> {
        Ok(StaticRoute {
            prefix: prefix.to_owned(),
            root: std::fs::canonicalize(root)?,
            index: vec!["index.html".to_owned()],
            try_files: Vec::new(),
            cache_control: None,
            browse: false,
            follow_symlinks: false,
            allow_hidden: false,
            compress: true,
            precompressed: true,
            cache: FileCache::new(cache_bytes),
        })
    }

    /// Whether `rel` (a clean path, `/`-led) names a file this route would serve.
    pub fn is_file(&self, rel: &str) -> bool {
        matches!(lookup(self, rel, false), Ok(Found::File(..)))
    }

    fn rules(&self) -> Rules {
        Rules {
            follow_symlinks: self.follow_symlinks,
            allow_hidden: self.allow_hidden,
        }
    }
}

/// A short plain-text response (errors, redirects).
fn simple(status: u16, message: &'static str, is_head: bool) -> Response {
    let mut r = Response {
        status,
        headers: Vec::with_capacity(4),
        body: if is_head {
            Body::Empty
        } else {
            Body::Bytes(Bytes::from_static(message.as_bytes()))
        },
        raw: Default::default(),
    };
    r.push(
        "content-type",
        Bytes::from_static(b"text/plain; charset=utf-8"),
    );
    r.push("content-length", (message.len() as u64).to_string());
    r
}

fn open_error(e: OpenError, is_head: bool) -> Response {
    match e {
        OpenError::NotFound | OpenError::Hidden => simple(404, "not found\n", is_head),
        OpenError::Forbidden => simple(403, "forbidden\n", is_head),
    }
}

/// What a path resolved to.
enum Found {
    /// A file, with the cache key it is stored under.
    File(Arc<Entry>, String),
    /// A directory (no index file, or asked for without the trailing slash).
    Dir(PathBuf),
}

/// Answers one request on a file route.
pub fn respond(route: &StaticRoute, req: &Request<'_>) -> Response {
    let is_head = req.method == "HEAD";
    if req.method != "GET" && !is_head {
        let mut r = simple(405, "method not allowed\n", false);
        r.push("allow", Bytes::from_static(b"GET, HEAD"));
        return r;
    }
    let clean = match path::clean(req.target, route.allow_hidden) {
        Ok(c) => c,
        Err(PathError::Invalid) => return simple(400, "bad request path\n", is_head),
        Err(PathError::Hidden) => return simple(404, "not found\n", is_head),
    };
    let mut full = clean.path.clone();
    if clean.trailing_slash && full != "/" {
        full.push('/');
    }
    let Some(rest) = full.strip_prefix(route.prefix.as_str()) else {
        return simple(404, "not found\n", is_head);
    };
    let rel = format!("/{}", rest.trim_start_matches('/'));
    let dir_request = rel.ends_with('/');
    let found = match lookup(route, &rel, dir_request) {
        Err(OpenError::NotFound) if !route.try_files.is_empty() => try_files(route, &rel),
        r => r,
    };
    match found {
        Ok(Found::File(entry, key)) => serve::serve_entry(route, req, entry, &key, is_head),
        Ok(Found::Dir(_)) if !dir_request => {
            // Redirect to the directory's canonical URL so relative links in it resolve; the
            // Location is rebuilt from the cleaned path, never echoed from the request.
            let mut r = simple(301, "moved permanently\n", is_head);
            let mut location = path::percent_encode(&full);
            location.push('/');
            if let Some((_, q)) = req.target.split_once('?') {
                location.push('?');
                location.push_str(q);
            }
            r.push("location", location);
            r
        }
        Ok(Found::Dir(dir)) if route.browse => {
            match listing::render(&dir, &full, route.allow_hidden) {
                Some(html) => {
                    let mut r = Response {
                        status: 200,
                        headers: Vec::with_capacity(3),
                        body: Body::Empty,
                        raw: Default::default(),
                    };
                    r.push(
                        "content-type",
                        Bytes::from_static(b"text/html; charset=utf-8"),
                    );
                    r.push("content-length", html.len().to_string());
                    if !is_head {
                        r.body = Body::Bytes(Bytes::from(html));
                    }
                    r
                }
                None => simple(403, "forbidden\n", is_head),
            }
        }
        Ok(Found::Dir(_)) => simple(404, "not found\n", is_head),
        Err(e) => open_error(e, is_head),
    }
}

/// `try_files`: the first fallback that is a file wins.
fn try_files(route: &StaticRoute, rel: &str) -> Result<Found, OpenError> {
    for pattern in &route.try_files {
        let mut candidate = pattern.replace("$uri", rel);
        if !candidate.starts_with('/') {
            candidate.insert(0, '/');
        }
        let Ok(clean) = path::clean(&candidate, route.allow_hidden) else {
            continue;
        };
        let mut key = clean.path;
        if clean.trailing_slash && key != "/" {
            key.push('/');
        }
        let dir = key.ends_with('/');
        if let Ok(found @ Found::File(..)) = lookup(route, &key, dir) {
            return Ok(found);
        }
    }
    Err(OpenError::NotFound)
}

/// Resolves `rel` through the cache. A directory request (`rel` ends with `/`) looks for
/// index files; a file request that finds a directory reports it (for the redirect).
fn lookup(route: &StaticRoute, rel: &str, dir_request: bool) -> Result<Found, OpenError> {
    let now = crate::clock::now_ms();
    let cached = route.cache.get(rel);
    if let Some(e) = &cached {
        if now.saturating_sub(e.checked_ms) < REVALIDATE_MS {
            return Ok(Found::File(e.clone(), rel.to_owned()));
        }
    }
    let opened = match resolve(route, rel, dir_request) {
        Ok(o) => o,
        Err(e) => {
            if cached.is_some() {
                route.cache.remove(rel);
            }
            return Err(e);
        }
    };
    if opened.meta.is_dir() {
        if cached.is_some() {
            route.cache.remove(rel);
        }
        return Ok(Found::Dir(opened.canonical));
    }
    let version = version_of(&opened.meta);
    let sidecars = probe_sidecars(route, &opened.canonical, &opened.meta);
    let entry = match cached {
        // Unchanged: keep content and variants, refresh the check time and sidecars.
        Some(old) if old.version == version => {
            let same_sidecars = sidecars_equal(&old.sidecars, &sidecars);
            let sidecars = if same_sidecars {
                old.sidecars.clone()
            } else {
                sidecars
            };
            old.with(sidecars, old.variants.clone(), now)
        }
        _ => build_entry(route, opened, sidecars, now),
    };
    Ok(Found::File(route.cache.insert(rel, entry), rel.to_owned()))
}

fn version_of(m: &std::fs::Metadata) -> (u64, u64, u64, std::time::SystemTime) {
    let mtime = m.modified().unwrap_or(std::time::UNIX_EPOCH);
    (m.dev(), m.ino(), m.len(), mtime)
}

fn sidecars_equal(a: &[Option<Sidecar>; 3], b: &[Option<Sidecar>; 3]) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| x.as_ref().map(|s| s.len) == y.as_ref().map(|s| s.len))
}

/// Opens `rel`; for a directory request, the first index file inside it instead (or the
/// directory itself when none exists).
fn resolve(route: &StaticRoute, rel: &str, dir_request: bool) -> Result<path::Opened, OpenError> {
    let opened = path::open(&route.root, rel, route.rules())?;
    if !opened.meta.is_dir() {
        if dir_request {
            // `/file.txt/`: a file is not a directory.
            return Err(OpenError::NotFound);
        }
        return Ok(opened);
    }
    if dir_request {
        for index in &route.index {
            let candidate = format!("{}/{index}", rel.trim_end_matches('/'));
            match path::open(&route.root, &candidate, route.rules()) {
                Ok(o) if o.meta.is_file() => return Ok(o),
                Err(OpenError::Forbidden) => return Err(OpenError::Forbidden),
                _ => {}
            }
        }
    }
    Ok(opened)
}

/// Sidecars `FILE.br`, `FILE.zst`, `FILE.gz` next to the canonical file: regular files (not
/// symlinks, unless `follow_symlinks`) at least as new as the file.
fn probe_sidecars(
    route: &StaticRoute,
    canonical: &Path,
    meta: &std::fs::Metadata,
) -> [Option<Sidecar>; 3] {
    if !route.precompressed {
        return [None, None, None];
    }
    let mtime = meta.modified().ok();
    let max_file = route.cache.max_file();
    Encoding::ALL.map(|e| {
        let mut name = canonical.as_os_str().to_owned();
        name.push(".");
        name.push(e.extension());
        let path = PathBuf::from(name);
        let lmeta = std::fs::symlink_metadata(&path).ok()?;
        if lmeta.file_type().is_symlink() && !route.follow_symlinks {
            return None;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .ok()?;
        let smeta = file.metadata().ok()?;
        if !smeta.is_file() || smeta.modified().ok() < mtime {
            return None;
        }
        let len = smeta.len();
        let source = if len <= max_file {
            Source::Memory(read_all(&file, len)?)
        } else {
            Source::File(Arc::new(file))
        };
        let len = match &source {
            Source::Memory(b) => b.len() as u64,
            Source::File(_) => len,
        };
        Some(Sidecar { source, len })
    })
}

fn read_all(mut file: &File, len: u64) -> Option<Bytes> {
    let mut buf = Vec::with_capacity(len as usize);
    file.read_to_end(&mut buf).ok()?;
    Some(Bytes::from(buf))
}

fn build_entry(
    route: &StaticRoute,
    opened: path::Opened,
    sidecars: [Option<Sidecar>; 3],
    now: u64,
) -> Entry {
    let version = version_of(&opened.meta);
    let mtime = version.3;
    let name = opened
        .canonical
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let content_type = mime::content_type(name);
    let mut len = opened.meta.len();
    let source = if len <= route.cache.max_file() {
        let file = opened.file;
        match read_all(&file, len) {
            Some(b) => {
                len = b.len() as u64;
                Source::Memory(b)
            }
            None => Source::File(Arc::new(file)),
        }
    } else {
        Source::File(Arc::new(opened.file))
    };
    let compressible = route.compress
        && matches!(source, Source::Memory(_))
        && len >= compress::MIN_SIZE
        && compress::is_compressible(content_type.as_bytes());
    Entry::new(
        source,
        len,
        mtime,
        version,
        content_type,
        compressible,
        sidecars,
        now,
    )
}
