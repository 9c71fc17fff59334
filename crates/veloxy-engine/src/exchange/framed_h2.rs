//! A framed client's request (an HTTP/2 or HTTP/3 stream) forwarded to an HTTP/2 upstream (`protocol = "h2"` over TLS,
//! or `"h2c"`): what gRPC needs. The attempts are [`crate::exchange::h2`]'s, over one
//! multiplexed connection per backend per worker. Bodies and trailers pass through as frames,
//! in both directions, without buffering; the request body is held to `max_body_bytes` and
//! `body_timeout` on its way ([`crate::exchange::body`]).

use std::rc::Rc;

use http::{Request, Response};
use http_body_util::BodyExt;

use super::framed::{End, FramedClient, ResponseBody};
use crate::error::ProxyError;
use crate::exchange::attempt::{self, AttemptFail};
use crate::exchange::h2_head::{upstream_headers, Forwarding};
use crate::exchange::{Fields, ProxyTarget};
use crate::worker::Generation;

/// Forwards the stream: its fields rewritten for the upstream, the route's concurrency slot,
/// the attempts (a failed connect moves to another backend), then the response, streamed.
pub(crate) async fn relay<C: FramedClient>(
    c: &C,
    gen: &Rc<Generation>,
    t: &ProxyTarget,
    req: Request<C::Body>,
    fin: &mut Option<Box<C::End>>,
) -> Result<Response<ResponseBody<C::End>>, ProxyError> {
    let group = &gen.snapshot.upstreams[t.upstream];
    let (parts, body) = req.into_parts();
    let is_head = parts.method == http::Method::HEAD;
    let host = super::framed::authority(&parts.uri, &parts.headers).to_owned();

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
    if let Some(ctx) = fin.as_deref_mut().and_then(|f| f.record().ctx.as_deref()) {
        super::edit::append_fields(super::edit::lines(&ctx.upstream_headers), &mut headers);
    }
    if let Some(web) = t.grpc_web {
        super::grpc_web::request_headers(&mut headers, web);
    }

    // The client's body is held to `max_body_bytes` and `body_timeout` as it streams.
    let wait = super::framed::body_wait(c, &body);
    let (body, watch) =
        crate::exchange::body::guard(body, t.max_body, wait, c.worker().metrics.clone());
    // Nothing is buffered: the slot is taken before the first attempt. Nothing is sent
    // before a backend has a live connection, so a failed connect moves on to another
    // backend whatever the method; once sent, the request is not retried (its body streams
    // through and cannot be replayed).
    let plan = super::framed::start_attempts(c, gen, t, fin, false).await?;
    let mut pending = Some((parts.method, parts.uri, headers, body));
    let mut last = None;
    let result = attempt::run(&plan, t.backend, &mut last, async |backend, _| {
        let make = || {
            let (method, uri, mut headers, body) = pending.take().expect("sent at most once");
            if let Some(tr) = &plan.trace {
                super::trace::set_traceparent(tr, &mut headers);
            }
            let path = t.path.as_deref();
            let path = path.unwrap_or_else(|| uri.path_and_query().map_or("/", |p| p.as_str()));
            let target = (host.as_str(), path);
            let body = match t.grpc_web {
                // A grpc-web-text body is decoded as it streams.
                Some(w) if w.text => {
                    super::grpc_web::DecodeText::new(body.boxed_unsync()).boxed_unsync()
                }
                _ => body.boxed_unsync(),
            };
            crate::exchange::h2::upstream_request(group, backend, target, method, headers, body)
        };
        let (to, trace) = ((t.upstream, backend), plan.trace.as_deref());
        let sent = crate::exchange::h2::attempt_on(c.worker(), gen, to, false, make, trace).await;
        // The client's body broke a limit: its fault, not the backend's.
        sent.map_err(|e| watch.error().map_or(e, AttemptFail::Fatal))
    })
    .await;
    if let (Some(f), Some(b)) = (fin.as_deref_mut(), last) {
        f.record().backend = Some(group.backends[b].addr.clone());
    }
    let result = match (result, watch.take_rest()) {
        (Err(e), Some(rest)) => Err(c.drain(rest, e)),
        (result, _) => result,
    };
    let resp = result?;
    let status = resp.status().as_u16();
    if let Some(page) = super::framed::upstream_error_page(c.worker(), status, is_head, fin) {
        return Ok(page);
    }
    let (mut rparts, rbody) = resp.into_parts();
    let mut fin = fin.take().expect("present until success");
    fin.set_status(status);
    // gRPC-Web: the fields first, so that the route's rules see (and may change) them.
    let web = t
        .grpc_web
        .map(|w| super::grpc_web::Encode::head(w, &mut rparts.headers));
    crate::exchange::invalidate_map(fin.record(), status, &rparts.headers);
    if let Some(view) = crate::exchange::on_response(c.worker(), fin.record(), status) {
        view.apply_map(&mut rparts.headers);
    }
    let body = match web {
        Some(web) => ResponseBody::GrpcWeb(Box::new(web.body(rbody)), Some(fin)),
        None => ResponseBody::H2(rbody, Some(fin)),
    };
    Ok(super::framed::respond(rparts.status, rparts.headers, body))
}
