//! docker compose's variables: the `.env` file beside a compose file (compose reads it for
//! `${VAR}` placeholders), interpolation (`${VAR}`, `${VAR:-default}`, `$$`), and the docker
//! provider's `defaultRule` template (`{{ normalize .Name }}`, `.ContainerName`,
//! `index .Labels "key"`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use veloxy_import::{Loc, Options};

/// One `.env` file: its variables with their places.
#[derive(Debug, Clone, Default)]
pub struct DotEnv {
    /// `NAME` -> (value, place).
    pub vars: BTreeMap<String, (String, Loc)>,
    /// The variables a placeholder used.
    pub used: BTreeSet<String>,
}

impl DotEnv {
    /// Reads `DIR/.env` (none when absent): `NAME=VALUE` lines, `export NAME=VALUE`, `#`
    /// comments, values in single or double quotes.
    pub fn read(dir: &Path) -> Option<DotEnv> {
        let path = dir.join(".env");
        let text = std::fs::read_to_string(&path).ok()?;
        let file: Arc<str> = path.display().to_string().into();
        Some(Self::parse(&file, &text))
    }

    /// Parses the text of a `.env` file.
    pub fn parse(file: &Arc<str>, text: &str) -> DotEnv {
        let mut vars = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let l = l.strip_prefix("export ").unwrap_or(l);
            let Some((k, v)) = l.split_once('=') else {
                continue;
            };
            let v = v.trim();
            let v = if (v.starts_with('"') && v.ends_with('"') && v.len() >= 2)
                || (v.starts_with('\'') && v.ends_with('\'') && v.len() >= 2)
            {
                &v[1..v.len() - 1]
            } else {
                v.split(" #").next().unwrap_or(v).trim()
            };
            let loc = Loc::new(file, i as u32 + 1, 1);
            vars.insert(k.trim().to_string(), (v.to_string(), loc));
        }
        DotEnv {
            vars,
            used: BTreeSet::new(),
        }
    }

    /// A variable's value: the environment's with `--env`, else the file's.
    fn value(&mut self, name: &str, opts: &Options) -> Option<String> {
        if let Some(v) = opts.env.as_ref().and_then(|e| e.get(name)) {
            return Some(v.clone());
        }
        let (v, _) = self.vars.get(name)?;
        self.used.insert(name.to_string());
        Some(v.clone())
    }
}

/// docker compose interpolation: `${VAR}` and `${VAR:-default}` from the `.env` file (the
/// environment wins with `--env`), the rest through [`Options::expand_env`]; `$$` is a `$`.
pub fn interpolate(v: &str, opts: &Options, env: &mut DotEnv) -> Result<String, String> {
    if !v.contains('$') {
        return Ok(v.to_string());
    }
    let protected = v.replace("$$", "\u{0}");
    let mut out = String::with_capacity(protected.len());
    let mut rest = protected.as_str();
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let Some(end) = rest[i..].find('}') else {
            out.push_str(&rest[i..]);
            rest = "";
            break;
        };
        let inner = &rest[i + 2..i + end];
        let name_end = inner
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(inner.len());
        let (name, op) = inner.split_at(name_end);
        match env.value(name, opts) {
            Some(val) => {
                let default = op.strip_prefix(":-").or_else(|| op.strip_prefix('-'));
                match default {
                    Some(d) if val.is_empty() && op.starts_with(':') => out.push_str(d),
                    _ => out.push_str(&val),
                }
            }
            None => match op.strip_prefix('-') {
                // `${VAR-default}`: the default when unset.
                Some(d) => out.push_str(d),
                None => out.push_str(&rest[i..i + end + 1]),
            },
        }
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    let expanded = opts.expand_env(&out)?;
    Ok(expanded.replace('\u{0}', "$"))
}

/// What `defaultRule` sees of a container.
pub struct Model<'a> {
    /// `.Name`: the compose service and project, `SERVICE_PROJECT` (normalized in use).
    pub name: &'a str,
    /// `.ContainerName`.
    pub container_name: &'a str,
    /// `.Labels`.
    pub labels: &'a [(String, String)],
}

/// Traefik's `provider.Normalize`: runs of characters other than letters and digits become
/// one `-`, none at the ends.
pub fn normalize(s: &str) -> String {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// Evaluates a `defaultRule` template. Hand-written: the provider's templates use a handful
/// of forms (a Go template engine would be a large dependency for them); others are `Err`.
pub fn eval_rule(tpl: &str, m: &Model) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = tpl;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let end = rest[i..]
            .find("}}")
            .ok_or_else(|| format!("defaultRule {tpl}: an unclosed {{{{"))?;
        let inner = rest[i + 2..i + end]
            .trim()
            .trim_start_matches('-')
            .trim_end_matches('-')
            .trim();
        out.push_str(&eval_expr(inner, m).ok_or_else(|| {
            format!("defaultRule {tpl}: only .Name, .ContainerName, index .Labels \"KEY\" and normalize are evaluated")
        })?);
        rest = &rest[i + end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn eval_expr(e: &str, m: &Model) -> Option<String> {
    let e = e.trim();
    if let Some(inner) = e.strip_prefix('(').and_then(|x| x.strip_suffix(')')) {
        return eval_expr(inner, m);
    }
    if let Some(arg) = e.strip_prefix("normalize ") {
        return eval_expr(arg, m).map(|v| normalize(&v));
    }
    if let Some(args) = e.strip_prefix("index ") {
        let key = args
            .trim()
            .strip_prefix(".Labels")?
            .trim()
            .trim_matches('"');
        return Some(
            m.labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_default(),
        );
    }
    match e {
        ".Name" => Some(m.name.to_string()),
        ".ContainerName" => Some(m.container_name.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rules() {
        let labels = vec![("app.domain".to_string(), "example.com".to_string())];
        let m = Model {
            name: "whoami_stack",
            container_name: "stack-whoami-1",
            labels: &labels,
        };
        assert_eq!(
            eval_rule("Host(`{{ normalize .Name }}`)", &m).unwrap(),
            "Host(`whoami-stack`)"
        );
        assert_eq!(
            eval_rule("PathPrefix(`/{{ .ContainerName }}`)", &m).unwrap(),
            "PathPrefix(`/stack-whoami-1`)"
        );
        assert_eq!(
            eval_rule(
                "Host(`{{ normalize .Name }}.{{ index .Labels \"app.domain\" }}`)",
                &m
            )
            .unwrap(),
            "Host(`whoami-stack.example.com`)"
        );
        assert!(eval_rule("Host(`{{ .Foo }}`)", &m).is_err());
    }

    #[test]
    fn dotenv_placeholders() {
        let f: Arc<str> = "x/.env".into();
        let mut env = DotEnv::parse(
            &f,
            "# c\nAPP_HOST=app.example.com\nexport EMAIL=\"a@b.c\"\nEMPTY=\n",
        );
        let o = Options::default();
        assert_eq!(
            interpolate("Host(`${APP_HOST}`)", &o, &mut env).unwrap(),
            "Host(`app.example.com`)"
        );
        assert_eq!(interpolate("${EMAIL}", &o, &mut env).unwrap(), "a@b.c");
        assert_eq!(interpolate("${EMPTY:-d}", &o, &mut env).unwrap(), "d");
        assert_eq!(interpolate("$$apr1$$x", &o, &mut env).unwrap(), "$apr1$x");
        assert!(interpolate("${MISSING}", &o, &mut env).is_err());
        assert!(env.used.contains("APP_HOST") && !env.used.contains("MISSING"));
    }
}
