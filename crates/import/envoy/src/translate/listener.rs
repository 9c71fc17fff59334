//! `static_resources.listeners`: the address, listener filters, filter chains (matched by
//! SNI), downstream TLS, and the network filters (HTTP connection manager, TCP proxy).

use toml::Value;
use veloxy_import::tree::Node;
use veloxy_import::{Config, GeneratedFile, Loc};

use super::Ctx;
use crate::util::{data_source, seq, socket_address, typed, DataSource, Fields};

const HCM: &str = "HttpConnectionManager";
const TCP: &str = "TcpProxy";

/// What a network filter is, from its `@type` or its name.
fn filter_kind(f: &Node) -> String {
    if let Some(tc) = f.get("typed_config") {
        let (ty, _) = typed(tc);
        if let Some(last) = ty.rsplit('.').next().filter(|s| !s.is_empty()) {
            return last.to_string();
        }
    }
    match f.get("name").and_then(|n| n.scalar()).as_deref() {
        Some("envoy.filters.network.http_connection_manager" | "envoy.http_connection_manager") => {
            HCM.into()
        }
        Some("envoy.filters.network.tcp_proxy" | "envoy.tcp_proxy") => TCP.into(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// Whether a listener has an HTTP connection manager.
pub fn has_http(l: &Node) -> bool {
    chains(l).iter().any(|c| {
        seq(c.get("filters").unwrap_or(c))
            .iter()
            .any(|f| filter_kind(f) == HCM)
    })
}

/// The filter chains of a listener (`default_filter_chain` last).
fn chains(l: &Node) -> Vec<&Node> {
    let mut out: Vec<&Node> = l
        .get("filter_chains")
        .map(|c| seq(c).iter().collect())
        .unwrap_or_default();
    if let Some(d) = l.get("default_filter_chain") {
        out.push(d);
    }
    out
}

/// One filter chain, read.
struct Chain<'a> {
    node: &'a Node,
    names: Vec<String>,
    tls: Option<(String, String)>,
    alpn_h2: bool,
}

/// Translates one listener.
pub fn listener(ctx: &mut Ctx, l: &Node) {
    let mut f = Fields::new(l, "listener");
    let given = f.take("name").and_then(|(_, n)| n.scalar());
    let raw = given
        .clone()
        .unwrap_or_else(|| format!("listener_{}", ctx.cfg.listeners.len() + 1));
    let name = Config::unique(&ctx.cfg.listeners, &raw);
    if let Some(g) = given {
        ctx.listener_names.push((g, name.clone()));
    }
    let Some((aloc, addr)) = f.take("address") else {
        ctx.r
            .refused(&l.loc, "listener", "a listener without an address");
        f.finish(&mut ctx.r);
        return;
    };
    let addr = match socket_address(addr) {
        Ok((host, Some(port), true)) => format!("{host}:{port}"),
        Ok(_) => {
            ctx.r
                .refused(aloc, "listener.address", "not an IP address and port");
            f.finish(&mut ctx.r);
            return;
        }
        Err(e) => {
            ctx.r.refused(aloc, "listener.address", e);
            f.finish(&mut ctx.r);
            return;
        }
    };
    ctx.cfg.listener(&name, aloc).set("addr", addr);
    ctx.r.translated(aloc, "listener.address");
    if let Some((_, lf)) = f.take("listener_filters") {
        listener_filters(ctx, &name, lf);
    }
    f.refuse(
        &mut ctx.r,
        "additional_addresses",
        "a listener on several addresses: write one listener per address",
    );
    f.refuse(
        &mut ctx.r,
        "udp_listener_config",
        "a UDP (QUIC) listener: use http3 = true on a TLS listener instead",
    );
    f.ignore(
        &mut ctx.r,
        "listener_filters_timeout",
        "veloxy bounds the wait for the ClientHello by header_timeout",
    );
    if let Some((loc, _)) = f.take("access_log") {
        super::filters::access_log(ctx, loc, "listener.access_log");
    }
    let mut read = Vec::new();
    for key in ["filter_chains", "default_filter_chain"] {
        let Some((_, v)) = f.take(key) else { continue };
        let items: Vec<&Node> = if key == "default_filter_chain" {
            vec![v]
        } else {
            seq(v).iter().collect()
        };
        for c in items {
            read.push(chain(ctx, c));
        }
    }
    f.finish(&mut ctx.r);
    tls(ctx, &name, &read);
    let http = read
        .iter()
        .filter(|c| kinds(c.node).contains(&HCM.to_string()))
        .count();
    for c in &read {
        network_filters(ctx, &name, c, http);
    }
}

fn kinds(c: &Node) -> Vec<String> {
    seq(c.get("filters").unwrap_or(c))
        .iter()
        .map(filter_kind)
        .collect()
}

/// `listener_filters`: the TLS inspector (SNI), the PROXY protocol.
fn listener_filters(ctx: &mut Ctx, name: &str, lf: &Node) {
    for x in seq(lf) {
        let kind = x.get("name").and_then(|n| n.scalar()).unwrap_or_default();
        let ty = x
            .get("typed_config")
            .map(|t| typed(t).0)
            .unwrap_or_default();
        let d = format!("listener_filters.{kind}");
        if kind.contains("tls_inspector") || ty.ends_with("TlsInspector") {
            ctx.r.translated(&x.loc, d);
        } else if kind.contains("http_inspector") || ty.ends_with("HttpInspector") {
            ctx.r.ignored(
                &x.loc,
                d,
                "veloxy tells HTTP/1 from HTTP/2 by the connection preface itself",
            );
        } else if kind.contains("proxy_protocol") || ty.ends_with("ProxyProtocol") {
            ctx.cfg.listener(name, &x.loc).set("proxy_protocol", true);
            ctx.r.different(
                &x.loc,
                d,
                "veloxy reads the PROXY header only from [server] trusted_proxies (list the \
                 load balancer's addresses there) and closes other connections; Envoy reads it \
                 from any peer",
            );
        } else {
            ctx.r
                .refused(&x.loc, d, "veloxy lacks this listener filter");
        }
    }
}

/// Reads a filter chain's match and TLS context.
fn chain<'a>(ctx: &mut Ctx, c: &'a Node) -> Chain<'a> {
    let mut f = Fields::new(c, "filter_chain");
    let mut names = Vec::new();
    if let Some((_, m)) = f.take("filter_chain_match") {
        let mut mf = Fields::new(m, "filter_chain_match");
        if let Some((loc, sn)) = mf.take("server_names") {
            names = seq(sn).iter().filter_map(|n| n.scalar()).collect();
            ctx.r.translated(loc, "filter_chain_match.server_names");
        }
        if let Some((loc, tp)) = mf.take("transport_protocol") {
            match tp.scalar().as_deref() {
                Some("tls") => ctx
                    .r
                    .translated(loc, "filter_chain_match.transport_protocol"),
                _ => ctx.r.refused(
                    loc,
                    "filter_chain_match.transport_protocol",
                    "a chain for plain connections on a listener that also takes TLS: veloxy's \
                     listeners are either",
                ),
            }
        }
        mf.finish(&mut ctx.r);
    }
    let mut tls = None;
    let mut alpn_h2 = false;
    if let Some((loc, ts)) = f.take("transport_socket") {
        if let Some((pair, h2)) = downstream_tls(ctx, loc, ts) {
            tls = Some(pair);
            alpn_h2 = h2;
        }
    }
    f.ignore(
        &mut ctx.r,
        "transport_socket_connect_timeout",
        "veloxy bounds TLS handshakes by header_timeout",
    );
    f.take("filters");
    f.finish(&mut ctx.r);
    Chain {
        node: c,
        names,
        tls,
        alpn_h2,
    }
}

/// A `DownstreamTlsContext`: the certificate pair, and whether ALPN offers h2.
fn downstream_tls(ctx: &mut Ctx, loc: &Loc, ts: &Node) -> Option<((String, String), bool)> {
    let (ty, body) = typed(ts.get("typed_config").unwrap_or(ts));
    if !ty.ends_with("DownstreamTlsContext") {
        ctx.r
            .refused(loc, "transport_socket", format!("{ty}: veloxy lacks it"));
        return None;
    }
    let body = body?;
    let common = body.get("common_tls_context");
    let alpn: Vec<String> = common
        .and_then(|c| c.get("alpn_protocols"))
        .map(|a| seq(a).iter().filter_map(|x| x.scalar()).collect())
        .unwrap_or_default();
    if body
        .get("require_client_certificate")
        .and_then(|b| b.as_bool())
        .unwrap_or(false)
        || common.and_then(|c| c.get("validation_context")).is_some()
    {
        ctx.r.refused(
            loc,
            "transport_socket",
            "client certificates (mTLS, validation_context): veloxy does not verify clients",
        );
        return None;
    }
    let cert = common
        .and_then(|c| c.get("tls_certificates"))
        .and_then(|t| t.as_seq()?.first().cloned())
        .or_else(|| {
            let sds = common?
                .get("tls_certificate_sds_secret_configs")?
                .as_seq()?
                .first()?
                .get("name")?
                .scalar()?;
            ctx.secrets
                .iter()
                .find(|(n, _)| *n == sds)
                .map(|(_, c)| c.clone())
        });
    let Some(cert) = cert else {
        ctx.r
            .refused(loc, "transport_socket", "no certificate in the TLS context");
        return None;
    };
    let pair = (
        cert.get("certificate_chain").map(data_source),
        cert.get("private_key").map(data_source),
    );
    let (Some(c), Some(k)) = pair else {
        ctx.r.refused(
            loc,
            "transport_socket",
            "a certificate without certificate_chain and private_key",
        );
        return None;
    };
    let c = file(ctx, loc, c, "cert", 0o644)?;
    let k = file(ctx, loc, k, "key", 0o600)?;
    let mut diffs = Vec::new();
    if let Some(p) = common.and_then(|c| c.get("tls_params")) {
        let min = p
            .get("tls_minimum_protocol_version")
            .and_then(|v| v.scalar())
            .unwrap_or_default();
        if matches!(min.as_str(), "TLSv1_0" | "TLSv1_1" | "TLS_AUTO" | "") {
            diffs.push("veloxy offers TLS 1.2 and 1.3 only");
        } else if min == "TLSv1_3" {
            diffs.push("veloxy also accepts TLS 1.2");
        }
        if p.get("cipher_suites").is_some() || p.get("ecdh_curves").is_some() {
            diffs.push("veloxy's cipher suites and curves are rustls' defaults");
        }
    }
    if alpn.is_empty() {
        diffs.push(
            "Envoy offers no ALPN here, so clients speak HTTP/1.1; veloxy offers h2 (http2 = \
             false keeps HTTP/1.1 only)",
        );
    }
    if diffs.is_empty() {
        ctx.r.translated(loc, "transport_socket");
    } else {
        ctx.r.different(loc, "transport_socket", diffs.join("; "));
    }
    Some(((c, k), alpn.is_empty() || alpn.iter().any(|a| a == "h2")))
}

/// A certificate or key: a path kept, inline PEM written beside the output.
fn file(ctx: &mut Ctx, loc: &Loc, d: DataSource, what: &str, mode: u32) -> Option<String> {
    match d {
        DataSource::File(p) => Some(ctx.path(&p)),
        DataSource::Inline(text) => {
            let n = ctx.cfg.files.len() + 1;
            let name = format!("envoy-{what}-{n}.pem");
            ctx.cfg.files.push(GeneratedFile {
                name: name.clone(),
                contents: text,
                mode,
            });
            Some(name)
        }
        DataSource::Other(what) => {
            ctx.r.refused(
                loc,
                "transport_socket",
                format!("a certificate from {what}: give a filename"),
            );
            None
        }
    }
}

/// The listener's TLS: the chain without server_names gives `cert`, the others `[[certs]]`.
fn tls(ctx: &mut Ctx, name: &str, chains: &[Chain]) {
    let mut t = toml::Table::new();
    let mut certs = Vec::new();
    let mut h2 = false;
    let mut any = false;
    for c in chains {
        let Some((cert, key)) = &c.tls else { continue };
        any = true;
        h2 |= c.alpn_h2;
        if c.names.is_empty() && !t.contains_key("cert") {
            t.insert("cert".into(), cert.clone().into());
            t.insert("key".into(), key.clone().into());
        } else {
            let mut e = toml::Table::new();
            let hosts: Vec<Value> = c.names.iter().map(|n| n.clone().into()).collect();
            e.insert("hosts".into(), Value::Array(hosts));
            e.insert("cert".into(), cert.clone().into());
            e.insert("key".into(), key.clone().into());
            certs.push(Value::Table(e));
        }
    }
    if !any {
        return;
    }
    if !certs.is_empty() {
        t.insert("certs".into(), Value::Array(certs));
    }
    let loc = chains[0].node.loc.clone();
    let l = ctx.cfg.listener(name, &loc);
    if !h2 {
        l.set("http2", false);
    }
    l.set("tls", Value::Table(t));
}

/// The network filters of one chain.
fn network_filters(ctx: &mut Ctx, listener: &str, c: &Chain, http_chains: usize) {
    let Some(filters) = c.node.get("filters") else {
        return;
    };
    let tls = ctx
        .cfg
        .listeners
        .iter()
        .any(|(n, s)| n == listener && s.get("tls").is_some());
    for x in seq(filters) {
        let kind = filter_kind(x);
        let name = x
            .get("name")
            .and_then(|n| n.scalar())
            .unwrap_or(kind.clone());
        let d = format!("filters.{name}");
        let body = x.get("typed_config").and_then(|t| typed(t).1);
        match (kind.as_str(), body) {
            (HCM, Some(b)) => {
                let sni = if http_chains > 1 {
                    c.names.clone()
                } else {
                    Vec::new()
                };
                super::hcm::hcm(ctx, listener, tls, &sni, &x.loc, &d, b);
            }
            (TCP, Some(b)) => tcp_proxy(ctx, listener, c, &x.loc, &d, b),
            _ => ctx.r.refused(
                &x.loc,
                d,
                "veloxy lacks this network filter (it proxies HTTP and relays TCP)",
            ),
        }
    }
}

/// `tcp_proxy`: a tcp listener and its stream, or SNI passthrough on a TLS listener.
fn tcp_proxy(ctx: &mut Ctx, listener: &str, c: &Chain, loc: &Loc, d: &str, b: &Node) {
    let mut f = Fields::new(b, "tcp_proxy");
    f.take("@type");
    let cluster = f.take("cluster").and_then(|(_, n)| n.scalar());
    f.refuse(
        &mut ctx.r,
        "weighted_clusters",
        "a weighted split between clusters: veloxy relays a listener to one group",
    );
    f.ignore(
        &mut ctx.r,
        "idle_timeout",
        "veloxy closes idle relayed connections after the group's idle_timeout",
    );
    f.ignore(
        &mut ctx.r,
        "max_connect_attempts",
        "veloxy moves on to the next backend `retries` times",
    );
    if let Some((aloc, _)) = f.take("access_log") {
        super::filters::access_log(ctx, aloc, "tcp_proxy.access_log");
    }
    f.finish(&mut ctx.r);
    let Some(cluster) = cluster else {
        ctx.r.refused(loc, d, "a tcp_proxy without a cluster");
        return;
    };
    if c.tls.is_some() {
        ctx.r.refused(
            loc,
            d,
            "TLS terminated in front of a TCP relay: veloxy relays TLS untouched (SNI \
             passthrough) or terminates it for HTTP",
        );
        return;
    }
    let Some(group) = ctx.plain_group(&cluster) else {
        ctx.r.refused(
            loc,
            d,
            format!("cluster {cluster} is not defined or has no endpoint veloxy can use"),
        );
        return;
    };
    let has_tls = ctx
        .cfg
        .listeners
        .iter()
        .any(|(n, s)| n == listener && s.get("tls").is_some());
    let mut s = veloxy_import::Section::from(loc);
    s.set("listener", listener);
    if !c.names.is_empty() {
        if !has_tls {
            ctx.r.refused(
                loc,
                d,
                "SNI passthrough on a listener that terminates no TLS: veloxy answers the names \
                 no passthrough takes itself and needs a certificate for them (Envoy closes \
                 those connections)",
            );
            return;
        }
        let names: Vec<Value> = c.names.iter().map(|n| n.clone().into()).collect();
        s.set("sni", Value::Array(names));
        ctx.r.translated(loc, d);
    } else {
        if has_tls || has_http_chain(ctx, listener) {
            ctx.r.refused(
                loc,
                d,
                "a TCP relay for connections no other chain takes, on a listener that also \
                 serves HTTP: veloxy's listeners are either",
            );
            return;
        }
        ctx.cfg.listener(listener, loc).set("protocol", "tcp");
        ctx.r.translated(loc, d);
    }
    s.set("upstream", group);
    ctx.cfg.streams.push(s);
}

fn has_http_chain(ctx: &Ctx, listener: &str) -> bool {
    ctx.route_lists
        .iter()
        .any(|(ls, _)| ls.iter().any(|l| l == listener))
}
