//! A located document tree for the YAML, JSON and TOML inputs (Traefik, Envoy, Kubernetes,
//! docker-compose): every node knows its `FILE:LINE:COL`, so a report line can point at the
//! key it is about.
//!
//! YAML (and JSON, a subset of it) is read with `yaml-rust2`'s event parser, the one
//! maintained YAML 1.2 crate that reports positions; aliases are expanded and merge keys
//! (`<<: *base`) applied, as docker-compose files use them. TOML is read with `toml_edit`,
//! whose items carry byte spans.

use std::sync::Arc;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::source::{Loc, ParseError};

/// A value and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Where the value starts.
    pub loc: Loc,
    /// The value.
    pub value: Value,
}

/// A map key and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The key as text.
    pub name: String,
    /// Where the key is.
    pub loc: Loc,
}

/// A document value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`, `~` or nothing.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (quoted, or plain text that is no other type).
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, keys in document order.
    Map(Vec<(Key, Node)>),
}

impl Node {
    /// The value under `key` of a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(_, v)| v)
    }

    /// A string value (not a number or boolean written plain).
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Any scalar as text (`8080`, `true`, `x`); `None` for null, sequences and maps.
    pub fn scalar(&self) -> Option<String> {
        match &self.value {
            Value::Str(s) => Some(s.clone()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// The items of a sequence.
    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// The entries of a mapping.
    pub fn as_map(&self) -> Option<&[(Key, Node)]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    /// A boolean (also the strings `"true"` and `"false"`, as Kubernetes annotations are).
    pub fn as_bool(&self) -> Option<bool> {
        match &self.value {
            Value::Bool(b) => Some(*b),
            Value::Str(s) if s.eq_ignore_ascii_case("true") => Some(true),
            Value::Str(s) if s.eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        }
    }

    /// An integer (also a string of digits).
    pub fn as_i64(&self) -> Option<i64> {
        match &self.value {
            Value::Int(i) => Some(*i),
            Value::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// Whether this is null.
    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }
}

/// Every document of a YAML (or JSON) stream.
pub fn parse_yaml(file: &Arc<str>, text: &str) -> Result<Vec<Node>, ParseError> {
    let mut b = Builder {
        file: file.clone(),
        docs: Vec::new(),
        stack: Vec::new(),
        anchors: Vec::new(),
        error: None,
    };
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut b, true).map_err(|e| {
        let m = e.marker();
        ParseError::new(
            Loc::new(file, m.line().max(1) as u32, m.col() as u32 + 1),
            e.info().to_string(),
        )
    })?;
    if let Some(e) = b.error {
        return Err(e);
    }
    Ok(b.docs)
}

/// A TOML document.
pub fn parse_toml(file: &Arc<str>, text: &str) -> Result<Node, ParseError> {
    let doc = toml_edit::ImDocument::parse(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        ParseError::new(
            Loc::at_offset(file, text, at),
            e.message().trim().to_string(),
        )
    })?;
    let loc = Loc::new(file, 1, 1);
    Ok(toml_table(file, text, doc.as_table(), loc))
}

fn toml_table(file: &Arc<str>, text: &str, t: &dyn toml_edit::TableLike, loc: Loc) -> Node {
    let mut entries = Vec::new();
    for (k, item) in t.iter() {
        let key_at = t
            .key(k)
            .and_then(|k| k.span())
            .map_or_else(|| loc.clone(), |s| Loc::at_offset(file, text, s.start));
        let node = toml_item(file, text, item, key_at.clone());
        entries.push((
            Key {
                name: k.to_string(),
                loc: key_at,
            },
            node,
        ));
    }
    Node {
        loc,
        value: Value::Map(entries),
    }
}

fn toml_item(file: &Arc<str>, text: &str, item: &toml_edit::Item, fallback: Loc) -> Node {
    let at = |span: Option<std::ops::Range<usize>>| {
        span.map_or_else(|| fallback.clone(), |s| Loc::at_offset(file, text, s.start))
    };
    match item {
        toml_edit::Item::None => Node {
            loc: fallback,
            value: Value::Null,
        },
        toml_edit::Item::Table(t) => toml_table(file, text, t, at(t.span())),
        toml_edit::Item::ArrayOfTables(a) => Node {
            loc: at(a.span()),
            value: Value::Seq(
                a.iter()
                    .map(|t| toml_table(file, text, t, at(t.span())))
                    .collect(),
            ),
        },
        toml_edit::Item::Value(v) => toml_value(file, text, v, fallback),
    }
}

fn toml_value(file: &Arc<str>, text: &str, v: &toml_edit::Value, fallback: Loc) -> Node {
    let loc = v
        .span()
        .map_or(fallback, |s| Loc::at_offset(file, text, s.start));
    let value = match v {
        toml_edit::Value::String(s) => Value::Str(s.value().clone()),
        toml_edit::Value::Integer(i) => Value::Int(*i.value()),
        toml_edit::Value::Float(f) => Value::Float(*f.value()),
        toml_edit::Value::Boolean(b) => Value::Bool(*b.value()),
        toml_edit::Value::Datetime(d) => Value::Str(d.value().to_string()),
        toml_edit::Value::Array(a) => Value::Seq(
            a.iter()
                .map(|x| toml_value(file, text, x, loc.clone()))
                .collect(),
        ),
        toml_edit::Value::InlineTable(t) => return toml_table(file, text, t, loc),
    };
    Node { loc, value }
}

/// Builds nodes from the parser's events.
struct Builder {
    file: Arc<str>,
    docs: Vec<Node>,
    /// Open collections: the node, its anchor, and for maps a key waiting for its value.
    stack: Vec<(Node, usize, Option<Key>)>,
    anchors: Vec<(usize, Node)>,
    error: Option<ParseError>,
}

impl Builder {
    fn loc(&self, m: Marker) -> Loc {
        Loc::new(&self.file, m.line().max(1) as u32, m.col() as u32 + 1)
    }

    /// Places a finished node into its parent (or as a document).
    fn push(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.push((anchor, node.clone()));
        }
        let Some((parent, _, pending)) = self.stack.last_mut() else {
            self.docs.push(node);
            return;
        };
        match &mut parent.value {
            Value::Seq(items) => items.push(node),
            Value::Map(entries) => match pending.take() {
                None => {
                    let name = node.scalar().unwrap_or_default();
                    *pending = Some(Key {
                        name,
                        loc: node.loc,
                    });
                }
                Some(k) if k.name == "<<" => merge(entries, node),
                // An explicit key wins over one a merge key brought in earlier.
                Some(k) => match entries.iter_mut().find(|(e, _)| e.name == k.name) {
                    Some(slot) => *slot = (k, node),
                    None => entries.push((k, node)),
                },
            },
            _ => {}
        }
    }
}

/// A merge key: the entries of `from` (a map, or a list of maps) that `into` lacks.
fn merge(into: &mut Vec<(Key, Node)>, from: Node) {
    let maps: Vec<Node> = match from.value {
        Value::Seq(items) => items,
        _ => vec![from],
    };
    for m in maps {
        if let Value::Map(entries) = m.value {
            for (k, v) in entries {
                if !into.iter().any(|(e, _)| e.name == k.name) {
                    into.push((k, v));
                }
            }
        }
    }
}

/// A plain scalar's type, YAML 1.2 core schema.
fn plain(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Value::Int(i);
    }
    if s.contains(['.', 'e', 'E'])
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '.')
    {
        if let Ok(f) = s.parse::<f64>() {
            return Value::Float(f);
        }
    }
    Value::Str(s.to_string())
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let loc = self.loc(mark);
        match ev {
            Event::Scalar(s, style, anchor, _tag) => {
                let value = match style {
                    TScalarStyle::Plain => plain(&s),
                    _ => Value::Str(s),
                };
                self.push(Node { loc, value }, anchor);
            }
            Event::SequenceStart(anchor, _) => {
                let node = Node {
                    loc,
                    value: Value::Seq(Vec::new()),
                };
                self.stack.push((node, anchor, None));
            }
            Event::MappingStart(anchor, _) => {
                let node = Node {
                    loc,
                    value: Value::Map(Vec::new()),
                };
                self.stack.push((node, anchor, None));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, anchor, _)) = self.stack.pop() {
                    self.push(node, anchor);
                }
            }
            Event::Alias(id) => match self.anchors.iter().rev().find(|(a, _)| *a == id) {
                Some((_, n)) => {
                    let n = n.clone();
                    self.push(n, 0);
                }
                None => {
                    self.error
                        .get_or_insert(ParseError::new(loc, "alias to an unknown anchor"));
                }
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_with_locations_aliases_and_merges() {
        let f: Arc<str> = "a.yaml".into();
        let text = "base: &b\n  port: 80\n  name: x\nsvc:\n  <<: *b\n  name: y\n  list: [1, \"2\", true]\n---\nkind: Ingress\n";
        let docs = parse_yaml(&f, text).unwrap();
        assert_eq!(docs.len(), 2);
        let svc = docs[0].get("svc").unwrap();
        assert_eq!(svc.get("name").unwrap().as_str(), Some("y"));
        assert_eq!(svc.get("port").unwrap().as_i64(), Some(80));
        let list = svc.get("list").unwrap().as_seq().unwrap();
        assert_eq!(list[1].as_str(), Some("2"));
        assert_eq!(list[2].as_bool(), Some(true));
        let key = &docs[0].as_map().unwrap()[1].0;
        assert_eq!(
            (key.name.as_str(), key.loc.to_string()),
            ("svc", "a.yaml:4:1".into())
        );
        assert_eq!(svc.get("name").unwrap().loc.to_string(), "a.yaml:6:9");
        assert_eq!(docs[1].get("kind").unwrap().as_str(), Some("Ingress"));
    }

    #[test]
    fn yaml_errors_are_located() {
        let f: Arc<str> = "b.yaml".into();
        let e = parse_yaml(&f, "a: [1, 2\nb: c\n").unwrap_err();
        assert!(e.to_string().starts_with("b.yaml:"), "{e}");
    }

    #[test]
    fn toml_with_locations() {
        let f: Arc<str> = "t.toml".into();
        let text =
            "[http.routers.web]\nrule = \"Host(`a`)\"\nentryPoints = [\"web\"]\n[[x]]\ny = 1\n";
        let n = parse_toml(&f, text).unwrap();
        let web = n
            .get("http")
            .unwrap()
            .get("routers")
            .unwrap()
            .get("web")
            .unwrap();
        let rule = web.get("rule").unwrap();
        assert_eq!(rule.as_str(), Some("Host(`a`)"));
        assert_eq!(rule.loc.to_string(), "t.toml:2:8");
        assert_eq!(
            n.get("x").unwrap().as_seq().unwrap()[0]
                .get("y")
                .unwrap()
                .as_i64(),
            Some(1)
        );
        assert!(parse_toml(&f, "a = \n")
            .unwrap_err()
            .to_string()
            .starts_with("t.toml:1:"));
    }
}
