//! The fields of a request forwarded to an HTTP/2 upstream, written once for every client
//! protocol: [`upstream_headers`] (the hop-by-hop filter and X-Forwarded-*) for HTTP/2 and
//! HTTP/3 streams, and [`H2Head`], the whole HTTP/2 head built at admission from a parsed
//! HTTP/1 request.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, Full};

use crate::config::UpstreamProtocol;
use crate::error::{ErrorKind, ProxyError};
use crate::exchange::Fields;

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

/// The HTTP/2 request head for an HTTP/1 request, built from the parsed request (no HTTP/1
/// head is written and parsed back): `:authority` from Host (the backend's address when the
/// client sent none), the fields filtered and X-Forwarded-* set as for HTTP/2 clients, and
/// the hooks' fields.
pub(crate) struct H2Head {
    method: http::Method,
    /// `:authority` ("": the address of the backend the attempt goes to).
    authority: String,
    /// The request target sent upstream.
    path: String,
    headers: http::HeaderMap,
}

impl H2Head {
    /// Adds "Name: value\r\n" lines (forward_auth's copied fields).
    pub(crate) fn add_lines(&mut self, lines: &[u8]) {
        crate::exchange::edit::append_fields(
            crate::exchange::edit::lines(lines),
            &mut self.headers,
        );
    }

    /// A gRPC-Web request: its fields become a gRPC request's
    /// ([`crate::exchange::grpc_web::request_headers`]).
    pub(crate) fn grpc_web(&mut self, web: crate::exchange::grpc_web::Web) {
        crate::exchange::grpc_web::request_headers(&mut self.headers, web);
    }

    pub(crate) fn build(
        req: &crate::http1::request::RequestView,
        path: &str,
        fwd: &Forwarding,
        group: &crate::config::UpstreamGroup,
        backend: usize,
        hook_lines: Option<&[u8]>,
    ) -> Result<H2Head, ProxyError> {
        let bad =
            || ProxyError::downstream(ErrorKind::BadRequest("request not expressible in HTTP/2"));
        let method = http::Method::from_bytes(req.method.as_bytes()).map_err(|_| bad())?;
        let authority = match fwd.edit.and_then(|e| e.host()) {
            Some(h) => h,
            None => fwd.host,
        };
        // Checked once here, so that no attempt fails on it.
        let scheme = if group.protocol == UpstreamProtocol::H2 {
            "https"
        } else {
            "http"
        };
        let addr = group.backends[backend].addr.to_string();
        let shown = if authority.is_empty() {
            &addr
        } else {
            authority
        };
        format!("{scheme}://{shown}{path}")
            .parse::<http::Uri>()
            .map_err(|_| bad())?;
        let fields = crate::exchange::Fields::H1(req.headers);
        let mut headers = upstream_headers(fields, fwd);
        if let Some(lines) = hook_lines {
            crate::exchange::edit::append_fields(crate::exchange::edit::lines(lines), &mut headers);
        }
        Ok(H2Head {
            method,
            authority: authority.to_owned(),
            path: path.to_owned(),
            headers,
        })
    }

    /// The HTTP/2 request for an attempt on `backend`: the head and the buffered body.
    pub(crate) fn request(
        &self,
        group: &crate::config::UpstreamGroup,
        backend: usize,
        body: Bytes,
    ) -> Result<http::Request<crate::upstream::H2Body>, ProxyError> {
        let body = Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync();
        crate::exchange::h2::upstream_request(
            group,
            backend,
            (&self.authority, &self.path),
            self.method.clone(),
            self.headers.clone(),
            body,
        )
    }
}
