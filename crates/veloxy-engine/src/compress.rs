//! Content codings: `Accept-Encoding` negotiation, one-shot compression of cached static
//! files, and a streaming encoder for proxied responses (`compress = true` on a route).
//!
//! Levels (see the README): gzip 6 everywhere (zlib's default, the usual size/CPU knee);
//! brotli 5 for static variants, which are compressed once and then served from memory, and 4
//! for streamed proxy bodies, which pay the cost on every response; zstd 3 (its default) for
//! both. When several codings are equally acceptable to the client, the server prefers brotli
//! (smallest output), then zstd (fastest to decode), then gzip.

use std::io::{self, Write};

/// Bodies smaller than this are never compressed: the coding's framing and the CPU cost
/// outweigh the bytes saved.
pub const MIN_SIZE: u64 = 256;
/// gzip level for all uses.
pub const GZIP_LEVEL: u32 = 6;
/// brotli quality for static variants (compressed once, cached).
pub const BROTLI_STATIC_LEVEL: u32 = 5;
/// brotli quality for streamed proxy bodies (compressed on every response).
pub const BROTLI_STREAM_LEVEL: u32 = 4;
/// zstd level for all uses.
pub const ZSTD_LEVEL: i32 = 3;
/// brotli window (log2), the library's default.
const BROTLI_LGWIN: u32 = 22;

/// A content coding veloxy can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Brotli,
    Zstd,
    Gzip,
}

impl Encoding {
    /// Every coding, in server preference order (used to break ties between equal q-values).
    pub const ALL: [Encoding; 3] = [Encoding::Brotli, Encoding::Zstd, Encoding::Gzip];

    /// The `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Encoding::Brotli => "br",
            Encoding::Zstd => "zstd",
            Encoding::Gzip => "gzip",
        }
    }

    /// The extension of a precompressed sidecar file (`app.js.br`).
    pub fn extension(self) -> &'static str {
        match self {
            Encoding::Brotli => "br",
            Encoding::Zstd => "zst",
            Encoding::Gzip => "gz",
        }
    }

    /// Position in [`Encoding::ALL`], for per-coding arrays.
    pub fn index(self) -> usize {
        match self {
            Encoding::Brotli => 0,
            Encoding::Zstd => 1,
            Encoding::Gzip => 2,
        }
    }
}

/// The client's `Accept-Encoding`, as q-values in thousandths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// Per coding, indexed by [`Encoding::index`].
    codings: [u16; 3],
    /// The q-value of an explicit `identity` item (0 when not listed).
    identity: u16,
}

impl Accepted {
    /// Parses an `Accept-Encoding` value (RFC 9110 section 12.5.3). No header means no coding
    /// is wanted (identity only), as browsers always send one and some tools cannot decode.
    /// Items that do not parse are ignored.
    pub fn parse(header: Option<&[u8]>) -> Accepted {
        let none = Accepted {
            codings: [0; 3],
            identity: 1000,
        };
        let Some(header) = header else {
            return none;
        };
        let mut codings: [Option<u16>; 3] = [None; 3];
        let mut identity = None;
        let mut star = None;
        for item in header.split(|&b| b == b',') {
            let mut parts = item.split(|&b| b == b';');
            let token = parts.next().unwrap_or(b"").trim_ascii();
            if token.is_empty() {
                continue;
            }
            let mut q = Some(1000);
            for p in parts {
                let p = p.trim_ascii();
                if let Some(v) = p.strip_prefix(b"q=").or_else(|| p.strip_prefix(b"Q=")) {
                    q = parse_qvalue(v);
                }
            }
            let Some(q) = q else { continue };
            let lower = token.to_ascii_lowercase();
            let slot = match lower.as_slice() {
                b"br" => &mut codings[0],
                b"zstd" => &mut codings[1],
                b"gzip" | b"x-gzip" => &mut codings[2],
                b"identity" => &mut identity,
                b"*" => &mut star,
                _ => continue,
            };
            // A repeated token keeps its highest q.
            *slot = Some(slot.map_or(q, |old: u16| old.max(q)));
        }
        Accepted {
            codings: codings.map(|c| c.or(star).unwrap_or(0)),
            // Only an explicit `identity` competes with the codings; unlisted, it is just the
            // fallback.
            identity: identity.unwrap_or(0),
        }
    }

    /// The client's q-value for `e`, in thousandths (0: refused).
    pub fn q(&self, e: Encoding) -> u16 {
        self.codings[e.index()]
    }

    /// The best coding among those `available`: the highest q-value above zero, ties broken by
    /// server preference; `None` (identity) when nothing is acceptable or identity is
    /// preferred by a strictly higher q-value. Identity is always the fallback, even when the
    /// client refused it: a response the client may not decode beats a 406 for static assets.
    pub fn choose(&self, available: impl Fn(Encoding) -> bool) -> Option<Encoding> {
        let mut best: Option<(Encoding, u16)> = None;
        for e in Encoding::ALL {
            let q = self.q(e);
            let better = match best {
                None => true,
                Some((_, bq)) => q > bq,
            };
            if q > 0 && available(e) && better {
                best = Some((e, q));
            }
        }
        match best {
            Some((_, q)) if self.identity > q => None,
            b => b.map(|(e, _)| e),
        }
    }

    /// True when some coding at all is acceptable (the response varies with the header).
    #[cfg(test)]
    pub fn any(&self) -> bool {
        self.codings.iter().any(|&q| q > 0)
    }
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`, in thousandths.
fn parse_qvalue(v: &[u8]) -> Option<u16> {
    let (int, frac) = match v.iter().position(|&b| b == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// True for media types worth compressing: text, scripts, JSON, XML, SVG, wasm, and a few
/// uncompressed font and image formats. Already-compressed formats (JPEG, PNG, WOFF2, video,
/// archives) are left alone. `content_type` may carry parameters (`; charset=utf-8`).
pub fn is_compressible(content_type: &[u8]) -> bool {
    let media = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or(b"")
        .trim_ascii()
        .to_ascii_lowercase();
    if media.starts_with(b"text/") || media.ends_with(b"+json") || media.ends_with(b"+xml") {
        return true;
    }
    matches!(
        media.as_slice(),
        b"application/javascript"
            | b"application/x-javascript"
            | b"application/ecmascript"
            | b"application/json"
            | b"application/xml"
            | b"application/wasm"
            | b"application/x-ndjson"
            | b"application/vnd.ms-fontobject"
            | b"font/ttf"
            | b"font/otf"
            | b"image/bmp"
            | b"image/x-icon"
            | b"image/vnd.microsoft.icon"
    )
}

/// Compresses `data` in one go (static variants).
pub fn compress(e: Encoding, data: &[u8]) -> io::Result<Vec<u8>> {
    match e {
        Encoding::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(data.len() / 3),
                flate2::Compression::new(GZIP_LEVEL),
            );
            enc.write_all(data)?;
            enc.finish()
        }
        Encoding::Brotli => {
            let mut out = Vec::with_capacity(data.len() / 3);
            {
                let mut w = brotli::CompressorWriter::new(
                    &mut out,
                    16 * 1024,
                    BROTLI_STATIC_LEVEL,
                    BROTLI_LGWIN,
                );
                w.write_all(data)?;
            }
            Ok(out)
        }
        Encoding::Zstd => zstd::bulk::compress(data, ZSTD_LEVEL),
    }
}

enum Inner {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

/// A streaming encoder that emits HTTP/1.1 chunks: each input piece is compressed and flushed
/// at once (a proxied stream must not stall waiting for more input), so memory stays at the
/// codec's window however long the body is.
pub struct StreamEncoder {
    inner: Option<Inner>,
    /// Framed output of the last call, handed out by reference.
    out: Vec<u8>,
    /// Emit the coded bytes without HTTP/1.1 chunk framing (HTTP/2 DATA frames).
    raw: bool,
}

impl StreamEncoder {
    pub fn new(e: Encoding) -> io::Result<StreamEncoder> {
        let inner = match e {
            Encoding::Gzip => Inner::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(GZIP_LEVEL),
            )),
            Encoding::Brotli => Inner::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                16 * 1024,
                BROTLI_STREAM_LEVEL,
                BROTLI_LGWIN,
            ))),
            Encoding::Zstd => {
                Inner::Zstd(zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL)?)
            }
        };
        Ok(StreamEncoder {
            inner: Some(inner),
            out: Vec::new(),
            raw: false,
        })
    }

    /// An encoder whose output is the bare coded stream, for HTTP/2 DATA frames.
    pub fn new_raw(e: Encoding) -> io::Result<StreamEncoder> {
        let mut enc = Self::new(e)?;
        enc.raw = true;
        Ok(enc)
    }

    /// Compresses and flushes `data`; returns the chunk(s) to send (maybe empty).
    pub fn encode(&mut self, data: &[u8]) -> io::Result<&[u8]> {
        self.out.clear();
        let Some(inner) = self.inner.as_mut() else {
            return Ok(&self.out);
        };
        if data.is_empty() {
            return Ok(&self.out);
        }
        let produced = match inner {
            Inner::Gzip(w) => {
                w.write_all(data)?;
                w.flush()?;
                std::mem::take(w.get_mut())
            }
            Inner::Brotli(w) => {
                w.write_all(data)?;
                w.flush()?;
                std::mem::take(w.get_mut())
            }
            Inner::Zstd(w) => {
                w.write_all(data)?;
                w.flush()?;
                std::mem::take(w.get_mut())
            }
        };
        if self.raw {
            self.out.extend_from_slice(&produced);
        } else {
            push_chunk(&mut self.out, &produced);
        }
        Ok(&self.out)
    }

    /// Ends the coded stream: the last compressed bytes and the terminating zero chunk. Later
    /// calls return nothing.
    pub fn finish(&mut self) -> io::Result<&[u8]> {
        self.out.clear();
        let Some(inner) = self.inner.take() else {
            return Ok(&self.out);
        };
        let tail = match inner {
            Inner::Gzip(w) => w.finish()?,
            Inner::Brotli(w) => w.into_inner(),
            Inner::Zstd(w) => w.finish()?,
        };
        if self.raw {
            self.out.extend_from_slice(&tail);
        } else {
            push_chunk(&mut self.out, &tail);
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        Ok(&self.out)
    }
}

/// Appends one chunk (`size CRLF data CRLF`); nothing for empty data (a zero-size chunk would
/// end the body).
fn push_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// For a route with `compress = true`: decides from the downstream copy of a proxied response
/// head whether to compress it, and if so rewrites the head (`head`: status line and header
/// lines, without the final blank line).
///
/// Eligible: status 200, a body, no `Content-Encoding` (nor a transfer-coding other than
/// chunked), no `Cache-Control: no-transform`, a
/// compressible `Content-Type`, and a `Content-Length` (if any) of at least [`MIN_SIZE`].
/// An eligible response always gets `Vary: Accept-Encoding`; when `chosen` is a coding it
/// also loses `Content-Length` and `Accept-Ranges`, its strong `ETag` becomes weak (the bytes
/// differ, the content does not), and it becomes chunked with `Content-Encoding`.
/// Returns the encoder when the body is to be compressed.
pub(crate) fn filter_proxy_head(
    head: &mut Vec<u8>,
    status: u16,
    has_body: bool,
    chosen: Option<Encoding>,
) -> Option<StreamEncoder> {
    if status != 200 {
        return None;
    }
    let mut content_type = None;
    let mut small = false;
    for line in header_lines(head) {
        let (name, value) = split_header(line);
        if name.eq_ignore_ascii_case(b"content-encoding")
            || (name.eq_ignore_ascii_case(b"transfer-encoding")
                && !value.eq_ignore_ascii_case(b"chunked"))
            || (name.eq_ignore_ascii_case(b"cache-control")
                && crate::http1::has_token(value, "no-transform"))
        {
            return None;
        }
        if name.eq_ignore_ascii_case(b"content-type") {
            content_type = Some(value);
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            small = crate::http1::parse_content_length(value).is_some_and(|n| n < MIN_SIZE);
        }
    }
    if !content_type.is_some_and(is_compressible) {
        return None;
    }
    let encoder = match chosen {
        Some(e) if has_body && !small => StreamEncoder::new(e).ok(),
        _ => None,
    };
    let Some(enc) = encoder else {
        head.extend_from_slice(b"Vary: Accept-Encoding\r\n");
        return None;
    };
    let chosen = chosen.expect("an encoder implies a coding");
    let mut out = Vec::with_capacity(head.len() + 96);
    let status_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .map_or(0, |i| i + 2);
    out.extend_from_slice(&head[..status_end]);
    for line in header_lines(head) {
        let (name, value) = split_header(line);
        let drop = [
            &b"content-length"[..],
            b"transfer-encoding",
            b"accept-ranges",
        ]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n));
        if drop {
            continue;
        }
        if name.eq_ignore_ascii_case(b"etag") && value.starts_with(b"\"") {
            out.extend_from_slice(b"ETag: W/");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
            continue;
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Content-Encoding: ");
    out.extend_from_slice(chosen.token().as_bytes());
    out.extend_from_slice(b"\r\nVary: Accept-Encoding\r\nTransfer-Encoding: chunked\r\n");
    *head = out;
    Some(enc)
}

/// [`filter_proxy_head`] for an HTTP/2 client: the same eligibility rules on a header map.
/// Returns a raw (unframed) encoder when the body is to be compressed.
pub(crate) fn filter_proxy_headers(
    headers: &mut http::HeaderMap,
    status: u16,
    has_body: bool,
    chosen: Option<Encoding>,
) -> Option<StreamEncoder> {
    use http::header::{
        ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, VARY,
    };
    if status != 200 || headers.contains_key(CONTENT_ENCODING) {
        return None;
    }
    if headers
        .get_all(CACHE_CONTROL)
        .iter()
        .any(|v| crate::http1::has_token(v.as_bytes(), "no-transform"))
    {
        return None;
    }
    if !headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| is_compressible(v.as_bytes()))
    {
        return None;
    }
    let small = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| crate::http1::parse_content_length(v.as_bytes()))
        .is_some_and(|n| n < MIN_SIZE);
    headers.append(VARY, http::HeaderValue::from_static("Accept-Encoding"));
    let chosen = chosen.filter(|_| has_body && !small)?;
    let encoder = StreamEncoder::new_raw(chosen).ok()?;
    headers.remove(CONTENT_LENGTH);
    headers.remove(ACCEPT_RANGES);
    if let Some(etag) = headers
        .get(ETAG)
        .filter(|v| v.as_bytes().starts_with(b"\""))
    {
        let mut weak = b"W/".to_vec();
        weak.extend_from_slice(etag.as_bytes());
        if let Ok(v) = http::HeaderValue::from_bytes(&weak) {
            headers.insert(ETAG, v);
        }
    }
    headers.insert(
        CONTENT_ENCODING,
        http::HeaderValue::from_static(chosen.token()),
    );
    Some(encoder)
}

/// The header lines of a head (after the status line), without their CRLF.
fn header_lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let start = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .map_or(head.len(), |i| i + 2);
    head[start..]
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty())
}

fn split_header(line: &[u8]) -> (&[u8], &[u8]) {
    match line.iter().position(|&b| b == b':') {
        Some(i) => (&line[..i], line[i + 1..].trim_ascii()),
        None => (line, &b""[..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pick(h: &str) -> Option<&'static str> {
        Accepted::parse(Some(h.as_bytes()))
            .choose(|_| true)
            .map(Encoding::token)
    }

    #[test]
    fn accept_encoding_negotiation() {
        assert_eq!(Accepted::parse(None).choose(|_| true), None);
        assert_eq!(pick("gzip"), Some("gzip"));
        assert_eq!(pick("gzip, deflate, br, zstd"), Some("br"));
        assert_eq!(pick("gzip, zstd"), Some("zstd"));
        assert_eq!(pick("br;q=0.5, gzip;q=0.8"), Some("gzip"));
        assert_eq!(pick("br;q=0, gzip"), Some("gzip"));
        assert_eq!(pick("*"), Some("br"));
        assert_eq!(pick("*;q=0.5, br;q=0"), Some("zstd"));
        assert_eq!(pick("gzip;q=0, *"), Some("br"));
        assert_eq!(pick("*;q=0"), None);
        assert_eq!(pick("identity"), None);
        assert_eq!(pick("identity;q=0"), None);
        assert_eq!(pick("gzip;q=0.5, identity"), None);
        assert_eq!(pick("gzip;q=0.5, identity;q=0.4"), Some("gzip"));
        assert_eq!(pick("x-gzip"), Some("gzip"));
        assert_eq!(pick("GZIP;Q=1.000"), Some("gzip"));
        assert_eq!(pick("deflate, compress"), None);
        assert_eq!(pick("gzip;q=2, br;q=0.1"), Some("br"));
        assert_eq!(pick("gzip;q=0.0001"), None, "four decimals are invalid");
        assert_eq!(pick(" , ;q=1,gzip ; q=0.3"), Some("gzip"));
        let only_gzip = |e: Encoding| e == Encoding::Gzip;
        assert_eq!(
            Accepted::parse(Some(b"br, gzip;q=0.1")).choose(only_gzip),
            Some(Encoding::Gzip)
        );
        assert!(!Accepted::parse(Some(b"identity")).any());
    }

    #[test]
    fn qvalues() {
        assert_eq!(parse_qvalue(b"1"), Some(1000));
        assert_eq!(parse_qvalue(b"0.5"), Some(500));
        assert_eq!(parse_qvalue(b"0.123"), Some(123));
        assert_eq!(parse_qvalue(b"0"), Some(0));
        assert_eq!(parse_qvalue(b"1.001"), None);
        assert_eq!(parse_qvalue(b"abc"), None);
    }

    #[test]
    fn compressible_types() {
        assert!(is_compressible(b"text/html; charset=utf-8"));
        assert!(is_compressible(b"application/javascript"));
        assert!(is_compressible(b"image/svg+xml"));
        assert!(is_compressible(b"application/wasm"));
        assert!(!is_compressible(b"image/png"));
        assert!(!is_compressible(b"font/woff2"));
        assert!(!is_compressible(b"application/octet-stream"));
    }

    fn decode(e: Encoding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match e {
            Encoding::Gzip => {
                flate2::read::GzDecoder::new(data)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Encoding::Brotli => {
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Encoding::Zstd => out = zstd::stream::decode_all(data).unwrap(),
        }
        out
    }

    /// Undoes chunked framing (test helper; the input is well formed).
    fn dechunk(mut data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let nl = data.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&data[..nl]).unwrap(), 16).unwrap();
            data = &data[nl + 2..];
            if size == 0 {
                return out;
            }
            out.extend_from_slice(&data[..size]);
            data = &data[size + 2..];
        }
    }

    #[test]
    fn round_trips() {
        let text: Vec<u8> = (0..50_000).map(|i| b"hello world "[i % 12]).collect();
        for e in Encoding::ALL {
            let packed = compress(e, &text).unwrap();
            assert!(packed.len() < text.len() / 10, "{e:?}");
            assert_eq!(decode(e, &packed), text, "{e:?}");
            let mut s = StreamEncoder::new(e).unwrap();
            let mut framed = Vec::new();
            for piece in text.chunks(7000) {
                framed.extend_from_slice(s.encode(piece).unwrap());
            }
            framed.extend_from_slice(s.finish().unwrap());
            assert!(s.finish().unwrap().is_empty());
            assert_eq!(decode(e, &dechunk(&framed)), text, "{e:?} streamed");
        }
    }

    #[test]
    fn proxy_head_rewrite() {
        let mut head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5000\r\nETag: \"x\"\r\nAccept-Ranges: bytes\r\n".to_vec();
        let enc = filter_proxy_head(&mut head, 200, true, Some(Encoding::Gzip));
        assert!(enc.is_some());
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nETag: W/\"x\"\r\nContent-Encoding: gzip\r\nVary: Accept-Encoding\r\nTransfer-Encoding: chunked\r\n"
        );
        let mut head =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5000\r\n".to_vec();
        assert!(filter_proxy_head(&mut head, 200, true, None).is_none());
        assert!(head.ends_with(b"Vary: Accept-Encoding\r\n"));
        for h in [
            &b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Encoding: gzip\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: no-transform\r\n",
        ] {
            let mut head = h.to_vec();
            assert!(filter_proxy_head(&mut head, 200, true, Some(Encoding::Gzip)).is_none());
            assert_eq!(head, h);
        }
        let mut head =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n".to_vec();
        assert!(filter_proxy_head(&mut head, 200, true, Some(Encoding::Gzip)).is_none());
    }
}
