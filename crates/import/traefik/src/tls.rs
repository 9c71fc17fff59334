//! TLS: routers' `tls` (ACME through a certificate resolver, options), `tls.certificates`
//! and `tls.stores` (files picked by SNI: each certificate's names are read from it),
//! `tls.options` (versions and the like), all on the TLS listeners.

use std::path::Path;

use veloxy_import::tree::Node;
use veloxy_import::Loc;

use crate::matcher::Branch;
use crate::node::{at, entries, get, items, list, text};
use crate::translate::Ctx;

/// A router's `tls`: ACME names for its listeners, its options.
pub fn router_tls(
    ctx: &mut Ctx,
    lkey: &str,
    tls: &Node,
    loc: &Loc,
    branches: &[Branch],
    listeners: &[String],
) {
    let lkey = lkey.to_string();
    ctx.tls_lines
        .push((lkey.clone(), loc.clone(), listeners.to_vec()));
    let line = ctx.lines.at(&lkey, loc, &lkey);
    if let Some(opt) = text(tls, "options") {
        let opt = crate::input::strip_provider(&opt).to_string();
        if !ctx.inp.tls_options.iter().any(|o| o.name == opt) {
            line.refuse(format!("TLS options {opt} are not defined"));
        } else if !ctx.used_options.contains(&opt) {
            ctx.used_options.push(opt);
        }
    }
    if tls.as_map().is_some() && get(tls, "passthrough").is_some_and(|p| p.as_bool() == Some(true))
    {
        line.refuse("passthrough on an HTTP router (a TCP router's option)");
        return;
    }
    let Some(resolver) = text(tls, "certResolver") else {
        for l in listeners {
            let v = ctx.tls_hosts.entry(l.clone()).or_default();
            for h in branches.iter().flat_map(|b| b.hosts.iter()) {
                if !v.contains(h) {
                    v.push(h.clone());
                }
            }
        }
        return;
    };
    let Some(r) = ctx.resolvers.iter().find(|r| r.name == resolver).cloned() else {
        line.refuse(format!("certificate resolver {resolver} is not defined"));
        return;
    };
    if let Err(why) = &r.challenge {
        line.refuse(why.clone());
        return;
    }
    let mut names: Vec<String> = Vec::new();
    if let Some(d) = get(tls, "domains") {
        for dom in items(d) {
            if let Some(m) = text(dom, "main") {
                names.push(m);
            }
            names.extend(
                get(dom, "sans")
                    .map(list)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(s, _)| s),
            );
        }
    } else {
        for b in branches {
            names.extend(b.hosts.iter().cloned());
        }
    }
    if names.is_empty() {
        line.refuse("no host names for ACME (the rule names no Host and there are no tls.domains)");
        return;
    }
    if let Some(w) = names.iter().find(|n| n.starts_with("*.")) {
        line.refuse(format!(
            "{w}: wildcard certificates need the DNS-01 challenge, which veloxy lacks"
        ));
        return;
    }
    for l in listeners {
        let v = ctx.acme_hosts.entry(l.clone()).or_default();
        for n in &names {
            if !v.contains(n) {
                v.push(n.clone());
            }
        }
    }
}

/// Why a certificate's names are unknown.
enum NoNames {
    /// The file cannot be read (not there at import).
    Unread(String),
    /// It is not a certificate.
    Bad(String),
}

/// A certificate file's DNS names (its SANs, else its CN).
fn cert_names(path: &Path) -> Result<Vec<String>, NoNames> {
    let data =
        std::fs::read(path).map_err(|e| NoNames::Unread(format!("{}: {e}", path.display())))?;
    names_of(path, &data).map_err(NoNames::Bad)
}

fn names_of(path: &Path, data: &[u8]) -> Result<Vec<String>, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(data)
        .map_err(|e| format!("{}: not a PEM certificate: {e}", path.display()))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for g in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(n) = g {
                names.push(n.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(s.to_ascii_lowercase());
            }
        }
    }
    Ok(names)
}

/// The TLS listeners' certificates, ACME names and options.
pub fn listeners(ctx: &mut Ctx) {
    // Files: (cert, key, names), the default first.
    let mut files: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut default: Option<(String, String)> = None;
    // Files not readable at import: (cert, key, why, line key, place).
    let mut unread: Vec<(String, String, String, String, Loc)> = Vec::new();
    for s in ctx.inp.tls_stores.clone() {
        let key = format!("tls.stores.{}", s.name);
        let line = ctx.lines.at(&key, &s.loc, &key);
        if s.name != "default" {
            line.ignored = Some("only the default store is used by routers".into());
            continue;
        }
        if let Some(dc) = get(&s.node, "defaultCertificate") {
            let (Some(c), Some(k)) = (text(dc, "certFile"), text(dc, "keyFile")) else {
                line.refuse("defaultCertificate without certFile and keyFile");
                continue;
            };
            default = Some((
                ctx.opts.out_path(&s.base, &c),
                ctx.opts.out_path(&s.base, &k),
            ));
        }
        if get(&s.node, "defaultGeneratedCert").is_some() {
            line.refuse("defaultGeneratedCert: an ACME certificate as the default for every name");
        }
    }
    for c in ctx.inp.certs.clone() {
        let key = format!("tls.certificates[{}]", c.name);
        let line = ctx.lines.at(&key, &c.loc, "tls.certificates");
        let (Some(cf), Some(kf)) = (text(&c.node, "certFile"), text(&c.node, "keyFile")) else {
            line.refuse("certFile and keyFile are required (inline PEM is not translated)");
            continue;
        };
        if cf.contains("-----BEGIN") {
            line.refuse("inline PEM: write it to a file");
            continue;
        }
        let path = if Path::new(&cf).is_absolute() {
            Path::new(&cf).to_path_buf()
        } else {
            c.base.join(&cf)
        };
        let (cert, keyf) = (
            ctx.opts.out_path(&c.base, &cf),
            ctx.opts.out_path(&c.base, &kf),
        );
        match cert_names(&path) {
            Ok(names) => files.push((cert, keyf, names)),
            Err(NoNames::Unread(_)) if default.as_ref().is_some_and(|d| d.0 == cert) => {}
            Err(NoNames::Unread(why)) => unread.push((cert, keyf, why, key, c.loc.clone())),
            Err(NoNames::Bad(why)) => {
                line.refuse(format!("cannot read the certificate's names: {why}"));
            }
        }
    }
    let tls_eps: Vec<(String, Loc)> = ctx
        .eps
        .iter()
        .filter(|e| e.tls)
        .map(|e| (e.listener.clone(), e.loc.clone()))
        .collect();
    if tls_eps.is_empty() {
        for s in &ctx.inp.tls_stores {
            let key = format!("tls.stores.{}", s.name);
            let line = ctx.lines.at(&key, &s.loc, &key);
            if line.refused.is_none() && line.ignored.is_none() {
                line.ignored = Some("no entry point serves TLS routers".into());
            }
        }
        for c in &ctx.inp.certs {
            let key = format!("tls.certificates[{}]", c.name);
            let line = ctx.lines.at(&key, &c.loc, "tls.certificates");
            if line.refused.is_none() {
                line.ignored = Some("no entry point serves TLS routers".into());
            }
        }
    }
    for (l, loc) in tls_eps {
        let acme = ctx.acme_hosts.get(&l).cloned().unwrap_or_default();
        let mut t = toml::Table::new();
        let mut certs = Vec::new();
        let mut dflt = default.clone();
        for (i, (c, k, names)) in files.iter().enumerate() {
            if dflt.is_none() && i == 0 && files.len() == 1 && unread.is_empty() {
                dflt = Some((c.clone(), k.clone()));
                continue;
            }
            certs.push(cert_entry(names, c, k));
        }
        let known: Vec<&String> = files.iter().flat_map(|f| f.2.iter()).collect();
        let hosts: Vec<String> = ctx
            .tls_hosts
            .get(&l)
            .map(|h| {
                h.iter()
                    .filter(|h| !known.iter().any(|n| covers(n, h)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for (c, k, why, lkey, lloc) in &unread {
            let line = ctx.lines.at(lkey, lloc, "tls.certificates");
            let pre = format!("the certificate could not be read at import ({why})");
            if dflt.is_none() && (files.is_empty() || hosts.is_empty()) {
                dflt = Some((c.clone(), k.clone()));
                line.note(format!("{pre}; it is served as listener {l}'s default certificate, for every name (check its names)"));
            } else if !hosts.is_empty() {
                certs.push(cert_entry(&hosts, c, k));
                line.note(format!(
                    "{pre}; it is served for {} on listener {l} (check its names)",
                    hosts.join(", ")
                ));
            } else {
                line.note(format!("{pre}; listener {l} does not serve it: its default and the other certificates cover every router's name"));
            }
        }
        if let Some((c, k)) = &dflt {
            t.insert("cert".into(), c.as_str().into());
            t.insert("key".into(), k.as_str().into());
        }
        if !acme.is_empty() {
            t.insert("acme".into(), crate::route::strings(&acme));
        }
        if !certs.is_empty() {
            t.insert("certs".into(), toml::Value::Array(certs));
        }
        if t.is_empty() {
            for (k, lloc, ls) in ctx.tls_lines.clone() {
                if ls.contains(&l) {
                    ctx.lines.at(&k, &lloc, &k).refuse(format!(
                        "no certificate for listener {l}: Traefik serves its self-signed default certificate; give tls.certificates or a certResolver"
                    ));
                }
            }
            continue;
        }
        let unknown = if default.is_some() {
            None
        } else if !files.is_empty() || dflt.is_some() {
            Some("clients naming no known host get veloxy's first certificate (Traefik: its self-signed default certificate)")
        } else {
            Some("clients naming other hosts get a TLS alert (Traefik: its self-signed default certificate)")
        };
        if let Some(note) = unknown {
            if let Some((k, lloc, _)) = ctx.tls_lines.iter().find(|x| x.2.contains(&l)).cloned() {
                ctx.lines.at(&k, &lloc, &k).note(note);
            }
        }
        ctx.cfg.listener(&l, &loc).set("tls", toml::Value::Table(t));
    }
    options(ctx);
}

fn cert_entry(names: &[String], c: &str, k: &str) -> toml::Value {
    let mut e = toml::Table::new();
    e.insert("hosts".into(), crate::route::strings(names));
    e.insert("cert".into(), c.into());
    e.insert("key".into(), k.into());
    toml::Value::Table(e)
}

/// Whether a certificate name (`a.example.com`, `*.example.com`) covers a host.
fn covers(name: &str, host: &str) -> bool {
    match name.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(suffix)),
        None => name.eq_ignore_ascii_case(host),
    }
}

/// `tls.options`: the used ones (and `default`) reported by field.
fn options(ctx: &mut Ctx) {
    for o in ctx.inp.tls_options.clone() {
        let key = format!("tls.options.{}", o.name);
        let used = o.name == "default" || ctx.used_options.contains(&o.name);
        if !used {
            ctx.lines.at(&key, &o.loc, &key).ignored = Some("no router uses these options".into());
            continue;
        }
        for (k, v) in entries(&o.node) {
            let sub = format!("{key}.{}", k.name);
            let line = ctx.lines.at(&sub, &k.loc, &sub);
            let val = v.scalar().unwrap_or_default();
            match k.name.to_ascii_lowercase().as_str() {
                "minversion" => match val.as_str() {
                    "VersionTLS12" => {}
                    "VersionTLS13" => {
                        line.refuse(
                            "veloxy also accepts TLS 1.2 (it has no minimum version setting)",
                        );
                    }
                    _ => {
                        line.note(format!("{val}: veloxy accepts TLS 1.2 and 1.3 only"));
                    }
                },
                "maxversion" => {
                    if val != "VersionTLS13" {
                        line.refuse(
                            "veloxy also offers TLS 1.3 (it has no maximum version setting)",
                        );
                    }
                }
                "ciphersuites" | "curvepreferences" => {
                    line.note("veloxy uses rustls' safe default suites and groups");
                }
                "snistrict" => {
                    if v.as_bool() == Some(true) {
                        line.refuse(
                            "veloxy answers clients without a known SNI with its first certificate",
                        );
                    }
                }
                "clientauth" => {
                    if at(v, "clientAuthType")
                        .and_then(|t| t.scalar())
                        .is_some_and(|t| t != "NoClientCert")
                    {
                        line.refuse("veloxy does not ask clients for certificates (mutual TLS)");
                    } else {
                        line.ignored = Some("no client certificates are asked for".into());
                    }
                }
                "alpnprotocols" => {
                    line.note(
                        "veloxy offers h2 and http/1.1 by ALPN (listener http2 switches h2 off)",
                    );
                }
                "preferservercipher" | "preferserverciphersuites" => {
                    line.ignored = Some("cipher order preference".into());
                }
                _ => {
                    line.refuse("unknown TLS option");
                }
            }
        }
        ctx.lines.at(&key, &o.loc, &key);
    }
}
