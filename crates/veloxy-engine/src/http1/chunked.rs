//! A strict, incremental scanner for `Transfer-Encoding: chunked` bodies.
//!
//! veloxy forwards chunked bodies verbatim (no decode/re-encode copy) but must know where the
//! body ends and must refuse anything ambiguous: non-hex sizes, sizes beyond `i64::MAX`, bare
//! LF or CR, missing CRLF after data, over-long extensions or trailers. The scanner reports runs
//! of bytes as payload or framing, so a caller can also decode (for HTTP/1.0 clients) by writing
//! only the payload runs.

/// Framing error in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("invalid chunk size")]
    BadSize,
    #[error("chunk size too large")]
    SizeOverflow,
    #[error("missing CRLF in chunked framing")]
    BadLineEnding,
    #[error("chunk extension or trailer section too long")]
    TooLong,
    /// Not a framing error: the body passed the route's `max_body_bytes`.
    #[error("body larger than the route accepts")]
    OverLimit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size { digits: u8 },
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
    FinalLf,
    Done,
}

/// Largest chunk size accepted: `i64::MAX`.
const MAX_CHUNK_SIZE: u64 = i64::MAX as u64;

/// Limit on extension plus trailer bytes in one body; generous for real clients.
const META_LIMIT: usize = 16 * 1024;

/// One run of bytes the scanner consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub consumed: usize,
    /// The run is chunk payload (as opposed to sizes, CRLFs, extensions and trailers).
    pub payload: bool,
    /// The run is part of the trailer section: the fields after the last chunk, and the final
    /// CRLF. A run never mixes it with what comes before, so a caller can hold it back.
    pub trailer: bool,
}

#[derive(Debug, Clone)]
pub struct ChunkedScanner {
    state: State,
    size: u64,
    meta: usize,
}

impl Default for ChunkedScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedScanner {
    pub fn new() -> Self {
        ChunkedScanner {
            state: State::Size { digits: 0 },
            size: 0,
            meta: 0,
        }
    }

    /// The final CRLF after the last chunk and trailers has been consumed.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes bytes of the body that belong to it, stopping at its end; returns how many.
    pub fn scan(&mut self, data: &[u8]) -> Result<usize, ChunkError> {
        let mut off = 0;
        while off < data.len() && !self.is_done() {
            off += self.step(&data[off..])?.consumed;
        }
        Ok(off)
    }

    /// Consumes one run of payload or framing bytes from `data` (which must not be empty).
    pub fn step(&mut self, data: &[u8]) -> Result<Step, ChunkError> {
        if self.state == State::Data {
            return Ok(self.payload_run(data));
        }
        let trailer = matches!(
            self.state,
            State::TrailerStart | State::TrailerLine | State::TrailerLf | State::FinalLf
        );
        let mut i = 0;
        while i < data.len() {
            let from = self.state;
            self.state = self.next_state(data[i])?;
            i += 1;
            if ends_run(from) {
                break;
            }
        }
        Ok(Step {
            consumed: i,
            payload: false,
            trailer,
        })
    }

    /// The run of chunk payload at the start of `data`, in state `Data`.
    #[inline]
    fn payload_run(&mut self, data: &[u8]) -> Step {
        let n = (self.size.min(data.len() as u64)) as usize;
        self.size -= n as u64;
        if self.size == 0 {
            self.state = State::DataCr;
        }
        Step {
            consumed: n,
            payload: true,
            trailer: false,
        }
    }

    /// The state after framing byte `b` (never called in `Data` or `Done`).
    #[inline]
    fn next_state(&mut self, b: u8) -> Result<State, ChunkError> {
        Ok(match self.state {
            State::Size { digits } => return self.size_byte(digits, b),
            State::Ext => match b {
                b'\r' => State::SizeLf,
                b'\n' | 0 => return Err(ChunkError::BadLineEnding),
                _ => {
                    self.count_meta()?;
                    State::Ext
                }
            },
            State::SizeLf => match b {
                // The trailer section starts a run of its own.
                b'\n' if self.size == 0 => State::TrailerStart,
                b'\n' => State::Data,
                _ => return Err(ChunkError::BadLineEnding),
            },
            State::DataCr => match b {
                b'\r' => State::DataLf,
                _ => return Err(ChunkError::BadLineEnding),
            },
            State::DataLf => match b {
                b'\n' => {
                    self.size = 0;
                    State::Size { digits: 0 }
                }
                _ => return Err(ChunkError::BadLineEnding),
            },
            State::TrailerStart => match b {
                b'\r' => State::FinalLf,
                b'\n' => return Err(ChunkError::BadLineEnding),
                _ => {
                    // Counted too: request trailers are held in memory until they end.
                    self.count_meta()?;
                    State::TrailerLine
                }
            },
            State::TrailerLine => {
                self.count_meta()?;
                match b {
                    b'\r' => State::TrailerLf,
                    b'\n' | 0 => return Err(ChunkError::BadLineEnding),
                    _ => State::TrailerLine,
                }
            }
            State::TrailerLf => match b {
                b'\n' => State::TrailerStart,
                _ => return Err(ChunkError::BadLineEnding),
            },
            State::FinalLf => match b {
                b'\n' => State::Done,
                _ => return Err(ChunkError::BadLineEnding),
            },
            State::Data | State::Done => unreachable!("handled above"),
        })
    }

    /// Byte `b` of a chunk-size line, after `digits` hex digits.
    #[inline]
    fn size_byte(&mut self, digits: u8, b: u8) -> Result<State, ChunkError> {
        match b {
            b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                if digits >= 16 {
                    return Err(ChunkError::SizeOverflow);
                }
                let v = (b as char).to_digit(16).unwrap_or(0) as u64;
                self.size = (self.size << 4) | v;
                // Most servers hold a chunk size in a signed 64-bit integer: one that does not
                // fit reads as negative or wraps there, and the two ends would disagree on
                // where the body ends.
                if self.size > MAX_CHUNK_SIZE {
                    return Err(ChunkError::SizeOverflow);
                }
                Ok(State::Size { digits: digits + 1 })
            }
            b';' if digits > 0 => Ok(State::Ext),
            b'\r' if digits > 0 => Ok(State::SizeLf),
            b'\n' => Err(ChunkError::BadLineEnding),
            _ => Err(ChunkError::BadSize),
        }
    }

    /// Counts one extension or trailer byte against [`META_LIMIT`].
    #[inline]
    fn count_meta(&mut self) -> Result<(), ChunkError> {
        self.meta += 1;
        if self.meta > META_LIMIT {
            return Err(ChunkError::TooLong);
        }
        Ok(())
    }
}

/// A framing run ends after the LF that closes a size line (payload or the trailer section
/// follows, each a run of its own) and after the final LF of the body.
#[inline]
fn ends_run(from: State) -> bool {
    matches!(from, State::SizeLf | State::FinalLf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(input: &[u8]) -> Result<(usize, Vec<u8>, bool), ChunkError> {
        let mut s = ChunkedScanner::new();
        let mut payload = Vec::new();
        let mut off = 0;
        // Feed one byte at a time to exercise every state boundary.
        while off < input.len() && !s.is_done() {
            let st = s.step(&input[off..off + 1])?;
            if st.payload {
                payload.extend_from_slice(&input[off..off + st.consumed]);
            }
            off += st.consumed;
        }
        Ok((off, payload, s.is_done()))
    }

    #[test]
    fn valid_bodies() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let (n, payload, done) = scan_all(body).unwrap();
        assert!(done);
        assert_eq!(&body[n..], b"NEXT");
        assert_eq!(payload, b"hello world");
        let mut s = ChunkedScanner::new();
        assert_eq!(s.scan(b"A\r\n0123456789\r\n0\r\n\r\n").unwrap(), 20);
        assert!(s.is_done());
    }

    #[test]
    fn smuggling_shapes_rejected() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"-5\r\n",
            b" 5\r\n",
            b"5 \r\n",
            b"\r\n",
            b"11111111111111111\r\n",
            b"0\r\n\n",
            b"0\r\nX: y\n\r\n",
            b"5;a\nb\r\n",
        ] {
            assert!(
                scan_all(bad).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn chunk_sizes_must_fit_a_signed_64_bit_integer() {
        let mut s = ChunkedScanner::new();
        assert_eq!(s.scan(b"7fffffffffffffff\r\nab").unwrap(), 20);
        assert!(!s.is_done());
        for bad in [
            &b"8000000000000000\r\n"[..],
            b"ffffffffffffffff\r\n",
            b"FFFFFFFFFFFFFFFF;x\r\n",
        ] {
            assert_eq!(
                scan_all(bad).unwrap_err(),
                ChunkError::SizeOverflow,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn trailer_section_is_a_run_of_its_own() {
        let body = b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n";
        let mut s = ChunkedScanner::new();
        let (mut off, mut trailer_from) = (0, None);
        while !s.is_done() {
            let st = s.step(&body[off..]).unwrap();
            match (st.trailer, trailer_from) {
                (true, None) => trailer_from = Some(off),
                (false, Some(_)) => panic!("framing after the trailer section"),
                _ => {}
            }
            off += st.consumed;
        }
        assert_eq!(off, body.len());
        assert_eq!(&body[trailer_from.unwrap()..], b"X-T: 1\r\n\r\n");
    }

    #[test]
    fn incomplete_is_not_done() {
        let (_, _, done) = scan_all(b"5\r\nhel").unwrap();
        assert!(!done);
    }
}
