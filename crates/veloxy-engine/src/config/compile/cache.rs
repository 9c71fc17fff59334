//! `[caches.NAME]` and a route's `cache = {...}`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::dur;
use super::rules::size;
use crate::cache::lookup::RouteCache;
use crate::config::error::{ConfigError, Source};
use crate::config::file::{CacheSection, FileConfig, RouteCacheSection};
use crate::late::Late;

/// A route's cache key when it sets none: the method, the scheme and the authority as they
/// are forwarded (X-Forwarded-Proto, Host with its port), and the request target. What else
/// reaches the upstream is not in the key (docs: "Keys and variants").
pub(crate) const DEFAULT_KEY: &str = "{method}{scheme}://{authority}{uri}";
/// A `[caches.NAME]`, checked.
pub(super) struct CacheSpec {
    live: crate::cache::StoreSpec,
    max_object: u64,
    status_header: Option<String>,
}

impl CacheSpec {
    /// The store's name, slot and `max_object`.
    pub(super) fn store(&self) -> (Box<str>, Late<crate::cache::Store>, u64) {
        (
            self.live.name.as_str().into(),
            self.live.store.clone(),
            self.max_object,
        )
    }
}

/// The stores the runtime makes, in name order.
pub(super) fn store_specs(caches: HashMap<String, CacheSpec>) -> Vec<crate::cache::StoreSpec> {
    let mut out: Vec<_> = caches.into_values().map(|c| c.live).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Refuses a disk path that can never be a directory (it, or the nearest part of it that
/// exists, is something else), without creating anything: the runtime makes the directory.
fn usable_dir(path: &Path) -> Result<(), String> {
    let mut at = Some(path);
    while let Some(p) = at {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if p == path => return Err("not a directory".to_owned()),
            Ok(_) => return Err(format!("{} is not a directory", p.display())),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                at = p.parent()
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

const DEFAULT_MEMORY: u64 = 256 << 20;
const DEFAULT_MAX_OBJECT: u64 = 8 << 20;
const DEFAULT_DISK: u64 = 10 << 30;

/// Checks every `[caches.NAME]`.
pub(super) fn compile_caches(
    src: &Source,
    file: &FileConfig,
) -> Result<HashMap<String, CacheSpec>, ConfigError> {
    let mut out = HashMap::new();
    for (name, section) in &file.caches {
        let key = format!("caches.{name}");
        let c: &CacheSection = section.get_ref();
        if !super::valid_name(name) {
            return Err(src.error(section.span(), key, "names use letters, digits, _ - ."));
        }
        let memory = c
            .memory
            .as_ref()
            .map(|m| size(src, &format!("{key}.memory"), m))
            .transpose()?
            .unwrap_or(DEFAULT_MEMORY);
        // Unset, it follows `memory`: a quarter of it, at most 8 MiB.
        let max_object = c
            .max_object
            .as_ref()
            .map(|m| size(src, &format!("{key}.max_object"), m))
            .transpose()?
            .unwrap_or((memory / 4).min(DEFAULT_MAX_OBJECT));
        let defaulted = |v: u64| {
            if c.max_object.is_some() {
                String::new()
            } else {
                format!(
                    " (max_object is not set: its default is a quarter of memory, at most 8MiB, \
                     here {}; set {key}.max_object to change it)",
                    size_text(v)
                )
            }
        };
        if memory < (1 << 20) {
            let span = c.memory.as_ref().map_or(section.span(), |m| m.span());
            return Err(src.error(span, format!("{key}.memory"), "must be at least 1MiB"));
        }
        if max_object == 0 || max_object > memory / 4 {
            let span = c.max_object.as_ref().map_or(section.span(), |m| m.span());
            return Err(src.error(
                span,
                format!("{key}.max_object"),
                "must be above 0 and at most a quarter of memory",
            ));
        }
        let status_header = status_header(src, &key, c.cache_status_header.as_ref())?;
        let targeted = targeted(src, &key, c.targeted_cache_control.as_ref())?;
        let disk = match &c.disk {
            None => None,
            Some(d) => {
                let dk = format!("{key}.disk");
                let spec = d.get_ref();
                let size = spec
                    .size
                    .as_ref()
                    .map(|s| size(src, &format!("{dk}.size"), s))
                    .transpose()?
                    .unwrap_or(DEFAULT_DISK);
                if size < max_object {
                    return Err(src.error(
                        d.span(),
                        format!("{dk}.size"),
                        format!("must be at least max_object{}", defaulted(max_object)),
                    ));
                }
                let path = super::absolute(&src.relative(spec.path.get_ref()));
                usable_dir(&path).map_err(|e| {
                    src.error(
                        spec.path.span(),
                        format!("{dk}.path"),
                        format!("cannot use the directory: {e}"),
                    )
                })?;
                Some(crate::cache::DiskSpec { path, size })
            }
        };
        // The live store is made by the runtime as soon as the cache is configured (purges
        // and metrics name it even before a route uses it), with its disk directory; compiling
        // (`veloxy check`) creates nothing.
        out.insert(
            name.clone(),
            CacheSpec {
                live: crate::cache::StoreSpec {
                    name: name.clone(),
                    memory,
                    disk,
                    store: Late::empty(),
                    targeted,
                },
                max_object,
                status_header: status_header.unwrap_or(Some("X-Cache".to_owned())),
            },
        );
    }
    Ok(out)
}

/// `targeted_cache_control`: the field veloxy obeys first (RFC 9213), then
/// `CDN-Cache-Control`, which it always obeys.
fn targeted(
    src: &Source,
    key: &str,
    v: Option<&Spanned<String>>,
) -> Result<Arc<[Box<str>]>, ConfigError> {
    let cdn: Box<str> = crate::cache::policy::CDN_CACHE_CONTROL.into();
    let Some(v) = v else {
        return Ok(Arc::from([cdn]));
    };
    let field = format!("{key}.targeted_cache_control");
    super::rules::field_name(src, v.span(), &field, v.get_ref().trim())?;
    let name = v.get_ref().trim().to_ascii_lowercase();
    if matches!(name.as_str(), "cache-control" | "pragma" | "expires") {
        return Err(src.error(
            v.span(),
            field,
            "names a field of its own meaning: a targeted field is another one, \
             like \"Veloxy-Cache-Control\"",
        ));
    }
    if *name == *cdn {
        return Ok(Arc::from([cdn]));
    }
    Ok(Arc::from([name.into_boxed_str(), cdn]))
}

/// `cache_status_header`: `Some(None)` turns it off ("").
fn status_header(
    src: &Source,
    key: &str,
    v: Option<&Spanned<String>>,
) -> Result<Option<Option<String>>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let name = v.get_ref().trim();
    if name.is_empty() {
        return Ok(Some(None));
    }
    let field = format!("{key}.cache_status_header");
    super::rules::field_name(src, v.span(), &field, name)?;
    Ok(Some(Some(name.to_owned())))
}

/// A route's `cache = {...}`; `http1` says whether the route's group speaks HTTP/1.1
/// (`None`: the route has no group); `compress`: the route's `compress`.
pub(super) fn route_cache(
    src: &Source,
    key: &str,
    c: &Spanned<RouteCacheSection>,
    caches: &HashMap<String, CacheSpec>,
    http1: Option<bool>,
    compress: bool,
) -> Result<Arc<RouteCache>, ConfigError> {
    let key = format!("{key}.cache");
    let r = c.get_ref();
    let store = r.store.get_ref();
    let spec = caches.get(store).ok_or_else(|| {
        src.error(
            r.store.span(),
            format!("{key}.store"),
            format!("cache {store:?} is not defined (add [caches.{store}])"),
        )
    })?;
    match http1 {
        None => {
            return Err(src.error(c.span(), key, "is for proxied routes (with upstream)"));
        }
        Some(false) => {
            return Err(src.error(
                c.span(),
                key,
                "caching is built for HTTP/1.1 upstream groups so far (protocol = \"http1\")",
            ));
        }
        Some(true) => {}
    }
    let template_text = r.key.as_ref().map_or(DEFAULT_KEY, |k| k.get_ref().as_str());
    let span = r.key.as_ref().map_or(c.span(), |k| k.span());
    let template = super::rules::template(src, span, &format!("{key}.key"), template_text, None)?;
    let (mut get, mut head, mut query) = (true, true, false);
    if let Some(m) = &r.methods {
        (get, head) = (false, false);
        for method in m.get_ref() {
            match method.to_ascii_uppercase().as_str() {
                "GET" => get = true,
                "HEAD" => head = true,
                "QUERY" => query = true,
                other => {
                    return Err(src.error(
                        m.span(),
                        format!("{key}.methods"),
                        format!("{other:?} responses are not cacheable here: GET, HEAD and QUERY"),
                    ))
                }
            }
        }
    }
    let purge = r
        .purge
        .as_ref()
        .map(|l| {
            crate::access::IpList::parse(l.get_ref())
                .map(|allow| crate::access::IpRules {
                    allow: Some(allow),
                    deny: Default::default(),
                })
                .map_err(|m| src.error(l.span(), format!("{key}.purge"), m))
        })
        .transpose()?;
    let status = match status_header(src, &key, r.cache_status_header.as_ref())? {
        Some(s) => s,
        None => spec.status_header.clone(),
    };
    let route = crate::cache::lookup::RouteCacheSettings {
        key: template,
        get,
        head,
        query,
        policy: crate::cache::policy::Settings {
            default_ttl: dur(&r.default_ttl, Duration::ZERO),
            stale_while_revalidate: dur(&r.stale_while_revalidate, Duration::ZERO),
            stale_if_error: dur(&r.stale_if_error, Duration::ZERO),
            ignore_cache_control: r
                .ignore_cache_control
                .as_ref()
                .is_some_and(|b| *b.get_ref()),
        },
        status_header: status,
        purge,
        compress,
        targeted: spec.live.targeted.clone(),
    };
    Ok(Arc::new(RouteCache::new(spec.store(), route)))
}

/// A size in the largest binary unit that divides it (`"8MiB"`), for messages.
fn size_text(v: u64) -> String {
    match v {
        v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}MiB", v >> 20),
        v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}KiB", v >> 10),
        v => format!("{v} bytes"),
    }
}
