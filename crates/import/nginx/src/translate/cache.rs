//! nginx's proxy cache as veloxy's response cache: `proxy_cache_path` is a `[caches.NAME]`
//! (memory, and its directory as the disk tier), `proxy_cache NAME` with `proxy_cache_valid`,
//! `proxy_cache_key`, `proxy_cache_use_stale`, `proxy_cache_methods`... is a route's `cache`.
//!
//! What differs by design is named where it is written: veloxy keys by the client's Host
//! and method (nginx's default key is `$scheme$proxy_host$request_uri`), does not store
//! answers to requests with Authorization, lets a client's `Cache-Control: no-cache`
//! revalidate, and bounds serving stale answers by a duration (nginx's `inactive`).

use toml::Value;
use veloxy_import::{Loc, Section};

use super::level::Own;
use super::{Level, Tr};
use crate::parse::Directive;
use crate::vars;

/// nginx's default `inactive` (entries unused this long are deleted).
const INACTIVE: &str = "10m";

/// How veloxy's default key differs from nginx's.
const DEFAULT_KEY: &str = "veloxy's key {method}{scheme}://{authority}{uri} keeps one entry \
     per Host name (and port) and method, where nginx's $scheme$proxy_host$request_uri shares \
     one entry among every name of the server";

/// A `proxy_cache_path` zone.
#[derive(Debug, Clone)]
pub struct Zone {
    loc: Loc,
    path: String,
    max_size: Option<String>,
    inactive: String,
    diffs: Vec<String>,
    used: bool,
}

/// One `proxy_cache_valid`: its status codes and the veloxy duration.
pub type Valid = (Vec<String>, String);

/// The cache settings a level passes down (each inherited on its own, as nginx does).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `proxy_cache NAME` (`Some(None)`: `proxy_cache off`).
    pub zone: Option<Option<String>>,
    /// `proxy_cache_valid` lines: (codes, veloxy duration).
    pub valid: Option<std::rc::Rc<Vec<Valid>>>,
    /// `proxy_cache_key` as a veloxy template (`None`: nginx's default).
    pub key: Option<String>,
    /// `proxy_cache_use_stale`: (on errors, `updating`).
    pub stale: (bool, bool),
    /// `add_header NAME $upstream_cache_status`.
    pub status_header: Option<String>,
    /// `proxy_ignore_headers Cache-Control Expires`.
    pub ignore_cache_control: bool,
}

/// Pass 1: a `proxy_cache_path` (reported when the caches are written).
pub fn path(tr: &mut Tr<'_>, d: &Directive) {
    let mut zone = None;
    let mut z = Zone {
        loc: d.loc.clone(),
        path: d.arg(0).to_string(),
        max_size: None,
        inactive: INACTIVE.into(),
        diffs: Vec::new(),
        used: false,
    };
    let mut bad = None;
    for a in d.args.iter().skip(1) {
        let (k, v) = a.text.split_once('=').unwrap_or((a.text.as_str(), ""));
        match k {
            "keys_zone" => zone = Some(v.split(':').next().unwrap_or(v).to_string()),
            "max_size" => z.max_size = vars::size(v),
            "inactive" => match vars::duration(v) {
                Some(t) => z.inactive = t,
                None => bad = Some(format!("inactive={v}")),
            },
            "levels" | "use_temp_path" | "min_free" | "manager_files" | "manager_sleep"
            | "manager_threshold" | "loader_files" | "loader_sleep" | "loader_threshold" => {}
            other => bad = Some(format!("{other}: nginx Plus or unknown")),
        }
    }
    let Some(name) = zone else {
        tr.rep
            .refused(&d.loc, "proxy_cache_path", "no keys_zone=NAME:SIZE");
        return;
    };
    if let Some(b) = bad {
        tr.rep.refused(&d.loc, "proxy_cache_path", b);
        return;
    }
    z.diffs.push(format!(
        "nginx keeps entries on disk and deletes those unused for {}; veloxy holds them in \
         memory ({}) and on disk under {} in its own file layout, evicting the least recently \
         used",
        z.inactive,
        memory(&z),
        z.path
    ));
    tr.cache_zones.insert(name, z);
}

/// Memory for a zone: its `max_size` up to 256 MiB.
fn memory(z: &Zone) -> String {
    let cap = 256u64 << 20;
    z.max_size
        .as_deref()
        .and_then(bytes)
        .filter(|b| *b <= cap && *b > 0)
        .and_then(|_| z.max_size.clone())
        .unwrap_or_else(|| "256MiB".into())
}

fn bytes(s: &str) -> Option<u64> {
    let (n, mult) = if let Some(n) = s.strip_suffix("GiB") {
        (n, 1u64 << 30)
    } else if let Some(n) = s.strip_suffix("MiB") {
        (n, 1 << 20)
    } else if let Some(n) = s.strip_suffix("KiB") {
        (n, 1 << 10)
    } else {
        (s, 1)
    };
    n.parse::<u64>().ok().map(|n| n * mult)
}

/// A level's cache directive; `false` when `d` is not one.
pub fn directive(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) -> bool {
    let loc = &d.loc;
    let name = d.name.as_str();
    let c = &mut lvl.cache;
    match name {
        "proxy_cache" => {
            if d.arg(0) == "off" {
                c.zone = Some(None);
                tr.rep.translated(loc, name);
            } else if let Some(z) = tr.cache_zones.get_mut(d.arg(0)) {
                z.used = true;
                c.zone = Some(Some(d.arg(0).to_string()));
                tr.rep.different(
                    loc,
                    name,
                    format!(
                        "veloxy does not store answers to requests with Authorization, and a \
                         client's Cache-Control: no-cache (or Pragma: no-cache) makes it \
                         revalidate (nginx ignores both); without proxy_cache_key, {DEFAULT_KEY}"
                    ),
                );
            } else {
                tr.rep.refused(
                    loc,
                    name,
                    format!("no proxy_cache_path with keys_zone={}", d.arg(0)),
                );
            }
        }
        "proxy_cache_valid" => valid(tr, d, lvl),
        "proxy_cache_key" => key(tr, d, lvl),
        "proxy_cache_use_stale" => {
            let mut on_error = false;
            let mut updating = false;
            let mut other = Vec::new();
            for a in &d.args {
                match a.text.as_str() {
                    "off" => {}
                    "updating" => updating = true,
                    "error" | "timeout" | "http_500" | "http_502" | "http_503" | "http_504" => {
                        on_error = true
                    }
                    o => other.push(o.to_string()),
                }
            }
            c.stale = (on_error, updating);
            let mut diffs = Vec::new();
            if on_error {
                diffs.push(
                    "veloxy serves a stale answer on any failure (no connection, timeout, 5xx) \
                     for the zone's inactive time past freshness; nginx on the listed ones for \
                     as long as the entry is kept"
                        .to_string(),
                );
            }
            if !other.is_empty() {
                diffs.push(format!("{} are not kept", other.join(", ")));
            }
            if diffs.is_empty() {
                tr.rep.translated(loc, name);
            } else {
                tr.rep.different(loc, name, diffs.join("; "));
            }
        }
        "proxy_cache_background_update" => tr.rep.translated(loc, name),
        "proxy_cache_methods" => {
            let other: Vec<&str> = d
                .args
                .iter()
                .map(|a| a.text.as_str())
                .filter(|m| !m.eq_ignore_ascii_case("GET") && !m.eq_ignore_ascii_case("HEAD"))
                .collect();
            if other.is_empty() {
                tr.rep.translated(loc, name);
            } else {
                tr.rep.refused(
                    loc,
                    name,
                    format!(
                        "{}: veloxy caches answers to GET and HEAD only",
                        other.join(", ")
                    ),
                );
            }
        }
        "proxy_cache_lock" if d.arg(0) == "on" => tr.rep.translated(loc, name),
        "proxy_cache_lock" => tr.rep.different(
            loc,
            name,
            "veloxy always sends one request per key upstream while others wait",
        ),
        "proxy_cache_lock_timeout" | "proxy_cache_lock_age" => tr.rep.different(
            loc,
            name,
            "waiting requests go upstream themselves after 10 s",
        ),
        "proxy_cache_revalidate" if d.arg(0) == "on" => tr.rep.translated(loc, name),
        "proxy_cache_revalidate" => tr.rep.different(
            loc,
            name,
            "veloxy revalidates expired entries with If-None-Match / If-Modified-Since",
        ),
        "proxy_cache_min_uses" if d.arg(0) == "1" => tr.rep.translated(loc, name),
        "proxy_cache_min_uses" => {
            tr.rep
                .different(loc, name, "veloxy stores an answer the first time")
        }
        "proxy_cache_bypass" | "proxy_no_cache" => bypass(tr, d),
        "proxy_ignore_headers" => {
            let names: Vec<String> = d.args.iter().map(|a| a.text.to_ascii_lowercase()).collect();
            if names.iter().all(|n| n == "cache-control" || n == "expires") && names.len() == 2 {
                c.ignore_cache_control = true;
                tr.rep.translated(loc, name);
            } else if names.iter().all(|n| n.starts_with("x-accel-")) {
                tr.rep.translated(loc, name);
            } else {
                tr.rep.refused(
                    loc,
                    name,
                    "veloxy ignores Cache-Control and Expires together (ignore_cache_control), nothing else",
                );
            }
        }
        _ => return false,
    }
    true
}

fn valid(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let (codes, time) = match d.args.split_last() {
        Some((t, codes)) => (
            codes.iter().map(|a| a.text.clone()).collect::<Vec<_>>(),
            t.text.as_str(),
        ),
        None => return,
    };
    let Some(t) = vars::duration(time) else {
        tr.rep
            .refused(&d.loc, "proxy_cache_valid", format!("duration {time:?}"));
        return;
    };
    let codes = if codes.is_empty() {
        vec!["200".into(), "301".into(), "302".into()]
    } else {
        codes
    };
    Level::start(&mut lvl.own, Own::CACHE_VALID, &mut lvl.cache.valid).push((codes, t));
    tr.rep.different(
        &d.loc,
        "proxy_cache_valid",
        "veloxy has one default_ttl (the 200 answers' time, else the first line's) for every \
         status the HTTP caching RFC lets a cache store without freshness (200, 203, 204, 301, \
         308, 404, 405, 410, 414, 501)",
    );
}

fn key(tr: &mut Tr<'_>, d: &Directive, lvl: &mut Level) {
    let k = d.arg(0);
    if k == "$scheme$proxy_host$request_uri" {
        lvl.cache.key = None;
        tr.rep.different(&d.loc, "proxy_cache_key", DEFAULT_KEY);
        return;
    }
    if k.contains("$proxy_host") {
        tr.rep.refused(
            &d.loc,
            "proxy_cache_key",
            "$proxy_host in a custom key: veloxy keys by the request",
        );
        return;
    }
    match vars::template(k, &super::common::ctx(lvl)) {
        Ok(t) => {
            lvl.cache.key = Some(t);
            tr.rep.translated(&d.loc, "proxy_cache_key");
        }
        Err(v) => tr.rep.refused(
            &d.loc,
            "proxy_cache_key",
            format!("veloxy has no variable {v}"),
        ),
    }
}

/// `proxy_cache_bypass` / `proxy_no_cache`: the client's Pragma / Cache-Control (veloxy
/// revalidates on `no-cache`, bypasses on `no-store`) and Upgrade (never cached) only.
fn bypass(tr: &mut Tr<'_>, d: &Directive) {
    if tr.cache_zones.is_empty() {
        tr.rep.ignored(
            &d.loc,
            &d.name,
            "no proxy_cache_path: nothing is cached, so nothing is bypassed",
        );
        return;
    }
    let vars: Vec<&str> = d.args.iter().map(|a| a.text.as_str()).collect();
    let known = |v: &&str| {
        matches!(
            v.to_ascii_lowercase().as_str(),
            "$http_pragma" | "$http_cache_control" | "$http_upgrade" | "$http_authorization"
        )
    };
    if vars.iter().all(known) {
        tr.rep.different(
            &d.loc,
            &d.name,
            "veloxy goes upstream for a client's Cache-Control/Pragma no-cache (revalidating) or \
             no-store, and never caches upgrades or answers to Authorization; nginx for any \
             value that is not empty or \"0\"",
        );
    } else {
        tr.rep.refused(
            &d.loc,
            &d.name,
            format!(
                "{}: veloxy bypasses its cache only on the client's Cache-Control and Pragma",
                vars.join(" ")
            ),
        );
    }
}

/// The route's `cache` for a proxied level with `proxy_cache` on.
pub fn route(tr: &Tr<'_>, lvl: &Level, sec: &mut Section) {
    let c = &lvl.cache;
    let Some(Some(zone)) = &c.zone else {
        return;
    };
    let Some(z) = tr.cache_zones.get(zone) else {
        return;
    };
    // veloxy caches answers of HTTP/1.1 groups only (gRPC is refused at load).
    let group = sec.get("upstream").and_then(|u| u.as_str()).unwrap_or("");
    if tr
        .cfg
        .upstreams
        .iter()
        .any(|(n, g)| n == group && g.get("protocol").is_some())
    {
        return;
    }
    let mut t = toml::Table::new();
    t.insert("store".into(), zone.as_str().into());
    if let Some(k) = &c.key {
        t.insert("key".into(), k.as_str().into());
    }
    if let Some(valid) = c.valid.as_deref() {
        let ttl = valid
            .iter()
            .find(|(codes, _)| codes.iter().any(|c| c == "200" || c == "any"))
            .or(valid.first())
            .map(|(_, t)| t.clone());
        if let Some(ttl) = ttl {
            t.insert("default_ttl".into(), ttl.into());
        }
    }
    if c.stale.1 {
        t.insert("stale_while_revalidate".into(), z.inactive.as_str().into());
    }
    if c.stale.0 {
        t.insert("stale_if_error".into(), z.inactive.as_str().into());
    }
    if c.ignore_cache_control {
        t.insert("ignore_cache_control".into(), true.into());
    }
    if let Some(h) = &c.status_header {
        t.insert("cache_status_header".into(), h.as_str().into());
    }
    sec.set("cache", Value::Table(t));
}

/// Writes the used zones as `[caches.NAME]` and reports every `proxy_cache_path`.
pub fn finish(tr: &mut Tr<'_>) {
    let zones = std::mem::take(&mut tr.cache_zones);
    for (name, z) in &zones {
        if !z.used {
            tr.rep
                .ignored(&z.loc, "proxy_cache_path", "no proxy_cache uses it");
            continue;
        }
        let base = tr.prefix.clone();
        let path = tr.opts.out_path(&base, &z.path);
        let mut s = Section::from(&z.loc);
        s.set("memory", memory(z));
        let mut disk = toml::Table::new();
        disk.insert("path".into(), path.into());
        if let Some(m) = &z.max_size {
            disk.insert("size".into(), m.as_str().into());
        }
        s.set("disk", Value::Table(disk));
        // nginx adds no status field unless add_header sends $upstream_cache_status.
        s.set("cache_status_header", "");
        tr.cfg.caches.push((name.clone(), s));
        tr.rep
            .different(&z.loc, "proxy_cache_path", z.diffs.join("; "));
    }
    tr.cache_zones = zones;
}
