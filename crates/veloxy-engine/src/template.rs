//! Templates in config values (`redirect = { to = "https://{host}{uri}" }`): compiled once at
//! load time into literal parts and variables, rendered per request without parsing.

use std::fmt;

/// One variable a template can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    /// The request method.
    Method,
    /// The request's host, without its port, lowercase (as nginx's `$host`).
    Host,
    /// `{authority}`: the Host (or `:authority`) as it is forwarded upstream: the host as
    /// sent, and its port when the request named one. The default cache key uses it, so a
    /// request for another port is another entry.
    Authority,
    /// Path and query as received.
    Uri,
    /// The path, without the query.
    Path,
    /// The query, without `?` ("" when none).
    Query,
    /// `{is_args}`: "?" when the request has a query, else "" (nginx's `$is_args`), so
    /// `"{path}{is_args}{query}"` keeps a query without leaving a bare `?`.
    IsArgs,
    /// `http` or `https`: the client's scheme.
    Scheme,
    /// The client's IP address.
    ClientIp,
    /// The client's port.
    ClientPort,
    /// The port the request came in on.
    ServerPort,
    /// `{header.NAME}`: a request header's first value ("" when absent).
    Header(String),
    /// `{cookie.NAME}`: a cookie's value.
    Cookie(String),
    /// `{query.NAME}`: a query parameter's first value, as sent.
    QueryArg(String),
    /// `{re.1}` / `{re.NAME}`: a capture group of the route's `path_regex`.
    Re(Capture),
    /// `{request_id}`: the request's ID (`[server] request_id`).
    RequestId,
}

impl Var {
    /// The value may carry CR, LF or NUL (the client's header fields, cookies and query
    /// arguments); the others cannot: addresses, ports, the scheme, the ID, and the path and
    /// host, which the codecs have already validated.
    fn may_break_lines(&self) -> bool {
        matches!(self, Var::Header(_) | Var::Cookie(_) | Var::QueryArg(_))
    }
}

/// A `path_regex` capture group, by number or name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capture {
    /// `{re.1}` (`{re.0}` is the whole match).
    Index(usize),
    /// `{re.NAME}` for `(?<NAME>...)`.
    Name(String),
}

/// A compiled template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    /// The source text, for `veloxy check --print`.
    source: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

/// How a proxied route changes the request target sent upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRule {
    /// `strip_prefix = true`: the route's `path` prefix is removed (the path keeps at least
    /// `/`); the query is kept.
    StripPrefix(String),
    /// `rewrite = "/v2{path}"`: the path is replaced by the rendered template; the query is
    /// kept unless the template has a `?` (`"/new?{query}&x=1"` replaces it, a trailing empty
    /// `?` drops it: `"/socket/?"`).
    Rewrite(Template),
}

impl PathRule {
    /// The new request target (path and query) for `target`, the client's, written into
    /// `out` (empty; a reused buffer).
    pub(crate) fn apply(&self, target: &str, vars: &dyn Vars, mut out: String) -> String {
        let (path, query) = match memchr::memchr(b'?', target.as_bytes()) {
            Some(i) => (&target[..i], Some(&target[i + 1..])),
            None => (target, None),
        };
        match self {
            PathRule::StripPrefix(prefix) => {
                let rest = path.strip_prefix(prefix.as_str()).unwrap_or(path);
                out.push('/');
                out.push_str(rest.trim_start_matches('/'));
            }
            PathRule::Rewrite(t) => {
                t.render_into(vars, &mut out);
                if memchr::memchr(b'?', out.as_bytes()).is_some() {
                    // An empty query (`"/socket/?"`, or `"?{query}"` with none) is no query,
                    // as nginx's `rewrite ... ?` drops the arguments.
                    if out.ends_with('?') {
                        out.pop();
                    }
                    return out;
                }
            }
        }
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        out
    }
}

/// What a template is rendered against.
pub(crate) trait Vars {
    /// The value of `var` for this request.
    fn value(&self, var: &Var, out: &mut String);
}

impl Template {
    /// Compiles `text`; `{name}` is a variable, `{{` and `}}` are literal braces. An unknown
    /// variable or an unclosed brace is an error naming it.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(i) = rest.find(['{', '}']) {
            lit.push_str(&rest[..i]);
            let (c, after) = (rest.as_bytes()[i], &rest[i + 1..]);
            if after.as_bytes().first() == Some(&c) {
                lit.push(c as char);
                rest = &after[1..];
                continue;
            }
            if c == b'}' {
                return Err(format!(
                    "unmatched '}}' in {text:?} (write '}}}}' for a brace)"
                ));
            }
            let end = after
                .find('}')
                .ok_or_else(|| format!("unclosed '{{' in {text:?}"))?;
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            let name = &after[..end];
            let var = var(name).map_err(|e| {
                if text[..text.len() - rest.len() + i].ends_with('$') {
                    format!(
                        "${{{name}}} looks like a shell or nginx variable: veloxy does not expand \
                         environment variables in its config; write the value ({e})"
                    )
                } else {
                    e
                }
            })?;
            parts.push(Part::Var(var));
            rest = &after[end + 1..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template {
            parts,
            source: text.to_owned(),
        })
    }

    /// Renders against `vars`. CR, LF and NUL never reach the output: values carrying them
    /// lose them (a template feeds header values).
    pub(crate) fn render(&self, vars: &dyn Vars) -> String {
        let mut out = String::new();
        self.render_into(vars, &mut out);
        out
    }

    /// [`render`](Self::render), appending to `out` (no allocation of its own).
    pub(crate) fn render_into(&self, vars: &dyn Vars, out: &mut String) {
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => {
                    let start = out.len();
                    vars.value(v, out);
                    if v.may_break_lines()
                        && memchr::memchr3(b'\r', b'\n', b'\0', &out.as_bytes()[start..]).is_some()
                    {
                        let clean: String = out[start..]
                            .chars()
                            .filter(|c| !matches!(c, '\r' | '\n' | '\0'))
                            .collect();
                        out.truncate(start);
                        out.push_str(&clean);
                    }
                }
            }
        }
    }
}

impl Template {
    /// The template has no variable: it renders the same for every request.
    pub fn is_literal(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The text of a template without variables.
    pub fn literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Lit(s)] => Some(s),
            _ => None,
        }
    }

    /// Replaces `{re.NAME}` by the group's index (`index` resolves a name).
    pub(crate) fn resolve_captures(&mut self, index: impl Fn(&str) -> Option<usize>) {
        for p in &mut self.parts {
            if let Part::Var(Var::Re(Capture::Name(n))) = p {
                if let Some(i) = index(n) {
                    *p = Part::Var(Var::Re(Capture::Index(i)));
                }
            }
        }
    }

    /// The variables used, in order.
    pub fn vars(&self) -> impl Iterator<Item = &Var> {
        self.parts.iter().filter_map(|p| match p {
            Part::Var(v) => Some(v),
            Part::Lit(_) => None,
        })
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn var(name: &str) -> Result<Var, String> {
    let named = |prefix: &str| {
        name.strip_prefix(prefix)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
    };
    Ok(match name {
        "method" => Var::Method,
        "host" => Var::Host,
        "authority" => Var::Authority,
        "uri" => Var::Uri,
        "path" => Var::Path,
        "query" => Var::Query,
        "is_args" => Var::IsArgs,
        "scheme" => Var::Scheme,
        "client_ip" => Var::ClientIp,
        "client_port" => Var::ClientPort,
        "server_port" => Var::ServerPort,
        "request_id" => Var::RequestId,
        _ => {
            if let Some(h) = named("header.") {
                Var::Header(h.to_ascii_lowercase())
            } else if let Some(c) = named("cookie.") {
                Var::Cookie(c)
            } else if let Some(q) = named("query.") {
                Var::QueryArg(q)
            } else if let Some(r) = named("re.") {
                Var::Re(match r.parse::<usize>() {
                    Ok(n) => Capture::Index(n),
                    Err(_) => Capture::Name(r),
                })
            } else {
                return Err(format!(
                    "unknown template variable {{{name}}}: use method, host, authority, uri, path, query, scheme, \
                     client_ip, client_port, server_port, request_id, header.NAME, cookie.NAME, \
                     query.NAME, re.N or re.NAME"
                ));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Vars for Fixed {
        fn value(&self, var: &Var, out: &mut String) {
            out.push_str(match var {
                Var::Host => "example.com",
                Var::Uri => "/a?b=1",
                Var::Header(_) => "x\r\ny",
                _ => "?",
            });
        }
    }

    #[test]
    fn parse_and_render() {
        let t = Template::parse("https://{host}{uri}").unwrap();
        assert_eq!(t.render(&Fixed), "https://example.com/a?b=1");
        let t = Template::parse("{{literal}} {header.X-A}").unwrap();
        assert_eq!(t.render(&Fixed), "{literal} xy");
        assert!(Template::parse("{nope}")
            .unwrap_err()
            .contains("unknown template variable {nope}"));
        assert!(Template::parse("{host").is_err());
        assert!(Template::parse("a}b").is_err());
    }
}
