//! Per-connection HTTP/1.1 handling: request head parsing, request body
//! decoding (`Content-Length` and chunked) and response writing.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::request::{parse_chunk_size, parse_head, Fail, Framing, Req};
use crate::routes::{
    push_head_start, push_hex, push_u64, Canned, DefaultBody, Route, Shared, SizeMode,
    APPLICATION_JSON, OCTET_STREAM, PATTERN_BLOCK, TEXT_PLAIN,
};

/// Size of the per-connection read buffer; also the maximum request head.
const READ_BUF: usize = 64 * 1024;
/// Maximum length of a chunk-size line or of one trailer line.
const MAX_LINE: usize = 8 * 1024;
/// Maximum total size of the trailer section of a chunked body.
const MAX_TRAILERS: usize = 64 * 1024;
/// Pending output is written once it reaches this size.
const OUT_FLUSH: usize = 64 * 1024;
/// Data size of each chunk of a chunked `/size` response.
const CHUNK_OUT: usize = 16 * 1024;
/// How long to drain input after shutting down our side of a connection.
const LINGER: Duration = Duration::from_secs(1);

/// Accepts connections forever, spawning one task per connection.
pub async fn serve(listener: TcpListener, shared: &'static Shared) {
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                if let Err(e) = stream.set_nodelay(true) {
                    eprintln!("veloxy-upstream: set TCP_NODELAY: {e}");
                }
                let id = shared.next_conn_id.fetch_add(1, Ordering::Relaxed) + 1;
                tokio::spawn(Conn::new(stream, id, shared).run());
            }
            Err(e) => {
                // Typically EMFILE; back off instead of spinning.
                eprintln!("veloxy-upstream: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

#[derive(Default)]
struct BodyStats {
    bytes: u64,
    sum: u64,
    newlines: u64,
    last: Option<u8>,
}

impl BodyStats {
    fn feed(&mut self, data: &[u8], count_lines: bool) {
        if data.is_empty() {
            return;
        }
        self.bytes += data.len() as u64;
        self.sum = self.sum.wrapping_add(byte_sum(data));
        if count_lines {
            self.newlines += data.iter().filter(|&&b| b == b'\n').count() as u64;
            self.last = data.last().copied();
        }
    }

    /// Newline-delimited lines; a non-empty final line without `\n` counts.
    fn lines(&self) -> u64 {
        self.newlines + u64::from(self.last.is_some_and(|b| b != b'\n'))
    }
}

fn byte_sum(data: &[u8]) -> u64 {
    // 65536 * 255 fits in a u32, and u32 lanes vectorize better than u64.
    data.chunks(1 << 16)
        .map(|c| u64::from(c.iter().map(|&b| u32::from(b)).sum::<u32>()))
        .sum()
}

/// Which `connection` header a response carries.
#[derive(Clone, Copy)]
enum ConnHdr {
    None,
    Close,
    KeepAlive,
}

struct Conn {
    stream: TcpStream,
    /// Read buffer; unconsumed input is `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Pending output, written by `flush`.
    out: Vec<u8>,
    /// 1-based index of the current request on this connection.
    seq: u64,
    /// `x-conn-id: C\r\n`.
    id_hdr: Vec<u8>,
    shared: &'static Shared,
}

impl Conn {
    fn new(stream: TcpStream, id: u64, shared: &'static Shared) -> Self {
        let mut id_hdr = Vec::with_capacity(32);
        id_hdr.extend_from_slice(b"x-conn-id: ");
        push_u64(&mut id_hdr, id);
        id_hdr.extend_from_slice(b"\r\n");
        Conn {
            stream,
            buf: vec![0; READ_BUF],
            start: 0,
            end: 0,
            out: Vec::with_capacity(4096),
            seq: 0,
            id_hdr,
            shared,
        }
    }

    async fn run(mut self) {
        match self.serve().await {
            Ok(()) => self.lingering_close().await,
            Err(Fail::Closed) => {}
            Err(Fail::Bad(status)) => {
                let body: &[u8] = if status == 431 {
                    b"request header fields too large\n"
                } else {
                    b"bad request\n"
                };
                self.push_simple(status, TEXT_PLAIN, b"", body, false, ConnHdr::Close);
                self.lingering_close().await;
            }
        }
    }

    /// Serves requests until the connection should be closed gracefully
    /// (`Ok`) or must be dropped / answered with an error (`Err`).
    async fn serve(&mut self) -> Result<(), Fail> {
        loop {
            self.seq += 1;
            let req = self.read_head().await?;
            if !self.handle(&req).await? || self.seq >= self.shared.close_after {
                return Ok(());
            }
            if self.out.len() >= OUT_FLUSH {
                self.flush().await?;
            }
        }
    }

    async fn read_head(&mut self) -> Result<Req, Fail> {
        loop {
            if self.start < self.end {
                if let Some(req) = parse_head(&self.buf[self.start..self.end])? {
                    return Ok(req);
                }
                if self.end - self.start >= READ_BUF {
                    return Err(Fail::Bad(431));
                }
            }
            self.fill().await?;
        }
    }

    /// Handles one request whose head is at `buf[start..]`. Returns whether
    /// the connection stays open.
    async fn handle(&mut self, req: &Req) -> Result<bool, Fail> {
        match req.route {
            Route::Drop => {
                self.flush().await?;
                return Err(Fail::Closed);
            }
            Route::Hang => {
                self.flush().await?;
                self.drain_until_eof().await;
                return Err(Fail::Closed);
            }
            _ => {}
        }

        let echo_head = if req.route == Route::Echo {
            self.buf[self.start..self.start + req.head_len].to_vec()
        } else {
            Vec::new()
        };
        self.start += req.head_len;

        let count_lines = req.route == Route::Bulk;
        let mut stats = BodyStats::default();
        match req.body {
            Framing::None => {}
            Framing::Length(len) => {
                self.send_continue(req).await?;
                self.consume(len, &mut stats, count_lines).await?;
            }
            Framing::Chunked => {
                self.send_continue(req).await?;
                self.read_chunked(&mut stats, count_lines).await?;
            }
        }

        let shared = self.shared;
        let keep = req.keep_alive;
        let conn_hdr = if !keep {
            ConnHdr::Close
        } else if req.http10 {
            ConnHdr::KeepAlive
        } else {
            ConnHdr::None
        };
        let head = req.is_head;
        match req.route {
            Route::Default => self.push_default(head, conn_hdr).await?,
            Route::Delay(ms) => {
                self.flush().await?;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                self.push_default(head, conn_hdr).await?;
            }
            Route::Close => {
                self.push_default(head, ConnHdr::Close).await?;
                return Ok(false);
            }
            Route::Health => self.push_canned(&shared.health, head, conn_hdr),
            Route::Search => self.push_canned(&shared.search, head, conn_hdr),
            Route::Echo => {
                let mut extra = Vec::with_capacity(64);
                extra.extend_from_slice(b"x-body-bytes: ");
                push_u64(&mut extra, stats.bytes);
                extra.extend_from_slice(b"\r\nx-body-sum: ");
                push_u64(&mut extra, stats.sum);
                extra.extend_from_slice(b"\r\n");
                self.push_simple(200, TEXT_PLAIN, &extra, &echo_head, head, conn_hdr);
            }
            Route::Sink => {
                let mut body = Vec::with_capacity(64);
                body.extend_from_slice(b"{\"bytes\":");
                push_u64(&mut body, stats.bytes);
                body.extend_from_slice(b",\"sum\":");
                push_u64(&mut body, stats.sum);
                body.push(b'}');
                self.push_simple(200, APPLICATION_JSON, b"", &body, head, conn_hdr);
            }
            Route::Bulk => {
                let mut body = Vec::with_capacity(64);
                body.extend_from_slice(b"{\"took\":1,\"errors\":false,\"items\":");
                push_u64(&mut body, stats.lines() / 2);
                body.push(b'}');
                self.push_simple(200, APPLICATION_JSON, b"", &body, head, conn_hdr);
            }
            Route::Status(code) => match code {
                204 | 304 => {
                    self.push_head(code, None, None);
                    self.finish_head(conn_hdr);
                }
                205 => self.push_simple(code, TEXT_PLAIN, b"", b"", head, conn_hdr),
                _ => {
                    let mut body = Vec::with_capacity(16);
                    body.extend_from_slice(b"status ");
                    push_u64(&mut body, u64::from(code));
                    body.push(b'\n');
                    self.push_simple(code, TEXT_PLAIN, b"", &body, head, conn_hdr);
                }
            },
            Route::Size { len, mode, text } => {
                let ctype = if text { TEXT_PLAIN } else { OCTET_STREAM };
                // HTTP/1.0 clients do not understand chunked framing.
                let mode = if mode == SizeMode::Chunked && req.http10 {
                    SizeMode::CloseDelimited
                } else {
                    mode
                };
                match mode {
                    SizeMode::Length => {
                        self.push_head(200, Some(ctype), Some(len));
                        self.finish_head(conn_hdr);
                        if !head {
                            self.push_pattern(len, false).await?;
                        }
                    }
                    SizeMode::Chunked => {
                        self.push_head(200, Some(ctype), None);
                        self.out
                            .extend_from_slice(b"transfer-encoding: chunked\r\n");
                        self.finish_head(conn_hdr);
                        if !head {
                            self.push_pattern(len, true).await?;
                        }
                    }
                    SizeMode::CloseDelimited => {
                        self.push_head(200, Some(ctype), None);
                        self.finish_head(ConnHdr::Close);
                        if !head {
                            self.push_pattern(len, false).await?;
                        }
                        return Ok(false);
                    }
                }
            }
            Route::BadParam => {
                self.push_simple(
                    400,
                    TEXT_PLAIN,
                    b"",
                    b"bad path parameter\n",
                    head,
                    conn_hdr,
                );
            }
            // Handled before the body is read.
            Route::Drop | Route::Hang => return Err(Fail::Closed),
        }
        Ok(keep)
    }

    /// Sends `100 Continue` if the request asked for it.
    async fn send_continue(&mut self, req: &Req) -> Result<(), Fail> {
        if req.expect_continue && !req.http10 {
            self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            self.flush().await?;
        }
        Ok(())
    }

    /// Consumes exactly `len` body bytes.
    async fn consume(
        &mut self,
        len: u64,
        stats: &mut BodyStats,
        count_lines: bool,
    ) -> Result<(), Fail> {
        let mut remaining = len;
        loop {
            let take = ((self.end - self.start) as u64).min(remaining) as usize;
            stats.feed(&self.buf[self.start..self.start + take], count_lines);
            self.start += take;
            remaining -= take as u64;
            if remaining == 0 {
                return Ok(());
            }
            self.fill().await?;
        }
    }

    /// Decodes a chunked body, including chunk extensions and trailers.
    async fn read_chunked(&mut self, stats: &mut BodyStats, count_lines: bool) -> Result<(), Fail> {
        loop {
            let n = self.read_line().await?;
            let size =
                parse_chunk_size(&self.buf[self.start..self.start + n]).ok_or(Fail::Bad(400))?;
            self.start += n + 2;
            if size == 0 {
                break;
            }
            self.consume(size, stats, count_lines).await?;
            while self.end - self.start < 2 {
                self.fill().await?;
            }
            if &self.buf[self.start..self.start + 2] != b"\r\n" {
                return Err(Fail::Bad(400));
            }
            self.start += 2;
        }
        let mut total = 0;
        loop {
            let n = self.read_line().await?;
            let line = &self.buf[self.start..self.start + n];
            if n == 0 {
                self.start += 2;
                return Ok(());
            }
            // A trailer field: `name: value`, no obsolete line folding.
            if line[0] == b' ' || line[0] == b'\t' || !line.contains(&b':') {
                return Err(Fail::Bad(400));
            }
            self.start += n + 2;
            total += n + 2;
            if total > MAX_TRAILERS {
                return Err(Fail::Bad(400));
            }
        }
    }

    /// Waits for a CRLF-terminated line at `buf[start..]` and returns its
    /// length without the CRLF. A bare LF is a protocol error.
    async fn read_line(&mut self) -> Result<usize, Fail> {
        let mut scanned = 0;
        loop {
            let data = &self.buf[self.start..self.end];
            if let Some(i) = data[scanned..].iter().position(|&b| b == b'\n') {
                let i = scanned + i;
                if i == 0 || data[i - 1] != b'\r' {
                    return Err(Fail::Bad(400));
                }
                return Ok(i - 1);
            }
            scanned = data.len();
            if scanned > MAX_LINE {
                return Err(Fail::Bad(400));
            }
            self.fill().await?;
        }
    }

    /// Writes pending output, then reads more input into the buffer.
    async fn fill(&mut self) -> Result<(), Fail> {
        self.flush().await?;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            return Err(Fail::Bad(431));
        }
        let n = self.stream.read(&mut self.buf[self.end..]).await?;
        if n == 0 {
            return Err(Fail::Closed);
        }
        self.end += n;
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Fail> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Flushes, shuts down our write side, then drains input for a while so
    /// that unread request bytes do not turn the close into a reset that
    /// could destroy the last response.
    async fn lingering_close(&mut self) {
        if self.flush().await.is_err() || self.stream.shutdown().await.is_err() {
            return;
        }
        let (stream, buf) = (&mut self.stream, &mut self.buf);
        let _ = tokio::time::timeout(LINGER, async move {
            while let Ok(n) = stream.read(buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }

    /// Reads and discards input until the peer closes (for `/hang`).
    async fn drain_until_eof(&mut self) {
        while let Ok(n) = self.stream.read(&mut self.buf).await {
            if n == 0 {
                break;
            }
        }
    }

    /// Appends the per-request headers and the blank line ending the head.
    fn finish_head(&mut self, conn_hdr: ConnHdr) {
        self.out.extend_from_slice(&self.id_hdr);
        self.out.extend_from_slice(b"x-conn-seq: ");
        push_u64(&mut self.out, self.seq);
        self.out.extend_from_slice(match conn_hdr {
            ConnHdr::None => b"\r\n\r\n".as_slice(),
            ConnHdr::Close => b"\r\nconnection: close\r\n\r\n",
            ConnHdr::KeepAlive => b"\r\nconnection: keep-alive\r\n\r\n",
        });
    }

    /// Appends the status line, `content-type`, `content-length` and
    /// `x-upstream` headers.
    fn push_head(&mut self, status: u16, content_type: Option<&str>, len: Option<u64>) {
        push_head_start(&mut self.out, status, content_type, len);
        self.out.extend_from_slice(&self.shared.upstream_hdr);
    }

    /// Appends a complete response with a `content-length` body. `extra`
    /// holds additional CRLF-terminated header lines.
    fn push_simple(
        &mut self,
        status: u16,
        content_type: &str,
        extra: &[u8],
        body: &[u8],
        head: bool,
        conn_hdr: ConnHdr,
    ) {
        self.push_head(status, Some(content_type), Some(body.len() as u64));
        self.out.extend_from_slice(extra);
        self.finish_head(conn_hdr);
        if !head {
            self.out.extend_from_slice(body);
        }
    }

    fn push_canned(&mut self, canned: &Canned, head: bool, conn_hdr: ConnHdr) {
        self.out.extend_from_slice(&canned.head);
        self.finish_head(conn_hdr);
        if !head {
            self.out.extend_from_slice(&canned.body);
        }
    }

    async fn push_default(&mut self, head: bool, conn_hdr: ConnHdr) -> Result<(), Fail> {
        let shared = self.shared;
        match &shared.default {
            DefaultBody::Static(canned) => self.push_canned(canned, head, conn_hdr),
            DefaultBody::Pattern {
                head: resp_head,
                len,
            } => {
                self.out.extend_from_slice(resp_head);
                self.finish_head(conn_hdr);
                if !head {
                    self.push_pattern(*len, false).await?;
                }
            }
        }
        Ok(())
    }

    /// Appends (and, once large, writes) `len` bytes of the `/size` pattern,
    /// raw or chunked. Small bodies stay in `out`, so head and body go out in
    /// one write; large raw bodies are written straight from the shared
    /// pattern buffer.
    async fn push_pattern(&mut self, len: u64, chunked: bool) -> Result<(), Fail> {
        let shared = self.shared;
        let pattern = &shared.pattern;
        let step = (if chunked { CHUNK_OUT } else { PATTERN_BLOCK }) as u64;
        let mut off = 0;
        while off < len {
            let n = (len - off).min(step) as usize;
            let phase = (off % 26) as usize;
            let piece = &pattern[phase..phase + n];
            if chunked {
                push_hex(&mut self.out, n as u64);
                self.out.extend_from_slice(b"\r\n");
                self.out.extend_from_slice(piece);
                self.out.extend_from_slice(b"\r\n");
            } else if self.out.is_empty() {
                self.stream.write_all(piece).await?;
            } else {
                self.out.extend_from_slice(piece);
            }
            off += n as u64;
            if self.out.len() >= OUT_FLUSH {
                self.flush().await?;
            }
        }
        if chunked {
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        Ok(())
    }
}
