//! Environment placeholders in nginx configs written as templates: the official nginx image
//! runs `envsubst` over `/etc/nginx/templates/*.template`, so `server ${BACKEND};` or
//! `listen ${PORT};` are common. nginx itself reads `${name}` as one of its own variables,
//! whose names are lowercase (`$host`, `$http_x_real_ip`); so an upper-case `${NAME}` (the
//! environment's convention, what envsubst is given) is a placeholder: resolved with
//! `--env` (or its `${NAME:-default}`), else the directive is refused naming it. Lower-case
//! ones stay nginx variables.

use veloxy_import::{Options, Report};

use crate::parse::Directive;

/// `directives` with their placeholders resolved; a directive with one that cannot be is
/// reported refused (with everything inside it) and left out.
pub(super) fn resolve(
    directives: &[Directive],
    opts: &Options,
    rep: &mut Report,
) -> Vec<Directive> {
    let mut out = Vec::with_capacity(directives.len());
    for d in directives {
        match resolve_one(d, opts) {
            Ok(mut resolved) => {
                if let Some(block) = &d.block {
                    resolved.block = Some(resolve(block, opts, rep));
                }
                out.push(resolved);
            }
            Err(why) => refuse(d, &why, rep),
        }
    }
    out
}

/// `d` with the placeholders of its own arguments resolved (its block left empty).
fn resolve_one(d: &Directive, opts: &Options) -> Result<Directive, String> {
    // The block is resolved by the caller, directive by directive.
    let mut d = Directive {
        loc: d.loc.clone(),
        name: d.name.clone(),
        args: d.args.clone(),
        block: d.block.as_ref().map(|_| Vec::new()),
    };
    for a in &mut d.args {
        a.text = expand(&a.text, opts)?;
    }
    Ok(d)
}

/// Resolves the upper-case `${NAME}` placeholders of `text` (see the module doc).
fn expand(text: &str, opts: &Options) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        let placeholder = &rest[start..start + len + 1];
        let inner = &placeholder[2..placeholder.len() - 1];
        let name = inner.split(':').next().unwrap_or("");
        let env_name = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        out.push_str(&rest[..start]);
        if env_name {
            out.push_str(&opts.expand_env(placeholder)?);
        } else {
            out.push_str(placeholder);
        }
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn refuse(d: &Directive, why: &str, rep: &mut Report) {
    rep.refused(&d.loc, &d.name, why);
    for c in d.block.iter().flatten() {
        refuse(c, why, rep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_case_placeholders_are_the_environment_lower_case_ones_nginx_variables() {
        let without = Options::default();
        assert!(expand("${UP}", &without).unwrap_err().contains("UP"));
        assert_eq!(
            expand("${UP:-127.0.0.1:9}", &without).unwrap(),
            "127.0.0.1:9"
        );
        assert_eq!(
            expand("${scheme}://${host}", &without).unwrap(),
            "${scheme}://${host}"
        );
        let with = Options {
            env: Some([("UP".to_string(), "10.0.0.1:80".to_string())].into()),
            ..Options::default()
        };
        assert_eq!(
            expand("http://${UP}/${uri}", &with).unwrap(),
            "http://10.0.0.1:80/${uri}"
        );
        assert!(expand("${MISSING}", &with).unwrap_err().contains("MISSING"));
    }
}
