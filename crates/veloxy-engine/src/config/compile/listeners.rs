//! `[listeners.NAME]`: addresses, HTTP/2 settings and TLS termination with SNI certificates.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::{absolute, dur, resolve, valid_name};
use crate::config::error::{ConfigError, Source};
use crate::config::file::{ListenerSection, ServerSection, TlsSection};
use crate::config::{ListenerSpec, Settings, TlsFiles};
use crate::late::Late;
use crate::tls::LiveCerts;

/// Compiles every listener, with empty routers (routes are added afterwards). Returns the
/// addresses taken, by listener name, for the admin address check.
pub(super) fn compile_listeners<'a>(
    src: &Source,
    sections: &'a BTreeMap<String, Spanned<ListenerSection>>,
    certs: &Late<dyn LiveCerts>,
) -> Result<(Vec<ListenerSpec>, HashMap<SocketAddr, &'a str>), ConfigError> {
    if sections.is_empty() {
        return Err(src.whole("no listeners: add a [listeners.NAME] table with an addr"));
    }
    let mut listeners = Vec::with_capacity(sections.len());
    let mut seen_addrs: HashMap<SocketAddr, &str> = HashMap::new();
    for (name, section) in sections {
        let key = format!("listeners.{name}");
        if !valid_name(name) {
            return Err(src.error(
                section.span(),
                &key,
                "names use letters, digits, '_', '-' and '.'",
            ));
        }
        let a = &section.get_ref().addr;
        let addr =
            resolve(a.get_ref()).map_err(|m| src.error(a.span(), format!("{key}.addr"), m))?;
        // Port 0 asks the system for a free port, so two of them never clash.
        if addr.port() != 0 {
            if let Some((other_addr, other)) = seen_addrs.iter().find(|(o, _)| overlaps(**o, addr))
            {
                let how = if *other_addr == addr {
                    format!("address {addr} is already used by listener {other:?}")
                } else {
                    format!(
                        "{addr} overlaps listener {other:?} ({other_addr}): a wildcard address \
                         takes the port on every address of its family; use one of the two"
                    )
                };
                return Err(src.error(a.span(), format!("{key}.addr"), how));
            }
            seen_addrs.insert(addr, name);
        }
        listeners.push(compile_listener(src, &key, name, addr, section, certs)?);
    }
    Ok((listeners, seen_addrs))
}

/// One listener's settings past its address.
fn compile_listener(
    src: &Source,
    key: &str,
    name: &str,
    addr: SocketAddr,
    section: &Spanned<ListenerSection>,
    certs: &Late<dyn LiveCerts>,
) -> Result<ListenerSpec, ConfigError> {
    let l = section.get_ref();
    let http2_set = l.http2.as_ref().map(|h| *h.get_ref());
    let http2 = http2_set.unwrap_or(l.tls.is_some());
    let mut local_ca = Vec::new();
    let (tls, tls_files) = match &l.tls {
        None => (None, Vec::new()),
        Some(t) => {
            let (config, files, local) =
                compile_tls(src, &format!("{key}.tls"), t, section.span(), http2, certs)?;
            local_ca = local;
            (Some(config), files)
        }
    };
    let streams = l
        .h2_max_concurrent_streams
        .as_ref()
        .map_or(128, |v| *v.get_ref());
    if streams == 0 {
        let span = l
            .h2_max_concurrent_streams
            .as_ref()
            .map(|v| v.span())
            .unwrap_or(0..0);
        return Err(src.error(
            span,
            format!("{key}.h2_max_concurrent_streams"),
            "must be at least 1",
        ));
    }
    let tcp = match l
        .protocol
        .as_ref()
        .map(|p| (p.get_ref().as_str(), p.span()))
    {
        None | Some(("http", _)) => false,
        Some(("tcp", span)) => {
            if l.tls.is_some() {
                return Err(src.error(
                    span,
                    format!("{key}.protocol"),
                    "a tcp listener is plain: TLS passthrough by SNI is not built yet",
                ));
            }
            true
        }
        Some((other, span)) => {
            return Err(src.error(
                span,
                format!("{key}.protocol"),
                format!("{other:?}: use \"http\" or \"tcp\""),
            ))
        }
    };
    let redirect_https = match (&l.redirect_https, &l.https_port) {
        (Some(r), _) if *r.get_ref() && l.tls.is_some() => {
            return Err(src.error(
                r.span(),
                format!("{key}.redirect_https"),
                "is for plain listeners: this one already serves HTTPS",
            ))
        }
        (Some(r), port) if *r.get_ref() => Some(port.as_ref().map_or(443, |p| *p.get_ref())),
        _ => None,
    };
    let plain_http = plain_http(src, key, l)?;
    Ok(ListenerSpec {
        name: name.to_owned(),
        addr,
        router: Arc::default(),
        redirect_https,
        plain_http,
        proxy_protocol: l.proxy_protocol.as_ref().is_some_and(|p| *p.get_ref()),
        tcp,
        // Set by the listener's `[[streams]]` entries.
        stream: None,
        sni_streams: Vec::new(),
        max_connections: l.max_connections.as_ref().map_or(0, |m| *m.get_ref()),
        tls,
        tls_files,
        http2,
        h2_max_concurrent_streams: streams,
        upgrade_idle_timeout: dur(&l.upgrade_idle_timeout, Duration::from_secs(600)),
        // Filled once routes are known (`acme = true` takes their hosts).
        acme: Vec::new(),
        acme_settings: None,
        local_ca,
        http3: None,
    })
}

/// The admin socket uses SO_REUSEPORT too (for upgrades), so on a listener's address it
/// would silently share that listener's port instead of failing to bind.
pub(super) fn check_admin_addr(
    src: &Source,
    s: &ServerSection,
    settings: &Settings,
    seen_addrs: &HashMap<SocketAddr, &str>,
) -> Result<(), ConfigError> {
    if let (Some(admin), Some(spanned)) = (settings.admin, &s.admin) {
        if let Some((addr, other)) = seen_addrs.iter().find(|(o, _)| overlaps(**o, admin)) {
            return Err(src.error(
                spanned.span(),
                "server.admin",
                format!("address {admin} is already used by listener {other:?} ({addr})"),
            ));
        }
    }
    Ok(())
}

/// Loads `cert` and `key` of the table `table`, for the SNI names `hosts`. An error points at
/// the line of the file it is about: a missing, unreadable or mismatched key at `key = `,
/// anything else at `cert = `.
fn load_pair(
    src: &Source,
    table: &str,
    hosts: &[String],
    cert: &Spanned<String>,
    key: &Spanned<String>,
) -> Result<(crate::tls::CertEntry, TlsFiles), ConfigError> {
    let (cert_path, key_path) = (src.relative(cert.get_ref()), src.relative(key.get_ref()));
    let certified = crate::tls::load_certified_key(&cert_path, &key_path).map_err(|e| {
        if e.is_about_key(&cert_path, &key_path) {
            src.error(key.span(), format!("{table}.key"), e.to_string())
        } else {
            src.error(cert.span(), format!("{table}.cert"), e.to_string())
        }
    })?;
    let entry = crate::tls::CertEntry {
        hosts: hosts.to_vec(),
        key: Arc::new(certified),
    };
    let files = TlsFiles {
        hosts: hosts.to_vec(),
        cert: absolute(&cert_path),
        key: absolute(&key_path),
    };
    Ok((entry, files))
}

/// A listener's rustls config, its certificate files, and its `local_ca` names.
type CompiledTls = (Arc<rustls::ServerConfig>, Vec<TlsFiles>, Vec<String>);

/// Loads a listener's certificates and builds its rustls config, whose resolver reads the
/// snapshot's `certs` slot (the runtime's ACME store, bound later); also returns the files.
fn compile_tls(
    src: &Source,
    key: &str,
    t: &TlsSection,
    span: Range<usize>,
    http2: bool,
    certs: &Late<dyn LiveCerts>,
) -> Result<CompiledTls, ConfigError> {
    let local = local_ca_names(src, key, t)?;
    if !local.is_empty() {
        let config = crate::tls::server_config(
            Vec::new(),
            http2,
            false,
            local.first().cloned(),
            certs.clone(),
        )
        .map_err(|e| src.error(span.clone(), key, e.to_string()))?;
        return Ok((config, Vec::new(), local));
    }
    let mut entries = Vec::new();
    let mut files = Vec::new();
    match (&t.cert, &t.key) {
        (Some(c), Some(k)) => {
            let (entry, f) = load_pair(src, key, &[], c, k)?;
            entries.push(entry);
            files.push(f);
        }
        (Some(c), None) => {
            return Err(src.error(c.span(), format!("{key}.key"), "cert needs a key"))
        }
        (None, Some(k)) => {
            return Err(src.error(k.span(), format!("{key}.cert"), "key needs a cert"))
        }
        (None, None) => {}
    }
    for (i, c) in t.certs.iter().enumerate() {
        let ckey = format!("{key}.certs[{i}]");
        let e = c.get_ref();
        if e.hosts.get_ref().is_empty() {
            return Err(src.error(
                e.hosts.span(),
                format!("{ckey}.hosts"),
                "needs at least one host name",
            ));
        }
        for h in e.hosts.get_ref().iter().filter(|h| *h != "*") {
            let bare = h.strip_prefix("*.").unwrap_or(h);
            if bare.is_empty()
                || bare.contains('*')
                || rustls::pki_types::ServerName::try_from(bare).is_err()
            {
                return Err(src.error(
                    e.hosts.span(),
                    format!("{ckey}.hosts"),
                    format!("{h:?} is not a host name (exact, *.domain, or * for any)"),
                ));
            }
        }
        let (entry, f) = load_pair(src, &ckey, e.hosts.get_ref(), &e.cert, &e.key)?;
        entries.push(entry);
        files.push(f);
    }
    let acme = t
        .acme
        .as_ref()
        .is_some_and(|a| !matches!(a.get_ref(), crate::config::file::AcmeNames::All(false)));
    if entries.is_empty() && !acme {
        return Err(src.error(
            span.clone(),
            key,
            "needs cert and key, [[...tls.certs]] entries, or acme",
        ));
    }
    let config = crate::tls::server_config(entries, http2, acme, None, certs.clone())
        .map_err(|e| src.error(span.clone(), key, e.to_string()))?;
    Ok((config, files, Vec::new()))
}

/// `local_ca = true`: the names of its certificate (lowercase; default localhost, 127.0.0.1
/// and ::1), each a host name or an IP address; alone (no cert, certs or acme beside it).
/// `names` without `local_ca` is refused.
fn local_ca_names(src: &Source, key: &str, t: &TlsSection) -> Result<Vec<String>, ConfigError> {
    let on = t.local_ca.as_ref().is_some_and(|v| *v.get_ref());
    if !on {
        if let Some(n) = &t.names {
            return Err(src.error(
                n.span(),
                format!("{key}.names"),
                "names the local CA's certificate: set local_ca = true",
            ));
        }
        return Ok(Vec::new());
    }
    let span = t.local_ca.as_ref().map(|v| v.span()).unwrap_or_default();
    let beside = [
        ("cert", t.cert.is_some()),
        ("certs", !t.certs.is_empty()),
        ("acme", t.acme.is_some()),
    ];
    if let Some((other, _)) = beside.iter().find(|(_, set)| *set) {
        return Err(src.error(
            span,
            format!("{key}.local_ca"),
            format!("the local CA issues this listener's certificate: drop {other}, or local_ca"),
        ));
    }
    let names: Vec<String> = match &t.names {
        None => ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec(),
        Some(n) => n.get_ref().iter().map(|s| s.to_ascii_lowercase()).collect(),
    };
    let bad = names.iter().find(|n| {
        n.parse::<std::net::IpAddr>().is_err()
            && (n.contains('*') || rustls::pki_types::ServerName::try_from(n.as_str()).is_err())
    });
    if let (Some(b), Some(n)) = (bad, &t.names) {
        return Err(src.error(
            n.span(),
            format!("{key}.names"),
            format!("{b:?} is not a host name or an IP address"),
        ));
    }
    if names.is_empty() {
        let s = t.names.as_ref().map(|n| n.span()).unwrap_or(span);
        return Err(src.error(s, format!("{key}.names"), "needs at least one name"));
    }
    Ok(names)
}

/// Two listening addresses that cannot both be bound: the same port, the same family (IPv6
/// sockets are IPv6-only, so `0.0.0.0:80` and `[::]:80` coexist, as in nginx), and the same
/// address or a wildcard on either side.
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `plain_http`: one of its three values, on a TLS listener only.
fn plain_http(
    src: &Source,
    key: &str,
    l: &ListenerSection,
) -> Result<Option<crate::config::PlainHttp>, ConfigError> {
    use crate::config::PlainHttp;
    let Some(v) = &l.plain_http else {
        return Ok(None);
    };
    let mode = match v.get_ref().as_str() {
        "redirect" => PlainHttp::Redirect,
        "serve" => PlainHttp::Serve,
        "reject" => PlainHttp::Reject,
        other => {
            return Err(src.error(
                v.span(),
                format!("{key}.plain_http"),
                format!("{other:?}: use \"redirect\", \"serve\" or \"reject\""),
            ))
        }
    };
    if l.tls.is_none() {
        return Err(src.error(
            v.span(),
            format!("{key}.plain_http"),
            "is for TLS listeners: this one serves plain HTTP already (see redirect_https)",
        ));
    }
    Ok(Some(mode))
}
