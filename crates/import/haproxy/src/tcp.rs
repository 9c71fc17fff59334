//! Binds (for every proxy) and `mode tcp` frontends: plain TCP relays become tcp listeners
//! with a `[[streams]]` entry; SNI routing (`use_backend B if { req.ssl_sni -i NAME }`) in
//! front of a local HTTPS frontend becomes SNI passthrough on that frontend's listener.

use std::collections::BTreeMap;

use toml::Value;
use veloxy_import::{Config, Loc, Section};

use crate::backend::Groups;
use crate::frontend::Listener;
use crate::parse::Line;
use crate::proxy::Proxy;
use crate::Ctx;

/// A tcp frontend whose SNI rules wait for the HTTPS listener they pass through on.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The tcp listener made for it.
    pub listener: String,
    /// The names and group of each SNI rule, with its line.
    pub sni: Vec<(Vec<String>, String, Loc)>,
    /// The address of the default backend's server (a local HTTPS bind).
    pub target: Option<String>,
    /// The default backend's group.
    pub default: Option<String>,
    /// The default_backend line.
    pub default_loc: Option<Loc>,
}

/// Listeners for the `bind` lines of `p` (`tcp`: as tcp listeners).
pub fn binds(cx: &mut Ctx, p: &Proxy, tcp: bool) -> Vec<Listener> {
    let lines: Vec<&Line> = p.own.iter().copied().filter(|l| l.kw() == "bind").collect();
    let mut addrs: Vec<(&Line, String)> = Vec::new();
    for l in &lines {
        for a in l.arg(0).unwrap_or_default().split(',') {
            addrs.push((l, a.to_string()));
        }
    }
    if p.kind == "listen" {
        if let Some(a) = p.head.arg(1) {
            addrs.push((p.head, a.to_string()));
        }
    }
    let single = addrs.len() == 1;
    let mut out = Vec::new();
    for (l, a) in addrs {
        if let Some(e) = &l.env_error {
            cx.refuse(l, e.clone());
            continue;
        }
        let addr = match address(&a) {
            Ok(x) => x,
            Err(e) => {
                cx.refuse(l, e);
                continue;
            }
        };
        let port = addr.rsplit(':').next().unwrap_or_default().to_string();
        let base = if single {
            p.name.clone()
        } else {
            format!("{}_{port}", p.name)
        };
        let name = Config::unique(&cx.out.listeners, &base);
        let mut sec = Section::from(&l.loc);
        sec.set("addr", addr.clone());
        let args = if l.kw() == "bind" {
            l.args()[1..].to_vec()
        } else {
            Vec::new()
        };
        let tls = match bind_params(cx, l, &args, &mut sec, tcp) {
            Ok(t) => t,
            Err(e) => {
                cx.refuse(l, e);
                continue;
            }
        };
        if tcp && !tls {
            sec.set("protocol", "tcp");
        }
        cx.binds.push((addr, name.clone()));
        cx.out.listeners.push((name.clone(), sec));
        out.push(Listener { name, tls });
    }
    out
}

/// The ports proxy `p` listens on.
pub fn bind_ports(p: &Proxy) -> Vec<u16> {
    let mut addrs: Vec<&str> = p
        .own
        .iter()
        .filter(|l| l.kw() == "bind")
        .filter_map(|l| l.arg(0))
        .flat_map(|a| a.split(','))
        .collect();
    if p.kind == "listen" {
        addrs.extend(p.head.arg(1));
    }
    addrs
        .iter()
        .filter_map(|a| a.rsplit_once(':').and_then(|(_, port)| port.parse().ok()))
        .collect()
}

/// A bind address as veloxy's `addr`.
fn address(a: &str) -> Result<String, String> {
    let a = a
        .trim_start_matches("ipv4@")
        .trim_start_matches("tcp4@")
        .trim_start_matches("tcp@");
    if a.contains('@') {
        return Err(format!(
            "bind {a}: veloxy listens on TCP addresses only (no unix, abns, fd or quic)"
        ));
    }
    let a = a.trim_start_matches("ipv6@").trim_start_matches("tcp6@");
    let (host, port) = a.rsplit_once(':').ok_or(format!("bind {a}: no port"))?;
    if port.contains('-') || port.parse::<u16>().is_err() {
        return Err(format!("bind {a}: veloxy listens on one port per listener"));
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(match host {
        "" | "*" => format!(":{port}"),
        "::" | ":::" => format!("[::]:{port}"),
        "localhost" => format!("127.0.0.1:{port}"),
        h if h.parse::<std::net::Ipv4Addr>().is_ok() => format!("{h}:{port}"),
        h if h.parse::<std::net::Ipv6Addr>().is_ok() => format!("[{h}]:{port}"),
        h => return Err(format!("bind {h}:{port}: veloxy listens on IP addresses")),
    })
}

/// The bind's parameters; `Ok(true)` for TLS.
fn bind_params(
    cx: &mut Ctx,
    l: &Line,
    args: &[&str],
    sec: &mut Section,
    tcp: bool,
) -> Result<bool, String> {
    let mut tls = false;
    let mut crts: Vec<String> = Vec::new();
    let mut alpn: Option<&str> = None;
    let mut notes = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).copied();
        match args[i] {
            "ssl" => tls = true,
            "crt" => {
                crts.push(v.ok_or("crt needs a file")?.to_string());
                i += 1;
            }
            "alpn" => {
                alpn = v;
                i += 1;
            }
            "proto" => {
                if v == Some("h2") {
                    sec.set("http2", true);
                }
                i += 1;
            }
            "crt-list" => return Err("crt-list: name the certificates with crt".into()),
            "accept-proxy" => return Err("accept-proxy: veloxy takes PROXY headers only from [server] trusted_proxies; add the load balancer's addresses and set proxy_protocol = true".into()),
            "verify" | "ca-file" | "crl-file" | "ca-verify-file" if v != Some("none") => {
                return Err("client certificates (verify/ca-file): veloxy has no mutual TLS".into())
            }
            "maxconn" => {
                if let Some(n) = v.and_then(|n| n.parse::<i64>().ok()) {
                    sec.set("max_connections", n);
                }
                notes.push("maxconn: beyond it veloxy answers 503 at once".to_string());
                i += 1;
            }
            "strict-sni" => notes.push("strict-sni: veloxy answers other names with its default certificate".into()),
            "ssl-min-ver" | "ssl-max-ver" | "ciphers" | "ciphersuites" | "curves" | "ecdhe" | "npn"
            | "name" | "process" | "thread" | "interface" | "mode" | "user" | "group" | "level"
            | "backlog" | "mss" | "id" | "nice" | "namespace" | "tcp-ut" | "severity-output"
            | "sigalgs" | "client-sigalgs" | "dhparam" | "shards" | "label" | "gid" | "uid" => i += 1,
            "v4v6" | "v6only" | "transparent" | "defer-accept" | "tfo" | "no-sslv3" | "no-tlsv10"
            | "no-tlsv11" | "no-tlsv12" | "no-tlsv13" | "force-tlsv12" | "force-tlsv13" | "no-tls-tickets"
            | "prefer-client-ciphers" | "allow-0rtt" | "no-ca-names" | "crt-ignore-err" | "ca-ignore-err"
            | "generate-certificates" | "expose-fd" | "quic-force-retry" => {}
            "verify" => i += 1,
            other => return Err(format!("bind option {other}: not translated")),
        }
        i += 1;
    }
    if tls {
        if tcp {
            return Err(
                "TLS termination in mode tcp: veloxy's tcp listeners relay bytes as they are"
                    .into(),
            );
        }
        let Some(first) = crts.first() else {
            return Err("ssl without crt".into());
        };
        let mut t = toml::Table::new();
        let (cert, key) = pem_pair(cx, first)?;
        t.insert("cert".into(), cert.into());
        t.insert("key".into(), key.into());
        let mut extra = Vec::new();
        for c in &crts[1..] {
            let (cert, key) = pem_pair(cx, c)?;
            let names = cert_names(&cx.local(cx.crt_base.clone().as_deref(), c)).ok_or(format!(
                "crt {c}: cannot read its names (veloxy picks extra certificates by name)"
            ))?;
            let mut e = toml::Table::new();
            e.insert(
                "hosts".into(),
                Value::Array(names.into_iter().map(Value::from).collect()),
            );
            e.insert("cert".into(), cert.into());
            e.insert("key".into(), key.into());
            extra.push(Value::Table(e));
        }
        if !extra.is_empty() {
            t.insert("certs".into(), Value::Array(extra));
        }
        sec.set("tls", Value::Table(t));
        let h2 = alpn.is_some_and(|a| a.split(',').any(|p| p == "h2"));
        if !h2 {
            sec.set("http2", false);
        }
    }
    if notes.is_empty() {
        cx.ok(l);
    } else {
        for n in notes {
            cx.diff(l, n);
        }
    }
    Ok(tls)
}

/// The cert and key paths of a HAProxy `crt` PEM: the same file when it holds both (veloxy
/// reads the certificates and the key from it), else `FILE.key` beside it.
fn pem_pair(cx: &Ctx, crt: &str) -> Result<(String, String), String> {
    let base = cx.crt_base.clone();
    let local = cx.local(base.as_deref(), crt);
    if local.is_dir() {
        return Err(format!(
            "crt {crt} is a directory: name each certificate file"
        ));
    }
    let cert = cx.path(base.as_deref(), crt);
    let has_key = std::fs::read_to_string(&local)
        .map(|t| t.contains("PRIVATE KEY"))
        .unwrap_or(true);
    if has_key {
        return Ok((cert.clone(), cert));
    }
    let key = format!("{crt}.key");
    Ok((cert, cx.path(base.as_deref(), &key)))
}

/// The DNS names of the first certificate in a PEM file.
fn cert_names(path: &std::path::Path) -> Option<Vec<String>> {
    let data = std::fs::read(path).ok()?;
    for pem in x509_parser::pem::Pem::iter_from_buffer(&data) {
        let pem = pem.ok()?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        let cert = pem.parse_x509().ok()?;
        let mut names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                    names.push(d.to_string());
                }
            }
        }
        if names.is_empty() {
            for cn in cert.subject().iter_common_name() {
                names.extend(cn.as_str().ok().map(str::to_string));
            }
        }
        return (!names.is_empty()).then_some(names);
    }
    None
}

/// Translates tcp frontend `p`.
pub fn translate(
    cx: &mut Ctx,
    p: &Proxy,
    backends: &BTreeMap<String, &Proxy>,
    groups: &Groups,
    _all: &[Proxy],
) {
    cx.ok(p.head);
    let listeners = binds(cx, p, true);
    let acls = crate::rules::acls(cx, p, &bind_ports(p));
    let mut pending = Pending {
        listener: listeners
            .first()
            .map(|l| l.name.clone())
            .unwrap_or_default(),
        sni: Vec::new(),
        target: None,
        default: None,
        default_loc: None,
    };
    let group = |cx: &mut Ctx, l: &Line, name: &str| -> Option<String> {
        match groups.by_name.get(name) {
            Some(g) if g.upstream.is_some() => g.upstream.clone(),
            Some(_) => {
                cx.refuse(l, format!("backend {name} has no usable server"));
                None
            }
            None => {
                cx.refuse(l, format!("backend {name} is not defined"));
                None
            }
        }
    };
    for l in p.lines() {
        match (l.kw(), l.arg(0)) {
            ("mode", _) => cx.ok(l),
            ("log", _)
            | ("option", Some("tcplog" | "dontlognull" | "logasap" | "log-health-checks")) => {
                cx.ignore(l, "logging: no effect on what clients or backends see")
            }
            (
                "option",
                Some(
                    "tcpka" | "clitcpka" | "srvtcpka" | "splice-auto" | "nolinger" | "redispatch"
                    | "abortonclose",
                ),
            ) => cx.ignore(l, "connection handling"),
            ("tcp-request", Some("inspect-delay")) => cx.ok(l),
            ("tcp-request", Some("content")) if l.arg(1) == Some("accept") => cx.ok(l),
            ("tcp-request" | "tcp-response", _) => cx.refuse(
                l,
                "tcp rules other than accepting a TLS ClientHello: not translated",
            ),
            ("timeout", Some("client" | "tunnel")) => cx.ok(l),
            ("timeout", Some("client-fin" | "server-fin")) => {
                cx.ignore(l, "half-closed connection tuning")
            }
            ("use_backend", Some(b)) => {
                let words: Vec<String> = l.words[2..].iter().map(|w| w.text.clone()).collect();
                let cond = match crate::acl::condition(&words, &acls, &cx.base) {
                    Ok(c) => c,
                    Err(e) => {
                        cx.refuse(l, e);
                        continue;
                    }
                };
                match cond.dnf.as_slice() {
                    [t] if t.sni.is_some()
                        && t.guards.is_empty()
                        && t.negs.is_empty()
                        && t.m == Default::default() =>
                    {
                        if let Some(u) = group(cx, l, b) {
                            pending
                                .sni
                                .push((t.sni.clone().unwrap_or_default(), u, l.loc.clone()));
                        }
                    }
                    _ => cx.refuse(
                        l,
                        "a tcp rule veloxy cannot express: it routes tcp by SNI only",
                    ),
                }
            }
            ("default_backend", Some(b)) => {
                if let Some(u) = group(cx, l, b) {
                    pending.default = Some(u);
                    pending.default_loc = Some(l.loc.clone());
                    pending.target = backends.get(b).and_then(|bp| {
                        bp.own
                            .iter()
                            .find(|x| x.kw() == "server")
                            .and_then(|x| x.arg(1))
                            .map(str::to_string)
                    });
                    cx.ok(l);
                }
            }
            _ => {}
        }
    }
    if p.kind == "listen" {
        if let Some(u) = groups.by_name.get(&p.name).and_then(|g| g.upstream.clone()) {
            pending.default = Some(u);
            pending.default_loc = Some(p.head.loc.clone());
        }
    }
    if !listeners.is_empty() {
        cx.pending.push(pending);
    }
}

/// Resolves the SNI passthrough of tcp frontends once every listener exists.
pub fn merge_passthrough(cx: &mut Ctx) {
    let pending = std::mem::take(&mut cx.pending);
    for p in pending {
        let https = p.target.as_deref().and_then(|t| local_bind(cx, t));
        if !p.sni.is_empty() {
            if let Some(h) = https {
                // The HTTPS frontend now listens where the tcp frontend did.
                let addr = veloxy_import::model::named(&mut cx.out.listeners, &p.listener)
                    .and_then(|s| s.get("addr").cloned());
                cx.out.listeners.retain(|(n, _)| *n != p.listener);
                if let (Some(a), Some(sec)) =
                    (addr, veloxy_import::model::named(&mut cx.out.listeners, &h))
                {
                    sec.set("addr", a);
                }
                for (names, up, loc) in &p.sni {
                    let mut s = Section::from(loc);
                    s.set("listener", h.clone());
                    s.set(
                        "sni",
                        Value::Array(names.iter().map(|n| Value::from(n.as_str())).collect()),
                    );
                    s.set("upstream", up.clone());
                    cx.out.streams.push(s);
                    cx.ok_loc(loc);
                }
                if let Some(d) = &p.default {
                    cx.out.upstreams.retain(|(n, _)| n != d);
                }
                continue;
            }
            for (_, _, loc) in &p.sni {
                cx.refuse_loc(loc, "SNI passthrough: veloxy passes TLS through by name on a listener that terminates the other names itself; the default_backend must be a local HTTPS frontend");
            }
        }
        match &p.default {
            Some(d) => {
                let mut s = Section::from(p.default_loc.as_ref().expect("with default"));
                s.set("listener", p.listener.clone());
                s.set("upstream", d.clone());
                cx.out.streams.push(s);
            }
            None => cx.out.listeners.retain(|(n, _)| *n != p.listener),
        }
    }
}

/// The HTTPS listener bound at `addr` (a server address pointing back at this HAProxy).
fn local_bind(cx: &Ctx, addr: &str) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    cx.binds.iter().find_map(|(a, name)| {
        let (bh, bp) = a.rsplit_once(':')?;
        let same_host = bh == host || bh.is_empty() || bh == "0.0.0.0" || bh == "[::]";
        let tls = cx
            .out
            .listeners
            .iter()
            .any(|(n, s)| n == name && s.get("tls").is_some());
        (bp == port && same_host && tls).then(|| name.clone())
    })
}
