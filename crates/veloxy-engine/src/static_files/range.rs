//! `Range: bytes=...` parsing (RFC 9110 section 14.1.2).
//!
//! A header that does not parse is ignored (the full representation is sent, as the RFC
//! allows). Satisfiable ranges are kept in request order; unsatisfiable ones are dropped, and
//! if none is left the answer is 416. Abusive sets (more than [`MAX_RANGES`] ranges, or ranges
//! that add up to more than the file, i.e. overlapping ones) are ignored too: a full 200
//! costs the server less than a pathological multipart.

/// Most ranges honored in one request.
pub const MAX_RANGES: usize = 32;

/// A byte range, `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub len: u64,
}

impl ByteRange {
    /// The last byte's offset (inclusive), as `Content-Range` writes it.
    pub fn end(&self) -> u64 {
        self.start + self.len - 1
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeRequest {
    /// No usable Range: send everything with 200.
    Ignore,
    /// Syntactically fine but no range overlaps the file: 416.
    Unsatisfiable,
    /// One or more satisfiable ranges: 206.
    Ranges(Vec<ByteRange>),
}

/// Parses a Range header for a representation of `len` bytes.
pub fn parse(header: &[u8], len: u64) -> RangeRequest {
    let Ok(header) = std::str::from_utf8(header) else {
        return RangeRequest::Ignore;
    };
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeRequest::Ignore;
    };
    let mut ranges = Vec::new();
    let mut items = 0;
    for item in spec.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        items += 1;
        if items > MAX_RANGES {
            return RangeRequest::Ignore;
        }
        let Some((first, last)) = item.split_once('-') else {
            return RangeRequest::Ignore;
        };
        let (first, last) = (first.trim(), last.trim());
        let range = if first.is_empty() {
            // Suffix range: the last N bytes.
            let Some(n) = digits(last) else {
                return RangeRequest::Ignore;
            };
            if n == 0 || len == 0 {
                continue;
            }
            let n = n.min(len);
            ByteRange {
                start: len - n,
                len: n,
            }
        } else {
            let Some(start) = digits(first) else {
                return RangeRequest::Ignore;
            };
            let end = if last.is_empty() {
                None
            } else {
                match digits(last) {
                    Some(e) if e >= start => Some(e),
                    _ => return RangeRequest::Ignore,
                }
            };
            if start >= len {
                continue;
            }
            let end = end.map_or(len - 1, |e| e.min(len - 1));
            ByteRange {
                start,
                len: end - start + 1,
            }
        };
        ranges.push(range);
    }
    if items == 0 {
        return RangeRequest::Ignore;
    }
    if ranges.is_empty() {
        return RangeRequest::Unsatisfiable;
    }
    let total: u64 = ranges.iter().map(|r| r.len).sum();
    if ranges.len() > 1 && total > len {
        return RangeRequest::Ignore;
    }
    RangeRequest::Ranges(ranges)
}

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, len: u64) -> ByteRange {
        ByteRange { start, len }
    }

    fn p(h: &str, len: u64) -> RangeRequest {
        parse(h.as_bytes(), len)
    }

    #[test]
    fn single_ranges() {
        assert_eq!(p("bytes=0-9", 100), RangeRequest::Ranges(vec![r(0, 10)]));
        assert_eq!(p("bytes=90-", 100), RangeRequest::Ranges(vec![r(90, 10)]));
        assert_eq!(p("bytes=-10", 100), RangeRequest::Ranges(vec![r(90, 10)]));
        assert_eq!(p("bytes=-500", 100), RangeRequest::Ranges(vec![r(0, 100)]));
        assert_eq!(p("bytes=95-500", 100), RangeRequest::Ranges(vec![r(95, 5)]));
        assert_eq!(p("bytes=99-99", 100), RangeRequest::Ranges(vec![r(99, 1)]));
        assert_eq!(
            p(" bytes= 1 - 2 ", 100),
            RangeRequest::Ranges(vec![r(1, 2)])
        );
        assert_eq!(r(90, 10).end(), 99);
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(p("bytes=100-", 100), RangeRequest::Unsatisfiable);
        assert_eq!(p("bytes=200-300", 100), RangeRequest::Unsatisfiable);
        assert_eq!(p("bytes=-0", 100), RangeRequest::Unsatisfiable);
        assert_eq!(p("bytes=0-", 0), RangeRequest::Unsatisfiable);
        assert_eq!(p("bytes=-5", 0), RangeRequest::Unsatisfiable);
        assert_eq!(
            p("bytes=200-300, 0-1", 100),
            RangeRequest::Ranges(vec![r(0, 2)])
        );
    }

    #[test]
    fn ignored() {
        for h in [
            "",
            "bytes=",
            "items=0-1",
            "bytes=5-1",
            "bytes=a-b",
            "bytes=1",
            "bytes=--1",
            "bytes=-1-2",
            "bytes=+1-2",
            "bytes=99999999999999999999-",
            "bytes=0-99,0-99",
        ] {
            assert_eq!(p(h, 100), RangeRequest::Ignore, "{h:?}");
        }
        let many = format!("bytes={}", vec!["0-0"; 33].join(","));
        assert_eq!(p(&many, 100), RangeRequest::Ignore);
    }

    #[test]
    fn multiple() {
        assert_eq!(
            p("bytes=0-1, 10-19, -5", 100),
            RangeRequest::Ranges(vec![r(0, 2), r(10, 10), r(95, 5)])
        );
    }
}
