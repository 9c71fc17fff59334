//! Upstream groups: a Service port (or a weighted main + canary pair) with the settings of
//! the Ingress that sends to it (protocol, timeouts, retries, affinity, policy). Services
//! are their DNS name (`NAME.NAMESPACE.svc:PORT`, resolved again every 10 s) unless
//! `--service NAME.NAMESPACE:PORT=ADDR[,ADDR...]` maps them.

use toml::Value;
use veloxy_import::tree::Node;
use veloxy_import::{Loc, Section};

use crate::annotations::{Ann, Proto};
use crate::util::{self, table};
use crate::Ctx;

/// A Service port as an Ingress backend names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Backend {
    /// Namespace.
    pub ns: String,
    /// Service name.
    pub name: String,
    /// `port.number` or `port.name`.
    pub port: String,
}

impl Backend {
    /// An Ingress backend (`service: {name, port: {number | name}}`) in namespace `ns`.
    pub fn read(node: &Node, ns: &str) -> Result<Backend, String> {
        let Some(svc) = node.get("service") else {
            return Err(if node.get("resource").is_some() {
                "a resource backend (not a Service): ingress-nginx does not serve it".into()
            } else {
                "no service backend".into()
            });
        };
        let name = svc.get("name").and_then(Node::scalar).unwrap_or_default();
        let port = svc.get("port");
        let port = port
            .and_then(|p| p.get("number").or_else(|| p.get("name")))
            .and_then(Node::scalar)
            .unwrap_or_default();
        if name.is_empty() || port.is_empty() {
            return Err("the backend names no Service or port".into());
        }
        Ok(Backend {
            ns: ns.to_string(),
            name,
            port,
        })
    }

    /// `NAME:PORT`, for report lines.
    pub fn label(&self) -> String {
        format!("{}:{}", self.name, self.port)
    }
}

/// What makes two groups the same.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupKey {
    /// Backends and weights.
    pub backends: Vec<(Backend, u32)>,
    /// Upstream protocol.
    pub proto: Proto,
    /// connect, read, write timeouts.
    pub timeouts: [String; 3],
    /// Attempts in all (retries + 1).
    pub tries: u32,
    /// sticky.
    pub sticky: Option<Value>,
    /// policy and hash key.
    pub policy: (String, Option<String>),
}

impl Ctx<'_> {
    /// The servers of a Service port: `--service` addresses, else its DNS name. A mapped
    /// Service port read here is recorded in [`Sources::opaque`].
    pub fn servers(&mut self, b: &Backend, https: bool) -> Result<Vec<Value>, String> {
        let (servers, key) = self.servers_keyed(b, https)?;
        self.sources.opaque.extend(key);
        Ok(servers)
    }

    /// [`Ctx::servers`], with the `--service` key they come from (`None`: a DNS name).
    fn servers_keyed(
        &mut self,
        b: &Backend,
        https: bool,
    ) -> Result<(Vec<Value>, Option<String>), String> {
        let svc = self.objs.service(&b.ns, &b.name);
        if svc.is_some() {
            self.used_services.insert((b.ns.clone(), b.name.clone()));
        }
        let mut port = b.port.clone();
        let key = format!("{}.{}:{}", b.name, b.ns, port);
        if let Some(list) = self.opts.services.get(&key) {
            return Ok((addrs(list, https), Some(key)));
        }
        if port.parse::<u16>().is_err() {
            let number = svc
                .and_then(|s| s.spec("ports"))
                .and_then(Node::as_seq)
                .unwrap_or(&[])
                .iter()
                .find(|p| p.get("name").and_then(Node::scalar).as_deref() == Some(&port))
                .and_then(|p| p.get("port").and_then(Node::scalar));
            match number {
                Some(n) => port = n,
                None => {
                    return Err(format!(
                        "the named port {port:?} of Service {}/{}: add the Service to the \
                         input or map it with --service {}.{}:{port}=ADDR",
                        b.ns, b.name, b.name, b.ns
                    ))
                }
            }
            let key = format!("{}.{}:{}", b.name, b.ns, port);
            if let Some(list) = self.opts.services.get(&key) {
                return Ok((addrs(list, https), Some(key)));
            }
        }
        let scheme = if https { "https://" } else { "" };
        let external = svc
            .filter(|s| s.spec("type").and_then(Node::scalar).as_deref() == Some("ExternalName"))
            .and_then(|s| s.spec("externalName").and_then(Node::scalar));
        let host = external.unwrap_or_else(|| format!("{}.{}.svc", b.name, b.ns));
        let dns = table([("dns", format!("{scheme}{host}:{port}").into())]);
        Ok((vec![dns], None))
    }

    /// The servers of a host named in a URL (`auth-url`): a Service's DNS name (mapped by
    /// `--service` when given), an address, or a name resolved at run time.
    pub fn service_servers_for_host(&mut self, host: &str, port: u16, https: bool) -> Vec<Value> {
        let trimmed = host
            .trim_end_matches(".cluster.local")
            .trim_end_matches(".svc");
        if let Some((name, ns)) = trimmed.split_once('.') {
            if !ns.contains('.') {
                let key = format!("{name}.{ns}:{port}");
                if let Some(list) = self.opts.services.get(&key) {
                    let servers = addrs(list, https);
                    self.sources.opaque.insert(key);
                    return servers;
                }
            }
        }
        let scheme = if https { "https://" } else { "" };
        if host.parse::<std::net::IpAddr>().is_ok() {
            return vec![format!("{scheme}{host}:{port}").into()];
        }
        vec![table([("dns", format!("{scheme}{host}:{port}").into())])]
    }

    /// A group for an auth service.
    pub fn auth_group(&mut self, base: &str, servers: Vec<Value>, loc: &Loc) -> String {
        if let Some((name, s)) = self.config.upstreams.iter().find(|(n, s)| {
            n.starts_with(base) && s.get("servers") == Some(&Value::Array(servers.clone()))
        }) {
            let _ = s;
            return name.clone();
        }
        let name = veloxy_import::Config::unique(&self.config.upstreams, base);
        let g = self.config.upstream(&name, loc);
        g.set("servers", Value::Array(servers));
        g.set("connect_timeout", self.g.connect_timeout.as_str());
        name
    }

    /// The group for `backends` with the settings of `ann` (made once per distinct key).
    pub fn group(
        &mut self,
        backends: Vec<(Backend, u32)>,
        ann: &Ann,
        loc: &Loc,
    ) -> Result<String, String> {
        let key = GroupKey {
            backends,
            proto: ann.proto,
            timeouts: [
                ann.timeouts[0]
                    .clone()
                    .unwrap_or(self.g.connect_timeout.clone()),
                ann.timeouts[1]
                    .clone()
                    .unwrap_or(self.g.read_timeout.clone()),
                ann.timeouts[2]
                    .clone()
                    .unwrap_or(self.g.send_timeout.clone()),
            ],
            tries: ann.tries.unwrap_or(self.g.tries),
            sticky: ann.sticky.clone(),
            policy: ann.policy.clone().unwrap_or((self.g.policy.clone(), None)),
        };
        if let Some((_, name)) = self.groups.iter().find(|(k, _)| *k == key) {
            let name = name.clone();
            if let Some(s) = veloxy_import::model::named(&mut self.config.upstreams, &name) {
                s.add_from(loc);
            }
            return Ok(name);
        }
        let https = matches!(key.proto, Proto::Https | Proto::Grpcs);
        let split = key.backends.len() > 1;
        let mut servers = Vec::new();
        let mut keys = Vec::new();
        for (b, w) in &key.backends {
            let (list, from) = self.servers_keyed(b, https)?;
            keys.push(from.map(|k| (k, *w)));
            servers.extend(list.into_iter().map(|s| weighted(s, *w, split)));
        }
        let base = match key.backends.as_slice() {
            [(b, _)] => b.name.clone(),
            [(b, _), ..] => format!("{}-canary", b.name),
            [] => "default".into(),
        };
        let name = veloxy_import::Config::unique(&self.config.upstreams, &base);
        let mut s = Section::from(loc);
        s.set("servers", Value::Array(servers));
        fill(&mut s, &key);
        self.config.upstreams.push((name.clone(), s));
        self.groups.push((key, name.clone()));
        if keys.iter().all(Option::is_some) {
            self.sources.groups.push(GroupSource {
                group: name.clone(),
                keys: keys.into_iter().flatten().collect(),
                split,
                https,
            });
        } else {
            // Some backend is a DNS name: the mapped ones are not recomputed alone.
            let mapped = keys.into_iter().flatten().map(|(k, _)| k);
            self.sources.opaque.extend(mapped);
        }
        Ok(name)
    }
}

/// Where the servers of the groups come from, for a caller that maps Services to addresses
/// (`--service`, the Kubernetes provider's endpoints) and recomputes them when only the
/// addresses change.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    /// The groups whose servers are all mapped Service ports.
    pub groups: Vec<GroupSource>,
    /// The `--service` keys read for anything else (an auth service, a passthrough stream's
    /// group, a group with a DNS backend too): a change of their addresses is a new import.
    pub opaque: std::collections::BTreeSet<String>,
}

/// One group's servers as a function of the `--service` map.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSource {
    /// The group's name as imported.
    pub group: String,
    /// Each backend's `--service` key and weight.
    pub keys: Vec<(String, u32)>,
    /// Weighted entries (a canary split).
    pub split: bool,
    /// `https://` addresses.
    pub https: bool,
}

impl GroupSource {
    /// The group's servers with `list(key)` as each key's comma-separated addresses: what
    /// [`Ctx::group`] makes from the same map.
    pub fn servers(&self, list: impl Fn(&str) -> String) -> Vec<Value> {
        let mut out = Vec::new();
        for (key, w) in &self.keys {
            let mapped = addrs(&list(key), self.https);
            out.extend(mapped.into_iter().map(|s| weighted(s, *w, self.split)));
        }
        out
    }
}

/// The group's settings beyond its servers.
fn fill(s: &mut Section, key: &GroupKey) {
    match key.proto {
        Proto::Grpc => {
            s.set("protocol", "h2c");
        }
        Proto::Grpcs => {
            s.set("protocol", "h2");
        }
        _ => {}
    }
    if key.policy.0 != "round_robin" {
        s.set("policy", key.policy.0.as_str());
    }
    if let Some(h) = &key.policy.1 {
        s.set("hash_key", h.as_str());
    }
    s.set("connect_timeout", key.timeouts[0].as_str());
    s.set("read_timeout", key.timeouts[1].as_str());
    s.set("write_timeout", key.timeouts[2].as_str());
    if key.tries != 3 {
        s.set("retries", i64::from(key.tries.saturating_sub(1)));
    }
    // ingress-nginx retries on connection errors and timeouts only (proxy_next_upstream
    // "error timeout"), never on a backend's 5xx answer.
    s.set("retry_on", Value::Array(Vec::new()));
    if let Some(st) = &key.sticky {
        s.set("sticky", st.clone());
    }
}

/// `--service` addresses (comma-separated) as servers.
fn addrs(list: &str, https: bool) -> Vec<Value> {
    let scheme = if https { "https://" } else { "" };
    util::list(list)
        .into_iter()
        .map(|a| {
            let a = a.trim_start_matches("http://");
            if a.starts_with("https://") || a.starts_with("unix:") {
                a.to_string().into()
            } else {
                format!("{scheme}{a}").into()
            }
        })
        .collect()
}

/// A server with a weight (canary splits).
fn weighted(s: Value, w: u32, split: bool) -> Value {
    if !split {
        return s;
    }
    let mut t = match s {
        Value::Table(t) => t,
        Value::String(a) => [("addr".to_string(), Value::String(a))]
            .into_iter()
            .collect(),
        other => return other,
    };
    t.insert("weight".into(), i64::from(w).into());
    Value::Table(t)
}
