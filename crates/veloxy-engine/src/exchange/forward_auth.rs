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

/// What the auth service said.
pub(crate) enum Outcome {
    /// Pass, with these fields ("Name: value\r\n" lines) for the upstream request.
    Pass(Vec<u8>),
    /// Its answer, for the client.
    Deny(Answer),
}

impl AuthRequest {
    /// Renders the subrequest for `head` from the client at `client_ip`.
    pub(crate) fn new(rule: &ForwardAuth, head: &Head, peer: &Peer, client_ip: &str) -> Self {
        let mut h = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nX-Forwarded-Method: {}\r\nX-Forwarded-Proto: {}\r\n\
             X-Forwarded-Host: {}\r\nX-Forwarded-Uri: {}\r\nX-Forwarded-For: {}\r\n",
            rule.path,
            rule.host,
            head.method,
            if peer.tls { "https" } else { "http" },
            String::from_utf8_lossy(head.host),
            head.target,
            client_ip
        )
        .into_bytes();
        for name in ["cookie", "authorization"] {
            if let Some(v) = head.fields.get(name) {
                h.extend_from_slice(name.as_bytes());
                h.extend_from_slice(b": ");
                h.extend_from_slice(v);
                h.extend_from_slice(b"\r\n");
            }
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
fn complete(buf: &[u8]) -> bool {
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
