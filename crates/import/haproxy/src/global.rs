//! `global`, `userlist`, `resolvers` and the sections veloxy has no use for.

use std::collections::BTreeMap;

use veloxy_import::GeneratedFile;

use crate::parse::Section;
use crate::Ctx;

/// `global`: process settings. Only `nbthread`, `crt-base` and `ca-base` change the output.
pub fn global(cx: &mut Ctx, s: &Section) {
    cx.ok(&s.head);
    for l in &s.lines {
        let kw = l.kw();
        match kw {
            "nbthread" => match l.arg(0).and_then(|n| n.parse::<i64>().ok()) {
                Some(n) if n > 0 => {
                    cx.out.server.set("workers", n);
                    cx.out.server.add_from(&l.loc);
                    cx.ok(l);
                }
                _ => cx.refuse(l, "nbthread needs a positive number"),
            },
            "crt-base" => {
                cx.crt_base = l.arg(0).map(str::to_string);
                cx.ok(l);
            }
            "ca-base" => {
                cx.ca_base = l.arg(0).map(str::to_string);
                cx.ok(l);
            }
            "log" | "log-send-hostname" | "log-tag" | "log-format" => {
                cx.ignore(l, "logging: veloxy's access log is [server.access_log]")
            }
            "chroot"
            | "user"
            | "group"
            | "uid"
            | "gid"
            | "daemon"
            | "pidfile"
            | "master-worker"
            | "nbproc"
            | "node"
            | "description"
            | "cpu-map"
            | "ulimit-n"
            | "setcap"
            | "expose-experimental-directives"
            | "insecure-fork-wanted"
            | "insecure-setuid-wanted"
            | "localpeer"
            | "unix-bind"
            | "numa-cpu-mapping"
            | "hard-stop-after"
            | "grace"
            | "close-spread-time"
            | "mworker-max-reloads"
            | "noepoll"
            | "nopoll"
            | "nosplice"
            | "profiling.tasks"
            | "busy-polling"
            | "set-dumpable"
            | "strict-limits"
            | "server-state-file"
            | "server-state-base"
            | "spread-checks"
            | "max-spread-checks"
            | "h1-case-adjust"
            | "h1-case-adjust-file"
            | "h2-workaround-bogus-websocket-clients"
            | "default-path"
            | "zero-warning"
            | "quiet"
            | "debug"
            | "limited-quic" => cx.ignore(
                l,
                "process management: no effect on what clients or backends see",
            ),
            "stats" => cx.ignore(
                l,
                "HAProxy's runtime API (veloxy's is its admin endpoint's /upstreams)",
            ),
            "maxconn" | "maxsslconn" | "maxconnrate" | "maxsessrate" | "maxsslrate"
            | "maxpipes" => cx.ignore(
                l,
                "a process-wide limit; veloxy limits connections per listener (frontend maxconn)",
            ),
            k if k.starts_with("ssl-default-")
                || k.starts_with("ssl-dh-param")
                || k == "ssl-server-verify"
                || k.starts_with("ssl-engine")
                || k == "ssl-mode-async"
                || k == "ssl-load-extra-files" =>
            {
                cx.ignore(
                    l,
                    "TLS policy: veloxy offers TLS 1.2 and 1.3 with rustls' cipher suites",
                )
            }
            k if k.starts_with("tune.") => cx.ignore(l, "buffer and process tuning"),
            "lua-load" | "lua-load-per-thread" | "lua-prepend-path" => {
                cx.refuse(l, "Lua scripts: veloxy has no scripting")
            }
            "setenv" | "presetenv" | "resetenv" | "unsetenv" => cx.refuse(
                l,
                "environment changes: pass the variables to veloxy import --env instead",
            ),
            _ => {}
        }
    }
}

/// A user of a userlist: name, hash, groups.
struct User {
    name: String,
    hash: String,
    groups: Vec<String>,
}

/// `userlist NAME`: users become an htpasswd file (0600) beside the output; one per group
/// selection that an `http_auth_group` names, made on demand by [`auth_file`].
pub fn userlist(cx: &mut Ctx, s: &Section) {
    cx.ok(&s.head);
    let mut users = Vec::new();
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in &s.lines {
        match l.kw() {
            "group" => {
                let name = l.arg(0).unwrap_or_default().to_string();
                let mut members = Vec::new();
                let args = l.args();
                if let Some(i) = args.iter().position(|a| *a == "users") {
                    if let Some(list) = args.get(i + 1) {
                        members.extend(list.split(',').map(str::to_string));
                    }
                }
                groups.insert(name, members);
                cx.ok(l);
            }
            "user" => {
                let args = l.args();
                let name = args.first().copied().unwrap_or_default().to_string();
                let mut hash = None;
                let mut ugroups = Vec::new();
                let mut i = 1;
                while i < args.len() {
                    match args[i] {
                        "password" => hash = args.get(i + 1).map(|h| (true, h.to_string())),
                        "insecure-password" => {
                            hash = args.get(i + 1).map(|h| (false, h.to_string()))
                        }
                        "groups" => ugroups.extend(
                            args.get(i + 1)
                                .unwrap_or(&"")
                                .split(',')
                                .map(str::to_string),
                        ),
                        _ => {}
                    }
                    i += 2;
                }
                match hash {
                    Some((true, h)) if h.starts_with("$2y$") || h.starts_with("$2b$") || h.starts_with("$2a$") => {
                        users.push(User { name, hash: h, groups: ugroups });
                        cx.ok(l);
                    }
                    Some((true, h)) => cx.refuse(
                        l,
                        format!(
                            "password hash of type {}: veloxy's basic_auth takes bcrypt ($2y$) or $apr1$ only; the user is left out",
                            h.split('$').nth(1).map(|t| format!("${t}$")).unwrap_or_else(|| "DES crypt".into())
                        ),
                    ),
                    Some((false, _)) => cx.refuse(
                        l,
                        "insecure-password: veloxy's htpasswd files hold hashes only (make one with htpasswd -B); the user is left out",
                    ),
                    None => cx.refuse(l, "a user without a password"),
                }
            }
            _ => {}
        }
    }
    for (g, members) in &groups {
        for u in &mut users {
            if members.contains(&u.name) && !u.groups.contains(g) {
                u.groups.push(g.clone());
            }
        }
    }
    cx.userlists.insert(
        s.name.clone(),
        users
            .into_iter()
            .map(|u| (u.name, u.hash, u.groups))
            .collect(),
    );
}

/// The htpasswd file for userlist `list` (only the users of `groups`, when given), written
/// once; `Err` when the list is unknown or has no usable user.
pub fn auth_file(cx: &mut Ctx, list: &str, groups: &[String]) -> Result<String, String> {
    let key = format!("{list}:{}", groups.join(","));
    if let Some(f) = cx.auth_files.get(&key) {
        return Ok(f.clone());
    }
    let users = cx
        .userlists
        .get(list)
        .cloned()
        .ok_or_else(|| format!("userlist {list} is not defined"))?;
    let lines: Vec<String> = users
        .iter()
        .filter(|(_, _, g)| groups.is_empty() || g.iter().any(|x| groups.contains(x)))
        .map(|(u, h, _)| format!("{u}:{h}\n"))
        .collect();
    if lines.is_empty() {
        return Err(format!("userlist {list} has no user veloxy can check"));
    }
    let name = if groups.is_empty() {
        format!("{}.htpasswd", veloxy_import::model::sanitize(list))
    } else {
        format!(
            "{}-{}.htpasswd",
            veloxy_import::model::sanitize(list),
            veloxy_import::model::sanitize(&groups.join("-"))
        )
    };
    cx.out.files.push(GeneratedFile {
        name: name.clone(),
        contents: lines.concat(),
        mode: 0o600,
    });
    cx.auth_files.insert(key, name.clone());
    Ok(name)
}

/// `resolvers NAME`: its nameservers become `[server] resolvers`.
pub fn resolvers(cx: &mut Ctx, s: &Section) {
    cx.ok(&s.head);
    let mut list = Vec::new();
    for l in &s.lines {
        match l.kw() {
            "nameserver" => match l.arg(1) {
                Some(a) => {
                    let a = a.trim_start_matches("udp@").trim_start_matches("udp4@");
                    list.push(toml::Value::from(a));
                    cx.ok(l);
                }
                None => cx.refuse(l, "nameserver needs an address"),
            },
            "parse-resolv-conf" => cx.ok(l),
            "hold" => cx.ok(l),
            "resolve_retries" | "timeout" | "accepted_payload_size" => {
                cx.ignore(l, "DNS client tuning")
            }
            _ => {}
        }
    }
    if !list.is_empty() && cx.out.server.get("resolvers").is_none() {
        cx.out.server.set("resolvers", toml::Value::Array(list));
        cx.out.server.add_from(&s.head.loc);
    }
}

/// The `hold valid` of a resolvers section, as the re-resolve interval.
pub fn hold_valid(s: &Section) -> Option<String> {
    s.lines
        .iter()
        .find(|l| l.kw() == "hold" && l.arg(0) == Some("valid"))
        .and_then(|l| l.arg(1))
        .and_then(crate::duration)
}

/// Sections veloxy has no counterpart for.
pub fn other(cx: &mut Ctx, s: &Section) {
    let (ignore, why) = match s.kind.as_str() {
        "peers" => (true, "replicates stick tables between HAProxy instances"),
        "mailers" => (true, "e-mail alerts about server state"),
        "ring" => (true, "a log buffer"),
        "log-forward" => (true, "a syslog relay"),
        "traces" => (true, "HAProxy's traces"),
        "program" => (false, "an external program run by HAProxy's master process"),
        "cache" => (
            false,
            "HAProxy's cache sections are not translated (veloxy has [caches.NAME])",
        ),
        "http-errors" => (
            false,
            "custom error files: veloxy answers its own errors with short text bodies",
        ),
        "fcgi-app" => (false, "FastCGI: veloxy speaks HTTP to its backends"),
        "crt-store" => (
            false,
            "a certificate store: name the files on the bind lines",
        ),
        _ => (false, "an unknown section"),
    };
    for l in std::iter::once(&s.head).chain(&s.lines) {
        if ignore {
            cx.ignore(l, why);
        } else {
            cx.refuse(l, why);
        }
    }
}

/// Keywords a `defaults` section may hold.
pub fn inheritable(kw: &str) -> bool {
    matches!(
        kw,
        "mode"
            | "balance"
            | "timeout"
            | "option"
            | "no"
            | "log"
            | "maxconn"
            | "default-server"
            | "retries"
            | "cookie"
            | "http-check"
            | "errorfile"
            | "compression"
            | "http-reuse"
            | "fullconn"
            | "hash-type"
            | "unique-id-format"
            | "unique-id-header"
            | "log-format"
            | "default_backend"
            | "http-request"
            | "http-response"
            | "tcp-request"
            | "retry-on"
            | "monitor-uri"
            | "backlog"
            | "rate-limit"
            | "load-server-state-from-file"
            | "email-alert"
            | "http-error"
            | "errorfiles"
            | "errorloc"
            | "errorloc302"
            | "errorloc303"
            | "log-tag"
            | "stats"
            | "acl"
            | "bind-process"
            | "http-after-response"
    )
}
