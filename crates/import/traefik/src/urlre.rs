//! `redirectRegex`: Traefik runs `regex.ReplaceAllString(URL, replacement)` on the request's
//! whole URL (`scheme://host[:port]/path?query`) and redirects when the result differs.
//! veloxy's redirects are templates on a route that matches by host and path, so the regex
//! is run here on sample URLs of each (scheme, host) the route serves:
//!
//! * when every path gives the same template (the path and query land unchanged at one place
//!   of the result: `^https?://www\.(.*)` -> `https://${1}`), the route redirects to it;
//! * else the regex is split at the path's first `/`: the host part is matched here, the
//!   path part becomes the route's `path_regex`, and its captures `{re.N}`.

use regex_automata::meta::Regex;
use regex_automata::util::captures::Captures;

/// The marker standing for the request path (a byte no request path holds).
const MARK: &str = "\u{1}";
/// The marker standing for the request host of a route without host names.
const HOST: &str = "h\u{2}.invalid";

/// A redirect for one (scheme, host): `path_regex` (None: every path) and the target
/// template. `None` in the result: the regex does not change these URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// The route's `path_regex` (None: the route's own paths).
    pub path_regex: Option<String>,
    /// The `redirect.to` template.
    pub to: String,
    /// Difference from Traefik.
    pub note: Option<String>,
}

/// Go's `$1`, `${1}`, `${name}` in `replacement`, expanded from `caps` on `hay`; each capture
/// text is passed through `map` (to turn markers into template variables).
fn expand(
    replacement: &str,
    hay: &str,
    caps: &Captures,
    re: &Regex,
    map: &dyn Fn(&str) -> String,
) -> String {
    let mut out = String::new();
    let b = replacement.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            let (name, next) = if b[i + 1] == b'{' {
                match replacement[i + 2..].find('}') {
                    Some(e) => (&replacement[i + 2..i + 2 + e], i + 3 + e),
                    None => ("", i + 1),
                }
            } else {
                let e = replacement[i + 1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map_or(b.len(), |e| i + 1 + e);
                (&replacement[i + 1..e], e)
            };
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if !name.is_empty() {
                let span = match name.parse::<usize>() {
                    Ok(n) => caps.get_group(n),
                    Err(_) => re
                        .group_info()
                        .to_index(regex_automata::PatternID::ZERO, name)
                        .and_then(|n| caps.get_group(n)),
                };
                if let Some(s) = span {
                    out.push_str(&map(&hay[s.start..s.end]));
                }
                i = next;
                continue;
            }
        }
        let ch = replacement[i..].chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// `ReplaceAllString` on `hay`, captures mapped by `map`, literal text by `lit`.
fn replace_all(
    re: &Regex,
    hay: &str,
    replacement: &str,
    map: &dyn Fn(&str) -> String,
    lit: &dyn Fn(&str) -> String,
) -> String {
    let mut out = String::new();
    let mut last = 0;
    let mut caps = re.create_captures();
    let mut at = 0;
    while at <= hay.len() {
        re.search_captures(&regex_automata::Input::new(hay).range(at..), &mut caps);
        let Some(m) = caps.get_match() else { break };
        out.push_str(&lit(&hay[last..m.start()]));
        out.push_str(&expand(replacement, hay, &caps, re, map));
        last = m.end();
        at = if m.is_empty() { m.end() + 1 } else { m.end() };
    }
    out.push_str(&lit(hay.get(last..).unwrap_or_default()));
    out
}

/// Marker text as template text: the path marker (with its slash) becomes `{uri}`, the host
/// marker `{authority}`; braces are doubled.
fn templ(s: &str) -> String {
    s.replace('{', "{{")
        .replace('}', "}}")
        .replace(&format!("/{MARK}"), "{uri}")
        .replace(HOST, "{authority}")
}

/// The redirect of a route on `host` (None: any host) for `scheme`.
pub fn redirect(
    regex: &str,
    replacement: &str,
    scheme: &str,
    host: Option<&str>,
) -> Result<Option<Redirect>, String> {
    let re = Regex::new(regex).map_err(|e| format!("the regex does not compile: {e}"))?;
    let h = host.unwrap_or(HOST);
    // Whole-URL form: the marker must travel unchanged, and real paths must agree.
    let sample = format!("{scheme}://{h}/{MARK}");
    if re.is_match(&sample) {
        let t = templ(&replace_all(
            &re,
            &sample,
            replacement,
            &|s| s.to_string(),
            &|s| s.to_string(),
        ));
        if t == templ(&sample) {
            return Ok(None);
        }
        if t.matches("{uri}").count() == 1
            && !t.contains(MARK)
            && agrees(&re, replacement, scheme, h, &t)
        {
            return Ok(Some(Redirect {
                path_regex: None,
                to: t,
                note: None,
            }));
        }
    }
    split(regex, replacement, scheme, h)
}

/// Whether the template gives Traefik's result on a few real paths.
fn agrees(re: &Regex, replacement: &str, scheme: &str, h: &str, t: &str) -> bool {
    ["/", "/a/b.c", "/a?x=1&y=%20", "/x/"].iter().all(|p| {
        let url = format!("{scheme}://{h}{p}");
        let traefik = replace_all(re, &url, replacement, &|s| s.to_string(), &|s| {
            s.to_string()
        });
        let ours = t
            .replace("{uri}", p)
            .replace("{authority}", h)
            .replace("{{", "{")
            .replace("}}", "}");
        traefik == ours
    })
}

/// Splits `^SCHEME://HOST/PATH` at the path's first `/`.
fn split(
    regex: &str,
    replacement: &str,
    scheme: &str,
    h: &str,
) -> Result<Option<Redirect>, String> {
    let body = regex
        .strip_prefix('^')
        .ok_or("the regex is not anchored with ^ and depends on the path")?;
    let Some(slash) = top_level_slash(body) else {
        // No path part: the host (or scheme) does not match, unless a real path does.
        let re = Regex::new(regex).map_err(|e| format!("the regex does not compile: {e}"))?;
        if ["/", "/a/b", "/a?x=1"]
            .iter()
            .any(|p| re.is_match(&format!("{scheme}://{h}{p}")))
        {
            return Err("the regex depends on the path in a way veloxy cannot match".into());
        }
        return Ok(None);
    };
    let (host_re, path_re) = (&body[..slash], &body[slash..]);
    let host_groups = groups(host_re);
    let hre = Regex::new(&format!("^(?:{host_re})$"))
        .map_err(|e| format!("the regex does not compile: {e}"))?;
    let hay = format!("{scheme}://{h}");
    let mut caps = hre.create_captures();
    hre.captures(hay.as_str(), &mut caps);
    if !caps.is_match() {
        return Ok(None);
    }
    let anchored_end = (path_re.ends_with('$') && !path_re.ends_with("\\$"))
        || path_re.ends_with(".*")
        || path_re.ends_with(".*)");
    let path_regex = if anchored_end {
        format!("^{path_re}")
    } else {
        format!("^{path_re}(.*)")
    };
    Regex::new(&path_regex).map_err(|e| format!("the regex does not compile: {e}"))?;
    // Rewrite the replacement: host-part groups become constants, path-part ones {re.N}.
    let mut to = String::new();
    let b = replacement;
    let mut rest = b;
    let mut query_lost = false;
    while let Some(i) = rest.find('$') {
        to.push_str(&esc(&rest[..i]));
        let after = &rest[i + 1..];
        let (name, len) = if let Some(inner) = after.strip_prefix('{') {
            let e = inner.find('}').ok_or("an unclosed ${ in the replacement")?;
            (&inner[..e], e + 2)
        } else {
            let e = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..e], e)
        };
        match name.parse::<usize>() {
            Ok(0) => return Err("$0 (the whole URL) in the replacement".into()),
            Ok(n) if n <= host_groups => {
                if let Some(s) = caps.get_group(n) {
                    to.push_str(&esc(&hay[s.start..s.end]));
                }
            }
            Ok(n) => {
                to.push_str(&format!("{{re.{}}}", n - host_groups));
                query_lost = true;
            }
            Err(_) if !name.is_empty() => {
                to.push_str(&format!("{{re.{name}}}"));
                query_lost = true;
            }
            Err(_) => to.push('$'),
        }
        rest = &after[len..];
    }
    to.push_str(&esc(rest));
    if !anchored_end {
        to.push_str(&format!("{{re.{}}}", groups(path_re) + 1));
        query_lost = true;
    }
    Ok(Some(Redirect {
        path_regex: Some(path_regex),
        to,
        note: query_lost.then(|| "the path captures are the path only: the query string is not carried into the redirect".to_string()),
    }))
}

fn esc(s: &str) -> String {
    s.replace('{', "{{").replace('}', "}}")
}

/// The first `/` after `://` that is outside groups, classes and escapes.
fn top_level_slash(s: &str) -> Option<usize> {
    let start = s.find("://")? + 3;
    let b = s.as_bytes();
    let (mut depth, mut class, mut i) = (0i32, false, start);
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'[' if !class => class = true,
            b']' if class => class = false,
            b'(' if !class => depth += 1,
            b')' if !class => depth -= 1,
            b'/' if !class && depth == 0 => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Capture groups in a regex fragment: `(` not followed by `?` (or `(?P<`, `(?<`).
fn groups(s: &str) -> usize {
    let b = s.as_bytes();
    let (mut n, mut class, mut i) = (0, false, 0);
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'[' if !class => class = true,
            b']' if class => class = false,
            b'(' if !class => {
                let rest = &s[i + 1..];
                if !rest.starts_with('?')
                    || rest.starts_with("?P<")
                    || (rest.starts_with("?<")
                        && !rest.starts_with("?<=")
                        && !rest.starts_with("?<!"))
                {
                    n += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(
        re: &str,
        rep: &str,
        scheme: &str,
        host: Option<&str>,
    ) -> Option<(Option<String>, String)> {
        redirect(re, rep, scheme, host)
            .unwrap()
            .map(|r| (r.path_regex, r.to))
    }

    #[test]
    fn whole_url() {
        assert_eq!(
            r(
                "^https?://www\\.(.*)",
                "https://${1}",
                "http",
                Some("www.example.com")
            ),
            Some((None, "https://example.com{uri}".into()))
        );
        assert_eq!(
            r(
                "^https?://www\\.(.*)",
                "https://${1}",
                "https",
                Some("example.com")
            ),
            None
        );
        assert_eq!(
            r("^http://(.*)", "https://$1", "http", None),
            Some((None, "https://{authority}{uri}".into()))
        );
    }

    #[test]
    fn path_part() {
        assert_eq!(
            r(
                "^https?://example\\.com/old/(.*)",
                "https://example.com/new/${1}",
                "https",
                Some("example.com")
            ),
            Some((
                Some("^/old/(.*)".into()),
                "https://example.com/new/{re.1}".into()
            ))
        );
        assert_eq!(
            r(
                "^(https?)://([^/]+)/blog/(.*)$",
                "$1://$2/news/$3",
                "https",
                Some("a.example")
            ),
            Some((
                Some("^/blog/(.*)$".into()),
                "https://a.example/news/{re.1}".into()
            ))
        );
    }
}
