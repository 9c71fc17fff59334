//! HAProxy's small object cache: `cache NAME { total-max-size; max-object-size; max-age;
//! process-vary }` with `http-request cache-use NAME` and `http-response cache-store NAME`,
//! as `[caches.NAME]` and the routes' `cache = { store, default_ttl }`.
//!
//! Both caches follow the response's Cache-Control; what differs is named on the cache
//! section's lines: HAProxy stores only 200 answers to GET that state a lifetime or carry a
//! validator, for at most `max-age`; veloxy stores what RFC 9111 lets a shared cache store,
//! for as long as the answer says, and uses `max-age` as `default_ttl` for answers that give
//! none.

use toml::Value;
use veloxy_import::Loc;

use crate::parse::{Line, Section};
use crate::proxy::Proxy;
use crate::Ctx;

/// A `cache` section.
#[derive(Debug, Clone, Default)]
pub struct Cache {
    /// `total-max-size` in MiB.
    pub total_mb: Option<u64>,
    /// `max-object-size` in bytes.
    pub max_object: Option<u64>,
    /// `max-age` in seconds (HAProxy's default: 60).
    pub max_age: u64,
    /// `process-vary on`.
    pub vary: bool,
    /// Whether a route uses it.
    pub used: bool,
    /// The `cache-use` / `cache-store` lines naming it.
    pub rules: Vec<Loc>,
}

/// Reads every `cache` section (reported later by [`finish`]).
pub fn collect(cx: &mut Ctx, sections: &[Section]) {
    for s in sections.iter().filter(|s| s.kind == "cache") {
        let mut c = Cache {
            max_age: 60,
            ..Default::default()
        };
        for l in &s.lines {
            let n = l.arg(0).and_then(|v| v.parse::<u64>().ok());
            match l.kw() {
                "total-max-size" => c.total_mb = n,
                "max-object-size" => c.max_object = n,
                "max-age" => c.max_age = n.unwrap_or(60),
                "process-vary" => c.vary = matches!(l.arg(0), Some("on" | "1")),
                _ => {}
            }
        }
        cx.caches.insert(s.name.clone(), c);
    }
}

/// The unconditional `http-response cache-store NAME` lines of proxy `p`: the caches its
/// answers are stored in. Conditional ones are refused.
pub fn stores(cx: &mut Ctx, p: &Proxy) -> Vec<String> {
    let mut out = Vec::new();
    for l in p.lines().filter(|l| l.kw() == "http-response") {
        if l.arg(0) != Some("cache-store") {
            continue;
        }
        let name = l.arg(1).unwrap_or_default().to_string();
        if l.words.len() > 3 {
            cx.refuse(
                l,
                "a condition on cache-store: veloxy stores every cacheable answer of the route",
            );
        } else if let Some(c) = cx.caches.get_mut(&name) {
            c.rules.push(l.loc.clone());
            cx.ok(l);
            out.push(name);
        } else {
            cx.refuse(l, format!("cache {name} is not defined"));
        }
    }
    out
}

/// The route key for cache `name`.
pub fn route_key(cx: &mut Ctx, name: &str) -> Option<Value> {
    let c = cx.caches.get_mut(name)?;
    c.used = true;
    let mut t = toml::Table::new();
    t.insert("store".into(), Value::from(name));
    t.insert(
        "default_ttl".into(),
        Value::from(crate::duration(&format!("{}s", c.max_age)).unwrap_or_default()),
    );
    Some(Value::Table(t))
}

/// Writes the caches routes use and reports every `cache` section's lines.
pub fn finish(cx: &mut Ctx, sections: &[Section]) {
    for s in sections.iter().filter(|s| s.kind == "cache") {
        let Some(c) = cx.caches.get(&s.name).cloned() else {
            continue;
        };
        if !c.used {
            for l in std::iter::once(&s.head).chain(&s.lines) {
                cx.ignore(l, "no route uses this cache (it needs both http-request cache-use and http-response cache-store)");
            }
            for loc in &c.rules {
                cx.shadowed(
                    loc,
                    "nothing is served from this cache: no route both uses and stores it",
                );
            }
            continue;
        }
        let sec = cx.out.caches.iter_mut().find(|(n, _)| *n == s.name);
        let sec = match sec {
            Some((_, sec)) => sec,
            None => {
                cx.out
                    .caches
                    .push((s.name.clone(), veloxy_import::Section::from(&s.head.loc)));
                &mut cx.out.caches.last_mut().expect("pushed").1
            }
        };
        let memory = c.total_mb.map(|m| m.max(1) << 20);
        if let Some(m) = memory {
            sec.set("memory", format!("{}MiB", m >> 20));
        }
        let limit = memory.unwrap_or(256 << 20) / 4;
        let object = c
            .max_object
            .or(memory.map(|m| m / 256))
            .map(|o| o.clamp(1, limit));
        if let Some(o) = object {
            sec.set("max_object", size_text(o));
        }
        // HAProxy adds no cache status field to its answers.
        sec.set("cache_status_header", "");
        report(cx, s, &c, object);
    }
}

fn report(cx: &mut Ctx, s: &Section, c: &Cache, object: Option<u64>) {
    cx.diff(&s.head, "HAProxy stores only 200 answers to GET that state a lifetime or carry an ETag or Last-Modified; veloxy stores every answer RFC 9111 lets a shared cache store (200, 203, 204, 301, 404...), answers HEAD from the stored GET, and keys by method, scheme, Host and URI (HAProxy: Host and URI)");
    let vary = if c.vary {
        "veloxy stores a variant for any field Vary names (HAProxy only for Accept-Encoding, Referer and Origin: other answers with Vary are not stored)"
    } else {
        "veloxy stores a variant per combination of the fields Vary names (HAProxy without process-vary stores no answer with Vary)"
    };
    let mut vary_reported = false;
    for l in &s.lines {
        match l.kw() {
            "total-max-size" => cx.ok(l),
            "max-object-size" => match (c.max_object, object) {
                (Some(a), Some(b)) if a != b => cx.diff(l, format!("veloxy's max_object is at most a quarter of memory: {b} bytes")),
                _ => cx.ok(l),
            },
            "max-age" => cx.diff(l, "veloxy keeps an answer as long as its Cache-Control or Expires says (HAProxy caps it at max-age); max-age is the default_ttl of answers that state no lifetime, which veloxy stores without a validator too"),
            "process-vary" => {
                vary_reported = true;
                cx.diff(l, vary);
            }
            "max-secondary-entries" => cx.diff(l, "veloxy bounds the variants of a URL by memory only"),
            other => cx.refuse(l, format!("cache option {other}: not translated")),
        }
    }
    if !vary_reported {
        cx.diff(&s.head, vary);
    }
    if !s.lines.iter().any(|l| l.kw() == "max-age") {
        cx.diff(&s.head, "veloxy keeps an answer as long as its Cache-Control or Expires says (HAProxy caps it at max-age, 60s by default); 60s is the default_ttl of answers that state no lifetime");
    }
}

/// Bytes as veloxy's size text (`10MiB`, `64KiB`, or a plain number).
fn size_text(b: u64) -> Value {
    if b.is_multiple_of(1 << 20) {
        Value::from(format!("{}MiB", b >> 20))
    } else if b.is_multiple_of(1024) {
        Value::from(format!("{}KiB", b >> 10))
    } else {
        Value::from(b as i64)
    }
}

/// Whether `l` is an `http-response cache-store` line (read by [`stores`]).
pub fn is_store(l: &Line) -> bool {
    l.kw() == "http-response" && l.arg(0) == Some("cache-store")
}
