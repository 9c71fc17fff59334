//! `[server.acme]` and the listeners' `tls.acme`: which names get ACME certificates, from
//! which CA, and how they prove control.

use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::{absolute, dur};
use crate::acme::rfc2136::{Rfc2136Settings, TsigAlg};
use crate::acme::{AcmeSettings, Challenge, DnsProvider};
use crate::config::error::{ConfigError, Source};
use crate::config::file::{
    AcmeDnsSection, AcmeListenerSection, AcmeNames, AcmeSection, FileConfig, ListenerSection,
    Rfc2136Section,
};
use crate::config::ListenerSpec;

/// A listener's `tls.acme`, as written.
fn acme_of<'a>(file: &'a FileConfig, listener: &str) -> Option<&'a Spanned<AcmeNames>> {
    file.listeners
        .get(listener)?
        .get_ref()
        .tls
        .as_ref()?
        .acme
        .as_ref()
}

/// The routes that apply to `listener` (theirs, and those on every listener).
fn routes_of<'a>(
    file: &'a FileConfig,
    listener: &'a str,
) -> impl Iterator<Item = &'a crate::config::file::RouteSection> + 'a {
    file.routes.iter().map(|r| r.get_ref()).filter(move |r| {
        r.listener
            .as_ref()
            .is_none_or(|n| n.get_ref().as_str() == listener)
    })
}

/// Listed ACME names that no route on their listener serves: a certificate nobody will use
/// (usually a typo in `acme` or in a route's `host`).
pub(super) fn unserved_names(
    src: &Source,
    file: &FileConfig,
    listeners: &[ListenerSpec],
) -> Vec<String> {
    let mut out = Vec::new();
    for l in listeners.iter().filter(|l| !l.acme.is_empty()) {
        let Some(acme) = acme_of(file, &l.name) else {
            continue;
        };
        let hosts: Vec<Option<crate::router::HostMatch>> = routes_of(file, &l.name)
            .map(|r| {
                r.host
                    .as_ref()
                    .and_then(|h| crate::router::HostMatch::parse(h.get_ref()).ok())
            })
            .collect();
        for name in &l.acme {
            let served = hosts
                .iter()
                .any(|h| h.as_ref().is_none_or(|h| h.matches(name.as_bytes())));
            if !served {
                out.push(src.warning(
                    acme.span(),
                    &format!("listeners.{}.tls.acme", l.name),
                    &format!("{name:?}: no route on this listener serves this name"),
                ));
            }
        }
    }
    out
}

/// Fills each TLS listener's ACME names (an explicit list, or the hosts of the routes on it)
/// and compiles `[server.acme]` when any listener uses ACME, and the settings of each
/// listener whose `[listeners.NAME.tls.acme]` table proves its names its own way.
pub(super) fn compile_acme(
    src: &Source,
    file: &FileConfig,
    listeners: &mut [ListenerSpec],
    redis: Option<&crate::fleet::redis::RedisSpec>,
) -> Result<Option<Arc<AcmeSettings>>, ConfigError> {
    let default = AcmeSection::default();
    let server = file.server.acme.as_ref().map_or(&default, |a| a.get_ref());
    let server_challenge = challenge(src, server.challenge.as_ref(), "server.acme.challenge")?;
    let mut any = false;
    // A listener's dns-01 that takes `[server.acme] dns`.
    let mut borrows_dns = false;
    for l in listeners.iter_mut() {
        let Some(acme) = acme_of(file, &l.name) else {
            continue;
        };
        let key = format!("listeners.{}.tls.acme", l.name);
        let table = table_of(acme.get_ref());
        let own = match table {
            Some(t) => challenge(src, t.challenge.as_ref(), &format!("{key}.challenge"))?,
            None => None,
        };
        let effective = own.or(server_challenge);
        let dns01 = effective == Some(Challenge::Dns01);
        l.acme = names(src, &key, acme, file, &l.name, dns01)?;
        any |= !l.acme.is_empty();
        borrows_dns |= !l.acme.is_empty() && dns01 && table.is_none_or(|t| t.dns.is_none());
    }
    if !any {
        return Ok(None);
    }
    let plain_listener = file.listeners.values().any(|l| is_plain_http(l.get_ref()));
    let settings = settings(src, file, plain_listener, redis, borrows_dns)?;
    for l in listeners.iter_mut().filter(|l| !l.acme.is_empty()) {
        let Some(table) = acme_of(file, &l.name).and_then(|a| table_of(a.get_ref())) else {
            continue;
        };
        let key = format!("listeners.{}.tls.acme", l.name);
        l.acme_settings = listener_settings(src, &key, table, &settings)?.map(Arc::new);
    }
    for l in listeners.iter().filter(|l| !l.acme.is_empty()) {
        names_outside_zone(src, file, &settings, l)?;
    }
    one_way_per_name(src, file, &settings, listeners)?;
    Ok(Some(Arc::new(settings)))
}

/// The table form of a listener's `tls.acme`, when it is one.
fn table_of(acme: &AcmeNames) -> Option<&AcmeListenerSection> {
    match acme {
        AcmeNames::Table(t) => Some(t),
        _ => None,
    }
}

/// `challenge = "..."` at `key`.
fn challenge(
    src: &Source,
    c: Option<&Spanned<String>>,
    key: &str,
) -> Result<Option<Challenge>, ConfigError> {
    match c.map(|c| (c.get_ref().as_str(), c.span())) {
        None => Ok(None),
        Some(("http-01", _)) => Ok(Some(Challenge::Http01)),
        Some(("tls-alpn-01", _)) => Ok(Some(Challenge::TlsAlpn01)),
        Some(("dns-01", _)) => Ok(Some(Challenge::Dns01)),
        Some((other, span)) => Err(src.error(
            span,
            key,
            format!("{other:?}: use \"http-01\", \"tls-alpn-01\" or \"dns-01\""),
        )),
    }
}

/// A listener's own settings: `[server.acme]`'s with the table's `challenge`, `dns` and
/// `propagation_timeout` in place of the server's; `None` when the table sets none of them
/// (only `names`).
fn listener_settings(
    src: &Source,
    key: &str,
    t: &AcmeListenerSection,
    server: &AcmeSettings,
) -> Result<Option<AcmeSettings>, ConfigError> {
    if t.challenge.is_none() && t.dns.is_none() && t.propagation_timeout.is_none() {
        return Ok(None);
    }
    let ckey = format!("{key}.challenge");
    let challenge = challenge(src, t.challenge.as_ref(), &ckey)?.or(server.challenge);
    let span = t.challenge.as_ref().map_or(0..0, |c| c.span());
    if challenge == Some(Challenge::Http01) && !server.plain_listener {
        return Err(src.error(
            span,
            ckey,
            "http-01 needs a plain HTTP listener (on port 80, where the CA connects)",
        ));
    }
    let dns = match (&t.dns, challenge) {
        (Some(d), Some(Challenge::Dns01)) => provider(src, d, &format!("{key}.dns"))?,
        (Some(d), _) => {
            return Err(src.error(
                d.span(),
                format!("{key}.dns"),
                "is for challenge = \"dns-01\" (here or in [server.acme])",
            ))
        }
        (None, Some(Challenge::Dns01)) if server.dns == DnsProvider::None => {
            return Err(src.error(
                span,
                ckey,
                "dns-01 needs a dns provider: dns = { command = [\"/usr/local/bin/dns-hook\"] } \
                 here or in [server.acme]",
            ))
        }
        (None, Some(Challenge::Dns01)) => server.dns.clone(),
        (None, _) => DnsProvider::None,
    };
    if challenge != Some(Challenge::Dns01) && t.propagation_timeout.is_some() {
        return Err(src.error(
            span,
            format!("{key}.propagation_timeout"),
            "is for challenge = \"dns-01\" (here or in [server.acme])",
        ));
    }
    Ok(Some(AcmeSettings {
        challenge,
        dns,
        propagation_timeout: dur(&t.propagation_timeout, server.propagation_timeout),
        ..server.clone()
    }))
}

/// One name on two listeners that prove it two ways: which way would win is arbitrary.
fn one_way_per_name(
    src: &Source,
    file: &FileConfig,
    server: &AcmeSettings,
    listeners: &[ListenerSpec],
) -> Result<(), ConfigError> {
    let mut seen: std::collections::BTreeMap<&str, (&str, &AcmeSettings)> = Default::default();
    for l in listeners {
        let own = l.acme_settings.as_deref().unwrap_or(server);
        for name in &l.acme {
            match seen.get(name.as_str()) {
                Some((other, way)) if *way != own => {
                    let span = acme_of(file, &l.name).map_or(0..0, |a| a.span());
                    return Err(src.error(
                        span,
                        format!("listeners.{}.tls.acme", l.name),
                        format!(
                            "{name:?} is also on listener {other:?}, which proves it another way \
                             (challenge or dns): give both listeners the same, or the name to one"
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    seen.insert(name, (&l.name, own));
                }
            }
        }
    }
    Ok(())
}

fn is_plain_http(l: &ListenerSection) -> bool {
    l.tls.is_none() && l.protocol.as_ref().is_none_or(|p| p.get_ref() == "http")
}

/// The names of one listener's `acme`: checked exact DNS names, lowercase, sorted.
fn names(
    src: &Source,
    key: &str,
    acme: &Spanned<AcmeNames>,
    file: &FileConfig,
    listener: &str,
    wildcards: bool,
) -> Result<Vec<String>, ConfigError> {
    let listed: Vec<String> = match acme.get_ref() {
        AcmeNames::All(false) => return Ok(Vec::new()),
        AcmeNames::List(names) => names.clone(),
        AcmeNames::Table(t) if t.names.is_some() => t.names.as_ref().unwrap().get_ref().clone(),
        AcmeNames::All(true) | AcmeNames::Table(_) => routes_of(file, listener)
            .filter_map(|r| r.host.as_ref().map(|h| h.get_ref().to_string()))
            .collect(),
    };
    let mut out = std::collections::BTreeSet::new();
    for name in listed {
        let lower = name.to_ascii_lowercase();
        if lower.contains('*') && !wildcards {
            let own = table_of(acme.get_ref()).and_then(|t| t.challenge.as_ref());
            let why = match own {
                Some(c) => format!(
                    "this listener's challenge is {:?}: wildcard certificates need \"dns-01\"",
                    c.get_ref()
                ),
                None => "wildcard certificates need [server.acme] challenge = \"dns-01\" \
                         (with a dns provider)"
                    .to_owned(),
            };
            return Err(src.error(
                acme.span(),
                key,
                format!("{name:?} is a wildcard: {why}; or list the exact names"),
            ));
        }
        // A wildcard is `*.` and a name: one label, leftmost.
        let bare = lower.strip_prefix("*.").unwrap_or(&lower);
        let valid = !bare.is_empty()
            && !bare.contains('*')
            && bare.parse::<std::net::IpAddr>().is_err()
            && matches!(
                rustls::pki_types::ServerName::try_from(bare),
                Ok(rustls::pki_types::ServerName::DnsName(_))
            );
        if !valid {
            return Err(src.error(
                acme.span(),
                key,
                format!("{name:?} is not a DNS name a CA can issue for"),
            ));
        }
        out.insert(lower);
    }
    if out.is_empty() {
        return Err(src.error(
            acme.span(),
            key,
            "no names: no route on this listener has a `host` (list the names: acme = [\"example.com\"])",
        ));
    }
    Ok(out.into_iter().collect())
}

fn settings(
    src: &Source,
    file: &FileConfig,
    plain_listener: bool,
    redis: Option<&crate::fleet::redis::RedisSpec>,
    borrows_dns: bool,
) -> Result<AcmeSettings, ConfigError> {
    let default = Default::default();
    let a = file.server.acme.as_ref().map_or(&default, |a| a.get_ref());
    let text = |v: &Option<Spanned<String>>| v.as_ref().map(|s| s.get_ref().clone());
    if let Some(e) = &a.email {
        let ok = e.get_ref().contains('@') && !e.get_ref().contains([' ', ':', '<', '>']);
        if !ok {
            return Err(src.error(e.span(), "server.acme.email", "not an email address"));
        }
    }
    let directory = text(&a.directory).unwrap_or_else(|| crate::acme::DEFAULT_DIRECTORY.into());
    if !directory.starts_with("https://") {
        let span = a.directory.as_ref().map_or(0..0, |d| d.span());
        return Err(src.error(span, "server.acme.directory", "must be an https:// URL"));
    }
    let ca_file = match &a.ca_file {
        None => None,
        Some(c) => {
            let p = absolute(&src.relative(c.get_ref()));
            crate::tls::client_config(Some(&p), false)
                .map_err(|e| src.error(c.span(), "server.acme.ca_file", e.to_string()))?;
            Some(p)
        }
    };
    let challenge = challenge(src, a.challenge.as_ref(), "server.acme.challenge")?;
    let dns = dns_provider(src, a, challenge, borrows_dns)?;
    if challenge == Some(Challenge::Http01) && !plain_listener {
        let span = a.challenge.as_ref().map_or(0..0, |c| c.span());
        return Err(src.error(
            span,
            "server.acme.challenge",
            "http-01 needs a plain HTTP listener (on port 80, where the CA connects)",
        ));
    }
    let shared = a.storage.as_ref().is_some_and(|s| s.get_ref() == "redis");
    let redis_url = match (shared, redis) {
        (false, _) => None,
        (true, Some(r)) => Some(r.clone()),
        (true, None) => {
            let span = a.storage.as_ref().map_or(0..0, |s| s.span());
            return Err(src.error(
                span,
                "server.acme.storage",
                "\"redis\" needs [server.redis] (the Redis the instances share)",
            ));
        }
    };
    Ok(AcmeSettings {
        email: text(&a.email),
        directory,
        storage: match &a.storage {
            // Shared storage keeps its local copies in the default folder.
            Some(s) if !shared => absolute(&src.relative(s.get_ref())),
            _ => crate::acme::data_dir("acme"),
        },
        redis: redis_url,
        ca_file,
        challenge,
        renew_before: dur(&a.renew_before, Duration::from_secs(30 * 86400)),
        plain_listener,
        dns,
        propagation_timeout: dur(&a.propagation_timeout, Duration::from_secs(120)),
        resolvers: resolvers(file),
    })
}

/// `dns = { command = [...] }` or `dns = { rfc2136 = {...} }`, which `challenge = "dns-01"`
/// needs (and nothing else takes, unless a listener's dns-01 `borrows` it).
fn dns_provider(
    src: &Source,
    a: &AcmeSection,
    challenge: Option<Challenge>,
    borrows: bool,
) -> Result<DnsProvider, ConfigError> {
    let span = a.challenge.as_ref().map_or(0..0, |c| c.span());
    let Some(dns) = &a.dns else {
        if challenge == Some(Challenge::Dns01) {
            return Err(src.error(
                span,
                "server.acme.challenge",
                "dns-01 needs a dns provider: dns = { command = [\"/usr/local/bin/dns-hook\"] } \
                 or dns = { rfc2136 = { server, zone, key_name, key_file } }",
            ));
        }
        return Ok(DnsProvider::None);
    };
    if challenge != Some(Challenge::Dns01) && !borrows {
        return Err(src.error(
            dns.span(),
            "server.acme.dns",
            "is for challenge = \"dns-01\"",
        ));
    }
    provider(src, dns, "server.acme.dns")
}

/// One `dns = { ... }` table (`key`: where it is).
fn provider(
    src: &Source,
    dns: &Spanned<AcmeDnsSection>,
    key: &str,
) -> Result<DnsProvider, ConfigError> {
    let d = dns.get_ref();
    match (&d.command, &d.rfc2136) {
        (Some(_), Some(_)) => Err(src.error(dns.span(), key, "takes command or rfc2136, not both")),
        (None, Some(r)) => rfc2136(src, r.get_ref(), &format!("{key}.rfc2136"))
            .map(|r| DnsProvider::Rfc2136(Box::new(r))),
        (Some(c), None) if !c.get_ref().is_empty() && !c.get_ref()[0].is_empty() => {
            let mut cmd = c.get_ref().clone();
            cmd[0] = absolute(&src.relative(&cmd[0]))
                .to_string_lossy()
                .into_owned();
            Ok(DnsProvider::Command(cmd))
        }
        (Some(c), None) => Err(src.error(c.span(), format!("{key}.command"), "needs a program")),
        (None, None) => Err(src.error(dns.span(), key, "needs command (or rfc2136)")),
    }
}

/// `rfc2136 = { server, zone, key_name, key_file, algorithm }`: the key file is read here.
fn rfc2136(src: &Source, r: &Rfc2136Section, key: &str) -> Result<Rfc2136Settings, ConfigError> {
    let err = |span: std::ops::Range<usize>, field: &str, msg: String| {
        src.error(span, format!("{key}.{field}"), msg)
    };
    let text = r.server.get_ref();
    let server = text
        .parse::<std::net::SocketAddr>()
        .ok()
        .or_else(|| {
            text.parse::<std::net::IpAddr>()
                .ok()
                .map(|ip| (ip, 53).into())
        })
        .ok_or_else(|| {
            err(
                r.server.span(),
                "server",
                format!("{text:?} is not an address: the primary's IP and port (\"192.0.2.1:53\")"),
            )
        })?;
    let zone = r.zone.get_ref().trim_end_matches('.');
    if hickory_proto::rr::Name::from_ascii(zone).is_err() || zone.is_empty() || zone.contains('*') {
        return Err(err(
            r.zone.span(),
            "zone",
            format!("{zone:?} is not a zone name"),
        ));
    }
    let key_name = r.key_name.get_ref();
    if key_name.is_empty() || hickory_proto::rr::Name::from_ascii(key_name).is_err() {
        return Err(err(
            r.key_name.span(),
            "key_name",
            format!("{key_name:?} is not a key name (the name in the server's `key \"NAME\"`)"),
        ));
    }
    let algorithm = match &r.algorithm {
        None => None,
        Some(a) => Some(TsigAlg::parse(a.get_ref()).ok_or_else(|| {
            err(
                a.span(),
                "algorithm",
                format!(
                    "{:?}: use \"hmac-sha256\", \"hmac-sha384\" or \"hmac-sha512\"",
                    a.get_ref()
                ),
            )
        })?),
    };
    let file = r.key_file.get_ref();
    Rfc2136Settings::load(
        server,
        zone,
        key_name,
        &absolute(&src.relative(file)),
        algorithm,
    )
    .map_err(|e| err(r.key_file.span(), "key_file", format!("{file:?}: {e}")))
}

/// A listener's names whose DNS-01 record would fall outside its rfc2136 `zone`: the server
/// would refuse (NOTZONE) every order for them.
fn names_outside_zone(
    src: &Source,
    file: &FileConfig,
    server: &AcmeSettings,
    l: &ListenerSpec,
) -> Result<(), ConfigError> {
    let settings = l.acme_settings.as_deref().unwrap_or(server);
    let DnsProvider::Rfc2136(r) = &settings.dns else {
        return Ok(());
    };
    let outside = l.acme.iter().find(|n| {
        let bare = n.strip_prefix("*.").unwrap_or(n);
        bare != r.zone && !bare.ends_with(&format!(".{}", r.zone))
    });
    let Some(name) = outside else {
        return Ok(());
    };
    // The zone's key: the listener's own provider's, else the server's.
    let own = acme_of(file, &l.name)
        .and_then(|a| table_of(a.get_ref()))
        .and_then(|t| t.dns.as_ref())
        .map(|d| (d, format!("listeners.{}.tls.acme.dns.rfc2136.zone", l.name)));
    let server_dns = file
        .server
        .acme
        .as_ref()
        .and_then(|a| a.get_ref().dns.as_ref())
        .map(|d| (d, "server.acme.dns.rfc2136.zone".to_owned()));
    let (dns, key) = own
        .or(server_dns)
        .expect("an rfc2136 provider is configured");
    let span = dns
        .get_ref()
        .rfc2136
        .as_ref()
        .map_or(0..0, |r| r.get_ref().zone.span());
    Err(src.error(
        span,
        key,
        format!(
            "{name:?} is not in zone {:?}: its _acme-challenge record cannot be updated there",
            r.zone
        ),
    ))
}

/// `[server] resolvers`, for the DNS-01 propagation check (port 53 unless given).
fn resolvers(file: &FileConfig) -> Vec<std::net::SocketAddr> {
    let list = file
        .server
        .resolvers
        .as_ref()
        .map(|r| r.get_ref().clone())
        .unwrap_or_default();
    list.iter()
        .filter_map(|s| {
            s.parse::<std::net::SocketAddr>()
                .ok()
                .or_else(|| s.parse::<std::net::IpAddr>().ok().map(|ip| (ip, 53).into()))
        })
        .collect()
}
