//! A message body in transit over HTTP/1: its framing state (declared length, chunked,
//! until close), how much of a buffer belongs to it, and the filtering of a request's
//! trailer section. Plain data, no I/O: the downstream relay, the HTTP/1 upstream client and
//! the cache fill all read bodies through it.

use bytes::BytesMut;

use crate::error::{ErrorKind, ProxyError};
use crate::http1::chunked::{ChunkError, ChunkedScanner};
use crate::http1::BodyKind;

/// Keep at least this much free space before reading a body chunk.
pub(crate) const READ_CHUNK: usize = 16 * 1024;

pub(crate) fn reserve(buf: &mut BytesMut, min: usize) {
    if buf.capacity() - buf.len() < min {
        buf.reserve(min);
    }
}

/// Where a body stands while it is relayed.
pub(crate) enum BodyState {
    Done,
    Length(u64),
    Chunked {
        scanner: ChunkedScanner,
        decode: bool,
        /// Request bodies: the trailer section, held until it ends so it can be forwarded
        /// filtered (see [`BodyState::take_request`]). `None`: forwarded as it comes.
        held: Option<Vec<u8>>,
        /// Request bodies: the bytes (chunk framing included) still allowed by the route's
        /// `max_body_bytes`.
        budget: u64,
    },
    UntilClose,
}

impl BodyState {
    pub fn new(kind: BodyKind, decode: bool) -> Self {
        match kind {
            BodyKind::None | BodyKind::Length(0) => BodyState::Done,
            BodyKind::Length(n) => BodyState::Length(n),
            BodyKind::Chunked => BodyState::Chunked {
                scanner: ChunkedScanner::new(),
                decode,
                held: None,
                budget: u64::MAX,
            },
            BodyKind::UntilClose => BodyState::UntilClose,
        }
    }

    /// A request body on its way upstream: verbatim, except that a chunked body's trailer
    /// section loses the fields an upstream could take for framing or routing.
    /// `max_body`: the route's `max_body_bytes` (a declared length was checked at
    /// admission; a chunked body is counted as it comes, framing included).
    pub fn request(kind: BodyKind, max_body: Option<u64>) -> Self {
        match BodyState::new(kind, false) {
            BodyState::Chunked { scanner, .. } => BodyState::Chunked {
                scanner,
                decode: false,
                held: Some(Vec::new()),
                budget: max_body.unwrap_or(u64::MAX),
            },
            other => other,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, BodyState::Done)
    }

    pub fn decodes(&self) -> bool {
        matches!(self, BodyState::Chunked { decode: true, .. })
    }

    /// Consumes the body's bytes at the start of `data`; returns how many belong to the body.
    /// Bytes past the body's end are left for the next message.
    pub fn take(&mut self, data: &[u8]) -> Result<usize, ChunkError> {
        let n = match self {
            BodyState::Done => 0,
            BodyState::Length(rem) => {
                let n = (*rem).min(data.len() as u64);
                *rem -= n;
                n as usize
            }
            BodyState::Chunked { scanner, .. } => scanner.scan(data)?,
            BodyState::UntilClose => data.len(),
        };
        if matches!(self, BodyState::Length(0))
            || matches!(self, BodyState::Chunked { scanner, .. } if scanner.is_done())
        {
            *self = BodyState::Done;
        }
        Ok(n)
    }

    /// Like [`take`](Self::take), but appends the bytes to forward to `out`: the payload only
    /// when decoding chunked framing, everything otherwise.
    pub fn take_into(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<usize, ChunkError> {
        if let BodyState::Chunked {
            scanner,
            decode: true,
            ..
        } = self
        {
            let mut off = 0;
            while off < data.len() && !scanner.is_done() {
                let step = scanner.step(&data[off..])?;
                if step.payload {
                    out.extend_from_slice(&data[off..off + step.consumed]);
                }
                off += step.consumed;
            }
            if scanner.is_done() {
                *self = BodyState::Done;
            }
            return Ok(off);
        }
        let n = self.take(data)?;
        out.extend_from_slice(&data[..n]);
        Ok(n)
    }

    /// [`take`](Self::take) for a body made with [`request`](Self::request). Returns the bytes
    /// consumed and how many of them, from the start of `data`, to forward as they are. The
    /// trailer section is not among those: it is held (bounded by the scanner's limit) and,
    /// once complete, appended to `extra` filtered. When nothing is filtered out of a section
    /// that arrived whole in `data`, it is forwarded in place instead (no copy, `extra` empty).
    pub fn take_request(
        &mut self,
        data: &[u8],
        extra: &mut Vec<u8>,
    ) -> Result<(usize, usize), ChunkError> {
        let BodyState::Chunked {
            scanner,
            held: Some(held),
            budget,
            ..
        } = self
        else {
            let n = self.take(data)?;
            return Ok((n, n));
        };
        let (mut off, mut verbatim) = (0, 0);
        let held_before = held.len();
        while off < data.len() && !scanner.is_done() {
            let step = scanner.step(&data[off..])?;
            if step.trailer {
                held.extend_from_slice(&data[off..off + step.consumed]);
            } else {
                verbatim = off + step.consumed;
            }
            off += step.consumed;
        }
        *budget = budget
            .checked_sub(off as u64)
            .ok_or(ChunkError::OverLimit)?;
        if scanner.is_done() {
            let start = extra.len();
            let dropped = crate::http1::request::filter_trailer_section(held, extra);
            if !dropped && held_before == 0 {
                extra.truncate(start);
                verbatim = off;
            }
            *self = BodyState::Done;
        }
        Ok((off, verbatim))
    }

    /// [`take_request`](Self::take_request), appending the bytes to forward to `out`.
    pub fn take_request_into(
        &mut self,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, ChunkError> {
        let mut extra = Vec::new();
        let (n, verbatim) = self.take_request(data, &mut extra)?;
        out.extend_from_slice(&data[..verbatim]);
        out.extend_from_slice(&extra);
        Ok(n)
    }
}

/// The error for a request body the chunked scanner refused.
pub(crate) fn request_body_error(e: ChunkError) -> ProxyError {
    ProxyError::downstream(match e {
        ChunkError::OverLimit => ErrorKind::BodyTooLarge,
        _ => ErrorKind::BadRequest("invalid chunked body"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `body` to a request body state in pieces of `step` bytes; returns what would be
    /// forwarded and whether it was forwarded in place (no filtered copy) throughout.
    fn forwarded(body: &[u8], step: usize) -> (Vec<u8>, bool) {
        let mut state = BodyState::request(BodyKind::Chunked, None);
        let (mut out, mut in_place, mut off) = (Vec::new(), true, 0);
        while !state.is_done() {
            let end = (off + step).min(body.len());
            let mut extra = Vec::new();
            let (n, verbatim) = state.take_request(&body[off..end], &mut extra).unwrap();
            out.extend_from_slice(&body[off..off + verbatim]);
            out.extend_from_slice(&extra);
            in_place &= extra.is_empty();
            off += n;
        }
        assert_eq!(off, body.len());
        (out, in_place)
    }

    #[test]
    fn request_trailers_are_filtered_whatever_the_reads() {
        let body = b"3\r\nabc\r\n0\r\nContent-Length: 9\r\nX-Sum: 1\r\nHost: evil\r\n\r\n";
        for step in [1, 2, 7, body.len()] {
            let (out, _) = forwarded(body, step);
            assert_eq!(out, b"3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n", "reads of {step}");
        }
        // Nothing to drop, all in one read: forwarded in place.
        let clean = b"3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n";
        assert_eq!(forwarded(clean, clean.len()), (clean.to_vec(), true));
        assert_eq!(forwarded(b"0\r\n\r\n", 5), (b"0\r\n\r\n".to_vec(), true));
        assert_eq!(forwarded(clean, 3).0, clean);
    }
}
