//! What the admin endpoint shows of certificates: `GET /certificates` (every certificate of
//! every TLS listener, from files and from ACME) and the certificate lines of `/metrics`.

use std::time::{SystemTime, UNIX_EPOCH};

use super::{CertStore, ListenerCerts};

/// One certificate as reported.
struct Row {
    listener: String,
    source: &'static str,
    names: Vec<String>,
    issuer: Option<String>,
    not_after: Option<SystemTime>,
    next_renewal: Option<SystemTime>,
    last_error: Option<String>,
    file: Option<String>,
}

fn rows(store: &CertStore, listeners: &[ListenerCerts<'_>]) -> Vec<Row> {
    let statuses = store.statuses();
    let mut out = Vec::new();
    for l in listeners {
        for f in l.files {
            // Read again from disk: the rustls config keeps no parsed certificate, and this
            // is an admin request, not the data path.
            let info = crate::tls::load_certs(&f.cert)
                .ok()
                .and_then(|c| c.first().and_then(crate::tls::leaf_info));
            out.push(Row {
                listener: l.name.to_owned(),
                source: "file",
                names: match (&info, f.hosts.is_empty()) {
                    (Some(i), true) => i.names.clone(),
                    _ => f.hosts.clone(),
                },
                issuer: info.as_ref().map(|i| i.issuer.clone()),
                not_after: info.as_ref().map(|i| i.not_after),
                next_renewal: None,
                last_error: None,
                file: Some(f.cert.display().to_string()),
            });
        }
        for name in l.acme {
            let s = statuses.get(name).cloned().unwrap_or_default();
            out.push(Row {
                listener: l.name.to_owned(),
                source: "acme",
                names: vec![name.clone()],
                issuer: s.issuer,
                not_after: s.not_after,
                next_renewal: s.next_attempt,
                last_error: s.last_error,
                file: None,
            });
        }
    }
    out
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn time(t: Option<SystemTime>) -> serde_json::Value {
    t.map_or(serde_json::Value::Null, |t| {
        httpdate::fmt_http_date(t).into()
    })
}

/// `GET /certificates`: `listeners`' certificates, the ACME ones as `store` holds them.
pub(crate) fn certificates_json(store: &CertStore, listeners: &[ListenerCerts<'_>]) -> String {
    let now = SystemTime::now();
    let list: Vec<serde_json::Value> = rows(store, listeners)
        .into_iter()
        .map(|r| {
            serde_json::json!({
                "listener": r.listener,
                "source": r.source,
                "names": r.names,
                "issuer": r.issuer,
                "not_after": time(r.not_after),
                "expires_in_s": r.not_after.map(|t| t.duration_since(now).map_or(0, |d| d.as_secs())),
                "next_renewal": time(r.next_renewal),
                "last_error": r.last_error,
                "file": r.file,
            })
        })
        .collect();
    let mut s = serde_json::json!({ "certificates": list }).to_string();
    s.push('\n');
    s
}

/// The certificate lines of `/metrics` (`store`: the runtime's ACME store).
pub(crate) fn metrics(store: &CertStore, listeners: &[ListenerCerts<'_>], out: &mut String) {
    use std::fmt::Write;
    let rows = rows(store, listeners);
    let _ = writeln!(
        out,
        "# HELP veloxy_certificate_expiry_timestamp_seconds When each certificate expires (Unix time).\n# TYPE veloxy_certificate_expiry_timestamp_seconds gauge"
    );
    for r in rows.iter().filter(|r| r.not_after.is_some()) {
        let _ = writeln!(
            out,
            "veloxy_certificate_expiry_timestamp_seconds{{listener=\"{}\",name=\"{}\",source=\"{}\"}} {}",
            r.listener,
            r.names.first().map_or("", String::as_str),
            r.source,
            r.not_after.map_or(0, unix)
        );
    }
    let failures = store.failures.load(std::sync::atomic::Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# HELP veloxy_acme_failures_total Failed ACME issuances and renewals.\n# TYPE veloxy_acme_failures_total counter\nveloxy_acme_failures_total {failures}"
    );
}
