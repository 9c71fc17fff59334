//! docker-compose files: each service's `traefik.*` labels are a dynamic configuration (the
//! docker provider's), with the service's address being its compose name. The Traefik
//! service's own `command:` flags (`--entrypoints.web.address=:80`) are a static one.
//!
//! Files are read first ([`read`]: containers kept, `.env` placeholders resolved); once every
//! static tree is known, [`build`] applies the provider's defaults: `exposedByDefault`, a
//! router for a container without one, `defaultRule` for routers without a rule, the port
//! (`loadbalancer.server.port`, else the lowest port the container exposes).

use std::path::{Path, PathBuf};

use veloxy_import::tree::{Node, Value};
use veloxy_import::{Loc, Options, Report};

use crate::dotenv::{interpolate, DotEnv, Model};
use crate::input::{add_tree, pairs, tree_of, Inputs};
use crate::node::{at, entries, flag, get, items, mk, text};

/// A compose service (container), as read.
#[derive(Debug, Clone)]
pub struct Container {
    /// The compose service name (its address on the compose network).
    pub name: String,
    /// Where its key is.
    pub loc: Loc,
    /// Its definitions (an override file adds one).
    pub nodes: Vec<Node>,
    /// The directory of its file.
    pub base: PathBuf,
    /// `traefik.*` labels, `traefik.` removed, placeholders resolved.
    pub labels: Vec<(String, String, Loc)>,
    /// Every label (for `defaultRule`'s `.Labels`).
    pub all_labels: Vec<(String, String)>,
    /// `rule` labels with an unresolved placeholder: (router, place, label, why), reported
    /// once the router's fate is known (a dashboard router's rule does not matter).
    pub refused_rules: Vec<(String, Loc, String, String)>,
    /// The compose project, and whether it is named (else the directory's name).
    pub project: (String, bool),
    /// Runs the Traefik image.
    pub traefik: bool,
}

/// The docker provider's static settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `exposedByDefault` (default true).
    pub exposed_by_default: bool,
    /// `defaultRule`.
    pub default_rule: String,
    /// Traefik's API port (the `traefik` entry point's).
    pub api_port: u16,
}

/// The docker provider's settings found in the static trees.
pub fn settings(statics: &[(Node, PathBuf)]) -> Settings {
    let mut s = Settings {
        exposed_by_default: true,
        default_rule: "Host(`{{ normalize .Name }}`)".into(),
        api_port: 8080,
    };
    for (t, _) in statics {
        for p in ["providers.docker", "providers.swarm"] {
            if let Some(d) = at(t, p) {
                if let Some(e) = flag(d, "exposedByDefault") {
                    s.exposed_by_default = e;
                }
                if let Some(r) = text(d, "defaultRule") {
                    s.default_rule = r;
                }
            }
        }
        if let Some(port) = at(t, "entryPoints.traefik")
            .and_then(|e| text(e, "address"))
            .and_then(|a| crate::entry::address(&a))
            .map(|a| a.1)
        {
            s.api_port = port;
        }
    }
    s
}

/// Reads a compose document's services (containers kept for [`build`]; the Traefik
/// service's flags become a static tree now).
pub fn read(doc: &Node, base: &Path, opts: &Options, report: &mut Report, inputs: &mut Inputs) {
    let Some(services) = get(doc, "services") else {
        return;
    };
    let env_i = match inputs.dotenv.iter().position(|(b, _)| b == base) {
        Some(i) => i,
        None => {
            let env = DotEnv::read(base).unwrap_or_default();
            inputs.dotenv.push((base.to_path_buf(), env));
            inputs.dotenv.len() - 1
        }
    };
    let env = &mut inputs.dotenv[env_i].1;
    let project = project(doc, base, opts, env);
    let mut found = Vec::new();
    for (k, svc) in entries(services) {
        let image = text(svc, "image")
            .and_then(|i| interpolate(&i, opts, env).ok())
            .unwrap_or_default();
        let traefik = is_traefik(&image) || runs_traefik(svc);
        if traefik {
            if let Some(cmd) = get(svc, "command") {
                let flags = flags(cmd, opts, env, report, &mut inputs.config_file);
                if !flags.is_empty() {
                    found.push(tree_of(&flags, &cmd.loc));
                }
            }
        }
        let mut labels = Vec::new();
        let mut all_labels = Vec::new();
        let mut refused_rules = Vec::new();
        for (key, v, l) in get(svc, "labels").map(pairs).unwrap_or_default() {
            let v = match interpolate(&v, opts, env) {
                Ok(v) => v,
                Err(why) => {
                    if let Some(r) = router_of_rule(&key) {
                        refused_rules.push((r, l, key.clone(), why));
                    } else if key.to_ascii_lowercase().starts_with("traefik.") {
                        report.refused(&l, key.clone(), why);
                    }
                    continue;
                }
            };
            all_labels.push((key.clone(), v.clone()));
            if key.to_ascii_lowercase().starts_with("traefik.") {
                labels.push((key["traefik.".len()..].to_string(), v, l));
            }
        }
        let c = Container {
            name: k.name.clone(),
            loc: k.loc.clone(),
            nodes: vec![svc.clone()],
            base: base.to_path_buf(),
            labels,
            all_labels,
            refused_rules,
            project: project.clone(),
            traefik,
        };
        merge(&mut inputs.containers, c);
    }
    for t in found {
        add_tree(t, base, inputs);
    }
}

/// An override file's service adds to the one already read (labels after, ports too).
fn merge(list: &mut Vec<Container>, c: Container) {
    match list
        .iter_mut()
        .find(|x| x.name == c.name && x.base == c.base)
    {
        Some(x) => {
            x.nodes.extend(c.nodes);
            x.labels.extend(c.labels);
            x.all_labels.extend(c.all_labels);
            x.refused_rules.extend(c.refused_rules);
            x.traefik |= c.traefik;
        }
        None => list.push(c),
    }
}

/// `http.routers.NAME.rule` -> NAME.
fn router_of_rule(label: &str) -> Option<String> {
    let lower = label.to_ascii_lowercase();
    let rest = lower.strip_prefix("traefik.http.routers.")?;
    let name = rest.strip_suffix(".rule")?;
    (!name.contains('.')).then(|| label["traefik.http.routers.".len()..][..name.len()].to_string())
}

/// The compose project: the file's `name:`, else `COMPOSE_PROJECT_NAME`, else the
/// directory's name (lowercase, letters, digits, `-` and `_` kept), as compose does.
fn project(doc: &Node, base: &Path, opts: &Options, env: &mut DotEnv) -> (String, bool) {
    if let Some(n) = text(doc, "name").and_then(|n| interpolate(&n, opts, env).ok()) {
        return (n, true);
    }
    if let Ok(n) = interpolate("${COMPOSE_PROJECT_NAME}", opts, env) {
        return (n, true);
    }
    let dir = std::fs::canonicalize(if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    })
    .unwrap_or_else(|_| base.to_path_buf());
    let name: String = dir
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (name, false)
}

/// `traefik`, `traefik:v3.1`, `docker.io/library/traefik:latest` (not `traefik/whoami`).
fn is_traefik(image: &str) -> bool {
    let name = image.split([':', '@']).next().unwrap_or_default();
    name.rsplit('/').next() == Some("traefik")
}

/// A service without a Traefik image whose command has Traefik's flags (an image given
/// elsewhere, an `extends`).
fn runs_traefik(svc: &Node) -> bool {
    get(svc, "command").is_some_and(|c| {
        pairs(c).iter().any(|(k, _, _)| {
            let k = k.to_ascii_lowercase();
            k.starts_with("--entrypoints.") || k.starts_with("--providers.")
        })
    })
}

/// The Traefik service's `command:` flags (`--a.b=c`, `--api.insecure`), `--` removed.
fn flags(
    cmd: &Node,
    opts: &Options,
    env: &mut DotEnv,
    report: &mut Report,
    config_file: &mut Vec<(Loc, String)>,
) -> Vec<(String, String, Loc)> {
    let mut out = Vec::new();
    for (k, v, l) in pairs(cmd) {
        let Some(key) = k.strip_prefix("--") else {
            continue;
        };
        if key.eq_ignore_ascii_case("configfile") {
            config_file.push((l, v));
            continue;
        }
        match interpolate(v.trim_matches('"'), opts, env) {
            Ok(v) => out.push((key.to_string(), v, l)),
            Err(why) => report.refused(&l, k.clone(), why),
        }
    }
    out
}

/// The container ports the compose file shows (`expose`, and the container side of
/// `ports`), lowest first. The image's own `EXPOSE` ports are not known here.
fn compose_ports(c: &Container, opts: &Options, env: &mut DotEnv) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::new();
    for n in &c.nodes {
        for key in ["expose", "ports"] {
            for item in get(n, key).map(items).unwrap_or_default() {
                let p = match get(item, "target") {
                    Some(t) => t.scalar().unwrap_or_default(),
                    None => item.scalar().unwrap_or_default(),
                };
                let p = interpolate(&p, opts, env).unwrap_or(p);
                let p = p.split('/').next().unwrap_or_default();
                let container = p.rsplit(':').next().unwrap_or_default();
                let first = container.split('-').next().unwrap_or_default();
                if let Ok(port) = first.trim().parse::<u16>() {
                    if !ports.contains(&port) {
                        ports.push(port);
                    }
                }
            }
        }
    }
    ports.sort_unstable();
    ports
}

/// After every file is read: each container's dynamic configuration, with the docker
/// provider's defaults.
pub fn build(inputs: &mut Inputs, opts: &Options, s: &Settings, report: &mut Report) {
    let containers = std::mem::take(&mut inputs.containers);
    let mut no_port = Vec::new();
    for c in &containers {
        let env_i = inputs
            .dotenv
            .iter()
            .position(|(b, _)| *b == c.base)
            .unwrap_or(0);
        let mut env = std::mem::take(&mut inputs.dotenv[env_i].1);
        let port = compose_ports(c, opts, &mut env).first().copied();
        let name_field = c
            .nodes
            .iter()
            .rev()
            .find_map(|n| text(n, "container_name"))
            .and_then(|n| interpolate(&n, opts, &mut env).ok());
        inputs.dotenv[env_i].1 = env;
        let container_name = name_field.unwrap_or_else(|| format!("{}-{}-1", c.project.0, c.name));
        if let Some(tree) = crate::labels::container(c, s, port, &container_name, report, inputs) {
            add_tree(tree, &c.base, inputs);
        } else if c.labels.is_empty() && s.exposed_by_default && !c.traefik && port.is_none() {
            no_port.push(c.name.clone());
        }
    }
    if !no_port.is_empty() {
        inputs.docker_notes.push(format!(
            "containers without traefik labels and without a port in the compose file ({}) get no route here (Traefik routes each by defaultRule to the lowest port its image exposes)",
            no_port.join(", ")
        ));
    }
    for (_, env) in &inputs.dotenv {
        for (name, (_, loc)) in &env.vars {
            if env.used.contains(name) {
                report.translated(loc, format!(".env {name}"));
            } else {
                report.ignored(
                    loc,
                    format!(".env {name}"),
                    "no placeholder the import reads uses it (it configures the containers)",
                );
            }
        }
    }
    inputs.containers = containers;
}

/// The `.Name` and `.ContainerName` a container's `defaultRule` sees.
pub fn model<'a>(c: &'a Container, name: &'a str, container_name: &'a str) -> Model<'a> {
    Model {
        name,
        container_name,
        labels: &c.all_labels,
    }
}

/// A Node with the string `v` at `loc`.
pub fn string(loc: &Loc, v: &str) -> Node {
    mk(loc, Value::Str(v.to_string()))
}
