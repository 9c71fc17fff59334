//! Rule sets: rule keys (HAProxy's frontend-wide `http-request set-header`, `http-response`
//! headers, address rules, basic auth...) that several routes of a frontend carry with the same
//! value are written once in `[rule_sets.NAME]` and named by `use = ["NAME", ...]`.
//!
//! veloxy fills a key a route does not set from its sets, in order; a route is given a set
//! only when it carries every key of that set with the set's value, so no route gains a rule.

use std::collections::BTreeSet;

use toml::Value;
use veloxy_import::model::{inline, key};
use veloxy_import::{Config, Loc, Section};

/// Route keys a rule set may hold.
const RULE_KEYS: &[&str] = &[
    "request_headers",
    "response_headers",
    "error_pages",
    "max_body_bytes",
    "location_rewrite",
    "allow",
    "deny",
    "basic_auth",
    "cors",
    "forward_auth",
    "rate_limit",
    "compress",
    "max_concurrency",
    "queue",
    "queue_timeout",
    "cache",
];

/// A rule set's keys and values.
type Keys = Vec<(String, Value)>;

/// The characters of `[rule_sets.NAME]` with its `# from` and comment lines and a blank line.
const SET_COST: usize = 90;

/// Moves the rule keys routes `first..` of `cfg` (one frontend's) share into rule sets named
/// after `frontend`, where that makes the output shorter. `from`: the frontend's line.
pub fn rule_sets(cfg: &mut Config, first: usize, frontend: &str, from: &Loc) {
    let routes = &cfg.routes[first..];
    // Each (key, value) pair and the routes that carry it.
    let mut pairs: Vec<((String, Value), BTreeSet<usize>)> = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        for (k, v) in r
            .keys
            .iter()
            .filter(|(k, _)| RULE_KEYS.contains(&k.as_str()))
        {
            match pairs.iter_mut().find(|((pk, pv), _)| pk == k && pv == v) {
                Some((_, set)) => {
                    set.insert(i);
                }
                None => pairs.push(((k.clone(), v.clone()), BTreeSet::from([i]))),
            }
        }
    }
    // Pairs carried by the same routes form one candidate set.
    let mut candidates: Vec<(Keys, BTreeSet<usize>)> = Vec::new();
    for (pair, set) in pairs.into_iter().filter(|(_, s)| s.len() > 1) {
        match candidates.iter_mut().find(|(_, s)| *s == set) {
            Some((keys, _)) => keys.push(pair),
            None => candidates.push((vec![pair], set)),
        }
    }
    let saving = |keys: &[(String, Value)], n: usize, name: &str| -> isize {
        let line: usize = keys
            .iter()
            .map(|(k, v)| key(k).len() + 4 + inline(v).len())
            .sum();
        let use_line = 12 + name.len();
        (line * (n - 1)) as isize - (n * use_line) as isize - SET_COST as isize
    };
    candidates.sort_by_key(|(keys, set)| -saving(keys, set.len(), frontend));
    for (keys, set) in candidates {
        let name = Config::unique(&cfg.rule_sets, &veloxy_import::model::sanitize(frontend));
        if saving(&keys, set.len(), &name) <= 0 {
            continue;
        }
        let mut s = Section::from(from);
        s.comments
            .push(format!("rules shared by routes of frontend {frontend}"));
        s.keys = keys.clone();
        cfg.rule_sets.push((name.clone(), s));
        for i in set {
            let r: &mut Section = &mut cfg.routes[first + i];
            for (k, _) in &keys {
                r.remove(k);
            }
            let mut uses = match r.remove("use") {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            uses.push(Value::from(name.as_str()));
            r.set("use", Value::Array(uses));
        }
    }
}
