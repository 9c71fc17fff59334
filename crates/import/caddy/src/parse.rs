//! The Caddyfile parser: tokens become lines (a directive and its arguments, up to the end of
//! its line) with optional `{ }` blocks; then the top level is split into the global options
//! block, snippets `(name) { }` and site blocks, with `import` expanded (snippets with
//! `{args[N]}` / `{args.N}` / `{args[:]}` arguments, files and globs relative to the
//! importing file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use veloxy_import::{ImportError, Loc, Options, ParseError};

use crate::lexer::{lex, Token};

/// One line of a Caddyfile: a directive (or site addresses, or a matcher definition) and its
/// arguments, with the block that follows it on the same line's `{`.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The tokens; the first is the directive's name.
    pub toks: Vec<Token>,
    /// The `{ }` block, if any.
    pub block: Option<Vec<Line>>,
}

impl Line {
    /// The directive's name (the first token).
    pub fn name(&self) -> &str {
        self.toks.first().map_or("", |t| t.text.as_str())
    }

    /// Where the directive starts.
    pub fn loc(&self) -> &Loc {
        &self.toks[0].loc
    }

    /// The arguments after the name.
    pub fn args(&self) -> &[Token] {
        self.toks.get(1..).unwrap_or(&[])
    }

    /// The block's lines (empty without a block).
    pub fn body(&self) -> &[Line] {
        self.block.as_deref().unwrap_or(&[])
    }

    /// Why this line (or a line of its block) cannot be read: an environment placeholder
    /// that could not be resolved, named.
    pub fn unresolved(&self) -> Option<&str> {
        self.toks
            .iter()
            .find_map(|t| t.unresolved.as_deref())
            .or_else(|| self.body().iter().find_map(Line::unresolved))
    }
}

/// A site block: its addresses and its directives.
#[derive(Debug, Clone)]
pub struct Site {
    /// The addresses (commas removed).
    pub addrs: Vec<Token>,
    /// The directives.
    pub body: Vec<Line>,
}

/// A whole Caddyfile after imports.
#[derive(Debug, Default)]
pub struct Caddyfile {
    /// The global options block's lines.
    pub global: Vec<Line>,
    /// Where the global options block opens.
    pub global_loc: Option<Loc>,
    /// The site blocks, in order.
    pub sites: Vec<Site>,
    /// Each `import` line (expanded in place): where, and what it named.
    pub imports: Vec<(Loc, String)>,
    /// Snippets never imported: name and place (their directives are never used).
    pub unused_snippets: Vec<(String, Loc)>,
    /// Named routes `&(name) { }` (Caddy 2.7's `invoke`): name and place.
    pub named_routes: Vec<(String, Loc)>,
}

/// Reads and parses `path` with its imports; environment placeholders are resolved from
/// `opts` (see [`crate::env`]).
pub fn parse_file(path: &Path, opts: &Options) -> Result<Caddyfile, ImportError> {
    let text = veloxy_import::source::read(path)?;
    parse_text(&path.display().to_string(), &text, opts)
}

/// Parses a Caddyfile given as text (imports are relative to the directory of `file`).
pub fn parse_text(file: &str, text: &str, opts: &Options) -> Result<Caddyfile, ImportError> {
    let file: Arc<str> = file.into();
    let mut p = Parser {
        opts: opts.clone(),
        ..Default::default()
    };
    let lines = p.tree(&file, text)?;
    let top = p.expand_top(lines, 0)?;
    p.finish(top)
}

/// Groups tokens into lines and blocks.
pub fn tree(file: &Arc<str>, text: &str, opts: &Options) -> Result<Vec<Line>, ParseError> {
    let toks = crate::env::substitute(lex(file, text)?, opts);
    let mut i = 0;
    let lines = block(&toks, &mut i, None)?;
    Ok(lines)
}

fn block(toks: &[Token], i: &mut usize, open: Option<&Loc>) -> Result<Vec<Line>, ParseError> {
    let mut lines = Vec::new();
    while *i < toks.len() {
        if toks[*i].is("}") {
            if open.is_none() {
                return Err(ParseError::new(
                    toks[*i].loc.clone(),
                    "unexpected '}' (no block is open)",
                ));
            }
            *i += 1;
            return Ok(lines);
        }
        let mut line: Vec<Token> = vec![toks[*i].clone()];
        *i += 1;
        while *i < toks.len() {
            let prev = line.last().expect("one token");
            let continues = prev.line_end == toks[*i].line
                || (!prev.quoted && prev.text.ends_with(',') && open.is_none());
            if !continues || toks[*i].is("}") {
                break;
            }
            line.push(toks[*i].clone());
            *i += 1;
        }
        let opens = line.last().is_some_and(|t| t.is("{"));
        if let Some(bad) = line.iter().rev().skip(1).find(|t| t.is("{")) {
            if line.iter().rposition(|t| t.is("{")) != Some(line.len() - 1) || !opens {
                return Err(ParseError::new(
                    bad.loc.clone(),
                    "unexpected '{' in the middle of a line (a block opens at a line's end)",
                ));
            }
        }
        let mut block_lines = None;
        if opens {
            let brace = line.pop().expect("the brace");
            block_lines = Some(block(toks, i, Some(&brace.loc))?);
        }
        lines.push(Line {
            toks: line,
            block: block_lines,
        });
    }
    match open {
        Some(loc) => Err(ParseError::new(
            loc.clone(),
            "this '{' is never closed by a '}'",
        )),
        None => Ok(lines),
    }
}

#[derive(Default)]
struct Parser {
    opts: Options,
    snippets: HashMap<String, (Loc, Vec<Line>)>,
    used: std::collections::HashSet<String>,
    snippet_order: Vec<String>,
    imports: Vec<(Loc, String)>,
    named_routes: Vec<(String, Loc)>,
}

const MAX_DEPTH: usize = 32;

impl Parser {
    fn tree(&self, file: &Arc<str>, text: &str) -> Result<Vec<Line>, ParseError> {
        tree(file, text, &self.opts)
    }

    /// The top level: snippets are registered, imports spliced; other lines kept.
    fn expand_top(&mut self, lines: Vec<Line>, depth: usize) -> Result<Vec<Line>, ImportError> {
        let mut out = Vec::new();
        for line in lines {
            let name = line.name().to_string();
            if line.toks.len() == 1 && name.starts_with('(') && name.ends_with(')') {
                let Some(body) = line.block else {
                    return Err(ParseError::new(
                        line.toks[0].loc.clone(),
                        format!("snippet {name} needs a {{ }} block"),
                    )
                    .into());
                };
                let n = name[1..name.len() - 1].to_string();
                self.snippet_order.push(n.clone());
                self.snippets.insert(n, (line.toks[0].loc.clone(), body));
                continue;
            }
            if line.toks.len() == 1 && name.starts_with("&(") && line.block.is_some() {
                self.named_routes
                    .push((name.clone(), line.toks[0].loc.clone()));
                continue;
            }
            if line.toks.first().is_some_and(|t| t.is("import")) && line.block.is_none() {
                let spliced = self.import(&line, depth)?;
                out.extend(self.expand_top(spliced, depth + 1)?);
                continue;
            }
            out.push(line);
        }
        Ok(out)
    }

    /// Expands imports inside blocks (recursively).
    fn expand(&mut self, lines: Vec<Line>, depth: usize) -> Result<Vec<Line>, ImportError> {
        let mut out = Vec::new();
        for mut line in lines {
            if line.toks.first().is_some_and(|t| t.is("import")) && line.block.is_none() {
                let spliced = self.import(&line, depth)?;
                out.extend(self.expand(spliced, depth + 1)?);
                continue;
            }
            if let Some(b) = line.block.take() {
                line.block = Some(self.expand(b, depth)?);
            }
            out.push(line);
        }
        Ok(out)
    }

    /// The lines an `import` line stands for (snippet or files), arguments substituted.
    fn import(&mut self, line: &Line, depth: usize) -> Result<Vec<Line>, ImportError> {
        let at = line.toks[0].loc.clone();
        let dir = Path::new(&*at.file)
            .parent()
            .unwrap_or(Path::new(""))
            .to_path_buf();
        if depth >= MAX_DEPTH {
            return Err(ParseError::new(at, "import nesting too deep (an import cycle?)").into());
        }
        let Some(target) = line.toks.get(1) else {
            return Err(ParseError::new(at, "import needs a snippet name or a file").into());
        };
        if let Some(why) = &target.unresolved {
            return Err(ParseError::new(target.loc.clone(), format!("import: {why}")).into());
        }
        let args = &line.toks[2..];
        self.imports.push((at.clone(), target.text.clone()));
        let lines = if let Some((_, body)) = self.snippets.get(&target.text) {
            self.used.insert(target.text.clone());
            body.clone()
        } else {
            let mut lines = Vec::new();
            for path in glob(&dir, &target.text, &target.loc)? {
                let text = veloxy_import::source::read(&path)?;
                let file: Arc<str> = path.display().to_string().into();
                lines.extend(self.tree(&file, &text)?);
            }
            lines
        };
        let lines = substitute(lines, args);
        Ok(lines)
    }

    fn finish(mut self, top: Vec<Line>) -> Result<Caddyfile, ImportError> {
        let mut cf = Caddyfile::default();
        let mut rest = top.into_iter().peekable();
        if let Some(first) = rest.peek() {
            if first.toks.is_empty() {
                let g = rest.next().expect("peeked");
                cf.global = g.block.unwrap_or_default();
            }
        }
        let rest: Vec<Line> = rest.collect();
        let braceless = rest.first().is_some_and(|l| l.block.is_none());
        if braceless {
            let mut it = rest.into_iter();
            let first = it.next().expect("non-empty");
            let body: Vec<Line> = it.collect();
            let body = self.expand(body, 0)?;
            cf.sites.push(Site {
                addrs: addresses(&first.toks),
                body,
            });
        } else {
            for line in rest {
                if line.toks.is_empty() {
                    return Err(ParseError::new(
                        line.body()
                            .first()
                            .map_or_else(|| Loc::new(&"".into(), 1, 1), |l| l.loc().clone()),
                        "the global options block must come first",
                    )
                    .into());
                }
                let body = self.expand(line.block.unwrap_or_default(), 0)?;
                cf.sites.push(Site {
                    addrs: addresses(&line.toks),
                    body,
                });
            }
        }
        cf.imports = std::mem::take(&mut self.imports);
        cf.named_routes = std::mem::take(&mut self.named_routes);
        for n in &self.snippet_order {
            if !self.used.contains(n) {
                cf.unused_snippets
                    .push((format!("({n})"), self.snippets[n].0.clone()));
            }
        }
        Ok(cf)
    }
}

/// Site address tokens, commas removed.
fn addresses(toks: &[Token]) -> Vec<Token> {
    let mut out = Vec::new();
    for t in toks {
        for part in t.text.split(',') {
            let part = part.trim();
            if !part.is_empty() {
                let mut a = t.clone();
                a.text = part.to_string();
                out.push(a);
            }
        }
    }
    out
}

/// Replaces `{args[N]}`, `{args.N}` and `{args[:]}`/`{args[N:]}` in every token (a token
/// made from an argument keeps the argument's placeholders).
fn substitute(lines: Vec<Line>, args: &[Token]) -> Vec<Line> {
    lines
        .into_iter()
        .map(|l| Line {
            toks: l
                .toks
                .into_iter()
                .flat_map(|t| substitute_token(t, args))
                .collect(),
            block: l.block.map(|b| substitute(b, args)),
        })
        .collect()
}

fn substitute_token(t: Token, args: &[Token]) -> Vec<Token> {
    if !t.text.contains("{args") {
        return vec![t];
    }
    if let Some(from) = spread(&t.text) {
        return args
            .iter()
            .skip(from)
            .map(|a| Token {
                text: a.text.clone(),
                env: a.env.clone(),
                unresolved: a.unresolved.clone(),
                ..t.clone()
            })
            .collect();
    }
    let mut out = t.clone();
    for (i, a) in args.iter().enumerate() {
        let before = out.text.clone();
        out.text = before
            .replace(&format!("{{args[{i}]}}"), &a.text)
            .replace(&format!("{{args.{i}}}"), &a.text);
        if out.text != before {
            out.env.extend(a.env.iter().cloned());
            if out.unresolved.is_none() {
                out.unresolved.clone_from(&a.unresolved);
            }
        }
    }
    vec![out]
}

/// `{args[:]}` -> 0, `{args[2:]}` -> 2.
fn spread(text: &str) -> Option<usize> {
    let inner = text.strip_prefix("{args[")?.strip_suffix(":]}")?;
    if inner.is_empty() {
        Some(0)
    } else {
        inner.parse().ok()
    }
}

/// The files an import pattern names, sorted; `*` and `?` match within the last component.
fn glob(dir: &Path, pattern: &str, loc: &Loc) -> Result<Vec<PathBuf>, ImportError> {
    let full = dir.join(pattern);
    let Some(name) = full.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Err(ParseError::new(loc.clone(), format!("import {pattern}: not a file")).into());
    };
    if !name.contains(['*', '?']) {
        if full.is_file() {
            return Ok(vec![full]);
        }
        return Err(ParseError::new(
            loc.clone(),
            format!("import {pattern}: no snippet of this name and no such file"),
        )
        .into());
    }
    let parent = full.parent().unwrap_or(Path::new("."));
    let mut out: Vec<PathBuf> = std::fs::read_dir(parent)
        .map_err(|source| ImportError::Read {
            path: parent.display().to_string(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| wildcard(&name, &n.to_string_lossy()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Shell-style match of `*` and `?`.
fn wildcard(pat: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pat.chars().collect(), s.chars().collect());
    let (mut pi, mut si, mut star, mut mark) = (0, 0, None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o() -> Options {
        Options::default()
    }

    #[test]
    fn sites_snippets_imports() {
        let cf = parse_text(
            "C",
            "{\n  email a@b.c\n}\n(common) {\n  header X-A {args[0]}\n  encode {args[1:]}\n}\n\
             a.com, b.com {\n  import common one gzip zstd\n  reverse_proxy x:1\n}\n:8080 {\n  respond ok\n}\n",
            &o(),
        )
        .unwrap();
        assert_eq!(cf.global[0].name(), "email");
        assert_eq!(cf.sites.len(), 2);
        let s = &cf.sites[0];
        assert_eq!(
            s.addrs.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
            ["a.com", "b.com"]
        );
        assert_eq!(s.body[0].toks[2].text, "one");
        assert_eq!(s.body[0].loc().to_string(), "C:5:3");
        let enc: Vec<_> = s.body[1].toks.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(enc, ["encode", "gzip", "zstd"]);
        assert_eq!(cf.imports.len(), 1);
    }

    #[test]
    fn braceless_single_site() {
        let cf = parse_text("C", "example.com\n\nreverse_proxy app:80\n", &o()).unwrap();
        assert_eq!(cf.sites[0].addrs[0].text, "example.com");
        assert_eq!(cf.sites[0].body[0].name(), "reverse_proxy");
    }

    #[test]
    fn errors_name_the_place() {
        let e = parse_text("C", "a.com {\n  respond x\n", &o()).unwrap_err();
        assert_eq!(e.to_string(), "C:1:7: this '{' is never closed by a '}'");
        let e = parse_text("C", "a.com {\n}\n}\n", &o()).unwrap_err();
        assert_eq!(e.to_string(), "C:3:1: unexpected '}' (no block is open)");
        let e = parse_text("C", "a.com {\n  import nope\n}\n", &o()).unwrap_err();
        assert!(e.to_string().starts_with("C:2:10: import nope"), "{e}");
    }

    #[test]
    fn continued_lines_are_one_directive() {
        let cf = parse_text(
            "C",
            "{\n  servers {\n    trusted_proxies static \\\n      10.0.0.0/8 \\\n      192.168.0.0/16\n    trusted_proxies_strict\n  }\n}\n:80 {\n  respond ok\n}\n",
            &o(),
        )
        .unwrap();
        let servers = cf.global[0].body();
        assert_eq!(servers.len(), 2);
        let args: Vec<&str> = servers[0].args().iter().map(|t| t.text.as_str()).collect();
        assert_eq!(args, ["static", "10.0.0.0/8", "192.168.0.0/16"]);
        assert_eq!(servers[1].name(), "trusted_proxies_strict");
    }

    #[test]
    fn snippet_arguments_keep_their_placeholders() {
        let cf = parse_text(
            "C",
            "(s) {\n  header X-A {args[0]}\n}\n:80 {\n  import s {$NOPE}\n}\n",
            &o(),
        )
        .unwrap();
        let l = &cf.sites[0].body[0];
        assert!(l.unresolved().unwrap().contains("NOPE"), "{l:?}");
    }

    #[test]
    fn wildcards() {
        assert!(wildcard("*.caddy", "a.caddy"));
        assert!(!wildcard("*.caddy", "a.conf"));
        assert!(wildcard("s?te*", "site1.x"));
    }
}
