//! `layered_runtime`: Envoy's runtime values.
//!
//! A static layer's nested keys are flattened the way Envoy does (`a: {b: 1}` is `a.b`), and
//! each value gets its own report line: the few veloxy has an equivalent of are translated,
//! the ones that change nothing a client or backend sees (load-time checks, limits for
//! listeners this config does not define) are ignored with why, and every other override is
//! refused by name. Layers that hold nothing at start (an empty static layer, the admin layer)
//! are ignored.

use veloxy_import::tree::{Node, Value};
use veloxy_import::Loc;

use super::Ctx;
use crate::util::seq;

/// One runtime value of a static layer: its dotted key, where the key is, the value.
struct Entry<'a> {
    key: String,
    loc: &'a Loc,
    value: &'a Node,
}

/// Translates `layered_runtime`.
pub fn layered_runtime(ctx: &mut Ctx, loc: &Loc, lr: &Node) {
    let layers = seq(lr.get("layers").unwrap_or(lr));
    let mut entries = Vec::new();
    let mut others = false;
    for layer in layers {
        if let Some(s) = layer.get("static_layer") {
            flatten(s, "", &mut entries);
        } else if layer.get("admin_layer").is_some() {
            others = true;
            ctx.r.ignored(
                &layer.loc,
                "layered_runtime.admin_layer",
                "values set at run time through Envoy's admin /runtime_modify: none at start",
            );
        } else if let Some(d) = layer.get("disk_layer") {
            others = true;
            let root = d
                .get("symlink_root")
                .and_then(|r| r.scalar())
                .unwrap_or_default();
            ctx.r.refused(
                &layer.loc,
                "layered_runtime.disk_layer",
                format!(
                    "runtime overrides read from the directory {root} (not in the input): \
                     veloxy has no runtime layer; write the values into a static_layer to \
                     have them checked"
                ),
            );
        } else if layer.get("rtds_layer").is_some() {
            others = true;
            ctx.r.refused(
                &layer.loc,
                "layered_runtime.rtds_layer",
                "runtime overrides from RTDS (xDS): veloxy reads a static file",
            );
        }
    }
    if entries.is_empty() && !others {
        ctx.r.ignored(
            loc,
            "layered_runtime",
            "runtime layers without values: no override is in effect",
        );
        return;
    }
    ctx.r.ignored(
        loc,
        "layered_runtime",
        "the layer list itself (each layer or value has its own line)",
    );
    for e in entries {
        value(ctx, loc, &e);
    }
}

/// Flattens a static layer: nested maps join their keys with dots; a map with `numerator`
/// is a fractional percent, one value.
fn flatten<'a>(n: &'a Node, prefix: &str, out: &mut Vec<Entry<'a>>) {
    for (k, v) in n.as_map().unwrap_or(&[]) {
        let key = if prefix.is_empty() {
            k.name.clone()
        } else {
            format!("{prefix}.{}", k.name)
        };
        match &v.value {
            Value::Map(m) if !m.iter().any(|(k, _)| k.name == "numerator") => flatten(v, &key, out),
            _ => out.push(Entry {
                key,
                loc: &k.loc,
                value: v,
            }),
        }
    }
}

/// One runtime value.
fn value(ctx: &mut Ctx, loc: &Loc, e: &Entry) {
    let d = format!("layered_runtime.static_layer.{}", e.key);
    let shown = e.value.scalar().unwrap_or_else(|| "{...}".into());
    if e.key == "overload.global_downstream_max_connections" {
        if let Some(n) = e.value.as_i64() {
            let names: Vec<String> = ctx.cfg.listeners.iter().map(|(n, _)| n.clone()).collect();
            for l in names {
                ctx.cfg.listener(&l, loc).set("max_connections", n);
            }
            ctx.r.different(
                e.loc,
                d,
                "Envoy's limit counts the connections of every listener together; veloxy's \
                 max_connections is set on each listener (and answers the excess with 503)",
            );
            return;
        }
    }
    if let Some(l) = e
        .key
        .strip_prefix("envoy.resource_limits.listener.")
        .and_then(|r| r.strip_suffix(".connection_limit"))
    {
        listener_limit(ctx, &d, e, l);
        return;
    }
    if let Some(why) = harmless(&e.key) {
        ctx.r.ignored(e.loc, d, why);
        return;
    }
    let what = if e.key.starts_with("envoy.reloadable_features.")
        || e.key.starts_with("envoy.restart_features.")
    {
        "an Envoy feature flag"
    } else {
        "a runtime override of Envoy's behaviour"
    };
    ctx.r.refused(
        e.loc,
        d,
        format!("{what} ({} = {shown}): veloxy has no equivalent", e.key),
    );
}

/// `envoy.resource_limits.listener.NAME.connection_limit`: the listener's max_connections.
fn listener_limit(ctx: &mut Ctx, d: &str, e: &Entry, listener: &str) {
    let target = ctx
        .listener_names
        .iter()
        .find(|(envoy, _)| envoy == listener)
        .map(|(_, ours)| ours.clone());
    let (Some(ours), Some(n)) = (target, e.value.as_i64()) else {
        ctx.r.ignored(
            e.loc,
            d,
            format!(
                "a connection limit for the listener {listener}, which this config does not \
                 define: it limits nothing"
            ),
        );
        return;
    };
    ctx.cfg.listener(&ours, e.loc).set("max_connections", n);
    ctx.r.different(
        e.loc,
        d,
        "Envoy closes the connections over the limit at once; veloxy's max_connections \
         answers them with 503 and Retry-After, then closes them",
    );
}

/// Runtime keys that change nothing a client or backend sees, with why.
fn harmless(key: &str) -> Option<&'static str> {
    if key.starts_with("re2.max_program_size.") {
        return Some("a load-time limit on the size of Envoy's compiled regexes");
    }
    if key.starts_with("envoy.deprecated_features") {
        return Some("lets Envoy load deprecated config fields (a load-time check)");
    }
    if key.starts_with("stats.") || key.starts_with("envoy.stats.") {
        return Some("Envoy's statistics");
    }
    if key.starts_with("tracing.") {
        return Some("Envoy's trace sampling: veloxy exports no traces");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn nested_keys_are_flattened_with_dots() {
        let f: Arc<str> = "rt.yaml".into();
        let text = "a:\n  b:\n    c: 1\n  d: {numerator: 5}\ne: true\n";
        let doc = veloxy_import::tree::parse_yaml(&f, text).unwrap().remove(0);
        let mut out = Vec::new();
        flatten(&doc, "", &mut out);
        let keys: Vec<&str> = out.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a.b.c", "a.d", "e"]);
        assert_eq!(out[0].loc.line, 3);
    }
}
