//! Reading the inputs: the static file (traefik.yml / traefik.toml), dynamic files (YAML or
//! TOML) and docker-compose files, whose services' `traefik.*` labels are a dynamic
//! configuration (and whose Traefik service's `command:` flags are a static one). Everything
//! becomes one [`Inputs`]: the static trees and the dynamic objects by kind and name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use veloxy_import::tree::{self, Key, Node, Value};
use veloxy_import::{ImportError, Loc, Options, Report};

use crate::node::{entries, get, list_at, mk, text};

/// A named dynamic object (a router, a middleware, a service...).
#[derive(Debug, Clone)]
pub struct Named {
    /// Its name (without an `@provider` suffix).
    pub name: String,
    /// Where its name is (the directive's place).
    pub loc: Loc,
    /// Its definition.
    pub node: Node,
    /// The directory relative paths in it are read from.
    pub base: PathBuf,
}

/// Every input, read.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Static configuration trees (files, or a compose Traefik service's flags), with the
    /// directory of each.
    pub statics: Vec<(Node, PathBuf)>,
    /// `http.routers`.
    pub routers: Vec<Named>,
    /// `http.middlewares`.
    pub middlewares: Vec<Named>,
    /// `http.services`.
    pub services: Vec<Named>,
    /// `http.serversTransports`.
    pub transports: Vec<Named>,
    /// `tcp.routers`.
    pub tcp_routers: Vec<Named>,
    /// `tcp.services`.
    pub tcp_services: Vec<Named>,
    /// `tls.certificates` entries (name = index).
    pub certs: Vec<Named>,
    /// `tls.options`.
    pub tls_options: Vec<Named>,
    /// `tls.stores`.
    pub tls_stores: Vec<Named>,
    /// Other dynamic sections (`udp`, `http.unknown`...), refused by name.
    pub other: Vec<(Loc, String)>,
    /// Whether any docker-compose file was given.
    pub compose: bool,
    /// Files already read (so `providers.file` does not read one twice).
    pub read: Vec<PathBuf>,
    /// Compose services, until [`crate::compose::build`] makes their configurations.
    pub containers: Vec<crate::compose::Container>,
    /// The `.env` file of each compose file's directory.
    pub dotenv: Vec<(PathBuf, crate::dotenv::DotEnv)>,
    /// Differences the docker provider's line names.
    pub docker_notes: Vec<String>,
    /// Differences of routers made or completed from labels: (router, note).
    pub router_notes: Vec<(String, String)>,
    /// `--configFile` flags of a compose Traefik service: (place, path).
    pub config_file: Vec<(Loc, String)>,
    /// Whether a static file (not flags) was given.
    pub static_file: bool,
    /// `rule` labels not resolved: (router, place, label, why).
    pub refused_rules: Vec<(String, Loc, String, String)>,
    /// Routers Traefik drops: (router, why).
    pub router_refusals: Vec<(String, String)>,
}

/// Which kind of file a text is: `compose` (services with `traefik.` labels, or a Traefik
/// service), `traefik` (a static or dynamic file: top-level `entryPoints`, `providers`,
/// `certificatesResolvers`, `http`/`tcp` with routers, in YAML or TOML), else `None`.
pub fn kind(_path: &Path, text: &str) -> Option<&'static str> {
    let lower = text.to_ascii_lowercase();
    let top = |k: &str| {
        lower.lines().any(|l| {
            l.starts_with(&format!("{k}:"))
                || l.starts_with(&format!("[{k}."))
                || l.starts_with(&format!("[{k}]"))
                || l.starts_with(&format!("[[{k}."))
        })
    };
    if top("services") {
        let traefik = lower.contains("traefik.")
            || lower.contains("image: traefik:")
            || lower.contains("image: \"traefik:");
        return traefik.then_some("compose");
    }
    let static_file = top("entrypoints") || top("providers") || top("certificatesresolvers");
    let dynamic = (top("http") || top("tcp"))
        && (lower.contains("routers")
            || lower.contains("services")
            || lower.contains("middlewares"));
    (static_file || dynamic || (top("tls") && lower.contains("certfile"))).then_some("traefik")
}

/// Reads `files` in order.
pub fn read_all(
    files: &[PathBuf],
    opts: &Options,
    report: &mut Report,
) -> Result<Inputs, ImportError> {
    let mut inputs = Inputs::default();
    for f in files {
        read_file(f, opts, report, &mut inputs)?;
    }
    Ok(inputs)
}

/// Reads one file (static, dynamic or compose) into `inputs`.
pub fn read_file(
    path: &Path,
    opts: &Options,
    report: &mut Report,
    inputs: &mut Inputs,
) -> Result<(), ImportError> {
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if inputs.read.contains(&canon) {
        return Ok(());
    }
    inputs.read.push(canon);
    if path.file_name().is_some_and(|n| n == ".env") {
        // compose's variables: read beside each compose file.
        return Ok(());
    }
    let raw = veloxy_import::source::read(path)?;
    let file: Arc<str> = path.display().to_string().into();
    let base = path.parent().unwrap_or(Path::new("")).to_path_buf();
    let toml = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
    let parse = |src: &str| -> Result<Vec<Node>, ImportError> {
        Ok(if toml {
            vec![tree::parse_toml(&file, src)?]
        } else {
            tree::parse_yaml(&file, src)?
        })
    };
    // Only the file provider's dynamic files are Go templates: a static file (or a compose
    // file) is read as written, so its defaultRule template stays for the docker provider.
    let plain =
        raw.contains("{{") && parse(&raw).is_ok_and(|docs| docs.iter().all(|d| !is_dynamic(d)));
    let docs = if plain || !raw.contains("{{") {
        parse(&raw)?
    } else {
        parse(&go_env(&raw, &file, opts, report))?
    };
    for doc in docs {
        if doc.is_null() {
            continue;
        }
        if doc.as_map().is_none() {
            return Err(veloxy_import::ParseError::new(
                doc.loc.clone(),
                "expected a mapping of keys",
            )
            .into());
        }
        let compose = get(&doc, "services").is_some_and(|s| s.as_map().is_some())
            && get(&doc, "http").is_none();
        if compose {
            inputs.compose = true;
            crate::compose::read(&doc, &base, opts, report, inputs);
        } else {
            let before = inputs.statics.len();
            add_tree(doc, &base, inputs);
            inputs.static_file |= inputs.statics.len() > before;
        }
    }
    Ok(())
}

const STATIC_KEYS: &[&str] = &[
    "entrypoints",
    "providers",
    "certificatesresolvers",
    "api",
    "log",
    "accesslog",
    "global",
    "serverstransport",
    "tcpserverstransport",
    "metrics",
    "ping",
    "tracing",
    "experimental",
    "core",
    "hostresolver",
    "spiffe",
    "pilot",
    "ocsp",
];

/// Whether a document holds dynamic configuration (`http`, `tcp`, `udp`, `tls`).
fn is_dynamic(doc: &Node) -> bool {
    ["http", "tcp", "udp", "tls"]
        .iter()
        .any(|k| get(doc, k).is_some())
}

/// Splits a tree into its static part (kept whole) and its dynamic objects.
pub fn add_tree(doc: Node, base: &Path, inputs: &mut Inputs) {
    let mut statics = Vec::new();
    for (k, v) in entries(&doc) {
        let lower = k.name.to_ascii_lowercase();
        if STATIC_KEYS.contains(&lower.as_str()) {
            statics.push((k.clone(), v.clone()));
            continue;
        }
        match lower.as_str() {
            "http" => add_http(v, base, inputs),
            "tcp" => {
                for (k2, v2) in entries(v) {
                    match k2.name.to_ascii_lowercase().as_str() {
                        "routers" => add_named(v2, base, &mut inputs.tcp_routers),
                        "services" => add_named(v2, base, &mut inputs.tcp_services),
                        _ => inputs
                            .other
                            .push((k2.loc.clone(), format!("tcp.{}", k2.name))),
                    }
                }
            }
            "tls" => add_tls(v, base, inputs),
            _ if crate::v1::is_static_key(&lower) => statics.push((k.clone(), v.clone())),
            _ => inputs.other.push((k.loc.clone(), k.name.clone())),
        }
    }
    if !statics.is_empty() {
        inputs
            .statics
            .push((mk(&doc.loc, Value::Map(statics)), base.to_path_buf()));
    }
}

fn add_http(v: &Node, base: &Path, inputs: &mut Inputs) {
    for (k, v2) in entries(v) {
        let list = match k.name.to_ascii_lowercase().as_str() {
            "routers" => &mut inputs.routers,
            "middlewares" => &mut inputs.middlewares,
            "services" => &mut inputs.services,
            "serverstransports" => &mut inputs.transports,
            _ => {
                inputs
                    .other
                    .push((k.loc.clone(), format!("http.{}", k.name)));
                continue;
            }
        };
        add_named(v2, base, list);
    }
}

fn add_tls(v: &Node, base: &Path, inputs: &mut Inputs) {
    for (k, v2) in entries(v) {
        match k.name.to_ascii_lowercase().as_str() {
            "certificates" => {
                for (i, c) in crate::node::items(v2).into_iter().enumerate() {
                    inputs.certs.push(Named {
                        name: i.to_string(),
                        loc: c.loc.clone(),
                        node: c.clone(),
                        base: base.to_path_buf(),
                    });
                }
            }
            "options" => add_named(v2, base, &mut inputs.tls_options),
            "stores" => add_named(v2, base, &mut inputs.tls_stores),
            _ => inputs
                .other
                .push((k.loc.clone(), format!("tls.{}", k.name))),
        }
    }
}

/// Adds each `name: {...}` of a mapping; a later definition of a name replaces the earlier.
pub fn add_named(v: &Node, base: &Path, list: &mut Vec<Named>) {
    for (k, node) in entries(v) {
        let name = strip_provider(&k.name).to_string();
        list.retain(|n| n.name != name);
        list.push(Named {
            name,
            loc: k.loc.clone(),
            node: node.clone(),
            base: base.to_path_buf(),
        });
    }
}

/// `name@file` -> `name` (one namespace for every provider read here).
pub fn strip_provider(name: &str) -> &str {
    match name.rsplit_once('@') {
        Some((n, p)) if !matches!(p, "internal") => n,
        _ => name,
    }
}

/// Follows `providers.file` of the static trees: the named file or directory, unless it was
/// given already. Returns what happened, for the report.
pub fn follow_file_provider(
    node: &Node,
    base: &Path,
    opts: &Options,
    report: &mut Report,
    inputs: &mut Inputs,
) -> Result<Result<(), String>, ImportError> {
    let mut paths = Vec::new();
    if let Some(f) = text(node, "filename") {
        paths.push(PathBuf::from(f));
    }
    if let Some(d) = text(node, "directory") {
        let dir = resolve(base, &d);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return Ok(Err(format!(
                "directory {d} not found: give its files on the command line"
            )));
        };
        let mut found: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| matches!(e, "yml" | "yaml" | "toml" | "json"))
            })
            .collect();
        found.sort();
        paths.extend(found);
    }
    for p in paths {
        let full = resolve(base, &p.to_string_lossy());
        let canon = std::fs::canonicalize(&full).unwrap_or_else(|_| full.clone());
        if inputs.read.contains(&canon) {
            continue;
        }
        if !full.is_file() {
            return Ok(Err(format!(
                "{} not found: give the dynamic file on the command line",
                p.display()
            )));
        }
        read_file(&full, opts, report, inputs)?;
    }
    Ok(Ok(()))
}

fn resolve(base: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() || path.exists() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

/// Builds a tree from dotted keys (`http.routers.app.rule`, `servers[0].url`): labels and
/// command-line flags. Later keys replace earlier ones.
pub fn insert(root: &mut Node, segments: &[&str], loc: &Loc, value: Node) {
    let Some((first, rest)) = segments.split_first() else {
        *root = value;
        return;
    };
    let (name, index) = match first.split_once('[') {
        Some((n, i)) => (n, i.trim_end_matches(']').parse::<usize>().ok()),
        None => (*first, None),
    };
    if root.as_map().is_none() {
        *root = mk(loc, Value::Map(Vec::new()));
    }
    let Value::Map(m) = &mut root.value else {
        unreachable!("just made a map")
    };
    let pos = match m
        .iter()
        .position(|(k, _)| k.name.eq_ignore_ascii_case(name))
    {
        Some(p) => p,
        None => {
            let key = Key {
                name: name.to_string(),
                loc: loc.clone(),
            };
            m.push((key, mk(loc, Value::Null)));
            m.len() - 1
        }
    };
    let child = &mut m[pos].1;
    match index {
        None => insert(child, rest, loc, value),
        Some(i) => {
            if child.as_seq().is_none() {
                *child = mk(loc, Value::Seq(Vec::new()));
            }
            let Value::Seq(s) = &mut child.value else {
                unreachable!("just made a sequence")
            };
            while s.len() <= i {
                s.push(mk(loc, Value::Null));
            }
            insert(&mut s[i], rest, loc, value);
        }
    }
}

/// `key=value` pairs (labels, flags) as a tree; `prefix` (`traefik.`, `--`) removed and
/// compared without case.
pub fn tree_of(pairs: &[(String, String, Loc)], loc: &Loc) -> Node {
    let mut root = mk(loc, Value::Map(Vec::new()));
    for (k, v, l) in pairs {
        let segs: Vec<&str> = k.split('.').collect();
        insert(&mut root, &segs, l, mk(l, Value::Str(v.clone())));
    }
    root
}

/// The list of a compose `labels`/`command` value: `["a=b"]`, `{a: b}` or a string.
pub fn pairs(n: &Node) -> Vec<(String, String, Loc)> {
    match &n.value {
        Value::Map(m) => m
            .iter()
            .map(|(k, v)| {
                (
                    k.name.clone(),
                    v.scalar().unwrap_or_default(),
                    k.loc.clone(),
                )
            })
            .collect(),
        _ => list_at_self(n)
            .into_iter()
            .map(|(s, l)| match s.split_once('=') {
                Some((k, v)) => (k.trim().to_string(), v.to_string(), l),
                None => (s.trim().to_string(), "true".to_string(), l),
            })
            .collect(),
    }
}

fn list_at_self(n: &Node) -> Vec<(String, Loc)> {
    match &n.value {
        Value::Seq(items) => items
            .iter()
            .filter_map(|i| Some((i.scalar()?, i.loc.clone())))
            .collect(),
        _ => n
            .scalar()
            .unwrap_or_default()
            .split_whitespace()
            .map(|s| (s.to_string(), n.loc.clone()))
            .collect(),
    }
}

/// `list_at` re-exported for the compose reader.
pub fn names(n: &Node, key: &str) -> Vec<String> {
    list_at(n, key).into_iter().map(|(s, _)| s).collect()
}

/// The file provider's Go templates `{{ env "NAME" }}` (the form configs use), resolved from
/// the environment with `--env`; unresolved ones and other templates are refused by place.
fn go_env(src: &str, file: &Arc<str>, opts: &Options, report: &mut Report) -> String {
    if !src.contains("{{") {
        return src.to_string();
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    let mut offset = 0;
    while let Some(i) = rest.find("{{") {
        let Some(end) = rest[i..].find("}}") else {
            break;
        };
        let inner = rest[i + 2..i + end]
            .trim()
            .trim_start_matches('-')
            .trim_end_matches('-')
            .trim();
        out.push_str(&rest[..i]);
        let loc = Loc::at_offset(file, src, offset + i);
        let name = inner
            .strip_prefix("env")
            .map(|n| n.trim().trim_matches('"'))
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        match name.map(|n| (n, opts.expand_env(&format!("${{{n}}}")))) {
            Some((_, Ok(v))) => out.push_str(&v),
            Some((n, Err(why))) => {
                report.refused(&loc, format!("{{{{ env \"{n}\" }}}}"), why);
                out.push_str(&rest[i..i + end + 2]);
            }
            None => {
                report.refused(
                    &loc,
                    "Go template",
                    "only {{ env \"NAME\" }} templates are resolved",
                );
                out.push_str(&rest[i..i + end + 2]);
            }
        }
        offset += i + end + 2;
        rest = &rest[i + end + 2..];
    }
    out.push_str(rest);
    out
}
