//! `reverse_proxy`'s parts: backend addresses, `transport http`, `lb_policy`, header
//! operations, and the group's server entries and name.

use toml::Value;
use veloxy_import::model::sanitize;
use veloxy_import::Section;

use super::placeholder::template;
use super::proxy::Opt;
use super::T;
use crate::parse::Line;

/// One backend address of a `reverse_proxy`.
pub struct Upstream {
    /// `host:port`, `https://host:port` or `unix:/path`.
    pub addr: String,
    /// `h2c://`.
    pub h2c: bool,
}

/// `localhost:8080`, `http://app`, `https://api:8443`, `h2c://grpc:50051`, `unix//run/a.sock`,
/// `:9000`, `app:8001-8003`.
pub fn upstreams(text: &str) -> Result<Vec<Upstream>, String> {
    if text.contains('{') {
        return Err(format!(
            "upstream {text} with a placeholder (veloxy's servers are fixed or DNS names)"
        ));
    }
    if let Some(path) = text.strip_prefix("unix/") {
        return Ok(vec![Upstream {
            addr: format!("unix:{path}"),
            h2c: false,
        }]);
    }
    let (scheme, rest) = match text.split_once("://") {
        Some((s, r)) => (s, r),
        None => ("", text),
    };
    let (tls, h2c, default_port) = match scheme {
        "" | "http" => (false, false, "80"),
        "https" => (true, false, "443"),
        "h2c" => (false, true, "80"),
        other => return Err(format!("upstream scheme {other}://")),
    };
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return Err(format!(
            "upstream {text} with a path (Caddy refuses it too)"
        ));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || rest.starts_with('[') => (h, p),
        _ => (rest, default_port),
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    let ports: Vec<String> = match port.split_once('-') {
        Some((a, b)) => {
            let (a, b): (u16, u16) = (
                a.parse().map_err(|_| format!("port range {port}"))?,
                b.parse().map_err(|_| format!("port range {port}"))?,
            );
            (a..=b).map(|p| p.to_string()).collect()
        }
        None => vec![port.to_string()],
    };
    Ok(ports
        .into_iter()
        .map(|p| Upstream {
            addr: if tls {
                format!("https://{host}:{p}")
            } else {
                format!("{host}:{p}")
            },
            h2c,
        })
        .collect())
}

impl T<'_> {
    /// `transport http { ... }`.
    pub fn transport(&mut self, sub: &Line, vals: &[&str], g: &mut Section) -> Opt {
        if vals.first() != Some(&"http") {
            return Opt::Refused(format!(
                "transport {} (veloxy speaks HTTP to upstreams)",
                vals.join(" ")
            ));
        }
        let mut tls = false;
        for t in sub.body() {
            let v: Vec<&str> = t.args().iter().map(|x| x.text.as_str()).collect();
            let first = v.first().copied().unwrap_or("");
            let r = match t.name() {
                "tls" => {
                    tls = true;
                    Opt::Done
                }
                "tls_server_name" => {
                    tls = true;
                    g.set("tls_server_name", first);
                    Opt::Done
                }
                "tls_trusted_ca_certs" => {
                    tls = true;
                    let p = self.path(first);
                    g.set("ca_file", p);
                    Opt::Done
                }
                "tls_insecure_skip_verify" => Opt::Refused(
                    "tls_insecure_skip_verify (veloxy always verifies upstream certificates: give ca_file)".into(),
                ),
                "tls_client_auth" => Opt::Refused("tls_client_auth (veloxy has no upstream client certificates)".into()),
                "versions" => {
                    if v.contains(&"h2c") {
                        g.set("protocol", "h2c");
                    } else if v == ["2"] {
                        g.set("protocol", "h2");
                    } else if !v.contains(&"1.1") {
                        return Opt::Refused(format!("versions {}", v.join(" ")));
                    }
                    Opt::Done
                }
                "dial_timeout" => dur_key(g, "connect_timeout", first),
                "read_timeout" | "response_header_timeout" => dur_key(g, "read_timeout", first),
                "write_timeout" => dur_key(g, "write_timeout", first),
                "keepalive" if first == "off" => {
                    g.set("keepalive", 0);
                    Opt::Done
                }
                "keepalive" => dur_key(g, "idle_timeout", first),
                "keepalive_idle_conns" | "keepalive_idle_conns_per_host" => match first.parse::<i64>() {
                    Ok(n) => {
                        g.set("keepalive", n);
                        Opt::Different("veloxy keeps this many idle connections per backend and worker".into())
                    }
                    Err(_) => Opt::Refused(format!("{} {first}", t.name())),
                },
                "max_conns_per_host" => match first.parse::<i64>() {
                    Ok(n) => {
                        g.set("max_connections", n);
                        Opt::Done
                    }
                    Err(_) => Opt::Refused(format!("max_conns_per_host {first}")),
                },
                "compression" => Opt::Ignored("veloxy forwards the client's Accept-Encoding as it is".into()),
                "dial_fallback_delay" | "keepalive_interval" | "max_response_header" | "read_buffer"
                | "write_buffer" => Opt::Ignored("a buffer or socket tuning with no visible effect".into()),
                other => Opt::Refused(format!("transport http {other}")),
            };
            match r {
                Opt::Done => self.report.translated(t.loc(), t.name()),
                Opt::Different(d) => self.report.different(t.loc(), t.name(), d),
                Opt::Ignored(w) => self.report.ignored(t.loc(), t.name(), w),
                Opt::Refused(w) => self.report.refused(t.loc(), t.name(), w),
                _ => {}
            }
        }
        if tls {
            if let Some(Value::Array(servers)) = g.get("servers").cloned() {
                let s: Vec<Value> = servers
                    .into_iter()
                    .map(|v| match v {
                        Value::String(a)
                            if !a.starts_with("https://") && !a.starts_with("unix:") =>
                        {
                            Value::String(format!("https://{a}"))
                        }
                        Value::Table(mut t) => {
                            if let Some(Value::String(d)) = t.get("dns").cloned() {
                                if !d.starts_with("https://") {
                                    t.insert("dns".into(), format!("https://{d}").into());
                                }
                            }
                            Value::Table(t)
                        }
                        v => v,
                    })
                    .collect();
                g.set("servers", Value::Array(s));
            }
            if g.get("protocol").and_then(Value::as_str) == Some("h2c") {
                g.set("protocol", "h2");
            }
        }
        Opt::Done
    }
}

pub fn dur(t: &mut toml::Table, key: &str, v: &str) -> Opt {
    match super::duration(v) {
        Some(d) => {
            t.insert(key.into(), d.into());
            Opt::Done
        }
        None => Opt::Refused(format!("duration {v}")),
    }
}

pub fn dur_key(g: &mut Section, key: &str, v: &str) -> Opt {
    match super::duration(v) {
        Some(d) => {
            g.set(key, d);
            Opt::Done
        }
        None => Opt::Refused(format!("duration {v}")),
    }
}

pub fn lb_policy(vals: &[&str], g: &mut Section) -> Opt {
    match vals {
        ["round_robin"] => Opt::Done,
        ["weighted_round_robin", weights @ ..] => {
            let Some(Value::Array(servers)) = g.get("servers").cloned() else {
                return Opt::Refused("weighted_round_robin without servers".into());
            };
            let w: Vec<i64> = weights.iter().filter_map(|w| w.parse().ok()).collect();
            if w.len() != servers.len() || w.iter().any(|w| *w < 1) {
                return Opt::Refused(
                    "weighted_round_robin weights (one positive weight per server)".into(),
                );
            }
            let entries = servers
                .into_iter()
                .zip(w)
                .map(|(s, w)| {
                    let mut t = toml::Table::new();
                    t.insert("addr".into(), s);
                    t.insert("weight".into(), w.into());
                    Value::Table(t)
                })
                .collect();
            g.set("servers", Value::Array(entries));
            Opt::Done
        }
        ["least_conn"] => {
            g.set("policy", "least_conn");
            Opt::Different("veloxy counts in-flight requests per worker".into())
        }
        ["random"] => {
            g.set("policy", "random");
            Opt::Done
        }
        ["ip_hash"] | ["client_ip_hash"] => {
            g.set("policy", "consistent_hash");
            g.set("hash_key", "client_ip");
            Opt::Different("a client always reaches one backend, but veloxy's hash (Maglev) may pick another one than Caddy's".into())
        }
        ["uri_hash"] => {
            g.set("policy", "consistent_hash");
            g.set("hash_key", "path");
            Opt::Different(
                "veloxy hashes the path without the query, with Maglev rather than Caddy's hash"
                    .into(),
            )
        }
        ["header", name] => {
            g.set("policy", "consistent_hash");
            g.set("hash_key", format!("header:{name}"));
            Opt::Different(
                "veloxy's hash (Maglev) may pick another backend than Caddy's for a value".into(),
            )
        }
        ["cookie", name, ..] => {
            let mut t = toml::Table::new();
            t.insert("cookie".into(), (*name).into());
            t.insert("ttl".into(), "0s".into());
            g.set("sticky", Value::Table(t));
            Opt::Different(
                "the cookie's value is veloxy's token of the backend, not Caddy's HMAC".into(),
            )
        }
        ["random_choose", ..] => {
            g.set("policy", "p2c_ewma");
            Opt::Different(
                "veloxy picks the lower latency x in-flight of two random backends".into(),
            )
        }
        ["first"] => Opt::Refused(
            "lb_policy first (veloxy has no policy that fills backends in order)".into(),
        ),
        other => Opt::Refused(format!("lb_policy {}", other.join(" "))),
    }
}

/// `header_up Name value`, `+Name value`, `-Name`, `Name find replace` into `h`.
pub fn header_op(h: &mut super::flow::Headers, vals: &[&str], single: Option<&str>) -> Opt {
    let Some(first) = vals.first() else {
        return Opt::Refused("header without a field".into());
    };
    if let Some(name) = first.strip_prefix('-') {
        h.remove.push(name.to_string());
        return Opt::Done;
    }
    let (name, add) = match first.strip_prefix('+') {
        Some(n) => (n, true),
        None => (*first, false),
    };
    match vals.len() {
        2 => {}
        3 => return Opt::Refused(format!("{name} find/replace (veloxy sets whole values)")),
        _ => return Opt::Refused(format!("{name} without a value")),
    }
    let value = match template(vals[1], single) {
        Ok(v) => v,
        Err(e) => return Opt::Refused(e),
    };
    if add {
        h.add.insert(name.to_string(), value.into());
    } else {
        h.set.insert(name.to_string(), value.into());
    }
    Opt::Done
}

/// A server entry: an address, or for a host name `{ dns = "name:port" }`, resolved while
/// running as Caddy resolves at each dial (veloxy resolves plain names once, at load).
pub fn server_entry(addr: &str) -> Value {
    let bare = addr.trim_start_matches("https://");
    let host = bare.rsplit_once(':').map_or(bare, |(h, _)| h);
    let fixed = addr.starts_with("unix:")
        || host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok();
    if fixed {
        return Value::String(addr.to_string());
    }
    let mut t = toml::Table::new();
    t.insert("dns".into(), addr.into());
    Value::Table(t)
}

/// A group name from a server address: its host name, or `backend_PORT` for addresses.
pub fn name_for(addr: &str) -> String {
    let a = addr.trim_start_matches("https://");
    if let Some(p) = a.strip_prefix("unix:") {
        return sanitize(
            p.rsplit('/')
                .next()
                .unwrap_or("unix")
                .trim_end_matches(".sock"),
        );
    }
    let (host, port) = a.rsplit_once(':').unwrap_or((a, ""));
    let loopback =
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[');
    if loopback {
        format!("backend_{port}")
    } else {
        sanitize(host.split('.').next().unwrap_or(host))
    }
}
