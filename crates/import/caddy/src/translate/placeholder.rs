//! Caddy placeholders (`{host}`, `{http.request.uri}`, `{header.X}`, `{re.name.1}`...) as
//! veloxy template variables.

/// `text` with Caddy's placeholders written as veloxy's; braces that are not placeholders
/// become `{{`/`}}`. `upstream` is the address `{upstream_hostport}` stands for (a group of
/// one server). `Err` names a placeholder veloxy has no variable for.
pub fn template(text: &str, upstream: Option<&str>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(['{', '}', '\\']) {
        out.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        if c == b'\\' {
            match rest[i + 1..].chars().next() {
                Some(n @ ('{' | '}')) => {
                    out.push(n);
                    out.push(n);
                    rest = &rest[i + 2..];
                }
                _ => {
                    out.push('\\');
                    rest = &rest[i + 1..];
                }
            }
            continue;
        }
        if c == b'}' {
            out.push_str("}}");
            rest = &rest[i + 1..];
            continue;
        }
        let Some(end) = rest[i..].find('}') else {
            out.push_str("{{");
            rest = &rest[i + 1..];
            continue;
        };
        let name = &rest[i + 1..i + end];
        if name.is_empty() || name.contains(char::is_whitespace) || name.contains('{') {
            out.push_str("{{");
            rest = &rest[i + 1..];
            continue;
        }
        out.push_str(&variable(name, upstream)?);
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn variable(name: &str, upstream: Option<&str>) -> Result<String, String> {
    let n = name.strip_prefix("http.request.").map_or(name, |r| r);
    let simple = match n {
        "host" => Some("{host}"),
        "hostport" => Some("{authority}"),
        "uri" => Some("{uri}"),
        "path" | "uri.path" => Some("{path}"),
        "query" | "uri.query" => Some("{query}"),
        "scheme" => Some("{scheme}"),
        "method" => Some("{method}"),
        "remote_host" | "remote.host" | "client_ip" => Some("{client_ip}"),
        "remote_port" | "remote.port" => Some("{client_port}"),
        "port" | "local.port" => Some("{server_port}"),
        _ => None,
    };
    if let Some(s) = simple {
        return Ok(s.to_string());
    }
    if name == "upstream_hostport" || name == "http.reverse_proxy.upstream.hostport" {
        return upstream.map(str::to_string).ok_or_else(|| {
            format!("placeholder {{{name}}} (veloxy has no variable for the chosen backend)")
        });
    }
    for (caddy, veloxy) in [
        ("header.", "header."),
        ("cookie.", "cookie."),
        ("query.", "query."),
        ("uri.query.", "query."),
    ] {
        if let Some(field) = n.strip_prefix(caddy) {
            return Ok(format!("{{{veloxy}{field}}}"));
        }
    }
    let re = name
        .strip_prefix("re.")
        .or_else(|| name.strip_prefix("http.regexp."));
    if let Some(re) = re {
        // {re.NAME.N}: veloxy numbers the groups of the route's one regex.
        if let Some((_, group)) = re.rsplit_once('.') {
            return Ok(format!("{{re.{group}}}"));
        }
    }
    Err(format!(
        "placeholder {{{name}}} (veloxy has no such variable)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts() {
        assert_eq!(
            template("https://{host}{uri}", None).unwrap(),
            "https://{host}{uri}"
        );
        assert_eq!(
            template("{http.request.header.X-Id} {hostport}", None).unwrap(),
            "{header.X-Id} {authority}"
        );
        assert_eq!(template("/v2{re.p.1}", None).unwrap(), "/v2{re.1}");
        assert_eq!(template("{\"a\": 1}", None).unwrap(), "{{\"a\": 1}}");
        assert!(template("{vars.x}", None).unwrap_err().contains("vars.x"));
        assert_eq!(template("{upstream_hostport}", Some("a:1")).unwrap(), "a:1");
    }
}
