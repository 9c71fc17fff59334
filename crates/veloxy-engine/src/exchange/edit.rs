//! Header edits, decided once at admission and applied by each codec to its own form of a
//! message head: the route's `request_headers` to the upstream request, its
//! `response_headers` (and `location_rewrite`, and the request ID) to every answer.
//!
//! Values are rendered at admission, where the request's variables are at hand; the codecs
//! only drop fields by name, rewrite `Location`, and append the rendered lines. A route
//! without rules and a server without `request_id` build no edit at all.

use crate::upstream::addr::BackendAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};

use crate::rules::RouteRules;

/// The edit of the request sent upstream.
#[derive(Clone)]
pub(crate) struct UpstreamEdit {
    rules: Option<Arc<RouteRules>>,
    /// The request-ID field (lowercase): the client's is replaced by the kept or new ID.
    id_field: Option<Box<str>>,
    /// Set and added fields, and the request ID, as "Name: value\r\n" lines.
    pub lines: Vec<u8>,
    /// A sampled exchange's trace: the client's `traceparent` and `tracestate` are replaced
    /// by veloxy's (in `lines`), and upstream attempts record their events in it.
    trace: Option<crate::otel::TraceRef>,
}

/// Buffers for rendered lines, kept per thread: an edit takes one and gives it back when it
/// is dropped, so rendering costs no allocation once warm.
mod pool {
    use std::cell::RefCell;

    const KEPT: usize = 64;
    const CAPACITY: usize = 256;

    thread_local! {
        static FREE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn take() -> Vec<u8> {
        FREE.with(|f| f.borrow_mut().pop())
            .unwrap_or_else(|| Vec::with_capacity(CAPACITY))
    }

    pub(super) fn give(mut v: Vec<u8>) {
        if v.capacity() == 0 || v.capacity() > 4 * CAPACITY {
            return;
        }
        v.clear();
        FREE.with(|f| {
            let mut f = f.borrow_mut();
            if f.len() < KEPT {
                f.push(v);
            }
        });
    }
}

/// A pooled, empty buffer for rendered lines.
pub(crate) fn line_buffer() -> Vec<u8> {
    pool::take()
}

/// The rewritten request target of a proxied request (`strip_prefix`, `rewrite`), in a
/// pooled buffer given back when the request ends.
pub(crate) struct UpstreamTarget(String);

impl UpstreamTarget {
    /// Renders `rule` for the client's `target`.
    pub(crate) fn new(
        rule: &crate::template::PathRule,
        target: &str,
        vars: &dyn crate::template::Vars,
    ) -> UpstreamTarget {
        // The pool holds bytes; an empty buffer is valid UTF-8.
        let buf = String::from_utf8(pool::take()).unwrap_or_default();
        UpstreamTarget(rule.apply(target, vars, buf))
    }
}

impl UpstreamTarget {
    /// A target made elsewhere (the search gateway's clamped query).
    pub(crate) fn from_string(target: String) -> UpstreamTarget {
        UpstreamTarget(target)
    }
}

impl std::ops::Deref for UpstreamTarget {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Clone for UpstreamTarget {
    fn clone(&self) -> Self {
        UpstreamTarget(self.0.clone())
    }
}

impl Drop for UpstreamTarget {
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.0).into_bytes());
    }
}

impl Drop for UpstreamEdit {
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.lines));
    }
}

impl Drop for ResponseEdit {
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.lines));
    }
}

impl crate::http1::DropsFields for UpstreamEdit {
    #[inline]
    fn drops(&self, name: &str) -> bool {
        UpstreamEdit::drops(self, name)
    }
}

impl UpstreamEdit {
    /// An edit that only adds lines (given later with [`push_lines`](Self::push_lines)).
    pub(crate) fn empty() -> UpstreamEdit {
        UpstreamEdit::new(None, None, Vec::new())
    }

    /// Adds "Name: value\r\n" lines to the upstream request (forward_auth's copied fields).
    pub(crate) fn push_lines(&mut self, lines: &[u8]) {
        self.lines.extend_from_slice(lines);
    }

    pub(crate) fn new(
        rules: Option<Arc<RouteRules>>,
        id_field: Option<Box<str>>,
        lines: Vec<u8>,
    ) -> UpstreamEdit {
        UpstreamEdit {
            rules,
            id_field,
            lines,
            trace: None,
        }
    }

    /// A sampled exchange: the upstream request carries veloxy's trace context instead of
    /// the client's.
    pub(crate) fn trace(&mut self, t: &crate::otel::TraceRef) {
        t.upstream_lines(&mut self.lines);
        self.trace = Some(t.clone());
    }

    /// The sampled exchange's trace, if any.
    pub(crate) fn traced(&self) -> Option<&crate::otel::Trace> {
        self.trace.as_deref()
    }

    /// Lets go of the trace (a background refresh outlives its exchange; the request head it
    /// sends was written already).
    pub(crate) fn untrace(&mut self) {
        self.trace = None;
    }

    /// The client's `name` fields are not forwarded: those the rules set or remove, the
    /// request ID's, and those forward_auth copies (a client must not supply its own
    /// `Remote-User`).
    pub fn drops(&self, name: &str) -> bool {
        self.trace.as_ref().is_some_and(|t| t.replaces(name))
            || self
                .id_field
                .as_deref()
                .is_some_and(|f| f.eq_ignore_ascii_case(name))
            || self.rules.as_ref().is_some_and(|r| {
                r.request.as_ref().is_some_and(|q| q.drops(name))
                    || r.forward_auth.as_ref().is_some_and(|f| {
                        f.copy_headers.iter().any(|c| c.eq_ignore_ascii_case(name))
                            || f.remove_headers.iter().any(|p| p.matches(name))
                    })
            })
    }

    /// The lines to add: the rules' when they are the same for every request (rendered
    /// once at load, not copied), then this request's.
    pub fn added(&self) -> [&[u8]; 2] {
        let fixed = self
            .rules
            .as_ref()
            .and_then(|r| r.request.as_ref())
            .and_then(|r| r.fixed());
        [fixed.unwrap_or(&[]), &self.lines]
    }

    /// The Host the rules set, if they set one (an HTTP/2 upstream gets it as `:authority`).
    pub fn host(&self) -> Option<&str> {
        self.added()
            .into_iter()
            .flat_map(lines)
            .find(|(n, _)| n.eq_ignore_ascii_case(b"host"))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }
}

/// The edit of every answer on a route.
pub(crate) struct ResponseEdit {
    pub(crate) rules: Option<Arc<RouteRules>>,
    id_field: Option<Box<str>>,
    /// Set and added fields rendered for this request (none when the rules' values are all
    /// fixed: those are rendered once, at load), and the request ID.
    lines: Vec<u8>,
    /// `location_rewrite`: the client's `scheme://host`, and the Host sent upstream when the
    /// rules replaced the client's.
    location: Option<Box<(String, Option<String>)>>,
}

impl ResponseEdit {
    /// An edit that only adds these lines (a cache status field).
    pub(crate) fn with_lines(lines: Vec<u8>) -> ResponseEdit {
        ResponseEdit {
            rules: None,
            id_field: None,
            lines,
            location: None,
        }
    }

    /// This answer's own lines, to add more (CORS fields).
    pub(crate) fn lines_mut(&mut self) -> &mut Vec<u8> {
        &mut self.lines
    }

    /// The message's own fields may change (some are dropped or rewritten); otherwise lines
    /// are only added.
    fn edits_fields(&self) -> bool {
        self.id_field.is_some()
            || self.location.is_some()
            || self
                .rules
                .as_ref()
                .and_then(|r| r.response.as_ref())
                .is_some_and(|r| !r.dropped().is_empty())
    }

    pub(crate) fn new(
        rules: Option<Arc<RouteRules>>,
        id_field: Option<Box<str>>,
        lines: Vec<u8>,
        location: Option<Box<(String, Option<String>)>>,
    ) -> ResponseEdit {
        ResponseEdit {
            rules,
            id_field,
            lines,
            location,
        }
    }
}

/// What happens to one field of a response head.
enum Action {
    Keep,
    Drop,
    Replace(Vec<u8>),
}

/// The edits of one response: the route's (if any) and the hooks' added lines.
pub(crate) struct ResponseView<'a> {
    pub(crate) edit: Option<&'a ResponseEdit>,
    pub(crate) hooks: &'a [u8],
    /// The backend that answered (a proxied response), for `location_rewrite`.
    pub(crate) backend: Option<&'a BackendAddr>,
}

impl ResponseView<'_> {
    /// The message's own `name` fields go (removed or replaced).
    pub fn drops(&self, name: &[u8]) -> bool {
        self.edit.is_some_and(|e| {
            e.id_field
                .as_deref()
                .is_some_and(|f| f.as_bytes().eq_ignore_ascii_case(name))
                || e.rules
                    .as_ref()
                    .and_then(|r| r.response.as_ref())
                    .is_some_and(|r| r.drops_bytes(name))
        })
    }

    fn action(&self, name: &[u8], value: &[u8]) -> Action {
        if self.drops(name) {
            return Action::Drop;
        }
        let Some((base, host)) = self.edit.and_then(|e| e.location.as_deref()) else {
            return Action::Keep;
        };
        if !(name.eq_ignore_ascii_case(b"location") || name.eq_ignore_ascii_case(b"refresh")) {
            return Action::Keep;
        }
        match rewrite_location(value, base, self.backend, host.as_deref()) {
            Some(v) => Action::Replace(v),
            None => Action::Keep,
        }
    }

    /// The first bytes (both cases) of the names this edit may drop or rewrite.
    fn first_bytes(&self) -> ByteSet {
        let mut set = ByteSet::default();
        let Some(e) = self.edit else { return set };
        let mut add = |name: &[u8]| {
            if let Some(&b) = name.first() {
                set.insert(b.to_ascii_lowercase());
                set.insert(b.to_ascii_uppercase());
            }
        };
        if let Some(f) = &e.id_field {
            add(f.as_bytes());
        }
        if let Some(r) = e.rules.as_ref().and_then(|r| r.response.as_ref()) {
            r.dropped().iter().for_each(|n| add(n.as_bytes()));
        }
        if e.location.is_some() {
            add(b"location");
            add(b"refresh");
        }
        set
    }

    /// The lines to add: the route's fixed ones (rendered at load), this request's, then
    /// the hooks'.
    fn added(&self) -> [&[u8]; 3] {
        let fixed = self
            .edit
            .and_then(|e| e.rules.as_ref())
            .and_then(|r| r.response.as_ref())
            .and_then(|r| r.fixed());
        [
            fixed.unwrap_or(&[]),
            self.edit.map_or(&[][..], |e| &e.lines),
            self.hooks,
        ]
    }

    /// Edits an HTTP/1 head in `buf` (status line first, no final blank line).
    pub fn apply_h1(&self, buf: &mut Vec<u8>) {
        let from = memchr::memchr(b'\n', buf).map_or(buf.len(), |i| i + 1);
        if self.edit.is_some_and(ResponseEdit::edits_fields) {
            let first = self.first_bytes();
            let (mut r, mut w) = (from, from);
            let mut tail = Vec::new();
            // Line ends found in one vectorized pass over the head (a search per short line
            // costs more); bytes at and after `r` never move, so they stay valid.
            let mut ends = [0u32; 96];
            let mut count = 0;
            for i in memchr::memchr_iter(b'\n', &buf[from..]).take(ends.len()) {
                ends[count] = (from + i + 1) as u32;
                count += 1;
            }
            let mut next = 0;
            while r < buf.len() {
                let end = if next < count {
                    next += 1;
                    ends[next - 1] as usize
                } else {
                    memchr::memchr(b'\n', &buf[r..]).map_or(buf.len(), |i| r + i + 1)
                };
                // Most lines name no field the edit touches: their first byte says so.
                if !first.contains(buf[r]) {
                    if w != r {
                        buf.copy_within(r..end, w);
                    }
                    w += end - r;
                    r = end;
                    continue;
                }
                let line = &buf[r..end];
                let colon = memchr::memchr(b':', line).unwrap_or(line.len());
                let value = line.get(colon + 1..).unwrap_or(b"").trim_ascii();
                match self.action(&line[..colon], value) {
                    Action::Keep => {
                        if w != r {
                            buf.copy_within(r..end, w);
                        }
                        w += end - r;
                    }
                    Action::Drop => {}
                    Action::Replace(v) => {
                        tail.extend_from_slice(&line[..colon]);
                        tail.extend_from_slice(b": ");
                        tail.extend_from_slice(&v);
                        tail.extend_from_slice(b"\r\n");
                    }
                }
                r = end;
            }
            buf.truncate(w);
            buf.extend_from_slice(&tail);
        }
        for lines in self.added() {
            buf.extend_from_slice(lines);
        }
    }

    /// Edits a header map (HTTP/2, and heads built by veloxy).
    pub fn apply_map(&self, map: &mut HeaderMap) {
        if let Some(e) = self.edit {
            if let Some(r) = e.rules.as_ref().and_then(|r| r.response.as_ref()) {
                for name in r.dropped() {
                    map.remove(name.as_str());
                }
            }
            if let Some(f) = &e.id_field {
                map.remove(&**f);
            }
            if e.location.is_some() {
                for name in [http::header::LOCATION, http::header::REFRESH] {
                    let Some(v) = map.get(&name) else { continue };
                    if let Action::Replace(new) =
                        self.action(name.as_str().as_bytes(), v.as_bytes())
                    {
                        if let Ok(v) = HeaderValue::from_bytes(&new) {
                            map.insert(name, v);
                        }
                    }
                }
            }
        }
        for raw in self.added() {
            append_fields(lines(raw), map);
        }
    }
}

/// Appends (name, value) fields to a header map, leaving out any that are not valid HTTP.
/// The one way "Name: value" lines (rules, hooks, forward_auth) enter an HTTP/2 message.
pub(crate) fn append_fields<'a>(
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    map: &mut HeaderMap,
) {
    for (n, v) in fields {
        if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
            map.append(n, v);
        }
    }
}

/// A set of bytes, as a 256-bit mask.
#[derive(Default)]
struct ByteSet([u64; 4]);

impl ByteSet {
    fn insert(&mut self, b: u8) {
        self.0[usize::from(b >> 6)] |= 1 << (b & 63);
    }
    fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] & (1 << (b & 63)) != 0
    }
}

pub(crate) use crate::http1::lines;

/// A `Location` (or `Refresh`'s `url=`) pointing at `backend` or at `host` (the Host sent
/// upstream) made to point at `base` (the client's `scheme://host`).
fn rewrite_location(
    value: &[u8],
    base: &str,
    backend: Option<&BackendAddr>,
    host: Option<&str>,
) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?;
    let start = text.find("http://").or_else(|| text.find("https://"))?;
    let after_scheme = start + text[start..].find("://")? + 3;
    let end = text[after_scheme..]
        .find(['/', '?', '#', ' ', ';'])
        .map_or(text.len(), |i| after_scheme + i);
    let authority = &text[after_scheme..end];
    let matches = backend.is_some_and(|b| authority == b.to_string())
        || host.is_some_and(|h| authority.eq_ignore_ascii_case(h));
    if !matches {
        return None;
    }
    let mut out = String::with_capacity(text.len() + base.len());
    out.push_str(&text[..start]);
    out.push_str(base);
    out.push_str(&text[end..]);
    Some(out.into_bytes())
}

/// The request ID: the client's when it is a plausible one (1 to 128 characters of
/// `[A-Za-z0-9._~:+/=-]`), a new one otherwise.
pub(crate) fn request_id(incoming: Option<&[u8]>) -> String {
    let valid = |v: &[u8]| {
        (1..=128).contains(&v.len())
            && v.iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"._~:+/=-".contains(&b))
    };
    match incoming {
        Some(v) if valid(v) => String::from_utf8_lossy(v).into_owned(),
        _ => new_request_id(),
    }
}

/// 32 hex digits: a per-thread counter hashed under a per-thread random key (unique, not
/// guessable from one another without the key; not a secret).
fn new_request_id() -> String {
    use std::cell::Cell;
    use std::hash::BuildHasher;
    thread_local! {
        static KEY: (std::hash::RandomState, Cell<u64>) =
            (std::hash::RandomState::new(), Cell::new(0));
    }
    KEY.with(|(key, n)| {
        let i = n.get();
        n.set(i + 1);
        format!(
            "{:016x}{:016x}",
            key.hash_one((i, 0u8)),
            key.hash_one((i, 1u8))
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_rewrites() {
        let b: BackendAddr = "127.0.0.1:8080".parse().unwrap();
        let r = |v: &str, h: Option<&str>| {
            rewrite_location(v.as_bytes(), "https://example.com", Some(&b), h)
                .map(|v| String::from_utf8(v).unwrap())
        };
        assert_eq!(
            r("http://127.0.0.1:8080/login?x=1", None).as_deref(),
            Some("https://example.com/login?x=1")
        );
        assert_eq!(
            r("http://app.internal/a", Some("app.internal")).as_deref(),
            Some("https://example.com/a")
        );
        assert_eq!(
            r("0; url=http://127.0.0.1:8080/", None).as_deref(),
            Some("0; url=https://example.com/")
        );
        assert_eq!(r("https://elsewhere.org/", None), None);
        assert_eq!(r("/relative", None), None);
    }

    #[test]
    fn request_ids() {
        assert_eq!(request_id(Some(b"abc-123")), "abc-123");
        assert_eq!(request_id(Some(b"bad id")).len(), 32);
        assert_ne!(request_id(None), request_id(None));
    }

    #[test]
    fn h1_head_edit() {
        let rules = crate::rules::HeaderRules::new(
            vec![(
                "X-Frame-Options".into(),
                crate::template::Template::parse("DENY").unwrap(),
            )],
            vec![],
            vec!["Server".into()],
        );
        let rules = RouteRules {
            response: Some(rules),
            ..Default::default()
        };
        // Fixed values: rendered at load, added by reference.
        let edit = ResponseEdit::new(Some(Arc::new(rules)), None, Vec::new(), None);
        let view = ResponseView {
            edit: Some(&edit),
            hooks: b"X-Hook: 1\r\n",
            backend: None,
        };
        let mut buf =
            b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 2\r\nx-frame-options: SAMEORIGIN\r\n"
                .to_vec();
        view.apply_h1(&mut buf);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Frame-Options: DENY\r\nX-Hook: 1\r\n"
        );
    }
}
