//! The output config: named and listed sections of keys, each remembering the source lines
//! it came from, written as TOML by [`Config::to_toml`].
//!
//! The model is deliberately thin (keys and `toml::Value`s, not typed structs): what a valid
//! veloxy config is stays defined in one place, the engine's config loader, which the golden
//! tests run on every output.

use std::fmt::Write as _;

use toml::Value;

use crate::source::Loc;

/// Keys of a section whose table value is written as a sub-table (`[listeners.web.tls]`)
/// rather than inline; every other table value is inline (`{ set = { ... } }`).
const BLOCK_TABLES: &[&str] = &["tls", "health", "outlier", "access_log", "acme", "redis"];

/// A section: its keys in the order they were set, and where it came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Section {
    /// The source lines this section was made from (`# from FILE:LINE` above it).
    pub from: Vec<Loc>,
    /// Comment lines written above the section (after `# from`), without the `# `.
    pub comments: Vec<String>,
    /// The keys, in order.
    pub keys: Vec<(String, Value)>,
}

impl Section {
    /// An empty section made from `loc`.
    pub fn from(loc: &Loc) -> Self {
        Section {
            from: vec![loc.clone()],
            ..Default::default()
        }
    }

    /// Sets `key` (replacing an earlier value of it, keeping its place).
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        let value = value.into();
        match self.keys.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.keys.push((key.to_string(), value)),
        }
        self
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of `key`, to change in place.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.keys.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.keys.iter().position(|(k, _)| k == key)?;
        Some(self.keys.remove(i).1)
    }

    /// Adds a source location (kept once).
    pub fn add_from(&mut self, loc: &Loc) {
        if !self.from.contains(loc) {
            self.from.push(loc.clone());
        }
    }

    /// The table under `key` (created empty when absent), e.g. a route's `request_headers`.
    pub fn table(&mut self, key: &str) -> &mut toml::Table {
        if !matches!(self.get(key), Some(Value::Table(_))) {
            self.set(key, Value::Table(toml::Table::new()));
        }
        match self.get_mut(key) {
            Some(Value::Table(t)) => t,
            _ => unreachable!("just set to a table"),
        }
    }
}

/// A file written beside the output (an htpasswd file made from inline hashes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Path relative to the output's directory (as the config names it).
    pub name: String,
    /// Contents.
    pub contents: String,
    /// Unix mode (0o600 for secrets).
    pub mode: u32,
}

/// A whole veloxy config, section by section, in the order it is written.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Comment lines at the top, without the `# `.
    pub header: Vec<String>,
    /// `[server]`.
    pub server: Section,
    /// `[upstream_defaults]`: keys every upstream group takes where it sets none.
    pub upstream_defaults: Section,
    /// `[listeners.NAME]`.
    pub listeners: Vec<(String, Section)>,
    /// `[rule_sets.NAME]`: rules routes share through `use = ["NAME"]`.
    pub rule_sets: Vec<(String, Section)>,
    /// `[upstreams.NAME]`.
    pub upstreams: Vec<(String, Section)>,
    /// `[caches.NAME]`.
    pub caches: Vec<(String, Section)>,
    /// `[[routes]]`, in order.
    pub routes: Vec<Section>,
    /// `[[streams]]`, in order.
    pub streams: Vec<Section>,
    /// Files written beside the output.
    pub files: Vec<GeneratedFile>,
}

/// Finds a named section.
pub fn named<'a>(list: &'a mut [(String, Section)], name: &str) -> Option<&'a mut Section> {
    list.iter_mut().find(|(n, _)| n == name).map(|(_, s)| s)
}

impl Config {
    /// The listener `name`, created (made from `loc`) when absent.
    pub fn listener(&mut self, name: &str, loc: &Loc) -> &mut Section {
        entry(&mut self.listeners, name, loc)
    }

    /// The upstream group `name`, created (made from `loc`) when absent.
    pub fn upstream(&mut self, name: &str, loc: &Loc) -> &mut Section {
        entry(&mut self.upstreams, name, loc)
    }

    /// The rule set `name`, created (made from `loc`) when absent.
    pub fn rule_set(&mut self, name: &str, loc: &Loc) -> &mut Section {
        entry(&mut self.rule_sets, name, loc)
    }

    /// A name not yet used in `list`: `base`, else `base_2`, `base_3`...
    pub fn unique(list: &[(String, Section)], base: &str) -> String {
        let base = sanitize(base);
        if !list.iter().any(|(n, _)| *n == base) {
            return base;
        }
        (2..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| !list.iter().any(|(m, _)| m == n))
            .expect("an unused suffix exists")
    }

    /// Finishing touches every importer's output gets before it is written:
    /// * a server given by a name (`app:8080`, `https://api.internal:443`) becomes a `dns`
    ///   entry, resolved when veloxy runs (and again every 10 s) rather than when the config
    ///   is loaded: the source tools resolve such names on the machine they run on, often
    ///   inside a container network the importing machine cannot see, so a load-time lookup
    ///   would fail `veloxy check` there;
    /// * keys that every upstream group sets to the same value move to `[upstream_defaults]`
    ///   (two groups or more), so an importer may write each group whole and the output
    ///   still says a shared timeout once.
    pub fn finish(&mut self) {
        const SHARED: &[&str] = &[
            "policy",
            "keepalive",
            "pool_purge_delay",
            "connect_timeout",
            "read_timeout",
            "write_timeout",
            "idle_timeout",
            "retries",
            "retry_on",
            "retry_budget",
            "retry_body_limit",
            "max_connections",
            "hash_key",
            "health",
            "outlier",
            "location_rewrite",
            "runtime_overrides",
        ];
        for (_, g) in &mut self.upstreams {
            if let Some(Value::Array(servers)) = g.get_mut("servers") {
                servers.iter_mut().for_each(by_name_to_dns);
            }
        }
        if self.upstreams.len() < 2 {
            return;
        }
        for key in SHARED {
            let first = self.upstreams[0].1.get(key).cloned();
            let Some(value) = first else { continue };
            if self.upstream_defaults.get(key).is_some()
                || !self
                    .upstreams
                    .iter()
                    .all(|(_, g)| g.get(key) == Some(&value))
            {
                continue;
            }
            for (_, g) in &mut self.upstreams {
                g.remove(key);
            }
            self.upstream_defaults.set(key, value);
        }
        if !self.upstream_defaults.keys.is_empty() && self.upstream_defaults.comments.is_empty() {
            self.upstream_defaults
                .comments
                .push("what every upstream group below shares".to_string());
        }
    }

    /// The config as TOML, with a `# from FILE:LINE` comment above each section.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        for h in &self.header {
            let _ = writeln!(out, "# {h}");
        }
        if !self.server.keys.is_empty() {
            write_section(&mut out, "server", false, &self.server);
        }
        for (kind, list) in [
            ("listeners", &self.listeners),
            ("rule_sets", &self.rule_sets),
            ("upstreams", &self.upstreams),
            ("caches", &self.caches),
        ] {
            if kind == "upstreams" && !self.upstream_defaults.keys.is_empty() {
                write_section(
                    &mut out,
                    "upstream_defaults",
                    false,
                    &self.upstream_defaults,
                );
            }
            for (name, s) in list {
                write_section(&mut out, &format!("{kind}.{}", key(name)), false, s);
            }
        }
        for r in &self.routes {
            write_section(&mut out, "routes", true, r);
        }
        for s in &self.streams {
            write_section(&mut out, "streams", true, s);
        }
        out
    }
}

/// A server string or `{ addr, weight }` table naming a host (not an IP address, not a unix
/// socket) as the `dns` entry of the same name and weight.
fn by_name_to_dns(server: &mut Value) {
    let named = |addr: &str| {
        let rest = addr
            .strip_prefix("https://")
            .or_else(|| addr.strip_prefix("http://"))
            .unwrap_or(addr);
        if rest.starts_with("unix:") || rest.starts_with('[') {
            return false;
        }
        let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
        // `localhost` stays: the system resolver reads /etc/hosts; DNS may not answer it.
        rest.contains(':') && host.parse::<std::net::IpAddr>().is_err() && host != "localhost"
    };
    match server {
        Value::String(addr) if named(addr) => {
            let mut t = toml::Table::new();
            t.insert("dns".into(), Value::String(addr.clone()));
            *server = Value::Table(t);
        }
        Value::Table(t) => {
            let addr = t.get("addr").and_then(Value::as_str).map(str::to_string);
            if let Some(addr) = addr.filter(|a| named(a)) {
                t.remove("addr");
                let mut out = toml::Table::new();
                out.insert("dns".into(), Value::String(addr));
                out.extend(std::mem::take(t));
                *t = out;
            }
        }
        _ => {}
    }
}

fn entry<'a>(list: &'a mut Vec<(String, Section)>, name: &str, loc: &Loc) -> &'a mut Section {
    let i = match list.iter().position(|(n, _)| n == name) {
        Some(i) => i,
        None => {
            list.push((name.to_string(), Section::from(loc)));
            list.len() - 1
        }
    };
    &mut list[i].1
}

/// A name usable as a veloxy section name: letters, digits, `_` and `-`; others become `_`.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "default".to_string()
    } else {
        s
    }
}

/// A key, bare when TOML allows it, else quoted.
pub fn key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        k.to_string()
    } else {
        Value::String(k.to_string()).to_string()
    }
}

/// A value written inline (`{ a = 1 }`, `["x"]`, `"s"`).
pub fn inline(v: &Value) -> String {
    match v {
        Value::Table(t) => {
            if t.is_empty() {
                return "{}".to_string();
            }
            let parts: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", key(k), inline(v)))
                .collect();
            format!("{{ {} }}", parts.join(", "))
        }
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(inline).collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.to_string(),
    }
}

fn write_from(out: &mut String, s: &Section) {
    if s.from.is_empty() {
        return;
    }
    let places: Vec<String> = s
        .from
        .iter()
        .map(|l| format!("{}:{}", l.file, l.line))
        .collect();
    let _ = writeln!(out, "# from {}", places.join(", "));
}

fn write_section(out: &mut String, path: &str, array: bool, s: &Section) {
    if !out.is_empty() {
        out.push('\n');
    }
    write_from(out, s);
    for c in &s.comments {
        let _ = writeln!(out, "# {c}");
    }
    if array {
        let _ = writeln!(out, "[[{path}]]");
    } else {
        let _ = writeln!(out, "[{path}]");
    }
    let mut blocks = Vec::new();
    for (k, v) in &s.keys {
        match v {
            Value::Table(t) if !array && BLOCK_TABLES.contains(&k.as_str()) => blocks.push((k, t)),
            _ => {
                let _ = writeln!(out, "{} = {}", key(k), inline(v));
            }
        }
    }
    for (k, t) in blocks {
        let sub = format!("{path}.{}", key(k));
        let mut arrays = Vec::new();
        let _ = writeln!(out, "[{sub}]");
        for (k2, v2) in t {
            match v2 {
                Value::Array(a) if !a.is_empty() && a.iter().all(|x| x.is_table()) => {
                    arrays.push((k2, a))
                }
                _ => {
                    let _ = writeln!(out, "{} = {}", key(k2), inline(v2));
                }
            }
        }
        for (k2, a) in arrays {
            for item in a {
                let _ = writeln!(out, "[[{sub}.{}]]", key(k2));
                if let Value::Table(t2) = item {
                    for (k3, v3) in t2 {
                        let _ = writeln!(out, "{} = {}", key(k3), inline(v3));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn writes_sections_with_their_origin() {
        let f: Arc<str> = "nginx.conf".into();
        let loc = Loc::new(&f, 3, 5);
        let mut c = Config::default();
        c.listener("web", &loc).set("addr", "0.0.0.0:80");
        let mut tls = toml::Table::new();
        tls.insert("cert".into(), "a.pem".into());
        let mut extra = toml::Table::new();
        extra.insert("hosts".into(), Value::Array(vec!["b.example".into()]));
        tls.insert("certs".into(), Value::Array(vec![Value::Table(extra)]));
        c.listener("web", &loc).set("tls", Value::Table(tls));
        let mut r = Section::from(&loc);
        r.set("path", "/api/");
        r.table("request_headers").insert(
            "set".into(),
            Value::Table(
                [("X-A".to_string(), Value::from("1"))]
                    .into_iter()
                    .collect(),
            ),
        );
        c.routes.push(r);
        let text = c.to_toml();
        assert_eq!(
            text,
            "# from nginx.conf:3\n[listeners.web]\naddr = \"0.0.0.0:80\"\n[listeners.web.tls]\n\
             cert = \"a.pem\"\n[[listeners.web.tls.certs]]\nhosts = [\"b.example\"]\n\n\
             # from nginx.conf:3\n[[routes]]\npath = \"/api/\"\n\
             request_headers = { set = { X-A = \"1\" } }\n"
        );
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert!(parsed.contains_key("routes"));
    }

    #[test]
    fn shared_group_keys_move_to_upstream_defaults() {
        let f: Arc<str> = "x".into();
        let loc = Loc::new(&f, 1, 1);
        let mut c = Config::default();
        for (name, read) in [("a", "1m"), ("b", "1m")] {
            let g = c.upstream(name, &loc);
            g.set("servers", Value::Array(vec!["127.0.0.1:1".into()]));
            g.set("connect_timeout", "1m").set("read_timeout", read);
        }
        c.upstream("b", &loc).set("retries", 0);
        c.finish();
        assert_eq!(
            c.upstream_defaults.get("connect_timeout"),
            Some(&Value::from("1m"))
        );
        assert_eq!(
            c.upstream_defaults.get("read_timeout"),
            Some(&Value::from("1m"))
        );
        assert_eq!(
            c.upstream_defaults.get("retries"),
            None,
            "not every group sets it"
        );
        assert!(c.upstream("a", &loc).get("connect_timeout").is_none());
        assert!(c
            .to_toml()
            .contains("[upstream_defaults]\nconnect_timeout = \"1m\""));
    }

    #[test]
    fn servers_by_name_become_dns_entries() {
        let f: Arc<str> = "x".into();
        let loc = Loc::new(&f, 1, 1);
        let mut c = Config::default();
        let mut weighted = toml::Table::new();
        weighted.insert("addr".into(), "app:8080".into());
        weighted.insert("weight".into(), Value::from(2));
        let servers = vec![
            Value::from("127.0.0.1:80"),
            Value::from("app:8080"),
            Value::from("https://api.internal:443"),
            Value::from("unix:/run/app.sock"),
            Value::from("[::1]:80"),
            Value::Table(weighted),
        ];
        c.upstream("a", &loc).set("servers", Value::Array(servers));
        c.finish();
        let text = c.to_toml();
        assert!(
            text.contains(
                "servers = [\"127.0.0.1:80\", { dns = \"app:8080\" }, { dns = \"https://api.internal:443\" }, \"unix:/run/app.sock\", \"[::1]:80\", { dns = \"app:8080\", weight = 2 }]"
            ),
            "{text}"
        );
    }

    #[test]
    fn unique_names() {
        let list = vec![("api".to_string(), Section::default())];
        assert_eq!(Config::unique(&list, "api"), "api_2");
        assert_eq!(Config::unique(&list, "a.b"), "a_b");
    }
}
