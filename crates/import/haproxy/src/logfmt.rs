//! HAProxy log-format strings (`%[src]`, `%[req.hdr(host)]`, `%ci`...) as veloxy templates.

/// `s` as a veloxy template, or what has no equivalent.
pub fn template(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '{' => out.push_str("{{"),
            '}' => out.push_str("}}"),
            '%' if chars.get(i + 1) == Some(&'%') => {
                out.push('%');
                i += 1;
            }
            '%' if chars.get(i + 1) == Some(&'[') => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == ']')
                    .ok_or("'%[' without ']'")?
                    + i;
                let expr: String = chars[i + 2..end].iter().collect();
                out.push_str(&sample(expr.trim())?);
                i = end;
            }
            '%' => {
                let name: String = chars[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                let v = match name.as_str() {
                    "ci" => "{client_ip}",
                    "cp" => "{client_port}",
                    "fp" => "{server_port}",
                    "ID" => "{request_id}",
                    _ => return Err(format!("log-format variable %{name}")),
                };
                out.push_str(v);
                i += name.len();
            }
            c => out.push(c),
        }
        i += 1;
    }
    Ok(out)
}

/// A sample expression as a template variable.
fn sample(expr: &str) -> Result<String, String> {
    let (name, arg) = match expr.split_once('(') {
        Some((n, a)) => (n, Some(a.strip_suffix(')').ok_or("unclosed '('")?)),
        None => (expr, None),
    };
    if expr.contains(',') && !expr.ends_with(')') || arg.is_some_and(|a| a.contains(')')) {
        return Err(format!("sample %[{expr}] (converters have no equivalent)"));
    }
    let name = name.strip_prefix("req.").unwrap_or(name);
    Ok(match (name, arg) {
        ("src", None) => "{client_ip}".into(),
        ("src_port", None) => "{client_port}".into(),
        ("dst_port", None) => "{server_port}".into(),
        ("hdr" | "fhdr", Some(h)) if h.eq_ignore_ascii_case("host") => "{authority}".into(),
        ("hdr" | "fhdr", Some(h)) => format!("{{header.{h}}}"),
        ("path", None) => "{path}".into(),
        ("query", None) => "{query}".into(),
        ("url" | "uri", None) => "{uri}".into(),
        ("cook" | "req.cook", Some(c)) => format!("{{cookie.{c}}}"),
        ("urlp" | "url_param", Some(q)) => format!("{{query.{q}}}"),
        ("unique-id", None) => "{request_id}".into(),
        _ => return Err(format!("sample %[{expr}] has no veloxy template variable")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        assert_eq!(template("%[src]").unwrap(), "{client_ip}");
        assert_eq!(template("/v2%[path]").unwrap(), "/v2{path}");
        assert_eq!(
            template("%[req.hdr(X-Id)] {x}").unwrap(),
            "{header.X-Id} {{x}}"
        );
        assert_eq!(template("100%%").unwrap(), "100%");
        assert!(template("%[src,ipmask(24)]").is_err());
        assert!(template("%[rand]").is_err());
    }
}
