//! The HTTP/1.1 calls veloxy makes to search nodes itself: the discovery thread's reads of
//! `_nodes/http` and the cluster state, and the parts of a split `_bulk`.
//!
//! hyper-util's pooled client (keep-alive per node), one per thread: each worker's runtime
//! owns its connections, so no pool is shared across threads.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

type Http = Client<HttpConnector, Full<Bytes>>;

thread_local! {
    static CLIENT: Http = {
        let mut c = HttpConnector::new();
        c.set_nodelay(true);
        c.set_connect_timeout(Some(Duration::from_secs(2)));
        Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .build(c)
    };
}

/// A node's answer, read whole.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub content_type: Option<Bytes>,
    pub body: Bytes,
}

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    #[error("{0}: no answer within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("{0}: {1}")]
    Failed(SocketAddr, String),
}

/// One request to the node at `addr`; the answer's body is read up to `limit` bytes, all
/// within `timeout`.
pub(crate) async fn call(
    method: &str,
    addr: SocketAddr,
    target: &str,
    fields: &[(&str, &[u8])],
    body: Bytes,
    timeout: Duration,
    limit: usize,
) -> Result<Reply, CallError> {
    let failed = |e: &dyn std::fmt::Display| CallError::Failed(addr, e.to_string());
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{target}"));
    for (name, value) in fields {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body)).map_err(|e| failed(&e))?;
    let client = CLIENT.with(Clone::clone);
    let work = async {
        let resp = client.request(req).await.map_err(|e| failed(&e))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| Bytes::copy_from_slice(v.as_bytes()));
        let body = Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| failed(&*e))?
            .to_bytes();
        Ok(Reply {
            status,
            content_type,
            body,
        })
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| CallError::Timeout(addr, timeout))?
}

/// A GET whose 2xx JSON answer is parsed.
pub(crate) async fn get_json(
    addr: SocketAddr,
    target: &str,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let r = call("GET", addr, target, &[], Bytes::new(), timeout, 64 << 20)
        .await
        .map_err(|e| e.to_string())?;
    if !(200..300).contains(&r.status) {
        return Err(format!("{addr}{target}: status {}", r.status));
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("{addr}{target}: {e}"))
}
