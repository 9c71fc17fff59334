//! An HTTP/2 (or HTTP/3) stream forwarded to an HTTP/2 upstream (`protocol = "h2"` over TLS,
//! or `"h2c"`): what gRPC needs. The attempts are [`crate::exchange::h2`]'s, over one
//! multiplexed connection per backend per worker. Bodies and trailers pass through as frames,
//! in both directions, without buffering; the request body is held to `max_body_bytes` and
//! `body_timeout` on its way ([`crate::exchange::body`]).

use std::rc::Rc;

use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::BodyExt;

use super::request_body::RequestBody;
use super::{ConnCtx, Finish, ProxyBody};
use crate::error::ProxyError;
use crate::exchange::attempt::{self, AttemptFail, Plan};
use crate::exchange::{Fields, ProxyTarget};
use crate::worker::Generation;

/// Forwards the stream: its fields rewritten for the upstream, the route's concurrency slot,
/// the attempts (a failed connect moves to another backend), then the response, streamed.
pub(super) async fn relay(
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

    // The client's body is held to `max_body_bytes` and `body_timeout` as it streams.
    let (body, watch) = crate::exchange::body::guard(
        body,
        t.max_body,
        c.body_timeout(),
        c.worker().metrics.clone(),
    );
    // Nothing is buffered: the slot is taken before the first attempt.
    super::hold_slot(t, fin).await?;
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
        let make = || {
            let (method, uri, headers, body) = pending.take().expect("sent at most once");
            let path = t.path.as_deref();
            let path = path.unwrap_or_else(|| uri.path_and_query().map_or("/", |p| p.as_str()));
            let target = (host.as_str(), path);
            let body = body.boxed_unsync();
            crate::exchange::h2::upstream_request(group, backend, target, method, headers, body)
        };
        let sent =
            crate::exchange::h2::attempt_on(c.worker(), gen, (t.upstream, backend), false, make)
                .await;
        // The client's body broke a limit: its fault, not the backend's.
        sent.map_err(|e| watch.error().map_or(e, AttemptFail::Fatal))
    })
    .await;
    if let (Some(f), Some(b)) = (fin.as_deref_mut(), last) {
        f.record.backend = Some(group.backends[b].addr.clone());
    }
    let result = match (result, watch.take_rest()) {
        (Err(e), Some(rest)) => Err(super::errors::drain_after_413(c, rest, e)),
        (result, _) => result,
    };
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
