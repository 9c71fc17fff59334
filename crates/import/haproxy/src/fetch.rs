//! ACL bodies: a fetch (`hdr(host)`, `path`, `src`, `ssl_fc`...), its converters, flags and
//! match method, and its patterns, as the literals of [`crate::acl`].

use std::path::Path;

use crate::acl::{Acl, Lit};
use crate::matcher::{Host, Match, PathPat};

/// Parses an ACL body: `FETCH[,conv] [-i] [-m METHOD] [-f FILE] [--] PATTERN...`.
pub fn parse_acl(words: &[&str], base: &Path) -> Result<Acl, String> {
    let Some((&fetch_conv, rest)) = words.split_first() else {
        return Err("an empty ACL".into());
    };
    let parts = split_top(fetch_conv);
    let mut parts = parts.iter().map(String::as_str);
    let fetch = parts.next().unwrap_or_default().to_string();
    let mut ci = false;
    let mut strip_port = false;
    for conv in parts {
        match conv {
            "lower" => ci = true,
            "field(1,:)" | "host_only" => strip_port = true,
            other => return Err(format!("converter {other}")),
        }
    }
    let mut method: Option<String> = None;
    let mut patterns: Vec<String> = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        match rest[i] {
            "-i" => ci = true,
            "-n" | "-u" => {}
            "-m" => {
                i += 1;
                method = Some(rest.get(i).ok_or("-m needs a method")?.to_string());
            }
            "-f" => {
                i += 1;
                let f = rest.get(i).ok_or("-f needs a file")?;
                let text = std::fs::read_to_string(base.join(f))
                    .map_err(|e| format!("pattern file {f}: {e}"))?;
                patterns.extend(
                    text.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty() && !l.starts_with('#'))
                        .map(str::to_string),
                );
            }
            "--" => {
                patterns.extend(rest[i + 1..].iter().map(|s| s.to_string()));
                break;
            }
            p => patterns.push(p.to_string()),
        }
        i += 1;
    }
    let (name, arg) = match fetch.split_once('(') {
        Some((n, a)) => (n.to_string(), Some(a.trim_end_matches(')').to_string())),
        None => (fetch.clone(), None),
    };
    let name = name.strip_prefix("req.").unwrap_or(&name).to_string();
    let fetch_args = Fetch {
        name,
        arg,
        ci,
        strip_port,
        method,
    };
    fetch_args.build(&patterns)
}

/// `a,b(c,d),e` split at the commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut depth = 0;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(String::new());
                continue;
            }
            _ => {}
        }
        out.last_mut().expect("one").push(c);
    }
    out
}

struct Fetch {
    name: String,
    arg: Option<String>,
    ci: bool,
    strip_port: bool,
    method: Option<String>,
}

impl Fetch {
    fn build(&self, patterns: &[String]) -> Result<Acl, String> {
        let rate = crate::limit::rate_fetch(
            &self.name,
            self.arg.as_deref(),
            self.method.as_deref(),
            patterns,
        )?;
        if let Some(t) = rate {
            return Ok(Acl {
                alts: vec![Lit::Rate(t)],
                ..Default::default()
            });
        }
        let (base, suffix) = match self.name.split_once('_') {
            Some((b, s))
                if matches!(
                    s,
                    "beg" | "end" | "reg" | "sub" | "dom" | "dir" | "len" | "cnt" | "val" | "str"
                ) =>
            {
                (b.to_string(), Some(s.to_string()))
            }
            _ => (self.name.clone(), None),
        };
        let method = self.method.clone().or(suffix.clone());
        let mut note = None;
        let mut ports = Vec::new();
        let alts = match (base.as_str(), self.arg.as_deref()) {
            ("hdr" | "fhdr", Some(h)) if h.eq_ignore_ascii_case("host") => {
                if !self.ci {
                    note = Some("Host is compared case-insensitively (HAProxy compares it as written without -i)".to_string());
                }
                let (alts, named) = host_alts(method.as_deref(), patterns)?;
                if !self.strip_port && method.as_deref() != Some("dom") && named.is_empty() {
                    let n = "a Host with a port matches too (veloxy ignores the port)";
                    note = Some(match note {
                        Some(x) => format!("{x}; {n}"),
                        None => n.to_string(),
                    });
                }
                ports = named;
                alts
            }
            ("hdr" | "fhdr", Some(h)) => {
                if method.as_deref().unwrap_or("str") != "str" {
                    return Err(format!(
                        "{} on header {h}: veloxy matches a header's exact value only",
                        method.unwrap_or_default()
                    ));
                }
                note = Some(format!(
                    "{h} is compared with its first value{}",
                    if self.ci {
                        ", exactly (HAProxy: any value, ignoring case)"
                    } else {
                        " (HAProxy: any value)"
                    }
                ));
                patterns
                    .iter()
                    .map(|p| {
                        let mut m = Match::default();
                        m.headers.insert(h.to_string(), p.clone());
                        Lit::Route(m)
                    })
                    .collect()
            }
            ("path" | "url", None) => {
                if base == "url"
                    && !matches!(
                        method.as_deref(),
                        Some("beg" | "reg" | "sub" | "end" | "dir")
                    )
                {
                    return Err("url: veloxy matches the path without the query".into());
                }
                if base == "url" {
                    note = Some(
                        "url matched on the path (the query is not part of it in veloxy)".into(),
                    );
                }
                path_alts(method.as_deref(), patterns, self.ci)?
            }
            ("method", None) => vec![Lit::Route(Match {
                methods: Some({
                    let mut m: Vec<String> = patterns.iter().map(|p| p.to_uppercase()).collect();
                    m.sort();
                    m.dedup();
                    m
                }),
                ..Default::default()
            })],
            ("src", None) => vec![Lit::Src(patterns.to_vec())],
            ("ssl_fc", None) => vec![Lit::Route(Match::tls(true))],
            ("ssl_sni" | "req_ssl_sni", None) if method.as_deref().unwrap_or("str") == "str" => {
                vec![Lit::Sni(
                    patterns.iter().map(|p| p.to_lowercase()).collect(),
                )]
            }
            ("ssl_sni" | "req_ssl_sni", None) if method.as_deref() == Some("end") => {
                vec![Lit::Sni(
                    patterns
                        .iter()
                        .map(|p| format!("*.{}", p.trim_start_matches('.')))
                        .collect(),
                )]
            }
            ("ssl_hello_type" | "req_ssl_hello_type", None) => vec![Lit::Const(true)],
            ("url_param" | "urlp", Some(q)) if method.as_deref().unwrap_or("str") == "str" => {
                patterns
                    .iter()
                    .map(|p| {
                        let mut m = Match::default();
                        m.query.insert(q.to_string(), p.clone());
                        Lit::Route(m)
                    })
                    .collect()
            }
            ("http_auth", Some(l)) => vec![Lit::Auth {
                list: l.to_string(),
                groups: Vec::new(),
            }],
            ("http_auth_group", Some(l)) => vec![Lit::Auth {
                list: l.to_string(),
                groups: patterns.to_vec(),
            }],
            ("always_true", None) => vec![Lit::Const(true)],
            ("always_false", None) => vec![Lit::Const(false)],
            _ => {
                return Err(format!(
                    "fetch {}{} has no veloxy equivalent",
                    self.name,
                    self.arg
                        .as_deref()
                        .map(|a| format!("({a})"))
                        .unwrap_or_default()
                ))
            }
        };
        Ok(Acl { alts, note, ports })
    }
}

/// Route hosts for Host patterns, and the ports the patterns name (veloxy's hosts have none).
fn host_alts(method: Option<&str>, patterns: &[String]) -> Result<(Vec<Lit>, Vec<u16>), String> {
    let route = |h: Host| {
        Lit::Route(Match {
            host: Some(h),
            ..Default::default()
        })
    };
    let mut out = Vec::new();
    let mut ports = Vec::new();
    for p in patterns {
        let mut p = p.to_lowercase();
        if let Some((name, port)) = p.rsplit_once(':') {
            if let (Ok(port), false) = (port.parse::<u16>(), name.contains(':')) {
                if !ports.contains(&port) {
                    ports.push(port);
                }
                p = name.to_string();
            }
        }
        match method.unwrap_or("str") {
            "str" => out.push(route(Host::Exact(p))),
            "end" if p.starts_with('.') => out.push(route(Host::Suffix(p))),
            "dom" => {
                out.push(route(Host::Exact(p.clone())));
                out.push(route(Host::Suffix(format!(".{p}"))));
            }
            m => {
                return Err(format!(
                    "host match -m {m} {p}: veloxy matches exact names and *.suffix"
                ))
            }
        }
    }
    Ok((out, ports))
}

fn path_alts(method: Option<&str>, patterns: &[String], ci: bool) -> Result<Vec<Lit>, String> {
    let route = |p: PathPat| {
        Lit::Route(Match {
            path: Some(p),
            ..Default::default()
        })
    };
    let flags = if ci { "(?i)" } else { "" };
    let mut out = Vec::new();
    for p in patterns {
        let q = escape_regex(p);
        let pat = match (method.unwrap_or("str"), ci) {
            ("str", false) => PathPat::Exact(p.clone()),
            ("beg", false) => PathPat::Prefix(p.clone()),
            ("str", true) => PathPat::Regex(format!("(?i)^{q}$")),
            ("beg", true) => PathPat::Regex(format!("(?i)^{q}")),
            ("end", _) => PathPat::Regex(format!("{flags}{q}$")),
            ("sub", _) => PathPat::Regex(format!("{flags}{q}")),
            ("dir", _) => PathPat::Regex(format!(
                "{flags}(?:^|/){}(?:/|$)",
                escape_regex(p.trim_matches('/'))
            )),
            ("reg", _) => {
                check_regex(p)?;
                PathPat::Regex(format!("{flags}{p}"))
            }
            (m, _) => return Err(format!("path match -m {m}")),
        };
        out.push(route(pat));
    }
    Ok(out)
}

/// Refuses what Rust's regex syntax does not take (look-around, back-references).
pub fn check_regex(r: &str) -> Result<(), String> {
    regex_syntax::Parser::new()
        .parse(r)
        .map(|_| ())
        .map_err(|e| {
            format!(
                "regex {r:?} is not Rust regex syntax ({})",
                e.to_string().lines().last().unwrap_or("")
            )
        })
}

/// `s` as a regex matching itself literally.
pub fn escape_regex(s: &str) -> String {
    regex_syntax::escape(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(acl: &Acl) -> Vec<Host> {
        acl.alts
            .iter()
            .filter_map(|l| match l {
                Lit::Route(m) => m.host.clone(),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn host_patterns_lose_their_port() {
        let a = parse_acl(
            &[
                "hdr(host)",
                "-i",
                "login.example.com:8080",
                "www.example.com",
            ],
            Path::new("."),
        )
        .unwrap();
        assert_eq!(
            hosts(&a),
            vec![
                Host::Exact("login.example.com".into()),
                Host::Exact("www.example.com".into())
            ]
        );
        assert_eq!(a.ports, vec![8080]);
        assert_eq!(a.port_note(&[8080]), None);
        assert!(a.port_note(&[80, 8080]).unwrap().contains(":8080"));
        assert!(a.port_note(&[]).is_some());
        let plain = parse_acl(&["hdr(host)", "-i", "example.com"], Path::new(".")).unwrap();
        assert!(plain.ports.is_empty());
        assert_eq!(plain.port_note(&[80]), None);
        assert!(plain.note.unwrap().contains("with a port matches too"));
    }
}
