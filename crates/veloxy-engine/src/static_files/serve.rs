//! The response for a resolved file: content coding (a sidecar or a cached variant),
//! preconditions ([`conditional`]: 304, 412), then ranges ([`range`]: 206, multipart, 416).

use std::sync::Arc;

use bytes::Bytes;

use super::cache::{Entry, Source, Variant};
use super::range::{self, ByteRange, RangeRequest};
use super::{conditional, simple, Body, Part, Request, Response, StaticRoute};
use crate::compress::{self, Accepted, Encoding};

/// Builds the response for a resolved file.
pub(super) fn serve_entry(
    route: &StaticRoute,
    req: &Request<'_>,
    entry: Arc<Entry>,
    key: &str,
    is_head: bool,
) -> Response {
    let h = req.headers;
    let range_header = if is_head { None } else { h.get("range") };
    let varies = entry.compressible || entry.sidecars.iter().any(Option::is_some);
    // Ranges apply to the identity bytes: a Range request is answered uncompressed.
    let (entry, coding) = if varies && range_header.is_none() {
        let accepted = Accepted::parse(h.get("accept-encoding"));
        choose_encoding(route, key, entry, &accepted)
    } else {
        (entry, None)
    };
    let etag = match coding {
        Some(c) => entry.variant_etags[c.index()].clone(),
        None => entry.etag.clone(),
    };
    let mtime = conditional::secs(entry.mtime);
    let etag_str = std::str::from_utf8(&etag).unwrap_or("");
    let mut r = Response {
        status: 200,
        headers: Vec::with_capacity(10),
        body: Body::Empty,
        raw: Default::default(),
    };
    let outcome = conditional::evaluate(h, etag_str, mtime);
    if outcome == conditional::Outcome::Failed {
        return simple(412, "precondition failed\n", is_head);
    }
    push_validators(&mut r, route, &entry, &etag, varies);
    if outcome == conditional::Outcome::NotModified {
        r.status = 304;
        return r;
    }
    r.push(
        "content-type",
        Bytes::from_static(entry.content_type.as_bytes()),
    );
    if let Some(c) = coding {
        coded_body(&mut r, &entry, c, is_head);
        return r;
    }
    r.push("accept-ranges", Bytes::from_static(b"bytes"));
    let ranges = match range_header {
        Some(v) if conditional::if_range_allows(h, etag_str, mtime) => range::parse(v, entry.len),
        _ => RangeRequest::Ignore,
    };
    identity_body(r, &entry, ranges, is_head)
}

/// The validators and caching fields every answer for the file carries, 304 included.
#[inline]
fn push_validators(
    r: &mut Response,
    route: &StaticRoute,
    entry: &Entry,
    etag: &Bytes,
    varies: bool,
) {
    r.push("last-modified", entry.last_modified.clone());
    r.push("etag", etag.clone());
    if let Some(cc) = &route.cache_control {
        r.push("cache-control", cc.clone());
    }
    if varies {
        r.push("vary", Bytes::from_static(b"Accept-Encoding"));
    }
}

/// The whole file in coding `c`, from its sidecar or its cached variant.
#[inline]
fn coded_body(r: &mut Response, entry: &Entry, c: Encoding, is_head: bool) {
    let i = c.index();
    let part = match (&entry.sidecars[i], &entry.variants[i]) {
        (Some(s), _) => source_part(&s.source, 0, s.len),
        (None, Variant::Ready(b)) => Part::Bytes(b.clone()),
        _ => unreachable!("choose_encoding returns a coding with bytes"),
    };
    r.push("content-encoding", Bytes::from_static(c.token().as_bytes()));
    r.push("content-length", part.len().to_string());
    if !is_head {
        r.body = part_body(part);
    }
}

/// The identity bytes: the whole file, one range, several (multipart), or a 416.
fn identity_body(mut r: Response, entry: &Entry, ranges: RangeRequest, is_head: bool) -> Response {
    let len = entry.len;
    match ranges {
        RangeRequest::Ignore => {
            r.push("content-length", len.to_string());
            if !is_head {
                r.body = part_body(source_part(&entry.source, 0, len));
            }
        }
        RangeRequest::Unsatisfiable => {
            let mut e = simple(416, "range not satisfiable\n", is_head);
            e.push("content-range", format!("bytes */{len}"));
            return e;
        }
        RangeRequest::Ranges(ranges) if ranges.len() == 1 => {
            let rg = ranges[0];
            r.status = 206;
            r.push(
                "content-range",
                format!("bytes {}-{}/{len}", rg.start, rg.end()),
            );
            r.push("content-length", rg.len.to_string());
            r.body = part_body(source_part(&entry.source, rg.start, rg.len));
        }
        RangeRequest::Ranges(ranges) => multipart(&mut r, entry, &ranges),
    }
    r
}

/// A `multipart/byteranges` body for several ranges, replacing the single-part content type.
fn multipart(r: &mut Response, entry: &Entry, ranges: &[ByteRange]) {
    let len = entry.len;
    let b = boundary();
    let mut parts = Vec::with_capacity(ranges.len() * 2 + 1);
    for (i, rg) in ranges.iter().enumerate() {
        let head = format!(
            "{}--{b}\r\nContent-Type: {}\r\nContent-Range: bytes {}-{}/{len}\r\n\r\n",
            if i == 0 { "" } else { "\r\n" },
            entry.content_type,
            rg.start,
            rg.end()
        );
        parts.push(Part::Bytes(Bytes::from(head)));
        parts.push(source_part(&entry.source, rg.start, rg.len));
    }
    parts.push(Part::Bytes(Bytes::from(format!("\r\n--{b}--\r\n"))));
    let total: u64 = parts.iter().map(Part::len).sum();
    r.status = 206;
    // Replace the single-part content type.
    r.headers.retain(|(n, _)| *n != "content-type");
    r.push(
        "content-type",
        format!("multipart/byteranges; boundary={b}"),
    );
    r.push("content-length", total.to_string());
    r.body = Body::Multipart(parts);
}

/// Picks the coding for `entry` and makes sure its bytes exist (compressing and caching a
/// variant on first use). Returns the entry (maybe updated) and the coding.
fn choose_encoding(
    route: &StaticRoute,
    key: &str,
    mut entry: Arc<Entry>,
    accepted: &Accepted,
) -> (Arc<Entry>, Option<Encoding>) {
    loop {
        let e = &entry;
        let chosen = accepted.choose(|c| {
            e.sidecars[c.index()].is_some()
                || (e.compressible && !matches!(e.variants[c.index()], Variant::Useless))
        });
        let Some(c) = chosen else {
            return (entry, None);
        };
        let i = c.index();
        if e.sidecars[i].is_some() || matches!(e.variants[i], Variant::Ready(_)) {
            return (entry, Some(c));
        }
        let Source::Memory(content) = &e.source else {
            return (entry, None);
        };
        let variant = match compress::compress(c, content) {
            Ok(v) if v.len() < content.len() => Variant::Ready(Bytes::from(v)),
            _ => Variant::Useless,
        };
        let mut variants = e.variants.clone();
        variants[i] = variant;
        let updated = e.with(e.sidecars.clone(), variants, e.checked_ms);
        entry = route.cache.insert(key, updated);
    }
}

fn source_part(source: &Source, offset: u64, len: u64) -> Part {
    match source {
        Source::Memory(b) => Part::Bytes(b.slice(offset as usize..(offset + len) as usize)),
        Source::File(f) => Part::File {
            file: f.clone(),
            offset,
            len,
        },
    }
}

fn part_body(p: Part) -> Body {
    match p {
        Part::Bytes(b) => Body::Bytes(b),
        Part::File { file, offset, len } => Body::File { file, offset, len },
    }
}

/// A fresh multipart boundary (random, so no file can contain it by design).
fn boundary() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::clock::now_us());
    format!("veloxy-{:016x}", h.finish())
}
