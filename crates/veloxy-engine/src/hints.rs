//! `103 Early Hints` veloxy sends itself, on routes with `early_hints = true` (as Cloudflare
//! does): the `Link` fields with `rel=preload` or `rel=preconnect` of the last `200` answer
//! to a GET of a path are remembered, and the next GET of that path gets them in a 103 before
//! the upstream is asked, so the browser starts those fetches while the upstream works.
//!
//! The memory is per worker and per generation (a reload starts it afresh), keyed by the
//! route's index and the request path (without its query), and bounded: at most
//! [`MAX_ENTRIES`] paths and [`MAX_BYTES`] bytes of paths and fields, the least recently used
//! path forgotten first. A path's entry holds at most [`MAX_ENTRY_BYTES`]. A 200 without such
//! a field forgets the path; other statuses teach nothing.

use http::HeaderValue;

/// Paths remembered per worker.
pub(crate) const MAX_ENTRIES: usize = 1024;
/// Bytes (paths and field values) remembered per worker.
pub(crate) const MAX_BYTES: usize = 256 * 1024;
/// The largest set of fields one path keeps (more are left out).
pub(crate) const MAX_ENTRY_BYTES: usize = 4096;

/// Where a request's hints are remembered: its route and path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HintKey {
    pub route: usize,
    pub path: Box<str>,
}

/// One worker's remembered Link fields (see the module doc).
#[derive(Default)]
pub(crate) struct Memory {
    lru: Option<hashlink::LruCache<HintKey, Vec<HeaderValue>>>,
    bytes: usize,
}

fn cost(key: &HintKey, links: &[HeaderValue]) -> usize {
    key.path.len() + links.iter().map(|v| v.len()).sum::<usize>()
}

impl Memory {
    /// The fields remembered for `key` (a clone), marked as recently used.
    pub(crate) fn get(&mut self, key: &HintKey) -> Option<Vec<HeaderValue>> {
        self.lru.as_mut()?.get(key).cloned()
    }

    /// Remembers the preload and preconnect links among `links` (Link field values) for
    /// `key`; none forgets the path.
    pub(crate) fn learn<'a>(&mut self, key: &HintKey, links: impl Iterator<Item = &'a [u8]>) {
        let mut kept = Vec::new();
        let mut size = 0;
        for value in links {
            for link in hinted_links(value) {
                if size + link.len() > MAX_ENTRY_BYTES {
                    break;
                }
                if let Ok(v) = HeaderValue::from_bytes(link) {
                    size += link.len();
                    kept.push(v);
                }
            }
        }
        if kept.is_empty() {
            self.forget(key);
            return;
        }
        let lru = self
            .lru
            .get_or_insert_with(|| hashlink::LruCache::new(MAX_ENTRIES));
        if lru.get(key) == Some(&kept) {
            return;
        }
        let added = cost(key, &kept);
        if let Some(old) = lru.insert(key.clone(), kept) {
            self.bytes -= cost(key, &old);
        }
        self.bytes += added;
        while self.bytes > MAX_BYTES || lru.len() > MAX_ENTRIES {
            let Some((k, v)) = lru.remove_lru() else {
                break;
            };
            self.bytes -= cost(&k, &v);
        }
    }

    fn forget(&mut self, key: &HintKey) {
        if let Some(old) = self.lru.as_mut().and_then(|l| l.remove(key)) {
            self.bytes -= cost(key, &old);
        }
    }

    /// Paths remembered (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lru.as_ref().map_or(0, |l| l.len())
    }
}

/// The links of one Link field value (a comma-separated list, RFC 8288) whose `rel` names
/// `preload` or `preconnect`, each as written. Hand-written: a split on the commas outside
/// `<...>` and quotes and a look at one parameter, where a Link parser crate would build
/// every link's URI and parameters.
pub(crate) fn hinted_links(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    split_links(value)
        .into_iter()
        .map(<[u8]>::trim_ascii)
        .filter(|link| hinted(link))
}

fn split_links(value: &[u8]) -> Vec<&[u8]> {
    let (mut out, mut start, mut angle, mut quote) = (Vec::new(), 0, false, false);
    for (i, &b) in value.iter().enumerate() {
        match b {
            b'<' if !quote => angle = true,
            b'>' if !quote => angle = false,
            b'"' if !angle => quote = !quote,
            b',' if !angle && !quote => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&value[start..]);
    out
}

/// A link whose `rel` parameter names `preload` or `preconnect`.
fn hinted(link: &[u8]) -> bool {
    if !link.starts_with(b"<") {
        return false;
    }
    let Some(end) = link.iter().position(|&b| b == b'>') else {
        return false;
    };
    link[end + 1..].split(|&b| b == b';').any(|param| {
        let param = param.trim_ascii();
        let Some(eq) = param.iter().position(|&b| b == b'=') else {
            return false;
        };
        if !param[..eq].trim_ascii().eq_ignore_ascii_case(b"rel") {
            return false;
        }
        let rels = param[eq + 1..].trim_ascii();
        let rels = rels
            .strip_prefix(b"\"")
            .and_then(|r| r.strip_suffix(b"\""))
            .unwrap_or(rels);
        rels.split(|b| b.is_ascii_whitespace())
            .any(|r| r.eq_ignore_ascii_case(b"preload") || r.eq_ignore_ascii_case(b"preconnect"))
    })
}

/// Interim heads of an upstream forwarded to a client per response, on every client
/// protocol; later ones are dropped (an upstream cannot make veloxy write heads without end
/// while its final one waits).
pub(crate) const MAX_FORWARDED: u8 = 8;

/// The informational (1xx) responses of one framed request on their way to its client, for
/// codecs that can send one before the final response (HTTP/3): the codec puts one in the
/// request's extensions and sends what arrives while the exchange runs. A few at most wait;
/// more are dropped (they are hints). One small allocation per request, no channel (tokio's
/// would allocate a block of slots for every request).
#[derive(Clone, Default)]
pub(crate) struct Interims(std::sync::Arc<Queue>);

/// What an [`Interims`] shares: the waiting responses and the codec's wake-up.
#[derive(Default)]
pub(crate) struct Queue {
    waiting: std::sync::Mutex<std::collections::VecDeque<http::Response<()>>>,
    ready: tokio::sync::Notify,
    /// Upstream interim heads forwarded (at most [`MAX_FORWARDED`]).
    forwarded: std::sync::atomic::AtomicU8,
}

impl Interims {
    /// Interim responses waiting for the codec, at most.
    const QUEUE: usize = 4;

    /// Sends `res` to the client (unless the codec is behind by [`Self::QUEUE`]).
    pub(crate) fn send(&self, res: http::Response<()>) {
        let mut waiting = self.0.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.len() < Self::QUEUE {
            waiting.push_back(res);
            self.0.ready.notify_one();
        }
    }

    /// Forwards an upstream's interim head (HTTP/1 bytes) if it is one to forward and fewer
    /// than [`MAX_FORWARDED`] went before it.
    pub(crate) fn forward(&self, head: &[u8]) {
        use std::sync::atomic::Ordering;
        let Some(res) = crate::http1::interim::to_response(head) else {
            return;
        };
        if self.0.forwarded.load(Ordering::Relaxed) < MAX_FORWARDED {
            self.0.forwarded.fetch_add(1, Ordering::Relaxed);
            self.send(res);
        }
    }

    /// The next waiting response, if any.
    pub(crate) fn take(&self) -> Option<http::Response<()>> {
        let mut waiting = self.0.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.pop_front()
    }

    /// The next response, waiting for one.
    pub(crate) async fn next(&self) -> http::Response<()> {
        loop {
            if let Some(res) = self.take() {
                return res;
            }
            self.0.ready.notified().await;
        }
    }
}

/// Writes a `103 Early Hints` head with `links` for an HTTP/1.1 client.
pub(crate) fn write_h1(links: &[HeaderValue], out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 103 Early Hints\r\n");
    for v in links {
        out.extend_from_slice(b"Link: ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A `103 Early Hints` with `links`, for HTTP/2 and HTTP/3 clients.
pub(crate) fn response(links: Vec<HeaderValue>) -> http::Response<()> {
    let mut res = http::Response::new(());
    *res.status_mut() = http::StatusCode::EARLY_HINTS;
    for v in links {
        res.headers_mut().append(http::header::LINK, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(path: &str) -> HintKey {
        HintKey {
            route: 0,
            path: path.into(),
        }
    }

    #[test]
    fn keeps_preload_and_preconnect_only() {
        let v = b"</a.css>; rel=preload; as=style, </x,y>; rel=\"next\", \
            <https://cdn.example>; rel=\"preconnect dns-prefetch\", </b.js>; rel=modulepreload";
        let got: Vec<&[u8]> = hinted_links(v).collect();
        assert_eq!(
            got,
            [
                &b"</a.css>; rel=preload; as=style"[..],
                b"<https://cdn.example>; rel=\"preconnect dns-prefetch\""
            ]
        );
    }

    #[test]
    fn bounded_and_forgetting() {
        let mut m = Memory::default();
        assert!(m.get(&key("/")).is_none());
        m.learn(&key("/"), [&b"</a.css>; rel=preload"[..]].into_iter());
        assert_eq!(m.get(&key("/")).unwrap().len(), 1);
        m.learn(&key("/"), [&b"</a>; rel=next"[..]].into_iter());
        assert!(m.get(&key("/")).is_none());
        assert_eq!(m.bytes, 0);
        for i in 0..MAX_ENTRIES + 10 {
            m.learn(
                &key(&format!("/{i}")),
                [&b"</a.css>; rel=preload"[..]].into_iter(),
            );
        }
        assert_eq!(m.len(), MAX_ENTRIES);
        assert!(m.get(&key("/0")).is_none());
        let big = format!("</{}>; rel=preload", "x".repeat(4000));
        for i in 0..100 {
            m.learn(&key(&format!("/b{i}")), [big.as_bytes()].into_iter());
        }
        assert!(m.bytes <= MAX_BYTES);
    }

    #[test]
    fn an_upstream_gets_at_most_max_forwarded_interim_heads_through() {
        let q = Interims::default();
        let mut through = 0;
        for _ in 0..3 * MAX_FORWARDED {
            q.forward(b"HTTP/1.1 102 Processing\r\n\r\n");
            while q.take().is_some() {
                through += 1;
            }
        }
        assert_eq!(through, MAX_FORWARDED);
        // veloxy's own 103 is not an upstream's: it is not counted.
        q.send(response(Vec::new()));
        assert!(q.take().is_some());
    }
}
