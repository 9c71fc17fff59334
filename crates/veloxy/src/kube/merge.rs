//! Puts the Ingress translation into the file's config: the file's listeners, routes, server
//! settings and groups stay as written; the Ingress routes go on `http_listener` (and, for
//! TLS hosts, `https_listener`), their upstream groups and rule sets are added under a `k8s-`
//! prefix, and the certificates of Ingress TLS Secrets join the https listener's
//! `[[listeners.NAME.tls.certs]]`.

use std::path::Path;

use toml::{Table, Value};
use veloxy_engine::config::KubernetesSpec;
use veloxy_import::Config;

/// The prefix of the names of Ingress-made upstream groups, rule sets and caches.
pub const PREFIX: &str = "k8s-";

/// Route keys that only make sense when the route proxies (dropped from a route whose
/// Service has no ready endpoint: it answers 503 instead).
const PROXY_ONLY: &[&str] = &[
    "rewrite",
    "strip_prefix",
    "location_rewrite",
    "forward_auth",
    "cache",
    "mirror",
];

/// A route value naming one of the translation's generated files (a basic-auth users file)
/// made absolute: the file is written under `out_dir`, and the merged config is read as if
/// it were the config file, from that file's directory.
fn absolute_files(v: &mut Value, imported: &Config, out_dir: &Path) {
    match v {
        Value::String(s) if imported.files.iter().any(|f| f.name == *s) => {
            *s = out_dir.join(&*s).display().to_string();
        }
        Value::Table(t) => t
            .iter_mut()
            .for_each(|(_, v)| absolute_files(v, imported, out_dir)),
        Value::Array(a) => a
            .iter_mut()
            .for_each(|v| absolute_files(v, imported, out_dir)),
        _ => {}
    }
}

/// Merges `imported` into `file` (the config file as a TOML table). `out_dir`: where the
/// translation's generated files (certificates and keys) were written. Returns lines for the
/// log about what could not be merged.
pub fn merge(
    file: &mut Table,
    imported: &Config,
    spec: &KubernetesSpec,
    out_dir: &Path,
) -> Vec<String> {
    let mut notes = Vec::new();
    let empty_groups = add_named(
        file,
        "upstreams",
        &imported.upstreams,
        |s| matches!(s.get("servers"), Some(Value::Array(a)) if a.is_empty()),
    );
    add_named(file, "rule_sets", &imported.rule_sets, |_| false);
    add_named(file, "caches", &imported.caches, |_| false);
    let https_in_import = imported.listeners.iter().any(|(n, _)| n == "https");
    let listener_wide = imported
        .listeners
        .iter()
        .find(|(n, _)| n == "http")
        .and_then(|(_, s)| s.get("redirect_https"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let https = spec.https_listener.as_deref();
    if https_in_import && https.is_none() {
        notes.push(
            "Ingress TLS is not served: [providers.kubernetes] names no https_listener".into(),
        );
    }
    let mut redirect_hosts: Vec<Value> = Vec::new();
    let mut routes = Vec::new();
    for r in &imported.routes {
        let mut t: Table = r.keys.iter().cloned().collect();
        rename_refs(&mut t, &empty_groups);
        for (_, v) in t.iter_mut() {
            absolute_files(v, imported, out_dir);
        }
        let on: Vec<&str> = match t.get("listener").and_then(Value::as_str) {
            Some("https") => https.into_iter().collect(),
            Some(_) => vec![spec.http_listener.as_str()],
            None if listener_wide && https.is_some() => {
                if let Some(h) = t.get("host") {
                    match h {
                        Value::Array(a) => redirect_hosts.extend(a.iter().cloned()),
                        other => redirect_hosts.push(other.clone()),
                    }
                }
                https.into_iter().collect()
            }
            None if https_in_import => std::iter::once(spec.http_listener.as_str())
                .chain(https)
                .collect(),
            None => vec![spec.http_listener.as_str()],
        };
        if on.is_empty() {
            continue;
        }
        let listeners = Value::Array(on.iter().map(|l| Value::from(*l)).collect());
        t.insert("listener".into(), listeners);
        routes.push(Value::Table(t));
    }
    if !redirect_hosts.is_empty() {
        redirect_hosts.dedup();
        let mut redirect = Table::new();
        redirect.insert("to".into(), "https://{host}{uri}".into());
        redirect.insert("status".into(), 308.into());
        let mut t = Table::new();
        t.insert("listener".into(), spec.http_listener.as_str().into());
        t.insert("host".into(), Value::Array(redirect_hosts));
        t.insert("redirect".into(), Value::Table(redirect));
        routes.push(Value::Table(t));
    }
    array(file, "routes").extend(routes);
    if let Some(https) = https {
        notes.extend(add_certs(file, imported, https, out_dir));
    }
    if !imported.streams.is_empty() {
        notes.push(
            "ssl-passthrough Ingresses are not served by the provider yet (their [[streams]] \
             are left out)"
                .into(),
        );
    }
    notes
}

/// Adds `sections` to the table `key` under prefixed names; returns the prefixed names of
/// those for which `empty` holds (they are left out).
fn add_named(
    file: &mut Table,
    key: &str,
    sections: &[(String, veloxy_import::Section)],
    empty: impl Fn(&veloxy_import::Section) -> bool,
) -> Vec<String> {
    let mut left_out = Vec::new();
    if sections.is_empty() {
        return left_out;
    }
    let target = table(file, key);
    for (name, s) in sections {
        let name = format!("{PREFIX}{name}");
        if empty(s) {
            left_out.push(name);
            continue;
        }
        target.insert(name, Value::Table(s.keys.iter().cloned().collect()));
    }
    left_out
}

/// Adds the Gateway API translation: its routes after the file's and the Ingresses', its
/// streams after the file's, its groups, its copies of the file's listeners on Gateway
/// addresses, and its certificates to their listeners' `tls.certs`.
pub fn add_gateway(
    file: &mut Table,
    (routes, streams): (Vec<Value>, Vec<Value>),
    (upstreams, listeners): (Table, Table),
    certs: Vec<(String, Value)>,
) {
    // The listeners copied onto Gateway addresses first: their certificates go into them.
    if !listeners.is_empty() {
        table(file, "listeners").extend(listeners);
    }
    if !upstreams.is_empty() {
        table(file, "upstreams").extend(upstreams);
    }
    if !routes.is_empty() {
        array(file, "routes").extend(routes);
    }
    if !streams.is_empty() {
        array(file, "streams").extend(streams);
    }
    for (listener, cert) in certs {
        let l = table(table(file, "listeners"), &listener);
        array(table(l, "tls"), "certs").push(cert);
    }
}

/// Prefixes the group, rule set and cache names a route refers to; a route whose group has
/// no server answers 503.
fn rename_refs(t: &mut Table, empty_groups: &[String]) {
    let prefixed = |v: &mut Value| {
        if let Value::String(s) = v {
            *s = format!("{PREFIX}{s}");
        }
    };
    if let Some(u) = t.get_mut("upstream") {
        prefixed(u);
    }
    if let Some(Value::Array(list)) = t.get_mut("use") {
        list.iter_mut().for_each(prefixed);
    }
    for (outer, inner) in [("forward_auth", "upstream"), ("cache", "store")] {
        if let Some(Value::Table(f)) = t.get_mut(outer) {
            if let Some(u) = f.get_mut(inner) {
                prefixed(u);
            }
        }
    }
    mirrors_renamed(t, empty_groups);
    let empty = t
        .get("upstream")
        .and_then(Value::as_str)
        .is_some_and(|u| empty_groups.iter().any(|g| g == u));
    if empty {
        t.remove("upstream");
        for k in PROXY_ONLY {
            t.remove(*k);
        }
        let mut respond = Table::new();
        respond.insert("status".into(), 503.into());
        respond.insert("body".into(), "no ready endpoint\n".into());
        t.insert("respond".into(), Value::Table(respond));
    }
}

/// The route's `mirror` tables (one table or a list) with their groups prefixed; a table
/// whose group has no ready endpoint (left out of the config) is dropped, and so is the key
/// when none is left: the copies stop, the primary traffic stays.
fn mirrors_renamed(t: &mut Table, empty_groups: &[String]) {
    let Some(m) = t.remove("mirror") else {
        return;
    };
    let list = match m {
        Value::Array(list) => list,
        one => vec![one],
    };
    let kept: Vec<Value> = list
        .into_iter()
        .filter_map(|mut v| {
            let u = v.as_table_mut()?.get_mut("upstream")?;
            let name = format!("{PREFIX}{}", u.as_str()?);
            if empty_groups.contains(&name) {
                return None;
            }
            *u = name.into();
            Some(v)
        })
        .collect();
    if !kept.is_empty() {
        t.insert("mirror".into(), Value::Array(kept));
    }
}

/// The Ingress certificates as entries of the https listener's `tls.certs`, their paths made
/// absolute (they are written under `out_dir`).
fn add_certs(file: &mut Table, imported: &Config, https: &str, out_dir: &Path) -> Vec<String> {
    let Some((_, l)) = imported.listeners.iter().find(|(n, _)| n == "https") else {
        return Vec::new();
    };
    let Some(Value::Table(tls)) = l.get("tls") else {
        return Vec::new();
    };
    let mut notes = Vec::new();
    if tls.contains_key("acme") {
        notes.push("Ingress hosts with cert-manager annotations and no Secret: not served".into());
    }
    let Some(Value::Array(certs)) = tls.get("certs") else {
        return notes;
    };
    let abs = |v: &Value| -> Value {
        match v.as_str() {
            Some(p) => out_dir.join(p).display().to_string().into(),
            None => v.clone(),
        }
    };
    let mut entries = Vec::new();
    for c in certs {
        let Value::Table(c) = c else { continue };
        let mut c = c.clone();
        for k in ["cert", "key"] {
            if let Some(v) = c.get(k).map(abs) {
                c.insert(k.into(), v);
            }
        }
        entries.push(Value::Table(c));
    }
    let listener = table(table(file, "listeners"), https);
    array(table(listener, "tls"), "certs").extend(entries);
    notes
}

/// Sections whose entries are named sections (`[listeners.NAME]`).
const NAMED: &[&str] = &["listeners", "upstreams", "rule_sets", "caches"];

/// `config` as TOML text: one header per section (`[server]`, `[listeners.NAME]`,
/// `[[routes]]`...), everything below it inline. The config parser keeps the place of most
/// values for its messages, which a table written only through a deeper header
/// (`[rule_sets.x.response_headers.set]`) does not have, so no such header is written.
pub fn render(config: &Table) -> String {
    use std::fmt::Write as _;
    use veloxy_import::model::{inline, key};
    let mut out = String::new();
    let section = |out: &mut String, header: String, t: &Table| {
        let _ = writeln!(out, "\n{header}");
        for (k, v) in t {
            let _ = writeln!(out, "{} = {}", key(k), inline(v));
        }
    };
    let tables = |items: &[Value]| !items.is_empty() && items.iter().all(Value::is_table);
    // Top-level values first: after a header they would belong to its section.
    for (k, v) in config {
        match v {
            Value::Table(_) => {}
            Value::Array(items) if tables(items) => {}
            _ => {
                let _ = writeln!(out, "{} = {}", key(k), inline(v));
            }
        }
    }
    for (k, v) in config {
        match v {
            Value::Table(t) if NAMED.contains(&k.as_str()) => {
                for (name, s) in t {
                    match s {
                        Value::Table(s) => section(&mut out, format!("[{k}.{}]", key(name)), s),
                        other => {
                            let _ = writeln!(out, "\n[{k}]\n{} = {}", key(name), inline(other));
                        }
                    }
                }
            }
            Value::Table(t) => section(&mut out, format!("[{}]", key(k)), t),
            Value::Array(items) if tables(items) => {
                for item in items.iter().filter_map(Value::as_table) {
                    section(&mut out, format!("[[{}]]", key(k)), item);
                }
            }
            _ => {}
        }
    }
    out
}

/// The table under `key` (made when absent or not a table).
fn table<'t>(t: &'t mut Table, key: &str) -> &'t mut Table {
    if !matches!(t.get(key), Some(Value::Table(_))) {
        t.insert(key.into(), Value::Table(Table::new()));
    }
    match t.get_mut(key) {
        Some(Value::Table(x)) => x,
        _ => unreachable!("just made a table"),
    }
}

/// The array under `key` (made when absent or not an array).
fn array<'t>(t: &'t mut Table, key: &str) -> &'t mut Vec<Value> {
    if !matches!(t.get(key), Some(Value::Array(_))) {
        t.insert(key.into(), Value::Array(Vec::new()));
    }
    match t.get_mut(key) {
        Some(Value::Array(x)) => x,
        _ => unreachable!("just made an array"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> KubernetesSpec {
        KubernetesSpec {
            https_listener: Some("websecure".into()),
            ..crate::kube::test_spec()
        }
    }

    fn imported(yaml: &str, services: &[(&str, &str)]) -> Config {
        let docs = veloxy_import::tree::parse_yaml(&"test".into(), yaml).unwrap();
        let opts = veloxy_import::Options {
            services: services
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        veloxy_import_ingress::import_docs(&docs, &opts)
            .unwrap()
            .config
    }

    const ING: &str = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: a, \
                       namespace: ns}\nspec:\n  rules:\n  - host: a.example\n    http:\n      \
                       paths:\n      - {path: /, pathType: Prefix, backend: {service: {name: \
                       web, port: {number: 80}}}}\n";

    #[test]
    fn ingress_routes_go_on_the_http_listener_with_prefixed_groups() {
        let mut file: Table = toml::from_str(
            "[listeners.web]\naddr = \":80\"\n[upstreams.web]\nservers = [\"10.0.0.1:1\"]\n",
        )
        .unwrap();
        let notes = merge(
            &mut file,
            &imported(ING, &[("web.ns:80", "192.0.2.10:8080,192.0.2.11:8080")]),
            &spec(),
            Path::new("/x"),
        );
        assert!(notes.is_empty(), "{notes:?}");
        let text = render(&file);
        let reread: Table = toml::from_str(&text).unwrap();
        assert_eq!(reread, file, "render writes what it was given: {text}");
        let routes = file["routes"].as_array().unwrap();
        assert_eq!(routes.len(), 1, "{text}");
        assert_eq!(routes[0]["listener"], Value::Array(vec!["web".into()]));
        assert_eq!(routes[0]["upstream"].as_str(), Some("k8s-web"), "{text}");
        let servers = &file["upstreams"]["k8s-web"]["servers"];
        assert_eq!(
            servers,
            &Value::Array(vec!["192.0.2.10:8080".into(), "192.0.2.11:8080".into()])
        );
        assert!(
            file["upstreams"].get("web").is_some(),
            "the file's group stays"
        );
        let uses = routes[0]["use"].as_array().unwrap();
        assert!(uses.iter().all(|u| u.as_str().unwrap().starts_with(PREFIX)));
    }

    #[test]
    fn a_service_without_ready_endpoints_answers_503() {
        let mut file: Table = toml::from_str("[listeners.web]\naddr = \":80\"\n").unwrap();
        merge(
            &mut file,
            &imported(ING, &[("web.ns:80", "")]),
            &spec(),
            Path::new("/x"),
        );
        let route = &file["routes"][0];
        assert!(route.get("upstream").is_none(), "{route}");
        assert_eq!(route["respond"]["status"].as_integer(), Some(503));
        let groups = file.get("upstreams").and_then(Value::as_table);
        assert!(groups.is_none_or(Table::is_empty), "{groups:?}");
    }

    /// `mirror-target`: the route's mirror names the prefixed group; a mirror Service without
    /// ready endpoints drops the copies, not the route; a route answering 503 keeps no mirror.
    /// (Without this the merged config named a group that does not exist, and the provider
    /// left the whole Ingress out.)
    #[test]
    fn mirror_groups_are_renamed_and_dropped_with_their_endpoints() {
        let ing = ING.replace(
            "namespace: ns}",
            "namespace: ns, annotations: {nginx.ingress.kubernetes.io/mirror-target: \
             'http://shadow.ns.svc.cluster.local:8080$request_uri'}}",
        );
        let run = |web: &str, shadow: &str| {
            let mut file: Table = toml::from_str("[listeners.web]\naddr = \":80\"\n").unwrap();
            let services = [("web.ns:80", web), ("shadow.ns:8080", shadow)];
            merge(
                &mut file,
                &imported(&ing, &services),
                &spec(),
                Path::new("/x"),
            );
            file
        };
        let file = run("192.0.2.10:80", "192.0.2.20:8080");
        let route = &file["routes"][0];
        let m = route["mirror"][0]["upstream"].as_str().unwrap();
        assert!(m.starts_with(PREFIX), "{route}");
        assert!(file["upstreams"].get(m).is_some(), "{file}");
        let file = run("192.0.2.10:80", "");
        let route = &file["routes"][0];
        assert!(route.get("mirror").is_none(), "{route}");
        assert!(route.get("upstream").is_some(), "{route}");
        let file = run("", "192.0.2.20:8080");
        let route = &file["routes"][0];
        assert!(
            route.get("mirror").is_none() && route.get("respond").is_some(),
            "{route}"
        );
    }
}
