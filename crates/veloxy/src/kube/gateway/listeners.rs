//! Gateway listeners: the veloxy listener each is served on, the route kinds it takes, its
//! HTTPS certificates (TLS Secrets, another namespace's with a ReferenceGrant). TCP
//! listeners need a `protocol = "tcp"` listener of the file on their port; TLS listeners
//! (Passthrough) go on one, or on a TLS listener, whose other names veloxy terminates.

use std::collections::BTreeSet;
use std::path::Path;

use toml::{Table, Value};
use veloxy_engine::config::KubernetesSpec;

use super::types::{Gateway, Listener, GROUP};
use super::{backends, ListenerReport, Translation};
use crate::kube::events::Problem;
use crate::kube::objects::{id, World};

/// A Gateway listener's report: the veloxy listener serving it, its certificates.
pub(super) fn listener(
    world: &World,
    spec: &KubernetesSpec,
    file: &Table,
    gw: &Gateway,
    l: &Listener,
    t: &mut Translation,
) -> ListenerReport {
    let mut r = ListenerReport {
        name: l.name.clone(),
        kinds: Vec::new(),
        attached: 0,
        accepted: Ok(()),
        resolved: Ok(()),
        veloxy: None,
        spec: l.clone(),
        hosts: BTreeSet::new(),
        certs: Vec::new(),
    };
    let kinds = super::kinds(&l.protocol);
    if kinds.is_empty() {
        r.accepted = Err((
            "UnsupportedProtocol",
            format!(
                "protocol {} is not served (HTTP, HTTPS, TCP and TLS are)",
                l.protocol
            ),
        ));
        return r;
    }
    let mode = l.tls.as_ref().and_then(|t| t.mode.as_deref());
    if l.protocol == "TLS" && mode.unwrap_or("Terminate") != "Passthrough" {
        r.accepted = Err((
            "UnsupportedProtocol",
            "protocol TLS is served in tls.mode Passthrough only (the backends terminate TLS)"
                .into(),
        ));
        return r;
    }
    let allowed = l
        .allowed_routes
        .as_ref()
        .map(|a| &a.kinds[..])
        .unwrap_or(&[]);
    for k in allowed {
        let group_ok = k.group.as_deref().unwrap_or(GROUP) == GROUP;
        match kinds.iter().find(|s| **s == k.kind) {
            Some(s) if group_ok => r.kinds.push(s),
            _ => {
                r.resolved = Err((
                    "InvalidRouteKinds",
                    format!(
                        "route kind {} is not supported on a {} listener",
                        k.kind, l.protocol
                    ),
                ))
            }
        }
    }
    if allowed.is_empty() {
        r.kinds = kinds.to_vec();
    }
    r.veloxy = served_on(file, spec, l.port, &l.protocol);
    if r.veloxy.is_none() {
        let why = match l.protocol.as_str() {
            "TCP" => format!(
                "no veloxy listener with protocol = \"tcp\" on port {}: add one to the config file",
                l.port
            ),
            _ => "no veloxy listener for HTTPS or TLS: set https_listener in \
                  [providers.kubernetes]"
                .into(),
        };
        r.accepted = Err(("PortUnavailable", why));
        return r;
    }
    if l.protocol == "HTTPS" {
        tls(world, gw, l, &mut r, t);
    }
    r
}

/// A Gateway listener's refusal, for an Event.
pub(super) fn problem(
    gw: &Gateway,
    l: &Listener,
    (reason, msg): &(&'static str, String),
) -> Problem {
    let m = &gw.metadata;
    let note = format!("listener {}: {msg}", l.name);
    let name = m.name.as_deref().unwrap_or_default();
    Problem::new("Gateway", m.namespace.as_deref(), name, reason, note)
}

/// The file's listener for a Gateway listener of `protocol` on `port`: one with that port
/// and kind (TLS for HTTPS; `protocol = "tcp"` for TCP; for TLS passthrough a tcp one, else
/// a TLS one), else `http_listener` (HTTP) / `https_listener` (HTTPS, TLS).
fn served_on(file: &Table, spec: &KubernetesSpec, port: i32, protocol: &str) -> Option<String> {
    let listeners = file.get("listeners").and_then(Value::as_table);
    // (name, TLS, tcp) of the file's listeners on `port`.
    let on_port: Vec<(&String, bool, bool)> = listeners
        .into_iter()
        .flatten()
        .filter_map(|(name, l)| {
            let l = l.as_table()?;
            let lport = l
                .get("addr")
                .and_then(Value::as_str)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse::<i32>().ok());
            let tcp = l.get("protocol").and_then(Value::as_str) == Some("tcp");
            (lport == Some(port)).then(|| (name, l.contains_key("tls"), tcp))
        })
        .collect();
    let find = |tls: bool, tcp: bool| {
        on_port
            .iter()
            .find(|(_, t, c)| *t == tls && *c == tcp)
            .map(|(n, _, _)| (*n).clone())
    };
    match protocol {
        "HTTP" => find(false, false).or_else(|| Some(spec.http_listener.clone())),
        "HTTPS" => find(true, false).or_else(|| spec.https_listener.clone()),
        "TCP" => find(false, true),
        "TLS" => find(false, true)
            .or_else(|| find(true, false))
            .or_else(|| spec.https_listener.clone()),
        _ => None,
    }
}

/// Whether `cert` holds PEM certificates (all well formed) and `key` a PEM private key.
fn pem_ok(cert: &str, key: &str) -> bool {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let mut certs = CertificateDer::pem_slice_iter(cert.as_bytes()).peekable();
    certs.peek().is_some()
        && certs.all(|c| c.is_ok())
        && PrivateKeyDer::from_pem_slice(key.as_bytes()).is_ok()
}

/// An HTTPS listener's certificateRefs: TLS Secrets (another namespace's with a
/// ReferenceGrant), written as PEM files.
fn tls(world: &World, gw: &Gateway, l: &Listener, r: &mut ListenerReport, t: &mut Translation) {
    let ns = gw.metadata.namespace.as_deref().unwrap_or("default");
    let Some(cfg) = l.tls.as_ref() else {
        r.resolved = Err((
            "InvalidCertificateRef",
            "an HTTPS listener needs tls".into(),
        ));
        return;
    };
    if cfg.mode.as_deref().unwrap_or("Terminate") != "Terminate" {
        r.accepted = Err((
            "UnsupportedProtocol",
            "tls.mode Passthrough is for protocol TLS (with TLSRoutes)".into(),
        ));
        return;
    }
    for c in &cfg.certificate_refs {
        let group = c.group.as_deref().unwrap_or("");
        let kind = c.kind.as_deref().unwrap_or("Secret");
        let sns = c.namespace.as_deref().unwrap_or(ns);
        if !group.is_empty() || kind != "Secret" {
            r.resolved = Err((
                "InvalidCertificateRef",
                format!("{kind} {}: only Secrets", c.name),
            ));
            continue;
        }
        if sns != ns && !backends::granted(&world.grants, "Gateway", ns, "Secret", sns, &c.name) {
            r.resolved = Err((
                "RefNotPermitted",
                format!(
                    "Secret {sns}/{}: no ReferenceGrant in {sns} allows it",
                    c.name
                ),
            ));
            continue;
        }
        let secret = world.secrets.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(sns)
                && s.metadata.name.as_deref() == Some(c.name.as_str())
        });
        let pem = |k: &str| {
            let d = secret?.data.as_ref()?.get(k)?;
            String::from_utf8(d.0.clone()).ok()
        };
        let (Some(cert), Some(key)) = (pem("tls.crt"), pem("tls.key")) else {
            r.resolved = Err((
                "InvalidCertificateRef",
                format!(
                    "Secret {sns}/{} not found or without tls.crt and tls.key",
                    c.name
                ),
            ));
            continue;
        };
        if !pem_ok(&cert, &key) {
            r.resolved = Err((
                "InvalidCertificateRef",
                format!(
                    "Secret {sns}/{}: tls.crt or tls.key is not valid PEM",
                    c.name
                ),
            ));
            continue;
        }
        let base = format!("gw-{sns}-{}", c.name);
        t.files.push((format!("{base}.crt"), cert));
        t.files.push((format!("{base}.key"), key));
        r.certs.push((format!("{base}.crt"), format!("{base}.key")));
    }
    if let Err((_, m)) = &r.resolved {
        t.notes.push(format!(
            "Gateway {} listener {}: {m}",
            id(&gw.metadata),
            l.name
        ));
    }
}

/// The certificates of the served HTTPS listeners, for the SNI names of the listener's
/// hostname or, without one, for the hostnames of the routes attached to it, and any other
/// name (`*`) when the Gateway has the veloxy listener to itself (a copy on its address of
/// `gateway_addresses`): a listener without hostname matches every name. On a listener the
/// file and other Gateways share, `*` would take every name the file's default certificate
/// serves, so there it is not added.
pub(super) fn certs(t: &mut Translation, dir: &Path) {
    let mut out = Vec::new();
    for g in &t.report.gateways {
        for l in &g.listeners {
            let Some(on) = &l.veloxy else { continue };
            let own = t.listeners.contains_key(on.as_str());
            let hosts: Vec<Value> = match &l.spec.hostname {
                Some(h) => vec![h.as_str().into()],
                None => l
                    .hosts
                    .iter()
                    .map(String::as_str)
                    .chain(own.then_some("*"))
                    .map(Value::from)
                    .collect(),
            };
            if hosts.is_empty() {
                continue;
            }
            for (cert, key) in &l.certs {
                let mut e = Table::new();
                e.insert("hosts".into(), Value::Array(hosts.clone()));
                e.insert("cert".into(), dir.join(cert).display().to_string().into());
                e.insert("key".into(), dir.join(key).display().to_string().into());
                out.push((on.clone(), Value::Table(e)));
            }
        }
    }
    t.certs = out;
}

#[cfg(test)]
mod tests {
    /// The conformance suite's GatewayInvalidTLSConfiguration: a Secret whose tls.crt and
    /// tls.key are "Hello world" is an invalid certificateRef, a real pair is not.
    #[test]
    fn a_secret_without_pem_is_not_a_certificate() {
        assert!(!super::pem_ok("Hello world\n", "Hello world\n"));
        let c = rcgen::generate_simple_self_signed(vec!["a.example".to_string()]).unwrap();
        let (cert, key) = (c.cert.pem(), c.signing_key.serialize_pem());
        assert!(super::pem_ok(&cert, &key));
        assert!(!super::pem_ok(&cert, "Hello world\n"));
        assert!(!super::pem_ok(&key, &key));
    }
}
