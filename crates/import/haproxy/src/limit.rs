//! The stick-table rate-limit idiom: a table storing `http_req_rate(PERIOD)`, a `track-scN
//! KEY` rule filling it, and `http-request deny if { sc_http_req_rate(N) gt LIMIT }` (or
//! `src_http_req_rate(TABLE) gt LIMIT`), as veloxy's `rate_limit` on the routes the deny rule
//! guards.
//!
//! HAProxy counts every request it tracks (refused ones too) over a sliding window and refuses
//! while the count exceeds the limit; veloxy's token bucket lets `burst` requests through at
//! once and refills at `rate`. The mapping keeps the window's worth: burst = the requests the
//! window admits, rate = that many per window. The rule's report line names what differs.

use std::collections::BTreeMap;

use veloxy_import::Loc;

use crate::parse::Line;
use crate::proxy::Proxy;
use crate::Ctx;

/// A request-rate test of an ACL.
#[derive(Debug, Clone, PartialEq)]
pub struct RateTest {
    /// The tracking slot (`sc_http_req_rate(0)`, `sc0_http_req_rate`), or `None` for a
    /// `src_http_req_rate` lookup.
    pub slot: Option<u8>,
    /// The table named in the fetch, if any.
    pub table: Option<String>,
    /// The test holds when the count exceeds this.
    pub above: u64,
}

/// A table that counts request rates (`stick-table ... store http_req_rate(PERIOD)`).
#[derive(Debug, Clone)]
pub struct Table {
    /// The counting window in milliseconds.
    pub window_ms: u64,
    /// `size`: the entries it holds.
    pub size: Option<u64>,
    /// The `stick-table` line.
    pub loc: Loc,
}

/// A `track-scN KEY [table T]` rule of a proxy.
#[derive(Debug, Clone)]
pub struct Track {
    /// N.
    pub slot: u8,
    /// veloxy's `rate_limit` key, or why the key has none.
    pub key: Result<String, String>,
    /// The table it fills.
    pub table: String,
    /// Its line.
    pub loc: Loc,
    /// Its place among the proxy's `http-request` lines (`None`: a `tcp-request` rule, which
    /// runs before every `http-request` rule).
    pub http_index: Option<usize>,
    /// Whether it has a condition.
    pub conditional: bool,
}

/// A veloxy `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// `N/s`, `N/m` or `N/h`.
    pub rate: String,
    /// The requests a full bucket admits at once.
    pub burst: u64,
    /// `client_ip` or `header:NAME`.
    pub key: String,
    /// The table's `size`, when not veloxy's default.
    pub max_keys: Option<u64>,
    /// The table's window in milliseconds.
    pub window_ms: u64,
    /// The deny rule.
    pub from: Loc,
}

/// A fetch of a request rate: `sc_http_req_rate(N[,TABLE])`, `scN_http_req_rate([TABLE])`,
/// `src_http_req_rate([TABLE])`, tested with `gt N` or `ge N`; `None` for other fetches.
pub fn rate_fetch(
    name: &str,
    arg: Option<&str>,
    method: Option<&str>,
    patterns: &[String],
) -> Result<Option<RateTest>, String> {
    let (slot, table) = match name {
        "sc_http_req_rate" => {
            let a = arg.unwrap_or_default();
            let (n, t) = match a.split_once(',') {
                Some((n, t)) => (n, Some(t.trim().to_string())),
                None => (a, None),
            };
            let n: u8 = n
                .trim()
                .parse()
                .map_err(|_| "sc_http_req_rate needs a slot")?;
            (Some(n), t)
        }
        "sc0_http_req_rate" | "sc1_http_req_rate" | "sc2_http_req_rate" => {
            (Some(name.as_bytes()[2] - b'0'), arg.map(str::to_string))
        }
        "src_http_req_rate" => (None, arg.map(str::to_string)),
        _ => return Ok(None),
    };
    if method.is_some_and(|m| m != "int") {
        return Err(format!(
            "{name} tested with -m {}",
            method.unwrap_or_default()
        ));
    }
    let above = match patterns {
        [op, n] if op == "gt" || op == "ge" => {
            let n: u64 = n
                .parse()
                .map_err(|_| format!("{name}: {n} is not a number"))?;
            match op.as_str() {
                "gt" => n,
                _ => n
                    .checked_sub(1)
                    .ok_or_else(|| format!("{name} ge 0 refuses every request"))?,
            }
        }
        _ => {
            return Err(format!(
                "{name} {}: veloxy's rate_limit expresses 'gt N' and 'ge N' only",
                patterns.join(" ")
            ))
        }
    };
    Ok(Some(RateTest { slot, table, above }))
}

/// Every table that counts request rates, by the name of the proxy that declares it.
pub fn tables(proxies: &[Proxy]) -> BTreeMap<String, Table> {
    let mut out = BTreeMap::new();
    for p in proxies {
        for l in p.own_kw("stick-table") {
            let a = l.args();
            let word = |k: &str| a.iter().position(|w| *w == k).and_then(|i| a.get(i + 1));
            let window = a
                .iter()
                .enumerate()
                .filter(|(i, _)| *i > 0 && a[i - 1] == "store")
                .flat_map(|(_, w)| w.split(','))
                .find_map(|s| {
                    s.strip_prefix("http_req_rate(")
                        .and_then(|s| s.strip_suffix(')'))
                })
                .and_then(crate::millis);
            let Some(window_ms) = window.filter(|w| *w > 0) else {
                continue;
            };
            out.insert(
                p.name.clone(),
                Table {
                    window_ms,
                    size: word("size").and_then(|s| size(s)),
                    loc: l.loc.clone(),
                },
            );
        }
    }
    out
}

/// HAProxy's table size: `100k`, `1m`, `1g` or a number.
fn size(s: &str) -> Option<u64> {
    let (n, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1_000),
        (i, 'm' | 'M') => (&s[..i], 1_000_000),
        (i, 'g' | 'G') => (&s[..i], 1_000_000_000),
        _ => (s, 1),
    };
    n.parse::<u64>().ok().map(|n| n * mult)
}

/// What a proxy's rate tests are resolved against.
#[derive(Debug, Default)]
pub struct ProxyRates {
    /// The proxy's name (its own table's).
    pub own: String,
    /// Its `track-scN` rules.
    pub tracks: Vec<Track>,
    /// Its `http-request` lines in order.
    pub order: Vec<Loc>,
}

impl ProxyRates {
    /// The tracking rules of proxy `p`.
    pub fn of(p: &Proxy) -> ProxyRates {
        ProxyRates {
            own: p.name.clone(),
            tracks: tracks(p),
            order: p
                .lines()
                .filter(|l| l.kw() == "http-request")
                .map(|l| l.loc.clone())
                .collect(),
        }
    }
}

/// The `track-scN` rules of proxy `p` (`http-request`, `tcp-request content|connection|session`).
fn tracks(p: &Proxy) -> Vec<Track> {
    let mut out = Vec::new();
    let mut http = 0;
    for l in p.lines() {
        let (action, rest, http_index) = match (l.kw(), l.arg(0)) {
            ("http-request", Some(a)) => {
                http += 1;
                (a, &l.words[2..], Some(http - 1))
            }
            ("tcp-request", Some("content" | "connection" | "session")) => match l.arg(1) {
                Some(a) => (a, &l.words[3..], None),
                None => continue,
            },
            _ => continue,
        };
        let Some(slot) = action
            .strip_prefix("track-sc")
            .and_then(|n| n.parse::<u8>().ok())
        else {
            continue;
        };
        let words: Vec<&str> = rest.iter().map(|w| w.text.as_str()).collect();
        let table = match words.iter().position(|w| *w == "table") {
            Some(i) => words.get(i + 1).copied().unwrap_or_default().to_string(),
            None => p.name.clone(),
        };
        out.push(Track {
            slot,
            key: key(words.first().copied().unwrap_or_default()),
            table,
            loc: l.loc.clone(),
            http_index,
            conditional: words.iter().any(|w| *w == "if" || *w == "unless"),
        });
    }
    out
}

/// A tracked key as veloxy's `rate_limit` key.
fn key(k: &str) -> Result<String, String> {
    let header = ["req.hdr(", "hdr(", "req.fhdr(", "fhdr("]
        .iter()
        .find_map(|p| k.strip_prefix(p).and_then(|r| r.strip_suffix(')')));
    match (k, header) {
        ("src", _) => Ok("client_ip".into()),
        (_, Some(h)) if !h.is_empty() && !h.contains(',') => Ok(format!("header:{h}")),
        _ => Err(format!(
            "tracked key {k}: veloxy's rate_limit keys are the client address or one header"
        )),
    }
}

/// The `rate_limit` deny rule `rule` (answering `status`) with test `t` stands for, and what differs from HAProxy's count.
pub fn resolve(
    cx: &mut Ctx,
    pr: &ProxyRates,
    t: &RateTest,
    rule: &Line,
    status: u16,
) -> Result<(RateLimit, Vec<String>), String> {
    let (tracks, own) = (&pr.tracks, pr.own.as_str());
    let index = pr.order.iter().position(|l| *l == rule.loc);
    let track = match t.slot {
        Some(s) => {
            let tr = tracks
                .iter()
                .find(|tr| tr.slot == s)
                .ok_or_else(|| format!("sc{s} is not tracked by this proxy"))?;
            if let Some(tt) = &t.table {
                if *tt != tr.table {
                    return Err(format!("sc{s} tracks table {}, not {tt}", tr.table));
                }
            }
            if tr.http_index.zip(index).is_some_and(|(a, b)| a > b) {
                return Err(format!(
                    "sc{s} is tracked after this rule: the test never holds"
                ));
            }
            tr
        }
        None => {
            let table = t.table.clone().unwrap_or_else(|| own.to_string());
            tracks
                .iter()
                .find(|tr| tr.table == table && tr.key.as_deref() == Ok("client_ip"))
                .ok_or_else(|| {
                    format!("no track-sc rule of this proxy fills table {table} with src")
                })?
        }
    };
    if track.conditional {
        return Err(
            "a conditional track-sc rule: veloxy's rate_limit counts every request of its routes"
                .into(),
        );
    }
    let key = track.key.clone()?;
    let table = cx.tables.get(&track.table).cloned().ok_or_else(|| {
        format!(
            "table {} stores no http_req_rate: nothing counts requests",
            track.table
        )
    })?;
    // A tracking rule after this one counts the current request only later.
    let counted = match (track.http_index, index) {
        (Some(a), Some(b)) => a < b,
        _ => true,
    };
    let allowed = t.above + u64::from(!counted);
    if allowed == 0 {
        return Err("the limit refuses every request".into());
    }
    let rate = rate_text(allowed, table.window_ms);
    let window = crate::duration(&format!("{}ms", table.window_ms)).unwrap_or_default();
    let mut notes = vec![format!(
        "HAProxy counts every tracked request (refused ones too) over a sliding {window} window and refuses while more than {} are counted; veloxy's token bucket lets {allowed} through at once and refills at {rate}: a client that keeps sending gets one through at that pace (HAProxy refuses it until it slows down), and only the requests of the routes carrying the limit count",
        t.above,
    )];
    notes.push(if status == 429 {
        "veloxy's 429 has its own short text body and a Retry-After field".into()
    } else {
        format!("veloxy answers 429 with its own short text body and a Retry-After field (HAProxy: {status})")
    });
    if let Some(h) = key.strip_prefix("header:") {
        notes.push(format!("requests without {h} share one bucket in veloxy (HAProxy does not track them: no limit)"));
    }
    cx.rate_rules.push((rule.loc.clone(), status));
    for loc in [&track.loc, &table.loc] {
        cx.ok_loc(loc);
    }
    let limit = RateLimit {
        rate,
        burst: allowed,
        key,
        max_keys: table.size.filter(|s| *s != 100_000),
        window_ms: table.window_ms,
        from: rule.loc.clone(),
    };
    Ok((limit, notes))
}

/// `n` requests per `window_ms` as veloxy's `N/s`, `N/m` or `N/h` (a whole N when one exists).
pub fn rate_text(n: u64, window_ms: u64) -> String {
    for (unit, ms) in [("s", 1_000u64), ("m", 60_000), ("h", 3_600_000)] {
        if (n * ms).is_multiple_of(window_ms) {
            return format!("{}/{unit}", n * ms / window_ms);
        }
    }
    let per_hour = n as f64 * 3_600_000.0 / window_ms as f64;
    format!("{}/h", (per_hour * 1000.0).round() / 1000.0)
}

/// Two limits on one route: the stricter when they count the same key over one window.
pub fn combine(have: Option<RateLimit>, new: &RateLimit) -> Result<RateLimit, String> {
    match have {
        None => Ok(new.clone()),
        Some(h) if h.key == new.key && h.window_ms == new.window_ms => {
            Ok(if new.burst < h.burst { new.clone() } else { h })
        }
        Some(_) => Err(
            "two rate limits on different keys or windows: a veloxy route has one rate_limit"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(rate_text(20, 10_000), "2/s");
        assert_eq!(rate_text(100, 30_000), "200/m");
        assert_eq!(rate_text(20, 60_000), "20/m");
        assert_eq!(rate_text(1000, 86_400_000), "41.667/h");
    }

    #[test]
    fn fetches() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let t = rate_fetch("sc_http_req_rate", Some("0"), None, &p(&["gt", "20"]))
            .unwrap()
            .unwrap();
        assert_eq!((t.slot, t.above), (Some(0), 20));
        let t = rate_fetch("src_http_req_rate", Some("api"), None, &p(&["ge", "10"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.slot, t.table.as_deref(), t.above),
            (None, Some("api"), 9)
        );
        assert!(rate_fetch("sc0_http_req_rate", None, None, &p(&["lt", "5"])).is_err());
        assert!(rate_fetch("src_conn_cur", None, None, &p(&["gt", "5"]))
            .unwrap()
            .is_none());
        assert_eq!(key("req.hdr(x-api-key)").unwrap(), "header:x-api-key");
        assert!(key("base32+src").is_err());
        assert_eq!(size("100k"), Some(100_000));
    }
}
