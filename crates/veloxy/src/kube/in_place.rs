//! Endpoint changes applied in place. Most changes a cluster makes are to EndpointSlices: a
//! pod starts, stops or turns unready, and only the `servers` of the upstream groups the
//! Services became change. The merged config is therefore kept in two parts: its structure
//! (everything but the groups' `servers`, fingerprinted as rendered) and each group's
//! servers. When a build's structure is the one running, the groups whose servers differ get
//! their new sets through [`veloxy_engine::Running::set_servers`] (the runtime API's path:
//! backends that stay keep health and pooled connections), with no compile and no swap of
//! routes. Anything else (a route, a group added or gone, a server entry other than a plain
//! address with an optional weight) takes a full build, which carries the same sets.

use std::collections::BTreeMap;

use toml::{Table, Value};

/// A group's servers as `(address, weight)`, or `None` when an entry is more than that
/// (`dns`, `backup`, ...): such a group changes only through a full build.
pub(super) type Plain = Option<Vec<(String, u32)>>;

/// New server sets by group name.
pub(super) type Sets = Vec<(String, Vec<(String, u32)>)>;

/// The `servers` of every upstream group of a merged config, taken out of it.
#[derive(Default)]
pub(super) struct Servers {
    /// By group name: the value as it was in the table.
    values: BTreeMap<String, Value>,
    /// By group name: the plain form.
    pub plain: BTreeMap<String, Plain>,
    /// By group name: the value as text, for the fingerprint (rendered once per change: an
    /// endpoint-only change fingerprints every group again).
    text: BTreeMap<String, String>,
}

impl Servers {
    /// Takes the `servers` of every `[upstreams.NAME]` out of `table`.
    pub fn take(table: &mut Table) -> Servers {
        let mut out = Servers::default();
        let Some(Value::Table(groups)) = table.get_mut("upstreams") else {
            return out;
        };
        for (name, group) in groups.iter_mut() {
            let Some(servers) = group.as_table_mut().and_then(|g| g.remove("servers")) else {
                continue;
            };
            out.plain.insert(name.clone(), plain(&servers));
            out.text.insert(name.clone(), servers.to_string());
            out.values.insert(name.clone(), servers);
        }
        out
    }

    /// `table` (as [`Servers::take`] left it) with the servers back in.
    pub fn put_back(&self, table: &Table) -> Table {
        let mut table = table.clone();
        if let Some(Value::Table(groups)) = table.get_mut("upstreams") {
            for (name, servers) in &self.values {
                if let Some(g) = groups.get_mut(name).and_then(Value::as_table_mut) {
                    g.insert("servers".into(), servers.clone());
                }
            }
        }
        table
    }

    /// A group's servers value.
    pub fn value(&self, group: &str) -> Option<&Value> {
        self.values.get(group)
    }

    /// Sets a group's servers (a group of the table taken).
    pub fn set(&mut self, group: &str, servers: Value) {
        self.plain.insert(group.to_string(), plain(&servers));
        self.text.insert(group.to_string(), servers.to_string());
        self.values.insert(group.to_string(), servers);
    }

    /// Feeds the servers to a fingerprint.
    pub fn hash(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash as _;
        for (name, text) in &self.text {
            name.hash(h);
            text.hash(h);
        }
    }
}

/// The plain form of a group's `servers`.
pub(super) fn plain(servers: &Value) -> Plain {
    let list = servers.as_array()?;
    list.iter()
        .map(|e| match e {
            Value::String(a) => plain_addr(a).map(|a| (a, 1)),
            Value::Table(t) if t.keys().all(|k| k == "addr" || k == "weight") => {
                let addr = plain_addr(t.get("addr")?.as_str()?)?;
                let weight = match t.get("weight") {
                    None => 1,
                    Some(w) => u32::try_from(w.as_integer()?).ok().filter(|w| *w > 0)?,
                };
                Some((addr, weight))
            }
            _ => None,
        })
        .collect()
}

/// An address the runtime path takes as the compile would: `[https://]host:port`, not a
/// Unix socket.
fn plain_addr(a: &str) -> Option<String> {
    (!a.starts_with("unix:")).then(|| a.to_string())
}

/// The groups whose servers differ between `running` and `next` (same structure, so the
/// same groups), or `None` when one of them needs a full build.
pub(super) fn changes(
    running: &BTreeMap<String, Plain>,
    next: &BTreeMap<String, Plain>,
) -> Option<Sets> {
    if running.len() != next.len() {
        return None;
    }
    let mut out = Vec::new();
    for (name, want) in next {
        let have = running.get(name)?;
        if have == want {
            continue;
        }
        match (have, want) {
            (Some(_), Some(w)) if !w.is_empty() => out.push((name.clone(), w.clone())),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn servers_come_out_and_go_back() {
        let mut t = table(
            "[upstreams.a]\nservers = [\"192.0.2.10:80\", { addr = \"192.0.2.11:80\", weight = 3 }]\n\
             [upstreams.b]\nservers = [{ dns = \"x.svc:80\" }]\n[upstreams.c]\npolicy = \"random\"\n",
        );
        let before = t.clone();
        let s = Servers::take(&mut t);
        assert!(t["upstreams"]["a"].get("servers").is_none());
        assert_eq!(
            s.plain["a"],
            Some(vec![
                ("192.0.2.10:80".into(), 1),
                ("192.0.2.11:80".into(), 3)
            ])
        );
        assert_eq!(s.plain["b"], None);
        assert!(!s.plain.contains_key("c"));
        assert_eq!(s.put_back(&t), before);
    }

    #[test]
    fn only_plain_changes_go_in_place() {
        let p = |a: &str| Some(vec![(a.to_string(), 1)]);
        let running: BTreeMap<String, Plain> =
            [("a".into(), p("192.0.2.10:80")), ("b".into(), None)].into();
        let mut next = running.clone();
        assert_eq!(changes(&running, &next), Some(vec![]));
        next.insert("a".into(), p("192.0.2.11:80"));
        assert_eq!(
            changes(&running, &next),
            Some(vec![("a".into(), vec![("192.0.2.11:80".into(), 1)])])
        );
        next.insert("a".into(), Some(vec![]));
        assert_eq!(
            changes(&running, &next),
            None,
            "an empty set is a full build"
        );
        next.insert("a".into(), p("192.0.2.10:80"));
        next.insert("b".into(), p("192.0.2.12:80"));
        assert_eq!(
            changes(&running, &next),
            None,
            "a dns group changes by a build"
        );
    }
}
