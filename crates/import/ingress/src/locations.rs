//! The locations of the imported Ingresses: each rule's host (a DNS name, else refused) and
//! paths, with their path types and backends, as ingress-nginx reads them.

use veloxy_import::tree::Node;

use crate::groups::Backend;
use crate::routes::{Kind, Location, Target};
use crate::util;
use crate::{Ctx, IngInfo};

/// A host's server: the first Ingress that names it gives its default location.
pub struct Server {
    /// The host ("" = any).
    pub host: String,
    /// The index of the first Ingress naming it.
    pub first: usize,
}

/// Every location of the imported, non-canary Ingresses, and the hosts in order.
pub fn collect(ctx: &mut Ctx, ings: &[IngInfo]) -> (Vec<Location>, Vec<Server>, bool) {
    let mut locs: Vec<Location> = Vec::new();
    let mut servers: Vec<Server> = Vec::new();
    let mut catch_all = false;
    for (i, info) in ings.iter().enumerate() {
        if !info.imported || info.ann.canary.is_some() {
            continue;
        }
        let ing = info.obj;
        let rules = ing.spec("rules").and_then(Node::as_seq).unwrap_or(&[]);
        if let Some(db) = ing.spec("defaultBackend") {
            let what = "spec.defaultBackend";
            match Backend::read(db, &ing.ns) {
                Err(e) => ctx.report.refused(&db.loc, what, e),
                Ok(b) if rules.is_empty() => {
                    if locs.iter().any(|l| l.host.is_empty() && l.path == "/") || catch_all {
                        ctx.report.ignored(&db.loc, what, "another Ingress already set the catch-all backend (ingress-nginx keeps the first)");
                    } else {
                        catch_all = true;
                        locs.push(Location {
                            host: String::new(),
                            path: "/".into(),
                            kind: Kind::Prefix,
                            ing: i,
                            target: Target::Service(b),
                            loc: db.loc.clone(),
                            directive: Some(what.into()),
                            canary: Vec::new(),
                        });
                    }
                }
                Ok(_) => ctx.report.translated(&db.loc, what),
            }
        }
        for rule in rules {
            let host = rule.get("host").and_then(Node::scalar).unwrap_or_default();
            if !host.is_empty() && !util::dns_name(&host) {
                bad_host(ctx, rule, &host);
                continue;
            }
            if !servers.iter().any(|s| s.host == host) {
                servers.push(Server {
                    host: host.clone(),
                    first: i,
                });
            }
            let paths = rule_paths(rule);
            if paths.is_empty() {
                let shown = if host.is_empty() { "*" } else { &host };
                ctx.report.ignored(
                    &rule.loc,
                    format!("rule {shown}"),
                    "a rule without paths: ingress-nginx answers its requests from the default \
                     backend (404), as veloxy answers a request no route takes",
                );
            }
            for p in paths {
                path_item(ctx, ing.ns.as_str(), i, &host, p, &mut locs);
            }
        }
    }
    (locs, servers, catch_all)
}

/// An Ingress rule's `http.paths` (none when absent).
fn rule_paths(rule: &Node) -> &[Node] {
    rule.get("http")
        .and_then(|h| h.get("paths"))
        .and_then(Node::as_seq)
        .unwrap_or(&[])
}

/// A rule whose host is not a DNS name (a docs placeholder such as `<your domain>`, a name
/// with `_`): Kubernetes would not accept it and the output must not carry it, so each of
/// its paths is refused naming the host.
fn bad_host(ctx: &mut Ctx, rule: &Node, host: &str) {
    let why = format!(
        "{}: the rule is left out; write the real host name and import again",
        util::not_dns(host)
    );
    let paths = rule_paths(rule);
    if paths.is_empty() {
        return ctx.report.refused(&rule.loc, format!("rule {host}"), why);
    }
    for p in paths {
        let path = p
            .get("path")
            .and_then(Node::scalar)
            .unwrap_or_else(|| "/".into());
        let directive = format!("path {host}{path} ({})", kind_of(p).1);
        ctx.report.refused(&p.loc, directive, why.clone());
    }
}

pub fn kind_of(p: &Node) -> (Kind, &'static str) {
    match p.get("pathType").and_then(Node::scalar).as_deref() {
        Some("Exact") => (Kind::Exact, "Exact"),
        Some("Prefix") => (Kind::Prefix, "Prefix"),
        _ => (Kind::Impl, "ImplementationSpecific"),
    }
}

fn path_item(ctx: &mut Ctx, ns: &str, i: usize, host: &str, p: &Node, locs: &mut Vec<Location>) {
    let path = p
        .get("path")
        .and_then(Node::scalar)
        .unwrap_or_else(|| "/".into());
    let (kind, kname) = kind_of(p);
    let shown = if host.is_empty() {
        "*".to_string()
    } else {
        host.to_string()
    };
    let directive = format!("path {shown}{path} ({kname})");
    let backend = match p.get("backend").map(|b| Backend::read(b, ns)) {
        Some(Ok(b)) => b,
        Some(Err(e)) => return ctx.report.refused(&p.loc, directive, e),
        None => return ctx.report.refused(&p.loc, directive, "no backend"),
    };
    if let Some(other) = locs
        .iter()
        .find(|l| l.host == host && l.path == path && l.kind == kind && l.directive.is_some())
    {
        let why = format!("the same host and path as an earlier location (from line {}); ingress-nginx keeps the first", other.loc.line);
        return ctx.report.ignored(&p.loc, directive, why);
    }
    locs.push(Location {
        host: host.to_string(),
        path,
        kind,
        ing: i,
        target: Target::Service(backend),
        loc: p.loc.clone(),
        directive: Some(directive),
        canary: Vec::new(),
    });
}
