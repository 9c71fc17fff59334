//! The request body of a multiplexed stream: an HTTP/2 stream (hyper's [`Incoming`]) or an
//! HTTP/3 request stream (h3 over quinn).
//!
//! HTTP/2 and HTTP/3 requests share one stream handler ([`super::handle`]): the exchange
//! core, file routes and both upstream protocols take a `Request<RequestBody>`, so a feature
//! is written once for both. An enum rather than a boxed body keeps the HTTP/2 path free of
//! an allocation and a virtual call per frame.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// A body error from either codec: the client's stream failed (reset, connection lost).
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The client's request body.
pub(crate) enum RequestBody {
    H2(Incoming),
    H3(H3Body),
    /// A body whose first part was read before the attempts (a `mirror` copy took it).
    Read(Box<ReadAhead>),
}

/// What was read of a body ahead of the attempts, handed out first: its data, then the rest
/// of the body if it had not ended, else its trailers.
#[derive(Default)]
pub(crate) struct ReadAhead {
    pub data: Option<Bytes>,
    pub trailers: Option<http::HeaderMap>,
    pub rest: Option<RequestBody>,
    /// The client stalled past `body_timeout` while it was read, as the exchange's driver
    /// decided (`Codec::body_stalled`): the rest is not waited for again (see
    /// [`RequestBody::stalled`]).
    pub stalled: bool,
}

impl RequestBody {
    /// Whether the client already stalled past `body_timeout` in this body (a `mirror`
    /// read-ahead waited it out): the attempts then wait no longer for the rest than for
    /// what has arrived, and the client gets its 408 after one timeout, not two.
    pub(crate) fn stalled(&self) -> bool {
        matches!(self, RequestBody::Read(r) if r.stalled)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RequestBody::H2(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            RequestBody::H3(b) => b.poll(cx).map(|f| f.map(|r| r.map_err(Into::into))),
            RequestBody::Read(r) => match (r.data.take(), &mut r.rest) {
                (Some(d), _) => Poll::Ready(Some(Ok(Frame::data(d)))),
                (None, Some(rest)) => Pin::new(rest).poll_frame(cx),
                (None, None) => Poll::Ready(r.trailers.take().map(|t| Ok(Frame::trailers(t)))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::H2(b) => b.is_end_stream(),
            RequestBody::H3(b) => b.state == H3State::Done,
            RequestBody::Read(r) => {
                r.data.is_none()
                    && r.trailers.is_none()
                    && r.rest.as_ref().is_none_or(|b| b.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::H2(b) => b.size_hint(),
            RequestBody::H3(b) if b.state == H3State::Done => SizeHint::with_exact(0),
            RequestBody::H3(_) => SizeHint::default(),
            RequestBody::Read(r) => {
                let first = r.data.as_ref().map_or(0, |d| d.len() as u64);
                match &r.rest {
                    None => SizeHint::with_exact(first),
                    Some(rest) => {
                        let h = rest.size_hint();
                        let mut out = SizeHint::new();
                        out.set_lower(h.lower() + first);
                        if let Some(u) = h.upper() {
                            out.set_upper(u + first);
                        }
                        out
                    }
                }
            }
        }
    }
}

type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// A request body read from the client's HTTP/3 stream: DATA frames, then trailers.
pub(crate) struct H3Body {
    recv: H3Recv,
    state: H3State,
    /// Data read ahead by [`H3Body::new`], handed out first.
    first: Option<Bytes>,
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum H3State {
    Data,
    Trailers,
    Done,
}

impl H3Body {
    /// Wraps the stream, looking once at what has already arrived: a request whose FIN came
    /// with its headers (every GET from a browser) is then known to have no body, so it is
    /// forwarded with no body framing at all, as on HTTP/2, instead of an empty chunked one.
    pub(crate) fn new(recv: H3Recv) -> H3Body {
        let mut body = H3Body {
            recv,
            state: H3State::Data,
            first: None,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match body.recv.poll_recv_data(&mut cx) {
            Poll::Ready(Ok(Some(mut buf))) => body.first = Some(buf.copy_to_bytes(buf.remaining())),
            Poll::Ready(Ok(None)) => {
                body.state = H3State::Trailers;
                // Polled again, with the real waker, if trailers are still on their way.
                if let Poll::Ready(Ok(None)) = body.recv.poll_recv_trailers(&mut cx) {
                    body.state = H3State::Done;
                }
            }
            // Not arrived yet, or an error the first real poll reports.
            Poll::Pending | Poll::Ready(Err(_)) => {}
        }
        body
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h3::error::StreamError>>> {
        if let Some(data) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if self.state == H3State::Data {
            match self.recv.poll_recv_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Ok(Some(mut buf))) => {
                    let data = buf.copy_to_bytes(buf.remaining());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Ok(None)) => self.state = H3State::Trailers,
            }
        }
        if self.state == H3State::Done {
            return Poll::Ready(None);
        }
        match self.recv.poll_recv_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Ready(Ok(Some(t))) => {
                self.state = H3State::Done;
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Poll::Ready(Ok(None)) => {
                self.state = H3State::Done;
                Poll::Ready(None)
            }
        }
    }
}
