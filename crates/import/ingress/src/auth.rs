//! Authentication annotations: `auth-type: basic` with its Secret (written as an htpasswd
//! file) and `auth-url` (veloxy's forward_auth).

use base64::Engine as _;
use toml::Value;
use veloxy_import::tree::Node;
use veloxy_import::GeneratedFile;

use crate::annotations::{Ann, KeysApi};
use crate::objects::Object;
use crate::util::{self, table};
use crate::Ctx;

/// `auth-type`, `auth-secret`, `auth-secret-type`, `auth-realm`.
pub fn basic(ctx: &mut Ctx, ing: &Object, keys: &mut KeysApi, ann: &mut Ann) {
    const FAMILY: &[&str] = &["auth-secret", "auth-secret-type", "auth-realm"];
    let Some((_, kind)) = keys.get("auth-type") else {
        for n in FAMILY {
            keys.ignore(ctx, n, "no auth-type: ingress-nginx ignores it");
        }
        return;
    };
    if kind.trim() != "basic" {
        let why = format!("auth-type {kind:?}: veloxy checks Basic credentials only");
        keys.refuse_family(ctx, "auth-type", FAMILY, why);
        return;
    }
    let Some((_, secret)) = keys.get("auth-secret") else {
        keys.refuse_family(ctx, "auth-type", FAMILY, "no auth-secret names the users");
        return;
    };
    let (ns, name) = match secret.split_once('/') {
        Some((n, s)) => (n.to_string(), s.to_string()),
        None => (ing.ns.clone(), secret.trim().to_string()),
    };
    let map = keys
        .get("auth-secret-type")
        .is_some_and(|(_, t)| t.trim() == "auth-map");
    let file = format!("htpasswd/{}", util_name(&ns, &name));
    let Some(found) = ctx.objs.secret(&ns, &name) else {
        let realm = keys.get("auth-realm").map(|(_, r)| r).unwrap_or_default();
        set_basic(ann, realm, &file);
        keys.diff(ctx, "auth-type", missing_users(&ns, &name, &file, map));
        for n in FAMILY {
            keys.ok(ctx, n);
        }
        return;
    };
    let users = htpasswd(found.node, map).map(|u| (u, found.loc.clone()));
    let (lines, secret_loc) = match users {
        Ok(u) => u,
        Err(e) => {
            keys.refuse_family(ctx, "auth-type", FAMILY, e);
            return;
        }
    };
    ctx.used_secrets
        .push((ns.clone(), name.clone(), secret_loc));
    let (good, weak): (Vec<_>, Vec<_>) = lines.into_iter().partition(|(_, h)| {
        ["$2y$", "$2b$", "$2a$", "$apr1$"]
            .iter()
            .any(|p| h.starts_with(p))
    });
    if good.is_empty() {
        keys.refuse(
            ctx,
            "auth-type",
            format!(
                "no user of Secret {ns}/{name} has a bcrypt or $apr1$ hash, the ones veloxy \
                 checks (re-hash with htpasswd -B)"
            ),
        );
        keys.ignore_family(ctx, "auth-type", FAMILY);
        return;
    }
    if !ctx.config.files.iter().any(|f| f.name == file) {
        let contents: String = good.iter().map(|(u, h)| format!("{u}:{h}\n")).collect();
        ctx.config.files.push(GeneratedFile {
            name: file.clone(),
            contents,
            mode: 0o600,
        });
    }
    let realm = keys.get("auth-realm").map(|(_, r)| r).unwrap_or_default();
    set_basic(ann, realm, &file);
    if weak.is_empty() {
        keys.ok(ctx, "auth-type");
    } else {
        let names: Vec<&str> = weak.iter().map(|(u, _)| u.as_str()).collect();
        keys.diff(
            ctx,
            "auth-type",
            format!(
                "{} {} {} hashes veloxy cannot check (SHA1 or crypt): left out of the \
                 htpasswd file (re-hash with htpasswd -B)",
                if names.len() == 1 { "user" } else { "users" },
                names.join(", "),
                if names.len() == 1 { "has" } else { "have" }
            ),
        );
    }
    for n in FAMILY {
        keys.ok(ctx, n);
    }
}

/// The route's `basic_auth`; ingress-nginx does not pass the credentials on.
fn set_basic(ann: &mut Ann, realm: String, file: &str) {
    ann.rules.insert(
        "basic_auth".into(),
        table([("realm", realm.into()), ("users_file", file.into())]),
    );
    ann.request_remove.push("Authorization".into());
}

/// The note for a basic-auth Secret that lives in the cluster but not in the input: the
/// htpasswd path the output names and the command that writes it.
fn missing_users(ns: &str, name: &str, file: &str, map: bool) -> String {
    let get = if map {
        // auth-map: one key per user, its value the hash.
        format!(
            "kubectl get secret -n {ns} {name} -o go-template='{{{{range $u, $h := .data}}}}\
             {{{{$u}}}}:{{{{$h | base64decode}}}}{{{{\"\\n\"}}}}{{{{end}}}}' > {file}"
        )
    } else {
        format!(
            "kubectl get secret -n {ns} {name} -o jsonpath='{{.data.auth}}' | base64 -d > {file}"
        )
    };
    format!(
        "the Secret {ns}/{name} is not in the input: write its users to {file} next to the \
         output ({get}); veloxy checks bcrypt and $apr1$ hashes only (re-hash SHA1 or crypt \
         ones with htpasswd -B)"
    )
}

/// `user:hash` pairs of a basic-auth Secret: the `auth` key (an htpasswd file) or, for
/// `auth-map`, one key per user.
fn htpasswd(secret: &Node, map: bool) -> Result<Vec<(String, String)>, String> {
    let entries = secret_entries(secret);
    if map {
        return Ok(entries
            .into_iter()
            .map(|(k, v)| (k, v.trim().to_string()))
            .collect());
    }
    let auth = entries
        .into_iter()
        .find(|(k, _)| k == "auth")
        .map(|(_, v)| v)
        .ok_or("the Secret has no `auth` key (an htpasswd file)")?;
    Ok(auth
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(u, h)| (u.to_string(), h.to_string()))
        .collect())
}

/// A Secret's `data` (base64-decoded) and `stringData` entries.
pub fn secret_entries(secret: &Node) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(data) = secret.get("data").and_then(Node::as_map) {
        for (k, v) in data {
            let raw = v.scalar().unwrap_or_default();
            let clean: String = raw.chars().filter(|c| !c.is_whitespace()).collect();
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(clean) {
                out.push((k.name.clone(), String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
    }
    if let Some(data) = secret.get("stringData").and_then(Node::as_map) {
        for (k, v) in data {
            out.push((k.name.clone(), v.scalar().unwrap_or_default()));
        }
    }
    out
}

/// `NS-NAME` for file names.
pub fn util_name(ns: &str, name: &str) -> String {
    veloxy_import::model::sanitize(&format!("{ns}-{name}"))
}

/// `auth-tls-*`: client certificate verification, which veloxy lacks.
pub fn client_certs(ctx: &mut Ctx, keys: &mut KeysApi) {
    const FAMILY: &[&str] = &[
        "auth-tls-verify-client",
        "auth-tls-verify-depth",
        "auth-tls-error-page",
        "auth-tls-pass-certificate-to-upstream",
        "auth-tls-match-cn",
    ];
    let Some((_, secret)) = keys.get("auth-tls-secret") else {
        for n in FAMILY {
            keys.ignore(ctx, n, "no auth-tls-secret: ingress-nginx ignores it");
        }
        return;
    };
    let off = keys
        .get("auth-tls-verify-client")
        .is_some_and(|(_, v)| v.trim() == "off");
    if off {
        keys.ignore(
            ctx,
            "auth-tls-secret",
            "auth-tls-verify-client is off: ingress-nginx asks for no client certificate",
        );
        for n in FAMILY {
            keys.ignore(
                ctx,
                n,
                "client certificates are not asked for (verify-client off)",
            );
        }
        return;
    }
    keys.refuse(
        ctx,
        "auth-tls-secret",
        format!(
            "client certificate verification (mTLS against the CA of Secret {}): veloxy \
             verifies no client certificates",
            secret.trim()
        ),
    );
    keys.ignore_family(ctx, "auth-tls-secret", FAMILY);
}

/// `auth-url` and its companions.
pub fn external(ctx: &mut Ctx, ing: &Object, keys: &mut KeysApi, ann: &mut Ann) {
    const FAMILY: &[&str] = &[
        "auth-method",
        "auth-response-headers",
        "auth-signin",
        "auth-signin-redirect-param",
        "auth-cache-key",
        "auth-cache-duration",
        "auth-keepalive",
        "auth-keepalive-share-vars",
        "auth-keepalive-requests",
        "auth-keepalive-timeout",
        "auth-proxy-set-headers",
        "auth-request-redirect",
        "auth-always-set-cookie",
    ];
    let Some((_, url)) = keys.get("auth-url") else {
        for n in FAMILY {
            keys.ignore(ctx, n, "no auth-url: ingress-nginx ignores it");
        }
        return;
    };
    let target = match parse_url(&url) {
        Ok(t) => t,
        Err(e) => {
            keys.refuse_family(ctx, "auth-url", FAMILY, e);
            return;
        }
    };
    if let Some((_, m)) = keys.get("auth-method") {
        if m.trim().eq_ignore_ascii_case("GET") {
            keys.ok(ctx, "auth-method");
        } else {
            keys.refuse(ctx, "auth-method", "veloxy's forward_auth always sends GET");
        }
    }
    let servers = ctx.service_servers_for_host(&target.host, target.port, target.https);
    let base = format!("auth-{}", target.host.split('.').next().unwrap_or("auth"));
    let group = ctx.auth_group(&base, servers, &ing.loc);
    let mut fa = toml::Table::new();
    fa.insert("upstream".into(), group.into());
    fa.insert("path".into(), target.path.into());
    if let Some((_, h)) = keys.get("auth-response-headers") {
        fa.insert("copy_headers".into(), util::strings(&util::list(&h)));
        keys.ok(ctx, "auth-response-headers");
    }
    ann.rules.insert("forward_auth".into(), Value::Table(fa));
    keys.diff(
        ctx,
        "auth-url",
        "veloxy's GET carries X-Forwarded-Method, -Uri, -Host, -Proto, -For and the client's \
         Cookie and Authorization (ingress-nginx: every client field plus X-Original-URL, \
         X-Original-Method and X-Auth-Request-Redirect); a refusal reaches the client as the \
         auth service sent it (ingress-nginx: 401 and 403 with its own page, any other \
         status as 500); Set-Cookie of a passing answer is not sent to the client",
    );
    keys.refuse(
        ctx,
        "auth-signin",
        "veloxy cannot turn the auth service's 401 into a redirect to a sign-in page (the \
         client gets the 401)",
    );
    keys.ignore(
        ctx,
        "auth-signin-redirect-param",
        "part of auth-signin (refused)",
    );
    for n in ["auth-cache-key", "auth-cache-duration"] {
        keys.ignore(
            ctx,
            n,
            "veloxy asks the auth service on every request (the same answers, more auth \
             requests)",
        );
    }
    for n in [
        "auth-keepalive",
        "auth-keepalive-share-vars",
        "auth-keepalive-requests",
        "auth-keepalive-timeout",
    ] {
        keys.ignore(ctx, n, "connection reuse to the auth service");
    }
    for n in [
        "auth-proxy-set-headers",
        "auth-request-redirect",
        "auth-always-set-cookie",
    ] {
        keys.refuse(ctx, n, "veloxy's forward_auth has no such setting");
    }
}

/// An `auth-url`'s parts.
struct AuthUrl {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

fn parse_url(url: &str) -> Result<AuthUrl, String> {
    let url = url.trim();
    if url.contains('$') {
        return Err(format!(
            "{url:?} uses nginx variables: veloxy's forward_auth has a fixed URL"
        ));
    }
    let (https, rest) = crate::util::split_scheme(url)?;
    let (hostport, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path
    };
    let (host, port) = crate::util::host_port(url, hostport, https)?;
    Ok(AuthUrl {
        https,
        host: host.to_string(),
        port,
        path,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_users_secret_names_the_command_for_each_secret_type() {
        let file = super::missing_users("web", "u", "htpasswd/web-u", false);
        assert!(
            file.contains(
                "(kubectl get secret -n web u -o jsonpath='{.data.auth}' | base64 -d > \
                 htpasswd/web-u)"
            ),
            "{file}"
        );
        let map = super::missing_users("web", "u", "htpasswd/web-u", true);
        assert!(
            map.contains(
                "(kubectl get secret -n web u -o go-template='{{range $u, $h := .data}}\
                 {{$u}}:{{$h | base64decode}}{{\"\\n\"}}{{end}}' > htpasswd/web-u)"
            ),
            "{map}"
        );
    }
}
