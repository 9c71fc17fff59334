//! Traefik v1 syntax (`[frontends]`, `[backends]`, `[entryPoints.http.redirect]`, `[file]`,
//! `[docker]` at the top level, `traefik.frontend.rule` labels): recognized and refused, one
//! line per section, pointing at the migration.

/// The reason on every v1 line.
pub const WHY: &str =
    "Traefik v1 syntax: migrate to v2 first (traefik's own migration tool) or write the v2 equivalent";

/// Top-level keys of a v1 static/dynamic file (lowercase) that v2 does not have.
const STATIC: &[&str] = &[
    "defaultentrypoints",
    "frontends",
    "backends",
    "file",
    "docker",
    "web",
    "acme",
    "marathon",
    "consul",
    "consulcatalog",
    "etcd",
    "zookeeper",
    "boltdb",
    "kubernetes",
    "rancher",
    "ecs",
    "eureka",
    "dynamodb",
    "servicefabric",
    "mesos",
    "rest",
    "traefiklogsfile",
    "accesslogsfile",
    "loglevel",
    "debug",
    "checknewversion",
    "sendanonymoususage",
    "insecureskipverify",
    "rootcas",
    "maxidleconnsperhost",
    "idletimeout",
    "gracetimeout",
    "retry",
    "healthcheck",
    "respondingtimeouts",
    "forwardingtimeouts",
    "lifecycle",
    "constraints",
    "keeptrailingslash",
    "allowminweightzero",
];

/// Whether a top-level key (lowercase) is v1 syntax.
pub fn is_static_key(lower: &str) -> bool {
    STATIC.contains(&lower)
}

/// Whether an entry point's option (lowercase) is v1 syntax (`tls`, `redirect`, `auth`...).
pub fn is_entry_point_key(lower: &str) -> bool {
    matches!(
        lower,
        "tls" | "redirect" | "auth" | "compress" | "whitelist" | "whitelistsourcerange"
    )
}

/// Whether a docker label (without `traefik.`, lowercase) is v1 syntax: `frontend.rule`,
/// `port`, `backend`, `protocol`, `weight`, `domain`, or `NAME.frontend.rule` (segment
/// labels).
pub fn is_label(lower: &str) -> bool {
    let mut segs = lower.split('.');
    let first = segs.next().unwrap_or_default();
    let second = segs.next().unwrap_or_default();
    const V1: &[&str] = &[
        "frontend",
        "backend",
        "port",
        "protocol",
        "weight",
        "domain",
        "frontends",
        "backends",
    ];
    V1.contains(&first) || (!matches!(first, "http" | "tcp" | "udp") && V1.contains(&second))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_labels_and_keys() {
        assert!(is_label("frontend.rule"));
        assert!(is_label("port"));
        assert!(is_label("web.frontend.rule"));
        assert!(!is_label("http.routers.frontend.rule"));
        assert!(!is_label("http.services.port.loadbalancer.server.port"));
        assert!(is_static_key("frontends"));
        assert!(!is_static_key("entrypoints"));
        assert!(is_entry_point_key("redirect"));
        assert!(!is_entry_point_key("http"));
    }
}
