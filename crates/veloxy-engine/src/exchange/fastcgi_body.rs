//! A FastCGI response read off its connection ([`FcgiStream`]): the CGI header section first
//! ([`FcgiStream::head`], while the attempt can still be retried), then the body as its
//! FCGI_STDOUT records arrive, for every client protocol: the HTTP/1 writer
//! (`downstream::stream`) and the framed codecs (`framed::ResponseBody::Fastcgi`) take it a
//! chunk at a time, so memory stays bounded by a record (64 KiB) whatever the body's size,
//! and a script that flushes reaches the client as it flushes. The connection goes back to
//! the pool only after FCGI_END_REQUEST; what the script wrote to stderr is logged then (or
//! when the stream is dropped early).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::time::{Instant, Sleep};

use crate::error::{ErrorKind, ProxyError};
use crate::fastcgi::{FastcgiError, Record, MAX_HEAD};
use crate::upstream::pool::UpstreamConn;
use crate::worker::{Generation, Worker};

/// The stderr kept for the log (the rest is dropped).
const STDERR_KEPT: usize = 64 * 1024;

/// One FastCGI response on its pooled connection.
pub(crate) struct FcgiStream {
    worker: Rc<Worker>,
    gen: Rc<Generation>,
    /// (group, backend): where the connection goes back.
    to: (usize, usize),
    conn: Option<UpstreamConn>,
    /// Bytes read and not yet taken as records.
    buf: BytesMut,
    /// Body bytes that came with the head.
    pending: Option<Bytes>,
    read_timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    stderr: Vec<u8>,
    /// FCGI_END_REQUEST was read.
    done: bool,
}

impl FcgiStream {
    pub(crate) fn new(
        worker: &Rc<Worker>,
        gen: &Rc<Generation>,
        to: (usize, usize),
        conn: UpstreamConn,
    ) -> FcgiStream {
        FcgiStream {
            worker: worker.clone(),
            gen: gen.clone(),
            to,
            conn: Some(conn),
            buf: worker.take_bytes(),
            pending: None,
            read_timeout: gen.snapshot.upstreams[to.0].read_timeout,
            sleep: None,
            stderr: Vec::new(),
            done: false,
        }
    }

    /// Sends `request` and reads the response's CGI header section: (the section, without
    /// the blank line that ends it). Body bytes read with it are kept for [`Self::poll_data`].
    pub(crate) async fn head(&mut self, request: &[u8]) -> Result<Bytes, FastcgiError> {
        let conn = self.conn.as_mut().ok_or(FastcgiError::Closed)?;
        match crate::deadline::timeout(self.read_timeout, conn.stream.write_all(request)).await {
            Err(_) => return Err(FastcgiError::TimedOut),
            // A pooled connection the server had closed.
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return Err(FastcgiError::Closed)
            }
            Ok(Err(e)) => return Err(FastcgiError::Io(e)),
            Ok(Ok(())) => {}
        }
        let mut head = BytesMut::new();
        loop {
            let chunk = std::future::poll_fn(|cx| self.poll_stdout(cx)).await?;
            let Some(chunk) = chunk else {
                // The response ended without a blank line: all of it is the head.
                return Ok(head.freeze());
            };
            head.extend_from_slice(&chunk);
            if let Some((end, body)) = crate::fastcgi::head_end(&head) {
                let mut head = head.freeze();
                let rest = head.split_off(body);
                if !rest.is_empty() {
                    self.pending = Some(rest);
                }
                head.truncate(end);
                return Ok(head);
            }
            if head.len() > MAX_HEAD {
                return Err(FastcgiError::TooLarge);
            }
        }
    }

    /// The whole body, when the response's end is already read (no more reading needed);
    /// `None` otherwise: the body is to be streamed.
    pub(crate) fn whole(&mut self) -> Option<Result<Bytes, FastcgiError>> {
        if !self.done && !crate::fastcgi::complete_in(&self.buf) {
            return None;
        }
        let mut body = BytesMut::new();
        if let Some(p) = self.pending.take() {
            body.extend_from_slice(&p);
        }
        while !self.done && !self.buf.is_empty() {
            match self.take_record() {
                Ok(Some(data)) => body.extend_from_slice(&data),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        if !self.done {
            return Some(Err(FastcgiError::Closed));
        }
        Some(Ok(body.freeze()))
    }

    /// Takes one record off the buffer: stdout bytes, or `None` (stderr kept, the end
    /// handled, nothing complete yet). Returns `Ok(None)` without consuming when the next
    /// record is incomplete; the caller reads more unless [`Self::done`].
    fn take_record(&mut self) -> Result<Option<Bytes>, FastcgiError> {
        match crate::fastcgi::next_record(&mut self.buf)? {
            Some(Record::Stdout(data)) => Ok(Some(data)),
            Some(Record::Stderr(text)) => {
                let room = STDERR_KEPT.saturating_sub(self.stderr.len());
                self.stderr.extend_from_slice(&text[..text.len().min(room)]);
                Ok(None)
            }
            Some(Record::End(status)) => {
                self.done = true;
                self.log_stderr();
                if status != 0 {
                    self.conn = None;
                    return Err(FastcgiError::Refused(status));
                }
                // Nothing may follow END_REQUEST on a connection that serves one request
                // at a time: anything else and it is not reused.
                if let Some(conn) = self.conn.take() {
                    if self.buf.is_empty() {
                        self.worker.pool_upstream(&self.gen, self.to, conn);
                    }
                }
                Ok(None)
            }
            Some(Record::Other) => Ok(None),
            None => Ok(None),
        }
    }

    fn log_stderr(&mut self) {
        if self.stderr.is_empty() {
            return;
        }
        let group = &self.gen.snapshot.upstreams[self.to.0];
        let text = String::from_utf8_lossy(&self.stderr);
        tracing::warn!(upstream = %group.name, stderr = %text.trim_end(), "FastCGI stderr");
        self.stderr.clear();
    }

    /// The next stdout bytes (`Ok(None)` at FCGI_END_REQUEST), reading as needed, each read
    /// waiting at most the group's `read_timeout`.
    fn poll_stdout(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, FastcgiError>> {
        loop {
            let before = self.buf.len();
            match self.take_record()? {
                Some(data) if !data.is_empty() => return Poll::Ready(Ok(Some(data))),
                _ if self.done => return Poll::Ready(Ok(None)),
                // A record was taken (an empty one, stderr, a management record).
                _ if self.buf.len() != before => continue,
                _ => {}
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(Err(FastcgiError::Closed));
            };
            let need = crate::fastcgi::record_len(&self.buf);
            crate::http1::body::reserve(&mut self.buf, need.max(crate::http1::body::READ_CHUNK));
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.stream), cx, &mut self.buf) {
                Poll::Ready(Ok(0)) => {
                    self.conn = None;
                    return Poll::Ready(Err(FastcgiError::Closed));
                }
                Poll::Ready(Ok(_)) => {
                    if let Some(s) = self.sleep.as_mut() {
                        s.as_mut().reset(Instant::now() + self.read_timeout);
                    }
                }
                Poll::Ready(Err(e)) => {
                    self.conn = None;
                    return Poll::Ready(Err(FastcgiError::Io(e)));
                }
                Poll::Pending => {
                    let limit = self.read_timeout;
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                    if sleep.as_mut().poll(cx).is_ready() {
                        self.conn = None;
                        return Poll::Ready(Err(FastcgiError::TimedOut));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// The next chunk of the body for the client; `None` once the response is complete.
    pub(crate) fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, ProxyError>>> {
        if let Some(p) = self.pending.take() {
            return Poll::Ready(Some(Ok(p)));
        }
        // The read timeout measures the server's silence, not the time the client took to
        // want more.
        if let Some(s) = self.sleep.as_mut() {
            s.as_mut().reset(Instant::now() + self.read_timeout);
        }
        match self.poll_stdout(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(data))) => Poll::Ready(Some(Ok(data))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(body_error(e)))),
        }
    }

    /// [`Self::poll_data`] as a future.
    pub(crate) async fn next(&mut self) -> Option<Result<Bytes, ProxyError>> {
        std::future::poll_fn(|cx| self.poll_data(cx)).await
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_none()
    }
}

/// A failure after the head went to the client: the response is cut short.
fn body_error(e: FastcgiError) -> ProxyError {
    let kind = match e {
        FastcgiError::Closed => ErrorKind::UpstreamClosed,
        FastcgiError::TimedOut => ErrorKind::ReadTimeout,
        FastcgiError::Io(e) => ErrorKind::Io(e),
        _ => ErrorKind::BadResponse("invalid FastCGI response"),
    };
    ProxyError::upstream(kind)
}

impl Drop for FcgiStream {
    fn drop(&mut self) {
        self.log_stderr();
        if !self.done && self.conn.is_some() {
            tracing::debug!("FastCGI response cut short: its connection is closed");
        }
        self.worker.give_bytes(std::mem::take(&mut self.buf));
    }
}
