//! Route order. Traefik tries routers by priority (by default the rule's length, longest
//! first); veloxy picks nginx-like: the most specific host, then an exact path, then the
//! first matching regex, then the longest prefix, then more conditions, then file order.
//! Where two routers' routes can match one request and the two orders pick differently,
//! the difference is named on the router Traefik would have picked.

use crate::matcher::PathKind;
use crate::route::{Action, Route};
use crate::translate::Ctx;

/// Drops redundant 404 carve-outs, then compares the two orders.
pub fn check(ctx: &mut Ctx) {
    dedupe_carves(&mut ctx.routes);
    let routes = &ctx.routes;
    let mut notes: Vec<(String, String)> = Vec::new();
    for (i, a) in routes.iter().enumerate() {
        for (j, b) in routes.iter().enumerate().skip(i + 1) {
            if a.router == b.router || a.priority == b.priority || !overlap(a, b) {
                continue;
            }
            let veloxy_a = rank(a, i) > rank(b, j);
            let traefik_a = a.priority > b.priority;
            if veloxy_a != traefik_a {
                let (win, lose) = if traefik_a { (a, b) } else { (b, a) };
                notes.push((
                    win.router.clone(),
                    format!(
                        "requests matching both this router (priority {}) and router {} (priority {}) go to {} in veloxy, whose order is by host, then exact path, regex, longest prefix",
                        win.priority, lose.router, lose.priority, lose.router
                    ),
                ));
            }
        }
    }
    for (router, note) in notes {
        let key = format!("http.routers.{router}");
        if let Some(r) = ctx.routes.iter().find(|r| r.router == router) {
            let loc = r.loc.clone();
            ctx.lines.at(&key, &loc, &key).note(note);
        }
    }
}

fn is_carve(r: &Route) -> bool {
    matches!(&r.action, Action::Respond(404, b) if b == "404 page not found")
}

fn dedupe_carves(routes: &mut Vec<Route>) {
    let keep: Vec<bool> = routes
        .iter()
        .map(|r| {
            !is_carve(r)
                || !routes.iter().any(|o| {
                    !is_carve(o)
                        && o.m.kind == r.m.kind
                        && o.m.paths == r.m.paths
                        && (o.m.hosts == r.m.hosts || r.m.hosts.is_empty())
                })
        })
        .collect();
    let mut it = keep.into_iter();
    routes.retain(|_| it.next().unwrap_or(true));
}

/// veloxy's precedence as a sortable key (higher wins).
fn rank(r: &Route, index: usize) -> (u8, u8, usize, usize, std::cmp::Reverse<usize>) {
    let host = if r.m.hosts.is_empty() {
        0
    } else if r.m.hosts.iter().all(|h| h.starts_with("*.")) {
        1
    } else {
        2
    };
    let (kind, len) = match r.m.kind {
        Some(PathKind::Exact) => (3, 0),
        Some(PathKind::Regex) => (2, 0),
        Some(PathKind::Prefix) => (1, r.m.paths.iter().map(String::len).min().unwrap_or(1)),
        None => (1, 1),
    };
    let conds = r.m.methods.len().min(1) + r.m.headers.len() + r.m.query.len();
    (host, kind, len, conds, std::cmp::Reverse(index))
}

fn hosts_overlap(a: &[String], b: &[String]) -> bool {
    if a.is_empty() || b.is_empty() {
        return true;
    }
    a.iter().any(|x| {
        b.iter().any(|y| {
            x == y
                || x.strip_prefix('*').is_some_and(|s| y.ends_with(s))
                || y.strip_prefix('*').is_some_and(|s| x.ends_with(s))
        })
    })
}

/// The literal text an anchored regex starts with (`^/legacy/(.*)` -> `/legacy/`).
fn regex_prefix(re: &str) -> String {
    let Some(body) = re.strip_prefix('^') else {
        return String::new();
    };
    let mut out = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) if !e.is_ascii_alphanumeric() => out.push(e),
                _ => break,
            },
            '.' | '+' | '*' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '^' | '$' => {
                // A quantifier makes the previous character optional.
                if matches!(c, '*' | '?' | '{') {
                    out.pop();
                }
                break;
            }
            c => out.push(c),
        }
    }
    out
}

/// Paths as prefixes (regexes by their literal start) with their kind.
fn prefixes(r: &Route) -> Vec<(bool, String)> {
    match r.m.kind {
        None => vec![(false, "/".to_string())],
        Some(PathKind::Regex) => r.m.paths.iter().map(|p| (false, regex_prefix(p))).collect(),
        Some(PathKind::Exact) => r.m.paths.iter().map(|p| (true, p.clone())).collect(),
        Some(PathKind::Prefix) => r.m.paths.iter().map(|p| (false, p.clone())).collect(),
    }
}

fn paths_overlap(a: &Route, b: &Route) -> bool {
    prefixes(a).iter().any(|(ea, x)| {
        prefixes(b).iter().any(|(eb, y)| match (ea, eb) {
            (true, true) => x == y,
            (true, false) => x.starts_with(y.as_str()),
            (false, true) => y.starts_with(x.as_str()),
            _ => x.starts_with(y.as_str()) || y.starts_with(x.as_str()),
        })
    })
}

fn overlap(a: &Route, b: &Route) -> bool {
    if !a.listeners.iter().any(|l| b.listeners.contains(l)) {
        return false;
    }
    if !a.m.methods.is_empty()
        && !b.m.methods.is_empty()
        && !a.m.methods.iter().any(|m| b.m.methods.contains(m))
    {
        return false;
    }
    for (k, v) in &a.m.headers {
        if b.m.headers.get(k).is_some_and(|w| w != v) {
            return false;
        }
    }
    for (k, v) in &a.m.query {
        if b.m.query.get(k).is_some_and(|w| w != v) {
            return false;
        }
    }
    hosts_overlap(&a.m.hosts, &b.m.hosts) && paths_overlap(a, b)
}
