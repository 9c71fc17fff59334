//! `spec.tls`: certificates from the Secrets (written beside the output), chosen by SNI on
//! the `https` listener; cert-manager's hosts without a Secret get veloxy's own ACME.

use toml::Value;
use veloxy_import::tree::Node;
use veloxy_import::GeneratedFile;

use crate::auth::{secret_entries, util_name};
use crate::objects::Object;
use crate::util;
use crate::{Ctx, IngInfo};

/// The hosts that have a certificate (exact names and `*.suffix` patterns).
#[derive(Debug, Default)]
pub struct Certs {
    /// Host patterns with a certificate.
    pub hosts: Vec<String>,
    /// `[[listeners.https.tls.certs]]` entries: (secret id, hosts, cert, key).
    pub entries: Vec<(String, Vec<String>, String, String)>,
    /// Hosts whose certificates veloxy obtains by ACME.
    pub acme: Vec<String>,
    /// A certificate for clients without SNI (a tls entry without hosts).
    pub default: Option<(String, String)>,
}

impl Certs {
    /// Whether `host` has a certificate.
    pub fn covers(&self, host: &str) -> bool {
        !host.is_empty()
            && self.hosts.iter().chain(&self.acme).any(|h| {
                h == host
                    || h.strip_prefix("*.").is_some_and(|s| {
                        host.strip_suffix(s)
                            .is_some_and(|p| p.ends_with('.') && !p[..p.len() - 1].contains('.'))
                    })
            })
    }

    /// Whether the https listener is needed for certificates.
    pub fn any(&self) -> bool {
        !self.entries.is_empty() || !self.acme.is_empty() || self.default.is_some()
    }
}

/// Reads `spec.tls` of every imported Ingress.
pub fn read(ctx: &mut Ctx, ings: &[IngInfo]) -> Certs {
    let mut certs = Certs::default();
    for info in ings.iter().filter(|i| i.imported && i.ann.canary.is_none()) {
        let ing = info.obj;
        let before = certs.acme.len();
        for entry in ing.spec("tls").and_then(Node::as_seq).unwrap_or(&[]) {
            one(ctx, info, ing, entry, &mut certs);
        }
        for (loc, name) in &info.ann.cert_manager {
            if certs.acme.len() > before {
                ctx.report.different(
                    loc,
                    name,
                    "veloxy's own ACME client obtains the certificates (see spec.tls)",
                );
            } else {
                ctx.report.ignored(
                    loc,
                    name,
                    "read by cert-manager, which writes the TLS Secrets (taken from the input)",
                );
            }
        }
    }
    certs
}

fn one(ctx: &mut Ctx, info: &IngInfo, ing: &Object, entry: &Node, certs: &mut Certs) {
    let listed: Vec<String> = entry
        .get("hosts")
        .and_then(Node::as_seq)
        .unwrap_or(&[])
        .iter()
        .filter_map(Node::scalar)
        .collect();
    let (hosts, bad): (Vec<String>, Vec<String>) =
        listed.iter().cloned().partition(|h| util::dns_name(h));
    let secret = entry
        .get("secretName")
        .and_then(Node::scalar)
        .unwrap_or_default();
    let directive = format!(
        "spec.tls {}",
        if listed.is_empty() {
            "(no hosts)".to_string()
        } else {
            listed.join(", ")
        }
    );
    let bad_note = (!bad.is_empty()).then(|| {
        let each: Vec<String> = bad.iter().map(|h| util::not_dns(h)).collect();
        format!("{}: left out", each.join(", "))
    });
    if hosts.is_empty() && !listed.is_empty() {
        let why = bad_note.unwrap_or_default();
        return ctx.report.refused(&entry.loc, directive, why);
    }
    let found = ctx.objs.secret(&ing.ns, &secret);
    let pair = found.and_then(|s| {
        let e = secret_entries(s.node);
        let get = |k: &str| e.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        Some((get("tls.crt")?, get("tls.key")?, s.loc.clone()))
    });
    let base = format!("secrets/{}", util_name(&ing.ns, &secret));
    let (cert_file, key_file) = (format!("{base}.crt"), format!("{base}.key"));
    let mut notes = Vec::new();
    match pair {
        Some((crt, key, sloc)) => {
            if !ctx.config.files.iter().any(|f| f.name == cert_file) {
                for (name, contents) in [(&cert_file, crt), (&key_file, key)] {
                    ctx.config.files.push(GeneratedFile {
                        name: name.clone(),
                        contents,
                        mode: 0o600,
                    });
                }
            }
            ctx.used_secrets
                .push((ing.ns.clone(), secret.clone(), sloc));
        }
        None if !info.ann.cert_manager.is_empty() && !hosts.is_empty() => {
            certs.acme.extend(hosts.iter().cloned());
            notes.extend(bad_note);
            notes.push(format!(
                "Secret {}/{secret} (cert-manager's) is not in the input: veloxy obtains the \
                 certificates itself by ACME (tls.acme; Let's Encrypt unless [server.acme] \
                 names another directory) instead of cert-manager's issuer",
                ing.ns
            ));
            return ctx
                .report
                .different(&entry.loc, directive, notes.join("; "));
        }
        None if secret.is_empty() => {
            let why = "no secretName: ingress-nginx serves its default certificate \
                       (--default-ssl-certificate) for these hosts, which veloxy does not have: \
                       name the Secret";
            return ctx.report.refused(&entry.loc, directive, why);
        }
        None if found.is_some() => {
            let why = format!("Secret {}/{secret} has no tls.crt and tls.key", ing.ns);
            return ctx.report.refused(&entry.loc, directive, why);
        }
        None => notes.push(missing_secret(&ing.ns, &secret, &cert_file, &key_file)),
    }
    let id = format!("{}/{secret}", ing.ns);
    if hosts.is_empty() {
        certs.default.get_or_insert((cert_file, key_file));
    } else {
        certs.hosts.extend(hosts.iter().cloned());
        match certs.entries.iter_mut().find(|e| e.0 == id) {
            Some(e) => e.1.extend(hosts),
            None => certs.entries.push((id, hosts, cert_file, key_file)),
        }
    }
    notes.extend(bad_note);
    notes.extend(https_notes(ctx, info));
    if notes.is_empty() {
        ctx.report.translated(&entry.loc, directive);
    } else {
        ctx.report
            .different(&entry.loc, directive, notes.join("; "));
    }
}

/// What differs for hosts with a certificate: the redirect's trailing '/', HSTS over HTTP.
fn https_notes(ctx: &Ctx, info: &IngInfo) -> Vec<String> {
    let mut notes = Vec::new();
    let redirect = info.ann.ssl_redirect.unwrap_or(ctx.g.ssl_redirect);
    if redirect && !ctx.g.preserve_trailing_slash {
        notes.push(format!(
            "plain HTTP requests for these hosts get a {} to https:// (ingress-nginx's \
             ssl-redirect); ingress-nginx drops a trailing '/' from that redirect's URI, \
             veloxy keeps it",
            ctx.g.redirect_code
        ));
    }
    if ctx.g.hsts.is_some() && !redirect {
        notes.push(
            "Strict-Transport-Security is also sent over plain HTTP, where browsers ignore it \
             (ingress-nginx sends it over HTTPS only)"
                .into(),
        );
    }
    notes
}

/// The note for a TLS Secret that lives in the cluster but not in the input: the paths the
/// output names and the commands that write them.
fn missing_secret(ns: &str, name: &str, cert: &str, key: &str) -> String {
    let get = |field: &str, file: &str| {
        format!(
            "kubectl get secret -n {ns} {name} -o jsonpath='{{.data.tls\\.{field}}}' | base64 -d \
             > {file}"
        )
    };
    format!(
        "the Secret {ns}/{name} is not in the input: write its tls.crt and tls.key to {cert} \
         and {key} next to the output ({}; {})",
        get("crt", cert),
        get("key", key)
    )
}

/// The `http` and `https` listeners.
pub fn listeners(ctx: &mut Ctx, certs: &Certs, https: bool, first: &veloxy_import::Loc) {
    ctx.config.listener("http", first).set("addr", ":80");
    if !https {
        return;
    }
    let l = ctx.config.listener("https", first);
    l.set("addr", ":443");
    if !ctx.g.http2 {
        l.set("http2", false);
    }
    let mut tls = toml::Table::new();
    if let Some((c, k)) = &certs.default {
        tls.insert("cert".into(), c.as_str().into());
        tls.insert("key".into(), k.as_str().into());
    }
    if !certs.acme.is_empty() {
        tls.insert("acme".into(), util::strings(&certs.acme));
    }
    let list: Vec<Value> = certs
        .entries
        .iter()
        .map(|(_, hosts, c, k)| {
            util::table([
                ("hosts", util::strings(hosts)),
                ("cert", c.as_str().into()),
                ("key", k.as_str().into()),
            ])
        })
        .collect();
    if !list.is_empty() {
        tls.insert("certs".into(), Value::Array(list));
    }
    l.set("tls", Value::Table(tls));
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_secret_names_its_paths_and_the_commands_that_write_them() {
        let n = super::missing_secret("web", "shop-tls", "secrets/web-shop-tls.crt", "k.key");
        assert_eq!(
            n,
            "the Secret web/shop-tls is not in the input: write its tls.crt and tls.key to \
             secrets/web-shop-tls.crt and k.key next to the output (kubectl get secret -n web \
             shop-tls -o jsonpath='{.data.tls\\.crt}' | base64 -d > secrets/web-shop-tls.crt; \
             kubectl get secret -n web shop-tls -o jsonpath='{.data.tls\\.key}' | base64 -d > \
             k.key)"
        );
    }
}
