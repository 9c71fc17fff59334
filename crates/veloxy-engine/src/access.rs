//! Access control by address: a route's `allow` / `deny` lists, and the real client address
//! behind trusted proxies (`[server] trusted_proxies`, `client_ip_header`).

use std::net::IpAddr;

use ipnet::IpNet;

/// A list of networks: `"10.0.0.0/8"`, `"2001:db8::/32"`, or a single address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpList(Vec<IpNet>);

impl IpList {
    /// Parses each entry; the error names the first bad one.
    pub fn parse(entries: &[String]) -> Result<IpList, String> {
        let mut nets = Vec::with_capacity(entries.len());
        for e in entries {
            let net = match e.parse::<IpNet>() {
                Ok(n) => n.trunc(),
                Err(_) => match e.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => {
                        return Err(format!(
                            "{e:?} is not an address or network (use \"10.0.0.0/8\", \"2001:db8::/32\" or \"127.0.0.1\")"
                        ))
                    }
                },
            };
            nets.push(net);
        }
        Ok(IpList(nets))
    }

    /// `ip` (IPv4-mapped IPv6 addresses compared as IPv4) is in one of the networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|n| n.contains(&ip))
    }

    /// The entries, for `veloxy check --print`.
    pub fn entries(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|n| match n.prefix_len() == n.max_prefix_len() {
                true => n.addr().to_string(),
                false => n.to_string(),
            })
            .collect()
    }
}

/// A route's `allow` and `deny`: deny wins; with `allow` set, everyone else is refused.
#[derive(Debug, Clone, Default)]
pub struct IpRules {
    /// `allow`; `None`: everyone not denied.
    pub allow: Option<IpList>,
    /// `deny`.
    pub deny: IpList,
}

impl IpRules {
    /// The client at `ip` may use the route.
    pub fn permits(&self, ip: IpAddr) -> bool {
        !self.deny.contains(ip) && self.allow.as_ref().is_none_or(|a| a.contains(ip))
    }
}

/// Where the client's real address comes from behind trusted proxies.
#[derive(Debug, Clone)]
pub struct RealIp {
    /// `trusted_proxies`.
    pub trusted: IpList,
    /// `client_ip_header`, lowercase (`x-forwarded-for` by default, or e.g. `x-real-ip`).
    pub header: String,
}

impl RealIp {
    /// The client's address when the peer is trusted and the header names one: the
    /// rightmost address of the field's values that is not itself a trusted proxy (all of
    /// them trusted: the leftmost). `None` (use the peer) when the peer is not trusted, the
    /// field is absent, or an entry on that walk is not an address.
    pub fn client<'a>(
        &self,
        peer: IpAddr,
        values: impl DoubleEndedIterator<Item = &'a [u8]>,
    ) -> Option<IpAddr> {
        if !self.trusted.contains(peer) {
            return None;
        }
        let mut last = None;
        for value in values.rev() {
            for item in value.rsplit(|&b| b == b',') {
                let item = std::str::from_utf8(item.trim_ascii()).ok()?;
                if item.is_empty() {
                    continue;
                }
                let ip = parse_entry(item)?;
                if !self.trusted.contains(ip) {
                    return Some(ip.to_canonical());
                }
                last = Some(ip.to_canonical());
            }
        }
        last
    }
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:80`.
fn parse_entry(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    s.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> IpList {
        IpList::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn lists_and_rules() {
        let l = list(&["10.0.0.0/8", "2001:db8::/32", "127.0.0.1"]);
        assert!(l.contains("10.1.2.3".parse().unwrap()));
        assert!(l.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(l.contains("2001:db8::5".parse().unwrap()));
        assert!(!l.contains("127.0.0.2".parse().unwrap()));
        assert!(IpList::parse(&["10.0.0.0/33".into()]).is_err());
        assert!(IpList::parse(&["nope".into()]).is_err());
        let rules = IpRules {
            allow: Some(list(&["10.0.0.0/8"])),
            deny: list(&["10.0.0.9"]),
        };
        assert!(rules.permits("10.0.0.1".parse().unwrap()));
        assert!(!rules.permits("10.0.0.9".parse().unwrap()), "deny wins");
        assert!(!rules.permits("192.168.0.1".parse().unwrap()));
    }

    #[test]
    fn real_ip_is_the_rightmost_untrusted_address() {
        let r = RealIp {
            trusted: list(&["10.0.0.0/8"]),
            header: "x-forwarded-for".into(),
        };
        let from = |peer: &str, values: &[&str]| {
            r.client(peer.parse().unwrap(), values.iter().map(|v| v.as_bytes()))
                .map(|ip| ip.to_string())
        };
        assert_eq!(
            from("10.0.0.1", &["6.6.6.6, 1.2.3.4, 10.0.0.7"]).as_deref(),
            Some("1.2.3.4")
        );
        assert_eq!(
            from("10.0.0.1", &["6.6.6.6", "1.2.3.4"]).as_deref(),
            Some("1.2.3.4")
        );
        assert_eq!(from("192.168.1.1", &["1.2.3.4"]), None, "untrusted peer");
        assert_eq!(from("10.0.0.1", &["10.0.0.5"]).as_deref(), Some("10.0.0.5"));
        assert_eq!(
            from("10.0.0.1", &["junk, 1.2.3.4"]).as_deref(),
            Some("1.2.3.4")
        );
        assert_eq!(from("10.0.0.1", &["1.2.3.4, junk"]), None);
        assert_eq!(
            from("10.0.0.1", &["[2001:db8::1]:443"]).as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(from("10.0.0.1", &[]), None);
    }
}
