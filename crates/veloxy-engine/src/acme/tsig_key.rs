//! TSIG key files for the RFC 2136 provider ([`super::rfc2136`]): BIND's
//! `key "NAME" { algorithm ALG; secret "BASE64"; };` as `tsig-keygen` writes it (comments
//! `#`, `//` and `/* */`, several keys in one file), or the base64 secret alone. Errors name
//! the line, for `veloxy check`.

use base64::Engine as _;

use super::rfc2136::TsigAlg;

/// Why a key file cannot be used (`Display` completes "key_file FILE: ...").
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum KeyFileError {
    #[error("cannot read it: {0}")]
    Unreadable(String),
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("line {line}: the secret is not base64")]
    BadBase64 { line: usize },
    #[error("line {line}: algorithm {name:?} is not supported: use hmac-sha256, hmac-sha384 or hmac-sha512")]
    UnknownAlgorithm { line: usize, name: String },
    #[error("no key {wanted:?} in it (it holds {found})")]
    NoSuchKey { wanted: String, found: String },
    #[error("line {line}: key {key:?} is {file}, but the config says algorithm = {config:?}")]
    AlgorithmMismatch {
        line: usize,
        key: String,
        file: String,
        config: String,
    },
    #[error("the secret is empty")]
    Empty,
}

/// One token of a BIND key file and its line.
fn tokens(text: &str) -> Result<Vec<(usize, String)>, KeyFileError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while let Some(c) = chars.next() {
        match c {
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            '#' => while chars.next_if(|&c| c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'/') => while chars.next_if(|&c| c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                loop {
                    let Some(c) = chars.next() else {
                        return Err(syntax(line, "unterminated /* comment"));
                    };
                    line += usize::from(c == '\n');
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '{' | '}' | ';' => out.push((line, c.to_string())),
            '"' => {
                let start = line;
                let mut s = String::from("\"");
                loop {
                    match chars.next() {
                        None => return Err(syntax(start, "unterminated string")),
                        Some('"') => break,
                        Some(c) => {
                            line += usize::from(c == '\n');
                            s.push(c);
                        }
                    }
                }
                out.push((start, s));
            }
            c => {
                let mut s = c.to_string();
                while let Some(c) = chars.next_if(|c| !c.is_whitespace() && !"{};\"".contains(*c)) {
                    s.push(c);
                }
                out.push((line, s));
            }
        }
    }
    Ok(out)
}

fn syntax(line: usize, message: &str) -> KeyFileError {
    KeyFileError::Syntax {
        line,
        message: message.to_owned(),
    }
}

/// A token's text (a quoted string without its quotes).
fn unquote(t: &str) -> &str {
    t.strip_prefix('"').unwrap_or(t)
}

/// A `key "NAME" { algorithm ALG; secret "BASE64"; };` statement, as read.
struct KeyStatement {
    line: usize,
    name: String,
    algorithm: Option<(usize, String)>,
    secret: Option<(usize, String)>,
}

/// The `key` statements of a BIND key file (other statements are an error: the file is meant
/// to hold keys only, as `tsig-keygen` writes it).
fn key_statements(text: &str) -> Result<Vec<KeyStatement>, KeyFileError> {
    let toks = tokens(text)?;
    let mut it = toks.iter().peekable();
    let mut out = Vec::new();
    let expect = |t: Option<&(usize, String)>, want: &str, line: usize| match t {
        Some((_, s)) if s == want => Ok(()),
        Some((l, s)) => Err(syntax(*l, &format!("expected {want:?}, found {s:?}"))),
        None => Err(syntax(line, &format!("expected {want:?} at the end"))),
    };
    while let Some((line, word)) = it.next() {
        if word != "key" {
            return Err(syntax(*line, &format!("expected `key`, found {word:?}")));
        }
        let Some((_, name)) = it.next() else {
            return Err(syntax(*line, "a key needs a name"));
        };
        expect(it.next(), "{", *line)?;
        let mut k = KeyStatement {
            line: *line,
            name: unquote(name).to_owned(),
            algorithm: None,
            secret: None,
        };
        loop {
            let Some((l, field)) = it.next() else {
                return Err(syntax(*line, "unterminated key statement"));
            };
            if field == "}" {
                break;
            }
            let Some((vl, value)) = it.next() else {
                return Err(syntax(*l, &format!("{field} needs a value")));
            };
            match field.as_str() {
                "algorithm" => k.algorithm = Some((*vl, unquote(value).to_owned())),
                "secret" => k.secret = Some((*vl, unquote(value).to_owned())),
                other => return Err(syntax(*l, &format!("unknown key field {other:?}"))),
            }
            expect(it.next(), ";", *vl)?;
        }
        expect(it.next(), ";", *line)?;
        out.push(k);
    }
    Ok(out)
}

fn same_name(a: &str, b: &str) -> bool {
    a.trim_end_matches('.')
        .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

fn decode(line: usize, b64: &str) -> Result<Vec<u8>, KeyFileError> {
    let clean: String = b64.split_whitespace().collect();
    let secret = base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|_| KeyFileError::BadBase64 { line })?;
    if secret.is_empty() {
        return Err(KeyFileError::Empty);
    }
    Ok(secret)
}

/// The algorithm and secret of `key_name` in a key file: BIND's format, or the base64 secret
/// alone (then `config` or hmac-sha256 is the algorithm).
pub(crate) fn parse_key_file(
    text: &str,
    key_name: &str,
    config: Option<TsigAlg>,
) -> Result<(TsigAlg, Vec<u8>), KeyFileError> {
    let first = tokens(text)?.into_iter().next();
    if first.as_ref().is_none_or(|(_, t)| t != "key") {
        let line = first.map_or(1, |(l, _)| l);
        let secret = decode(line, text)?;
        return Ok((config.unwrap_or(TsigAlg::HmacSha256), secret));
    }
    let keys = key_statements(text)?;
    let Some(k) = keys.iter().find(|k| same_name(&k.name, key_name)) else {
        let names: Vec<String> = keys.iter().map(|k| format!("{:?}", k.name)).collect();
        return Err(KeyFileError::NoSuchKey {
            wanted: key_name.to_owned(),
            found: names.join(", "),
        });
    };
    let file_alg = match &k.algorithm {
        None => None,
        Some((line, name)) => Some(TsigAlg::parse(name).ok_or(KeyFileError::UnknownAlgorithm {
            line: *line,
            name: name.clone(),
        })?),
    };
    let algorithm = match (file_alg, config) {
        (Some(f), Some(c)) if f != c => {
            return Err(KeyFileError::AlgorithmMismatch {
                line: k.algorithm.as_ref().map_or(k.line, |a| a.0),
                key: k.name.clone(),
                file: f.name().into(),
                config: c.name().into(),
            })
        }
        (f, c) => c.or(f).unwrap_or(TsigAlg::HmacSha256),
    };
    let Some((line, b64)) = &k.secret else {
        return Err(syntax(k.line, &format!("key {:?} has no secret", k.name)));
    };
    Ok((algorithm, decode(*line, b64)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYGEN: &str =
        "key \"veloxy-key\" {\n\talgorithm hmac-sha512;\n\tsecret \"c2VjcmV0\";\n};\n";

    #[test]
    fn reads_bind_key_files_and_bare_secrets() {
        let (alg, secret) = parse_key_file(KEYGEN, "veloxy-key.", None).unwrap();
        assert_eq!(
            (alg, secret.as_slice()),
            (TsigAlg::HmacSha512, &b"secret"[..])
        );
        let (alg, secret) = parse_key_file("c2VjcmV0\n", "any", None).unwrap();
        assert_eq!(
            (alg, secret.as_slice()),
            (TsigAlg::HmacSha256, &b"secret"[..])
        );
        let two = format!("# keys\nkey \"other\" {{ algorithm hmac-sha256; secret \"b3RoZXI=\"; }};\n/* x */ {KEYGEN}");
        let (_, secret) = parse_key_file(&two, "VELOXY-KEY", Some(TsigAlg::HmacSha512)).unwrap();
        assert_eq!(secret, b"secret");
    }

    #[test]
    fn key_file_errors_name_the_line() {
        let bad = KEYGEN.replace("c2VjcmV0", "not base64!");
        assert_eq!(
            parse_key_file(&bad, "veloxy-key", None),
            Err(KeyFileError::BadBase64 { line: 3 })
        );
        let md5 = KEYGEN.replace("hmac-sha512", "hmac-md5");
        assert!(matches!(
            parse_key_file(&md5, "veloxy-key", None),
            Err(KeyFileError::UnknownAlgorithm { line: 2, .. })
        ));
        assert!(matches!(
            parse_key_file(KEYGEN, "other", None),
            Err(KeyFileError::NoSuchKey { .. })
        ));
        assert!(matches!(
            parse_key_file(KEYGEN, "veloxy-key", Some(TsigAlg::HmacSha256)),
            Err(KeyFileError::AlgorithmMismatch { line: 2, .. })
        ));
        assert!(matches!(
            parse_key_file("key \"k\" { secret \"c2VjcmV0\" }", "k", None),
            Err(KeyFileError::Syntax { line: 1, .. })
        ));
        assert_eq!(
            parse_key_file("\n\n%%%\n", "k", None),
            Err(KeyFileError::BadBase64 { line: 3 })
        );
    }
}
