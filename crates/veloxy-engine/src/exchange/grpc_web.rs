//! gRPC-Web (a route's `grpc_web`), translated in one place for every client protocol, as
//! Envoy's `grpc_web` filter does: browsers cannot read HTTP/2 trailers, so gRPC-Web carries
//! them in the body ([the protocol](https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-WEB.md)).
//!
//! * A request is gRPC-Web when its `content-type` is `application/grpc-web[+proto|+json]` or
//!   `application/grpc-web-text[+proto]` ([`detect`], at admission; any other request on the
//!   route, native gRPC included, is forwarded as before). Its fields become a gRPC
//!   request's ([`request_headers`]: `content-type: application/grpc[+...]`, `te: trailers`,
//!   `x-grpc-web` removed) and go to the route's `h2`/`h2c` group (`veloxy check` refuses
//!   `grpc_web` on a route to any other). The body passes through; a `-text` body is
//!   base64, decoded as it streams, four characters at a time ([`TextDecoder`],
//!   [`DecodeText`]; padded groups may come anywhere, as concatenated padded chunks do).
//! * The response ([`Encode`]): `content-type` back to `application/grpc-web[-text][+...]`,
//!   the data frames passed through, and the upstream's trailers (`grpc-status`,
//!   `grpc-message`, `grpc-status-details-bin`, any custom metadata) sent as one final
//!   gRPC-Web trailer frame: flag byte `0x80`, a 4-byte big-endian length, `name:value\r\n`
//!   lines with lowercase names. A trailers-only answer (`grpc-status` in the response head,
//!   no body) also ends with such a frame, made from its head's `grpc-*` fields. For `-text`
//!   every chunk goes out base64-encoded on its own (with its padding: the protocol lets a
//!   client decode concatenated padded chunks), so a streamed message is never held back.
//!   A response that is not gRPC (no `application/grpc` content-type, no `grpc-status`, say
//!   an error page of an intermediary) passes through untouched.
//!
//! * veloxy's own error answer to a gRPC-Web request from an HTTP/2 or HTTP/3 client (the
//!   backend down, a timeout) is gRPC-Web too ([`trailers_only`]): 200, the request's
//!   gRPC-Web content-type, the gRPC status in the head and in a trailer frame. An HTTP/1
//!   client gets the HTTP error, which gRPC-Web clients map to a status (502, 503 and 504 to
//!   UNAVAILABLE).
//!
//! The HTTP/1 client's bridge (`downstream::http2::bridge`) and the HTTP/2 and HTTP/3
//! clients' relay ([`super::framed_h2`]) call these; a route without `grpc_web` pays one
//! `Option` check at admission. CORS preflights for browsers are the route's CORS (see
//! `config::compile`: `grpc_web` gives the route one unless it has its own `cors`).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};

use crate::error::{ErrorKind, ProxyError};

/// A gRPC-Web request's encoding, read from its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Web {
    /// `application/grpc-web-text`: the bodies are base64, both ways.
    pub text: bool,
    /// The message format the content-type names (`+proto`, `+json`, or none).
    suffix: Suffix,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suffix {
    None,
    Proto,
    Json,
}

impl Web {
    /// The gRPC-Web content-type of an answer in message format `suffix`.
    fn content_type(self, suffix: Suffix) -> HeaderValue {
        HeaderValue::from_static(match (self.text, suffix) {
            (false, Suffix::None) => "application/grpc-web",
            (false, Suffix::Proto) => "application/grpc-web+proto",
            (false, Suffix::Json) => "application/grpc-web+json",
            (true, Suffix::None) => "application/grpc-web-text",
            (true, _) => "application/grpc-web-text+proto",
        })
    }
}

/// veloxy's own trailers-only answer (a gRPC status in `headers`) to a gRPC-Web request:
/// `headers` get the request's gRPC-Web content-type, and the body returned is the trailer
/// frame of the status fields (base64 for `-text`), as for an upstream's trailers-only answer.
pub(crate) fn trailers_only(web: Web, headers: &mut HeaderMap) -> Bytes {
    headers.insert(http::header::CONTENT_TYPE, web.content_type(web.suffix));
    let fields = headers
        .iter()
        .filter(|(n, _)| STATUS_FIELDS.contains(&n.as_str()));
    let frame = trailer_frame(fields);
    if web.text {
        Bytes::from(STANDARD.encode(&frame))
    } else {
        frame
    }
}

/// The gRPC-Web encoding a request's `content-type` names (parameters after `;` ignored);
/// `None`: not a gRPC-Web request.
pub(crate) fn detect(content_type: Option<&[u8]>) -> Option<Web> {
    let v = content_type?;
    let v = v.split(|&b| b == b';').next().unwrap_or(v).trim_ascii();
    let lower = v.to_ascii_lowercase();
    let rest = lower.strip_prefix(b"application/grpc-web")?;
    let (text, rest) = match rest.strip_prefix(b"-text") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let suffix = match rest {
        b"" => Suffix::None,
        b"+proto" => Suffix::Proto,
        b"+json" if !text => Suffix::Json,
        _ => return None,
    };
    Some(Web { text, suffix })
}

/// Turns a gRPC-Web request's fields (already filtered for the upstream) into a gRPC
/// request's: `content-type: application/grpc[+...]`, `te: trailers`, no `x-grpc-web`, and,
/// for `-text` (whose body shrinks when decoded), no `content-length`.
pub(crate) fn request_headers(headers: &mut HeaderMap, web: Web) {
    let ct = match web.suffix {
        Suffix::None => "application/grpc",
        Suffix::Proto => "application/grpc+proto",
        Suffix::Json => "application/grpc+json",
    };
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    headers.remove("x-grpc-web");
    if web.text {
        headers.remove(http::header::CONTENT_LENGTH);
    }
}

/// Decodes a `-text` body: base64 in any chunking, four characters (three bytes) at a time;
/// a group with padding (`=`) may end any chunk, as concatenated padded chunks do.
#[derive(Debug, Default)]
pub(crate) struct TextDecoder {
    /// Characters of a group not yet complete (at most three).
    carry: Vec<u8>,
}

impl TextDecoder {
    /// The bytes of every complete group of `input` (after what earlier chunks left over).
    pub(crate) fn push(&mut self, input: &[u8]) -> Result<Bytes, base64::DecodeError> {
        let mut text = std::mem::take(&mut self.carry);
        text.extend(input.iter().filter(|b| !b.is_ascii_whitespace()));
        let whole = text.len() / 4 * 4;
        let mut out = Vec::with_capacity(whole / 4 * 3);
        let mut start = 0;
        for group in (0..whole).step_by(4) {
            // A padded group ends a base64 run: decode up to it, then go on after it.
            if text[group + 2] == b'=' || text[group + 3] == b'=' {
                STANDARD.decode_vec(&text[start..group + 4], &mut out)?;
                start = group + 4;
            }
        }
        STANDARD.decode_vec(&text[start..whole], &mut out)?;
        self.carry = text.split_off(whole);
        Ok(Bytes::from(out))
    }

    /// The body ended: an incomplete group is an error.
    pub(crate) fn finish(&self) -> Result<(), base64::DecodeError> {
        match self.carry.len() {
            0 => Ok(()),
            n => Err(base64::DecodeError::InvalidLength(n)),
        }
    }
}

fn bad_text() -> ProxyError {
    ProxyError::downstream(ErrorKind::BadRequest(
        "grpc-web-text body is not valid base64",
    ))
}

/// A whole `-text` body decoded (the HTTP/1 bridge buffers its requests).
pub(crate) fn decode_all(body: &[u8]) -> Result<Bytes, ProxyError> {
    let mut d = TextDecoder::default();
    let out = d.push(body).map_err(|_| bad_text())?;
    d.finish().map_err(|_| bad_text())?;
    Ok(out)
}

/// A streamed `-text` request body, decoded as it comes.
pub(crate) struct DecodeText<B> {
    inner: B,
    decoder: TextDecoder,
}

impl<B> DecodeText<B> {
    pub(crate) fn new(inner: B) -> Self {
        DecodeText {
            inner,
            decoder: TextDecoder::default(),
        }
    }
}

impl<B> Body for DecodeText<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<super::framed::BodyError>,
{
    type Data = Bytes;
    type Error = super::framed::BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => {
                    let end = this.decoder.finish().map_err(|_| bad_text().into());
                    return Poll::Ready(end.err().map(Err));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                Some(Ok(f)) => f,
            };
            match frame.into_data() {
                Ok(text) => match this.decoder.push(&text) {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Err(_) => return Poll::Ready(Some(Err(bad_text().into()))),
                },
                Err(other) => return Poll::Ready(Some(Ok(other))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.decoder.carry.is_empty()
    }
}

/// A gRPC-Web trailer frame: `0x80`, the length (4 bytes, big-endian), `name:value\r\n`
/// lines (`HeaderMap` names are lowercase).
pub(crate) fn trailer_frame<'a>(
    fields: impl Iterator<Item = (&'a http::HeaderName, &'a HeaderValue)>,
) -> Bytes {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.extend_from_slice(name.as_str().as_bytes());
        block.push(b':');
        block.extend_from_slice(value.as_bytes());
        block.extend_from_slice(b"\r\n");
    }
    let mut out = BytesMut::with_capacity(5 + block.len());
    out.put_u8(0x80);
    out.put_u32(block.len() as u32);
    out.extend_from_slice(&block);
    out.freeze()
}

/// The fields of a trailers-only answer that go in its trailer frame.
const STATUS_FIELDS: [&str; 3] = ["grpc-status", "grpc-message", "grpc-status-details-bin"];

/// The response body of a gRPC-Web request: the upstream's body with its trailers turned into
/// the final trailer frame (base64 for `-text`); see the module's documentation.
pub(crate) struct Encode<B> {
    inner: B,
    text: bool,
    /// The response is gRPC: translated (else passed through).
    grpc: bool,
    /// A trailers-only answer's frame, sent at the end unless trailers come after all.
    head_trailer: Option<Bytes>,
    done: bool,
}

impl<B> Encode<B> {
    /// Adapts the upstream's response (`headers` rewritten in place for the client).
    pub(crate) fn new(inner: B, web: Web, headers: &mut HeaderMap) -> Self {
        Encode::head(web, headers).body(inner)
    }
}

impl Encode<()> {
    /// The translation of a response whose fields are `headers` (rewritten in place for the
    /// client); its body is given later ([`Encode::body`]).
    pub(crate) fn head(web: Web, headers: &mut HeaderMap) -> Self {
        let ct = headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes().to_ascii_lowercase());
        let grpc_type = ct
            .as_deref()
            .and_then(|v| v.strip_prefix(b"application/grpc"));
        let grpc = grpc_type.is_some() || headers.contains_key("grpc-status");
        let mut head_trailer = None;
        if grpc {
            // The upstream's format when it names one, else the request's (plain
            // `application/grpc` is protobuf, as `+proto` is).
            let suffix = match grpc_type {
                Some(b"+proto") => Suffix::Proto,
                Some(b"+json") if !web.text => Suffix::Json,
                _ => web.suffix,
            };
            headers.insert(http::header::CONTENT_TYPE, web.content_type(suffix));
            headers.remove(http::header::CONTENT_LENGTH);
            if headers.contains_key("grpc-status") {
                let fields = headers
                    .iter()
                    .filter(|(n, _)| STATUS_FIELDS.contains(&n.as_str()));
                head_trailer = Some(trailer_frame(fields));
            }
        }
        Encode {
            inner: (),
            text: web.text,
            grpc,
            head_trailer,
            done: false,
        }
    }

    /// The translated response body over the upstream's `inner`.
    pub(crate) fn body<B>(self, inner: B) -> Encode<B> {
        Encode {
            inner,
            text: self.text,
            grpc: self.grpc,
            head_trailer: self.head_trailer,
            done: false,
        }
    }
}

impl<B> Encode<B> {
    /// Bytes as the client gets them (base64 for `-text`, each chunk with its padding).
    fn out(&self, data: Bytes) -> Frame<Bytes> {
        if self.text {
            Frame::data(Bytes::from(STANDARD.encode(&data)))
        } else {
            Frame::data(data)
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Encode<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(f)) if !this.grpc => return Poll::Ready(Some(Ok(f))),
                Some(Ok(f)) => f,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    let last = this.head_trailer.take();
                    return Poll::Ready(last.map(|t| Ok(this.out(t))));
                }
            };
            match frame.into_data() {
                Ok(d) if d.is_empty() => {}
                Ok(d) => return Poll::Ready(Some(Ok(this.out(d)))),
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        this.done = true;
                        let t = trailer_frame(t.iter());
                        return Poll::Ready(Some(Ok(this.out(t))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn content_types() {
        let d = |s: &str| detect(Some(s.as_bytes()));
        assert_eq!(
            d("application/grpc-web"),
            Some(Web {
                text: false,
                suffix: Suffix::None
            })
        );
        assert_eq!(
            d("Application/gRPC-Web+proto; charset=x").unwrap().suffix,
            Suffix::Proto
        );
        assert!(d("application/grpc-web+json").is_some());
        assert!(d("application/grpc-web-text").unwrap().text);
        assert!(d("application/grpc-web-text+proto").unwrap().text);
        for no in [
            "application/grpc",
            "application/grpc+proto",
            "text/plain",
            "application/grpc-webx",
        ] {
            assert_eq!(d(no), None, "{no}");
        }
        assert_eq!(detect(None), None);
    }

    #[test]
    fn request_fields() {
        let mut h = HeaderMap::new();
        h.insert(
            "content-type",
            "application/grpc-web-text+proto".parse().unwrap(),
        );
        h.insert("x-grpc-web", "1".parse().unwrap());
        h.insert("content-length", "12".parse().unwrap());
        h.insert("x-user-agent", "grpc-web-javascript/0.1".parse().unwrap());
        request_headers(
            &mut h,
            detect(Some(b"application/grpc-web-text+proto")).unwrap(),
        );
        assert_eq!(h["content-type"], "application/grpc+proto");
        assert_eq!(h["te"], "trailers");
        assert!(h.get("x-grpc-web").is_none() && h.get("content-length").is_none());
        assert!(h.get("x-user-agent").is_some());
    }

    #[test]
    fn text_in_any_chunking() {
        let data: Vec<u8> = (0u8..=255).collect();
        let text = STANDARD.encode(&data);
        for cut in [1, 2, 3, 5, 7, 64] {
            let mut d = TextDecoder::default();
            let mut out = Vec::new();
            for chunk in text.as_bytes().chunks(cut) {
                out.extend_from_slice(&d.push(chunk).unwrap());
            }
            d.finish().unwrap();
            assert_eq!(out, data, "chunks of {cut}");
        }
        // Concatenated padded chunks.
        let joined = format!(
            "{}{}{}",
            STANDARD.encode(b"ab"),
            STANDARD.encode(b"c"),
            STANDARD.encode(b"defg")
        );
        assert_eq!(&decode_all(joined.as_bytes()).unwrap()[..], b"abcdefg");
        assert!(decode_all(b"abc").is_err());
        assert!(decode_all(b"a*cd").is_err());
    }

    /// A body of data frames and then trailers.
    struct Frames(std::collections::VecDeque<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    fn upstream(data: &[&'static [u8]], trailers: Option<HeaderMap>) -> Frames {
        let mut frames: std::collections::VecDeque<_> = data
            .iter()
            .map(|d| Frame::data(Bytes::from_static(d)))
            .collect();
        if let Some(t) = trailers {
            frames.push_back(Frame::trailers(t));
        }
        Frames(frames)
    }

    fn collect<B: Body<Data = Bytes> + Unpin>(b: B) -> Vec<u8>
    where
        B::Error: std::fmt::Debug,
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(b.collect()).unwrap().to_bytes().to_vec()
    }

    #[test]
    fn trailers_become_the_last_frame() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        t.insert("x-custom", "v".parse().unwrap());
        let mut head = HeaderMap::new();
        head.insert("content-type", "application/grpc".parse().unwrap());
        let web = detect(Some(b"application/grpc-web+proto")).unwrap();
        let body = Encode::new(
            upstream(&[b"\0\0\0\0\x01A"], Some(t.clone())),
            web,
            &mut head,
        );
        assert_eq!(head["content-type"], "application/grpc-web+proto");
        let out = collect(body);
        let block = b"grpc-status:0\r\nx-custom:v\r\n";
        let mut want = b"\0\0\0\0\x01A\x80\0\0\0".to_vec();
        want.push(block.len() as u8);
        want.extend_from_slice(block);
        assert_eq!(out, want);

        // -text: each chunk base64 on its own.
        let mut head = HeaderMap::new();
        head.insert("content-type", "application/grpc+proto".parse().unwrap());
        let web = detect(Some(b"application/grpc-web-text")).unwrap();
        let body = Encode::new(upstream(&[b"\0\0\0\0\x01A"], Some(t)), web, &mut head);
        assert_eq!(head["content-type"], "application/grpc-web-text+proto");
        let out = collect(body);
        assert_eq!(&decode_all(&out).unwrap()[..], &want[..]);
    }

    #[test]
    fn trailers_only_answers_get_a_frame() {
        let mut head = HeaderMap::new();
        head.insert("content-type", "application/grpc".parse().unwrap());
        head.insert("grpc-status", "12".parse().unwrap());
        head.insert("grpc-message", "nope".parse().unwrap());
        let web = detect(Some(b"application/grpc-web")).unwrap();
        let out = collect(Encode::new(upstream(&[], None), web, &mut head));
        assert_eq!(&out[5..], b"grpc-status:12\r\ngrpc-message:nope\r\n");
        assert_eq!(out[0], 0x80);

        // Not gRPC: passed through.
        let mut head = HeaderMap::new();
        head.insert("content-type", "text/html".parse().unwrap());
        head.insert("content-length", "2".parse().unwrap());
        let out = collect(Encode::new(upstream(&[b"hi"], None), web, &mut head));
        assert_eq!(out, b"hi");
        assert_eq!(head["content-type"], "text/html");
        assert!(head.get("content-length").is_some());
    }
}
