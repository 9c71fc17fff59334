//! HTTP routers: the rule becomes route matches, the entry points listeners, the middlewares
//! route rules (in the router's order), the service an upstream group.

use veloxy_import::tree::Node;
use veloxy_import::Loc;

use crate::input::{strip_provider, Named};
use crate::matcher::{self, Branch};
use crate::node::{get, get_kv, int, list_at, text};
use crate::ops::Internal;
use crate::route::{Action, Route};
use crate::rule;
use crate::translate::Ctx;

/// A router read, before its middlewares run.
struct Plan {
    named: Named,
    key: String,
    branches: Vec<Branch>,
    priority: i64,
    /// Entry point names.
    eps: Vec<String>,
    /// The router's TLS config (its own, or its entry point's default), its place and the
    /// key of its report line.
    tls: Option<(Node, Loc, String)>,
}

/// Translates every HTTP router.
pub fn all(ctx: &mut Ctx) {
    let routers = ctx.inp.routers.clone();
    let mut plans = Vec::new();
    for r in &routers {
        if let Some(p) = plan(ctx, r) {
            plans.push(p);
        }
    }
    // Which entry points serve TLS: those with TLS routers or a TLS default.
    for p in &plans {
        if p.tls.is_some() {
            for e in ctx.eps.iter_mut().filter(|e| p.eps.contains(&e.name)) {
                e.tls = true;
            }
        }
    }
    for e in ctx.eps.iter_mut() {
        if e.default_tls.is_some() {
            e.tls = true;
        }
    }
    for p in plans {
        build(ctx, p);
    }
}

fn plan(ctx: &mut Ctx, r: &Named) -> Option<Plan> {
    let key = format!("http.routers.{}", r.name);
    let n = &r.node;
    for (_, note) in ctx.inp.router_notes.iter().filter(|(x, _)| *x == r.name) {
        ctx.lines.at(&key, &r.loc, &key).note(note.clone());
    }
    if let Some((_, why)) = ctx.inp.router_refusals.iter().find(|(x, _)| *x == r.name) {
        ctx.lines.at(&key, &r.loc, &key).refuse(why.clone());
        return None;
    }
    // Routers to the dashboard, ping or metrics get no route (nor listeners, nor TLS).
    if let Some(s) = text(n, "service").filter(|s| s.ends_with("@internal")) {
        if let Internal::Dropped(note) = crate::ops::internal_service(ctx, &s) {
            ctx.lines.at(&key, &r.loc, &key).note(note);
            let (mine, rest) = std::mem::take(&mut ctx.inp.refused_rules)
                .into_iter()
                .partition(|x| x.0 == r.name);
            ctx.inp.refused_rules = rest;
            for (_, l, label, why) in mine {
                ctx.rep.ignored(
                    &l,
                    label,
                    format!("the router gets no route, so its rule does not matter ({why})"),
                );
            }
            for (m, _) in list_at(n, "middlewares") {
                ctx.skipped
                    .push((strip_provider(&m).to_string(), r.name.clone()));
            }
            return None;
        }
    }
    let Some(rule_text) = text(n, "rule") else {
        ctx.lines
            .at(&key, &r.loc, &key)
            .refuse("no rule (its rule label was refused, or this is not a container's router)");
        return None;
    };
    let branches = match branches(&rule_text) {
        Ok(b) => b,
        Err(why) => {
            ctx.lines.at(&key, &r.loc, &key).refuse(why);
            return None;
        }
    };
    if branches.is_empty() {
        ctx.lines.at(&key, &r.loc, &key).ignored = Some("its rule can never match".into());
        return None;
    }
    let priority = int(n, "priority")
        .filter(|p| *p > 0)
        .unwrap_or(rule_text.len() as i64);
    let mut eps: Vec<String> = list_at(n, "entryPoints")
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    if eps.is_empty() {
        eps = crate::entry::defaults(&ctx.eps);
    }
    if eps.is_empty() {
        eps.push("http".into());
    }
    for e in &eps {
        if !ctx.eps.iter().any(|x| &x.name == e) {
            match crate::entry::guess(&mut ctx.cfg, e, &r.loc) {
                Some(ep) => {
                    let note = format!("entry point {e} is not defined here: taken as {}", ep.addr);
                    ctx.lines.at(&key, &r.loc, &key).note(note);
                    ctx.eps.push(ep);
                }
                None => {
                    ctx.lines
                        .at(&key, &r.loc, &key)
                        .refuse(format!("entry point {e} is not defined"));
                    return None;
                }
            }
        }
    }
    let own_tls = get_kv(n, "tls")
        .filter(|(_, v)| v.as_bool() != Some(false))
        .map(|(k, v)| (v.clone(), k.loc.clone(), format!("{key}.tls")));
    let tls = own_tls.or_else(|| {
        ctx.eps
            .iter()
            .filter(|e| eps.contains(&e.name))
            .find_map(|e| {
                let (t, l) = e.default_tls.clone()?;
                Some((t, l, format!("entryPoints.{}.http.tls", e.name)))
            })
    });
    Some(Plan {
        named: r.clone(),
        key,
        branches,
        priority,
        eps,
        tls,
    })
}

/// The rule's branches, merged; `Err` says why veloxy cannot express it.
pub fn branches(rule_text: &str) -> Result<Vec<Branch>, String> {
    let e = rule::parse(rule_text)
        .map_err(|e| format!("the rule does not parse {e} (Traefik disables the router too)"))?;
    let conj = rule::dnf(&e)?;
    let mut out = Vec::new();
    for c in conj {
        if let Some(b) = matcher::branch(&c)? {
            out.push(b);
        }
    }
    Ok(matcher::merge(out))
}

fn build(ctx: &mut Ctx, p: Plan) {
    let n = &p.named.node;
    let key = p.key.clone();
    let loc = p.named.loc.clone();
    // The listeners: the entry points that do not redirect everything elsewhere, and whose
    // TLS matches the router's (a TLS router on a TLS entry point...).
    let mut listeners = Vec::new();
    for e in ctx.eps.iter().filter(|e| p.eps.contains(&e.name)) {
        if e.redirect.is_some() && p.tls.is_none() {
            continue;
        }
        if e.tls && p.tls.is_none() {
            ctx.plain_on_tls
                .push((key.clone(), loc.clone(), e.listener.clone(), e.name.clone()));
        }
        listeners.push(e.listener.clone());
    }
    if listeners.is_empty() {
        ctx.lines.at(&key, &loc, &key).ignored =
            Some("its entry points redirect every request to HTTPS, and it has no tls".into());
        return;
    }
    let mut mws: Vec<(String, Loc)> = Vec::new();
    for e in ctx.eps.iter().filter(|e| p.eps.contains(&e.name)) {
        mws.extend(e.middlewares.iter().cloned());
    }
    mws.extend(list_at(n, "middlewares"));
    let service = text(n, "service").ok_or_else(|| "no service".to_string());
    let service = match service {
        Ok(s) if s.ends_with("@internal") => match crate::ops::internal_service(ctx, &s) {
            Internal::Answer(a) => Ok(a),
            Internal::Dropped(note) => {
                ctx.lines.at(&key, &loc, &key).note(note);
                Err(None)
            }
            Internal::Unknown => Err(Some(format!("service {s}: Traefik's internal service"))),
        },
        Ok(s) => crate::service::upstream(ctx, &s)
            .map(Action::Upstream)
            .map_err(|why| Some(format!("service {s}: {why}"))),
        Err(why) => Err(Some(why)),
    };
    let action = match service {
        Ok(a) => a,
        Err(why) => {
            if let Some(why) = why {
                ctx.lines.at(&key, &loc, &key).refuse(why);
            }
            for (m, _) in &mws {
                ctx.skipped
                    .push((strip_provider(m).to_string(), p.named.name.clone()));
            }
            return;
        }
    };
    if let Some((tls, tls_loc, lkey)) = &p.tls {
        crate::tls::router_tls(ctx, lkey, tls, tls_loc, &p.branches, &listeners);
    }
    for b in &p.branches {
        for note in &b.notes {
            ctx.lines.at(&key, &loc, &key).note(note.clone());
        }
    }
    let mut routes: Vec<Route> = p
        .branches
        .iter()
        .map(|b| Route {
            router: p.named.name.clone(),
            loc: loc.clone(),
            priority: p.priority,
            listeners: listeners.clone(),
            m: b.clone(),
            path_op: None,
            req_set: Default::default(),
            req_remove: Vec::new(),
            resp_set: Default::default(),
            resp_remove: Vec::new(),
            keys: Vec::new(),
            action: action.clone(),
        })
        .collect();
    carve_negations(ctx, &key, &loc, &mut routes);
    let mut seen = Vec::new();
    for (name, at) in mws {
        let name = strip_provider(&name).to_string();
        routes = crate::middleware::apply(ctx, &name, &at, &key, routes, &mut seen);
    }
    if get(n, "observability").is_some() {
        ctx.lines
            .at(&key, &loc, &key)
            .note("observability: logs, metrics and tracing are not translated");
    }
    ctx.lines.at(&key, &loc, &key);
    ctx.routes.extend(routes);
}

/// `!PathPrefix(`/admin`)`: the excluded paths answer 404 on the branch's hosts (as Traefik
/// does when no other router takes them), unless another router's route takes them.
fn carve_negations(ctx: &mut Ctx, key: &str, loc: &Loc, routes: &mut Vec<Route>) {
    let mut extra = Vec::new();
    for r in routes.iter_mut() {
        for (kind, path) in std::mem::take(&mut r.m.not_paths) {
            let mut c = r.clone();
            c.m = Branch {
                hosts: r.m.hosts.clone(),
                kind: Some(kind),
                paths: vec![path.clone()],
                ..Default::default()
            };
            c.action = Action::Respond(404, "404 page not found".into());
            extra.push(c);
            ctx.lines.at(key, loc, key).note(format!(
                "the excluded path {path} answers 404 from this route unless another router's route is more specific"
            ));
        }
    }
    routes.extend(extra);
}

/// After the TLS listeners are made: plain-HTTP routers on a listener that serves TLS.
pub fn plain_on_tls(ctx: &mut Ctx) {
    for (key, loc, listener, ep) in std::mem::take(&mut ctx.plain_on_tls) {
        let tls = ctx
            .cfg
            .listeners
            .iter()
            .any(|(n, s)| *n == listener && s.get("tls").is_some());
        if tls {
            ctx.lines.at(&key, &loc, &key).note(format!(
                "a plain-HTTP router on entry point {ep}, which serves TLS here for other routers"
            ));
        }
    }
}
