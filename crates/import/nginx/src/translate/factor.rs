//! Rule sets: rule keys that every route of a server shares (nginx's server-level
//! `add_header`, `client_max_body_size`, `allow`...) are written once in `[rule_sets.NAME]`
//! and named by `use = ["NAME"]`, so the output does not repeat them route by route.

use toml::Value;
use veloxy_import::{Config, Section};

/// Keys a rule set may hold.
const RULE_KEYS: &[&str] = &[
    "request_headers",
    "response_headers",
    "error_pages",
    "max_body_bytes",
    "allow",
    "deny",
    "basic_auth",
    "rate_limit",
    "cache",
];

/// A route's rule keys and values.
type Signature = Vec<(String, Value)>;

/// Moves the rule keys of routes with the same rules into rule sets, where that makes the
/// output shorter.
pub fn rule_sets(cfg: &mut Config) {
    let mut groups: Vec<(Signature, Vec<usize>)> = Vec::new();
    for (i, r) in cfg.routes.iter().enumerate() {
        let sig: Vec<(String, Value)> = RULE_KEYS
            .iter()
            .filter_map(|k| r.get(k).map(|v| (k.to_string(), v.clone())))
            .collect();
        if sig.is_empty() {
            continue;
        }
        match groups.iter_mut().find(|(k, _)| *k == sig) {
            Some((_, v)) => v.push(i),
            None => groups.push((sig, vec![i])),
        }
    }
    for (shared, idx) in groups {
        // Lines saved: the keys written once instead of per route, less a `use` line per
        // route and the set's header, comment and blank line.
        let saved = shared.len() * (idx.len() - 1);
        if saved <= idx.len() + 3 {
            continue;
        }
        let first = &cfg.routes[idx[0]];
        let base = match first.get("host") {
            Some(Value::String(h)) => h.trim_start_matches("*.").to_string(),
            Some(Value::Array(a)) => a
                .first()
                .and_then(|h| h.as_str())
                .unwrap_or("site")
                .trim_start_matches("*.")
                .to_string(),
            _ => "default".to_string(),
        };
        let name = Config::unique(&cfg.rule_sets, &base);
        let mut s = Section {
            from: first.from.clone(),
            ..Default::default()
        };
        s.keys = shared.clone();
        cfg.rule_sets.push((name.clone(), s));
        for &i in &idx {
            let r: &mut Section = &mut cfg.routes[i];
            for (k, _) in &shared {
                r.remove(k);
            }
            r.set("use", Value::Array(vec![Value::from(name.as_str())]));
        }
    }
}
