//! An HTTP/2 client (the `h2` crate) over TLS or h2c prior knowledge, driven from a
//! current-thread tokio runtime.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use rustls::pki_types::ServerName;

/// A current-thread tokio runtime with I/O and timers, for the async clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An HTTP/2 response, fully read.
#[derive(Debug)]
pub struct H2Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub trailers: Option<http::HeaderMap>,
}

impl H2Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// An HTTP/2 connection (TLS when `tls` is given, else h2c prior knowledge).
pub async fn h2_connect(
    addr: SocketAddr,
    tls: Option<(Arc<rustls::ClientConfig>, &str)>,
) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    match tls {
        Some((config, sni)) => {
            let connector = tokio_rustls::TlsConnector::from(config);
            let name = ServerName::try_from(sni.to_string()).unwrap();
            let io = connector.connect(name, tcp).await.unwrap();
            assert_eq!(
                io.get_ref().1.alpn_protocol(),
                Some(&b"h2"[..]),
                "ALPN chose h2"
            );
            let (client, conn) = h2::client::handshake(io).await.unwrap();
            tokio::spawn(async move {
                let _ = conn.await;
            });
            client
        }
        None => {
            let (client, conn) = h2::client::handshake(tcp).await.unwrap();
            tokio::spawn(async move {
                let _ = conn.await;
            });
            client
        }
    }
}

/// Sends one request with an optional body and reads the whole response.
pub async fn h2_send(
    client: &mut h2::client::SendRequest<Bytes>,
    req: http::Request<()>,
    body: Option<Bytes>,
) -> Result<H2Reply, h2::Error> {
    let mut c = client.clone().ready().await?;
    let end = body.is_none();
    let (resp, mut stream) = c.send_request(req, end)?;
    if let Some(b) = body {
        stream.send_data(b, true)?;
    }
    let resp = resp.await?;
    let (parts, mut recv) = resp.into_parts();
    let mut body = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk?;
        body.extend_from_slice(&chunk);
        let _ = recv.flow_control().release_capacity(chunk.len());
    }
    let trailers = recv.trailers().await?;
    Ok(H2Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: Bytes::from(body),
        trailers,
    })
}

/// A GET request for `path` on `authority` (scheme https when `tls`).
pub fn h2_get(authority: &str, path: &str, tls: bool) -> http::Request<()> {
    let scheme = if tls { "https" } else { "http" };
    http::Request::builder()
        .uri(format!("{scheme}://{authority}{path}"))
        .body(())
        .unwrap()
}
