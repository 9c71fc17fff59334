//! Command line: `run`, `check`, `import`, `proxy`, `serve`, `completions` (and the hidden
//! `manpage`, for packaging: see [`crate::manual`]).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `veloxy --version`: the crate version plus build info recorded by build.rs.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("VELOXY_GIT_COMMIT"),
    ", ",
    env!("VELOXY_BUILD_TARGET"),
    ", ",
    env!("VELOXY_BUILD_PROFILE"),
    ")"
);

/// Examples and signals, shown at the end of `veloxy --help` (and in the man page).
pub const AFTER_HELP: &str = "\
Examples:
  veloxy run --config /etc/veloxy/veloxy.toml
  veloxy check --config veloxy.toml
  veloxy proxy --listen 0.0.0.0:8080 --to 127.0.0.1:3000 --to 127.0.0.1:3001
  veloxy serve --root ./public --browse
  veloxy serve --root ./public --listen :443 --acme example.com --acme-email ops@example.com
  veloxy import /etc/nginx/nginx.conf -o veloxy.toml
  veloxy completions bash > /usr/share/bash-completion/completions/veloxy

Signals (run, proxy, serve):
  SIGHUP   reload the config file (run --config); a bad file is refused, the running config stays
  SIGUSR1  reopen the access log (after log rotation)
  SIGTERM  stop: finish in-flight requests, then exit (SIGINT too)";

#[derive(Parser, Debug)]
#[command(
    name = "veloxy",
    version = VERSION,
    about = "A fast reverse proxy, load balancer and web server",
    long_about = "A fast reverse proxy, load balancer and web server. veloxy runs from a TOML \
                  config file (`veloxy run --config FILE`, validated by `veloxy check`) or in a \
                  one-line mode: `veloxy proxy` balances a listen address over backends, \
                  `veloxy serve` serves a directory. `veloxy import` translates an nginx, Caddy, \
                  Traefik, HAProxy, Envoy or Kubernetes Ingress config into a veloxy one.",
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run from a config file; without --config, run the built-in demo on 127.0.0.1:8080.
    Run {
        /// The TOML config file; SIGHUP reloads it [default: none: the built-in demo, a
        /// listener on 127.0.0.1:8080 balancing over two in-process backends]
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        upgrade: UpgradeArg,
    },
    /// Validate a config file: exit 0, or print `file:line:column: key: error` and exit 1.
    Check {
        /// The TOML config file to validate (required).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Print the compiled config as TOML, every default filled in and paths absolute,
        /// instead of the summary line (veloxy accepts the output as a config file).
        #[arg(long)]
        print: bool,
    },
    /// Translate another tool's config (nginx, Caddyfile, Traefik, HAProxy, Envoy, Kubernetes
    /// Ingress) into a veloxy config, with a report of every source directive.
    Import(ImportArgs),
    /// One-line mode: proxy a listen address to backends, round robin.
    Proxy(ProxyArgs),
    /// One-line mode: serve the files of a directory.
    Serve(ServeArgs),
    /// Print a shell completion script to stdout, e.g. `veloxy completions bash >
    /// /usr/share/bash-completion/completions/veloxy`.
    Completions {
        /// The shell to complete for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the local CA's certificate (the CA of `local_ca = true` listeners and
    /// `--tls-self-signed`), making it first if there is none, for clients to trust.
    Trust {
        /// Also install it in the system's trust store (update-ca-certificates).
        #[arg(long)]
        install: bool,
        /// The CA's directory [default: $XDG_DATA_HOME/veloxy/pki or ~/.local/share/veloxy/pki].
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// Print the man page (roff) to stdout, for packaging: `veloxy manpage > veloxy.1`.
    #[command(hide = true)]
    Manpage,
}

/// `veloxy import FILE... [--from F] [-o OUT] [--report FILE] [--format text|json] [--strict]`.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The source files: nginx.conf (includes are followed), Caddyfile, Traefik static and
    /// dynamic files or docker-compose files, haproxy.cfg, an Envoy bootstrap, Kubernetes YAML.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The source format [default: detected from the first file's content]
    #[arg(long, value_name = "FORMAT", value_parser = ["nginx", "caddyfile", "traefik", "haproxy", "envoy", "ingress"])]
    pub from: Option<String>,
    /// Write the TOML here (and generated files, such as htpasswd, beside it) [default:
    /// stdout]
    #[arg(short, long, value_name = "OUT.toml")]
    pub output: Option<PathBuf>,
    /// Write the report here [default: stderr]
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// The report's format.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
    /// Exit 1 when any directive was refused (the output is still written).
    #[arg(long)]
    pub strict: bool,
    /// Resolve `{$VAR}` / `${VAR}` placeholders from the environment (without it they are
    /// refused).
    #[arg(long)]
    pub env: bool,
    /// nginx: the prefix relative `include`s and paths are taken from [default: the first
    /// file's directory]
    #[arg(long, value_name = "DIR")]
    pub prefix: Option<PathBuf>,
    /// ingress: the address of a Service port, `NAME.NAMESPACE:PORT=ADDR` (repeatable)
    /// [default: the DNS name `NAME.NAMESPACE.svc:PORT`]
    #[arg(long, value_name = "NAME.NS:PORT=ADDR")]
    pub service: Vec<String>,
}

/// `--upgrade`, for every mode that listens.
#[derive(Args, Debug, Default, Clone, Copy)]
pub struct UpgradeArg {
    /// Zero-downtime binary upgrade: share the listener and admin ports another process (the
    /// old veloxy) holds, instead of refusing to start. Then SIGTERM the old process.
    #[arg(long)]
    pub upgrade: bool,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Directory to serve.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub root: String,
    /// Worker threads [default: one per core]
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// List directories without an index file.
    #[arg(long)]
    pub browse: bool,
    /// Fall back to this file (relative to the root) for missing paths, e.g. index.html for
    /// a single-page app [default: none: 404]
    #[arg(long, value_name = "FILE")]
    pub fallback: Option<String>,
    /// Cache-Control header value for files [default: none: no Cache-Control header]
    #[arg(long, value_name = "VALUE")]
    pub cache_control: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub upgrade: UpgradeArg,
}

#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// Address to listen on, e.g. 127.0.0.1:8080 (required).
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// A backend: host:port, or https://host:port for a TLS backend (verified against the
    /// system roots, or --ca-file); repeat for more, one scheme for all (required).
    #[arg(long = "to", value_name = "ADDR", required = true)]
    pub to: Vec<String>,
    /// CA certificates (PEM) to verify https:// backends with [default: the system roots]
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Worker threads [default: one per core]
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Idle upstream connections kept per worker and backend.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub keepalive: usize,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub upgrade: UpgradeArg,
}

/// TLS for the one-line modes.
#[derive(Args, Debug, Default, Clone)]
pub struct TlsArgs {
    /// Serve HTTPS with this certificate chain (PEM) [default: none]
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        conflicts_with = "tls_self_signed"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) for --tls-cert (required with it).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve HTTPS with a certificate for localhost issued at start by a local CA kept on
    /// disk (its path is printed so clients can trust it).
    #[arg(long)]
    pub tls_self_signed: bool,
    /// Directory of the local CA for --tls-self-signed [default: $XDG_DATA_HOME/veloxy/pki,
    /// or ~/.local/share/veloxy/pki]
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Accept HTTP/2 without TLS (h2c prior knowledge). With TLS, HTTP/2 is always offered.
    #[arg(long)]
    pub http2: bool,
    /// Also serve HTTP/3 (QUIC, UDP on the same port); needs TLS (--tls-*, or --acme).
    #[arg(long)]
    pub http3: bool,
    /// Serve HTTPS with a certificate for NAME obtained (and renewed) by ACME; repeat for
    /// more names. Also listens on --acme-http-listen for the http-01 challenge, redirecting
    /// everything else to HTTPS [default: none]
    #[arg(long, value_name = "NAME", conflicts_with = "tls_self_signed")]
    pub acme: Vec<String>,
    /// The ACME account's contact email [default: none: an account without contact]
    #[arg(long, value_name = "EMAIL", requires = "acme")]
    pub acme_email: Option<String>,
    /// The ACME directory URL [default: Let's Encrypt,
    /// https://acme-v02.api.letsencrypt.org/directory]
    #[arg(long, value_name = "URL", requires = "acme")]
    pub acme_directory: Option<String>,
    /// CA certificates (PEM) trusted for the ACME directory (a private or test CA) [default:
    /// the system roots]
    #[arg(long, value_name = "FILE", requires = "acme")]
    pub acme_ca_file: Option<PathBuf>,
    /// Where ACME accounts and certificates are kept [default: $XDG_DATA_HOME/veloxy/acme,
    /// or ~/.local/share/veloxy/acme]
    #[arg(long, value_name = "DIR", requires = "acme")]
    pub acme_storage: Option<PathBuf>,
    /// The plain HTTP listener started with --acme: HTTP -> HTTPS redirects and http-01
    /// challenges. "off": none (certificates then come by tls-alpn-01 only).
    #[arg(long, value_name = "ADDR", default_value = ":80", requires = "acme")]
    pub acme_http_listen: String,
}

/// The certificate and key a one-line mode serves.
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With --tls-self-signed: the local CA's certificate, for the `curl --cacert` hint that
    /// is printed once the listener is bound (its port is not known before with port 0).
    pub local_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The certificate and key to serve, issuing a self-signed one if asked.
    pub fn resolve(&self) -> anyhow::Result<Option<Tls>> {
        if self.tls_self_signed {
            let dir = self
                .tls_dir
                .clone()
                .unwrap_or_else(crate::local_ca::default_dir);
            let issued = crate::local_ca::issue(&dir)?;
            eprintln!(
                "veloxy: serving a certificate for localhost from the local CA {}",
                issued.ca.display()
            );
            return Ok(Some(Tls {
                cert: issued.cert,
                key: issued.key,
                local_ca: Some(issued.ca),
            }));
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Ok(Some(Tls {
                cert: absolute(c),
                key: absolute(k),
                local_ca: None,
            })),
            _ => Ok(None),
        }
    }

    /// TOML lines for the listener `main` (and, with --acme, the plain `http` listener and
    /// `[server.acme]`).
    pub fn listener_toml(&self, tls: Option<&Tls>) -> String {
        let mut s = String::new();
        if self.http2 {
            s.push_str("http2 = true\n");
        }
        if self.http3 {
            s.push_str("http3 = true\n");
        }
        if tls.is_some() || !self.acme.is_empty() {
            s.push_str("[listeners.main.tls]\n");
        }
        if let Some(Tls { cert, key, .. }) = tls {
            s.push_str(&format!(
                "cert = {}\nkey = {}\n",
                quote(&cert.to_string_lossy()),
                quote(&key.to_string_lossy())
            ));
        }
        if self.acme.is_empty() {
            return s;
        }
        let names: Vec<String> = self.acme.iter().map(|n| quote(n)).collect();
        s.push_str(&format!("acme = [{}]\n", names.join(", ")));
        if self.acme_http_listen != "off" {
            s.push_str(&format!(
                "[listeners.http]\naddr = {}\nredirect_https = true\n",
                quote(&self.acme_http_listen)
            ));
        }
        s.push_str("[server.acme]\n");
        if let Some(e) = &self.acme_email {
            s.push_str(&format!("email = {}\n", quote(e)));
        }
        if let Some(d) = &self.acme_directory {
            s.push_str(&format!("directory = {}\n", quote(d)));
        }
        if let Some(c) = &self.acme_ca_file {
            s.push_str(&format!(
                "ca_file = {}\n",
                quote(&absolute(c).to_string_lossy())
            ));
        }
        if let Some(d) = &self.acme_storage {
            s.push_str(&format!(
                "storage = {}\n",
                quote(&absolute(d).to_string_lossy())
            ));
        }
        s
    }
}

fn absolute(p: &std::path::Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn quote(s: &str) -> String {
    toml_string(s)
}

/// TOML basic string with escapes.
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The `proxy` mode is sugar for a config file: building TOML text keeps one validation path
/// (and its error messages) for both.
pub fn proxy_config(a: &ProxyArgs, tls: Option<&Tls>) -> String {
    let mut s = String::from("[server]\n");
    if let Some(w) = a.workers {
        s.push_str(&format!("workers = {w}\n"));
    }
    s.push_str(&format!("[listeners.main]\naddr = {}\n", quote(&a.listen)));
    s.push_str(&a.tls.listener_toml(tls));
    s.push_str("[[routes]]\nupstream = \"backends\"\n");
    let servers: Vec<String> = a.to.iter().map(|t| quote(t)).collect();
    s.push_str(&format!(
        "[upstreams.backends]\nservers = [{}]\npolicy = \"round_robin\"\nkeepalive = {}\n",
        servers.join(", "),
        a.keepalive
    ));
    if let Some(ca) = &a.ca_file {
        s.push_str(&format!(
            "ca_file = {}\n",
            quote(&absolute(ca).to_string_lossy())
        ));
    }
    s
}

/// The `serve` mode, like `proxy`, is sugar for a config file. The root is made absolute
/// first: generated configs resolve relative paths from the current directory anyway, but an
/// absolute path keeps log and error messages unambiguous.
pub fn serve_config(a: &ServeArgs, tls: Option<&Tls>) -> String {
    let root = std::path::absolute(&a.root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| a.root.clone());
    let mut s = String::from("[server]\n");
    if let Some(w) = a.workers {
        s.push_str(&format!("workers = {w}\n"));
    }
    s.push_str(&format!("[listeners.main]\naddr = {}\n", quote(&a.listen)));
    s.push_str(&a.tls.listener_toml(tls));
    s.push_str(&format!("[[routes]]\nroot = {}\n", quote(&root)));
    if a.browse {
        s.push_str("browse = true\n");
    }
    if let Some(f) = &a.fallback {
        s.push_str(&format!("try_files = [{}]\n", quote(f)));
    }
    if let Some(cc) = &a.cache_control {
        s.push_str(&format!("cache_control = {}\n", quote(cc)));
    }
    s
}
