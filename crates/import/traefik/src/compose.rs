//! docker-compose files: each service's `traefik.*` labels are a dynamic configuration (the
//! docker provider's), with the service's address being its compose name and the port its
//! `loadbalancer.server.port` label (else its one exposed port). The Traefik service's own
//! `command:` flags (`--entrypoints.web.address=:80`) are a static configuration.

use std::path::Path;

use veloxy_import::tree::{Node, Value};
use veloxy_import::{Loc, Options, Report};

use crate::input::{add_tree, insert, pairs, tree_of, Inputs};
use crate::node::{entries, get, get_kv, list, mk, text};

/// Reads a compose document's services.
pub fn read(doc: &Node, base: &Path, opts: &Options, report: &mut Report, inputs: &mut Inputs) {
    let Some(services) = get(doc, "services") else {
        return;
    };
    for (k, svc) in entries(services) {
        let image = text(svc, "image").unwrap_or_default();
        if is_traefik(&image) {
            if let Some(cmd) = get(svc, "command") {
                let flags = flags(cmd, opts, report);
                if !flags.is_empty() {
                    let tree = tree_of(&flags, &cmd.loc);
                    add_tree(tree, base, inputs);
                }
            }
        }
        let Some(labels) = get(svc, "labels") else {
            continue;
        };
        let labels = traefik_labels(labels, opts, report);
        if labels.is_empty() {
            continue;
        }
        if let Some((_, v, l)) = labels
            .iter()
            .find(|(k, _, _)| k.eq_ignore_ascii_case("enable"))
        {
            if v.eq_ignore_ascii_case("false") {
                report.ignored(l, "traefik.enable", "false: Traefik ignores this container");
                continue;
            }
            report.translated(l, "traefik.enable");
        }
        let mut rest = Vec::new();
        for (key, v, l) in labels {
            let lower = key.to_ascii_lowercase();
            if lower == "enable" {
                continue;
            } else if lower.starts_with("docker.") || lower == "tags" {
                report.ignored(
                    &l,
                    format!("traefik.{key}"),
                    "veloxy reaches the container by its compose service name",
                );
            } else {
                rest.push((key, v, l));
            }
        }
        let mut tree = tree_of(&rest, &k.loc);
        let port = compose_port(svc);
        complete(&mut tree, &k.name, port.as_deref(), &k.loc);
        add_tree(tree, base, inputs);
    }
}

/// `traefik`, `traefik:v3.1`, `docker.io/library/traefik:latest` (not `traefik/whoami`).
fn is_traefik(image: &str) -> bool {
    let name = image.split([':', '@']).next().unwrap_or_default();
    name.rsplit('/').next() == Some("traefik")
}

/// The `traefik.*` labels, `traefik.` removed, placeholders resolved, `$$` unescaped.
fn traefik_labels(n: &Node, opts: &Options, report: &mut Report) -> Vec<(String, String, Loc)> {
    let mut out = Vec::new();
    for (k, v, l) in pairs(n) {
        let Some(key) = k
            .strip_prefix("traefik.")
            .or_else(|| k.strip_prefix("Traefik."))
            .filter(|_| k.to_ascii_lowercase().starts_with("traefik."))
        else {
            continue;
        };
        match interpolate(&v, opts) {
            Ok(v) => out.push((key.to_string(), v, l)),
            Err(why) => report.refused(&l, k.clone(), why),
        }
    }
    out
}

/// docker-compose interpolation: `${VAR}` from the environment, `$$` is a `$`.
fn interpolate(v: &str, opts: &Options) -> Result<String, String> {
    let expanded = if v.contains("${") {
        opts.expand_env(&v.replace("$$", "\u{0}"))?
            .replace('\u{0}', "$$")
    } else {
        v.to_string()
    };
    Ok(expanded.replace("$$", "$"))
}

/// The Traefik service's `command:` flags (`--a.b=c`, `--api.insecure`), `--` removed.
fn flags(cmd: &Node, opts: &Options, report: &mut Report) -> Vec<(String, String, Loc)> {
    let mut out = Vec::new();
    for (k, v, l) in pairs(cmd) {
        let Some(key) = k.strip_prefix("--") else {
            continue;
        };
        if key.eq_ignore_ascii_case("configfile") {
            report.refused(
                &l,
                "--configFile",
                "give the static file it names on the command line",
            );
            continue;
        }
        match interpolate(&v, opts) {
            Ok(v) => out.push((key.to_string(), v, l)),
            Err(why) => report.refused(&l, k.clone(), why),
        }
    }
    out
}

/// The container port Traefik would pick: the one `expose`d port, else the one published
/// port's container side.
fn compose_port(svc: &Node) -> Option<String> {
    let mut ports: Vec<String> = Vec::new();
    for key in ["expose", "ports"] {
        for (p, _) in get(svc, key).map(list).unwrap_or_default() {
            let p = p.split('/').next().unwrap_or_default();
            let container = p.rsplit(':').next().unwrap_or_default().to_string();
            if !container.is_empty() && !ports.contains(&container) {
                ports.push(container);
            }
        }
        if !ports.is_empty() {
            break;
        }
    }
    (ports.len() == 1).then(|| ports.remove(0))
}

/// The docker provider's implicit parts: each service's server is `NAME:PORT`; a container
/// with routers and no service gets one named after it; routers without a service use the
/// container's only one.
fn complete(tree: &mut Node, name: &str, port: Option<&str>, loc: &Loc) {
    for proto in ["http", "tcp"] {
        let has_routers = get(tree, proto)
            .and_then(|p| get(p, "routers"))
            .is_some_and(|r| entries(r).iter().any(|(_, v)| get(v, "service").is_none()));
        let services: Vec<String> = get(tree, proto)
            .and_then(|p| get(p, "services"))
            .map(|s| entries(s).iter().map(|(k, _)| k.name.clone()).collect())
            .unwrap_or_default();
        if has_routers && services.is_empty() {
            insert(
                tree,
                &[proto, "services", name, "loadBalancer"],
                loc,
                mk(loc, Value::Map(Vec::new())),
            );
        }
        let services: Vec<String> = get(tree, proto)
            .and_then(|p| get(p, "services"))
            .map(|s| entries(s).iter().map(|(k, _)| k.name.clone()).collect())
            .unwrap_or_default();
        for s in &services {
            server_of(tree, proto, s, name, port);
        }
        if services.len() == 1 {
            let routers: Vec<(String, Loc)> = get(tree, proto)
                .and_then(|p| get(p, "routers"))
                .map(|r| {
                    entries(r)
                        .iter()
                        .filter(|(_, v)| get(v, "service").is_none())
                        .map(|(k, _)| (k.name.clone(), k.loc.clone()))
                        .collect()
                })
                .unwrap_or_default();
            for (r, l) in routers {
                insert(
                    tree,
                    &[proto, "routers", &r, "service"],
                    &l,
                    mk(&l, Value::Str(services[0].clone())),
                );
            }
        }
    }
}

/// `loadbalancer.server.port` / `.scheme` -> `loadBalancer.servers[0].url` (`address` for
/// TCP), the host being the compose service name.
fn server_of(tree: &mut Node, proto: &str, svc: &str, host: &str, default_port: Option<&str>) {
    let Some(lb) = get(tree, proto)
        .and_then(|p| get(p, "services"))
        .and_then(|s| get(s, svc))
        .and_then(|s| get(s, "loadbalancer"))
    else {
        return;
    };
    if get(lb, "servers").is_some() {
        return;
    }
    let server = get_kv(lb, "server");
    let port = server
        .and_then(|(_, s)| text(s, "port"))
        .or_else(|| default_port.map(str::to_string));
    let scheme = server
        .and_then(|(_, s)| text(s, "scheme"))
        .unwrap_or_else(|| "http".into());
    let loc = server.map_or_else(|| lb.loc.clone(), |(k, _)| k.loc.clone());
    let Some(port) = port else {
        return;
    };
    let (key, value) = if proto == "tcp" {
        ("address", format!("{host}:{port}"))
    } else {
        ("url", format!("{scheme}://{host}:{port}"))
    };
    insert(
        tree,
        &[proto, "services", svc, "loadBalancer", "servers[0]", key],
        &loc,
        mk(&loc, Value::Str(value)),
    );
}
