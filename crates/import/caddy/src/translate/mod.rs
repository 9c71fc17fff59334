//! Caddyfile -> veloxy: global options, site blocks (addresses, automatic HTTPS, TLS) and
//! their routes (see [`flow`]).

mod addr;
mod errors;
mod flow;
mod global;
mod handlers;
mod matcher;
mod middleware;
mod output;
mod placeholder;
mod proxy;
mod sites;
mod tls;
mod upstream;

use std::path::{Path, PathBuf};

use toml::Value;
use veloxy_import::{Config, Options, Report};

use crate::parse::{Caddyfile, Line};

/// The translator's state for one import.
pub struct T<'a> {
    /// The command line's options.
    pub opts: &'a Options,
    /// The output.
    pub cfg: Config,
    /// The report.
    pub report: Report,
    /// Where relative paths in the Caddyfile are taken from (Caddy: its working directory;
    /// here the Caddyfile's directory).
    pub base: PathBuf,
    /// `servers { trusted_proxies ... }`: X-Forwarded-For is then kept from trusted peers.
    pub trusted_proxies: bool,
    /// Global `auto_https`.
    pub auto_https: String,
    /// Global `http_port` / `https_port`.
    pub http_port: u16,
    /// See `http_port`.
    pub https_port: u16,
    /// Global `local_certs`: every site on Caddy's local CA.
    pub local_certs: bool,
    /// Where `auto_https` is set (reported with the sites).
    pub auto_https_loc: Option<veloxy_import::Loc>,
    /// The directive order (Caddy's, changed by the `order` option).
    pub order: Vec<String>,
    /// `servers { protocols }` offers HTTP/3 (Caddy's default).
    pub http3: bool,
}

/// Translates a parsed Caddyfile.
pub fn translate(cf: &Caddyfile, opts: &Options, main: &Path) -> (Config, Report) {
    let mut t = T {
        opts,
        cfg: Config::default(),
        report: Report::default(),
        base: main.parent().unwrap_or(Path::new("")).to_path_buf(),
        trusted_proxies: false,
        auto_https: "on".into(),
        http_port: 80,
        https_port: 443,
        local_certs: false,
        auto_https_loc: None,
        order: flow::ORDER.iter().map(|d| d.to_string()).collect(),
        http3: true,
    };
    t.cfg.header.push(format!(
        "veloxy config imported from the Caddyfile {}",
        main.display()
    ));
    t.global(&cf.global);
    for (loc, what) in &cf.imports {
        t.report.translated(loc, format!("import {what}"));
    }
    for (name, loc) in &cf.unused_snippets {
        t.report
            .ignored(loc, name.as_str(), "a snippet that is never imported");
    }
    for (name, loc) in &cf.named_routes {
        t.report
            .refused(loc, name.as_str(), "named routes (Caddy 2.7's invoke)");
    }
    t.sites(&cf.sites);
    t.report.sort();
    dedupe(&mut t.report);
    (t.cfg, t.report)
}

/// One line per directive: a snippet imported in several places is reported once per
/// outcome.
fn dedupe(r: &mut Report) {
    let mut seen = std::collections::HashSet::new();
    r.entries.retain(|e| {
        seen.insert((
            e.loc.clone(),
            e.directive.clone(),
            format!("{:?}", e.outcome),
        ))
    });
}

/// Reports every line of a block (and nested blocks) with the same refusal.
pub fn report_nested(t: &mut T<'_>, lines: &[Line], why: &str) {
    for l in lines {
        if l.toks.is_empty() {
            continue;
        }
        t.report.refused(l.loc(), l.name(), why.to_string());
        report_nested(t, l.body(), why);
    }
}

impl T<'_> {
    /// A path named in the Caddyfile, as written in the output.
    pub fn path(&self, p: &str) -> String {
        self.opts.out_path(&self.base, p)
    }
}

/// A Go duration (`30s`, `1m30s`, `500ms`, `2h`, `1d`) as a veloxy one.
pub fn duration(v: &str) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    if v.chars().all(|c| c.is_ascii_digit()) {
        // Caddy: a bare integer is nanoseconds.
        let ns: u64 = v.parse().ok()?;
        return Some(format!("{}ms", ns / 1_000_000));
    }
    let mut total_ms: f64 = 0.0;
    let mut num = String::new();
    let mut chars = v.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        while let Some(&n) = chars.peek() {
            if n.is_ascii_alphabetic() || n == 'µ' {
                unit.push(n);
                chars.next();
            } else {
                break;
            }
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        total_ms += n * match unit.as_str() {
            "ns" => 1e-6,
            "us" | "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3600e3,
            "d" => 86400e3,
            _ => return None,
        };
    }
    if !num.is_empty() {
        return None;
    }
    let ms = total_ms.round() as u64;
    Some(if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    })
}

/// A Caddy size (`10MB`, `1GiB`, `512k`, `1048576`) as a veloxy one.
pub fn size(v: &str) -> Option<Value> {
    let digits: String = v.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: i64 = digits.parse().ok()?;
    let unit = v[digits.len()..].trim().to_ascii_lowercase();
    let mult: i64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "ki" | "kib" => 1024,
        "m" | "mb" => 1000 * 1000,
        "mi" | "mib" => 1024 * 1024,
        "g" | "gb" => 1000 * 1000 * 1000,
        "gi" | "gib" => 1024 * 1024 * 1024,
        _ => return None,
    };
    let named = match unit.as_str() {
        "kb" | "k" => Some("KB"),
        "mb" | "m" => Some("MB"),
        "gb" | "g" => Some("GB"),
        "kib" | "ki" => Some("KiB"),
        "mib" | "mi" => Some("MiB"),
        "gib" | "gi" => Some("GiB"),
        _ => None,
    };
    Some(match named {
        Some(u) => Value::String(format!("{n}{u}")),
        None => Value::Integer(n * mult),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(duration("30s").unwrap(), "30s");
        assert_eq!(duration("1m30s").unwrap(), "90s");
        assert_eq!(duration("500ms").unwrap(), "500ms");
        assert_eq!(duration("2h").unwrap(), "2h");
        assert!(duration("x").is_none());
        assert_eq!(size("10MB").unwrap(), Value::String("10MB".into()));
        assert_eq!(size("1024").unwrap(), Value::Integer(1024));
    }
}
