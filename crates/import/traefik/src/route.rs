//! A veloxy route being built from one branch of a Traefik router, and how it is written.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Loc, Section};

use crate::matcher::{Branch, PathKind};

/// What answers a route.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Proxy to this upstream group.
    Upstream(String),
    /// `redirect = { to, status }`.
    Redirect(String, u16),
    /// `respond = { status, body }`.
    Respond(u16, String),
    /// Nothing yet (a router whose service was refused): the route is not written.
    Nothing,
}

/// How the request path is changed upstream.
#[derive(Debug, Clone, PartialEq)]
pub enum PathOp {
    /// `strip_prefix = true` (the route's path, a prefix, is the one stripped).
    Strip,
    /// `rewrite = "..."`.
    Rewrite(String),
}

/// One route in the making.
#[derive(Debug, Clone)]
pub struct Route {
    /// The router it comes from.
    pub router: String,
    /// The router's place.
    pub loc: Loc,
    /// The router's priority (explicit, or its rule's length).
    pub priority: i64,
    /// Listener names.
    pub listeners: Vec<String>,
    /// The match.
    pub m: Branch,
    /// The path change.
    pub path_op: Option<PathOp>,
    /// Request header fields set (in order) and removed.
    pub req_set: BTreeMap<String, String>,
    /// Request fields removed.
    pub req_remove: Vec<String>,
    /// Response header fields set.
    pub resp_set: BTreeMap<String, String>,
    /// Response fields removed.
    pub resp_remove: Vec<String>,
    /// Other route keys (`basic_auth`, `cors`, `rate_limit`...), last one wins.
    pub keys: Vec<(String, Value)>,
    /// What answers.
    pub action: Action,
}

impl Route {
    /// Sets a route key.
    pub fn set(&mut self, k: &str, v: impl Into<Value>) {
        let v = v.into();
        match self.keys.iter_mut().find(|(x, _)| x == k) {
            Some((_, old)) => *old = v,
            None => self.keys.push((k.to_string(), v)),
        }
    }

    /// A route key's value.
    pub fn key(&self, k: &str) -> Option<&Value> {
        self.keys.iter().find(|(x, _)| x == k).map(|(_, v)| v)
    }

    /// Sets a request field (replacing a removal of it).
    pub fn req(&mut self, name: &str, value: &str) {
        self.req_remove.retain(|r| !r.eq_ignore_ascii_case(name));
        self.req_set.retain(|k, _| !k.eq_ignore_ascii_case(name));
        if value.is_empty() {
            self.req_remove.push(name.to_string());
        } else {
            self.req_set.insert(name.to_string(), value.to_string());
        }
    }

    /// Sets a response field ("" removes it).
    pub fn resp(&mut self, name: &str, value: &str) {
        self.resp_remove.retain(|r| !r.eq_ignore_ascii_case(name));
        self.resp_set.retain(|k, _| !k.eq_ignore_ascii_case(name));
        if value.is_empty() {
            self.resp_remove.push(name.to_string());
        } else {
            self.resp_set.insert(name.to_string(), value.to_string());
        }
    }

    /// The route as a `[[routes]]` section. `all_listeners`: the listener key is left out
    /// when the route is on every HTTP listener. `base_req`: the request fields every route
    /// sets (Traefik's forwarded headers), merged under the route's own.
    pub fn section(
        &self,
        all_listeners: &[String],
        base: Option<&str>,
        base_req: &BTreeMap<String, String>,
    ) -> Section {
        let mut s = Section::from(&self.loc);
        s.comments.push(format!("router {}", self.router));
        let mut ls = self.listeners.clone();
        ls.sort();
        let mut all = all_listeners.to_vec();
        all.sort();
        if ls != all {
            s.set("listener", one_or_list(&self.listeners));
        }
        if !self.m.hosts.is_empty() {
            s.set("host", one_or_list(&self.m.hosts));
        }
        if let Some(kind) = self.m.kind {
            let key = match kind {
                PathKind::Prefix => "path",
                PathKind::Exact => "path_exact",
                PathKind::Regex => "path_regex",
            };
            s.set(key, one_or_list(&self.m.paths));
        }
        if !self.m.methods.is_empty() {
            s.set("methods", strings(&self.m.methods));
        }
        if !self.m.headers.is_empty() {
            s.set("headers", table(&self.m.headers));
        }
        if !self.m.query.is_empty() {
            s.set("query", table(&self.m.query));
        }
        match &self.action {
            Action::Upstream(u) => {
                s.set("upstream", u.as_str());
            }
            Action::Redirect(to, status) => {
                let mut t = toml::Table::new();
                t.insert("to".into(), to.as_str().into());
                t.insert("status".into(), Value::Integer(*status as i64));
                s.set("redirect", Value::Table(t));
            }
            Action::Respond(status, body) => {
                let mut t = toml::Table::new();
                t.insert("status".into(), Value::Integer(*status as i64));
                if !body.is_empty() {
                    t.insert("body".into(), body.as_str().into());
                }
                s.set("respond", Value::Table(t));
            }
            Action::Nothing => {}
        }
        let proxied = matches!(self.action, Action::Upstream(_));
        if proxied {
            match &self.path_op {
                Some(PathOp::Strip) => {
                    s.set("strip_prefix", true);
                }
                Some(PathOp::Rewrite(t)) => {
                    s.set("rewrite", t.as_str());
                }
                None => {}
            }
        }
        let mut allow = self.m.allow.clone();
        if let Some(Value::Array(a)) = self.key("allow") {
            allow.extend(a.iter().filter_map(|v| v.as_str().map(str::to_string)));
        }
        if !allow.is_empty() {
            s.set("allow", strings(&allow));
        }
        if !self.m.deny.is_empty() {
            s.set("deny", strings(&self.m.deny));
        }
        if proxied {
            let own = !self.req_set.is_empty() || !self.req_remove.is_empty();
            if own || base.is_none() {
                let mut set = base_req.clone();
                set.retain(|k, _| !self.req_remove.iter().any(|r| r.eq_ignore_ascii_case(k)));
                set.retain(|k, _| !self.req_set.keys().any(|r| r.eq_ignore_ascii_case(k)));
                set.extend(self.req_set.clone());
                if let Some(h) = header_rules(&set, &self.req_remove) {
                    s.set("request_headers", h);
                }
            } else if let Some(b) = base {
                s.set("use", Value::Array(vec![b.into()]));
            }
        }
        if let Some(h) = header_rules(&self.resp_set, &self.resp_remove) {
            s.set("response_headers", h);
        }
        for (k, v) in &self.keys {
            if k == "allow" || (!proxied && PROXY_ONLY.contains(&k.as_str())) {
                continue;
            }
            s.set(k, v.clone());
        }
        s
    }
}

/// Route keys that only proxied routes take.
const PROXY_ONLY: &[&str] = &[
    "forward_auth",
    "max_concurrency",
    "compress",
    "location_rewrite",
];

fn header_rules(set: &BTreeMap<String, String>, remove: &[String]) -> Option<Value> {
    if set.is_empty() && remove.is_empty() {
        return None;
    }
    let mut t = toml::Table::new();
    if !set.is_empty() {
        t.insert("set".into(), table(set));
    }
    if !remove.is_empty() {
        t.insert("remove".into(), strings(remove));
    }
    Some(Value::Table(t))
}

/// A string, or a list when there are several.
pub fn one_or_list(v: &[String]) -> Value {
    match v {
        [one] => one.as_str().into(),
        _ => strings(v),
    }
}

/// A list of strings.
pub fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.clone())).collect())
}

/// A string map as an inline table.
pub fn table(m: &BTreeMap<String, String>) -> Value {
    Value::Table(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}
