//! The compact span records a sampled exchange fills on its worker and the exporter thread
//! encodes ([`super::proto`]): ids as integers, times as nanosecond offsets from one wall
//! clock reading, names as enums, attribute values as numbers, enums and short inline texts.
//! Filling them allocates nothing beyond the exchange's [`Spans`] (moved whole into the
//! worker's batch at the end) and its list of child spans; the attribute names and the
//! protobuf shape live in the encoder.

use crate::upstream::addr::BackendAddr;

/// A short text copied inline (no allocation) when it fits in `N` bytes, boxed otherwise.
#[derive(Debug, Clone)]
pub(crate) enum Text<const N: usize> {
    /// Up to `N` bytes of UTF-8, `.0` long.
    Inline(u8, [u8; N]),
    /// A longer text.
    Heap(Box<str>),
}

impl<const N: usize> Text<N> {
    pub(crate) fn new(s: &str) -> Self {
        if s.len() <= N && N <= 255 {
            let mut buf = [0; N];
            buf[..s.len()].copy_from_slice(s.as_bytes());
            Text::Inline(s.len() as u8, buf)
        } else {
            Text::Heap(s.into())
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Only `new` makes it, from a whole `&str`.
            Text::Inline(n, buf) => std::str::from_utf8(&buf[..usize::from(*n)]).unwrap_or(""),
            Text::Heap(s) => s,
        }
    }
}

impl<const N: usize> Default for Text<N> {
    fn default() -> Self {
        Text::Inline(0, [0; N])
    }
}

/// `error.type` (and the status message) of a span.
#[derive(Debug, Clone)]
pub(crate) enum ErrorType {
    /// A 5xx status, written as its number.
    Status(u16),
    /// A fixed name (`incomplete`, `upstream`, `downstream`).
    Static(&'static str),
    /// An error kind's name (only failed exchanges and attempts pay for it).
    Kind(Box<str>),
}

impl ErrorType {
    /// Writes the text into `buf` (a status needs 3 digits) and returns it.
    pub(crate) fn as_str<'a>(&'a self, buf: &'a mut [u8; 5]) -> &'a str {
        match self {
            ErrorType::Status(s) => {
                let mut n = *s;
                let mut at = buf.len();
                loop {
                    at -= 1;
                    buf[at] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 || at == 0 {
                        break;
                    }
                }
                std::str::from_utf8(&buf[at..]).unwrap_or("")
            }
            ErrorType::Static(s) => s,
            ErrorType::Kind(s) => s,
        }
    }
}

/// What a child span timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The forward_auth subrequest.
    ForwardAuth,
    /// The wait for the route's concurrency slot.
    QueueWait,
    /// One upstream attempt (a client span).
    Attempt,
}

impl Step {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Step::ForwardAuth => "forward_auth",
            Step::QueueWait => "queue wait",
            Step::Attempt => "upstream attempt",
        }
    }
}

/// An event of an upstream attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventName {
    /// A connection to the backend: `veloxy.connection.reused` says whether it was pooled.
    Connected,
    /// The request (head and body) was written.
    RequestSent,
    /// The response head arrived (the time to first byte).
    ResponseHead,
    /// A new TLS connection's handshake completed (`connected` marks its TCP connect).
    TlsHandshake,
}

impl EventName {
    pub(crate) fn name(self) -> &'static str {
        match self {
            EventName::Connected => "connected",
            EventName::RequestSent => "request sent",
            EventName::ResponseHead => "response head",
            EventName::TlsHandshake => "tls handshake",
        }
    }
}

/// An attempt's event: its name, when (nanoseconds after the exchange started) and, for
/// `connected`, whether the connection was reused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub name: EventName,
    pub at: u64,
    pub reused: Option<bool>,
}

/// Events an attempt keeps; later ones are not recorded (a replay loop is bounded anyway).
pub(crate) const MAX_EVENTS: usize = 8;

/// An attempt's events, inline.
#[derive(Debug, Clone, Default)]
pub(crate) struct Events {
    pub n: u8,
    pub list: [Option<Event>; MAX_EVENTS],
}

impl Events {
    pub(crate) fn push(&mut self, e: Event) {
        if let Some(slot) = self.list.get_mut(usize::from(self.n)) {
            *slot = Some(e);
            self.n += 1;
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Event> {
        self.list[..usize::from(self.n)].iter().flatten()
    }
}

/// A finished child span of the exchange's span.
#[derive(Debug, Clone)]
pub(crate) struct Child {
    pub id: u64,
    pub step: Step,
    /// Start and end, in nanoseconds after the exchange started.
    pub start: u64,
    pub end: u64,
    /// `veloxy.backend` (attempts).
    pub backend: Option<BackendAddr>,
    /// `http.request.resend_count` and `veloxy.retry` when above 0.
    pub resend: u32,
    /// `http.response.status_code` when not 0.
    pub status: u16,
    /// `veloxy.forward_auth.allowed`.
    pub allowed: Option<bool>,
    pub error: Option<ErrorType>,
    pub events: Events,
}

/// The exchange's (server) span's attributes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Server {
    pub method: Text<15>,
    pub path: Text<63>,
    pub query: Option<Box<str>>,
    pub tls: bool,
    /// `http.route`: the route's path (also the span's name, after the method).
    pub route: Text<47>,
    pub host: Text<47>,
    pub port: u16,
    pub client: Text<47>,
    /// 0: HTTP/1.0, 1: HTTP/1.1, 2, 3.
    pub version: u8,
    /// `veloxy.cache.status`.
    pub cache: Option<&'static str>,
    pub backend: Option<BackendAddr>,
    /// The answer's status; 0: none.
    pub status: u16,
    pub error: Option<ErrorType>,
    /// An L4 stream's connection (`route` then names the listener), not an HTTP exchange:
    /// the bytes received from and sent to the client.
    pub stream: Option<(u64, u64)>,
}

impl Server {
    pub(crate) fn version(&self) -> &'static str {
        match self.version {
            0 => "1.0",
            1 => "1.1",
            2 => "2",
            _ => "3",
        }
    }
}

/// One sampled exchange's spans: the server span and its children, with the ids and the
/// trace context they share. Moved whole to the exporter thread.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spans {
    pub trace_id: u128,
    pub span_id: u64,
    /// The client's span (0: none).
    pub parent: u64,
    /// The client's `tracestate`, normalized.
    pub state: Option<Box<str>>,
    /// Unix time of the exchange's start, in nanoseconds.
    pub wall: u64,
    /// The server span's end, in nanoseconds after its start.
    pub end: u64,
    pub server: Server,
    pub children: Vec<Child>,
}

impl Spans {
    /// How many spans this is.
    pub(crate) fn count(&self) -> usize {
        1 + self.children.len()
    }
}

/// Writes `v` as `2 * N` lowercase hex digits into `out`.
pub(crate) fn hex<const N: usize>(v: &[u8; N], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in v.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 15)];
    }
}

/// A trace id and span id as hex text, on the stack (the access log's columns).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HexIds {
    trace: [u8; 32],
    span: [u8; 16],
}

impl HexIds {
    pub(crate) fn new(trace: u128, span: u64) -> HexIds {
        let mut ids = HexIds {
            trace: [0; 32],
            span: [0; 16],
        };
        hex(&trace.to_be_bytes(), &mut ids.trace);
        hex(&span.to_be_bytes(), &mut ids.span);
        ids
    }

    pub(crate) fn trace(&self) -> &str {
        std::str::from_utf8(&self.trace).unwrap_or("")
    }

    pub(crate) fn span(&self) -> &str {
        std::str::from_utf8(&self.span).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_and_hex() {
        let t = Text::<7>::new("abcdefg");
        assert!(matches!(t, Text::Inline(7, _)));
        assert_eq!(t.as_str(), "abcdefg");
        let t = Text::<7>::new("abcdefgh");
        assert!(matches!(t, Text::Heap(_)));
        assert_eq!(t.as_str(), "abcdefgh");
        let ids = HexIds::new(0x4bf92f3577b34da6a3ce929d0e0e4736, 0xf067aa0ba902b7);
        assert_eq!(ids.trace(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ids.span(), "00f067aa0ba902b7");
        let mut buf = [0; 5];
        assert_eq!(ErrorType::Status(502).as_str(&mut buf), "502");
        assert_eq!(ErrorType::Status(0).as_str(&mut buf), "0");
    }
}
