//! A route to write ([`Emitted`]) as a `[[routes]]` section.

use toml::Value;
use veloxy_import::Section;

use super::flow::{Action, Emitted};
use super::matcher::{Cond, PathCond};
use super::T;

impl T<'_> {
    /// The `[[routes]]` section of `e` on `listeners` (empty: every listener).
    pub fn route_section(&mut self, e: &Emitted, listeners: &[String]) -> Section {
        let mut sec = Section::default();
        for f in &e.from {
            if !sec
                .from
                .iter()
                .any(|x| x.file == f.file && x.line == f.line)
            {
                sec.add_from(f);
            }
        }
        // `# from` lists the answering directive and the branches leading to it, by line.
        sec.from.sort_by_key(|l| (l.line, l.col));
        if let Some(c) = &e.comment {
            sec.comments.push(c.clone());
        }
        let mut cond = e.cond.clone();
        let r = &e.rules;
        let proxied = matches!(e.action, Action::Proxy(_));
        let files = matches!(e.action, Action::Files(_));
        if let (Action::Files(_), PathCond::Regex(_)) = (&e.action, &cond.path) {
            sec.comments.push("Caddy serves files for this regex; veloxy file routes match by prefix: served for every path".into());
            cond.path = PathCond::Any;
        }
        cond_keys(&mut sec, &cond, listeners);
        match &e.action {
            Action::Proxy(g) => {
                sec.set("upstream", g.clone());
                if r.strip.is_some() {
                    if r.rewrite.is_some() {
                        sec.comments.push("Caddy also rewrites the path here: veloxy has one of strip_prefix and rewrite".into());
                    }
                    sec.set("strip_prefix", true);
                } else if let Some(rw) = &r.rewrite {
                    sec.set("rewrite", rw.clone());
                }
            }
            Action::Files(keys) => {
                let root = r.root.clone().unwrap_or_else(|| self.path("."));
                let root = match (&cond.path, &r.strip) {
                    (PathCond::Prefix(p), None) if p.len() > 1 => {
                        let dir = &p[1..p.rfind('/').map_or(p.len(), |i| i + 1)];
                        if p.ends_with('/') {
                            format!("{}/{}", root.trim_end_matches('/'), dir)
                        } else {
                            sec.comments.push(format!("Caddy matches {p}*; veloxy removes the prefix before looking up the file"));
                            root
                        }
                    }
                    _ => root,
                };
                sec.set("root", root);
                if let Some(tf) = &r.try_files {
                    sec.set(
                        "try_files",
                        Value::Array(tf.iter().cloned().map(Value::String).collect()),
                    );
                }
                for (k, v) in keys {
                    sec.set(k, v.clone());
                }
                if r.rewrite.is_some() {
                    sec.comments.push("Caddy rewrites the path before serving the file; veloxy rewrites proxied requests only".into());
                }
            }
            Action::Redirect(to, status) => {
                let mut t = toml::Table::new();
                t.insert("to".into(), to.clone().into());
                t.insert("status".into(), i64::from(*status).into());
                sec.set("redirect", Value::Table(t));
            }
            Action::Respond(status, body, ct) => {
                let mut t = toml::Table::new();
                t.insert("status".into(), i64::from(*status).into());
                t.insert("body".into(), body.clone().into());
                if let Some(ct) = ct {
                    t.insert("content_type".into(), ct.clone().into());
                }
                sec.set("respond", Value::Table(t));
            }
        }
        if proxied && !r.req.is_empty() {
            sec.set("request_headers", r.req.to_value());
        }
        if !r.resp.is_empty() {
            sec.set("response_headers", r.resp.to_value());
        }
        let mut compress = None;
        for (k, v) in &r.keys {
            match k.as_str() {
                "forward_auth" if !proxied => {
                    sec.comments.push("Caddy asks the auth service first here too; veloxy's forward_auth is for proxied routes".into());
                }
                "compress" => compress = Some(v.clone()),
                _ => {
                    sec.set(k, v.clone());
                }
            }
        }
        match (files, compress) {
            // veloxy compresses files by default; Caddy only with encode.
            (true, None) => {
                sec.set("compress", false);
            }
            (true, Some(_)) => {}
            (false, Some(v)) if proxied => {
                sec.set("compress", v);
            }
            _ => {}
        }
        sec
    }
}

/// The route's conditions and the site's listeners as keys (used by output).
pub fn cond_keys(sec: &mut Section, c: &Cond, listeners: &[String]) {
    match listeners {
        [] => {}
        [one] => {
            sec.set("listener", one.clone());
        }
        many => {
            sec.set(
                "listener",
                Value::Array(many.iter().cloned().map(Value::String).collect()),
            );
        }
    }
    match c.hosts.as_slice() {
        [] => {}
        [one] => {
            sec.set("host", one.clone());
        }
        many => {
            sec.set(
                "host",
                Value::Array(many.iter().cloned().map(Value::String).collect()),
            );
        }
    }
    match &c.path {
        PathCond::Any => {}
        PathCond::Prefix(p) => {
            sec.set("path", p.clone());
        }
        PathCond::Exact(p) => {
            sec.set("path_exact", p.clone());
        }
        PathCond::Regex(p) => {
            sec.set("path_regex", p.clone());
        }
    }
    if !c.methods.is_empty() {
        sec.set(
            "methods",
            Value::Array(c.methods.iter().cloned().map(Value::String).collect()),
        );
    }
    for (k, m) in [("headers", &c.headers), ("query", &c.query)] {
        if !m.is_empty() {
            sec.set(
                k,
                Value::Table(
                    m.iter()
                        .map(|(a, b)| (a.clone(), Value::String(b.clone())))
                        .collect(),
                ),
            );
        }
    }
}
