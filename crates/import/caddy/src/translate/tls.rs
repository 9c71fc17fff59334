//! A site's `tls` directive (certificate files, ACME settings) and its `log` (the access
//! log).

use super::T;
use crate::parse::Line;

impl T<'_> {
    /// `tls email | cert key | internal | { ... }`.
    pub fn tls_directive(&mut self, l: &Line, files: bool) {
        let args: Vec<&str> = l.args().iter().map(|t| t.text.as_str()).collect();
        match args.as_slice() {
            [email] if email.contains('@') => {
                self.acme().insert("email".into(), (*email).into());
                self.report.translated(l.loc(), "tls");
            }
            ["internal"] => self.report.refused(
                l.loc(),
                "tls",
                "tls internal: Caddy's local CA (a veloxy config names its certificate files; \
                 see the site address's line)",
            ),
            _ if files => self.report.translated(l.loc(), "tls"),
            [] => self.report.translated(l.loc(), "tls"),
            other => self
                .report
                .refused(l.loc(), "tls", format!("tls {}", other.join(" "))),
        }
        for sub in l.body() {
            let v: Vec<&str> = sub.args().iter().map(|t| t.text.as_str()).collect();
            let name = sub.name();
            match name {
                "protocols" if v.iter().all(|p| *p == "tls1.2" || *p == "tls1.3") => {
                    self.report.translated(sub.loc(), name)
                }
                "ca" => {
                    self.acme()
                        .insert("directory".into(), v.first().copied().unwrap_or("").into());
                    self.report.translated(sub.loc(), name);
                }
                "ca_root" => {
                    let p = self.path(v.first().copied().unwrap_or(""));
                    self.acme().insert("ca_file".into(), p.into());
                    self.report.translated(sub.loc(), name);
                }
                "key_type" | "alpn" | "resolvers" | "propagation_timeout" | "propagation_delay" => {
                    self.report
                        .ignored(sub.loc(), name, "no effect on what clients see")
                }
                "ciphers" | "curves" => self.report.different(
                    sub.loc(),
                    name,
                    "veloxy offers rustls's default suites and groups",
                ),
                "dns" => self.report.different(
                    sub.loc(),
                    name,
                    "veloxy validates certificates with tls-alpn-01 or http-01 (the CA must reach \
                     this host on port 443 or 80), not with DNS records",
                ),
                "on_demand" => self.report.refused(
                    sub.loc(),
                    name,
                    "on-demand certificates (veloxy obtains certificates for configured names)",
                ),
                "client_auth" => {
                    self.report
                        .refused(sub.loc(), name, "client certificate authentication (mTLS)")
                }
                other => self
                    .report
                    .refused(sub.loc(), other, format!("tls {other}")),
            }
        }
    }

    /// `log { output file PATH | stdout | stderr; format json|console }`: the access log.
    pub fn log(&mut self, l: &Line) {
        let mut path = "stdout".to_string();
        let mut diff =
            vec!["veloxy's access log is one for every site, with its own fields".to_string()];
        for sub in l.body() {
            let v: Vec<&str> = sub.args().iter().map(|t| t.text.as_str()).collect();
            match (sub.name(), v.as_slice()) {
                ("output", ["file", p, ..]) => path = self.path(p),
                ("output", ["stdout"]) => {}
                ("output", ["stderr"]) => diff.push("written to stdout, not stderr".into()),
                ("format", _) | ("level", _) => {}
                _ => diff.push(format!("{} ignored", sub.name())),
            }
        }
        if l.body().iter().all(|s| s.name() != "output") {
            diff.push("written to stdout, not stderr".into());
        }
        let t = self.cfg.server.table("access_log");
        t.insert("path".into(), path.into());
        t.insert("format".into(), "json".into());
        self.report.different(l.loc(), "log", diff.join("; "));
    }
}
