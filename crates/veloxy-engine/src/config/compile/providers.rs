//! `[providers.kubernetes]`: checked against the listeners it names and compiled into a
//! [`KubernetesSpec`]. The `veloxy` command runs the provider; the engine only carries it.

use toml::Spanned;

use crate::config::error::{ConfigError, Source};
use crate::config::file::{FileConfig, KubernetesSection};
use crate::config::{KubernetesSpec, ListenerSpec, StatusAddress};

/// The Kubernetes provider's settings, if the file has `[providers.kubernetes]`, and the
/// warnings about them (none at present).
pub(super) fn compile_providers(
    src: &Source,
    file: &FileConfig,
    listeners: &[ListenerSpec],
) -> Result<(Option<KubernetesSpec>, Vec<String>), ConfigError> {
    let Some(k) = file.providers.as_ref().and_then(|p| p.kubernetes.as_ref()) else {
        return Ok((None, Vec::new()));
    };
    let span = k.span();
    let k = k.get_ref();
    const KEY: &str = "providers.kubernetes";
    let listener = |v: &Spanned<String>, key: &str, tls: bool| -> Result<String, ConfigError> {
        let name = v.get_ref();
        let l = listeners.iter().find(|l| &l.name == name).ok_or_else(|| {
            src.error(
                v.span(),
                format!("{KEY}.{key}"),
                format!("listener {name:?} is not defined (add [listeners.{name}])"),
            )
        })?;
        if l.tcp {
            return Err(src.error(
                v.span(),
                format!("{KEY}.{key}"),
                format!("listener {name:?} is a tcp listener: Ingress rules need HTTP"),
            ));
        }
        if tls != l.tls.is_some() {
            let why = if tls {
                "has no [listeners.NAME.tls]: Ingress TLS hosts need a TLS listener (give it a \
                 default certificate or acme; the Ingress certificates are added to it)"
            } else {
                "has TLS: name a plain listener here and the TLS one as https_listener"
            };
            return Err(src.error(
                v.span(),
                format!("{KEY}.{key}"),
                format!("listener {name:?} {why}"),
            ));
        }
        Ok(name.clone())
    };
    let http_listener = match &k.http_listener {
        Some(v) => listener(v, "http_listener", false)?,
        None => {
            return Err(src.error(
                span,
                KEY,
                "needs http_listener: the listener Ingress rules are served on",
            ))
        }
    };
    let https_listener = match &k.https_listener {
        Some(v) => Some(listener(v, "https_listener", true)?),
        None => None,
    };
    let spec = KubernetesSpec {
        kubeconfig: k
            .kubeconfig
            .as_ref()
            .map(|p| super::absolute(&src.relative(p.get_ref()))),
        namespaces: namespaces(src, k)?,
        ingress_class: match &k.ingress_class {
            Some(c) => dns_name(src, c, "ingress_class")?,
            None => "veloxy".into(),
        },
        ingress_nginx: k.ingress_nginx.as_ref().is_some_and(|b| *b.get_ref()),
        gateway_class: match &k.gateway_class {
            Some(c) => Some(dns_name(src, c, "gateway_class")?),
            None => None,
        },
        http_listener,
        https_listener,
        status: status(src, k)?,
        gateway_addresses: gateway_addresses(src, k)?,
        lease: match &k.lease {
            Some(l) => Some(namespaced(src, l, "lease", "a Lease")?),
            None => None,
        },
        lease_duration: match &k.lease_duration {
            None => std::time::Duration::from_secs(15),
            Some(d) if (2..=300).contains(&d.0.as_secs()) => d.0,
            Some(_) => {
                return Err(src.error(
                    span,
                    format!("{KEY}.lease_duration"),
                    "must be between 2s and 5m",
                ))
            }
        },
    };
    Ok((Some(spec), Vec::new()))
}

/// `namespaces`: valid names, each once; empty or absent: all namespaces.
fn namespaces(src: &Source, k: &KubernetesSection) -> Result<Vec<String>, ConfigError> {
    let Some(list) = &k.namespaces else {
        return Ok(Vec::new());
    };
    let mut out: Vec<String> = Vec::new();
    for n in list.get_ref() {
        if !is_label(n) {
            return Err(src.error(
                list.span(),
                "providers.kubernetes.namespaces",
                format!("{n:?} is not a namespace name (lowercase letters, digits and '-')"),
            ));
        }
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    Ok(out)
}

/// A class name: a DNS subdomain (lowercase letters, digits, `-` and `.`).
fn dns_name(src: &Source, v: &Spanned<String>, key: &str) -> Result<String, ConfigError> {
    let n = v.get_ref();
    if n.is_empty() || n.len() > 253 || !n.split('.').all(is_label) {
        return Err(src.error(
            v.span(),
            format!("providers.kubernetes.{key}"),
            format!("{n:?} is not a Kubernetes object name (lowercase letters, digits, '-', '.')"),
        ));
    }
    Ok(n.clone())
}

/// An RFC 1123 label: 1 to 63 of `a-z0-9-`, not starting or ending with `-`.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `status_address` (an IP address or a host name) or `publish_service = "NS/NAME"`.
fn status(src: &Source, k: &KubernetesSection) -> Result<Option<StatusAddress>, ConfigError> {
    match (&k.status_address, &k.publish_service) {
        (Some(_), Some(p)) => Err(src.error(
            p.span(),
            "providers.kubernetes.publish_service",
            "give status_address or publish_service, not both",
        )),
        (Some(a), None) => {
            let text = a.get_ref().trim();
            if let Ok(ip) = text.parse() {
                return Ok(Some(StatusAddress::Ip(ip)));
            }
            let name = text.to_ascii_lowercase();
            if name.is_empty() || !name.split('.').all(is_label) {
                return Err(src.error(
                    a.span(),
                    "providers.kubernetes.status_address",
                    format!("{text:?} is neither an IP address nor a host name"),
                ));
            }
            Ok(Some(StatusAddress::Hostname(name)))
        }
        (None, Some(p)) => {
            let (namespace, name) = namespaced(src, p, "publish_service", "a Service")?;
            Ok(Some(StatusAddress::Service { namespace, name }))
        }
        (None, None) => Ok(None),
    }
}

/// `gateway_addresses`: IP addresses, each once.
fn gateway_addresses(
    src: &Source,
    k: &KubernetesSection,
) -> Result<Vec<std::net::IpAddr>, ConfigError> {
    let Some(list) = &k.gateway_addresses else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for a in list.get_ref() {
        let bad =
            |why: String| src.error(list.span(), "providers.kubernetes.gateway_addresses", why);
        let ip: std::net::IpAddr = a
            .trim()
            .parse()
            .map_err(|_| bad(format!("{a:?} is not an IP address")))?;
        if ip.is_unspecified() {
            return Err(bad(format!("{a:?}: a Gateway needs an address of its own")));
        }
        if out.contains(&ip) {
            return Err(bad(format!("{a:?} is listed twice")));
        }
        out.push(ip);
    }
    Ok(out)
}

/// `"NAMESPACE/NAME"` of an object (`what`: "a Service", "a Lease").
fn namespaced(
    src: &Source,
    v: &Spanned<String>,
    key: &str,
    what: &str,
) -> Result<(String, String), ConfigError> {
    match v.get_ref().split_once('/') {
        Some((ns, name)) if is_label(ns) && is_label(name) => Ok((ns.into(), name.into())),
        _ => Err(src.error(
            v.span(),
            format!("providers.kubernetes.{key}"),
            format!("{:?}: expected \"NAMESPACE/NAME\" of {what}", v.get_ref()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::compile::compile_str;
    use crate::config::{KubernetesSpec, StatusAddress};
    use crate::upstream::balancer::PolicyRegistry;

    const LISTENERS: &str = "[listeners.web]\naddr = \"127.0.0.1:0\"\n\
                             [[routes]]\nrespond = { status = 200 }\n";

    fn compile(k8s: &str) -> Result<crate::config::Snapshot, String> {
        let text = format!("{LISTENERS}[providers.kubernetes]\n{k8s}");
        compile_str(
            std::path::Path::new("v.toml"),
            &text,
            &PolicyRegistry::with_builtins(),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_compiles_with_its_defaults() {
        let s = compile("http_listener = \"web\"\nstatus_address = \"203.0.113.10\"\n").unwrap();
        assert_eq!(
            s.settings.kubernetes,
            Some(KubernetesSpec {
                kubeconfig: None,
                namespaces: Vec::new(),
                ingress_class: "veloxy".into(),
                ingress_nginx: false,
                gateway_class: None,
                http_listener: "web".into(),
                https_listener: None,
                status: Some(StatusAddress::Ip([203, 0, 113, 10].into())),
                lease: None,
                gateway_addresses: Vec::new(),
                lease_duration: std::time::Duration::from_secs(15),
            })
        );
        let s =
            compile("http_listener = \"web\"\nlease = \"ops/writer\"\nlease_duration = \"3s\"\n")
                .unwrap();
        let k = s.settings.kubernetes.unwrap();
        assert_eq!(k.lease, Some(("ops".into(), "writer".into())));
        assert_eq!(k.lease_duration, std::time::Duration::from_secs(3));
        for bad in [
            "lease = \"writer\"",
            "lease = \"Ops/x\"",
            "lease_duration = \"1s\"",
        ] {
            let e = compile(&format!("http_listener = \"web\"\n{bad}\n")).unwrap_err();
            assert!(e.contains("providers.kubernetes.lease"), "{bad}: {e}");
        }
        assert!(compile_str(
            std::path::Path::new("v.toml"),
            LISTENERS,
            &PolicyRegistry::with_builtins()
        )
        .unwrap()
        .settings
        .kubernetes
        .is_none());
    }

    #[test]
    fn refusals_name_the_place_and_key() {
        let e = compile("http_listener = \"nope\"\n").unwrap_err();
        assert!(
            e.starts_with("v.toml:6:17: providers.kubernetes.http_listener:"),
            "{e}"
        );
        assert!(e.contains("\"nope\" is not defined"), "{e}");
        let e = compile("http_listener = \"web\"\nhttps_listener = \"web\"\n").unwrap_err();
        assert!(
            e.contains("https_listener") && e.contains("no [listeners.NAME.tls]"),
            "{e}"
        );
        let e = compile("ingress_class = \"veloxy\"\n").unwrap_err();
        assert!(e.contains("needs http_listener"), "{e}");
        let e = compile("http_listener = \"web\"\npublish_service = \"x\"\n").unwrap_err();
        assert!(e.contains("NAMESPACE/NAME"), "{e}");
        let e = compile("http_listener = \"web\"\nnamespaces = [\"Bad_Name\"]\n").unwrap_err();
        assert!(e.contains("not a namespace name"), "{e}");
        let e = compile("http_listener = \"web\"\nfoo = 1\n").unwrap_err();
        assert!(e.contains("foo"), "{e}");
    }

    #[test]
    fn gateway_class_is_accepted() {
        let s = compile("http_listener = \"web\"\ngateway_class = \"veloxy\"\n").unwrap();
        let k = s.settings.kubernetes.unwrap();
        assert_eq!(k.gateway_class.as_deref(), Some("veloxy"));
        assert!(
            !s.warnings.iter().any(|w| w.contains("gateway_class")),
            "{:?}",
            s.warnings
        );
    }
}
