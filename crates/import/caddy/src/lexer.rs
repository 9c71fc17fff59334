//! The Caddyfile lexer, rule for rule as Caddy's (`caddyconfig/caddyfile/lexer.go`):
//!
//! * tokens are separated by whitespace; a `\` before a newline (spaces may come between)
//!   joins the next line to this one ("newlines can be escaped to chain arguments"); any other
//!   `\` outside quotes is kept with the character after it (`\{` stays `\{`), except `\<`,
//!   which only stops a heredoc;
//! * `#` starts a comment only at the start of a token (`a#b` is one token); a `\` inside a
//!   comment still escapes the newline that ends it, as in Caddy;
//! * `"quoted"` tokens may span lines; inside them only `\"` is an escape (`\\` stays two
//!   characters); `` `backtick` `` tokens have no escapes at all; a token ends at its closing
//!   quote (`"a"b` is two tokens);
//! * heredocs: `<<MARKER` (letters, digits, `-`, `_`) at the end of a line, closed where the
//!   text next ends with MARKER; what precedes the closing marker on its line is removed from
//!   every line, and the last newline is dropped;
//! * a leading byte order mark is skipped.
//!
//! Each token keeps its place (file, line, column) and its logical line (continuations
//! joined), which is what the parser groups by.
//!
//! Hand-written: no crate parses Caddyfiles.

use std::sync::Arc;

use veloxy_import::{Loc, ParseError};

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// The text, quotes removed.
    pub text: String,
    /// Where it starts.
    pub loc: Loc,
    /// The physical line it ends on (a quoted token or heredoc may span lines).
    pub end_line: u32,
    /// The logical line it starts on: physical lines joined by `\` count as one.
    pub line: u32,
    /// The logical line it ends on.
    pub line_end: u32,
    /// Written quoted (`"..."`, backticks, heredoc): never a brace or a comment.
    pub quoted: bool,
    /// The environment placeholders (`{$VAR}`, `{env.VAR}`) its text was written with.
    pub env: Vec<String>,
    /// Why its text is not known: a placeholder that could not be resolved (names it).
    pub unresolved: Option<String>,
}

impl Token {
    /// Whether this is the unquoted token `s` (`{`, `}`, `import`...).
    pub fn is(&self, s: &str) -> bool {
        !self.quoted && self.text == s
    }
}

/// Splits `text` (of file `file`) into tokens.
pub fn lex(file: &Arc<str>, text: &str) -> Result<Vec<Token>, ParseError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lx = Lexer {
        file,
        chars: text.chars().collect(),
        i: 0,
        line: 1,
        col: 1,
        logical: 1,
    };
    let mut out = Vec::new();
    while let Some(t) = lx.next_token()? {
        out.push(t);
    }
    Ok(out)
}

struct Lexer<'a> {
    file: &'a Arc<str>,
    chars: Vec<char>,
    i: usize,
    line: u32,
    col: u32,
    logical: u32,
}

/// What a token being read is.
#[derive(PartialEq, Clone, Copy)]
enum Kind {
    Plain,
    Quoted,
    Backtick,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.i).copied()
    }

    /// Consumes one character; a newline starts the next physical line (and the next
    /// logical one unless `joined`).
    fn bump(&mut self, joined: bool) -> char {
        let ch = self.chars[self.i];
        self.i += 1;
        if ch == '\n' {
            self.line += 1;
            self.col = 1;
            if !joined {
                self.logical += 1;
            }
        } else {
            self.col += 1;
        }
        ch
    }

    fn here(&self) -> Loc {
        Loc::new(self.file, self.line, self.col)
    }

    fn token(&self, text: String, start: (Loc, u32), quoted: bool, end: (u32, u32)) -> Token {
        Token {
            text,
            loc: start.0,
            end_line: end.0,
            line: start.1,
            line_end: end.1,
            quoted,
            env: Vec::new(),
            unresolved: None,
        }
    }

    /// The next token, or `None` at the end of the text.
    fn next_token(&mut self) -> Result<Option<Token>, ParseError> {
        let mut val = String::new();
        let (mut escaped, mut comment, mut heredoc_escaped) = (false, false, false);
        let mut kind: Option<Kind> = None;
        let mut start: Option<(Loc, u32)> = None;
        let mut escape_at: Option<Loc> = None;
        loop {
            let Some(ch) = self.peek() else {
                return match kind {
                    Some(Kind::Quoted | Kind::Backtick) => {
                        let (loc, _) = start.expect("a started token");
                        let q = if kind == Some(Kind::Quoted) { '"' } else { '`' };
                        Err(ParseError::new(
                            loc,
                            format!("unterminated {q}quoted{q} token"),
                        ))
                    }
                    _ if !val.is_empty() => {
                        let end = (self.line, self.logical);
                        Ok(Some(self.token(val, start.expect("started"), false, end)))
                    }
                    _ => Ok(None),
                };
            };
            let plain = kind.is_none() || kind == Some(Kind::Plain);
            if plain && !heredoc_escaped && val.starts_with("<<") {
                if ch == ' ' {
                    let end = (self.line, self.logical);
                    self.bump(false);
                    return Ok(Some(self.token(val, start.expect("started"), false, end)));
                }
                if ch == '\n' {
                    let start = start.expect("started");
                    let marker = val[2..].to_string();
                    let text = self.heredoc(&marker, &start.0)?;
                    let end = (self.line, self.logical);
                    return Ok(Some(self.token(text, start, true, end)));
                }
                self.bump(false);
                if ch != '\r' {
                    val.push(ch);
                }
                continue;
            }
            if !escaped && kind != Some(Kind::Backtick) && ch == '\\' {
                escape_at = Some(self.here());
                self.bump(false);
                escaped = true;
                continue;
            }
            if let Some(q @ (Kind::Quoted | Kind::Backtick)) = kind {
                if q == Kind::Quoted && escaped {
                    // Inside quotes only `\"` is an escape.
                    if ch != '"' {
                        val.push('\\');
                    }
                    escaped = false;
                } else if (q == Kind::Quoted && ch == '"') || (q == Kind::Backtick && ch == '`') {
                    let end = (self.line, self.logical);
                    self.bump(false);
                    return Ok(Some(self.token(val, start.expect("started"), true, end)));
                }
                val.push(self.bump(false));
                continue;
            }
            if ch.is_whitespace() {
                let end = (self.line, self.logical);
                if ch == '\n' {
                    // An escaped newline chains the next line's arguments onto this one.
                    self.bump(escaped);
                    escaped = false;
                    comment = false;
                } else {
                    self.bump(false);
                }
                if !val.is_empty() {
                    return Ok(Some(self.token(val, start.expect("started"), false, end)));
                }
                continue;
            }
            if ch == '#' && val.is_empty() {
                comment = true;
            }
            if comment {
                self.bump(false);
                continue;
            }
            if val.is_empty() && kind.is_none() {
                let at = if escaped {
                    escape_at.clone().unwrap_or_else(|| self.here())
                } else {
                    self.here()
                };
                start = Some((at, self.logical));
                if ch == '"' || ch == '`' {
                    kind = Some(if ch == '"' {
                        Kind::Quoted
                    } else {
                        Kind::Backtick
                    });
                    self.bump(false);
                    continue;
                }
                kind = Some(Kind::Plain);
            }
            if escaped {
                // `\<` only stops a heredoc; other escapes keep their backslash.
                if ch == '<' {
                    heredoc_escaped = true;
                } else {
                    val.push('\\');
                }
                escaped = false;
            }
            val.push(self.bump(false));
        }
    }

    /// Reads a heredoc body after `<<marker` (at the newline ending the opening line).
    fn heredoc(&mut self, marker: &str, at: &Loc) -> Result<String, ParseError> {
        if marker.is_empty() {
            return Err(ParseError::new(
                at.clone(),
                "missing heredoc marker after << (letters, digits, dashes and underscores)",
            ));
        }
        if marker.starts_with('<') {
            return Err(ParseError::new(
                at.clone(),
                "too many '<' for a heredoc (use two, as in <<END)",
            ));
        }
        if !marker
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ParseError::new(
                at.clone(),
                format!(
                    "heredoc marker {marker:?} must be letters, digits, dashes and underscores"
                ),
            ));
        }
        self.bump(false);
        let first_line = self.line;
        let mut body = String::new();
        loop {
            if self.peek().is_none() {
                return Err(ParseError::new(
                    at.clone(),
                    format!("heredoc <<{marker} is never closed by {marker}"),
                ));
            }
            body.push(self.bump(false));
            if body.ends_with(marker) {
                break;
            }
        }
        let content_end = body.rfind('\n').map_or(0, |n| n + 1);
        let padding = &body[content_end..body.len() - marker.len()];
        let mut out = String::new();
        for (n, line) in body[..content_end].split_terminator('\n').enumerate() {
            if line.is_empty() || line == "\r" {
                out.push('\n');
                continue;
            }
            let Some(rest) = line.strip_prefix(padding) else {
                return Err(ParseError::new(
                    Loc::new(self.file, first_line + n as u32, 1),
                    format!(
                        "heredoc line does not start with {padding:?}, the text before its \
                         closing {marker}"
                    ),
                ));
            };
            out.push_str(&rest.replace('\r', ""));
            out.push('\n');
        }
        out.pop();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Token> {
        let f: Arc<str> = "C".into();
        lex(&f, s).unwrap()
    }

    fn texts(s: &str) -> Vec<(String, u32, u32)> {
        toks(s)
            .into_iter()
            .map(|t| (t.text, t.loc.line, t.loc.col))
            .collect()
    }

    fn words(s: &str) -> Vec<String> {
        toks(s).into_iter().map(|t| t.text).collect()
    }

    #[test]
    fn tokens_quotes_comments() {
        let t = texts("a.com {\n  respond \"hi \\\"x\\\"\" 200 # c\n  header `a\"b`\n}\n");
        let words: Vec<&str> = t.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            words,
            ["a.com", "{", "respond", "hi \"x\"", "200", "header", "a\"b", "}"]
        );
        assert_eq!((t[2].1, t[2].2), (2, 3));
    }

    #[test]
    fn escapes_follow_caddy() {
        // Inside quotes only \" escapes; \\ stays two characters and does not eat the quote.
        assert_eq!(words(r#""a\\" b"#), [r"a\\", "b"]);
        assert_eq!(words(r#""a\nb""#), [r"a\nb"]);
        // Backticks have no escapes.
        assert_eq!(words(r"`a\` b"), [r"a\", "b"]);
        // Outside quotes the backslash stays, except before <.
        assert_eq!(words(r"\{host} \<<EOF"), [r"\{host}", "<<EOF"]);
        // `#` inside a token is text; a quoted token ends at its quote.
        assert_eq!(words("a#b \"c\"d # e"), ["a#b", "c", "d"]);
    }

    #[test]
    fn backslash_newline_joins_lines() {
        let t = toks("trusted_proxies static \\\n  10.0.0.0/8 \\  \n 192.168.0.0/16\\\n\nnext x\n");
        let w: Vec<(&str, u32, u32)> = t
            .iter()
            .map(|t| (t.text.as_str(), t.loc.line, t.line))
            .collect();
        assert_eq!(
            w,
            [
                ("trusted_proxies", 1, 1),
                ("static", 1, 1),
                ("10.0.0.0/8", 2, 1),
                ("192.168.0.0/16", 3, 1),
                ("next", 5, 2),
                ("x", 5, 2),
            ]
        );
        // CRLF line ends too.
        let t = toks("a \\\r\n b\r\nc\r\n");
        assert_eq!((t[1].line, t[2].line), (1, 2));
    }

    #[test]
    fn heredoc_strips_indent() {
        let t = texts("respond <<EOF\n    <p>hi</p>\n\n      x\n    EOF 200\n");
        assert_eq!(t[1].0, "<p>hi</p>\n\n  x");
        assert_eq!(t[2], ("200".to_string(), 5, 9));
        assert_eq!(words("respond <<my-Doc\nhi\nmy-Doc\n")[1], "hi");
        // `<<` followed by a space is a plain token.
        assert_eq!(words("a << b"), ["a", "<<", "b"]);
        let f: Arc<str> = "C".into();
        let e = lex(&f, "respond <<EOF\n  x\n").unwrap_err();
        assert!(e.to_string().contains("never closed"), "{e}");
        let e = lex(&f, "respond <<E.F\nx\nE.F\n").unwrap_err();
        assert!(e.to_string().contains("marker"), "{e}");
    }

    #[test]
    fn heredoc_keeps_its_logical_line() {
        let t = toks("respond <<EOF\n  a\n  EOF 200\nnext\n");
        assert_eq!(t[0].line_end, t[1].line);
        assert_eq!(t[1].line_end, t[2].line);
        assert!(t[3].line > t[2].line_end);
    }

    #[test]
    fn comment_with_backslash_joins_like_caddy() {
        let t = toks("a b # see C:\\dir\nc\nd\n");
        let w: Vec<(&str, u32)> = t.iter().map(|t| (t.text.as_str(), t.line)).collect();
        assert_eq!(w, [("a", 1), ("b", 1), ("c", 1), ("d", 2)]);
    }

    #[test]
    fn unterminated_quote() {
        let f: Arc<str> = "C".into();
        let e = lex(&f, "a {\n respond \"x\n}\n").unwrap_err();
        assert_eq!(e.to_string(), "C:2:10: unterminated \"quoted\" token");
    }

    #[test]
    fn byte_order_mark() {
        assert_eq!(words("\u{feff}a.com"), ["a.com"]);
    }
}
