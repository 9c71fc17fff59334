//! `request_headers_to_add/remove` and `response_headers_to_add/remove` at the route, the
//! virtual host and the route configuration: Envoy applies every level (the route's first,
//! the route configuration's last, so its `set` wins), unlike nginx where a level's own list
//! replaces its parent's. Each route gets the levels folded into one veloxy rule.

use toml::{Table, Value};
use veloxy_import::tree::Node;

use super::Ctx;
use crate::util::{header_value, seq, Fields};

/// One header edit.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Replace the field.
    Set(String, String),
    /// Append a value.
    Add(String, String),
    /// Remove the field.
    Remove(String),
}

/// The edits of one level.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mutations {
    /// On the request sent upstream.
    pub req: Vec<Op>,
    /// On the answer.
    pub resp: Vec<Op>,
}

/// Takes a level's four header fields from `f`, reporting each entry.
pub fn read(ctx: &mut Ctx, f: &mut Fields) -> Mutations {
    let mut m = Mutations::default();
    for (key, resp) in [
        ("request_headers_to_add", false),
        ("response_headers_to_add", true),
    ] {
        if let Some((_, list)) = f.take(key) {
            for item in seq(list) {
                if let Some(op) = add(ctx, key, item) {
                    if resp {
                        m.resp.push(op)
                    } else {
                        m.req.push(op)
                    }
                }
            }
        }
    }
    for (key, resp) in [
        ("request_headers_to_remove", false),
        ("response_headers_to_remove", true),
    ] {
        if let Some((_, list)) = f.take(key) {
            for item in seq(list) {
                let name = item.scalar().unwrap_or_default();
                let op = Op::Remove(name);
                if resp {
                    m.resp.push(op)
                } else {
                    m.req.push(op)
                }
                ctx.r.translated(&item.loc, key);
            }
        }
    }
    m
}

/// One `HeaderValueOption`.
fn add(ctx: &mut Ctx, key: &str, item: &Node) -> Option<Op> {
    let h = item.get("header").unwrap_or(item);
    let name = h.get("key").and_then(|k| k.scalar()).unwrap_or_default();
    let raw = h.get("value").and_then(|v| v.scalar()).unwrap_or_default();
    let d = format!("{key}.{name}");
    let value = match header_value(&raw) {
        Ok(v) => v,
        Err(cmd) => {
            ctx.r.refused(
                &item.loc,
                d,
                format!("the value uses {cmd}, which veloxy has no template for"),
            );
            return None;
        }
    };
    let action = item
        .get("append_action")
        .and_then(crate::util::enum_name)
        .unwrap_or_else(|| {
            match item.get("append").and_then(|a| a.as_bool()) {
                Some(false) => "OVERWRITE_IF_EXISTS_OR_ADD",
                _ => "APPEND_IF_EXISTS_OR_ADD",
            }
            .to_string()
        });
    let op = match action.as_str() {
        "APPEND_IF_EXISTS_OR_ADD" => Op::Add(name, value),
        "OVERWRITE_IF_EXISTS_OR_ADD" => Op::Set(name, value),
        other => {
            ctx.r.refused(
                &item.loc,
                d,
                format!("{other}: veloxy sets or appends a field, never only if absent or present"),
            );
            return None;
        }
    };
    ctx.r.translated(&item.loc, d);
    Some(op)
}

/// The levels folded, most specific first (route, virtual host, route configuration), into
/// veloxy's `request_headers` and `response_headers`.
pub fn fold(levels: &[&Mutations], rules: &mut Table) {
    let req: Vec<&Op> = levels.iter().flat_map(|l| l.req.iter()).collect();
    let resp: Vec<&Op> = levels.iter().flat_map(|l| l.resp.iter()).collect();
    if let Some(t) = fold_ops(&req) {
        rules.insert("request_headers".into(), Value::Table(t));
    }
    if let Some(t) = fold_ops(&resp) {
        rules.insert("response_headers".into(), Value::Table(t));
    }
}

fn fold_ops(ops: &[&Op]) -> Option<Table> {
    if ops.is_empty() {
        return None;
    }
    let mut set = Table::new();
    let mut add = Table::new();
    let mut remove: Vec<String> = Vec::new();
    for op in ops {
        match op {
            Op::Set(n, v) => {
                add.remove(n);
                set.insert(n.clone(), v.clone().into());
            }
            Op::Add(n, v) => {
                if !set.contains_key(n) && !add.contains_key(n) {
                    add.insert(n.clone(), v.clone().into());
                }
            }
            Op::Remove(n) => {
                if !remove.contains(n) {
                    remove.push(n.clone());
                }
            }
        }
    }
    let mut t = Table::new();
    if !set.is_empty() {
        t.insert("set".into(), Value::Table(set));
    }
    if !add.is_empty() {
        t.insert("add".into(), Value::Table(add));
    }
    if !remove.is_empty() {
        t.insert(
            "remove".into(),
            Value::Array(remove.into_iter().map(Value::from).collect()),
        );
    }
    Some(t)
}
