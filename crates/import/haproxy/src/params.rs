//! The parameters of `server` and `default-server` lines.

/// Server parameters that take a value.
const VALUED: &[&str] = &[
    "inter",
    "fastinter",
    "downinter",
    "rise",
    "fall",
    "weight",
    "maxconn",
    "maxqueue",
    "minconn",
    "cookie",
    "port",
    "addr",
    "ca-file",
    "crt",
    "verify",
    "sni",
    "alpn",
    "proto",
    "slowstart",
    "resolvers",
    "resolve-prefer",
    "resolve-opts",
    "resolve-net",
    "init-addr",
    "on-error",
    "on-marked-down",
    "on-marked-up",
    "observe",
    "error-limit",
    "id",
    "check-sni",
    "check-alpn",
    "check-proto",
    "agent-port",
    "agent-inter",
    "agent-addr",
    "agent-send",
    "ciphers",
    "ciphersuites",
    "pool-max-conn",
    "pool-purge-delay",
    "pool-low-conn",
    "redir",
    "track",
    "namespace",
    "source",
    "usesrc",
    "ws",
    "ssl-min-ver",
    "ssl-max-ver",
    "verifyhost",
    "tcp-ut",
    "crl-file",
    "curves",
    "sigalgs",
    "client-sigalgs",
    "max-reuse",
    "log-proto",
    "hash-key",
    "set-proxy-v2-tlv-fmt",
    "guid",
    "shard",
    "check-pool-conn-name",
];

/// Parameters that change nothing clients or backends see.
pub(crate) const QUIET: &[&str] = &[
    "id",
    "resolve-prefer",
    "resolve-opts",
    "resolve-net",
    "init-addr",
    "no-tls-tickets",
    "force-tlsv12",
    "force-tlsv13",
    "no-sslv3",
    "no-tlsv10",
    "no-tlsv11",
    "ssl-min-ver",
    "ssl-max-ver",
    "ciphers",
    "ciphersuites",
    "curves",
    "sigalgs",
    "tfo",
    "pool-max-conn",
    "pool-purge-delay",
    "pool-low-conn",
    "max-reuse",
    "check-ssl",
    "check-sni",
    "check-alpn",
    "check-proto",
    "enabled",
    "non-stick",
    "error-limit",
    "on-error",
    "fastinter",
    "downinter",
    "maxqueue",
    "minconn",
    "ws",
    "no-check",
    "check-send-proxy",
    "verifyhost",
    "log-proto",
    "tcp-ut",
    "guid",
    "shard",
    "allow-0rtt",
    "no-ssl-reuse",
    "ssl-reuse",
    "no-tls-tickets",
];

/// A server line's parameters, in order.
pub fn params(words: &[&str]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let k = words[i];
        if VALUED.contains(&k) {
            out.push((k.to_string(), words.get(i + 1).map(|s| s.to_string())));
            i += 2;
        } else {
            out.push((k.to_string(), None));
            i += 1;
        }
    }
    out
}

pub(crate) fn get<'p>(p: &'p [(String, Option<String>)], k: &str) -> Option<&'p str> {
    p.iter()
        .rev()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_deref().unwrap_or(""))
}

pub(crate) fn has(p: &[(String, Option<String>)], k: &str) -> bool {
    let neg = format!("no-{k}");
    for (n, _) in p.iter().rev() {
        if n == k {
            return true;
        }
        if *n == neg {
            return false;
        }
    }
    false
}
