//! The HTTP/1.1 client's streamed response body ([`H1Body`], an `http_body::Body`, for codecs
//! that send bodies as frames: HTTP/2 and HTTP/3 clients of HTTP/1 groups): read from the
//! upstream connection as the codec asks for frames, de-chunked (and compressed when the
//! route says so), and the connection pooled as soon as the body is complete. The codec's
//! end-of-exchange guard ([`End`]) counts what went out and records the exchange when the
//! body drops it.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body::Frame;
use tokio::time::{Instant, Sleep};

use super::framed::End;
use crate::error::{ErrorKind, ProxyError};
use crate::http1::body::{reserve, BodyState, READ_CHUNK};
use crate::upstream::pool::UpstreamConn;
use crate::worker::Generation;

fn up(kind: ErrorKind) -> ProxyError {
    ProxyError::upstream(kind)
}

/// A response body read from an HTTP/1.1 upstream connection.
pub(crate) struct H1Body<F: End> {
    /// The worker, to give the read buffer back when the body is dropped.
    pub(crate) worker: Rc<crate::worker::Worker>,
    /// `compress = true` and the response qualified: payload goes through this encoder.
    pub(crate) encoder: Option<crate::compress::StreamEncoder>,
    pub(crate) conn: Option<UpstreamConn>,
    /// Bytes read but not yet passed on.
    pub(crate) buf: BytesMut,
    pub(crate) state: BodyState,
    pub(crate) gen: Rc<Generation>,
    pub(crate) upstream: usize,
    pub(crate) backend: usize,
    pub(crate) reusable: bool,
    pub(crate) read_timeout: Duration,
    pub(crate) sleep: Option<Pin<Box<Sleep>>>,
    pub(crate) scratch: Vec<u8>,
    pub(crate) fin: Option<Box<F>>,
}

impl<F: End> H1Body<F> {
    /// The body is complete: pool the connection if it is clean, and record the stream.
    fn finish(&mut self) {
        self.release();
        self.fin.take();
    }

    /// Pools the connection as soon as the body is complete: hyper may drop a body whose
    /// `is_end_stream` is true without polling it again.
    pub(crate) fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.reusable && self.buf.is_empty() {
                let to = (self.upstream, self.backend);
                self.worker.pool_upstream(&self.gen, to, conn);
            }
        }
    }

    /// Runs payload through the encoder, if any; `None` when there is nothing to send yet.
    fn encode(&mut self, data: Bytes) -> Option<Result<Bytes, ProxyError>> {
        let Some(enc) = self.encoder.as_mut() else {
            return Some(Ok(data));
        };
        let coded = (|| {
            let mut out = enc.encode(&data)?.to_vec();
            if self.state.is_done() {
                out.extend_from_slice(enc.finish()?);
            }
            Ok::<_, std::io::Error>(out)
        })();
        match coded {
            Ok(out) if out.is_empty() => None,
            Ok(out) => Some(Ok(Bytes::from(out))),
            Err(e) => Some(Err(ProxyError::upstream(ErrorKind::Io(e)))),
        }
    }

    fn emit(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>> {
        if self.state.is_done() {
            self.release();
        }
        // The read timeout measures the upstream's silence, not time the client took to
        // want more (hyper polls the body only when the stream has window).
        if let Some(s) = self.sleep.as_mut() {
            s.as_mut().reset(Instant::now() + self.read_timeout);
        }
        let data = match self.encode(data) {
            Some(Ok(d)) => d,
            Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            // Nothing coded yet: an empty frame keeps the poll loop simple.
            None => Bytes::new(),
        };
        if let Some(f) = self.fin.as_deref_mut() {
            f.sent(data.len() as u64);
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        self.state.is_done()
    }

    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>> {
        let bad = |_| ProxyError::upstream(ErrorKind::BadResponse("invalid chunked body"));
        loop {
            if self.state.is_done() {
                // A close-delimited body ends with no payload left to carry the coded tail.
                if let Some(mut enc) = self.encoder.take() {
                    match enc.finish() {
                        Ok(tail) if !tail.is_empty() => {
                            let tail = Bytes::copy_from_slice(tail);
                            self.release();
                            return Poll::Ready(Some(Ok(Frame::data(tail))));
                        }
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Some(Err(up(ErrorKind::Io(e))))),
                    }
                }
                self.finish();
                return Poll::Ready(None);
            }
            if !self.buf.is_empty() {
                if self.state.decodes() {
                    self.scratch.clear();
                    let used = match self.state.take_into(&self.buf, &mut self.scratch) {
                        Ok(n) => n,
                        Err(e) => return Poll::Ready(Some(Err(bad(e)))),
                    };
                    self.buf.advance(used);
                    if !self.scratch.is_empty() {
                        let data = Bytes::copy_from_slice(&self.scratch);
                        return self.emit(data);
                    }
                    if used > 0 {
                        continue;
                    }
                } else {
                    let used = match self.state.take(&self.buf) {
                        Ok(n) => n,
                        Err(e) => return Poll::Ready(Some(Err(bad(e)))),
                    };
                    if used > 0 {
                        let data = Bytes::copy_from_slice(&self.buf[..used]);
                        self.buf.advance(used);
                        return self.emit(data);
                    }
                }
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            reserve(&mut self.buf, READ_CHUNK);
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.stream), cx, &mut self.buf) {
                Poll::Ready(Ok(0)) => {
                    if matches!(self.state, BodyState::UntilClose) {
                        self.state = BodyState::Done;
                        self.reusable = false;
                        continue;
                    }
                    self.conn = None;
                    return Poll::Ready(Some(Err(up(ErrorKind::UpstreamClosed))));
                }
                Poll::Ready(Ok(_)) => {
                    if let Some(s) = self.sleep.as_mut() {
                        s.as_mut().reset(Instant::now() + self.read_timeout);
                    }
                }
                Poll::Ready(Err(e)) => {
                    self.conn = None;
                    return Poll::Ready(Some(Err(up(ErrorKind::Io(e)))));
                }
                Poll::Pending => {
                    let timeout = self.read_timeout;
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    if sleep.as_mut().poll(cx).is_ready() {
                        self.conn = None;
                        return Poll::Ready(Some(Err(up(ErrorKind::ReadTimeout))));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<F: End> Drop for H1Body<F> {
    fn drop(&mut self) {
        self.worker.give_bytes(std::mem::take(&mut self.buf));
        if !self.state.is_done() {
            if let Some(f) = self.fin.as_deref_mut() {
                // The client reset the stream, or the upstream failed mid-body.
                tracing::debug!(status = f.status(), "streamed response body cut short");
            }
        }
    }
}
