//! Site addresses (`[scheme://][host][:port][/path]`) and which names Caddy certifies with
//! its local CA.

use veloxy_import::Loc;

use crate::lexer::Token;
use crate::parse::Line;

/// One site address.
#[derive(Debug, Clone)]
pub struct Addr {
    /// `http`, `https` or empty.
    pub scheme: String,
    /// Lowercase host; empty: every host.
    pub host: String,
    /// The port (the scheme's, or Caddy's default HTTPS port).
    pub port: u16,
    /// A path matcher written in the address.
    pub path: Option<String>,
    /// Where it is written.
    pub loc: Loc,
}

pub fn a_text(a: &Addr) -> String {
    if a.host.is_empty() {
        format!("site :{}", a.port)
    } else {
        format!("site {}", a.host)
    }
}

/// Names Caddy gives certificates from its local CA.
pub fn is_local(host: &str) -> bool {
    let h = host.trim_start_matches("*.");
    h == "localhost"
        || h.ends_with(".localhost")
        || h.ends_with(".local")
        || h.ends_with(".internal")
        || h.ends_with(".home.arpa")
        || h.trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok()
}

/// `[scheme://][host][:port][/path]`.
pub fn parse_addr(
    text: &str,
    tok: &Token,
    http_port: u16,
    https_port: u16,
) -> Result<Addr, String> {
    let (scheme, rest) = match text.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => (String::new(), text),
    };
    if !scheme.is_empty() && scheme != "http" && scheme != "https" {
        return Err(format!(
            "site address scheme {scheme}:// (veloxy serves HTTP and HTTPS)"
        ));
    }
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_string())),
        None => (rest, None),
    };
    let (host, port) = if hostport.starts_with('[') {
        match hostport.find(']') {
            Some(i) => (&hostport[..=i], hostport[i + 1..].strip_prefix(':')),
            None => return Err(format!("site address {text}")),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("site address port {p}"))?,
        None if scheme == "http" => http_port,
        None if scheme.is_empty() && host.is_empty() => http_port,
        None => https_port,
    };
    if host.contains('{') {
        return Err(format!("site address {text} with a placeholder"));
    }
    let name_chars = |c: char| c.is_ascii_alphanumeric() || "-._*[]:".contains(c);
    if !host.chars().all(name_chars) {
        return Err(format!(
            "site address {text}: {host} is not a host name (a template left to fill in?)"
        ));
    }
    Ok(Addr {
        scheme,
        host: host.to_ascii_lowercase(),
        port,
        path,
        loc: tok.loc.clone(),
    })
}

/// Names veloxy's `--tls-self-signed` certificate covers.
fn self_signed_covers(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "::1" | "[::1]")
}

/// Why a site on Caddy's local CA is refused, and exactly what to do instead.
pub fn local_ca_refusal(a: &Addr, body: &[Line]) -> String {
    let what = if a.host.is_empty() {
        "this site".to_string()
    } else {
        a.host.clone()
    };
    let head = format!(
        "Caddy serves {what} over HTTPS with a certificate from its local CA (an internal \
         self-signed chain its clients must be told to trust); a veloxy config cannot ask for a \
         local CA"
    );
    if !self_signed_covers(&a.host) {
        return format!(
            "{head}: give the site `tls CERT KEY` (a certificate for {what} that its clients \
             trust), or an http:// address (`veloxy proxy --tls-self-signed` certifies only \
             localhost, 127.0.0.1 and ::1)"
        );
    }
    let listen = format!("127.0.0.1:{}", a.port);
    let one_line = match one_line_answer(body) {
        Some(OneLine::Proxy(to)) => format!(
            "`veloxy proxy --listen {listen} --to {} --tls-self-signed`",
            to.join(" --to ")
        ),
        Some(OneLine::Files(root)) => {
            format!("`veloxy serve --listen {listen} --root {root} --tls-self-signed`")
        }
        None => {
            return format!(
                "{head}: give the site `tls CERT KEY` (a localhost certificate its clients \
                 trust), or an http:// address; for a site that only proxies or serves files, \
                 `veloxy proxy --tls-self-signed` (or `veloxy serve --tls-self-signed`) serves \
                 HTTPS with a localhost certificate from veloxy's local CA in one line"
            )
        }
    };
    format!(
        "{head}: run {one_line} for a one-line setup (its localhost certificate comes from \
         veloxy's local CA in $XDG_DATA_HOME/veloxy/pki; clients trust its ca.pem), or give \
         the site `tls CERT KEY`, or an http:// address"
    )
}

enum OneLine {
    Proxy(Vec<String>),
    Files(String),
}

/// A site that is one `reverse_proxy` or one `root` + `file_server` (what the one-line modes
/// do).
fn one_line_answer(body: &[Line]) -> Option<OneLine> {
    let names: Vec<&str> = body
        .iter()
        .map(Line::name)
        .filter(|n| !matches!(*n, "tls" | "encode" | "log"))
        .collect();
    let find = |n: &str| body.iter().find(|l| l.name() == n);
    match names.as_slice() {
        ["reverse_proxy"] => {
            let l = find("reverse_proxy")?;
            let to: Vec<String> = l.args().iter().map(|t| t.text.clone()).collect();
            (!to.is_empty() && l.body().is_empty() && !to[0].starts_with(['/', '@']))
                .then_some(OneLine::Proxy(to))
        }
        ["root", "file_server"] | ["file_server", "root"] => {
            let root = find("root")?.args().last()?.text.clone();
            Some(OneLine::Files(root))
        }
        _ => None,
    }
}
