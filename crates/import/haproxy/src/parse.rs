//! haproxy.cfg as sections of located lines of words.
//!
//! Hand-written: HAProxy's line syntax (words, `"..."` with escapes and `${VAR}`, `'...'`
//! verbatim, backslash escapes outside quotes, `#` comments, `.if` blocks) is its own and no
//! crate parses it. A line is a keyword and its arguments; a section keyword (`global`,
//! `defaults`, `frontend`, `backend`, `listen`, `userlist`, ...) starts a section, every other
//! line belongs to the section above it.

use std::sync::Arc;

use veloxy_import::{Loc, Options, ParseError};

/// The section keywords HAProxy knows.
pub const SECTIONS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "userlist",
    "peers",
    "resolvers",
    "mailers",
    "program",
    "http-errors",
    "ring",
    "cache",
    "fcgi-app",
    "crt-store",
    "traces",
    "log-forward",
];

/// One word of a line, unquoted and unescaped.
#[derive(Debug, Clone, PartialEq)]
pub struct Word {
    /// The text.
    pub text: String,
    /// Where it starts.
    pub loc: Loc,
}

/// A directive: its keyword (`words[0]`) and arguments.
#[derive(Debug, Clone)]
pub struct Line {
    /// Where the keyword is.
    pub loc: Loc,
    /// The words, keyword first.
    pub words: Vec<Word>,
    /// A `"${VAR}"` that could not be resolved (the line is refused with this).
    pub env_error: Option<String>,
}

impl Line {
    /// The keyword.
    pub fn kw(&self) -> &str {
        &self.words[0].text
    }

    /// Argument `i` (0 = the first after the keyword).
    pub fn arg(&self, i: usize) -> Option<&str> {
        self.words.get(i + 1).map(|w| w.text.as_str())
    }

    /// The arguments as strings.
    pub fn args(&self) -> Vec<&str> {
        self.words[1..].iter().map(|w| w.text.as_str()).collect()
    }
}

/// A section and its lines.
#[derive(Debug, Clone)]
pub struct Section {
    /// `frontend`, `backend`, ...
    pub kind: String,
    /// Its name (`defaults` may have none).
    pub name: String,
    /// `from NAME`: the named defaults it takes its settings from.
    pub from: Option<String>,
    /// The section line itself.
    pub head: Line,
    /// The directives in it.
    pub lines: Vec<Line>,
}

/// Reads every file into sections, in order.
pub fn parse_files(
    files: &[(Arc<str>, String)],
    opts: &Options,
) -> Result<Vec<Section>, ParseError> {
    let mut out = Vec::new();
    for (name, text) in files {
        parse_text(name, text, opts, &mut out)?;
    }
    Ok(out)
}

fn parse_text(
    file: &Arc<str>,
    text: &str,
    opts: &Options,
    out: &mut Vec<Section>,
) -> Result<(), ParseError> {
    let indented = text
        .lines()
        .any(|l| l.starts_with([' ', '\t']) && !l.trim().is_empty() && !l.trim().starts_with('#'));
    let mut conds = CondStack::default();
    let mut current: Option<Section> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i as u32 + 1;
        let line = tokenize(file, n, raw, opts)?;
        let Some(line) = line else { continue };
        if line.kw().starts_with('.') {
            conds.directive(&line, opts)?;
            continue;
        }
        if !conds.active() {
            continue;
        }
        let kw = line.kw().to_string();
        if SECTIONS.contains(&kw.as_str()) {
            if let Some(s) = current.take() {
                out.push(s);
            }
            current = Some(section(line)?);
            continue;
        }
        match current.as_mut() {
            None => {
                return Err(ParseError::new(
                    line.loc.clone(),
                    format!("'{kw}' outside any section (expected global, defaults, frontend, backend, listen...)"),
                ))
            }
            Some(_) if indented && line.loc.col == 1 => {
                return Err(ParseError::new(
                    line.loc.clone(),
                    format!("unknown section '{kw}' (a keyword at column 1 where the file indents its directives)"),
                ))
            }
            Some(s) => s.lines.push(line),
        }
    }
    if let Some(s) = current.take() {
        out.push(s);
    }
    if let Some(loc) = conds.open() {
        return Err(ParseError::new(loc, ".if without .endif"));
    }
    Ok(())
}

/// The section a section line starts: `frontend NAME [from DEFAULTS]`.
fn section(head: Line) -> Result<Section, ParseError> {
    let kind = head.kw().to_string();
    let mut name = String::new();
    let mut from = None;
    let args = head.args();
    let mut i = 0;
    while i < args.len() {
        if args[i] == "from" {
            let Some(f) = args.get(i + 1) else {
                return Err(ParseError::new(
                    head.words[i + 1].loc.clone(),
                    "'from' needs a defaults section name",
                ));
            };
            from = Some(f.to_string());
            i += 2;
        } else {
            if name.is_empty() {
                name = args[i].to_string();
            }
            i += 1;
        }
    }
    let needs_name = !matches!(kind.as_str(), "global" | "defaults");
    if needs_name && name.is_empty() {
        return Err(ParseError::new(
            head.loc.clone(),
            format!("'{kind}' needs a name"),
        ));
    }
    Ok(Section {
        kind,
        name,
        from,
        head,
        lines: Vec::new(),
    })
}

/// Splits one line into words; `None` for a blank or comment line.
pub fn tokenize(
    file: &Arc<str>,
    n: u32,
    raw: &str,
    opts: &Options,
) -> Result<Option<Line>, ParseError> {
    let chars: Vec<char> = raw.chars().collect();
    let mut words: Vec<Word> = Vec::new();
    let mut env_error = None;
    let mut i = 0;
    let loc = |col: usize| Loc::new(file, n, col as u32 + 1);
    while i < chars.len() {
        if chars[i] == ' ' || chars[i] == '\t' || chars[i] == '\r' {
            i += 1;
            continue;
        }
        if chars[i] == '#' {
            break;
        }
        let start = i;
        let mut text = String::new();
        while i < chars.len() && !matches!(chars[i], ' ' | '\t' | '\r' | '#') {
            match chars[i] {
                '\\' => {
                    let (c, used) = escape(&chars[i..])
                        .ok_or_else(|| ParseError::new(loc(i), "bad escape sequence"))?;
                    text.push_str(&c);
                    i += used;
                }
                '\'' => {
                    let end = chars[i + 1..]
                        .iter()
                        .position(|&c| c == '\'')
                        .ok_or_else(|| ParseError::new(loc(i), "unterminated quote '"))?;
                    text.extend(&chars[i + 1..i + 1 + end]);
                    i += end + 2;
                }
                '"' => {
                    let mut j = i + 1;
                    let mut inner = String::new();
                    loop {
                        match chars.get(j) {
                            None => return Err(ParseError::new(loc(i), "unterminated quote \"")),
                            Some('"') => break,
                            Some('\\') => {
                                let (c, used) = escape(&chars[j..]).ok_or_else(|| {
                                    ParseError::new(loc(j), "bad escape sequence")
                                })?;
                                inner.push_str(&c);
                                j += used;
                            }
                            Some(&c) => {
                                inner.push(c);
                                j += 1;
                            }
                        }
                    }
                    match expand(&inner, opts) {
                        Ok(v) => text.push_str(&v),
                        Err(e) => {
                            env_error.get_or_insert(e);
                            text.push_str(&inner);
                        }
                    }
                    i = j + 1;
                }
                c => {
                    text.push(c);
                    i += 1;
                }
            }
        }
        words.push(Word {
            text,
            loc: loc(start),
        });
    }
    if words.is_empty() {
        return Ok(None);
    }
    Ok(Some(Line {
        loc: words[0].loc.clone(),
        words,
        env_error,
    }))
}

/// A backslash escape at the start of `s`: its text and how many chars it used. Only
/// `\ `, `\#`, `\\`, `\'`, `\"`, `\r`, `\n`, `\t` and `\xHH` are escapes; any other
/// backslash stays (`\1` in a replacement, `\.` in a regex), as in HAProxy.
fn escape(s: &[char]) -> Option<(String, usize)> {
    match s.get(1)? {
        c @ (' ' | '#' | '\\' | '\'' | '"') => Some((c.to_string(), 2)),
        'r' => Some(("\r".into(), 2)),
        'n' => Some(("\n".into(), 2)),
        't' => Some(("\t".into(), 2)),
        'x' => {
            let hex: String = s.get(2..4)?.iter().collect();
            let b = u8::from_str_radix(&hex, 16).ok()?;
            Some(((b as char).to_string(), 4))
        }
        &c => Some((format!("\\{c}"), 2)),
    }
}

/// `${VAR}`, `${VAR-default}` and `$VAR` in a double-quoted string.
fn expand(s: &str, opts: &Options) -> Result<String, String> {
    if !s.contains('$') {
        return Ok(s.to_string());
    }
    let mut norm = String::with_capacity(s.len());
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '$' && chars.get(i + 1) == Some(&'{') {
            let end = chars[i..].iter().position(|&c| c == '}').map(|e| e + i);
            let Some(end) = end else {
                norm.extend(&chars[i..]);
                break;
            };
            let inner: String = chars[i + 2..end].iter().collect();
            let inner = inner.trim_end_matches("[*]");
            let inner = match inner.split_once('-') {
                Some((n, d)) if !n.ends_with(':') => format!("{n}:-{d}"),
                _ => inner.to_string(),
            };
            norm.push_str(&format!("${{{inner}}}"));
            i = end + 1;
        } else if chars[i] == '$'
            && chars
                .get(i + 1)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_')
        {
            let len = chars[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                .count();
            let name: String = chars[i + 1..i + 1 + len].iter().collect();
            norm.push_str(&format!("${{{name}}}"));
            i += 1 + len;
        } else {
            norm.push(chars[i]);
            i += 1;
        }
    }
    opts.expand_env(&norm)
}

/// `.if` / `.elif` / `.else` / `.endif` blocks.
#[derive(Default)]
struct CondStack {
    /// Per open block: (taking lines now, a branch was already taken, where it opened).
    stack: Vec<(bool, bool, Loc)>,
}

impl CondStack {
    fn active(&self) -> bool {
        self.stack.iter().all(|(on, _, _)| *on)
    }

    fn open(&self) -> Option<Loc> {
        self.stack.last().map(|(_, _, l)| l.clone())
    }

    fn directive(&mut self, line: &Line, opts: &Options) -> Result<(), ParseError> {
        let outer = self.stack.len() <= 1 || self.stack[..self.stack.len() - 1].iter().all(|s| s.0);
        match line.kw() {
            ".if" => {
                let v = self.active() && eval(line, opts)?;
                self.stack.push((v, v, line.loc.clone()));
            }
            ".elif" => {
                let done = self.top(line)?.1;
                let v = !done && outer && eval(line, opts)?;
                let top = self.stack.last_mut().expect("checked");
                *top = (v, done || v, top.2.clone());
            }
            ".else" => {
                let done = self.top(line)?.1;
                let top = self.stack.last_mut().expect("checked");
                *top = (!done && outer, true, top.2.clone());
            }
            ".endif" => {
                self.top(line)?;
                self.stack.pop();
            }
            ".diag" | ".notice" | ".warning" | ".alert" => {}
            other => {
                return Err(ParseError::new(
                    line.loc.clone(),
                    format!("unknown directive '{other}'"),
                ))
            }
        }
        Ok(())
    }

    fn top(&self, line: &Line) -> Result<&(bool, bool, Loc), ParseError> {
        self.stack.last().ok_or_else(|| {
            ParseError::new(line.loc.clone(), format!("'{}' without .if", line.kw()))
        })
    }
}

/// Evaluates an `.if` condition: `defined(VAR)`, `streq(a,b)`, `strneq(a,b)`,
/// `version_atleast(V)`, `version_before(V)`, `feature(F)`, numbers, `!` and `&&`/`||`
/// between terms (left to right).
fn eval(line: &Line, opts: &Options) -> Result<bool, ParseError> {
    let mut result: Option<bool> = None;
    let mut op = "";
    for w in &line.words[1..] {
        if w.text == "&&" || w.text == "||" {
            op = if w.text == "&&" { "&&" } else { "||" };
            continue;
        }
        let v = term(&w.text, opts).ok_or_else(|| {
            ParseError::new(
                w.loc.clone(),
                format!("cannot evaluate condition '{}'", w.text),
            )
        })?;
        result = Some(match (result, op) {
            (None, _) => v,
            (Some(r), "||") => r || v,
            (Some(r), _) => r && v,
        });
    }
    result.ok_or_else(|| ParseError::new(line.loc.clone(), ".if needs a condition"))
}

fn term(t: &str, opts: &Options) -> Option<bool> {
    if let Some(rest) = t.strip_prefix('!') {
        return term(rest, opts).map(|v| !v);
    }
    if let Ok(n) = t.parse::<i64>() {
        return Some(n != 0);
    }
    let (f, args) = t.strip_suffix(')')?.split_once('(')?;
    let args: Vec<&str> = args.split(',').map(str::trim).collect();
    let version = |v: &str| -> Vec<u32> { v.split('.').filter_map(|p| p.parse().ok()).collect() };
    match f {
        "defined" => Some(opts.env.as_ref()?.contains_key(args[0])),
        "streq" => Some(args.first()? == args.get(1)?),
        "strneq" => Some(args.first()? != args.get(1)?),
        "version_atleast" => Some(version("2.6") >= version(args[0])),
        "version_before" => Some(version("2.6") < version(args[0])),
        "feature" => Some(matches!(
            args[0],
            "OPENSSL" | "PCRE2" | "ZLIB" | "LUA" | "PROMEX"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        let f: Arc<str> = "t".into();
        let o = Options {
            env: Some([("PORT".to_string(), "8080".to_string())].into()),
            ..Default::default()
        };
        tokenize(&f, 1, s, &o)
            .unwrap()
            .map(|l| l.words.into_iter().map(|w| w.text).collect())
            .unwrap_or_default()
    }

    #[test]
    fn words_quotes_escapes_comments() {
        assert_eq!(words("  bind :80 # web"), ["bind", ":80"]);
        assert_eq!(
            words(r#"a "b c" 'd $e' f\ g \#h"#),
            ["a", "b c", "d $e", "f g", "#h"]
        );
        assert_eq!(
            words(r"replace-path /v1/(.*) /x/\1 ^/a\.b"),
            ["replace-path", "/v1/(.*)", "/x/\\1", "^/a\\.b"]
        );
        assert_eq!(words(r#"bind ":${PORT}""#), ["bind", ":8080"]);
        assert_eq!(words(r#"x "a${Y-dflt}""#), ["x", "adflt"]);
        assert!(words("# only").is_empty());
    }

    #[test]
    fn sections_and_errors() {
        let f: Arc<str> = "h.cfg".into();
        let o = Options::default();
        let mut out = Vec::new();
        parse_text(
            &f,
            "frontend a\n  bind :80\nbackend b from d\n  server s 1.2.3.4:80\n",
            &o,
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].from.as_deref(), Some("d"));
        let e = parse_text(&f, "bind :80\n", &o, &mut Vec::new()).unwrap_err();
        assert_eq!(e.to_string(), "h.cfg:1:1: 'bind' outside any section (expected global, defaults, frontend, backend, listen...)");
        let e = parse_text(
            &f,
            "frontend a\n  bind :80\nfrontnd b\n",
            &o,
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(e
            .to_string()
            .starts_with("h.cfg:3:1: unknown section 'frontnd'"));
        let e =
            parse_text(&f, "frontend a\n  x \"unterminated\n", &o, &mut Vec::new()).unwrap_err();
        assert!(e.to_string().starts_with("h.cfg:2:5: unterminated"));
    }

    #[test]
    fn conditional_blocks() {
        let f: Arc<str> = "h.cfg".into();
        let o = Options::default();
        let mut out = Vec::new();
        let text = "frontend a\n.if version_atleast(2.4)\n  bind :80\n.else\n  bind :81\n.endif\n";
        parse_text(&f, text, &o, &mut out).unwrap();
        assert_eq!(out[0].lines.len(), 1);
        assert_eq!(out[0].lines[0].arg(0), Some(":80"));
    }
}
