//! The HTTP/2 and HTTP/3 codec's side of the exchange driver ([`crate::exchange::drive`]):
//! how an admitted stream reads its body, answers, fails, and runs its attempts (to an
//! HTTP/1 group with [`crate::exchange::framed_h1`], to an `h2`/`h2c` group with [`crate::exchange::framed_h2`]).
//! Failures come back as `Err` for [`super::handle`] to answer (gRPC-aware).

use std::rc::Rc;

use bytes::Bytes;
use http::{Request, Response};

use super::request_body::{ReadAhead, RequestBody};
use super::{ConnCtx, Finish, ProxyBody};
use crate::config::UpstreamProtocol;
use crate::error::ProxyError;
use crate::exchange::drive::Codec;
use crate::exchange::mirror::MirrorRead;
use crate::exchange::{framed, framed_h1, framed_h2};
use crate::exchange::{Admitted, Answer, ProxyTarget, Record, Slot};
use crate::worker::{Generation, Worker};

/// One admitted stream.
pub(crate) struct H2<'a> {
    pub c: &'a Rc<ConnCtx>,
    pub req: Request<RequestBody>,
    /// What admission decided.
    pub admitted: Admitted,
    /// The record and slot, until the response takes them.
    pub fin: &'a mut Option<Box<Finish>>,
}

type Out = Result<Response<ProxyBody>, ProxyError>;

impl H2<'_> {
    fn finish(&mut self) -> &mut Finish {
        self.fin.as_deref_mut().expect("present until answered")
    }

    fn is_head(&self) -> bool {
        self.req.method() == http::Method::HEAD
    }
}

impl Codec for H2<'_> {
    type Out = Out;

    fn record(&mut self) -> &mut Record {
        &mut self.finish().record
    }

    fn target(&mut self) -> Option<&mut ProxyTarget> {
        match &mut self.admitted {
            Admitted::Proxy(t) => Some(t),
            _ => None,
        }
    }

    fn slot(&mut self) -> &mut Slot {
        &mut self.finish().admission
    }

    fn add_upstream_lines(&mut self, lines: &[u8]) {
        if let Some(t) = self.target() {
            t.edit
                .get_or_insert_with(crate::exchange::edit::UpstreamEdit::empty)
                .push_lines(lines);
        }
    }

    fn interims(&mut self) -> Option<crate::hints::Interims> {
        self.req
            .extensions()
            .get::<crate::hints::Interims>()
            .cloned()
    }

    async fn whole_body(&mut self, limit: u64) -> Result<Bytes, ProxyError> {
        framed::whole_body(&**self.c, self.req.body_mut(), limit).await
    }

    async fn mirror_body(&mut self, limit: usize, wait: bool) -> MirrorRead {
        use http_body::Body;
        let body = self.req.body();
        if body.is_end_stream() {
            return MirrorRead::Copy(Bytes::new());
        }
        let declared = self
            .req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .or(body.size_hint().exact());
        if declared.is_some_and(|n| n > limit as u64) {
            return MirrorRead::Uncopied;
        }
        // A declared length is sent whatever the answer: waiting for it holds no stream.
        let wait = wait || declared.is_some();
        let (read, stalled) = read_ahead(self.c, self.req.body_mut(), limit, wait).await;
        let copy = match (read.rest.is_none(), stalled) {
            (_, true) => MirrorRead::Stalled,
            (true, false) => MirrorRead::Copy(read.data.clone().unwrap_or_default()),
            (false, false) => MirrorRead::Uncopied,
        };
        let body = std::mem::replace(self.req.body_mut(), RequestBody::Read(Box::new(read)));
        if let RequestBody::Read(r) = self.req.body_mut() {
            if r.rest.is_some() {
                r.rest = Some(body);
            }
        }
        copy
    }

    fn body_stalled(&mut self) {
        // Read by `FramedClient::stalled`: the attempts' reads of the rest wait no longer.
        if let RequestBody::Read(r) = self.req.body_mut() {
            r.stalled = true;
        }
    }

    async fn ready(self) -> Out {
        let worker: &Rc<Worker> = &self.c.worker;
        let is_head = self.is_head();
        let f = self.fin.take().expect("present until answered");
        Ok(match self.admitted {
            Admitted::Files(route) => {
                let path = self.req.uri().path_and_query().map_or("/", |p| p.as_str());
                let req = (self.req.method(), path, self.req.headers());
                framed::serve_file(worker, &route, req, f)
            }
            Admitted::Answer(answer) => framed::serve_answer(worker, answer, is_head, f),
            Admitted::Cached(r) => framed::serve_static(worker, r, f),
            Admitted::Proxy(_) => unreachable!("a proxied request is not ready"),
        })
    }

    async fn answer(self, a: Answer) -> Out {
        let is_head = self.is_head();
        let f = self.fin.take().expect("present until answered");
        Ok(framed::serve_answer(&self.c.worker, a, is_head, f))
    }

    async fn cached(self, r: crate::static_files::Response) -> Out {
        let f = self.fin.take().expect("present until answered");
        Ok(framed::serve_static(&self.c.worker, r, f))
    }

    async fn streamed(
        self,
        r: crate::static_files::Response,
        body: Box<crate::exchange::fastcgi_body::FcgiStream>,
    ) -> Out {
        let f = self.fin.take().expect("present until answered");
        Ok(framed::serve_stream(&self.c.worker, r, body, f))
    }

    async fn fail(self, e: ProxyError) -> Out {
        Err(e)
    }

    async fn attempts(self, _worker: &Rc<Worker>, gen: &Rc<Generation>) -> Out {
        let Admitted::Proxy(target) = self.admitted else {
            unreachable!("only a proxied request runs attempts")
        };
        if self.req.method() == http::Method::CONNECT {
            // Only a WebSocket's extended CONNECT is admitted (RFC 8441).
            return super::websocket::relay(self.c, gen, &target, self.req, self.fin).await;
        }
        match gen.snapshot.upstreams[target.upstream].protocol {
            UpstreamProtocol::Http1 => {
                framed_h1::relay(&**self.c, gen, &target, self.req, self.fin).await
            }
            // FastCGI groups are answered by the driver's FastCGI step.
            UpstreamProtocol::H2 | UpstreamProtocol::H2c | UpstreamProtocol::Fastcgi => {
                framed_h2::relay(&**self.c, gen, &target, self.req, self.fin).await
            }
        }
    }
}

/// Reads the request body ahead of the attempts, up to `limit` bytes: whole (with its
/// trailers; `rest` is `None`), or the part read when it is longer, failed or stalled (`rest`
/// marks that the body goes on; the caller puts the body there), and whether the client
/// stalled past `body_timeout`. A failure is left for the attempts to meet on their own read.
/// Without `wait`, only the frames already arrived.
async fn read_ahead(
    c: &ConnCtx,
    body: &mut RequestBody,
    limit: usize,
    wait: bool,
) -> (ReadAhead, bool) {
    let mut out = bytes::BytesMut::new();
    let mut trailers = None;
    let mut stalled = false;
    let whole = loop {
        let next = match wait {
            true => framed::next_frame(c, body).await,
            false => match arrived(body) {
                Some(next) => next,
                None => break false,
            },
        };
        match next {
            Ok(None) => break true,
            Ok(Some(frame)) => match frame.into_data() {
                Ok(data) => {
                    out.extend_from_slice(&data);
                    if out.len() > limit {
                        break false;
                    }
                }
                Err(frame) => trailers = frame.into_trailers().ok(),
            },
            Err(e) => {
                stalled = matches!(e.kind, crate::error::ErrorKind::BodyTimeout);
                break false;
            }
        }
    };
    let read = ReadAhead {
        data: (!out.is_empty()).then(|| out.freeze()),
        trailers,
        // A placeholder, replaced by the body itself.
        rest: (!whole).then(|| RequestBody::Read(Box::default())),
        stalled: false,
    };
    (read, stalled)
}

/// The body's next frame if it has arrived (`None`: not yet), without waiting for it.
fn arrived(body: &mut RequestBody) -> Option<Result<Option<http_body::Frame<Bytes>>, ProxyError>> {
    use http_body::Body;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(body).poll_frame(&mut cx) {
        std::task::Poll::Pending => None,
        std::task::Poll::Ready(None) => Some(Ok(None)),
        std::task::Poll::Ready(Some(Ok(f))) => Some(Ok(Some(f))),
        std::task::Poll::Ready(Some(Err(e))) => Some(Err(ProxyError::downstream(
            crate::error::ErrorKind::Stream,
        )
        .because(e))),
    }
}
