//! Small translations shared by the modules: nginx sizes, seconds, nginx variables in
//! redirect targets, and header names.

/// An nginx size (`1m`, `512k`, `10g`, `1024`) as a veloxy size (`"1MiB"`); `None` when it
/// does not parse. `Some(None)`: `0`, no limit.
pub fn nginx_size(v: &str) -> Option<Option<String>> {
    let v = v.trim();
    let (num, unit) = match v.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&v[..i], v[i..].to_ascii_lowercase()),
        None => (v, String::new()),
    };
    let n: u64 = num.parse().ok()?;
    if n == 0 {
        return Some(None);
    }
    let out = match unit.as_str() {
        "" => format!("{n}"),
        "k" => format!("{n}KiB"),
        "m" => format!("{n}MiB"),
        "g" => format!("{n}GiB"),
        _ => return None,
    };
    Some(Some(out))
}

/// Seconds as ingress-nginx reads its timeouts (`"30"`, also `"30s"`): `"30s"`.
pub fn seconds(v: &str) -> Option<String> {
    let v = v.trim();
    let n: u64 = v.strip_suffix('s').unwrap_or(v).parse().ok()?;
    Some(format!("{n}s"))
}

/// nginx variables in a redirect target or header value, as veloxy templates; `Err` names
/// the first variable veloxy has no equivalent for.
pub fn nginx_template(v: &str) -> Result<String, String> {
    let mut out = String::with_capacity(v.len());
    let mut rest = v;
    while let Some(i) = rest.find(['$', '{', '}']) {
        out.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        if c == b'{' || c == b'}' {
            out.push_str(if c == b'{' { "{{" } else { "}}" });
            rest = &rest[i + 1..];
            continue;
        }
        let after = &rest[i + 1..];
        let (name, len) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(e) => (&inner[..e], e + 2),
                None => return Err(format!("an unclosed variable in {v:?}")),
            }
        } else {
            let e = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..e], e)
        };
        let t = match name {
            "request_uri" => "{uri}".to_string(),
            "uri" | "document_uri" => "{path}".to_string(),
            "args" | "query_string" => "{query}".to_string(),
            "host" => "{host}".to_string(),
            "http_host" => "{authority}".to_string(),
            "scheme" => "{scheme}".to_string(),
            "remote_addr" => "{client_ip}".to_string(),
            "server_port" => "{server_port}".to_string(),
            n if n.len() == 1 && n.as_bytes()[0].is_ascii_digit() => format!("{{re.{n}}}"),
            n if n.starts_with("http_") => format!("{{header.{}}}", header_name(&n[5..])),
            n if n.starts_with("arg_") => format!("{{query.{}}}", &n[4..]),
            n if n.starts_with("cookie_") => format!("{{cookie.{}}}", &n[7..]),
            "" => return Err(format!("a lone '$' in {v:?}")),
            n => return Err(format!("the nginx variable ${n}")),
        };
        out.push_str(&t);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `x_forwarded_proto` -> `X-Forwarded-Proto` (nginx's `$http_NAME` spelling).
pub fn header_name(var: &str) -> String {
    var.split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// A comma-separated annotation value as trimmed, non-empty items.
pub fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// A TOML array of strings.
pub fn strings<S: AsRef<str>>(items: &[S]) -> toml::Value {
    toml::Value::Array(items.iter().map(|s| s.as_ref().into()).collect())
}

/// A TOML inline table from pairs.
pub fn table<const N: usize>(pairs: [(&str, toml::Value); N]) -> toml::Value {
    toml::Value::Table(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// `["a"]` -> `"a"` (one item is written as a plain value), else the list.
pub fn one_or_list(items: &[String]) -> toml::Value {
    match items {
        [one] => one.as_str().into(),
        _ => strings(items),
    }
}

/// Whether `host` is a DNS name an Ingress host can be: dot-separated labels of letters,
/// digits and inner `-` (1 to 63 characters each, 253 in all), optionally after `*.`.
/// Upper case is accepted (hosts match case-insensitively); `_`, spaces and placeholders
/// such as `<your domain>` are not.
pub fn dns_name(host: &str) -> bool {
    let name = host.strip_prefix("*.").unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// Why `host` is not a DNS name, for a refusal: `not a DNS name: "HOST" (...)`.
pub fn not_dns(host: &str) -> String {
    let hint = if host.contains(['<', '>', '{', '}', '$']) {
        "a placeholder to fill in?"
    } else {
        "labels of letters, digits and '-' only"
    };
    format!("not a DNS name: {host:?} ({hint})")
}

/// `http://REST` or `https://REST` as `(https, REST)`; `url` (trimmed) is named in the error.
pub(crate) fn split_scheme(url: &str) -> Result<(bool, &str), String> {
    if let Some(r) = url.strip_prefix("https://") {
        Ok((true, r))
    } else if let Some(r) = url.strip_prefix("http://") {
        Ok((false, r))
    } else {
        Err(format!("{url:?} is not an http:// or https:// URL"))
    }
}

/// `HOST[:PORT]` of `url` as `(HOST, PORT)`, the port defaulting to the scheme's.
pub(crate) fn host_port<'a>(
    url: &str,
    hostport: &'a str,
    https: bool,
) -> Result<(&'a str, u16), String> {
    match hostport.rsplit_once(':') {
        Some((h, p)) => Ok((h, p.parse().map_err(|_| format!("{url:?}: bad port"))?)),
        None => Ok((hostport, if https { 443 } else { 80 })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for ok in [
            "example.com",
            "API.Example.com",
            "*.example.com",
            "a-b.c1",
            "localhost",
        ] {
            assert!(dns_name(ok), "{ok}");
        }
        for bad in [
            "registry.<your domain>",
            "my_app.example.com",
            "*.*.example.com",
            "a..b",
            "-a.example.com",
            "example.com.",
            "",
            "ex ample.com",
        ] {
            assert!(!dns_name(bad), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(nginx_size("1m"), Some(Some("1MiB".into())));
        assert_eq!(nginx_size("512K"), Some(Some("512KiB".into())));
        assert_eq!(nginx_size("0"), Some(None));
        assert_eq!(nginx_size("1x"), None);
    }

    #[test]
    fn templates() {
        assert_eq!(
            nginx_template("https://$host$request_uri").unwrap(),
            "https://{host}{uri}"
        );
        assert_eq!(nginx_template("/$2").unwrap(), "/{re.2}");
        assert_eq!(nginx_template("$http_x_user").unwrap(), "{header.X-User}");
        assert!(nginx_template("$pid").unwrap_err().contains("$pid"));
    }
}
