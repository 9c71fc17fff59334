//! `basicAuth` (inline users become a generated htpasswd file, 0600) and `forwardAuth` (the
//! address becomes an upstream group and the route's `forward_auth`).

use veloxy_import::tree::Node;
use veloxy_import::GeneratedFile;

use crate::input::Named;
use crate::node::{entries, flag, get, get_kv, list_at, text};
use crate::route::Route;
use crate::translate::Ctx;

type Notes = Result<Vec<String>, String>;

/// `basicAuth`.
pub fn basic(ctx: &mut Ctx, mw: &Named, cfg: &Node, routes: &mut [Route]) -> Notes {
    let users = list_at(cfg, "users");
    let mut notes = Vec::new();
    let file = if !users.is_empty() {
        let mut contents = String::new();
        for (u, _) in &users {
            let Some((name, hash)) = u.split_once(':') else {
                return Err(format!("user entry {u:?} is not user:hash"));
            };
            if !(hash.starts_with("$2") || hash.starts_with("$apr1$")) {
                return Err(format!("user {name}'s hash is neither bcrypt nor $apr1$ (veloxy verifies those two; re-hash with htpasswd -B)"));
            }
            contents.push_str(&format!("{name}:{hash}\n"));
        }
        let name = format!("htpasswd-{}", veloxy_import::model::sanitize(&mw.name));
        if !ctx.cfg.files.iter().any(|f| f.name == name) {
            ctx.cfg.files.push(GeneratedFile {
                name: name.clone(),
                contents,
                mode: 0o600,
            });
        }
        if get(cfg, "usersFile").is_some() {
            notes.push("usersFile is not merged with the inline users: only the inline ones are in the generated file".to_string());
        }
        name
    } else if let Some(f) = text(cfg, "usersFile") {
        ctx.opts.out_path(&mw.base, &f)
    } else {
        return Err("no users and no usersFile".into());
    };
    let mut t = toml::Table::new();
    t.insert(
        "realm".into(),
        text(cfg, "realm")
            .unwrap_or_else(|| "traefik".into())
            .into(),
    );
    t.insert("users_file".into(), file.into());
    for r in routes.iter_mut() {
        r.set("basic_auth", toml::Value::Table(t.clone()));
        if flag(cfg, "removeHeader") == Some(true) {
            r.req("Authorization", "");
        }
    }
    notes.push("veloxy's WWW-Authenticate adds charset=\"UTF-8\" after the realm".into());
    if users.iter().any(|(u, _)| u.contains(":$apr1$")) {
        notes.push("veloxy warns at load about $apr1$ (MD5) hashes".into());
    }
    sub_refusal(
        ctx,
        mw,
        cfg,
        "headerField",
        "veloxy does not pass the authenticated user's name upstream",
    );
    Ok(notes)
}

/// A refused option of a middleware on its own line.
fn sub_refusal(ctx: &mut Ctx, mw: &Named, cfg: &Node, key: &str, why: &str) {
    if let Some((k, _)) = get_kv(cfg, key) {
        let kind = entries(&mw.node)
            .first()
            .map(|(k, _)| k.name.clone())
            .unwrap_or_default();
        let d = format!("http.middlewares.{}.{kind}.{}", mw.name, k.name);
        ctx.lines.at(&d, &k.loc, &d).refuse(why);
    }
}

/// A URL's parts: (https, host:port, path with query).
pub fn split_url(url: &str) -> Option<(bool, String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let https = match scheme.to_ascii_lowercase().as_str() {
        "http" | "h2c" => false,
        "https" => true,
        _ => return None,
    };
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let hostport = if hostport
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !hostport.ends_with(']')
    {
        hostport.to_string()
    } else {
        format!("{hostport}:{}", if https { 443 } else { 80 })
    };
    Some((https, hostport, path.to_string()))
}

/// A server entry: an address as it is, a name as a `dns` entry (resolved at run time, as
/// container names are).
pub fn server_entry(https: bool, hostport: &str, weight: Option<i64>) -> toml::Value {
    let host = hostport
        .rsplit_once(':')
        .map_or(hostport, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let scheme = if https { "https://" } else { "" };
    let is_addr = host.parse::<std::net::IpAddr>().is_ok() || host == "localhost";
    let text = format!(
        "{scheme}{}",
        if host == "localhost" {
            hostport.replacen("localhost", "127.0.0.1", 1)
        } else {
            hostport.to_string()
        }
    );
    if is_addr && weight.is_none() {
        return text.into();
    }
    let mut t = toml::Table::new();
    t.insert(if is_addr { "addr" } else { "dns" }.into(), text.into());
    if let Some(w) = weight {
        t.insert("weight".into(), toml::Value::Integer(w));
    }
    toml::Value::Table(t)
}

/// `forwardAuth`.
pub fn forward(ctx: &mut Ctx, mw: &Named, cfg: &Node, routes: &mut [Route]) -> Notes {
    let address = text(cfg, "address").ok_or("no address")?;
    let (https, hostport, path) =
        split_url(&address).ok_or_else(|| format!("address {address} is not an http(s) URL"))?;
    let group = veloxy_import::Config::unique(&ctx.cfg.upstreams, &format!("auth_{}", mw.name));
    let group = match ctx.cfg.upstreams.iter().find(|(_, s)| {
        s.comments
            .iter()
            .any(|c| c == &format!("forwardAuth {}", mw.name))
    }) {
        Some((n, _)) => n.clone(),
        None => {
            let s = ctx.cfg.upstream(&group, &mw.loc);
            s.comments.push(format!("forwardAuth {}", mw.name));
            s.set(
                "servers",
                toml::Value::Array(vec![server_entry(https, &hostport, None)]),
            );
            if let Some(tls) = get(cfg, "tls") {
                if let Some(ca) = text(tls, "ca") {
                    let p = ctx.opts.out_path(&mw.base, &ca);
                    ctx.cfg.upstream(&group, &mw.loc).set("ca_file", p);
                }
                if flag(tls, "insecureSkipVerify") == Some(true) {
                    return Err(
                        "tls.insecureSkipVerify: veloxy always verifies upstream certificates"
                            .into(),
                    );
                }
                if get(tls, "cert").is_some() {
                    return Err(
                        "tls.cert: veloxy does not present client certificates to upstreams".into(),
                    );
                }
            }
            group
        }
    };
    let mut t = toml::Table::new();
    t.insert("upstream".into(), group.into());
    if path != "/" {
        t.insert("path".into(), path.into());
    }
    let copy: Vec<toml::Value> = list_at(cfg, "authResponseHeaders")
        .into_iter()
        .map(|(s, _)| s.into())
        .collect();
    if !copy.is_empty() {
        t.insert("copy_headers".into(), toml::Value::Array(copy));
    }
    t.insert("timeout".into(), "30s".into());
    for r in routes.iter_mut() {
        r.set("forward_auth", toml::Value::Table(t.clone()));
    }
    let mut notes = vec![];
    if get(cfg, "authRequestHeaders").is_some() {
        notes.push("authRequestHeaders: veloxy sends the auth service the client's Cookie and Authorization fields and X-Forwarded-*".to_string());
    } else {
        notes.push("veloxy sends the auth service the client's Cookie and Authorization fields and X-Forwarded-* (Traefik: every request field)".to_string());
    }
    if flag(cfg, "trustForwardHeader") == Some(true) {
        notes.push("trustForwardHeader: veloxy sends its own X-Forwarded-* to the auth service, not the client's".into());
    }
    sub_refusal(
        ctx,
        mw,
        cfg,
        "authResponseHeadersRegex",
        "veloxy copies fields named exactly",
    );
    sub_refusal(
        ctx,
        mw,
        cfg,
        "addAuthCookiesToResponse",
        "veloxy does not copy the auth service's cookies onto the answer",
    );
    sub_refusal(
        ctx,
        mw,
        cfg,
        "forwardBody",
        "veloxy asks the auth service with a GET without the body",
    );
    sub_refusal(
        ctx,
        mw,
        cfg,
        "headerField",
        "veloxy does not pass the authenticated user's name upstream",
    );
    Ok(notes)
}
