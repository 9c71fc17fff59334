//! nginx values in veloxy terms: strings with `$variables` become templates (`{host}`),
//! sizes (`1m`) and durations (`60s`, `1h30m`, a bare number of seconds) become veloxy's.

use std::collections::BTreeMap;

/// What a value's variables may refer to besides the request.
#[derive(Debug, Default, Clone)]
pub struct VarCtx {
    /// `set $name value;` constants (values without variables).
    pub constants: BTreeMap<String, String>,
    /// `$1..$9` refer to a regex's captures (a regex location or rewrite).
    pub captures: bool,
    /// `$proxy_host`: the upstream's name as nginx sends it in Host.
    pub proxy_host: Option<String>,
    /// `$server_name`: the server's first name.
    pub server_name: Option<String>,
}

/// One `$name` (or `${name}`) in a value, and where the literal text around it is.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Literal text.
    Lit(&'a str),
    /// A variable's name, without `$`.
    Var(&'a str),
}

/// Splits `value` into literal text and variables.
pub fn pieces(value: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        let after = &rest[i + 1..];
        let (name, used) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(e) => (&inner[..e], e + 2),
                None => ("", 0),
            }
        } else {
            let n = after
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                .count();
            // `$1x` is capture 1 then "x": a digit name is one digit.
            let n = if after.starts_with(|c: char| c.is_ascii_digit()) {
                1
            } else {
                n
            };
            (&after[..n], n)
        };
        if name.is_empty() {
            out.push(Piece::Lit(&rest[..i + 1]));
            rest = after;
            continue;
        }
        if i > 0 {
            out.push(Piece::Lit(&rest[..i]));
        }
        out.push(Piece::Var(name));
        rest = &after[used..];
    }
    if !rest.is_empty() {
        out.push(Piece::Lit(rest));
    }
    out
}

/// Whether `value` uses any variable.
pub fn has_vars(value: &str) -> bool {
    pieces(value).iter().any(|p| matches!(p, Piece::Var(_)))
}

/// `value` as a veloxy template; the error names the variable veloxy lacks.
pub fn template(value: &str, ctx: &VarCtx) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    for p in pieces(value) {
        match p {
            Piece::Lit(s) => out.push_str(&s.replace('{', "{{").replace('}', "}}")),
            Piece::Var(name) => out.push_str(&variable(name, ctx)?),
        }
    }
    Ok(out)
}

/// One variable's veloxy template text.
fn variable(name: &str, ctx: &VarCtx) -> Result<String, String> {
    if let Some(v) = ctx.constants.get(name) {
        return Ok(v.replace('{', "{{").replace('}', "}}"));
    }
    let lower = name.to_ascii_lowercase();
    let field = |n: &str| n.replace('_', "-");
    Ok(match lower.as_str() {
        "host" => "{host}".into(),
        "http_host" => "{authority}".into(),
        "remote_addr" | "binary_remote_addr" | "realip_remote_addr" => "{client_ip}".into(),
        "remote_port" => "{client_port}".into(),
        "server_port" => "{server_port}".into(),
        "scheme" => "{scheme}".into(),
        "request_uri" => "{uri}".into(),
        "uri" | "document_uri" => "{path}".into(),
        "args" | "query_string" => "{query}".into(),
        "request_method" => "{method}".into(),
        "is_args" => "{is_args}".into(),
        "request_id" => "{request_id}".into(),
        "content_type" => "{header.content-type}".into(),
        "content_length" => "{header.content-length}".into(),
        "proxy_host" if ctx.proxy_host.is_some() => ctx.proxy_host.clone().unwrap_or_default(),
        "server_name" if ctx.server_name.is_some() => ctx.server_name.clone().unwrap_or_default(),
        n if n.len() == 1 && n.as_bytes()[0].is_ascii_digit() => {
            if !ctx.captures {
                return Err(format!("${name} (no regex capture here)"));
            }
            format!("{{re.{n}}}")
        }
        n => {
            if let Some(h) = n.strip_prefix("http_") {
                format!("{{header.{}}}", field(h))
            } else if let Some(a) = name.strip_prefix("arg_") {
                format!("{{query.{a}}}")
            } else if let Some(c) = name.strip_prefix("cookie_") {
                format!("{{cookie.{c}}}")
            } else {
                return Err(format!("${name}"));
            }
        }
    })
}

/// An nginx size (`512`, `10k`, `1m`, `2g`) as a veloxy size; `None` when malformed.
pub fn size(s: &str) -> Option<String> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&s[..i], Some(c.to_ascii_lowercase())),
        _ => (s, None),
    };
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        None => n.to_string(),
        Some('k') => format!("{n}KiB"),
        Some('m') => format!("{n}MiB"),
        Some('g') => format!("{n}GiB"),
        _ => return None,
    })
}

/// An nginx duration (`60`, `30s`, `1m`, `1h30m`, `500ms`) as a veloxy duration.
pub fn duration(s: &str) -> Option<String> {
    let ms = millis(s)?;
    Some(if ms % 1000 == 0 {
        let secs = ms / 1000;
        if secs % 3600 == 0 && secs > 0 {
            format!("{}h", secs / 3600)
        } else if secs % 60 == 0 && secs > 0 {
            format!("{}m", secs / 60)
        } else {
            format!("{secs}s")
        }
    } else {
        format!("{ms}ms")
    })
}

/// An nginx duration in milliseconds.
pub fn millis(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(n) = s.parse::<u64>() {
        return Some(n * 1000);
    }
    let mut total = 0u64;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        let value: u64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let factor = match &rest[..u] {
            "ms" => 1,
            "s" | "" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            "M" => 2_592_000_000,
            "y" => 31_536_000_000,
            _ => return None,
        };
        total += value * factor;
        rest = &rest[u..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        let mut c = VarCtx::default();
        assert_eq!(
            template("https://$host$request_uri", &c).unwrap(),
            "https://{host}{uri}"
        );
        assert_eq!(
            template("${http_x_real_ip}-$cookie_sid-$arg_q{}", &c).unwrap(),
            "{header.x-real-ip}-{cookie.sid}-{query.q}{{}}"
        );
        assert!(template("/$1", &c).unwrap_err().contains("$1"));
        c.captures = true;
        assert_eq!(template("/v2/$1x", &c).unwrap(), "/v2/{re.1}x");
        assert_eq!(template("$nope", &c).unwrap_err(), "$nope");
        assert_eq!(template("a$", &c).unwrap(), "a$");
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(size("1m").as_deref(), Some("1MiB"));
        assert_eq!(size("100K").as_deref(), Some("100KiB"));
        assert_eq!(size("0").as_deref(), Some("0"));
        assert_eq!(size("1x"), None);
        assert_eq!(duration("60").as_deref(), Some("1m"));
        assert_eq!(duration("75s").as_deref(), Some("75s"));
        assert_eq!(duration("1h30m").as_deref(), Some("90m"));
        assert_eq!(duration("500ms").as_deref(), Some("500ms"));
        assert_eq!(duration("x"), None);
    }
}
