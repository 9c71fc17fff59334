//! `forward_auth`: before a request goes anywhere, a GET to an auth service (Authelia,
//! Authentik, oauth2-proxy) with the original method, URI, host and client address. A 2xx lets
//! the request pass with the listed fields copied onto it; any other answer (a redirect to a
//! login page, a 401) goes to the client as it is; the auth service being down or too slow is
//! a 503, never a pass.
//!
//! The subrequest is a plain HTTP/1.1 exchange on a fresh connection (`Connection: close`),
//! bounded by the rule's `timeout` and by [`MAX_RESPONSE`]: auth answers are small.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Answer, Head, Peer};
use crate::error::{ErrorKind, ProxyError};
use crate::rules::ForwardAuth;
use crate::upstream::balancer::PickContext;
use crate::worker::{Generation, Worker};

/// The largest auth answer read (head and body).
const MAX_RESPONSE: usize = 64 * 1024;

/// The subrequest of one request, rendered at admission.
#[derive(Clone)]
pub(crate) struct AuthRequest {
    upstream: usize,
    timeout: Duration,
    copy: std::sync::Arc<[String]>,
    head: Vec<u8>,
}

/// Whether the client's field `name` goes to the auth service: named by `send_headers`
/// (every field with `"all"`), not by `remove_headers`, and not one veloxy writes itself
/// (Host, X-Forwarded-*, X-Forwarded-Method and -Uri) or a hop-by-hop or framing field.
fn sent(rule: &ForwardAuth, name: &str) -> bool {
    use crate::http1::{classify, Special};
    let own = name.len() > 12 && name.as_bytes()[..12].eq_ignore_ascii_case(b"x-forwarded-");
    matches!(classify(name), Special::None)
        && !own
        && !rule.remove_headers.iter().any(|p| p.matches(name))
        && rule
            .send_headers
            .as_ref()
            .is_none_or(|names| names.iter().any(|p| p.matches(name)))
}

/// What the auth service said.
pub(crate) enum Outcome {
    /// Pass, with these fields ("Name: value\r\n" lines) for the upstream request.
    Pass(Vec<u8>),
    /// Its answer, for the client.
    Deny(Answer),
}

impl AuthRequest {
    /// Renders the subrequest for `head` from the client at `client_ip`: veloxy's
    /// X-Forwarded-* (the client's own with `trust_forward_header`, its For chain extended),
    /// then the client's fields that `send_headers` names (hop-by-hop ones and those
    /// `remove_headers` names never).
    pub(crate) fn new(rule: &ForwardAuth, head: &Head, peer: &Peer, client_ip: &str) -> Self {
        let trusted = |name: &str| {
            let v = head
                .fields
                .get(name)
                .filter(|_| rule.trust_forward_header)?;
            let v = v.trim_ascii();
            (!v.is_empty() && !rule.remove_headers.iter().any(|p| p.matches(name)))
                .then(|| String::from_utf8_lossy(v).into_owned())
        };
        let proto = if peer.tls { "https" } else { "http" };
        let xff = match trusted("x-forwarded-for") {
            Some(chain) => format!("{chain}, {client_ip}"),
            None => client_ip.to_owned(),
        };
        let mut h = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nX-Forwarded-Method: {}\r\nX-Forwarded-Proto: {}\r\n\
             X-Forwarded-Host: {}\r\nX-Forwarded-Uri: {}\r\nX-Forwarded-For: {}\r\n",
            rule.path,
            rule.host,
            trusted("x-forwarded-method").unwrap_or_else(|| head.method.to_owned()),
            trusted("x-forwarded-proto").unwrap_or_else(|| proto.to_owned()),
            trusted("x-forwarded-host")
                .unwrap_or_else(|| String::from_utf8_lossy(head.host).into_owned()),
            trusted("x-forwarded-uri").unwrap_or_else(|| head.target.to_owned()),
            xff
        )
        .into_bytes();
        // HTTP/2 clients may split Cookie into several fields: the auth service gets one.
        let mut cookie: Vec<u8> = Vec::new();
        for (name, value) in head.fields.iter() {
            if !sent(rule, name) {
                continue;
            }
            if name.eq_ignore_ascii_case("cookie") {
                if !cookie.is_empty() {
                    cookie.extend_from_slice(b"; ");
                }
                cookie.extend_from_slice(value);
                continue;
            }
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(b": ");
            h.extend_from_slice(value);
            h.extend_from_slice(b"\r\n");
        }
        if !cookie.is_empty() {
            h.extend_from_slice(b"Cookie: ");
            h.extend_from_slice(&cookie);
            h.extend_from_slice(b"\r\n");
        }
        h.extend_from_slice(b"Connection: close\r\n\r\n");
        AuthRequest {
            upstream: rule.upstream,
            timeout: rule.timeout,
            copy: rule.copy_headers.clone(),
            head: h,
        }
    }

    /// Asks the auth service.
    pub(crate) async fn run(
        &self,
        worker: &Worker,
        gen: &Generation,
    ) -> Result<Outcome, ProxyError> {
        let down = |why| ProxyError::upstream(ErrorKind::AuthUnavailable(why));
        let group = &gen.snapshot.upstreams[self.upstream];
        let backend = gen
            .group(self.upstream)
            .pick(&PickContext {
                client: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
                excluded: group.health.down_set(),
                hash: 0,
            })
            .ok_or_else(|| down("forward_auth: no auth server is up"))?;
        let exchange = async {
            let mut conn =
                crate::upstream::connect::connect_backend(&*worker.metrics, group, backend, None)
                    .await
                    .map_err(|_| down("forward_auth: cannot connect to the auth service"))?;
            conn.stream
                .write_all(&self.head)
                .await
                .map_err(|_| down("forward_auth: the auth service closed the connection"))?;
            let mut buf = Vec::with_capacity(4096);
            loop {
                let n = (&mut conn.stream)
                    .take((MAX_RESPONSE - buf.len()) as u64)
                    .read_buf(&mut buf)
                    .await
                    .map_err(|_| down("forward_auth: the auth service closed the connection"))?;
                if n == 0 || buf.len() >= MAX_RESPONSE {
                    break;
                }
                if complete(&buf) {
                    break;
                }
            }
            Ok::<_, ProxyError>(buf)
        };
        let buf = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                down("forward_auth: the auth service did not answer within its timeout")
            })??;
        self.judge(&buf)
            .ok_or_else(|| down("forward_auth: the auth service's answer is not HTTP"))
    }

    /// Pass or deny from the auth service's raw answer; `None`: not an HTTP answer.
    fn judge(&self, buf: &[u8]) -> Option<Outcome> {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut res = httparse::Response::new(&mut fields);
        let httparse::Status::Complete(len) = res.parse(buf).ok()? else {
            return None;
        };
        let status = res.code?;
        if (200..300).contains(&status) {
            let mut lines = Vec::new();
            for h in res.headers.iter() {
                if self.copy.iter().any(|c| c.eq_ignore_ascii_case(h.name)) {
                    lines.extend_from_slice(h.name.as_bytes());
                    lines.extend_from_slice(b": ");
                    lines.extend_from_slice(h.value);
                    lines.extend_from_slice(b"\r\n");
                }
            }
            return Some(Outcome::Pass(lines));
        }
        let chunked = res
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
        let mut headers = Vec::new();
        for h in res.headers.iter() {
            let name = h.name.to_ascii_lowercase();
            if crate::http1::classify(&name) != crate::http1::Special::None {
                continue;
            }
            if let Some(n) = KEPT.iter().find(|k| **k == name) {
                headers.push((*n, Bytes::copy_from_slice(h.value)));
            }
        }
        // A chunked body is not decoded here: the answer goes with its status and fields.
        let body = if chunked {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(&buf[len..])
        };
        Some(Outcome::Deny(Answer {
            status,
            headers,
            body,
        }))
    }
}

/// The fields of an auth service's refusal passed to the client.
const KEPT: &[&str] = &[
    "location",
    "www-authenticate",
    "set-cookie",
    "content-type",
    "cache-control",
    "retry-after",
];

/// The answer is complete: its head, and a body of its Content-Length.
pub(super) fn complete(buf: &[u8]) -> bool {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut res = httparse::Response::new(&mut fields);
    let Ok(httparse::Status::Complete(len)) = res.parse(buf) else {
        return false;
    };
    let length = res
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    length.is_some_and(|n| buf.len() >= len + n)
}
