//! An HTTP/2 stream forwarded to an HTTP/2 upstream (`protocol = "h2"` over TLS, or `"h2c"`):
//! what gRPC needs. Each worker keeps one multiplexed connection per backend (hyper's client,
//! driven by a task on the worker's thread). Bodies and trailers pass through as frames, in
//! both directions, without buffering.

use std::rc::Rc;

use http::{HeaderMap, HeaderValue, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::time::{timeout, Instant};

use super::request_body::RequestBody;
use super::{ConnCtx, Finish, LocalExec, ProxyBody};
use crate::config::UpstreamProtocol;
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::attempt::{self, AttemptFail, Plan};
use crate::exchange::{Fields, ProxyTarget};
use crate::upstream::connect::connect_backend;
use crate::upstream::H2Sender;
use crate::worker::Generation;

fn up(kind: ErrorKind) -> ProxyError {
    ProxyError::upstream(kind)
}

pub(super) async fn forward(
    c: &Rc<ConnCtx>,
    gen: &Rc<Generation>,
    t: &ProxyTarget,
    req: Request<RequestBody>,
    fin: &mut Option<Box<Finish>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let (parts, body) = req.into_parts();
    let is_head = parts.method == http::Method::HEAD;
    let host = super::authority_of(&parts).to_owned();

    let fwd = Forwarding {
        client_ip: c.client_ip(),
        proto: c.proto(),
        host: &host,
        keep_underscores: gen.snapshot.settings.underscores_in_headers,
        edit: t.edit.as_ref(),
    };
    let mut headers = upstream_headers(Fields::H2(&parts.headers), &fwd);
    // A Host the rules set is the upstream's `:authority`.
    let host = match t.edit.as_ref().and_then(|e| e.host()) {
        Some(h) => h.to_owned(),
        None => host,
    };
    if let Some(ctx) = fin.as_ref().and_then(|f| f.record.ctx.as_deref()) {
        super::add_hook_headers(&ctx.upstream_headers, &mut headers);
    }

    // Nothing is sent before a backend has a live connection, so a failed connect moves on
    // to another backend whatever the method; once sent, the request is not retried (its
    // body streams through and cannot be replayed).
    let plan = Plan {
        worker: c.worker(),
        gen,
        upstream: t.upstream,
        client: c.peer,
        hash: t.hash,
        replayable: false,
    };
    let mut pending = Some((parts.method, parts.uri, headers, body));
    let mut last = None;
    let result = attempt::run(&plan, t.backend, &mut last, async |backend, _| {
        let sender = sender_for(c.worker(), gen, t.upstream, backend)
            .await
            .map_err(|(error, health)| AttemptFail::NotSent { error, health })?;
        let (method, uri, headers, body) = pending.take().expect("sent at most once");
        let path = t.path.as_deref();
        let req = upstream_request(group, backend, &host, method, (&uri, path), headers, body)
            .map_err(AttemptFail::Fatal)?;
        let t0 = Instant::now();
        let sent = timeout(
            group.read_timeout,
            send_with_one_reconnect(c, gen, t, backend, sender, req),
        )
        .await;
        let failed = match sent {
            Ok(Ok(r)) => {
                c.worker().metrics.upstream_duration.observe(t0.elapsed());
                let status = r.status().as_u16();
                return Ok((r, status));
            }
            Ok(Err(e)) => e,
            Err(_) => up(ErrorKind::ReadTimeout),
        };
        // Maybe a connection that died silently: the next request opens a fresh one.
        gen.groups.borrow_mut()[t.upstream].h2[backend] = None;
        Err(AttemptFail::Fatal(failed))
    })
    .await;
    if let (Some(f), Some(b)) = (fin.as_deref_mut(), last) {
        f.record.backend = Some(group.backends[b].addr.clone());
    }
    let resp = result?;
    let status = resp.status().as_u16();
    if let Some(page) = super::files::upstream_error_page(c.worker(), status, is_head, fin) {
        return Ok(page);
    }
    let (mut rparts, rbody) = resp.into_parts();
    let mut fin = fin.take().expect("present until success");
    fin.status = status;
    if let Some(view) = crate::exchange::on_response(c.worker(), &mut fin.record, status) {
        view.apply_map(&mut rparts.headers);
    }
    let mut out = Response::new(ProxyBody::H2(rbody, Some(fin)));
    *out.status_mut() = rparts.status;
    *out.headers_mut() = rparts.headers;
    Ok(out)
}

/// What the forwarded fields say about the client.
pub(crate) struct Forwarding<'a> {
    pub client_ip: &'a str,
    /// "http" or "https": the client's scheme.
    pub proto: &'static str,
    /// The client's Host / `:authority` ("" when it sent none).
    pub host: &'a str,
    pub keep_underscores: bool,
    /// The route's `request_headers` and the request ID.
    pub edit: Option<&'a crate::exchange::edit::UpstreamEdit>,
}

/// The fields of a request forwarded to an HTTP/2 upstream, from an HTTP/1 or an HTTP/2
/// client alike: the one hop-by-hop list ([`crate::http1::classify`]) and any field a
/// Connection header names are dropped (`te: trailers` is kept: gRPC needs it), so are
/// names with `_` unless kept; X-Forwarded-For, -Proto and -Host are set.
pub(crate) fn upstream_headers(fields: Fields, fwd: &Forwarding) -> HeaderMap {
    use crate::http1::{classify, has_token, Special};
    let connection: Vec<&[u8]> = fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .map(|(_, v)| v)
        .collect();
    let mut headers = HeaderMap::new();
    let mut xff = Vec::new();
    for (name, value) in fields.iter() {
        match classify(name) {
            Special::XForwardedFor => {
                let v = value.trim_ascii();
                if !v.is_empty() {
                    xff.extend_from_slice(v);
                    xff.extend_from_slice(b", ");
                }
                continue;
            }
            Special::HopByHop if name.eq_ignore_ascii_case("te") => {
                if !value.eq_ignore_ascii_case(b"trailers") {
                    continue;
                }
            }
            Special::None => {}
            _ => continue,
        }
        let underscore = !fwd.keep_underscores && name.contains('_');
        if underscore || connection.iter().any(|c| has_token(c, name)) {
            continue;
        }
        if fwd.edit.is_some_and(|e| e.drops(name)) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    xff.extend_from_slice(fwd.client_ip.as_bytes());
    let dropped = |name: &str| fwd.edit.is_some_and(|e| e.drops(name));
    if let Ok(v) = HeaderValue::from_bytes(&xff) {
        if !dropped("x-forwarded-for") {
            headers.insert("x-forwarded-for", v);
        }
    }
    if !dropped("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static(fwd.proto));
    }
    if let Ok(v) = HeaderValue::from_str(fwd.host) {
        if !fwd.host.is_empty() && !dropped("x-forwarded-host") {
            headers.insert("x-forwarded-host", v);
        }
    }
    if let Some(e) = fwd.edit {
        // The Host the rules set goes as `:authority` (the caller's URI).
        let fields = e
            .added()
            .into_iter()
            .flat_map(crate::exchange::edit::lines)
            .filter(|(n, _)| !n.eq_ignore_ascii_case(b"host"));
        crate::exchange::edit::append_fields(fields, &mut headers);
    }
    headers
}

/// The upstream request: the client's, with the group's scheme and the client's authority
/// (the backend's address when the client sent none).
fn upstream_request(
    group: &crate::config::UpstreamGroup,
    backend: usize,
    host: &str,
    method: http::Method,
    (uri, target): (&Uri, Option<&str>),
    headers: HeaderMap,
    body: RequestBody,
) -> Result<Request<crate::upstream::H2Body>, ProxyError> {
    let scheme = if group.protocol == UpstreamProtocol::H2 {
        "https"
    } else {
        "http"
    };
    let addr = group.backends[backend].addr.to_string();
    let authority = if host.is_empty() { &addr } else { host };
    let path = target.unwrap_or_else(|| uri.path_and_query().map_or("/", |p| p.as_str()));
    let uri: Uri = format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|_| ProxyError::downstream(ErrorKind::BadRequest("invalid request target")))?;
    let mut req = Request::new(body.boxed_unsync());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Ok(req)
}

/// Sends on the cached connection; when the request never left (the connection was closing:
/// GOAWAY, a refused stream, a dead connection), it is sent once more on a fresh connection.
async fn send_with_one_reconnect(
    c: &ConnCtx,
    gen: &Generation,
    t: &ProxyTarget,
    backend: usize,
    mut sender: H2Sender,
    req: Request<crate::upstream::H2Body>,
) -> Result<Response<Incoming>, ProxyError> {
    let io_err = |e: hyper::Error| super::hyper_error(true, &e);
    match sender.try_send_request(req).await {
        Ok(r) => Ok(r),
        Err(mut e) => {
            let Some(req) = e.take_message() else {
                return Err(io_err(e.into_error()));
            };
            gen.groups.borrow_mut()[t.upstream].h2[backend] = None;
            let mut fresh = sender_for(c.worker(), gen, t.upstream, backend)
                .await
                .map_err(|(e, _)| e)?;
            fresh.send_request(req).await.map_err(io_err)
        }
    }
}

/// The worker's connection to `backend`, opened (TCP, TLS, HTTP/2 handshake) if there is
/// none or it has closed.
pub(crate) async fn sender_for(
    worker: &crate::worker::Worker,
    gen: &Generation,
    upstream: usize,
    backend: usize,
) -> Result<H2Sender, (ProxyError, bool)> {
    if let Some(s) = gen.groups.borrow()[upstream].h2[backend].as_ref() {
        if !s.is_closed() && s.is_ready() {
            return Ok(s.clone());
        }
    }
    let group = &gen.snapshot.upstreams[upstream];
    // HTTP/2 groups never send PROXY headers (one connection carries every client).
    let conn = connect_backend(&worker.metrics, group, backend, None).await?;
    let mut builder = hyper::client::conn::http2::Builder::new(LocalExec);
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(super::STREAM_WINDOW)
        .initial_connection_window_size(super::CONNECTION_WINDOW)
        // Pings find a connection that died silently (NAT or conntrack expiry) before a
        // request waits on it.
        .keep_alive_interval(std::time::Duration::from_secs(30))
        .keep_alive_timeout(std::time::Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let (sender, connection) =
        match timeout(group.connect_timeout, builder.handshake(TokioIo::new(conn))).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err((super::hyper_error(true, &e), true)),
            Err(_) => return Err((up(ErrorKind::ConnectTimeout), true)),
        };
    let addr = group.backends[backend].addr.clone();
    tokio::task::spawn_local(async move {
        if let Err(e) = connection.await {
            tracing::debug!(backend = %addr, error = %e, "HTTP/2 upstream connection ended");
        }
    });
    gen.groups.borrow_mut()[upstream].h2[backend] = Some(sender.clone());
    Ok(sender)
}
