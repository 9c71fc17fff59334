//! A route's `fastcgi = { root, index, split_path, params }` and its `try_files`.

use std::sync::Arc;

use toml::Spanned;

use crate::config::error::{ConfigError, Source};

/// `fastcgi = { root, index, split_path, params }`: the root is absolute (it is a path on the
/// FastCGI server's side, so it need not exist here), `split_path` a regex with two groups.
pub(super) fn fastcgi(
    src: &Source,
    key: &str,
    f: &Spanned<crate::config::file::FastcgiSection>,
    try_files: Option<&Spanned<Vec<String>>>,
) -> Result<Arc<crate::fastcgi::FastcgiRoute>, ConfigError> {
    let route_key = key;
    let key = format!("{key}.fastcgi");
    let s = f.get_ref();
    let root = s.root.get_ref();
    if !root.starts_with('/') {
        return Err(src.error(
            s.root.span(),
            format!("{key}.root"),
            "must be an absolute path (as the FastCGI server sees it)",
        ));
    }
    let index = s.index.clone().unwrap_or_else(|| "index.php".to_owned());
    if index.is_empty() || index.contains('/') {
        return Err(src.error(f.span(), format!("{key}.index"), "must be a file name"));
    }
    let split_path_text = s
        .split_path
        .as_ref()
        .map_or(r"^(.+\.php)(/.*)$".to_owned(), |p| p.get_ref().clone());
    let split_path = match &s.split_path {
        None => regex_automata::meta::Regex::new(r"^(.+\.php)(/.*)$").expect("valid"),
        Some(p) => {
            let re = regex_automata::meta::Regex::new(p.get_ref()).map_err(|e| {
                src.error(
                    p.span(),
                    format!("{key}.split_path"),
                    format!("not a regex: {e}"),
                )
            })?;
            if re.group_info().group_len(regex_automata::PatternID::ZERO) < 3 {
                return Err(src.error(
                    p.span(),
                    format!("{key}.split_path"),
                    "needs two groups: the script and PATH_INFO",
                ));
            }
            re
        }
    };
    let params = s.params.clone().unwrap_or_default().into_iter().collect();
    let mut route = crate::fastcgi::FastcgiRoute {
        root: root.into(),
        index,
        split_path,
        split_path_text,
        params,
        try_files: None,
    };
    if let Some(list) = try_files {
        route.try_files = Some(compile_try_files(src, route_key, s, list, &route)?);
    }
    Ok(Arc::new(route))
}

/// `try_files` on a FastCGI route (see [`crate::fastcgi::TryFiles`]): `"$uri"` and `"$uri/"`
/// in any order, then the script to run (`"/index.php"`, the request's query going with it).
/// The root must exist here: veloxy serves its files.
fn compile_try_files(
    src: &Source,
    key: &str,
    s: &crate::config::file::FastcgiSection,
    list: &Spanned<Vec<String>>,
    route: &crate::fastcgi::FastcgiRoute,
) -> Result<crate::fastcgi::TryFiles, ConfigError> {
    let err = |m: String| src.error(list.span(), format!("{key}.try_files"), m);
    let entries = list.get_ref();
    let Some((last, before)) = entries.split_last() else {
        return Err(err(
            "needs the script to run last, e.g. [\"$uri\", \"$uri/\", \"/index.php\"]".into(),
        ));
    };
    if last.contains('?') {
        return Err(err(format!(
            "{last:?}: the request's query goes to the script as it is (QUERY_STRING); \
             write the script alone, e.g. \"/index.php\""
        )));
    }
    let script = last.starts_with('/')
        && !last.contains('$')
        && !last.split('/').any(|p| p == "..")
        && (last.ends_with(".php") || route.split_path.is_match(&format!("{last}/")));
    if !script {
        return Err(err(format!(
            "{last:?}: the last entry is the script to run, a path like \"/index.php\" \
             (ending in .php, or one split_path splits)"
        )));
    }
    let (mut file, mut dir) = (false, false);
    for e in before {
        match e.as_str() {
            "$uri" => file = true,
            "$uri/" => dir = true,
            _ => {
                return Err(err(format!(
                    "{e:?}: on a FastCGI route, the entries before the script are \"$uri\" \
                     (an existing file) and \"$uri/\" (a directory's {})",
                    route.index
                )))
            }
        }
    }
    let root = s.root.get_ref();
    let root_err = |m: String| src.error(s.root.span(), format!("{key}.fastcgi.root"), m);
    let files = crate::static_files::StaticRoute::new("", std::path::Path::new(root), FILE_CACHE)
        .map_err(|e| {
        root_err(format!(
            "{root:?}: try_files serves the files under the root, which must exist here ({e})"
        ))
    })?;
    if !files.root.is_dir() {
        return Err(root_err(format!("{root:?} is not a directory")));
    }
    let mut files = files;
    files.index = Vec::new();
    Ok(crate::fastcgi::TryFiles {
        file,
        dir,
        fallback: last.clone(),
        entries: entries.clone(),
        files: Arc::new(files),
    })
}

/// The file cache of a FastCGI route's static files.
const FILE_CACHE: usize = 16 * 1024 * 1024;
