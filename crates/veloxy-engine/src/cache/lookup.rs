//! The cache step of admission: a route's compiled cache settings, and the synchronous lookup
//! that answers fresh hits at once and hands everything else to [`super::fill`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::fill::{Fill, Mode};
use super::policy::{self, CacheControl};
use super::{now_ms, Entry, Object, Stats, Store};
use crate::message::Head;
use crate::template::Template;

/// Separates a key from its variant's request values.
pub(crate) const VARIANT_MARK: char = '\u{1f}';

/// A route's `cache = {...}`, compiled.
pub struct RouteCache {
    /// `[caches.NAME]`'s store, bound by the runtime (see [`RouteCache::store`]).
    pub(crate) slot: crate::late::Late<Store>,
    /// The store's name (`veloxy check --print` writes it; the slot is empty there).
    pub(crate) store_name: Box<str>,
    /// `[caches.NAME] max_object`: larger responses are not stored.
    pub max_object: u64,
    /// `key`: the template rendered per request.
    pub key: Template,
    /// `methods`: GET and/or HEAD (a HEAD is filled with a GET, so a later GET hits).
    pub get: bool,
    pub head: bool,
    /// `methods` names QUERY: answers stored per body ([`super::query`]).
    pub query: bool,
    pub(crate) settings: policy::Settings,
    /// `cache_status_header` ("X-Cache" unless renamed; `None`: off), as `Name: ` bytes.
    pub status_header: Option<Bytes>,
    /// `purge`: clients that may send `PURGE` for the route's keys.
    pub purge: Option<crate::access::IpRules>,
    /// The route compresses (`compress = true`): answers carry a coded copy of the body.
    pub compress: bool,
    /// `[caches.NAME] targeted_cache_control`, then `CDN-Cache-Control` (RFC 9213): the
    /// fields whose directives replace Cache-Control's for this cache, lowercase, in order.
    pub(crate) targeted: Arc<[Box<str>]>,
}

/// What a route's `cache = {...}` sets (see [`RouteCache`]'s fields).
pub(crate) struct RouteCacheSettings {
    pub key: Template,
    pub get: bool,
    pub head: bool,
    pub query: bool,
    pub policy: policy::Settings,
    pub status_header: Option<String>,
    pub purge: Option<crate::access::IpRules>,
    pub compress: bool,
    pub targeted: Arc<[Box<str>]>,
}

impl std::fmt::Debug for RouteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteCache")
            .field("store", &self.store_name)
            .field("max_object", &self.max_object)
            .finish_non_exhaustive()
    }
}

impl RouteCache {
    /// The compiled settings (the config compiler's entry point): the store's slot, name and
    /// `max_object`, then the route's own settings.
    pub(crate) fn new(
        (store_name, slot, max_object): (Box<str>, crate::late::Late<Store>, u64),
        route: RouteCacheSettings,
    ) -> RouteCache {
        RouteCache {
            slot,
            store_name,
            max_object,
            key: route.key,
            get: route.get,
            head: route.head,
            query: route.query,
            settings: route.policy,
            status_header: route.status_header.map(|h| Bytes::from(format!("{h}: "))),
            purge: route.purge,
            compress: route.compress,
            targeted: route.targeted,
        }
    }

    /// The store (one atomic load).
    #[inline]
    pub(crate) fn store(&self) -> &Arc<Store> {
        self.slot.get()
    }

    /// The status field line (`X-Cache: HIT\r\n`), if the header is on.
    pub(crate) fn status_line(&self, status: &str) -> Bytes {
        match &self.status_header {
            None => Bytes::new(),
            Some(name) => {
                let mut v = Vec::with_capacity(name.len() + status.len() + 2);
                v.extend_from_slice(name);
                v.extend_from_slice(status.as_bytes());
                v.extend_from_slice(b"\r\n");
                Bytes::from(v)
            }
        }
    }
}

/// The route's `cache = {...}` as `veloxy check --print` writes it, every value explicit.
pub(crate) fn describe(rc: &RouteCache) -> String {
    let secs = |d: Duration| format!("\"{}s\"", d.as_secs_f64());
    let mut methods = Vec::new();
    if rc.get {
        methods.push("\"GET\"");
    }
    if rc.head {
        methods.push("\"HEAD\"");
    }
    if rc.query {
        methods.push("\"QUERY\"");
    }
    let status = rc.status_header.as_ref().map_or(String::new(), |h| {
        String::from_utf8_lossy(&h[..h.len() - 2]).into_owned()
    });
    let purge = rc
        .purge
        .as_ref()
        .and_then(|p| p.allow.as_ref())
        .map_or(String::new(), |a| format!(", purge = {:?}", a.entries()));
    format!(
        "{{ store = {:?}, key = {:?}, default_ttl = {}, methods = [{}], \
         stale_while_revalidate = {}, stale_if_error = {}, ignore_cache_control = {}, \
         cache_status_header = {:?}{purge} }}",
        &*rc.store_name,
        rc.key.to_string(),
        secs(rc.settings.default_ttl),
        methods.join(", "),
        secs(rc.settings.stale_while_revalidate),
        secs(rc.settings.stale_if_error),
        rc.settings.ignore_cache_control,
        status,
    )
}

/// The `[caches.NAME]` keys of the route's store, for `veloxy check --print`.
pub(crate) fn describe_store(
    store: &super::StoreSpec,
    max_object: u64,
) -> (String, Vec<(&'static str, String)>) {
    let mut keys = vec![
        ("memory", store.memory.to_string()),
        ("max_object", max_object.to_string()),
    ];
    if let [own, _] = &*store.targeted {
        keys.push(("targeted_cache_control", format!("{own:?}")));
    }
    if let Some(d) = &store.disk {
        keys.push((
            "disk",
            format!(
                "{{ path = {:?}, size = {} }}",
                d.path.display().to_string(),
                d.size
            ),
        ));
    }
    (store.name.to_string(), keys)
}

/// What admission does with a request on a caching route.
pub(crate) enum Step {
    /// Answer now (a fresh hit, or a purge).
    Answer(crate::static_files::Response),
    /// Go upstream through the cache (miss, stale, revalidation).
    Fill(Box<Fill>),
    /// Forward as if the route did not cache; the answer says so in the status header.
    Bypass,
}

/// Looks the request up. `key` is the rendered key template.
pub(crate) fn admit(
    rc: &Arc<RouteCache>,
    head: &Head,
    key: String,
    (client, encoding): (std::net::IpAddr, Option<crate::compress::Encoding>),
) -> Step {
    let store = rc.store();
    if head.method == "PURGE" {
        if let Some(allowed) = &rc.purge {
            let get_key = key.strip_prefix("PURGE").map(|k| format!("GET{k}"));
            return Step::Answer(purge_answer(store, allowed, client, get_key.unwrap_or(key)));
        }
    }
    let cacheable = match head.method {
        "GET" => rc.get,
        "HEAD" => rc.head,
        "QUERY" => rc.query && super::query::cacheable_length(head).is_some(),
        _ => false,
    };
    // A HEAD shares the GET's object: it is filled with a GET.
    let key = match key.strip_prefix("HEAD") {
        Some(rest) if cacheable => format!("GET{rest}"),
        _ => key,
    };
    let req_cc = CacheControl::parse(head.fields.get("cache-control").into_iter());
    if !cacheable || req_cc.no_store {
        Stats::inc(&store.stats.bypass);
        return Step::Bypass;
    }
    // `no-cache` (or `Pragma: no-cache`, or max-age=0) from the client: revalidate first.
    // A reload (`max-age=0` alone) of a fresh `immutable` object is answered from it
    // (RFC 8246); a forced reload (`no-cache`) is not.
    let force = req_cc.no_cache
        || head
            .fields
            .get("pragma")
            .is_some_and(|p| p.eq_ignore_ascii_case(b"no-cache"));
    let reload = req_cc.max_age == Some(0);
    let refresh = force || reload;
    let mode = if refresh { Mode::Refresh } else { Mode::Normal };
    if head.method == "QUERY" {
        // Its key needs its body: looked up once the exchange has read it.
        let key: Arc<str> = Arc::from(key);
        let fill = Fill::new(rc.clone(), (key.clone(), key), None, mode, (head, encoding));
        return Step::Fill(Box::new(fill.awaiting_body()));
    }
    let now = now_ms();
    let primary: Arc<str> = Arc::from(key);
    let Some((key, found)) = find(store, &primary, now, |names| {
        variant_key(&primary, names, head)
    }) else {
        return Step::Bypass;
    };
    match found {
        Some(obj) if (!refresh || (!force && immutable(&obj))) && obj.is_fresh(now) => {
            Stats::inc(&store.stats.hits);
            let client = head_view(head, encoding);
            Step::Answer(super::serve::respond(rc, &obj, client, "HIT", now))
        }
        stale => Step::Fill(Box::new(Fill::new(
            rc.clone(),
            (primary, key),
            stale,
            mode,
            (head, encoding),
        ))),
    }
}

/// What the store holds under `primary`: the key of the object (its variant's, from
/// `variant`, when the answers vary) and the object if there is one; `None` while the key is
/// a hit-for-pass (counted as a bypass).
pub(super) fn find(
    store: &super::Store,
    primary: &Arc<str>,
    now: u64,
    variant: impl FnOnce(&[Box<str>]) -> String,
) -> Option<(Arc<str>, Option<Arc<Object>>)> {
    match store.entries.get(primary) {
        Some(Entry::Vary(names)) => {
            let v: Arc<str> = Arc::from(variant(&names));
            let found = match store.entries.get(&v) {
                Some(Entry::Object(o)) => Some(o),
                _ => None,
            };
            Some((v, found))
        }
        Some(Entry::Object(o)) => Some((primary.clone(), Some(o))),
        Some(Entry::Pass(until)) if until > now => {
            Stats::inc(&store.stats.bypass);
            None
        }
        Some(Entry::Pass(_)) | None => Some((primary.clone(), None)),
    }
}

/// The stored response says `Cache-Control: immutable` (RFC 8246).
fn immutable(obj: &Object) -> bool {
    crate::http1::lines(&obj.lines).any(|(n, v)| {
        n.eq_ignore_ascii_case(b"cache-control") && crate::http1::has_token(v, "immutable")
    })
}

/// The request fields a stored answer depends on.
#[derive(Clone, Default)]
pub(crate) struct ClientHead {
    pub is_head: bool,
    pub if_none_match: Option<Bytes>,
    pub if_modified_since: Option<u64>,
    pub range: Option<Bytes>,
    pub if_range: Option<Bytes>,
    /// The coding the route would compress in for this client (`compress = true`).
    pub encoding: Option<crate::compress::Encoding>,
}

pub(crate) fn head_view(head: &Head, encoding: Option<crate::compress::Encoding>) -> ClientHead {
    let owned = |n: &str| head.fields.get(n).map(Bytes::copy_from_slice);
    ClientHead {
        is_head: head.method == "HEAD",
        if_none_match: owned("if-none-match"),
        if_modified_since: head
            .fields
            .get("if-modified-since")
            .and_then(policy::http_date),
        range: owned("range"),
        if_range: owned("if-range"),
        encoding,
    }
}

/// The key of the variant the request selects: the key, then each Vary field's value.
pub(crate) fn variant_key(primary: &str, names: &[Box<str>], head: &Head) -> String {
    variant_key_with(primary, names, |n| {
        combined(
            head.fields
                .iter()
                .filter(|(f, _)| f.eq_ignore_ascii_case(n))
                .map(|(_, v)| v),
        )
    })
}

/// A field's combined value: its lines joined with ", " in order (RFC 9110 section 5.3);
/// `None` when the request has no such line.
pub(crate) fn combined<'a>(mut lines: impl Iterator<Item = &'a [u8]>) -> Option<Vec<u8>> {
    let mut v = lines.next()?.to_vec();
    for more in lines {
        v.extend_from_slice(b", ");
        v.extend_from_slice(more);
    }
    Some(v)
}

pub(crate) fn variant_key_with(
    primary: &str,
    names: &[Box<str>],
    value: impl Fn(&str) -> Option<Vec<u8>>,
) -> String {
    let mut k = String::with_capacity(primary.len() + 32);
    k.push_str(primary);
    for n in names {
        k.push(VARIANT_MARK);
        k.push_str(n);
        k.push('=');
        if let Some(v) = value(n) {
            // Normalized a little: whitespace around commas does not make a new variant.
            let v = String::from_utf8_lossy(&v).replace(", ", ",");
            k.push_str(v.trim());
        }
    }
    k
}

/// `PURGE` from a permitted client: removes the key (and its variants).
fn purge_answer(
    store: &Store,
    allowed: &crate::access::IpRules,
    client: std::net::IpAddr,
    key: String,
) -> crate::static_files::Response {
    let (status, body) = if allowed.permits(client) {
        let n = store.purge(&super::Purge::Key(key));
        (
            if n > 0 { 200 } else { 404 },
            format!("{{\"purged\":{n}}}\n"),
        )
    } else {
        (
            403,
            "{\"error\":\"PURGE is not allowed from this address\"}\n".to_owned(),
        )
    };
    crate::message::Answer {
        status,
        headers: vec![("content-type", Bytes::from_static(b"application/json"))],
        body: Bytes::from(body),
    }
    .into_response(false)
}

/// Whether `obj` may be served stale now for the upstream's failure.
pub(crate) fn usable_on_error(obj: &Object, now: u64) -> bool {
    obj.staleness_ms(now) <= obj.life.stale_if_error.as_millis() as u64
}
