//! RFC 9111 decisions for a shared cache: what may be stored, for how long it is fresh, how
//! old a stored response is. Pure functions over header values, unit-tested here.

use std::time::Duration;

/// The `Cache-Control` directives veloxy acts on (request or response).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CacheControl {
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
    /// `must-understand` (RFC 9111 section 5.2.2.3): store only a status whose caching rules
    /// veloxy knows, and then ignore `no-store`.
    pub must_understand: bool,
}

impl CacheControl {
    /// Parses every `Cache-Control` value (comma-separated directives, case-insensitive
    /// names, quoted or bare arguments). Unknown directives are ignored; a malformed number
    /// makes its directive count as absent, except `max-age`, which then means stale (0), as
    /// RFC 9111 section 4.2.1 advises.
    pub fn parse<'a>(values: impl Iterator<Item = &'a [u8]>) -> CacheControl {
        let mut cc = CacheControl::default();
        for value in values {
            let Ok(text) = std::str::from_utf8(value) else {
                continue;
            };
            for item in text.split(',') {
                let item = item.trim();
                let (name, arg) = match item.split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (item, None),
                };
                let secs = || arg.and_then(|a| a.parse::<u64>().ok());
                match name.to_ascii_lowercase().as_str() {
                    "max-age" => cc.max_age = Some(secs().unwrap_or(0)),
                    "s-maxage" => cc.s_maxage = Some(secs().unwrap_or(0)),
                    "no-store" => cc.no_store = true,
                    "must-understand" => cc.must_understand = true,
                    // `no-cache="field"` (a qualified form) is treated as plain no-cache.
                    "no-cache" => cc.no_cache = true,
                    "private" => cc.private = true,
                    "public" => cc.public = true,
                    "must-revalidate" => cc.must_revalidate = true,
                    "proxy-revalidate" => cc.proxy_revalidate = true,
                    "stale-while-revalidate" => cc.stale_while_revalidate = secs(),
                    "stale-if-error" => cc.stale_if_error = secs(),
                    _ => {}
                }
            }
        }
        cc
    }

    /// A targeted field's directives (RFC 9213): its lines, joined, as a Structured Fields
    /// Dictionary. `None` when the value is empty or not a valid Dictionary, or a directive
    /// veloxy acts on has the wrong type (`max-age="60"`): the field is then ignored, as if
    /// absent.
    pub fn parse_targeted<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<CacheControl> {
        let mut joined = Vec::new();
        for v in values {
            if !joined.is_empty() {
                joined.push(b',');
            }
            joined.extend_from_slice(v);
        }
        let text = std::str::from_utf8(&joined).ok()?;
        let mut cc = CacheControl::default();
        let mut any = false;
        for member in text.split(',') {
            let member = member.trim_matches([' ', '\t']);
            // Parameters (`;a=b`) are allowed and ignored.
            let item = member.split(';').next()?;
            let (name, value) = match item.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (item, None),
            };
            if !sf_key(name) || value.is_some_and(|v| !sf_bare_item(v)) {
                return None;
            }
            any = true;
            let secs = || -> Option<Option<u64>> {
                match value {
                    None => Some(None),
                    Some(v) if v.bytes().all(|b| b.is_ascii_digit()) => {
                        Some(Some(v.parse::<u64>().unwrap_or(u64::MAX)))
                    }
                    Some(_) => None,
                }
            };
            match name {
                "max-age" => cc.max_age = Some(secs()?.unwrap_or(0)),
                "s-maxage" => cc.s_maxage = Some(secs()?.unwrap_or(0)),
                "stale-while-revalidate" => cc.stale_while_revalidate = secs()?,
                "stale-if-error" => cc.stale_if_error = secs()?,
                "no-store" => cc.no_store = true,
                "no-cache" => cc.no_cache = true,
                "private" => cc.private = true,
                "public" => cc.public = true,
                "must-revalidate" => cc.must_revalidate = true,
                "proxy-revalidate" => cc.proxy_revalidate = true,
                _ => {}
            }
        }
        any.then_some(cc)
    }

    /// A shared cache must not serve the response stale (RFC 9111 5.2.2.2, 5.2.2.8).
    pub fn forbids_stale(&self) -> bool {
        self.must_revalidate || self.proxy_revalidate || self.s_maxage.is_some()
    }
}

/// The targeted field every CDN obeys (RFC 9213); `[caches.NAME] targeted_cache_control`
/// names one veloxy obeys before it.
pub(crate) const CDN_CACHE_CONTROL: &str = "cdn-cache-control";

/// A Structured Fields key (RFC 8941 section 3.1.2): lowercase, starting with a letter or `*`.
fn sf_key(k: &str) -> bool {
    let b = k.as_bytes();
    b.first()
        .is_some_and(|c| c.is_ascii_lowercase() || *c == b'*')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(c))
}

/// A Structured Fields bare item: an integer or decimal, a string, a token, a byte sequence
/// or a boolean (RFC 8941 section 3.3).
fn sf_bare_item(v: &str) -> bool {
    let b = v.as_bytes();
    match b.first() {
        Some(b'"') => {
            b.len() >= 2
                && b[b.len() - 1] == b'"'
                && b[1..b.len() - 1].iter().all(|c| (0x20..0x7f).contains(c))
        }
        Some(b'?') => v == "?0" || v == "?1",
        Some(b':') => b.len() >= 2 && b[b.len() - 1] == b':',
        Some(c) if c.is_ascii_digit() || *c == b'-' => {
            let digits = v.strip_prefix('-').unwrap_or(v);
            let (int, frac) = digits.split_once('.').unwrap_or((digits, "0"));
            !int.is_empty()
                && int.len() <= 15
                && !frac.is_empty()
                && frac.len() <= 3
                && int.bytes().chain(frac.bytes()).all(|c| c.is_ascii_digit())
        }
        Some(c) if c.is_ascii_alphabetic() || *c == b'*' => v
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c)),
        _ => false,
    }
}

/// Statuses a cache may store with heuristic freshness (RFC 9110 15.1): here, with the
/// route's `default_ttl`.
pub(crate) fn heuristically_cacheable(status: u16) -> bool {
    matches!(
        status,
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// What a response says about its own storage, with the route's settings applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lifetime {
    /// How long the response is fresh from its generation.
    pub fresh: Duration,
    /// May be served stale while a refresh runs, for this long past freshness.
    pub stale_while_revalidate: Duration,
    /// May be served stale when the upstream fails, for this long past freshness.
    pub stale_if_error: Duration,
    /// Must be revalidated before every use (`no-cache`).
    pub always_revalidate: bool,
}

/// The route's cache settings that enter storage decisions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub default_ttl: Duration,
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
    pub ignore_cache_control: bool,
}

/// The facts about one response (and the request that fetched it) that decide storage.
pub(crate) struct Facts<'a> {
    pub status: u16,
    pub cc: &'a CacheControl,
    /// `Expires`, `Date` as Unix seconds (`None`: absent or unparsable).
    pub expires: Option<Option<u64>>,
    pub date: Option<u64>,
    /// When the response arrived, in Unix seconds: the `Date` of one with none (or an
    /// invalid one), as RFC 9110 section 6.6.1 lets a recipient assume.
    pub now: u64,
    pub has_validator: bool,
    pub set_cookie: bool,
    pub vary_star: bool,
    /// The request carried `Authorization`.
    pub authorization: bool,
    /// The request said `Cache-Control: no-store`.
    pub request_no_store: bool,
}

/// Whether a shared cache may store the response, and for how long it is fresh (RFC 9111
/// section 3 and 4.2.1). `None`: do not store.
pub(crate) fn lifetime(f: &Facts, s: &Settings) -> Option<Lifetime> {
    if f.request_no_store || f.vary_star || !(200..600).contains(&f.status) || f.status == 206 {
        return None;
    }
    let cc = f.cc;
    // `public` or `s-maxage` make a response with credentials (or cookies) shareable.
    let shareable = cc.public || cc.s_maxage.is_some();
    if (f.authorization && !(shareable || cc.must_revalidate)) || (f.set_cookie && !shareable) {
        return None;
    }
    let route_stale = |d: Duration, own: Option<u64>| own.map_or(d, Duration::from_secs).max(d);
    if s.ignore_cache_control {
        return (!s.default_ttl.is_zero()).then_some(Lifetime {
            fresh: s.default_ttl,
            stale_while_revalidate: s.stale_while_revalidate,
            stale_if_error: s.stale_if_error,
            always_revalidate: false,
        });
    }
    // must-understand: a status veloxy knows the caching rules of (those RFC 9110 section
    // 15.1 lists as heuristically cacheable) is stored despite `no-store`; any other is not
    // stored at all.
    if cc.must_understand && !heuristically_cacheable(f.status) {
        return None;
    }
    let no_store = cc.no_store && !cc.must_understand;
    if no_store || cc.private {
        return None;
    }
    let explicit = cc.s_maxage.or(cc.max_age).or_else(|| match f.expires {
        // An invalid Expires (like "0") means already expired.
        Some(None) => Some(0),
        Some(Some(exp)) => Some(exp.saturating_sub(f.date.unwrap_or(f.now))),
        None => None,
    });
    let fresh = match explicit {
        Some(secs) => Duration::from_secs(secs),
        None if heuristically_cacheable(f.status) && !s.default_ttl.is_zero() => s.default_ttl,
        None => Duration::ZERO,
    };
    let always_revalidate = cc.no_cache;
    if fresh.is_zero() && !(always_revalidate && f.has_validator) {
        // Stale on arrival with no way to revalidate cheaply: not worth storing.
        return None;
    }
    let (swr, sie) = if cc.forbids_stale() {
        (Duration::ZERO, Duration::ZERO)
    } else {
        (
            route_stale(s.stale_while_revalidate, cc.stale_while_revalidate),
            route_stale(s.stale_if_error, cc.stale_if_error),
        )
    };
    Some(Lifetime {
        fresh,
        stale_while_revalidate: swr,
        stale_if_error: sie,
        always_revalidate,
    })
}

/// The response's age when it arrived (RFC 9111 4.2.3's corrected initial age), from its
/// `Age` and `Date` and the request's round trip, in milliseconds.
pub(crate) fn initial_age_ms(
    age: Option<u64>,
    date: Option<u64>,
    request_ms: u64,
    response_ms: u64,
) -> u64 {
    let apparent = date.map_or(0, |d| response_ms.saturating_sub(d * 1000));
    let corrected = age.unwrap_or(0) * 1000 + response_ms.saturating_sub(request_ms);
    // Clocks: a Date far in the past (a skewed origin) would make every response stale on
    // arrival; a shared cache on one host trusts its own round trip more than that.
    apparent.min(corrected.max(1000) + 60_000).max(corrected)
}

/// The `Age` a response carries (RFC 9111 section 5.1), from its first field line: the
/// first member of that line (`7200, 0` is 7200), without parameters, when it is a
/// non-negative integer; anything else (`abc`, `-7200`, `7200.0`) is ignored, as if absent.
/// A value too large to represent is 2^31 seconds, as the RFC caps it.
pub(crate) fn age(first_line: &[u8]) -> Option<u64> {
    let member = first_line.split(|&b| b == b',').next()?;
    let value = member.split(|&b| b == b';').next()?.trim_ascii();
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    const MAX: u64 = 1 << 31;
    Some(
        std::str::from_utf8(value)
            .ok()?
            .parse::<u64>()
            .map_or(MAX, |v| v.min(MAX)),
    )
}

/// An `HTTP-date` as Unix seconds.
pub(crate) fn http_date(v: &[u8]) -> Option<u64> {
    super::date::parse(v)
}

/// Whether `If-None-Match` (a list, or `*`) matches `etag` by the weak comparison.
pub(crate) fn none_match(header: &[u8], etag: &[u8]) -> bool {
    let weak = |t: &[u8]| t.strip_prefix(b"W/").unwrap_or(t).to_vec();
    let tag = weak(etag);
    header
        .split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .any(|t| t == b"*" || weak(t) == tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(s: &str) -> CacheControl {
        CacheControl::parse([s.as_bytes()].into_iter())
    }

    const ROUTE: Settings = Settings {
        default_ttl: Duration::ZERO,
        stale_while_revalidate: Duration::ZERO,
        stale_if_error: Duration::ZERO,
        ignore_cache_control: false,
    };

    fn facts(c: &CacheControl) -> Facts<'_> {
        Facts {
            status: 200,
            cc: c,
            expires: None,
            date: None,
            has_validator: false,
            set_cookie: false,
            vary_star: false,
            authorization: false,
            request_no_store: false,
            now: 1_000_000,
        }
    }

    #[test]
    fn directives_parse_case_insensitively_with_quotes() {
        let c = cc("Public, MAX-AGE=\"60\", s-maxage=30, stale-while-revalidate=5, x-y=1");
        assert!(c.public);
        assert_eq!((c.max_age, c.s_maxage), (Some(60), Some(30)));
        assert_eq!(c.stale_while_revalidate, Some(5));
        assert_eq!(cc("max-age=abc").max_age, Some(0));
    }

    #[test]
    fn s_maxage_beats_max_age_and_expires_counts_from_date() {
        let c = cc("max-age=10, s-maxage=100");
        let l = lifetime(&facts(&c), &ROUTE).unwrap();
        assert_eq!(l.fresh, Duration::from_secs(100));
        let none = CacheControl::default();
        let mut f = facts(&none);
        f.expires = Some(Some(1_000_060));
        f.date = Some(1_000_000);
        assert_eq!(lifetime(&f, &ROUTE).unwrap().fresh, Duration::from_secs(60));
        f.expires = Some(None);
        assert_eq!(lifetime(&f, &ROUTE), None, "an invalid Expires is stale");
        // No Date (or an invalid one): Expires counts from when the response arrived.
        f.expires = Some(Some(1_000_030));
        f.date = None;
        assert_eq!(lifetime(&f, &ROUTE).unwrap().fresh, Duration::from_secs(30));
    }

    #[test]
    fn must_understand_stores_known_statuses_despite_no_store_and_no_others() {
        let c = cc("max-age=3600, no-store, must-understand");
        let mut f = facts(&c);
        assert_eq!(
            lifetime(&f, &ROUTE).unwrap().fresh,
            Duration::from_secs(3600)
        );
        f.status = 599;
        assert_eq!(lifetime(&f, &ROUTE), None);
        let c = cc("max-age=3600, must-understand");
        let mut f = facts(&c);
        f.status = 299;
        assert_eq!(lifetime(&f, &ROUTE), None);
        assert_eq!(
            lifetime(&facts(&cc("max-age=3600, no-store")), &ROUTE),
            None
        );
    }

    #[test]
    fn private_no_store_cookies_and_credentials_are_not_shared() {
        for v in ["private, max-age=60", "no-store, max-age=60"] {
            assert_eq!(lifetime(&facts(&cc(v)), &ROUTE), None, "{v}");
        }
        let c = cc("max-age=60");
        let mut f = facts(&c);
        f.set_cookie = true;
        assert_eq!(lifetime(&f, &ROUTE), None);
        let p = cc("public, max-age=60");
        let mut f = facts(&p);
        f.set_cookie = true;
        f.authorization = true;
        assert!(lifetime(&f, &ROUTE).is_some());
        let mut f = facts(&c);
        f.authorization = true;
        assert_eq!(lifetime(&f, &ROUTE), None);
    }

    #[test]
    fn default_ttl_only_for_heuristic_statuses_and_no_cache_needs_a_validator() {
        let none = CacheControl::default();
        assert_eq!(lifetime(&facts(&none), &ROUTE), None);
        let ttl = Settings {
            default_ttl: Duration::from_secs(30),
            ..ROUTE
        };
        assert_eq!(
            lifetime(&facts(&none), &ttl).unwrap().fresh,
            Duration::from_secs(30)
        );
        let mut f = facts(&none);
        f.status = 302;
        assert_eq!(lifetime(&f, &ttl), None);
        let nc = cc("no-cache");
        assert_eq!(lifetime(&facts(&nc), &ROUTE), None);
        let mut f = facts(&nc);
        f.has_validator = true;
        assert!(lifetime(&f, &ROUTE).unwrap().always_revalidate);
    }

    #[test]
    fn stale_windows_take_the_longer_and_must_revalidate_forbids_them() {
        let route = Settings {
            stale_if_error: Duration::from_secs(60),
            ..ROUTE
        };
        let c = cc("max-age=1, stale-while-revalidate=30");
        let l = lifetime(&facts(&c), &route).unwrap();
        assert_eq!(l.stale_while_revalidate, Duration::from_secs(30));
        assert_eq!(l.stale_if_error, Duration::from_secs(60));
        let m = cc("max-age=1, must-revalidate, stale-if-error=60");
        assert_eq!(
            lifetime(&facts(&m), &route).unwrap().stale_if_error,
            Duration::ZERO
        );
    }

    #[test]
    fn cache_age_takes_the_first_member_and_ignores_invalid_values() {
        for (v, want) in [
            ("30", Some(30)),
            ("7200, 0", Some(7200)),
            ("0, 7200", Some(0)),
            ("7200;foo=bar", Some(7200)),
            ("99999999999999999999999", Some(1 << 31)),
            ("abc", None),
            ("-7200", None),
            ("7200.0", None),
            ("1.5", None),
            ("", None),
        ] {
            assert_eq!(age(v.as_bytes()), want, "{v:?}");
        }
    }

    #[test]
    fn cache_targeted_fields_parse_as_structured_fields_or_are_ignored() {
        let t = |s: &str| CacheControl::parse_targeted([s.as_bytes()].into_iter());
        let c = t("max-age=3600, stale-if-error=60, foobar").unwrap();
        assert_eq!((c.max_age, c.stale_if_error), (Some(3600), Some(60)));
        assert!(t("no-store").unwrap().no_store);
        assert!(t("private;x=1").unwrap().private);
        assert_eq!(
            t("max-age=99999999999").unwrap().max_age,
            Some(99_999_999_999)
        );
        for bad in [
            "",
            "max-age=10000, &&&&&",
            "max-age=\"10000\"",
            "max-age =100",
            "max-age= 100",
            "MaX-aGe=3600",
        ] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ages_and_validators() {
        assert_eq!(initial_age_ms(Some(5), None, 1_000, 1_200), 5_200);
        assert_eq!(initial_age_ms(None, Some(10), 10_000, 12_000), 2_000);
        assert!(none_match(b"\"a\", W/\"b\"", b"\"b\""));
        assert!(none_match(b"*", b"\"x\""));
        assert!(!none_match(b"\"a\"", b"\"b\""));
    }
}
