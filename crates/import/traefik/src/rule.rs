//! Traefik's router rule expressions: `Host(`a`) && (PathPrefix(`/api`) || !Method(`GET`))`.
//!
//! Traefik parses rules with `vulcand/predicate` (a Go-expression subset): calls whose
//! arguments are string literals (`` `raw` `` or `"quoted"`), `&&`, `||`, `!` and
//! parentheses, `&&` binding tighter than `||`. No Rust crate parses that language, so this
//! is a small hand-written recursive-descent parser (about 150 lines), followed by the
//! disjunctive normal form the translation works on: an OR of ANDs of (possibly negated)
//! calls, each AND becoming one veloxy route.

use std::fmt;

/// A rule expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `Name(`a`, `b`)`.
    Call(Call),
    /// `!e`.
    Not(Box<Expr>),
    /// `a && b`.
    And(Box<Expr>, Box<Expr>),
    /// `a || b`.
    Or(Box<Expr>, Box<Expr>),
}

/// One matcher call.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Call {
    /// The matcher's name as written (`Host`, `PathPrefix`...).
    pub name: String,
    /// Its string arguments.
    pub args: Vec<String>,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self.args.iter().map(|a| format!("`{a}`")).collect();
        write!(f, "{}({})", self.name, args.join(", "))
    }
}

/// A call or its negation: one term of a conjunction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lit {
    /// `!Call(...)`.
    pub neg: bool,
    /// The call.
    pub call: Call,
}

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.neg {
            f.write_str("!")?;
        }
        self.call.fmt(f)
    }
}

/// A rule that does not parse: where (byte offset in the rule) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at column {}: {message}", offset + 1)]
pub struct RuleError {
    /// Byte offset in the rule text.
    pub offset: usize,
    /// What went wrong.
    pub message: String,
}

/// At most this many ANDs after distributing `||` over `&&` (a rule that blows up beyond
/// is refused rather than written as hundreds of routes).
pub const MAX_BRANCHES: usize = 64;

/// Parses a rule.
pub fn parse(text: &str) -> Result<Expr, RuleError> {
    let mut p = Parser { s: text, pos: 0 };
    let e = p.or()?;
    p.ws();
    if p.pos < p.s.len() {
        return Err(p.err("expected && or || or the end of the rule"));
    }
    Ok(e)
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, message: &str) -> RuleError {
        RuleError {
            offset: self.pos,
            message: message.to_string(),
        }
    }

    fn ws(&mut self) {
        while let Some(c) = self.s[self.pos..].chars().next() {
            if !c.is_whitespace() {
                break;
            }
            self.pos += c.len_utf8();
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        if self.s[self.pos..].starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Result<Expr, RuleError> {
        let mut left = self.and()?;
        while self.eat("||") {
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, RuleError> {
        let mut left = self.unary()?;
        while self.eat("&&") {
            let right = self.unary()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, RuleError> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.eat("(") {
            let e = self.or()?;
            if !self.eat(")") {
                return Err(self.err("expected )"));
            }
            return Ok(e);
        }
        self.call()
    }

    fn call(&mut self) -> Result<Expr, RuleError> {
        self.ws();
        let start = self.pos;
        let name_len = self.s[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(self.s.len() - start);
        if name_len == 0 {
            return Err(self.err("expected a matcher such as Host(`example.com`)"));
        }
        let name = self.s[start..start + name_len].to_string();
        self.pos += name_len;
        if !self.eat("(") {
            return Err(self.err(&format!("expected ( after {name}")));
        }
        let mut args = Vec::new();
        if !self.eat(")") {
            loop {
                args.push(self.string()?);
                if self.eat(")") {
                    break;
                }
                if !self.eat(",") {
                    return Err(self.err("expected , or )"));
                }
            }
        }
        Ok(Expr::Call(Call { name, args }))
    }

    /// `` `raw` ``, `"quoted"` (Go escapes `\"`, `\\`, `\n`, `\t`) or `'quoted'`.
    fn string(&mut self) -> Result<String, RuleError> {
        self.ws();
        let quote = match self.s[self.pos..].chars().next() {
            Some(q @ ('`' | '"' | '\'')) => q,
            _ => return Err(self.err("expected a string in backquotes")),
        };
        let start = self.pos;
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.s[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            if c == quote {
                self.pos += i + 1;
                return Ok(out);
            }
            if c == '\\' && quote != '`' {
                match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, 't')) => out.push('\t'),
                    Some((_, e)) => out.push(e),
                    None => break,
                }
                continue;
            }
            out.push(c);
        }
        self.pos = start;
        Err(self.err("unterminated string"))
    }
}

/// Matchers whose several arguments (Traefik v2 syntax: `Host(`a`, `b`)`) mean "any of".
const ANY_OF: &[&str] = &[
    "host",
    "hostheader",
    "hostregexp",
    "path",
    "pathprefix",
    "method",
    "clientip",
    "hostsni",
];

/// The rule as an OR of ANDs of literals (negations pushed down to the calls). `Err` names
/// why when the expansion passes [`MAX_BRANCHES`].
pub fn dnf(e: &Expr) -> Result<Vec<Vec<Lit>>, String> {
    let out = to_dnf(e, false)?;
    Ok(out)
}

fn to_dnf(e: &Expr, neg: bool) -> Result<Vec<Vec<Lit>>, String> {
    match (e, neg) {
        (Expr::Call(c), _) => {
            let lower = c.name.to_ascii_lowercase();
            if c.args.len() > 1 && ANY_OF.contains(&lower.as_str()) {
                // v2's multi-argument form: an OR of one-argument calls.
                let one = |a: &String| {
                    Expr::Call(Call {
                        name: c.name.clone(),
                        args: vec![a.clone()],
                    })
                };
                let mut it = c.args.iter();
                let first = one(it.next().expect("more than one argument"));
                let or = it.fold(first, |acc, a| Expr::Or(Box::new(acc), Box::new(one(a))));
                return to_dnf(&or, neg);
            }
            Ok(vec![vec![Lit {
                neg,
                call: c.clone(),
            }]])
        }
        (Expr::Not(inner), n) => to_dnf(inner, !n),
        (Expr::Or(a, b), false) | (Expr::And(a, b), true) => {
            let mut l = to_dnf(a, neg)?;
            l.extend(to_dnf(b, neg)?);
            check(l)
        }
        (Expr::And(a, b), false) | (Expr::Or(a, b), true) => {
            let l = to_dnf(a, neg)?;
            let r = to_dnf(b, neg)?;
            let mut out = Vec::with_capacity(l.len() * r.len());
            for x in &l {
                for y in &r {
                    let mut c = x.clone();
                    c.extend(y.iter().cloned());
                    out.push(c);
                }
                if out.len() > MAX_BRANCHES {
                    return Err(too_many());
                }
            }
            check(out)
        }
    }
}

fn check(v: Vec<Vec<Lit>>) -> Result<Vec<Vec<Lit>>, String> {
    if v.len() > MAX_BRANCHES {
        return Err(too_many());
    }
    Ok(v)
}

fn too_many() -> String {
    format!("the rule expands to more than {MAX_BRANCHES} combinations of matchers")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(rule: &str) -> Vec<String> {
        let e = parse(rule).unwrap();
        dnf(&e)
            .unwrap()
            .iter()
            .map(|c| {
                c.iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(" & ")
            })
            .collect()
    }

    #[test]
    fn precedence_and_negation() {
        assert_eq!(
            show("Host(`a`) && PathPrefix(`/x`) || Path(\"/y\")"),
            ["Host(`a`) & PathPrefix(`/x`)", "Path(`/y`)"]
        );
        assert_eq!(
            show("Host(`a`) && (PathPrefix(`/x`) || PathPrefix(`/y`))"),
            [
                "Host(`a`) & PathPrefix(`/x`)",
                "Host(`a`) & PathPrefix(`/y`)"
            ]
        );
        assert_eq!(
            show("!(Host(`a`) || Method(`GET`)) && ClientIP(`10.0.0.0/8`)"),
            ["!Host(`a`) & !Method(`GET`) & ClientIP(`10.0.0.0/8`)"]
        );
        assert_eq!(
            show("!(Host(`a`) && Method(`GET`))"),
            ["!Host(`a`)", "!Method(`GET`)"]
        );
    }

    #[test]
    fn v2_lists_are_alternatives() {
        assert_eq!(show("Host(`a`, `b`)"), ["Host(`a`)", "Host(`b`)"]);
        assert_eq!(show("Headers(`K`, `v`)"), ["Headers(`K`, `v`)"]);
    }

    #[test]
    fn errors_name_the_column() {
        let e = parse("Host(`a`) && ").unwrap_err();
        assert_eq!(e.offset, 13);
        assert!(parse("Host(`a`").is_err());
        assert!(parse("Host(`a) ")
            .unwrap_err()
            .message
            .contains("unterminated"));
        assert!(parse("Host(`a`) Path(`/`)").is_err());
        assert_eq!(
            parse("Host()").unwrap(),
            Expr::Call(Call {
                name: "Host".into(),
                args: vec![]
            })
        );
    }

    #[test]
    fn expansion_is_bounded() {
        let big = (0..8)
            .map(|i| format!("(Path(`/{i}a`) || Path(`/{i}b`))"))
            .collect::<Vec<_>>()
            .join(" && ");
        assert!(dnf(&parse(&big).unwrap()).is_err());
    }
}
