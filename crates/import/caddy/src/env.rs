//! Environment placeholders, resolved once for every token before the parser groups them.
//!
//! * `{$VAR}` and `{$VAR:default}` are Caddy's parse-time placeholders: Caddy substitutes
//!   them in the text before anything else, so they work in every token (site addresses,
//!   global options, `tls`, matchers...) and a value with spaces becomes several tokens.
//! * `{env.VAR}` is a runtime placeholder, read from Caddy's environment when a request (or
//!   the config's provisioning) uses it; the importer resolves it from the same environment.
//!
//! Both come from `--env` ([`Options::expand_env`]). A token whose placeholder cannot be
//! resolved keeps its text and says why in [`Token::unresolved`], naming the variable, so the
//! directive that uses it is refused by name.

use veloxy_import::Options;

use crate::lexer::Token;

/// `toks` with their placeholders resolved.
pub fn substitute(toks: Vec<Token>, opts: &Options) -> Vec<Token> {
    let mut out = Vec::with_capacity(toks.len());
    for t in toks {
        if !t.text.contains("{$") && !t.text.contains("{env.") {
            out.push(t);
            continue;
        }
        let (text, env, unresolved) = resolve(&t.text, opts);
        let base = Token {
            env,
            unresolved: unresolved.clone(),
            ..t
        };
        if unresolved.is_some() || base.quoted {
            out.push(Token { text, ..base });
            continue;
        }
        // Caddy substitutes before splitting the text into tokens.
        for word in text.split_whitespace() {
            out.push(Token {
                text: word.to_string(),
                ..base.clone()
            });
        }
    }
    out
}

/// The text with every placeholder resolved, the variables named, and the first reason one
/// could not be (the text then keeps that placeholder as written).
fn resolve(text: &str, opts: &Options) -> (String, Vec<String>, Option<String>) {
    let mut out = String::new();
    let mut env = Vec::new();
    let mut why = None;
    let mut rest = text;
    loop {
        let next = [rest.find("{$"), rest.find("{env.")]
            .into_iter()
            .flatten()
            .min();
        let Some(start) = next else { break };
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        let span = &rest[start..=start + len];
        out.push_str(&rest[..start]);
        rest = &rest[start + len + 1..];
        if let Some(inner) = span.strip_prefix("{$").and_then(|s| s.strip_suffix('}')) {
            if inner.is_empty() {
                out.push_str(span);
                continue;
            }
            env.push(inner.split(':').next().unwrap_or(inner).to_string());
            match opts.expand_env(span) {
                Ok(v) => out.push_str(&v),
                Err(e) => {
                    why.get_or_insert(e);
                    out.push_str(span);
                }
            }
            continue;
        }
        let name = &span[5..span.len() - 1];
        env.push(name.to_string());
        match &opts.env {
            // Caddy reads an unset variable as empty.
            Some(vars) => out.push_str(vars.get(name).map_or("", String::as_str)),
            None => {
                why.get_or_insert(format!(
                    "runtime placeholder {{env.{name}}} (run with --env to resolve it from the \
                     environment)"
                ));
                out.push_str(span);
            }
        }
    }
    out.push_str(rest);
    (out, env, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn run(text: &str, env: Option<&[(&str, &str)]>) -> Vec<Token> {
        let f: Arc<str> = "C".into();
        let opts = Options {
            env: env.map(|e| {
                e.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..Default::default()
        };
        substitute(crate::lexer::lex(&f, text).unwrap(), &opts)
    }

    #[test]
    fn resolves_in_every_token() {
        let t = run(
            "tls {$EMAIL} x{env.SUFFIX}y",
            Some(&[("EMAIL", "a@b.c"), ("SUFFIX", "-")]),
        );
        let w: Vec<&str> = t.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(w, ["tls", "a@b.c", "x-y"]);
        assert_eq!(t[1].env, ["EMAIL"]);
        assert!(t.iter().all(|t| t.unresolved.is_none()));
    }

    #[test]
    fn values_with_spaces_split_unless_quoted() {
        let t = run(
            "to {$UP} \"{$UP}\" {$NONE}",
            Some(&[("UP", "a:1 b:2"), ("NONE", "")]),
        );
        let w: Vec<&str> = t.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(w, ["to", "a:1", "b:2", "a:1 b:2"]);
    }

    #[test]
    fn unresolved_names_the_variable() {
        let t = run("tls {$LE_EMAIL} {env.TOKEN}", None);
        assert_eq!(t[1].text, "{$LE_EMAIL}");
        assert!(t[1].unresolved.as_deref().unwrap().contains("LE_EMAIL"));
        assert!(t[2].unresolved.as_deref().unwrap().contains("{env.TOKEN}"));
        let t = run("a {$X}", Some(&[]));
        assert!(t[1].unresolved.as_deref().unwrap().contains('X'));
        // A default applies when the variable is unset.
        let t = run("a {$PORT:8080}", Some(&[]));
        assert_eq!(t[1].text, "8080");
    }
}
