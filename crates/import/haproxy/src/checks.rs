//! Group-wide settings of a backend: checks, cookie persistence, limits, retries and the
//! timeouts of tcp relays.

use toml::Value;
use veloxy_import::Section;

use crate::backend::{get, has, Server};
use crate::parse::Line;
use crate::proxy::Proxy;
use crate::Ctx;

/// tcp relays: connect timeout, and the idle time after which a relay closes (the shorter of
/// timeout client and timeout server).
pub(crate) fn tcp_timeouts(cx: &mut Ctx, p: &Proxy, sec: &mut Section) {
    let mut idle: Option<(u64, String)> = None;
    for k in ["connect", "client", "server", "tunnel"] {
        let Some(l) = p.last("timeout", Some(k)) else {
            continue;
        };
        let Some(d) = l.arg(1).and_then(crate::duration) else {
            cx.refuse(l, "a malformed time");
            continue;
        };
        match k {
            "connect" => {
                if d != "2s" {
                    sec.set("connect_timeout", d);
                }
            }
            _ => {
                let ms = crate::millis(&d).unwrap_or(0);
                if idle.as_ref().is_none_or(|(m, _)| ms < *m) {
                    idle = Some((ms, d));
                }
            }
        }
        cx.ok(l);
    }
    match idle {
        Some((_, d)) if d != "60s" => {
            sec.set("idle_timeout", d);
        }
        Some(_) => {}
        None => cx.diff(p.head, "no timeout client/server: HAProxy keeps idle relays open without limit, veloxy closes them after 60s"),
    }
}

pub(crate) fn health(cx: &mut Ctx, p: &Proxy, servers: &[Server], sec: &mut Section) {
    let checked: Vec<&Server> = servers.iter().filter(|s| has(&s.p, "check")).collect();
    let httpchk = p.option("httpchk");
    let check_lines: Vec<&Line> = p
        .lines()
        .filter(|l| {
            (l.kw() == "option"
                && matches!(
                    l.arg(0),
                    Some(
                        "httpchk"
                            | "tcp-check"
                            | "ssl-hello-chk"
                            | "ldap-check"
                            | "mysql-check"
                            | "pgsql-check"
                            | "redis-check"
                            | "smtpchk"
                    )
                ))
                || l.kw() == "http-check"
                || l.kw() == "tcp-check"
                || (l.kw() == "timeout" && l.arg(0) == Some("check"))
        })
        .collect();
    if checked.is_empty() {
        for l in check_lines {
            cx.ignore(l, "no server has 'check': HAProxy runs no checks");
        }
        return;
    }
    if checked.len() < servers.len() {
        for s in servers.iter().filter(|s| !has(&s.p, "check")) {
            cx.diff(
                s.line,
                "veloxy checks every server of the group (this one has no 'check' in HAProxy)",
            );
        }
    }
    let first = &checked[0].p;
    let inter = get(first, "inter")
        .and_then(crate::duration)
        .unwrap_or_else(|| "2s".into());
    let mut h = toml::Table::new();
    if let Some(l) = httpchk {
        let args = l.args();
        let (mut method, uri) = match args.len() {
            1 => ("OPTIONS", "/"),
            2 => ("OPTIONS", args[1]),
            _ => (args[1], args[2]),
        };
        let mut path = uri.to_string();
        let mut host = None;
        for hc in p
            .lines()
            .filter(|x| x.kw() == "http-check" && x.arg(0) == Some("send"))
        {
            let a = hc.args();
            let mut i = 1;
            while i < a.len() {
                match a[i] {
                    "uri" => path = a.get(i + 1).unwrap_or(&"/").to_string(),
                    "meth" => method = a.get(i + 1).unwrap_or(&"GET"),
                    "hdr" if a.get(i + 1).is_some_and(|n| n.eq_ignore_ascii_case("host")) => {
                        host = a.get(i + 2).map(|s| s.to_string());
                        i += 1;
                    }
                    _ => {}
                }
                i += 2;
            }
            cx.ok(hc);
        }
        h.insert("path".into(), path.into());
        if let Some(host) = host {
            h.insert("host".into(), host.into());
        }
        if method != "GET" {
            cx.diff(l, format!("veloxy checks with GET (HAProxy: {method})"));
        } else {
            cx.ok(l);
        }
    }
    h.insert("interval".into(), inter.clone().into());
    let timeout = p
        .last("timeout", Some("check"))
        .and_then(|l| l.arg(1))
        .and_then(crate::duration)
        .unwrap_or(inter);
    h.insert("timeout".into(), timeout.into());
    let rise = get(first, "rise")
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(2);
    let fall = get(first, "fall")
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(3);
    h.insert("healthy".into(), rise.into());
    h.insert("unhealthy".into(), fall.into());
    for l in check_lines {
        match (l.kw(), l.arg(0)) {
            ("http-check", Some("expect")) => {
                let a = l.args();
                match (a.get(1), a.get(2)) {
                    (Some(&"status"), Some(s)) => {
                        h.insert("expect_status".into(), s.replace(',', "-").into());
                        cx.ok(l);
                    }
                    (Some(&"rstatus"), Some(re)) => match status_range(re) {
                        Some(r) => {
                            h.insert("expect_status".into(), r.into());
                            cx.ok(l);
                        }
                        None => cx.refuse(
                            l,
                            format!("rstatus {re}: veloxy's checks expect one range of statuses"),
                        ),
                    },
                    (Some(&"!"), _) | (Some(_), _) => {
                        cx.refuse(l, "veloxy's checks expect a status or a range only")
                    }
                    _ => cx.refuse(l, "http-check expect needs a test"),
                }
            }
            ("option", Some("httpchk")) | ("http-check", Some("send")) => {}
            ("timeout", _) => cx.ok(l),
            ("option", Some("tcp-check" | "ssl-hello-chk")) if httpchk.is_none() => cx.ok(l),
            ("tcp-check", Some("connect")) if httpchk.is_none() => match l.args().as_slice() {
                ["connect"] => cx.ok(l),
                ["connect", "port", port] => cx.diff(
                    l,
                    format!("port {port}: veloxy connects to the server's own port"),
                ),
                _ => cx.refuse(
                    l,
                    "tcp-check connect options: veloxy's TCP check is a plain connect",
                ),
            },
            ("http-check", Some("disable-on-404" | "send-state")) => cx.ignore(l, "check tuning"),
            _ => cx.refuse(
                l,
                "veloxy has HTTP (GET, expected status) and TCP connect checks only",
            ),
        }
    }
    for s in &checked[1..] {
        let same = ["inter", "rise", "fall"]
            .iter()
            .all(|k| get(&s.p, k) == get(first, k));
        if !same {
            cx.diff(s.line, "veloxy checks every server of a group alike: the first checked server's inter/rise/fall are used");
        }
    }
    let h2 = matches!(
        sec.get("protocol").and_then(Value::as_str),
        Some("h2" | "h2c")
    );
    let path = if h2 { h.remove("path") } else { None };
    if let Some(path) = path {
        h.remove("host");
        h.remove("expect_status");
        let why = format!(
            "veloxy checks an h2/h2c group by connecting (its HTTP checks speak HTTP/1.1): {} is not requested",
            path.as_str().unwrap_or("/")
        );
        for l in p.lines().filter(|l| {
            (l.kw() == "option" && l.arg(0) == Some("httpchk")) || l.kw() == "http-check"
        }) {
            if cx.decided(l) && !matches!(l.arg(0), Some("disable-on-404" | "send-state")) {
                cx.diff(l, why.clone());
            }
        }
    }
    sec.set("health", Value::Table(h));
}

/// The statuses (100-599) regex `re` finds a match in, as veloxy's `"LO-HI"` when they are
/// one range.
fn status_range(re: &str) -> Option<String> {
    let r = regex_automata::meta::Regex::new(re).ok()?;
    let hits: Vec<u16> = (100..=599u16)
        .filter(|s| r.is_match(s.to_string().as_bytes()))
        .collect();
    let (lo, hi) = (*hits.first()?, *hits.last()?);
    if usize::from(hi - lo) + 1 != hits.len() {
        return None;
    }
    Some(if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    })
}

pub(crate) fn persistence(cx: &mut Ctx, p: &Proxy, servers: &[Server], sec: &mut Section) {
    let Some(l) = p.last("cookie", None) else {
        return;
    };
    let args = l.args();
    let name = args.first().copied().unwrap_or("SERVERID");
    if !args.contains(&"insert") {
        cx.refuse(
            l,
            "cookie rewrite/prefix: veloxy sets its own affinity cookie (cookie ... insert)",
        );
        return;
    }
    let mut t = toml::Table::new();
    t.insert("cookie".into(), name.into());
    t.insert("ttl".into(), "0s".into());
    t.insert("http_only".into(), args.contains(&"httponly").into());
    if args.contains(&"secure") {
        t.insert("secure".into(), true.into());
    }
    sec.set("sticky", Value::Table(t));
    cx.diff(
        l,
        "the cookie holds veloxy's token for the server, not the server's 'cookie' value",
    );
    if args.contains(&"nocache") {
        cx.diff(
            l,
            "nocache: veloxy does not add Cache-Control: private to answers that set the cookie",
        );
    }
    if args.contains(&"domain") || args.contains(&"maxidle") || args.contains(&"maxlife") {
        cx.diff(l, "domain/maxidle/maxlife are not translated");
    }
    let _ = servers;
}

pub(crate) fn limits(cx: &mut Ctx, servers: &[Server], sec: &mut Section) {
    let maxconn: Vec<Option<&str>> = servers.iter().map(|s| get(&s.p, "maxconn")).collect();
    if let Some(Some(m)) = maxconn.first() {
        if let Ok(n) = m.parse::<i64>() {
            sec.set("max_connections", n);
        }
        for s in servers {
            cx.diff(s.line, "maxconn: beyond it veloxy answers 503 at once (HAProxy queues the request for timeout queue)");
        }
    }
    let proxy: Vec<Option<&str>> = servers
        .iter()
        .map(|s| {
            if has(&s.p, "send-proxy-v2") {
                Some("v2")
            } else if has(&s.p, "send-proxy") {
                Some("v1")
            } else {
                None
            }
        })
        .collect();
    if let Some(Some(v)) = proxy.first() {
        sec.set("proxy_protocol", *v);
        if proxy.iter().any(|x| x != &proxy[0]) {
            for s in servers {
                cx.refuse(
                    s.line,
                    "veloxy sends the PROXY header to every server of a group alike",
                );
            }
        }
    }
}

pub(crate) fn retries(cx: &mut Ctx, p: &Proxy, n: usize, sec: &mut Section) {
    if let Some(l) = p.last("retries", None) {
        match l.arg(0).and_then(|v| v.parse::<i64>().ok()) {
            Some(r) => {
                if n > 1 {
                    sec.set("retries", r.min(n as i64 - 1));
                    cx.diff(l, "veloxy retries a failed connection on another server (HAProxy: the same one, another with option redispatch)");
                } else {
                    cx.ignore(l, "one server: veloxy retries on other servers only");
                }
            }
            None => cx.refuse(l, "retries needs a number"),
        }
    }
    let retry_on = p.last("retry-on", None);
    match retry_on {
        Some(l) => {
            let mut statuses = Vec::new();
            let mut bad = Vec::new();
            for a in l.args() {
                match a {
                    "conn-failure" | "empty-response" | "junk-response" | "response-timeout"
                    | "none" => {}
                    "all-retryable-errors" => statuses.extend([500, 502, 503, 504]),
                    s => match s.parse::<i64>() {
                        Ok(c) => statuses.push(c),
                        Err(_) => bad.push(s),
                    },
                }
            }
            if n > 1 {
                sec.set(
                    "retry_on",
                    Value::Array(statuses.into_iter().map(Value::from).collect()),
                );
            }
            if bad.is_empty() {
                cx.ok(l);
            } else {
                cx.refuse(l, format!("retry-on {}: not translated", bad.join(" ")));
            }
        }
        None if n > 1 => {
            sec.set("retry_on", Value::Array(Vec::new()));
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::status_range;

    #[test]
    fn rstatus_as_a_range() {
        assert_eq!(status_range("^2").as_deref(), Some("200-299"));
        assert_eq!(status_range("^[23]").as_deref(), Some("200-399"));
        assert_eq!(status_range("^200$").as_deref(), Some("200"));
        assert_eq!(status_range("^(200|404)$"), None);
        assert_eq!(status_range("^9"), None);
    }
}
