//! Directives that answer: `respond`, `redir`, `error`, `abort`, `reverse_proxy`,
//! `file_server` (and the refused `php_fastcgi`), and how each becomes routes.

use toml::Value;

use super::flow::{Action, Emitted, Matched, Rules, Scope};
use super::matcher::{regex_escape, relate, Cond, PathCond, Rel};
use super::placeholder::template;
use super::T;
use crate::lexer::Token;
use crate::parse::Line;

/// Whether `name` is a directive that answers requests.
pub fn is_answer(name: &str) -> bool {
    matches!(
        name,
        "respond"
            | "redir"
            | "error"
            | "abort"
            | "reverse_proxy"
            | "file_server"
            | "php_fastcgi"
            | "acme_server"
            | "metrics"
    )
}

impl T<'_> {
    /// An answering directive; true when it answers every request of the scope.
    pub fn answer(
        &mut self,
        l: &Line,
        m: Matched,
        args: &[Token],
        scope: &mut Scope,
        out: &mut Vec<Emitted>,
    ) -> bool {
        let name = l.name();
        let conds = match m {
            Matched::All => vec![Cond::default()],
            Matched::Conds(c) => c,
            Matched::Remote(ranges, negated) => {
                self.remote_idiom(l, args, ranges, negated, scope);
                return false;
            }
            Matched::Refused(_) => unreachable!("handled by step"),
        };
        let all = conds.iter().any(|c| relate(&scope.cond, c) == Rel::Covers);
        let built = match name {
            "respond" => self.respond(l, args),
            "error" => self.error_directive(l, args),
            "redir" => self.redir(l, args),
            "reverse_proxy" => self.reverse_proxy(l, args, scope),
            "file_server" => self.file_server(l, args),
            "php_fastcgi" => Err(
                "veloxy has no FastCGI client: run PHP-FPM behind an HTTP server, or proxy to one"
                    .into(),
            ),
            "abort" => {
                Err("veloxy has no answer that closes the connection without a response".into())
            }
            "acme_server" => Err("veloxy is not an ACME certificate authority".into()),
            "metrics" => Err(
                "veloxy's metrics are on the admin endpoint ([server] admin), not on a route"
                    .into(),
            ),
            _ => Err(format!("{name} is not supported")),
        };
        match built {
            Ok((action, extra, difference)) => {
                match difference {
                    Some(d) => self.report.different(l.loc(), name, d),
                    None => self.report.translated(l.loc(), name),
                }
                let mut from = vec![l.loc().clone()];
                from.extend(scope.from.iter().rev().cloned());
                self.emit(scope, &conds, &action, &extra, from, out);
            }
            Err(why) => {
                self.report.refused(l.loc(), name, why);
                super::report_nested(self, l.body(), "its directive is refused");
                return false;
            }
        }
        all
    }

    /// `respond @blocked 403` / `abort @blocked` with a `remote_ip` matcher: veloxy's
    /// `deny` (or `allow` for `not remote_ip`) on the scope's later routes.
    fn remote_idiom(
        &mut self,
        l: &Line,
        args: &[Token],
        ranges: Vec<String>,
        negated: bool,
        scope: &mut Scope,
    ) {
        let name = l.name();
        let status = args.iter().find_map(|a| a.text.parse::<u16>().ok());
        let ok = match name {
            "abort" => true,
            "respond" | "error" => status == Some(403),
            _ => false,
        };
        if !ok {
            self.report.refused(
                l.loc(),
                name,
                "a remote_ip matcher here (veloxy has client address lists only as allow/deny with 403)",
            );
            return;
        }
        let key = if negated { "allow" } else { "deny" };
        let mut list: Vec<Value> = match scope.rules.keys.iter().find(|(k, _)| k == key) {
            Some((_, Value::Array(a))) => a.clone(),
            _ => Vec::new(),
        };
        list.extend(ranges.into_iter().map(Value::String));
        scope.rules.set(key, Value::Array(list));
        let body = args.iter().find(|a| a.text.parse::<u16>().is_err());
        let what = match name {
            "abort" => {
                "veloxy answers 403 where Caddy closes the connection without an answer".to_string()
            }
            _ if body.is_some() => {
                "veloxy's 403 carries its own short body, not this one".to_string()
            }
            _ => "veloxy's 403 carries a short text body; Caddy's is empty".to_string(),
        };
        self.report
            .different(l.loc(), name, format!("{key} list: {what}"));
    }

    /// Pushes the routes of an answer for each alternative of its matcher, split by the
    /// scope's partial middleware.
    pub fn emit(
        &mut self,
        scope: &Scope,
        conds: &[Cond],
        action: &Action,
        extra: &Rules,
        from: Vec<veloxy_import::Loc>,
        out: &mut Vec<Emitted>,
    ) {
        for c in conds {
            let base = match relate(&scope.cond, c) {
                Rel::Covers => scope.cond.clone(),
                Rel::Overlap(n) => n,
                Rel::Disjoint | Rel::Unknown => continue,
            };
            let mut rules = scope.rules.clone();
            rules.merge(extra);
            let mut variants = vec![(base, rules, from.clone())];
            for (mconds, delta, at) in &scope.partial {
                let mut next = Vec::new();
                for (vc, vr, vf) in variants {
                    let mut rest = true;
                    for mc in mconds {
                        match relate(&vc, mc) {
                            Rel::Covers => {
                                let mut r = vr.clone();
                                r.merge(delta);
                                let mut f = vf.clone();
                                f.push(at.clone());
                                next.push((vc.clone(), r, f));
                                rest = false;
                                break;
                            }
                            Rel::Overlap(n) => {
                                let mut r = vr.clone();
                                r.merge(delta);
                                let mut f = vf.clone();
                                f.push(at.clone());
                                next.push((n, r, f));
                            }
                            Rel::Disjoint | Rel::Unknown => {}
                        }
                    }
                    if rest {
                        next.push((vc, vr, vf));
                    }
                }
                variants = next;
            }
            for (cond, rules, from) in variants {
                self.push_route(cond, rules, action.clone(), from, out);
            }
        }
    }

    /// Applies a stripped prefix to a route and pushes it.
    fn push_route(
        &mut self,
        cond: Cond,
        mut rules: Rules,
        action: Action,
        from: Vec<veloxy_import::Loc>,
        out: &mut Vec<Emitted>,
    ) {
        if out.iter().any(|e| e.cond == cond) {
            // An earlier answer of the chain takes exactly these requests.
            return;
        }
        if let (Some(p), Some(rw)) = (rules.strip.clone(), rules.rewrite.clone()) {
            rules.strip = None;
            if rw.contains("{path}") {
                // Strip, then rewrite with the stripped path: one regex route.
                let rest = match &cond.path {
                    PathCond::Prefix(q) if q.starts_with(&p) => q[p.len()..].to_string(),
                    _ => String::new(),
                };
                let re = format!("^{}({}.*)$", regex_escape(&p), regex_escape(&rest));
                rules.rewrite = Some(rw.replace("{path}", "{re.1}"));
                out.push(Emitted {
                    cond: Cond {
                        path: PathCond::Regex(re),
                        ..cond
                    },
                    rules,
                    action,
                    from,
                    comment: None,
                });
                return;
            }
        }
        let Some(p) = rules.strip.clone() else {
            out.push(Emitted {
                cond,
                rules,
                action,
                from,
                comment: None,
            });
            return;
        };
        match &cond.path {
            PathCond::Any => {
                // Only requests under the prefix are stripped: split.
                let under = Cond {
                    path: PathCond::Prefix(format!("{p}/")),
                    ..cond.clone()
                };
                let mut plain = rules.clone();
                plain.strip = None;
                out.push(Emitted {
                    cond: under,
                    rules,
                    action: action.clone(),
                    from: from.clone(),
                    comment: None,
                });
                out.push(Emitted {
                    cond,
                    rules: plain,
                    action,
                    from,
                    comment: None,
                });
            }
            PathCond::Prefix(q) if *q == p || *q == format!("{p}/") => out.push(Emitted {
                cond,
                rules,
                action,
                from,
                comment: None,
            }),
            PathCond::Prefix(q) if q.starts_with(&p) && !matches!(action, Action::Files(_)) => {
                let rest = &q[p.len()..];
                let re = format!("^{}({}.*)$", regex_escape(&p), regex_escape(rest));
                rules.strip = None;
                rules.rewrite = Some("{re.1}".into());
                out.push(Emitted {
                    cond: Cond {
                        path: PathCond::Regex(re),
                        ..cond
                    },
                    rules,
                    action,
                    from,
                    comment: None,
                });
            }
            _ => {
                rules.strip = None;
                out.push(Emitted {
                    cond,
                    rules,
                    action,
                    from,
                    comment: Some(format!(
                        "Caddy strips {p} here; veloxy cannot for this path"
                    )),
                });
            }
        }
    }

    /// `respond [body] [status] { body, close }`.
    fn respond(&mut self, l: &Line, args: &[Token]) -> Answer {
        let (mut body, mut status) = (String::new(), 200u16);
        match args {
            [] => {}
            [one] => match one.text.parse::<u16>() {
                Ok(s) if one.text.len() == 3 => status = s,
                _ => body = one.text.clone(),
            },
            [b, s, ..] => {
                body = b.text.clone();
                status = s
                    .text
                    .parse()
                    .map_err(|_| format!("status {} is not a number", s.text))?;
            }
        }
        for sub in l.body() {
            match sub.name() {
                "body" => {
                    body = sub
                        .args()
                        .iter()
                        .map(|t| t.text.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                }
                "close" => {
                    return Err(
                        "respond close (veloxy has no answer that closes the connection)".into(),
                    )
                }
                other => return Err(format!("respond {other}")),
            }
        }
        let fixed = template(&body, None).map(|t| t.replace("{{", "").replace("}}", ""));
        if !fixed.is_ok_and(|t| !t.contains('{')) {
            return Err(
                "placeholders in a respond body (veloxy's respond body is fixed text)".into(),
            );
        }
        // Caddy sets no Content-Type: Go's sniffing gives text/html for markup.
        let lower = body.trim_start().to_ascii_lowercase();
        let html = [
            "<!doctype html",
            "<html",
            "<head",
            "<body",
            "<p",
            "<h1",
            "<div",
            "<br",
            "<table",
            "<a ",
            "<b>",
            "<title",
        ]
        .iter()
        .any(|p| lower.starts_with(p));
        let ct = html.then(|| "text/html; charset=utf-8".to_string());
        Ok((Action::Respond(status, body, ct), Rules::default(), None))
    }

    /// `error [message] [status]`: without `handle_errors`, Caddy answers the status with an
    /// empty body.
    fn error_directive(&mut self, _l: &Line, args: &[Token]) -> Answer {
        let status = args
            .iter()
            .rev()
            .find_map(|a| a.text.parse::<u16>().ok())
            .unwrap_or(500);
        Ok((
            Action::Respond(status, String::new(), None),
            Rules::default(),
            None,
        ))
    }

    /// `redir [to] [code]` (Caddy's default is 302).
    fn redir(&mut self, _l: &Line, args: &[Token]) -> Answer {
        let (to, code) = match args {
            [to] => (to, None),
            [to, code] => (to, Some(code.text.as_str())),
            _ => return Err("redir needs a target".into()),
        };
        let status = match code {
            None | Some("temporary") => 302,
            Some("permanent") => 301,
            Some("html") => return Err("redir html (an HTML page with a meta refresh)".into()),
            Some(n) => match n.parse::<u16>() {
                Ok(s @ (301 | 302 | 303 | 307 | 308)) => s,
                _ => {
                    return Err(format!(
                        "redir status {n} (veloxy redirects with 301, 302, 303, 307 or 308)"
                    ))
                }
            },
        };
        let to = template(&to.text, None)?;
        Ok((Action::Redirect(to, status), Rules::default(), None))
    }

    /// `file_server [browse] { root, index, browse, hide, precompressed }`.
    fn file_server(&mut self, l: &Line, args: &[Token]) -> Answer {
        let mut keys: Vec<(String, Value)> = Vec::new();
        let mut extra = Rules::default();
        let mut diffs = vec![
            "dot files are 404 and symlinks out of the root 403 in veloxy (Caddy serves both)"
                .to_string(),
        ];
        let mut browse = args.iter().any(|a| a.text == "browse");
        for sub in l.body() {
            let vals: Vec<String> = sub.args().iter().map(|t| t.text.clone()).collect();
            match sub.name() {
                "root" => extra.root = vals.first().map(|r| self.path(r)),
                "browse" => browse = true,
                "index" => keys.push((
                    "index".into(),
                    Value::Array(vals.into_iter().map(Value::String).collect()),
                )),
                "hide" => diffs.push("hide: veloxy hides dot files only".into()),
                "precompressed" => {}
                "disable_canonical_uris" => {
                    diffs.push("veloxy always redirects /dir to /dir/".into())
                }
                other => return Err(format!("file_server {other}")),
            }
        }
        if browse {
            keys.push(("browse".into(), Value::Boolean(true)));
            diffs.push("the listing page is veloxy's own".into());
        }
        Ok((Action::Files(keys), extra, Some(diffs.join("; "))))
    }
}

/// What an answering directive builds: its answer, rules it adds, and a difference to name.
pub type Answer = Result<(Action, Rules, Option<String>), String>;
