//! WebSocket over HTTP/2 (RFC 8441): an extended CONNECT with `:protocol = websocket`,
//! offered by SETTINGS_ENABLE_CONNECT_PROTOCOL, bridged to the route's HTTP/1.1 upstream as
//! the WebSocket upgrade (RFC 6455) it would have been over HTTP/1.1.
//!
//! The stream is routed as a GET of its `:authority` and `:path`: admission (routes, rules,
//! access, limits, hooks) and the exchange driver run as for any request. Its attempt
//! writes `GET` with `Upgrade: websocket`, a fresh `Sec-WebSocket-Key` and the client's
//! WebSocket fields, expects `101` with the matching `Sec-WebSocket-Accept`, answers the
//! client `200`, and then relays the stream's DATA and the upstream socket's bytes both
//! ways (hyper's upgrade of the stream), with the listener's `upgrade_idle_timeout`, as the
//! HTTP/1 tunnel does. An upstream that refuses the upgrade has its status passed back.
//!
//! To a group that speaks HTTP/2 the extended CONNECT goes as it is
//! ([`super::websocket_h2`]). Refused: a CONNECT without `:protocol` or with another protocol
//! (501: veloxy is no forward proxy), a WebSocket to a FastCGI route or to a route that
//! answers `2xx` itself (501), and to a file route (400).

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{ConnCtx, Finish, ProxyBody, RequestBody};
use crate::config::UpstreamProtocol;
use crate::deadline::timeout;
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::framed::{End, ResponseBody};
use crate::exchange::h1::{HeadParse, HeadReader};
use crate::exchange::{attempt, framed, Admitted, ProxyTarget};
use crate::worker::Generation;

/// RFC 6455 4.2.2: the GUID the accept value hashes with the key.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Whether a CONNECT stream is a WebSocket's extended CONNECT; any other CONNECT is refused
/// with 501 (veloxy is no forward proxy, and knows no other `:protocol`).
pub(super) fn extended<B>(req: &Request<B>) -> Result<bool, ProxyError> {
    match req.extensions().get::<hyper::ext::Protocol>() {
        // RFC 8441 5: the key and accept fields are not used over HTTP/2; a client's key
        // would go upstream beside veloxy's own.
        Some(_) if req.headers().contains_key("sec-websocket-key") => Err(ProxyError::downstream(
            ErrorKind::BadRequest("Sec-WebSocket-Key over HTTP/2"),
        )),
        Some(p) if p.as_str().eq_ignore_ascii_case("websocket") => Ok(true),
        _ => Err(ProxyError::downstream(ErrorKind::Rejected(501))),
    }
}

/// What admission decided, for a WebSocket: a proxied request loses its cache fill (a
/// tunnel is not stored); veloxy's own answers stay; a file route or a cached object has
/// nothing to tunnel to, and a route answering 2xx itself neither.
pub(super) fn admitted(a: Admitted) -> Result<Admitted, ProxyError> {
    match a {
        Admitted::Proxy(mut t) => {
            if t.search.is_some() || t.fastcgi.is_some() || t.grpc_web.is_some() {
                return Err(ProxyError::downstream(ErrorKind::Rejected(501)));
            }
            t.cache = None;
            t.hit = None;
            Ok(Admitted::Proxy(t))
        }
        // A refusal or a redirect of the route's rules; a success would tell the client its
        // WebSocket is open when nothing is behind it.
        Admitted::Answer(a) if a.status >= 300 => Ok(Admitted::Answer(a)),
        Admitted::Answer(_) => Err(ProxyError::downstream(ErrorKind::Rejected(501))),
        Admitted::Files(_) | Admitted::Cached(_) => Err(ProxyError::downstream(
            ErrorKind::BadRequest("WebSocket to a route without an upstream group"),
        )),
    }
}

/// The upstream's answer to the upgrade request.
struct Switched {
    status: u16,
    head_len: usize,
    /// `Upgrade: websocket` was in the answer.
    upgrade: bool,
    accept: Option<HeaderValue>,
    /// The fields the client gets: Sec-WebSocket-Protocol and -Extensions.
    fields: HeaderMap,
}

/// Reads the upstream's head: 101 (or a refusal) is final; other 1xx are skipped.
struct SwitchReader;

impl HeadReader for SwitchReader {
    type Head = Switched;
    fn parse(&mut self, buf: &[u8]) -> Result<HeadParse<Switched>, ProxyError> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut headers);
        let bad = |_| ProxyError::upstream(ErrorKind::BadResponse("malformed response head"));
        let head_len = match r.parse(buf).map_err(bad)? {
            httparse::Status::Partial => return Ok(HeadParse::Partial),
            httparse::Status::Complete(n) => n,
        };
        let status = r.code.unwrap_or(0);
        if (100..200).contains(&status) && status != 101 {
            return Ok(HeadParse::Interim(head_len));
        }
        let mut s = Switched {
            status,
            head_len,
            upgrade: false,
            accept: None,
            fields: HeaderMap::new(),
        };
        for h in r.headers.iter() {
            let Ok(value) = HeaderValue::from_bytes(h.value) else {
                continue;
            };
            let name = h.name.to_ascii_lowercase();
            match name.as_str() {
                "upgrade" => s.upgrade = h.value.eq_ignore_ascii_case(b"websocket"),
                "sec-websocket-accept" => s.accept = Some(value),
                _ => s
                    .fields
                    .extend(chosen_fields([(name.as_str(), &value)].into_iter())),
            }
        }
        Ok(HeadParse::Final(s))
    }
}

/// A fresh `Sec-WebSocket-Key`: 16 bytes, base64. RFC 6455 asks for a nonce the server
/// only hashes back (it protects nothing secret), so the std library's randomly keyed
/// hasher over a counter and the clock is enough; no random-number crate is needed.
fn new_key() -> String {
    use base64::Engine;
    use std::hash::{BuildHasher, RandomState};
    thread_local!(static N: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });
    let n = N.with(|n| {
        n.set(n.get() + 1);
        n.get()
    });
    let now = std::time::SystemTime::now();
    let a = RandomState::new().hash_one((n, now));
    let b = RandomState::new().hash_one((now, n, a));
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_le_bytes());
    bytes[8..].copy_from_slice(&b.to_le_bytes());
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `Sec-WebSocket-Accept` an upstream must answer `key` with (RFC 6455 4.2.2).
fn accept_for(key: &str) -> String {
    use base64::Engine;
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(key.as_bytes());
    h.update(GUID);
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// Writes the upgrade request: the client's fields as any HTTP/2 request's go to an
/// HTTP/1.1 upstream, then the upgrade itself.
fn write_head(
    c: &ConnCtx,
    gen: &Generation,
    (t, req): (&ProxyTarget, &Request<RequestBody>),
    key: &str,
    fin: &mut Option<Box<Finish>>,
    out: &mut Vec<u8>,
) {
    let host = framed::authority(req.uri(), req.headers());
    let head = crate::exchange::Head {
        method: "GET",
        target: req.uri().path_and_query().map_or("/", |p| p.as_str()),
        host: host.as_bytes(),
        version: c.version,
        fields: crate::exchange::Fields::H2(req.headers()),
    };
    let fallback = gen.snapshot.upstreams[t.upstream].backends[t.backend].authority();
    let options = crate::exchange::h1_head::HeadOptions {
        method: "GET",
        framing: crate::http1::BodyKind::None,
        unconditional: true,
        fallback_host: &fallback,
        client_ip: &c.client_ip,
        proto: if c.tls { "https" } else { "http" },
        keep_underscores: gen.snapshot.settings.underscores_in_headers,
        hook_lines: fin
            .as_deref_mut()
            .and_then(|f| f.record.ctx.as_deref())
            .map(|ctx| ctx.upstream_headers.as_slice()),
    };
    crate::exchange::h1_head::write(&head, t, &options, out);
    out.extend_from_slice(b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: ");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\r\n");
    if !req.headers().contains_key("sec-websocket-version") {
        out.extend_from_slice(b"Sec-WebSocket-Version: 13\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The attempts of a WebSocket stream: the upgrade on a backend of the route's HTTP/1.1
/// group (retried elsewhere only when nothing was sent), then the client's `200` and the
/// tunnel, which runs on its own task and ends the exchange's record when it closes.
pub(super) async fn relay(
    c: &Rc<ConnCtx>,
    gen: &Rc<Generation>,
    t: &ProxyTarget,
    mut req: Request<RequestBody>,
    fin: &mut Option<Box<Finish>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let group = &gen.snapshot.upstreams[t.upstream];
    match group.protocol {
        UpstreamProtocol::Http1 => {}
        UpstreamProtocol::H2 | UpstreamProtocol::H2c => {
            return super::websocket_h2::forward(c, gen, t, req, fin).await
        }
        // Admission refused FastCGI routes already.
        UpstreamProtocol::Fastcgi => return Err(ProxyError::downstream(ErrorKind::Rejected(501))),
    }
    let key = new_key();
    let mut wbuf = Vec::with_capacity(1024);
    write_head(c, gen, (t, &req), &key, fin, &mut wbuf);
    let plan = framed::start_attempts(&**c, gen, t, fin, false).await?;
    let mut last = None;
    let result = attempt::run(&plan, t.backend, &mut last, async |backend, _| {
        let mut ubuf = BytesMut::new();
        let to = t.to(backend);
        let nothing = async |_: &mut crate::upstream::pool::UpstreamConn| Ok(());
        let (conn, head) = crate::exchange::h1::attempt::<ProxyError, _>(
            (&c.worker, gen),
            to,
            &wbuf,
            &mut ubuf,
            nothing,
            &mut SwitchReader,
            // A GET without a body: a pooled connection the backend had closed is replaced
            // by a fresh one, as for the HTTP/1 upgrade.
            true,
        )
        .await?;
        let status = head.status;
        Ok(((conn, head, ubuf), status))
    })
    .await;
    if let (Some(f), Some(b)) = (fin.as_deref_mut(), last) {
        f.record.backend = Some(group.backends[b].addr.clone());
    }
    let (conn, head, mut rest) = result?;
    if head.status != 101 {
        // A refusal is passed back; a success that is no switch would tell the client its
        // WebSocket is open when nothing listens: 502.
        if head.status < 300 {
            return Err(ProxyError::upstream(ErrorKind::BadResponse(
                "WebSocket handshake: the upstream did not switch protocols",
            )));
        }
        return Err(ProxyError::upstream(ErrorKind::UpstreamStatus(head.status)));
    }
    let expected = accept_for(&key);
    if !head.upgrade || head.accept.as_ref().map(|a| a.as_bytes()) != Some(expected.as_bytes()) {
        return Err(ProxyError::upstream(ErrorKind::BadResponse(
            "WebSocket handshake: no upgrade or a wrong Sec-WebSocket-Accept",
        )));
    }
    bytes::Buf::advance(&mut rest, head.head_len);
    let on = hyper::upgrade::on(&mut req);
    let mut fin = fin.take().expect("present until answered");
    fin.set_status(200);
    c.worker.metrics.upgrades.inc();
    let idle = idle_limit(c, gen);
    let worker = c.worker.clone();
    tokio::task::spawn_local(async move {
        if let Ok(upgraded) = on.await {
            let mut down = TokioIo::new(upgraded);
            let mut up = conn;
            let counts = Counts {
                fin: &mut fin,
                worker: &worker,
            };
            tunnel(&mut down, &mut up.stream, rest, idle, counts).await;
        }
        // `fin` drops here: the record (access log, metrics) ends with the tunnel.
        drop(fin);
    });
    Ok(framed::respond(
        http::StatusCode::OK,
        head.fields,
        ResponseBody::Full(None, None),
    ))
}

/// The listener's `upgrade_idle_timeout`.
pub(super) fn idle_limit(c: &ConnCtx, gen: &Generation) -> Duration {
    gen.snapshot
        .listeners
        .iter()
        .find(|l| *l.name == *c.listener.name)
        .map_or(Duration::from_secs(600), |l| l.upgrade_idle_timeout)
}

/// Of an upstream's answer, the fields the client's `200` carries: the protocol and the
/// extensions the upstream chose.
pub(super) fn chosen_fields<'a>(
    fields: impl Iterator<Item = (&'a str, &'a HeaderValue)>,
) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in fields {
        for chosen in [
            http::header::SEC_WEBSOCKET_PROTOCOL,
            http::header::SEC_WEBSOCKET_EXTENSIONS,
        ] {
            if name.eq_ignore_ascii_case(chosen.as_str()) {
                out.append(chosen, value.clone());
            }
        }
    }
    out
}

/// Where a tunnel counts its bytes: sent to the client on the exchange's record, received
/// in the worker's metrics.
pub(super) struct Counts<'a> {
    pub fin: &'a mut Finish,
    pub worker: &'a crate::worker::Worker,
}

/// Relays bytes both ways until both sides have closed, a write fails, or nothing moves for
/// `idle` (every write and shutdown bounded by it too, so a peer that stops reading cannot
/// pin the tunnel). `first`: bytes the upstream sent with its 101, for the client.
pub(super) async fn tunnel<D, U>(
    down: &mut D,
    up: &mut U,
    first: BytesMut,
    idle: Duration,
    n: Counts<'_>,
) where
    D: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    if !first.is_empty() {
        if !matches!(timeout(idle, down.write_all(&first)).await, Ok(Ok(()))) {
            return;
        }
        let _ = timeout(idle, down.flush()).await;
        n.fin.sent(first.len() as u64);
    }
    let mut from_down = vec![0u8; crate::http1::body::READ_CHUNK];
    let mut from_up = vec![0u8; crate::http1::body::READ_CHUNK];
    let (mut down_open, mut up_open) = (true, true);
    while down_open || up_open {
        tokio::select! {
            r = down.read(&mut from_down), if down_open => match r {
                Ok(k) if k > 0 => {
                    n.worker.metrics.bytes_in.add(k as u64);
                    if !matches!(timeout(idle, up.write_all(&from_down[..k])).await, Ok(Ok(()))) {
                        return;
                    }
                }
                _ => {
                    down_open = false;
                    let _ = timeout(idle, up.shutdown()).await;
                }
            },
            r = up.read(&mut from_up), if up_open => match r {
                Ok(k) if k > 0 => {
                    let sent = async {
                        down.write_all(&from_up[..k]).await?;
                        down.flush().await
                    };
                    if !matches!(timeout(idle, sent).await, Ok(Ok(()))) {
                        return;
                    }
                    n.fin.sent(k as u64);
                }
                _ => {
                    up_open = false;
                    let _ = timeout(idle, down.shutdown()).await;
                }
            },
            _ = tokio::time::sleep(idle) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn accept_matches_rfc_6455_example() {
        // RFC 6455 1.3's example key and accept value.
        assert_eq!(
            super::accept_for("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_ne!(super::new_key(), super::new_key());
        assert_eq!(super::new_key().len(), 24);
    }
}
