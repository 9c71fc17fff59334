//! The nginx configuration syntax: directives (`name arg ...;`), blocks (`name arg { ... }`),
//! single- and double-quoted strings with backslash escapes, `#` comments and `${var}`
//! variables, each directive located at `FILE:LINE:COL`.
//!
//! Hand-written: no crate parses nginx.conf with source locations (the few that exist
//! drop positions or refuse quoted `{`), and the grammar is small: this is nginx's own
//! `ngx_conf_read_token` rules.

use std::sync::Arc;

use veloxy_import::{Loc, ParseError};

/// One argument of a directive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    /// The text, escapes resolved and quotes removed.
    pub text: String,
    /// Whether it was written in quotes (a quoted `{` or `;` is text).
    pub quoted: bool,
}

/// A directive: `name args;` or `name args { block }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// Where its name starts.
    pub loc: Loc,
    /// The name (`proxy_pass`, `location`...).
    pub name: String,
    /// The arguments after the name.
    pub args: Vec<Arg>,
    /// The directives inside `{ }`, for a block.
    pub block: Option<Vec<Directive>>,
}

impl Directive {
    /// Argument `i`'s text ("" when absent).
    pub fn arg(&self, i: usize) -> &str {
        self.args.get(i).map_or("", |a| a.text.as_str())
    }

    /// The block's directives (none for a simple directive).
    pub fn children(&self) -> &[Directive] {
        self.block.as_deref().unwrap_or(&[])
    }

    /// The block's directives with every `include` replaced by what it holds (for a look
    /// ahead: the translation reports each include where it walks the block).
    pub fn expanded(&self) -> Vec<&Directive> {
        fn walk<'a>(list: &'a [Directive], out: &mut Vec<&'a Directive>) {
            for d in list {
                if d.name == "include" {
                    walk(d.children(), out);
                } else {
                    out.push(d);
                }
            }
        }
        let mut out = Vec::new();
        walk(self.children(), &mut out);
        out
    }
}

enum Token {
    Word(Arg, usize),
    Semi(usize),
    Open(usize),
    Close(usize),
}

struct Lexer<'a> {
    file: &'a Arc<str>,
    text: &'a str,
    pos: usize,
    /// The last located offset, its line and its line's start (locations are asked for in
    /// increasing order: counting from there keeps parsing linear).
    mark: std::cell::Cell<(usize, u32, usize)>,
}

impl<'a> Lexer<'a> {
    fn loc(&self, offset: usize) -> Loc {
        let (mut at, mut line, mut start) = self.mark.get();
        if offset < at {
            (at, line, start) = (0, 1, 0);
        }
        let bytes = self.text.as_bytes();
        for (i, b) in bytes
            .iter()
            .enumerate()
            .take(offset.min(bytes.len()))
            .skip(at)
        {
            if *b == b'\n' {
                line += 1;
                start = i + 1;
            }
        }
        self.mark.set((offset, line, start));
        let col = self.text[start..offset.min(self.text.len())]
            .chars()
            .count() as u32
            + 1;
        Loc::new(self.file, line, col)
    }

    fn err(&self, offset: usize, msg: impl Into<String>) -> ParseError {
        ParseError::new(self.loc(offset), msg)
    }

    fn next(&mut self) -> Result<Option<Token>, ParseError> {
        let bytes = self.text.as_bytes();
        loop {
            while self.pos < bytes.len() && bytes[self.pos].is_ascii_whitespace() {
                self.pos += 1;
            }
            if self.pos < bytes.len() && bytes[self.pos] == b'#' {
                while self.pos < bytes.len() && bytes[self.pos] != b'\n' {
                    self.pos += 1;
                }
                continue;
            }
            break;
        }
        let start = self.pos;
        let Some(&c) = bytes.get(start) else {
            return Ok(None);
        };
        self.pos += 1;
        match c {
            b';' => Ok(Some(Token::Semi(start))),
            b'{' => Ok(Some(Token::Open(start))),
            b'}' => Ok(Some(Token::Close(start))),
            b'"' | b'\'' => self.quoted(start, c).map(Some),
            _ => {
                self.pos = start;
                Ok(Some(self.word(start)))
            }
        }
    }

    fn quoted(&mut self, start: usize, quote: u8) -> Result<Token, ParseError> {
        let mut out = String::new();
        let mut rest = self.text[self.pos..].char_indices();
        loop {
            let Some((i, ch)) = rest.next() else {
                return Err(self.err(start, "unterminated quoted string"));
            };
            if ch as u32 == quote as u32 {
                self.pos += i + 1;
                break;
            }
            if ch == '\\' {
                match rest.next() {
                    Some((_, '"')) => out.push('"'),
                    Some((_, '\'')) => out.push('\''),
                    Some((_, '\\')) => out.push('\\'),
                    Some((_, 't')) => out.push('\t'),
                    Some((_, 'r')) => out.push('\r'),
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, other)) => {
                        out.push('\\');
                        out.push(other);
                    }
                    None => return Err(self.err(start, "unterminated quoted string")),
                }
                continue;
            }
            out.push(ch);
        }
        // nginx (`need_space`): after a closing quote comes whitespace, `;`, `{` or `)` (the
        // `)` then starts the next word, as in `if ($a = "b")`); anything else is an error.
        let next = self.text.as_bytes().get(self.pos).copied();
        if next.is_some_and(|b| !(b.is_ascii_whitespace() || matches!(b, b';' | b'{' | b')'))) {
            return Err(self.err(
                self.pos,
                format!(
                    "unexpected \"{}\" after a quoted string",
                    self.text[self.pos..].chars().next().unwrap_or(' ')
                ),
            ));
        }
        Ok(Token::Word(
            Arg {
                text: out,
                quoted: true,
            },
            start,
        ))
    }

    /// An unquoted word, as nginx reads it: it ends at whitespace, `;` or `{` (but `${`
    /// continues it: a variable name); a backslash keeps the next character in the word
    /// whatever it is (`\"`, `\'`, `\\`, `\t`, `\r`, `\n` are resolved, any other `\x` stays
    /// as written: regexes); `#`, quotes and `}` inside a word are plain text.
    fn word(&mut self, start: usize) -> Token {
        let bytes = self.text.as_bytes();
        let mut out = String::new();
        let mut i = start;
        while i < bytes.len() {
            let b = bytes[i];
            if b.is_ascii_whitespace() || b == b';' {
                break;
            }
            if b == b'{' && !(i > start && bytes[i - 1] == b'$') {
                break;
            }
            if b == b'\\' && i + 1 < bytes.len() {
                match bytes[i + 1] {
                    b'"' | b'\'' | b'\\' => out.push(bytes[i + 1] as char),
                    b't' => out.push('\t'),
                    b'r' => out.push('\r'),
                    b'n' => out.push('\n'),
                    _ => {
                        out.push('\\');
                        let ch = self.text[i + 1..].chars().next().unwrap_or(' ');
                        out.push(ch);
                        i += 1 + ch.len_utf8();
                        continue;
                    }
                }
                i += 2;
                continue;
            }
            let ch = self.text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
        self.pos = i;
        Token::Word(
            Arg {
                text: out,
                quoted: false,
            },
            start,
        )
    }
}

/// Parses one file's text into its top-level directives.
pub fn parse(file: &Arc<str>, text: &str) -> Result<Vec<Directive>, ParseError> {
    let mut lx = Lexer {
        file,
        text,
        pos: 0,
        mark: std::cell::Cell::new((0, 1, 0)),
    };
    let (list, end) = block(&mut lx, None)?;
    debug_assert!(end.is_none());
    Ok(list)
}

/// Directives up to the `}` closing the block opened at `open` (or the end of the file at the
/// top level).
fn block(
    lx: &mut Lexer<'_>,
    open: Option<usize>,
) -> Result<(Vec<Directive>, Option<usize>), ParseError> {
    let mut out = Vec::new();
    loop {
        let Some(tok) = lx.next()? else {
            return match open {
                Some(o) => Err(lx.err(
                    lx.text.len(),
                    format!(
                        "unexpected end of file, expecting \"}}\" to close the block at {}",
                        lx.loc(o)
                    ),
                )),
                None => Ok((out, None)),
            };
        };
        let (name, at) = match tok {
            Token::Word(a, at) => (a.text, at),
            Token::Close(at) if open.is_some() => return Ok((out, Some(at))),
            Token::Close(at) => return Err(lx.err(at, "unexpected \"}\"")),
            Token::Semi(at) => return Err(lx.err(at, "unexpected \";\"")),
            Token::Open(at) => return Err(lx.err(at, "unexpected \"{\"")),
        };
        let loc = lx.loc(at);
        let mut args = Vec::new();
        let block_list = loop {
            match lx.next()? {
                Some(Token::Word(a, _)) => args.push(a),
                Some(Token::Semi(_)) => break None,
                Some(Token::Open(o)) => break Some(block(lx, Some(o))?.0),
                Some(Token::Close(c)) => {
                    return Err(lx.err(c, format!("unexpected \"}}\": {name} needs a \";\"")))
                }
                None => {
                    return Err(lx.err(
                        lx.text.len(),
                        format!("unexpected end of file, expecting \";\" or \"}}\" after {name}"),
                    ))
                }
            }
        };
        out.push(Directive {
            loc,
            name,
            args,
            block: block_list,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Vec<Directive>, ParseError> {
        parse(&Arc::from("t.conf"), text)
    }

    #[test]
    fn directives_blocks_quotes_comments() {
        let d = p("# c\nhttp {\n  server { listen 80; # x\n server_name \"a b\" 'c\\'d'; }\n}\n")
            .unwrap();
        assert_eq!(d.len(), 1);
        let server = &d[0].children()[0];
        assert_eq!(server.loc.to_string(), "t.conf:3:3");
        assert_eq!(server.children()[0].arg(0), "80");
        let names = &server.children()[1];
        assert_eq!(names.loc.to_string(), "t.conf:4:2");
        assert_eq!(names.arg(0), "a b");
        assert_eq!(names.arg(1), "c'd");
    }

    #[test]
    fn variables_and_regex_words() {
        let d = p("location ~ ^/a/(.*)$ { return 301 https://${host}$1; }").unwrap();
        assert_eq!(d[0].arg(1), "^/a/(.*)$");
        assert_eq!(d[0].children()[0].arg(1), "https://${host}$1");
        let d = p("location ~ \\.(png|jpg)$ { }").unwrap();
        assert_eq!(d[0].arg(1), "\\.(png|jpg)$");
        let d = p("location ~ \"^/x{2}\" { }").unwrap();
        assert_eq!(d[0].arg(1), "^/x{2}");
    }

    #[test]
    fn quote_then_paren_as_nginx_reads_it() {
        // nginx's `need_space`: a `)` after a closing quote starts the next word.
        let d = p("if ($request_method = 'OPTIONS') { return 204; }").unwrap();
        let args: Vec<&str> = d[0].args.iter().map(|a| a.text.as_str()).collect();
        assert_eq!(args, ["($request_method", "=", "OPTIONS", ")"]);
        let d = p("if ($args ~* \"^(/.+)$\") { }").unwrap();
        assert_eq!(d[0].arg(2), "^(/.+)$");
        assert_eq!(d[0].arg(3), ")");
        // Other characters after a quote are errors in nginx too.
        let e = p("a \"b\"c;").unwrap_err();
        assert!(e.message.contains("unexpected \"c\""), "{e}");
        let e = p("a { b \"c\"}").unwrap_err();
        assert!(e.message.contains("unexpected \"}\""), "{e}");
    }

    #[test]
    fn words_as_nginx_reads_them() {
        // A backslash keeps the next character, even a space or `;`.
        let d = p("a b\\ c\\;d;").unwrap();
        assert_eq!(d[0].arg(0), "b\\ c\\;d");
        // `#`, quotes and `}` inside a word are text.
        let d = p("a b#c d\"e f}g;").unwrap();
        let args: Vec<&str> = d[0].args.iter().map(|a| a.text.as_str()).collect();
        assert_eq!(args, ["b#c", "d\"e", "f}g"]);
        // `${` continues a word; `{` alone ends it.
        let d = p("a ${x}y;").unwrap();
        assert_eq!(d[0].arg(0), "${x}y");
    }

    #[test]
    fn errors_name_the_place() {
        let e = p("http {\n server {\n listen 80\n }\n}").unwrap_err();
        assert_eq!(e.loc.to_string(), "t.conf:4:2");
        assert!(e.message.contains("needs a"), "{e}");
        let e = p("http {\n").unwrap_err();
        assert!(e.message.contains("end of file"), "{e}");
        let e = p("}").unwrap_err();
        assert_eq!(e.loc.to_string(), "t.conf:1:1");
        let e = p("a \"b").unwrap_err();
        assert!(e.message.contains("unterminated"), "{e}");
        let e = p("listen 80").unwrap_err();
        assert!(e.message.contains("expecting"), "{e}");
    }
}
