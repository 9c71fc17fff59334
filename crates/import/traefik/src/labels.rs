//! One container's labels as a dynamic configuration, with the docker provider's implicit
//! parts (Traefik's `DynConfBuilder`): the container is skipped unless enabled
//! (`traefik.enable`, else `exposedByDefault`); without services it gets one named after it;
//! each service without servers gets `http://NAME:PORT`; without routers it gets one;
//! routers without a rule get `defaultRule`, without a service the container's only one.

use veloxy_import::tree::{Node, Value};
use veloxy_import::Report;

use crate::compose::{model, string, Container, Settings};
use crate::input::{insert, tree_of, Inputs};
use crate::node::{entries, get, get_kv, mk, text};

/// The container's tree, or `None` when Traefik makes nothing of it.
pub fn container(
    c: &Container,
    s: &Settings,
    port: Option<u16>,
    container_name: &str,
    report: &mut Report,
    inputs: &mut Inputs,
) -> Option<Node> {
    let enable = c
        .labels
        .iter()
        .rev()
        .find(|(k, _, _)| k.eq_ignore_ascii_case("enable"));
    let enabled = enable
        .and_then(|(_, v, _)| v.trim().parse::<bool>().ok())
        .unwrap_or(s.exposed_by_default);
    if !enabled {
        let why = if enable.is_some() {
            "traefik.enable=false: Traefik ignores this container"
        } else {
            "exposedByDefault is false and the container has no traefik.enable=true label: Traefik ignores it"
        };
        for (k, _, l) in &c.labels {
            report.ignored(l, format!("traefik.{k}"), why);
        }
        for (_, l, k, _) in &c.refused_rules {
            report.ignored(l, k.clone(), why);
        }
        return None;
    }
    if let Some((_, _, l)) = enable {
        report.translated(l, "traefik.enable");
    }
    let unlabeled = c
        .labels
        .iter()
        .all(|(k, _, _)| k.eq_ignore_ascii_case("enable"));
    if unlabeled && (c.traefik || (enable.is_none() && port.is_none())) {
        // Traefik's own container, or one whose port only its image knows (noted).
        return None;
    }
    let mut rest = Vec::new();
    let mut v1 = false;
    for (key, v, l) in &c.labels {
        let lower = key.to_ascii_lowercase();
        if lower == "enable" {
            continue;
        }
        if lower.starts_with("docker.") || lower == "tags" {
            report.ignored(
                l,
                format!("traefik.{key}"),
                "veloxy reaches the container by its compose service name",
            );
        } else if crate::v1::is_label(&lower) {
            report.refused(l, format!("traefik.{key}"), crate::v1::WHY);
            v1 = true;
        } else {
            rest.push((key.clone(), v.clone(), l.clone()));
        }
    }
    if v1 && rest.is_empty() {
        return None;
    }
    inputs.refused_rules.extend(c.refused_rules.iter().cloned());
    let mut tree = tree_of(&rest, &c.loc);
    complete(&mut tree, c, s, port, container_name, report, inputs);
    Some(tree)
}

/// The names of `tree.proto.kind`.
fn names(tree: &Node, proto: &str, kind: &str) -> Vec<String> {
    get(tree, proto)
        .and_then(|p| get(p, kind))
        .map(|m| entries(m).iter().map(|(k, _)| k.name.clone()).collect())
        .unwrap_or_default()
}

fn complete(
    tree: &mut Node,
    c: &Container,
    s: &Settings,
    port: Option<u16>,
    container_name: &str,
    report: &mut Report,
    inputs: &mut Inputs,
) {
    let loc = c.loc.clone();
    let tcp =
        !names(tree, "tcp", "routers").is_empty() || !names(tree, "tcp", "services").is_empty();
    if tcp {
        if names(tree, "tcp", "services").is_empty() {
            default_service(tree, "tcp", &c.name, &loc);
        }
        let services = names(tree, "tcp", "services");
        for svc in &services {
            server_of(tree, "tcp", svc, &c.name, port);
        }
        single_service(tree, "tcp", &services, inputs);
        if get(tree, "http").is_none() {
            return;
        }
    }
    let routers = names(tree, "http", "routers");
    let all_named = !routers.is_empty()
        && routers.iter().all(|r| {
            get(tree, "http")
                .and_then(|h| get(h, "routers"))
                .and_then(|m| get(m, r))
                .is_some_and(|n| get(n, "service").is_some())
        });
    // Traefik also makes a service for a container whose routers all name others; unused.
    if names(tree, "http", "services").is_empty() && !all_named {
        default_service(tree, "http", &c.name, &loc);
    }
    let services = names(tree, "http", "services");
    let mut api = Vec::new();
    for svc in &services {
        let p = server_of(tree, "http", svc, &c.name, port);
        if c.traefik && p == Some(s.api_port) {
            api.push(svc.clone());
        }
    }
    if names(tree, "http", "routers").is_empty() && services.len() <= 1 {
        let empty = mk(&loc, Value::Map(Vec::new()));
        insert(tree, &["http", "routers", &c.name], &loc, empty);
    }
    for r in names(tree, "http", "routers") {
        let router = get(tree, "http")
            .and_then(|h| get(h, "routers"))
            .and_then(|m| get_kv(m, &r))
            .map(|(k, v)| (k.loc.clone(), v.clone()));
        let Some((rloc, rnode)) = router else {
            continue;
        };
        if text(&rnode, "rule").is_none() && !c.refused_rules.iter().any(|x| x.0 == r) {
            let name = crate::dotenv::normalize(&format!("{}_{}", c.name, c.project.0));
            match crate::dotenv::eval_rule(&s.default_rule, &model(c, &name, container_name)) {
                Ok(rule) if !rule.is_empty() => {
                    if s.default_rule.contains(".Name") && !c.project.1 {
                        inputs.router_notes.push((r.clone(), format!(
                            "its rule is Traefik's defaultRule, {rule}: .Name is SERVICE_PROJECT normalized, the project {} being the directory's name (docker compose -p or COMPOSE_PROJECT_NAME change it)",
                            c.project.0
                        )));
                    }
                    insert(
                        tree,
                        &["http", "routers", &r, "rule"],
                        &rloc,
                        string(&rloc, &rule),
                    );
                }
                Ok(_) => inputs.router_refusals.push((
                    r.clone(),
                    "defaultRule gives an empty rule: Traefik drops the router".into(),
                )),
                Err(why) => inputs.router_refusals.push((r.clone(), why)),
            }
        }
        let service = text(&rnode, "service");
        if service.is_none() && services.len() == 1 {
            insert(
                tree,
                &["http", "routers", &r, "service"],
                &rloc,
                string(&rloc, &services[0]),
            );
        } else if service.is_none() {
            inputs.router_refusals.push((
                r.clone(),
                "no service, and the container defines several: Traefik drops the router".into(),
            ));
        }
        let service = service.or_else(|| (services.len() == 1).then(|| services[0].clone()));
        if service.is_some_and(|sv| api.contains(&sv)) {
            insert(
                tree,
                &["http", "routers", &r, "service"],
                &rloc,
                string(&rloc, "api@internal"),
            );
        }
    }
    for svc in api {
        remove_service(tree, &svc, s.api_port, report);
    }
}

/// Routers without a service get the only one.
fn single_service(tree: &mut Node, proto: &str, services: &[String], inputs: &mut Inputs) {
    for r in names(tree, proto, "routers") {
        let has = get(tree, proto)
            .and_then(|h| get(h, "routers"))
            .and_then(|m| get(m, &r))
            .is_some_and(|n| get(n, "service").is_some());
        if has {
            continue;
        }
        if services.len() == 1 {
            let loc = tree.loc.clone();
            insert(
                tree,
                &[proto, "routers", &r, "service"],
                &loc,
                string(&loc, &services[0]),
            );
        } else {
            inputs.router_refusals.push((
                r,
                "no service, and the container defines several: Traefik drops the router".into(),
            ));
        }
    }
}

/// A service of the Traefik container on its API port: its routers are routers to
/// `api@internal`.
fn remove_service(tree: &mut Node, svc: &str, port: u16, report: &mut Report) {
    let Some(Value::Map(m)) = get(tree, "http")
        .and_then(|h| get(h, "services"))
        .map(|n| n.value.clone())
    else {
        return;
    };
    let Some((k, _)) = m.iter().find(|(k, _)| k.name == svc) else {
        return;
    };
    report.ignored(
        &k.loc,
        format!("http.services.{svc}"),
        format!("the Traefik container's own port {port} (its API and dashboard): its routers are taken as routers to api@internal"),
    );
    let rest: Vec<_> = m.into_iter().filter(|(k, _)| k.name != svc).collect();
    let loc = tree.loc.clone();
    insert(
        tree,
        &["http", "services"],
        &loc,
        mk(&loc, Value::Map(rest)),
    );
}

/// `loadbalancer.server.port` / `.scheme` -> `loadBalancer.servers[0].url` (`address` for
/// TCP), the host being the compose service name; the port used.
fn server_of(
    tree: &mut Node,
    proto: &str,
    svc: &str,
    host: &str,
    default_port: Option<u16>,
) -> Option<u16> {
    let lb = get(tree, proto)
        .and_then(|p| get(p, "services"))
        .and_then(|s| get(s, svc))
        .and_then(|s| get(s, "loadbalancer"))?;
    if get(lb, "servers").is_some() {
        return None;
    }
    let server = get_kv(lb, "server");
    let port = server
        .and_then(|(_, s)| text(s, "port"))
        .and_then(|p| p.trim().parse::<u16>().ok())
        .or(default_port);
    let scheme = server
        .and_then(|(_, s)| text(s, "scheme"))
        .unwrap_or_else(|| "http".into());
    let loc = server.map_or_else(|| lb.loc.clone(), |(k, _)| k.loc.clone());
    let port = port?;
    let (key, value) = if proto == "tcp" {
        ("address", format!("{host}:{port}"))
    } else {
        ("url", format!("{scheme}://{host}:{port}"))
    };
    insert(
        tree,
        &[proto, "services", svc, "loadBalancer", "servers[0]", key],
        &loc,
        string(&loc, &value),
    );
    Some(port)
}

/// The service Traefik makes for a container whose labels name none: `PROTO.services.NAME`
/// with an empty load balancer, its server filled from the container afterwards.
fn default_service(tree: &mut Node, proto: &str, name: &str, loc: &veloxy_import::Loc) {
    let empty = mk(loc, Value::Map(Vec::new()));
    insert(tree, &[proto, "services", name, "loadBalancer"], loc, empty);
}
