//! Route sections from cases: conditions, target and rules as veloxy keys, header operations
//! folded into `{ set, add, remove }`, neighbours that differ in one key merged into a list.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Config, Section};

use crate::cases::{Case, HdrOp, Target};
use crate::matcher::{Match, PathPat};
use crate::Ctx;

/// One route section.
pub(crate) fn route(
    cx: &mut Ctx,
    m: &Match,
    c: &Case,
    listeners: &[&str],
) -> Result<Section, String> {
    let mut s = Section::default();
    for l in &c.from {
        s.add_from(l);
    }
    let list: Vec<Value> = listeners.iter().map(|l| Value::from(*l)).collect();
    s.set("listener", Value::Array(list));
    if let Some(h) = &m.host {
        s.set("host", h.value());
    }
    match &m.path {
        Some(PathPat::Prefix(p)) => {
            s.set("path", p.clone());
        }
        Some(PathPat::Exact(p)) => {
            s.set("path_exact", p.clone());
        }
        Some(PathPat::Regex(r)) => {
            s.set("path_regex", r.clone());
        }
        None => {}
    }
    if let Some(ms) = &m.methods {
        s.set(
            "methods",
            Value::Array(ms.iter().map(|x| Value::from(x.as_str())).collect()),
        );
    }
    if !m.headers.is_empty() {
        s.set("headers", table(&m.headers));
    }
    if !m.query.is_empty() {
        s.set("query", table(&m.query));
    }
    let r = &c.rules;
    if let Some(a) = &r.allow {
        s.set(
            "allow",
            Value::Array(a.iter().map(|x| Value::from(x.as_str())).collect()),
        );
    }
    if !r.deny.is_empty() {
        s.set(
            "deny",
            Value::Array(r.deny.iter().map(|x| Value::from(x.as_str())).collect()),
        );
    }
    if let Some(l) = &r.rate {
        let mut t = toml::Table::new();
        t.insert("rate".into(), l.rate.clone().into());
        t.insert("burst".into(), (l.burst as i64).into());
        t.insert("key".into(), l.key.clone().into());
        if let Some(k) = l.max_keys {
            t.insert("max_keys".into(), (k as i64).into());
        }
        s.set("rate_limit", Value::Table(t));
    }
    if let Some((realm, file)) = &r.auth {
        let mut t = toml::Table::new();
        t.insert("realm".into(), realm.clone().into());
        t.insert("users_file".into(), file.clone().into());
        s.set("basic_auth", Value::Table(t));
    }
    match &c.target {
        Target::Backend(u) => {
            s.set("upstream", u.clone());
            if let Some(rw) = &r.rewrite {
                if rw.contains("{re.") && !matches!(m.path, Some(PathPat::Regex(_))) {
                    return Err("a regex rewrite on a route whose path is not that regex".into());
                }
                s.set("rewrite", rw.clone());
            }
            if let Some(h) = headers(&r.req)? {
                s.set("request_headers", h);
            }
            if let Some(h) = headers(&r.resp)? {
                s.set("response_headers", h);
            }
            if let Some(v) = r.cache.first().and_then(|n| crate::cache::route_key(cx, n)) {
                s.set("cache", v);
            }
        }
        Target::Redirect { to, status } => {
            let mut t = toml::Table::new();
            t.insert("to".into(), to.clone().into());
            t.insert("status".into(), i64::from(*status).into());
            s.set("redirect", Value::Table(t));
            if let Some(h) = headers(&r.resp)? {
                s.set("response_headers", h);
            }
        }
        Target::Respond {
            status,
            body,
            ctype,
        } => {
            let mut t = toml::Table::new();
            t.insert("status".into(), i64::from(*status).into());
            if !body.is_empty() {
                t.insert("body".into(), body.clone().into());
            }
            if !ctype.is_empty() {
                t.insert("content_type".into(), ctype.clone().into());
            }
            s.set("respond", Value::Table(t));
            let mut ops = Vec::new();
            if crate::rules::haproxy_body(*status).is_some_and(|b| b == body) {
                ops.push(HdrOp::Set("Cache-Control".into(), "no-cache".into()));
            }
            ops.extend(r.resp.iter().cloned());
            if let Some(h) = headers(&ops)? {
                s.set("response_headers", h);
            }
        }
    }
    Ok(s)
}

fn table(m: &BTreeMap<String, String>) -> Value {
    Value::Table(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect(),
    )
}

/// HAProxy's header operations, in order, as veloxy's `{ set, add, remove }`.
fn headers(ops: &[HdrOp]) -> Result<Option<Value>, String> {
    if ops.is_empty() {
        return Ok(None);
    }
    // Per name (case-insensitive): the final state.
    enum St {
        Set(String, String),
        Add(String, String),
        Del(String),
    }
    let mut state: Vec<(String, St)> = Vec::new();
    for op in ops {
        let (name, new) = match op {
            HdrOp::Set(n, v) => (n, St::Set(n.clone(), v.clone())),
            HdrOp::Add(n, v) => (n, St::Add(n.clone(), v.clone())),
            HdrOp::Del(n) => (n, St::Del(n.clone())),
        };
        let key = name.to_ascii_lowercase();
        let pos = state.iter().position(|(k, _)| *k == key);
        let merged = match (pos.map(|i| &state[i].1), new) {
            (Some(St::Del(_)), St::Add(n, v)) => St::Set(n, v),
            (Some(St::Set(..) | St::Add(..)), St::Add(n, _)) => {
                return Err(format!(
                    "{n} set or added twice: veloxy adds one value per field"
                ))
            }
            (_, x) => x,
        };
        match pos {
            Some(i) => state[i].1 = merged,
            None => state.push((key, merged)),
        }
    }
    let (mut set, mut add, mut remove) = (toml::Table::new(), toml::Table::new(), Vec::new());
    for (_, st) in state {
        match st {
            St::Set(n, v) => {
                set.insert(n, v.into());
            }
            St::Add(n, v) => {
                add.insert(n, v.into());
            }
            St::Del(n) => remove.push(Value::from(n)),
        }
    }
    let mut t = toml::Table::new();
    if !set.is_empty() {
        t.insert("set".into(), Value::Table(set));
    }
    if !add.is_empty() {
        t.insert("add".into(), Value::Table(add));
    }
    if !remove.is_empty() {
        t.insert("remove".into(), Value::Array(remove));
    }
    Ok(Some(Value::Table(t)))
}

/// Adjacent routes that differ only in `host` (or only in a prefix `path`) become one route
/// listing them.
pub(crate) fn merge(routes: Vec<Section>) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for r in routes {
        if let Some(last) = out.last_mut() {
            if let Some(k) = differs_only_in(last, &r) {
                let add = r.get(k).cloned().expect("present");
                let v = last.get_mut(k).expect("present");
                match v {
                    Value::Array(a) => a.push(add),
                    other => *other = Value::Array(vec![other.clone(), add]),
                }
                for l in &r.from {
                    last.add_from(l);
                }
                continue;
            }
        }
        out.push(r);
    }
    out
}

fn differs_only_in<'k>(a: &Section, b: &Section) -> Option<&'k str> {
    for k in ["host", "path"] {
        let (Some(va), Some(vb)) = (a.get(k), b.get(k)) else {
            continue;
        };
        if va == vb {
            continue;
        }
        let strip = |s: &Section| -> Vec<(String, Value)> {
            s.keys.iter().filter(|(x, _)| x != k).cloned().collect()
        };
        if strip(a) == strip(b) && a.keys.len() == b.keys.len() {
            return Some(k);
        }
    }
    None
}

/// Whether `a` is the same listener set as every HTTP listener of the config (then routes
/// need not name it).
pub fn simplify_listeners(cfg: &mut Config) {
    let http: Vec<String> = cfg
        .listeners
        .iter()
        .filter(|(_, s)| s.get("protocol").is_none())
        .map(|(n, _)| n.clone())
        .collect();
    for r in &mut cfg.routes {
        let Some(Value::Array(a)) = r.get("listener").cloned() else {
            continue;
        };
        let names: Vec<String> = a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        if names.len() == http.len() && http.iter().all(|h| names.contains(h)) {
            r.remove("listener");
        } else if names.len() == 1 {
            r.set("listener", names[0].clone());
        }
    }
}
