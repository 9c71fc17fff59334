//! Config errors that name the file, the line and the key, like `veloxy.toml:12:11: upstreams.api.connect_timeout: ...`.

use std::ops::Range;
use std::path::PathBuf;

/// Why a config could not be loaded. Every variant names its source file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read config: {source}")]
    Read {
        /// The config file.
        file: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A syntax, type or validation error at a place in the file.
    #[error("{file}:{line}:{column}: {key}: {message}")]
    Invalid {
        /// The file the error is in (the config, or a file it names).
        file: PathBuf,
        /// 1-based line of the offending value.
        line: usize,
        /// 1-based column of the offending value.
        column: usize,
        /// Dotted path of the offending key, e.g. `upstreams.api.servers[1]`.
        key: String,
        /// What is wrong, and what to write instead when that is known.
        message: String,
    },
    /// An error about the file as a whole (no listener, ...).
    #[error("{file}: {message}")]
    Whole {
        /// The config file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A hint for the TOML syntax errors people run into most, whose parser messages say what
/// was wrong for the grammar but not what to write instead. Matched on the `toml` crate's
/// message text; the unit tests below pin each one so a `toml` upgrade that rewords them is
/// noticed. Type and validation errors already say what is expected and get none.
fn syntax_hint(message: &str) -> Option<&'static str> {
    const BACKSLASH: &str =
        "in double quotes a backslash starts an escape (\\n, \\t, \\\\): use single \
                             quotes for Windows paths and regexes ('C:\\site', '\\d+'), or double \
                             each backslash";
    let hints: [(&str, &str); 9] = [
        ("invalid escape sequence", BACKSLASH),
        (
            "invalid basic string",
            "strings are in double quotes and end on the same line (\"\"\"...\"\"\" for several \
             lines); a backslash starts an escape: use single quotes for Windows paths or \
             regexes ('C:\\site\\', '\\d+')",
        ),
        (
            "invalid literal string",
            "a string in single quotes ends at the next ' on the same line",
        ),
        (
            "invalid string: expected",
            "text values need quotes: key = \"value\" (numbers, true and false do not)",
        ),
        (
            "invalid table header: duplicate key",
            "each [table] appears once: merge the two, or give one another name; lists of \
             tables use [[double brackets]], like [[routes]]",
        ),
        (
            "duplicate key",
            "a key appears once per table: remove or merge the repeated one",
        ),
        (
            "expected newline, `#`",
            "one key = value per line, and only a # comment after the value",
        ),
        (
            "invalid array",
            "a list is [a, b, c]: items separated by commas, closed by ]",
        ),
        (
            "invalid inline table",
            "an inline table is { key = value, key = value }, on one line",
        ),
    ];
    hints
        .iter()
        .find(|(pattern, _)| message.contains(pattern))
        .map(|(_, hint)| *hint)
}

/// Source text plus file name: turns byte spans into `file:line:column`.
pub(crate) struct Source<'a> {
    pub file: &'a std::path::Path,
    pub text: &'a str,
    /// Where in `text` the spans given to this source count from: 0, or the start of a run
    /// of `[[routes]]` entries parsed on their own (see `compile::runs`).
    pub base: usize,
}

impl Source<'_> {
    /// A path from the config, relative to the config file's directory.
    pub fn relative(&self, path: &str) -> std::path::PathBuf {
        let p = std::path::Path::new(path);
        match self.file.parent() {
            Some(dir) if p.is_relative() && !dir.as_os_str().is_empty() && self.file.exists() => {
                dir.join(p)
            }
            _ => p.to_path_buf(),
        }
    }

    /// An error at `span` about `key`.
    pub fn error(
        &self,
        span: Range<usize>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        let (line, column) = self.line_col(self.base + span.start);
        ConfigError::Invalid {
            file: self.file.to_path_buf(),
            line,
            column,
            key: key.into(),
            message: message.into(),
        }
    }

    /// A warning: the config is valid but probably not what was meant. Same
    /// `file:line:column: key:` prefix as errors, then `warning:`.
    pub fn warning(&self, span: Range<usize>, key: &str, message: &str) -> String {
        let (line, column) = self.line_col(self.base + span.start);
        format!(
            "{}:{line}:{column}: {key}: warning: {message}",
            self.file.display()
        )
    }

    /// An error about the whole file (no single place to point at).
    pub fn whole(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::Whole {
            file: self.file.to_path_buf(),
            message: message.into(),
        }
    }

    /// Converts a TOML parse or type error, recovering the key from the text around its span.
    pub fn toml_error(&self, err: &toml::de::Error) -> ConfigError {
        let mut message = plain_types(&err.message().trim().replace('\n', ": "));
        if let Some(hint) = syntax_hint(&message) {
            message = format!("{message}; hint: {hint}");
        }
        match err.span() {
            Some(span) => {
                let key = self.key_at(self.base + span.start);
                self.error(span, key, message)
            }
            None => self.whole(message),
        }
    }

    fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let column = before.rfind('\n').map_or(offset, |nl| offset - nl - 1) + 1;
        (line, column)
    }

    /// Best-effort dotted key for an offset: the nearest `[table]` header above it plus the
    /// `key =` on its line; `[[array]]` headers get their index (`routes[2].upstream`).
    pub fn key_at(&self, offset: usize) -> String {
        let offset = offset.min(self.text.len());
        let line_start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let line_end = self.text[offset..]
            .find('\n')
            .map_or(self.text.len(), |i| offset + i);
        let line = self.text[line_start..line_end].trim();
        let key = if line.starts_with('[') {
            None
        } else {
            line.split_once('=')
                .map(|(k, _)| k.trim().trim_matches('"').to_owned())
        };
        let mut table = String::new();
        let mut counts: std::collections::HashMap<String, usize> = Default::default();
        for l in self.text[..line_start].lines() {
            let l = l.trim();
            if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
                let name = name.trim().to_owned();
                let n = counts.entry(name.clone()).or_insert(0);
                table = format!("{name}[{n}]");
                *n += 1;
            } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split(']').next()) {
                table = name.trim().to_owned();
            }
        }
        if line.starts_with('[') {
            return line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_owned();
        }
        match (table.is_empty(), key) {
            (true, Some(k)) => k,
            (true, None) => "(top level)".to_owned(),
            (false, Some(k)) => format!("{table}.{k}"),
            (false, None) => table,
        }
    }
}

/// What to write for each table-valued key, by the serde struct that reads it: a wrong type
/// names the shape to write, not a Rust type (`expected struct RedirectSection`).
const TABLE_SHAPES: &[(&str, &str)] = &[
    ("RedirectSection", "a table like { to = \"https://{host}{uri}\", status = 301 }"),
    ("RespondSection", "a table like { status = 200, body = \"ok\\n\", content_type = \"text/plain\" }"),
    ("RouteCacheSection", "a table like { store = \"main\", default_ttl = \"30s\" }"),
    ("CacheSection", "a table like [caches.main] with memory = \"256MiB\""),
    ("CacheDiskSection", "a table like { path = \"/var/cache/veloxy\", size = \"10GiB\" }"),
    ("StreamSection", "a table like [[streams]] with listener = \"tcp\" and upstream = \"db\""),
    ("ServerSection", "a table like [server] with workers = 2"),
    ("RedisSection", "a table like { url = \"redis://127.0.0.1:6379\" }"),
    ("AcmeSection", "a table like [server.acme] with email = \"ops@example.com\""),
    ("AccessLogSection", "a table like { path = \"/var/log/veloxy/access.log\", format = \"json\" }"),
    ("ListenerSection", "a table like [listeners.web] with addr = \"0.0.0.0:80\""),
    ("TlsSection", "a table like [listeners.web.tls] with cert = \"cert.pem\" and key = \"key.pem\""),
    ("CertSection", "a table like { hosts = [\"example.com\"], cert = \"cert.pem\", key = \"key.pem\" }"),
    ("RouteSection", "a table like [[routes]] with path = \"/\" and upstream = \"app\""),
    ("HeaderRulesSection", "a table like { set = { \"X-Name\" = \"value\" }, add = { \"X-Other\" = \"v\" }, remove = [\"X-Debug\"] }"),
    ("CorsSection", "a table like { origins = [\"https://app.example.com\"], methods = [\"GET\", \"POST\"] }"),
    ("ForwardAuthSection", "a table like { upstream = \"authelia\", path = \"/api/verify\", copy_headers = [\"Remote-User\"] }"),
    ("BasicAuthSection", "a table like { realm = \"admin\", users_file = \"htpasswd\" }"),
    ("RateLimitSection", "a table like { rate = \"10/s\", burst = 20 }"),
    ("HealthSection", "a table like { path = \"/health\", interval = \"5s\" }"),
    ("OutlierSection", "a table like { consecutive_failures = 5, base_ejection = \"30s\" }"),
    ("UpstreamSection", "a table like [upstreams.app] with servers = [\"127.0.0.1:9000\"]"),
    ("UpstreamSearchSection", "a table like { kind = \"opensearch\", discover = \"30s\" }"),
    ("RouteSearchSection", "a table like { bulk = \"route_to_shards\", max_size = 1000 }"),
    ("StickySection", "a table like { cookie = \"srv\", ttl = \"1h\" }"),
    ("ServerEntry", "\"host:port\" or a table like { addr = \"host:port\", weight = 2 }"),
];

/// serde's type words in a message, as a config's author would say them.
fn plain_types(message: &str) -> String {
    let mut m = message.to_owned();
    if let Some(i) = m.find("expected struct ") {
        let name: String = m[i + 16..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if let Some((_, shape)) = TABLE_SHAPES.iter().find(|(n, _)| *n == name) {
            m = format!("{}expected {shape}{}", &m[..i], &m[i + 16 + name.len()..]);
        }
    }
    for (rust, plain) in [
        ("expected usize", "expected a whole number"),
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected u16", "expected a whole number"),
        ("expected a boolean", "expected true or false"),
        ("expected a sequence", "expected a list like [\"a\", \"b\"]"),
    ] {
        m = m.replace(rust, plain);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hint each common mistake gets, through the real parser: a `toml` upgrade that
    /// rewords its messages fails here instead of silently dropping the hints.
    #[test]
    fn common_toml_mistakes_get_a_hint() {
        let cases = [
            (r#"root = "C:\site""#, "backslash starts an escape"),
            ("root = \"C:\\\"\n", "use single quotes for Windows paths"),
            ("a = \"x\nb = 1\n", "end on the same line"),
            ("a = 'x\n", "single quotes ends"),
            ("a = x\n", "need quotes"),
            ("a = 1\na = 2\n", "a key appears once"),
            ("[a]\n[a]\n", "each [table] appears once"),
            ("a = 1 b = 2\n", "one key = value per line"),
            ("a = [1, 2\n", "a list is [a, b, c]"),
            ("a = { b = 1\n", "an inline table is"),
        ];
        for (text, want) in cases {
            let src = Source {
                file: std::path::Path::new("t.toml"),
                text,
                base: 0,
            };
            let err = toml::from_str::<toml::Table>(text).unwrap_err();
            let shown = src.toml_error(&err).to_string();
            assert!(shown.starts_with("t.toml:"), "{text:?}: {shown}");
            assert!(shown.contains("; hint: "), "{text:?}: {shown}");
            assert!(shown.contains(want), "{text:?}: want {want:?} in {shown}");
        }
    }

    #[test]
    fn type_errors_get_no_hint() {
        assert_eq!(
            syntax_hint("invalid type: string \"two\", expected usize"),
            None
        );
    }
}
