//! The set of config keys veloxy accepts, read from veloxy's own parser.
//!
//! Why probing rather than a schema: the file's serde structs (`config::file`, private to the
//! engine) deny unknown keys, and serde's refusal names every key the table accepts:
//! ``unknown field `zzz_probe`, expected one of `addr`, `weight`, ...``. So this module loads
//! tiny configs through the public `veloxy_engine::load_file`, each putting the key
//! `zzz_probe` into one table, and reads the accepted keys off the error. It then probes each
//! accepted key as a table (`k = { zzz_probe = 1 }`), an array of tables
//! (`k = [{ zzz_probe = 1 }]`) and a map of named tables (`k = { n = { zzz_probe = 1 } }`)
//! to find the nested tables and walk them. Unlike a `schemars` derive or parsing `file.rs`
//! with `syn`, this sees exactly what the parser accepts, including the hand-written
//! `Deserialize` impls (a server entry's `addr`/`dns`/`srv`/...), `#[serde(rename)]`s and
//! keys added anywhere, and needs no change to the engine. Parsing happens before any
//! validation, so the probes need no valid surrounding config. The walk takes a few hundred
//! in-process loads (well under a second).
//!
//! Key paths are the table keys joined by `.`, without map names or array positions:
//! `listeners.tls.certs.hosts`, `upstreams.servers.weight`, `routes.cache.key`.
//!
//! A table whose key list equals one seen before (a route's `cache` inside a
//! `[rule_sets.NAME]`, an upstream group's `health` inside `[upstream_defaults]`) is the same
//! structure documented once: its keys are in [`Accepted::all`] but not required again. The
//! top-level sections are walked in file order except `rule_sets` and `upstream_defaults`,
//! last, because they reuse the tables of `routes` and `upstreams`, whose entries are the
//! reference's.

use std::collections::{BTreeSet, HashSet};

/// What the walk found.
#[derive(Debug, Default)]
pub struct Accepted {
    /// Every accepted key path.
    pub all: BTreeSet<String>,
    /// The paths the reference must have an entry for (`all` minus repeated tables' keys).
    pub required: BTreeSet<String>,
}

/// Where a probe puts its table, as steps from the top of the file.
#[derive(Clone, Debug)]
enum Step {
    /// A key of the enclosing table.
    Key(String),
    /// A named entry of a map of tables (`[listeners.NAME]`).
    Map,
    /// An entry of an array of tables (`[[routes]]`).
    Array,
}

const PROBE: &str = "zzz_probe";

/// A config with the probe key in the table at `steps`, as inline TOML.
fn probe_config(steps: &[Step]) -> String {
    let Some((Step::Key(first), rest)) = steps.split_first() else {
        assert!(steps.is_empty(), "a probe starts with a key: {steps:?}");
        return format!("{PROBE} = 1\n");
    };
    let mut value = format!("{{ {PROBE} = 1 }}");
    for step in rest.iter().rev() {
        value = match step {
            Step::Key(k) => format!("{{ {k} = {value} }}"),
            Step::Map => format!("{{ n = {value} }}"),
            Step::Array => format!("[ {value} ]"),
        };
    }
    format!("{first} = {value}\n")
}

/// Loads probe configs through veloxy's parser, in one temp file.
struct Prober {
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
    loads: usize,
}

impl Prober {
    /// The keys of the table at `steps`, or `None` when nothing there is a table of keys.
    fn keys_at(&mut self, steps: &[Step]) -> Option<Vec<String>> {
        std::fs::write(&self.file, probe_config(steps)).unwrap();
        self.loads += 1;
        let message = match veloxy_engine::load_file(&self.file) {
            Ok(_) => return None,
            Err(e) => e.to_string(),
        };
        let marker = format!("unknown field `{PROBE}`");
        let rest = &message[message.find(&marker)? + marker.len()..];
        // "expected one of `a`, `b`", "expected `a`" or "there are no fields".
        let keys: Vec<String> = rest
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        Some(keys)
    }
}

/// Walks every table veloxy's config parser accepts, from the top of the file.
pub fn accepted_keys() -> Accepted {
    let dir = tempfile::tempdir().unwrap();
    let mut prober = Prober {
        file: dir.path().join("probe.toml"),
        _dir: dir,
        loads: 0,
    };
    let mut top = prober
        .keys_at(&[])
        .expect("the top of the config refuses unknown keys, naming the accepted ones");
    for copy in ["rule_sets", "upstream_defaults"] {
        if let Some(i) = top.iter().position(|k| k == copy) {
            let k = top.remove(i);
            top.push(k);
        }
    }
    let mut walk = Walk {
        prober,
        seen: HashSet::new(),
        out: Accepted::default(),
    };
    walk.table(&[], "", top);
    assert!(walk.prober.loads < 5000, "runaway key walk");
    walk.out
}

struct Walk {
    prober: Prober,
    /// Key lists of the tables seen so far.
    seen: HashSet<Vec<String>>,
    out: Accepted,
}

impl Walk {
    fn table(&mut self, steps: &[Step], path: &str, keys: Vec<String>) {
        let repeated = !self.seen.insert(keys.clone());
        for key in keys {
            let key_path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            self.out.all.insert(key_path.clone());
            if !repeated {
                self.out.required.insert(key_path.clone());
            }
            let mut at = steps.to_vec();
            at.push(Step::Key(key));
            for shape in [None, Some(Step::Array), Some(Step::Map)] {
                let mut probe = at.clone();
                probe.extend(shape);
                if let Some(inner) = self.prober.keys_at(&probe) {
                    self.table(&probe, &key_path, inner);
                    break;
                }
            }
        }
    }
}
