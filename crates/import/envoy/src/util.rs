//! Small pieces every part of the translation uses: a view of a proto message that tracks
//! which fields were read (so every field gets exactly one report line), Envoy's durations,
//! typed configs, addresses and header value formatters.

use veloxy_import::tree::Node;
use veloxy_import::{Loc, Report};

/// The fields of one Envoy message (a YAML/JSON map), each taken at most once; the fields
/// nobody took are reported by [`Fields::finish`].
pub struct Fields<'a> {
    /// The message's kind, the prefix of its directives (`cluster`, `route`...).
    pub kind: &'static str,
    entries: Vec<(&'a str, &'a Loc, &'a Node, bool)>,
    /// Where the message starts.
    pub loc: &'a Loc,
}

impl<'a> Fields<'a> {
    /// The fields of `node` (no field when it is not a map).
    pub fn new(node: &'a Node, kind: &'static str) -> Fields<'a> {
        let entries = node
            .as_map()
            .unwrap_or(&[])
            .iter()
            .map(|(k, v)| (k.name.as_str(), &k.loc, v, false))
            .collect();
        Fields {
            kind,
            entries,
            loc: &node.loc,
        }
    }

    /// Takes field `name` (its key's location and its value).
    pub fn take(&mut self, name: &str) -> Option<(&'a Loc, &'a Node)> {
        let e = self.entries.iter_mut().find(|e| e.0 == name && !e.3)?;
        e.3 = true;
        Some((e.1, e.2))
    }

    /// Whether field `name` is present (taken or not).
    pub fn has(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.0 == name)
    }

    /// `kind.name`, the directive name of a field.
    pub fn name(&self, field: &str) -> String {
        format!("{}.{field}", self.kind)
    }

    /// Takes `name` and reports it ignored with `why`.
    pub fn ignore(&mut self, r: &mut Report, name: &str, why: &str) {
        if let Some((loc, _)) = self.take(name) {
            r.ignored(loc, self.name(name), why);
        }
    }

    /// Takes `name` and reports it refused with `why`.
    pub fn refuse(&mut self, r: &mut Report, name: &str, why: &str) {
        if let Some((loc, _)) = self.take(name) {
            r.refused(loc, self.name(name), why);
        }
    }

    /// Reports every field nobody took: known harmless ones as ignored, the rest refused.
    pub fn finish(self, r: &mut Report) {
        for (name, loc, _, used) in self.entries {
            if used {
                continue;
            }
            let d = format!("{}.{name}", self.kind);
            match harmless(name) {
                Some(why) => r.ignored(loc, d, why),
                None => r.refused(
                    loc,
                    d,
                    "not translated: the importer does not know this field, so its effect is \
                     not reproduced",
                ),
            }
        }
    }
}

/// Fields that change nothing a client or backend sees, with why.
fn harmless(name: &str) -> Option<&'static str> {
    Some(match name {
        "name" => "a name for Envoy's logs and stats",
        "stat_prefix" => "a prefix of Envoy's stats names",
        "metadata" => "metadata for Envoy's filters and logs",
        "decorator" => "names the span of Envoy's tracing",
        "tracing" => "tracing settings: veloxy exports no traces",
        "alt_stat_name" => "a name for Envoy's stats",
        "track_cluster_stats" | "track_timeout_budgets" => "Envoy's stats",
        "virtual_clusters" => "groups requests for Envoy's stats",
        "traffic_direction" => "a hint for Envoy's stats and tracing",
        "per_connection_buffer_limit_bytes" | "per_request_buffer_limit_bytes" => {
            "Envoy's buffer sizing: veloxy streams through fixed buffers"
        }
        "cleanup_interval" => "Envoy's internal housekeeping",
        "validate_clusters" => "a load-time check of Envoy's",
        "upstream_connection_options" => "TCP keepalive probes to the backends",
        "connection_balance_config" | "enable_reuse_port" | "reuse_port" => {
            "how Envoy spreads connections over its threads: veloxy uses SO_REUSEPORT per worker"
        }
        "ignore_health_on_host_removal" => "Envoy's endpoint bookkeeping under xDS",
        "dns_lookup_family" => "veloxy resolves both A and AAAA records",
        _ => return None,
    })
}

/// An Envoy `google.protobuf.Duration`: `"5s"`, `"0.25s"`, or `{seconds, nanos}`; in
/// milliseconds.
pub fn duration_ms(n: &Node) -> Option<u64> {
    if let Some(m) = n.as_map() {
        let secs = m
            .iter()
            .find(|(k, _)| k.name == "seconds")
            .and_then(|(_, v)| v.scalar()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        let nanos = m
            .iter()
            .find(|(k, _)| k.name == "nanos")
            .and_then(|(_, v)| v.scalar()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        return Some((secs * 1000.0 + nanos / 1e6).round() as u64);
    }
    let s = n.scalar()?;
    let s = s.trim();
    let v: f64 = s.strip_suffix('s').unwrap_or(s).parse().ok()?;
    (v >= 0.0).then(|| (v * 1000.0).round() as u64)
}

/// Milliseconds as a veloxy duration (`"15s"`, `"250ms"`, `"2m"`).
pub fn dur(ms: u64) -> String {
    if ms == 0 {
        "0s".to_string()
    } else if ms.is_multiple_of(86_400_000) {
        format!("{}d", ms / 86_400_000)
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The short type name of a `typed_config` (`envoy.extensions...v3.Router` -> `Router`,
/// with its package: `router.v3.Router`), and its fields (a `TypedStruct` unwrapped).
pub fn typed(node: &Node) -> (String, Option<&Node>) {
    let ty = node
        .get("@type")
        .and_then(|t| t.scalar())
        .unwrap_or_default();
    if ty.ends_with("TypedStruct") {
        let inner = node
            .get("type_url")
            .and_then(|t| t.scalar())
            .unwrap_or_default();
        return (short_type(&inner), node.get("value"));
    }
    (short_type(&ty), Some(node))
}

/// `type.googleapis.com/envoy.extensions.filters.http.router.v3.Router` -> the full message
/// name without the URL (`envoy.extensions.filters.http.router.v3.Router`).
pub fn short_type(url: &str) -> String {
    url.rsplit('/').next().unwrap_or(url).to_string()
}

/// A `core.v3.Address` as `ip:port` (IPv6 bracketed); `Err` names what is unsupported.
pub fn socket_address(n: &Node) -> Result<(String, Option<u16>, bool), String> {
    if n.get("pipe").is_some() {
        return Err("a unix socket (pipe) address: veloxy listens on TCP only".into());
    }
    if n.get("envoy_internal_address").is_some() {
        return Err("an Envoy internal address".into());
    }
    let sa = n
        .get("socket_address")
        .ok_or_else(|| "an address without socket_address".to_string())?;
    if let Some(p) = sa.get("protocol").and_then(|p| p.scalar()) {
        if p.eq_ignore_ascii_case("UDP") {
            return Err("a UDP address".into());
        }
    }
    if sa.get("named_port").is_some() {
        return Err("a named_port".into());
    }
    let addr = sa
        .get("address")
        .and_then(|a| a.scalar())
        .ok_or_else(|| "socket_address without address".to_string())?;
    let port = sa
        .get("port_value")
        .and_then(|p| p.scalar())
        .and_then(|p| p.parse::<u16>().ok());
    let is_ip = addr.parse::<std::net::IpAddr>().is_ok();
    let host = if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]")
    } else {
        addr
    };
    Ok((host, port, is_ip))
}

/// An Envoy header value (with `%COMMAND%` formatters) as a veloxy template; `Err` names the
/// formatter veloxy has no equivalent of.
pub fn header_value(v: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find(['%', '{', '}']) {
        out.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        if c == b'{' || c == b'}' {
            out.push_str(if c == b'{' { "{{" } else { "}}" });
            rest = &rest[i + 1..];
            continue;
        }
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('%') {
            out.push('%');
            rest = a;
            continue;
        }
        let Some(end) = after.find('%') else {
            out.push('%');
            rest = after;
            continue;
        };
        let cmd = &after[..end];
        out.push_str(&formatter(cmd)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// One `%COMMAND%` as a veloxy template variable.
fn formatter(cmd: &str) -> Result<String, String> {
    let simple = match cmd {
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT"
        | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT" => Some("{client_ip}"),
        "DOWNSTREAM_REMOTE_PORT" | "DOWNSTREAM_DIRECT_REMOTE_PORT" => Some("{client_port}"),
        "DOWNSTREAM_REMOTE_ADDRESS" | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS" => {
            Some("{client_ip}:{client_port}")
        }
        "DOWNSTREAM_LOCAL_PORT" => Some("{server_port}"),
        "REQUESTED_SERVER_NAME" => Some("{host}"),
        _ => None,
    };
    if let Some(s) = simple {
        return Ok(s.to_string());
    }
    if let Some(inner) = cmd.strip_prefix("REQ(").and_then(|c| c.strip_suffix(')')) {
        let name = inner.split('?').next().unwrap_or(inner);
        return Ok(match name.to_ascii_lowercase().as_str() {
            ":authority" | "host" => "{authority}".to_string(),
            ":path" => "{uri}".to_string(),
            ":method" => "{method}".to_string(),
            ":scheme" => "{scheme}".to_string(),
            n => format!("{{header.{n}}}"),
        });
    }
    Err(format!("%{cmd}%"))
}

/// A `type.matcher.v3.StringMatcher` (or the legacy `exact_match` forms): the exact value,
/// or what kind of match it is.
pub fn string_match(n: &Node) -> Result<String, String> {
    let ignore_case = n
        .get("ignore_case")
        .and_then(|b| b.as_bool())
        .unwrap_or(false);
    for (k, _) in n.as_map().unwrap_or(&[]) {
        match k.name.as_str() {
            "exact" if !ignore_case => {}
            "ignore_case" => {}
            other if other != "exact" => return Err(format!("a {other} match")),
            _ => return Err("a case-insensitive match".into()),
        }
    }
    n.get("exact")
        .and_then(|e| e.scalar())
        .ok_or_else(|| "an empty string matcher".to_string())
}

/// The elements of a sequence (none when it is not one).
pub fn seq(n: &Node) -> &[Node] {
    n.as_seq().unwrap_or(&[])
}

/// A file data source (`filename`, `inline_string`, `inline_bytes`, `environment_variable`).
pub enum DataSource {
    /// A path, as written.
    File(String),
    /// Inline text.
    Inline(String),
    /// Something veloxy cannot read (named).
    Other(String),
}

/// Reads a `core.v3.DataSource`.
pub fn data_source(n: &Node) -> DataSource {
    if let Some(f) = n.get("filename").and_then(|f| f.scalar()) {
        DataSource::File(f)
    } else if let Some(s) = n.get("inline_string").and_then(|f| f.scalar()) {
        DataSource::Inline(s)
    } else if n.get("inline_bytes").is_some() {
        DataSource::Other("inline_bytes (base64)".into())
    } else if n.get("environment_variable").is_some() {
        DataSource::Other("environment_variable".into())
    } else {
        DataSource::Other("an empty data source".into())
    }
}

/// A proto enum field's value in Envoy's spelling: Envoy parses enum names case-insensitively
/// (`strict_dns` is `STRICT_DNS`), so the name is upper-cased.
pub fn enum_name(n: &Node) -> Option<String> {
    n.scalar().map(|s| s.to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values() {
        assert_eq!(
            header_value("%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%").unwrap(),
            "{client_ip}"
        );
        assert_eq!(header_value("a%%b{c}").unwrap(), "a%b{{c}}");
        assert_eq!(header_value("%REQ(x-user)%").unwrap(), "{header.x-user}");
        assert!(header_value("%START_TIME%").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(dur(15_000), "15s");
        assert_eq!(dur(250), "250ms");
        assert_eq!(dur(120_000), "2m");
    }
}
