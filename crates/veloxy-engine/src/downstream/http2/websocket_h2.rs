//! A WebSocket's extended CONNECT (RFC 8441) to a route whose group speaks HTTP/2 (`h2` or
//! `h2c`): forwarded as it is, an extended CONNECT with `:protocol = websocket` on the
//! worker's multiplexed connection to the backend, with the fields any HTTP/2 request
//! forwards (hop-by-hop dropped, X-Forwarded-*, the route's edits and the hooks'). A `2xx`
//! answer is answered `200` to the client with the upstream's chosen protocol and
//! extensions, and the two streams are joined by the tunnel of [`super::websocket`]; any
//! other status is passed back. An upstream that does not offer
//! SETTINGS_ENABLE_CONNECT_PROTOCOL resets the stream: a `502`.

use std::rc::Rc;

use bytes::BytesMut;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use super::websocket::{chosen_fields, idle_limit, tunnel, Counts};
use super::{ConnCtx, Finish, ProxyBody, RequestBody};
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::framed::{End, FramedClient, ResponseBody};
use crate::exchange::h2_head::{upstream_headers, Forwarding};
use crate::exchange::{attempt, framed, Fields, ProxyTarget};
use crate::worker::Generation;

/// Forwards the extended CONNECT `req` to `t`'s HTTP/2 group (see the module doc).
pub(super) async fn forward(
    c: &Rc<ConnCtx>,
    gen: &Rc<Generation>,
    t: &ProxyTarget,
    mut req: Request<RequestBody>,
    fin: &mut Option<Box<Finish>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let host = framed::authority(req.uri(), req.headers()).to_owned();
    let fwd = Forwarding {
        client_ip: &c.client_ip,
        proto: c.proto(),
        host: &host,
        keep_underscores: gen.snapshot.settings.underscores_in_headers,
        edit: t.edit.as_ref(),
    };
    let mut headers = upstream_headers(Fields::H2(req.headers()), &fwd);
    if let Some(ctx) = fin.as_deref_mut().and_then(|f| f.record.ctx.as_deref()) {
        let lines = crate::exchange::edit::lines(&ctx.upstream_headers);
        crate::exchange::edit::append_fields(lines, &mut headers);
    }
    let host = match t.edit.as_ref().and_then(|e| e.host()) {
        Some(h) => h.to_owned(),
        None => host,
    };
    let path = t.path.as_deref().map(str::to_owned).unwrap_or_else(|| {
        let p = req.uri().path_and_query();
        p.map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned())
    });
    let down = hyper::upgrade::on(&mut req);
    let plan = framed::start_attempts(&**c, gen, t, fin, false).await?;
    let mut last = None;
    let result = attempt::run(&plan, t.backend, &mut last, async |backend, _| {
        let make = || {
            let empty = http_body_util::Empty::new().map_err(|never| match never {});
            let target = (host.as_str(), path.as_str());
            let method = http::Method::CONNECT;
            let h = headers.clone();
            let mut r = crate::exchange::h2::upstream_request(
                group,
                backend,
                target,
                method,
                h,
                empty.boxed_unsync(),
            )?;
            let protocol = hyper::ext::Protocol::from_static("websocket");
            r.extensions_mut().insert(protocol);
            Ok(r)
        };
        let (worker, to) = (&c.worker, (t.upstream, backend));
        crate::exchange::h2::attempt_on(worker, gen, to, false, make, plan.trace.as_deref()).await
    })
    .await;
    if let (Some(f), Some(b)) = (fin.as_deref_mut(), last) {
        f.record.backend = Some(group.backends[b].addr.clone());
    }
    let mut resp = result?;
    let status = resp.status().as_u16();
    if !resp.status().is_success() {
        return Err(ProxyError::upstream(ErrorKind::UpstreamStatus(status)));
    }
    let up = hyper::upgrade::on(&mut resp);
    let mut fin = fin.take().expect("present until answered");
    fin.set_status(200);
    c.worker.metrics.upgrades.inc();
    let idle = idle_limit(c, gen);
    let worker = c.worker.clone();
    tokio::task::spawn_local(async move {
        if let (Ok(d), Ok(u)) = tokio::join!(down, up) {
            let (mut d, mut u) = (TokioIo::new(d), TokioIo::new(u));
            let counts = Counts {
                fin: &mut fin,
                worker: &worker,
            };
            tunnel(&mut d, &mut u, BytesMut::new(), idle, counts).await;
        }
        drop(fin);
    });
    let fields = chosen_fields(resp.headers().iter().map(|(n, v)| (n.as_str(), v)));
    Ok(framed::respond(
        http::StatusCode::OK,
        fields,
        ResponseBody::Full(None, None),
    ))
}
