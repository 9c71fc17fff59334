//! `veloxy import --from caddyfile`: a Caddyfile (with its snippets and imports) becomes a
//! veloxy config, with a report line for every directive.
//!
//! * [`lexer`], [`env`] and [`parse`]: tokens (quotes, backticks, heredocs, `\` line
//!   continuations), environment placeholders resolved in every token, lines and `{ }` blocks,
//!   the global options block, snippets and `import` (snippets with arguments, files, globs).
//! * `translate`: Caddy's semantics as veloxy's: automatic HTTPS (ACME for public names, the
//!   HTTP -> HTTPS redirect), the directive order, matchers, `handle` branches, each directive.

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

pub mod env;
pub mod lexer;
pub mod parse;
mod translate;

/// The Caddyfile importer.
pub struct Caddyfile;

/// Directives that only Caddyfiles have (nginx, HAProxy and Traefik use other words).
const CADDY_WORDS: &[&str] = &[
    "reverse_proxy",
    "file_server",
    "encode",
    "handle_path",
    "handle",
    "redir",
    "respond",
    "basicauth",
    "basic_auth",
    "php_fastcgi",
    "forward_auth",
    "try_files",
    "header",
    "tls",
    "import",
];

impl Importer for Caddyfile {
    fn name(&self) -> &'static str {
        "caddyfile"
    }

    /// A file named `Caddyfile` (or `*.caddy`, `*.caddyfile`), or text with no `;`
    /// terminators and a line that opens a site or uses a Caddy directive.
    fn detect(&self, path: &Path, text: &str) -> bool {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if name.starts_with("caddyfile") || name.ends_with(".caddy") || name.ends_with(".caddyfile")
        {
            return true;
        }
        let code: Vec<&str> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .collect();
        if code.is_empty() || code.iter().any(|l| l.ends_with(';')) {
            return false;
        }
        let directive = code.iter().any(|l| {
            let first = l.split_whitespace().next().unwrap_or("");
            CADDY_WORDS.contains(&first) && !l.contains(": ") && !l.contains('=')
        });
        let site = code.iter().any(|l| {
            l.ends_with('{') && {
                let a = l.trim_end_matches('{').trim();
                a.starts_with(':')
                    || a.starts_with("http://")
                    || a.starts_with("https://")
                    || (a.contains('.') && !a.contains(' ') && !a.contains('='))
            }
        });
        directive && (site || code.len() > 1)
    }

    fn import(&self, files: &[PathBuf], opts: &Options) -> Result<Imported, ImportError> {
        let Some(main) = files.first() else {
            return Err(ImportError::Usage("no Caddyfile given".into()));
        };
        if files.len() > 1 {
            return Err(ImportError::Usage(
                "one Caddyfile at a time (it imports the others itself)".into(),
            ));
        }
        let cf = parse::parse_file(main, opts)?;
        let (config, report) = translate::translate(&cf, opts, main);
        Ok(Imported { config, report })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_caddyfiles_only() {
        let c = Caddyfile;
        assert!(c.detect(Path::new("x"), "example.com {\n  reverse_proxy app:80\n}\n"));
        assert!(c.detect(Path::new("x"), ":8080 {\n  file_server\n}\n"));
        assert!(!c.detect(Path::new("x"), "server {\n  listen 80;\n}\n"));
        assert!(!c.detect(Path::new("x"), "frontend web\n  bind :80\n"));
        assert!(!c.detect(Path::new("x"), "http:\n  routers:\n    a: {}\n"));
        assert!(c.detect(Path::new("/etc/caddy/Caddyfile"), ""));
    }
}
