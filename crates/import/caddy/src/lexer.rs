//! The Caddyfile lexer: whitespace-separated tokens, `#` comments, `"quoted"` tokens (with
//! `\"` escapes, spanning lines), `` `backtick` `` tokens (raw), heredocs (`<<EOF` ... `EOF`,
//! the closing marker's indentation removed from every line), each token with its place.
//!
//! Hand-written: no crate parses Caddyfiles, and the format is Caddy's own (its Go lexer is
//! the reference; this one follows it token for token).

use std::sync::Arc;

use veloxy_import::{Loc, ParseError};

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// The text, quotes removed.
    pub text: String,
    /// Where it starts.
    pub loc: Loc,
    /// The line it ends on (a quoted token or heredoc may span lines).
    pub end_line: u32,
    /// Written quoted (`"..."`, backticks, heredoc): never a brace or a comment.
    pub quoted: bool,
}

impl Token {
    /// Whether this is the unquoted token `s` (`{`, `}`, `import`...).
    pub fn is(&self, s: &str) -> bool {
        !self.quoted && self.text == s
    }
}

/// Splits `text` (of file `file`) into tokens.
pub fn lex(file: &Arc<str>, text: &str) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0usize, 1u32, 1u32);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            col = 1;
            i += 1;
            continue;
        }
        if c.is_whitespace() {
            col += 1;
            i += 1;
            continue;
        }
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        let loc = Loc::new(file, line, col);
        let start_line = line;
        let mut val = String::new();
        let mut quoted = false;
        if c == '"' || c == '`' {
            quoted = true;
            i += 1;
            col += 1;
            let mut closed = false;
            while i < chars.len() {
                let ch = chars[i];
                i += 1;
                col += 1;
                if c == '"' && ch == '\\' && i < chars.len() && chars[i] == '"' {
                    val.push('"');
                    i += 1;
                    col += 1;
                    continue;
                }
                if ch == c {
                    closed = true;
                    break;
                }
                if ch == '\n' {
                    line += 1;
                    col = 1;
                }
                val.push(ch);
            }
            if !closed {
                return Err(ParseError::new(
                    loc,
                    format!("unterminated {c}quoted{c} token"),
                ));
            }
        } else if c == '<' && chars.get(i + 1) == Some(&'<') && heredoc_marker(&chars, i + 2) {
            let (v, ni, nl, ncol) = heredoc(file, &chars, i, line, &loc)?;
            val = v;
            i = ni;
            line = nl;
            col = ncol;
            quoted = true;
        } else {
            while i < chars.len() && !chars[i].is_whitespace() {
                if chars[i] == '\\' && i + 1 < chars.len() && !chars[i + 1].is_whitespace() {
                    // `\{` and friends: the next character taken literally (Caddy keeps the
                    // backslash only before characters it does not escape; placeholders are
                    // escaped this way, which veloxy writes as `{{`).
                    val.push('\\');
                }
                val.push(chars[i]);
                i += 1;
                col += 1;
            }
        }
        out.push(Token {
            text: val,
            loc,
            end_line: line.max(start_line),
            quoted,
        });
    }
    Ok(out)
}

/// Whether `<<` at `i - 2` starts a heredoc: a marker of letters, digits or `_` to the end of
/// the line.
fn heredoc_marker(chars: &[char], i: usize) -> bool {
    let mut j = i;
    while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
        j += 1;
    }
    j > i && (j == chars.len() || chars[j] == '\n' || chars[j] == '\r')
}

/// Reads a heredoc starting at `i` (the first `<`): (text, index after the closing marker,
/// its line and the column after it).
fn heredoc(
    file: &Arc<str>,
    chars: &[char],
    i: usize,
    line: u32,
    loc: &Loc,
) -> Result<(String, usize, u32, u32), ParseError> {
    let mut j = i + 2;
    let mut marker = String::new();
    while j < chars.len() && chars[j] != '\n' && chars[j] != '\r' {
        marker.push(chars[j]);
        j += 1;
    }
    while j < chars.len() && chars[j] != '\n' {
        j += 1;
    }
    j += 1;
    let mut line = line + 1;
    let mut lines: Vec<String> = Vec::new();
    loop {
        if j >= chars.len() {
            return Err(ParseError::new(
                loc.clone(),
                format!("heredoc <<{marker} is not closed by a line {marker}"),
            ));
        }
        let start = j;
        while j < chars.len() && chars[j] != '\n' {
            j += 1;
        }
        let text: String = chars[start..j].iter().collect();
        let text = text.trim_end_matches('\r').to_string();
        let trimmed = text.trim_start();
        let closes = trimmed.starts_with(marker.as_str())
            && trimmed[marker.len()..]
                .chars()
                .next()
                .is_none_or(char::is_whitespace);
        if closes {
            let indent = &text[..text.len() - trimmed.len()];
            let indent_chars = indent.chars().count();
            let after = start + indent_chars + marker.chars().count();
            let mut body = Vec::new();
            for (n, l) in lines.iter().enumerate() {
                match l.strip_prefix(indent) {
                    Some(rest) => body.push(rest.to_string()),
                    None if l.trim().is_empty() => body.push(String::new()),
                    None => {
                        return Err(ParseError::new(
                            Loc::new(file, loc.line + 1 + n as u32, 1),
                            format!("heredoc line is not indented like its closing {marker}"),
                        ))
                    }
                }
            }
            let col = (indent_chars + marker.chars().count()) as u32 + 1;
            return Ok((body.join("\n"), after, line, col));
        }
        j += 1;
        lines.push(text);
        line += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(s: &str) -> Vec<(String, u32, u32)> {
        let f: Arc<str> = "C".into();
        lex(&f, s)
            .unwrap()
            .into_iter()
            .map(|t| (t.text, t.loc.line, t.loc.col))
            .collect()
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
    fn heredoc_strips_indent() {
        let t = texts("respond <<EOF\n    <p>hi</p>\n      x\n    EOF 200\n");
        assert_eq!(t[1].0, "<p>hi</p>\n  x");
        assert_eq!(t[2], ("200".to_string(), 4, 9));
    }

    #[test]
    fn unterminated_quote() {
        let f: Arc<str> = "C".into();
        let e = lex(&f, "a {\n respond \"x\n}\n").unwrap_err();
        assert_eq!(e.to_string(), "C:2:10: unterminated \"quoted\" token");
    }
}
