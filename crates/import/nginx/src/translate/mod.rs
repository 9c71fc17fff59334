//! From the directive tree to the veloxy config and the report.
//!
//! Two passes: the first collects what other blocks refer to by name (`upstream`, `map`,
//! `limit_req_zone`) and every `server` with the `http` settings it inherits; the second
//! translates each server (its listeners, names, certificates and locations) into routes.
//!
//! * [`level`]: the inherited settings of a level.
//! * [`common`]: directives valid at several levels (headers, timeouts, access...).
//! * [`server`], [`location`]: servers and their locations; [`names`]: `server_name`s.
//! * [`upstream`]: `upstream` blocks and `proxy_pass` targets as veloxy groups.
//! * [`stream`]: the `stream` block.
//! * [`factor`]: rule sets for keys many routes share.
//! * [`cache`]: `proxy_cache_path` and `proxy_cache` as veloxy's response cache.

mod auth;
mod cache;
mod common;
mod env;
mod factor;
mod level;
mod location;
mod names;
mod pages;
mod server;
mod stream;
mod upstream;

use std::collections::BTreeMap;
use std::path::PathBuf;

use veloxy_import::{Config, Options, Report};

use crate::load::{Loaded, Skipped};
use crate::parse::Directive;

pub use level::Level;

/// Directives that change nothing a client or backend sees, and why.
const IGNORED: &[(&str, &str)] = &[
    (
        "user",
        "process user: veloxy runs as the user that starts it",
    ),
    (
        "worker_processes",
        "veloxy sizes its workers ([server] workers, default one per core)",
    ),
    (
        "worker_rlimit_nofile",
        "process limit: set by the service manager for veloxy",
    ),
    (
        "worker_connections",
        "veloxy has no per-worker connection table to size",
    ),
    (
        "worker_shutdown_timeout",
        "shutdown: veloxy's shutdown_timeout applies",
    ),
    ("use", "event method: veloxy uses epoll"),
    ("multi_accept", "accept tuning"),
    ("accept_mutex", "accept tuning"),
    ("pid", "process file"),
    ("daemon", "process management"),
    ("master_process", "process management"),
    ("pcre_jit", "regex engine tuning"),
    ("thread_pool", "I/O tuning"),
    ("error_log", "nginx's own log; veloxy logs to stderr"),
    ("log_format", "a log format is used by access_log"),
    ("sendfile", "I/O tuning: veloxy uses sendfile for files"),
    ("tcp_nopush", "I/O tuning"),
    ("tcp_nodelay", "I/O tuning"),
    ("aio", "I/O tuning"),
    ("directio", "I/O tuning"),
    ("output_buffers", "I/O tuning"),
    ("types_hash_max_size", "hash table sizing"),
    ("types_hash_bucket_size", "hash table sizing"),
    ("server_names_hash_bucket_size", "hash table sizing"),
    ("server_names_hash_max_size", "hash table sizing"),
    ("variables_hash_max_size", "hash table sizing"),
    ("variables_hash_bucket_size", "hash table sizing"),
    ("map_hash_bucket_size", "hash table sizing"),
    ("map_hash_max_size", "hash table sizing"),
    ("proxy_headers_hash_max_size", "hash table sizing"),
    ("proxy_headers_hash_bucket_size", "hash table sizing"),
    ("types", "MIME types: veloxy has its own extension table"),
    ("server_tokens", "the Server field's version text"),
    (
        "resolver",
        "veloxy resolves upstream names with the system resolver",
    ),
    (
        "resolver_timeout",
        "veloxy resolves upstream names with the system resolver",
    ),
    ("open_file_cache", "veloxy caches file lookups itself"),
    ("open_file_cache_valid", "veloxy caches file lookups itself"),
    (
        "open_file_cache_min_uses",
        "veloxy caches file lookups itself",
    ),
    (
        "open_file_cache_errors",
        "veloxy caches file lookups itself",
    ),
    (
        "client_header_buffer_size",
        "buffer sizing (veloxy's limit is max_header_bytes, 64 KiB)",
    ),
    (
        "large_client_header_buffers",
        "buffer sizing (veloxy's limit is max_header_bytes, 64 KiB)",
    ),
    (
        "client_body_buffer_size",
        "buffer sizing: veloxy streams bodies",
    ),
    (
        "client_body_temp_path",
        "veloxy streams bodies, no temp files",
    ),
    ("proxy_temp_path", "veloxy streams bodies, no temp files"),
    ("fastcgi_temp_path", "veloxy streams bodies, no temp files"),
    ("uwsgi_temp_path", "veloxy streams bodies, no temp files"),
    ("scgi_temp_path", "veloxy streams bodies, no temp files"),
    (
        "proxy_buffer_size",
        "buffer sizing: veloxy streams responses",
    ),
    ("proxy_buffers", "buffer sizing: veloxy streams responses"),
    (
        "proxy_busy_buffers_size",
        "buffer sizing: veloxy streams responses",
    ),
    (
        "proxy_max_temp_file_size",
        "veloxy streams responses, no temp files",
    ),
    (
        "proxy_temp_file_write_size",
        "veloxy streams responses, no temp files",
    ),
    ("proxy_buffering", "veloxy streams responses as they arrive"),
    (
        "proxy_request_buffering",
        "veloxy streams request bodies (small ones are buffered for retries)",
    ),
    (
        "proxy_http_version",
        "veloxy speaks HTTP/1.1 to upstreams (with keep-alive)",
    ),
    ("proxy_ignore_client_abort", "connection handling"),
    ("proxy_socket_keepalive", "TCP keep-alive probes"),
    ("reset_timedout_connection", "connection handling"),
    ("lingering_close", "connection handling"),
    ("lingering_time", "connection handling"),
    ("lingering_timeout", "connection handling"),
    (
        "keepalive_requests",
        "veloxy does not cap requests per connection",
    ),
    (
        "keepalive_time",
        "veloxy does not cap a connection's lifetime",
    ),
    (
        "ssl_session_cache",
        "veloxy keeps its own TLS session cache and tickets",
    ),
    (
        "ssl_session_timeout",
        "veloxy keeps its own TLS session cache and tickets",
    ),
    (
        "ssl_session_tickets",
        "veloxy keeps its own TLS session cache and tickets",
    ),
    ("ssl_prefer_server_ciphers", "rustls orders its own suites"),
    ("ssl_dhparam", "no DHE suites in rustls: ECDHE only"),
    ("ssl_ecdh_curve", "rustls picks X25519 / P-256 / P-384"),
    ("ssl_buffer_size", "TLS record sizing"),
    (
        "ssl_stapling",
        "OCSP stapling: clients fetch status themselves",
    ),
    (
        "ssl_stapling_verify",
        "OCSP stapling: clients fetch status themselves",
    ),
    ("ssl_trusted_certificate", "used for OCSP stapling only"),
    ("ssl_early_data", "0-RTT is off in veloxy over TCP"),
    (
        "ssl_ciphers",
        "rustls offers its own modern suites (AES-GCM, ChaCha20), a subset of any usual list",
    ),
    (
        "gzip_comp_level",
        "veloxy compresses at gzip level 6, brotli 4",
    ),
    ("gzip_buffers", "buffer sizing"),
    (
        "gzip_http_version",
        "veloxy compresses for HTTP/1.1 and later",
    ),
    ("gzip_min_length", "veloxy compresses from 256 bytes"),
    (
        "gzip_vary",
        "veloxy sends Vary: Accept-Encoding on eligible answers",
    ),
    ("gzip_disable", "old-browser exclusions"),
    (
        "gzip_proxied",
        "veloxy compresses answers to proxied requests too",
    ),
    (
        "http2_max_field_size",
        "HTTP/2 sizing (veloxy's limit is max_header_bytes)",
    ),
    (
        "http2_max_header_size",
        "HTTP/2 sizing (veloxy's limit is max_header_bytes)",
    ),
    ("http2_max_concurrent_streams", "HTTP/2 sizing"),
    (
        "http2_push_preload",
        "server push: obsolete, browsers removed it",
    ),
    (
        "server_name_in_redirect",
        "redirects name the requested host",
    ),
    ("msie_padding", "old-browser workaround"),
    (
        "ignore_invalid_headers",
        "veloxy refuses invalid header names itself",
    ),
    ("limit_req_log_level", "log level"),
    ("limit_conn_log_level", "log level"),
    ("etag", "veloxy sends strong ETags on files"),
    (
        "if_modified_since",
        "veloxy answers conditional requests on files",
    ),
    (
        "load_module",
        "nginx modules: their directives are reported one by one",
    ),
    ("env", "environment for nginx's workers"),
    (
        "ssl_preread",
        "read with the stream's map of $ssl_preread_server_name",
    ),
];

/// The state of one import.
pub struct Tr<'a> {
    pub(crate) opts: &'a Options,
    /// nginx's prefix: relative paths are resolved from it.
    pub(crate) prefix: PathBuf,
    pub(crate) cfg: Config,
    pub(crate) rep: Report,
    /// `upstream` blocks of `http`, by name.
    pub(crate) upstream_blocks: BTreeMap<String, upstream::Block>,
    /// `map` blocks by the variable they set (without `$`).
    pub(crate) maps: BTreeMap<String, &'a Directive>,
    /// `limit_req_zone`s: zone -> (rate, key) or why it cannot be translated.
    pub(crate) zones: BTreeMap<String, Result<(String, String), String>>,
    /// veloxy groups made so far: (target, settings) -> name.
    pub(crate) groups: BTreeMap<String, String>,
    /// Servers and their inherited settings, for the second pass.
    servers: Vec<(&'a Directive, Level)>,
    /// `stream` blocks.
    streams: Vec<&'a Directive>,
    /// `proxy_cache_path` zones by name.
    pub(crate) cache_zones: BTreeMap<String, cache::Zone>,
    /// Whether `map $http_upgrade $connection_upgrade` is used by a header.
    pub(crate) upgrade_map: Option<String>,
    /// `auth_request` lines not reported yet (reported when a route uses them).
    pub(crate) auth_pending: Vec<veloxy_import::Loc>,
    /// Each route's `auth_request` (the placeholder `forward_auth` holds its index).
    pub(crate) auth_uses: Vec<auth::Use>,
    /// The current server's locations answering `auth_request` URIs.
    pub(crate) auth_targets: Vec<auth::Target>,
}

/// Translates the loaded files.
pub fn translate(loaded: &Loaded, opts: &Options, prefix: PathBuf) -> (Config, Report) {
    let mut rep = Report::default();
    let directives = env::resolve(&loaded.directives, opts, &mut rep);
    let mut tr = Tr {
        opts,
        prefix,
        cfg: Config::default(),
        rep,
        upstream_blocks: BTreeMap::new(),
        maps: BTreeMap::new(),
        zones: BTreeMap::new(),
        groups: BTreeMap::new(),
        servers: Vec::new(),
        streams: Vec::new(),
        upgrade_map: None,
        cache_zones: BTreeMap::new(),
        auth_pending: Vec::new(),
        auth_uses: Vec::new(),
        auth_targets: Vec::new(),
    };
    for (loc, why) in &loaded.skipped {
        match why {
            Skipped::MimeTypes => tr.rep.ignored(
                loc,
                "include",
                "MIME types: veloxy has its own extension table",
            ),
            Skipped::Params(proto) => tr.rep.ignored(
                loc,
                "include",
                format!(
                    "{proto} parameters (a stock file not in the input); the {}_pass using them is refused",
                    match *proto {
                        "FastCGI" => "fastcgi",
                        "uwsgi" => "uwsgi",
                        _ => "scgi",
                    }
                ),
            ),
            Skipped::Unreadable(e) => tr.rep.refused(
                loc,
                "include",
                format!("cannot read {e} (nginx would not start)"),
            ),
        }
    }
    let mut http = Level::default();
    tr.main(&directives, &mut http);
    let servers = std::mem::take(&mut tr.servers);
    server::translate_servers(&mut tr, &servers);
    for d in std::mem::take(&mut tr.streams) {
        stream::translate(&mut tr, d);
    }
    for loc in std::mem::take(&mut tr.auth_pending) {
        if !tr.rep.entries.iter().any(|e| e.loc == loc) {
            tr.rep.ignored(
                &loc,
                "auth_request",
                "no route it applies to (nginx's return answers before access checks)",
            );
        }
    }
    tr.finish_upstreams();
    tr.finish_maps();
    cache::finish(&mut tr);
    if tr.cfg.server.get("request_id").is_none() && tr.cfg.to_toml().contains("{request_id}") {
        tr.cfg.server.set("request_id", "X-Request-Id");
    }
    factor::rule_sets(&mut tr.cfg);
    tr.rep.sort();
    // A file included twice (or the stock proxy_params) reports each line once when it
    // fares the same both times.
    tr.rep.entries.dedup();
    (tr.cfg, tr.rep)
}

impl<'a> Tr<'a> {
    /// The main context (and the `http` context: a site file holds `server` blocks at its
    /// top level).
    fn main(&mut self, list: &'a [Directive], http: &mut Level) {
        let all: Vec<&Directive> = list.iter().collect();
        auth::prescan(self, &all, http);
        for d in list {
            match d.name.as_str() {
                "http" => {
                    self.rep.translated(&d.loc, "http");
                    self.main(d.children(), http);
                }
                "events" => {
                    self.rep
                        .ignored(&d.loc, "events", "connection processing tuning");
                    self.main(d.children(), http);
                }
                "include" => self.include(d, |tr, l| tr.main(l, http)),
                "stream" => self.streams.push(d),
                "server" => self.servers.push((d, http.clone())),
                "upstream" => upstream::collect(self, d),
                "map" => {
                    let var = d.arg(1).trim_start_matches('$').to_string();
                    self.maps.insert(var, d);
                }
                "limit_req_zone" => self.limit_req_zone(d),
                "proxy_cache_path" => cache::path(self, d),
                "limit_conn_zone" => self.rep.refused(
                    &d.loc,
                    "limit_conn_zone",
                    "veloxy has no per-key connection limit (max_concurrency is per route)",
                ),
                _ => {
                    if !common::directive(self, d, http, common::At::Http) {
                        self.unknown(d);
                    }
                }
            }
        }
    }

    /// An `include`: its line, then its directives handled by `walk` at the same level.
    pub(crate) fn include(
        &mut self,
        d: &'a Directive,
        walk: impl FnOnce(&mut Self, &'a [Directive]),
    ) {
        if d.block.as_ref().is_some_and(|b| !b.is_empty()) {
            self.rep.translated(&d.loc, "include");
        } else if !self.rep.entries.iter().any(|e| e.loc == d.loc) {
            self.rep
                .ignored(&d.loc, "include", "the pattern matches no file");
        }
        walk(self, d.children());
    }

    /// `list` with each `include` replaced by the directives it holds (each include
    /// reported once, where it is written).
    pub(crate) fn flat(&mut self, list: &'a [Directive]) -> Vec<&'a Directive> {
        let mut out = Vec::new();
        for d in list {
            if d.name == "include" && d.block.is_some() {
                self.include(d, |tr, l| out.extend(tr.flat(l)));
            } else {
                out.push(d);
            }
        }
        out
    }

    /// A directive this importer does not know, or one in the wrong place.
    pub(crate) fn unknown(&mut self, d: &Directive) {
        if let Some((_, why)) = IGNORED.iter().find(|(n, _)| *n == d.name) {
            self.rep.ignored(&d.loc, &d.name, *why);
            if d.name != "types" {
                for c in d.children() {
                    self.unknown(c);
                }
            }
            return;
        }
        let why = match d.name.as_str() {
            "fastcgi_pass" | "uwsgi_pass" | "scgi_pass" | "memcached_pass" => {
                "veloxy speaks HTTP to backends (no FastCGI, uwsgi, SCGI or memcached)".into()
            }
            n if n.starts_with("fastcgi_") || n.starts_with("uwsgi_") || n.starts_with("scgi_") => {
                "veloxy speaks HTTP to backends (no FastCGI, uwsgi or SCGI)".into()
            }
            n if n.starts_with("proxy_cache") => {
                "nginx's proxy cache: veloxy's cache ([caches]) is configured differently".into()
            }
            n if n.starts_with("sub_filter") => "veloxy does not rewrite response bodies".into(),
            n if n.starts_with("lua") || n.ends_with("_by_lua_block") || n.ends_with("_by_lua") => {
                "veloxy runs no Lua".into()
            }
            n if n.starts_with("js_") => "veloxy runs no njs".into(),
            n => format!("{n} is not known to veloxy import"),
        };
        self.rep.refused(&d.loc, &d.name, why);
        for c in d.children() {
            self.skip(c, "inside a refused block");
        }
    }

    /// Adds `diff` to the report line at `loc` (translated becomes translated with a
    /// difference), once.
    pub(crate) fn amend(&mut self, loc: &veloxy_import::Loc, diff: &str) {
        use veloxy_import::Outcome;
        let Some(e) = self.rep.entries.iter_mut().rev().find(|e| e.loc == *loc) else {
            return;
        };
        match &mut e.outcome {
            Outcome::Translated => e.outcome = Outcome::Different(diff.to_string()),
            Outcome::Different(w) if !w.contains(diff) => {
                w.push_str("; ");
                w.push_str(diff);
            }
            _ => {}
        }
    }

    /// Reports `d` and everything inside it as refused with `why`.
    pub(crate) fn skip(&mut self, d: &Directive, why: &str) {
        self.rep.refused(&d.loc, &d.name, why);
        for c in d.children() {
            self.skip(c, why);
        }
    }

    /// Reports `d` and everything inside it as ignored with `why`.
    pub(crate) fn skip_ignored(&mut self, d: &Directive, why: &str) {
        self.rep.ignored(&d.loc, &d.name, why);
        for c in d.children() {
            self.skip_ignored(c, why);
        }
    }

    fn limit_req_zone(&mut self, d: &Directive) {
        let mut zone = None;
        let mut rate = None;
        for a in d.args.iter().skip(1) {
            if let Some(z) = a.text.strip_prefix("zone=") {
                zone = Some(z.split(':').next().unwrap_or(z).to_string());
            } else if let Some(r) = a.text.strip_prefix("rate=") {
                rate = r
                    .strip_suffix("r/s")
                    .map(|n| format!("{n}/s"))
                    .or_else(|| r.strip_suffix("r/m").map(|n| format!("{n}/m")));
            }
        }
        let key = match d.arg(0) {
            "$binary_remote_addr" | "$remote_addr" => Ok("client_ip".to_string()),
            "$server_name" | "$host" => Ok("route".to_string()),
            k => match k.strip_prefix("$http_") {
                Some(h) if !crate::vars::has_vars(h) => {
                    Ok(format!("header:{}", h.replace('_', "-")))
                }
                _ => Err(format!(
                    "the key {k}: veloxy limits by client_ip, a header or the route"
                )),
            },
        };
        let Some(zone) = zone else {
            self.rep.refused(&d.loc, "limit_req_zone", "no zone=NAME");
            return;
        };
        let entry = match (rate, key) {
            (Some(r), Ok(k)) => Ok((r, k)),
            (None, _) => Err("a rate other than N r/s or N r/m".to_string()),
            (_, Err(e)) => Err(e),
        };
        match &entry {
            Ok(_) => self.rep.translated(&d.loc, "limit_req_zone"),
            Err(e) => self.rep.refused(&d.loc, "limit_req_zone", e.clone()),
        }
        self.zones.insert(zone, entry);
    }

    /// The `map` lines: the WebSocket idiom is veloxy's native behaviour; other maps are
    /// refused (veloxy has no map), and so is every directive using their variable.
    fn finish_maps(&mut self) {
        let maps = std::mem::take(&mut self.maps);
        for (var, d) in maps {
            if Some(&var) == self.upgrade_map.as_ref() {
                self.rep.translated(&d.loc, "map");
                self.skip_ignored_children(d, "part of the WebSocket upgrade map");
            } else if d.arg(0) == "$ssl_preread_server_name"
                && self.rep.entries.iter().any(|e| e.loc == d.loc)
            {
                // Reported by the stream translation.
            } else if self.rep.entries.iter().any(|e| match &e.outcome {
                veloxy_import::Outcome::Refused(w) => w.contains(&format!("${var}")),
                _ => false,
            }) {
                self.rep.refused(
                    &d.loc,
                    "map",
                    format!("veloxy has no map: ${var} cannot be computed (the directives using it are refused)"),
                );
                self.skip_ignored_children(d, "an entry of a refused map");
            } else {
                self.rep
                    .ignored(&d.loc, "map", format!("${var} is used nowhere"));
                self.skip_ignored_children(d, "an entry of an unused map");
            }
        }
    }

    fn skip_ignored_children(&mut self, d: &Directive, why: &str) {
        for c in d.children() {
            self.skip_ignored(c, why);
        }
    }
}
