//! An HTTP/3 client (the h3 crate over quinn), for the HTTP/3 tests.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::{Buf, Bytes};

use crate::H2Reply;

/// An HTTP/3 connection to `addr` with SNI `sni`, trusting only the CA file `ca`.
pub async fn h3_connect(
    addr: SocketAddr,
    sni: &str,
    ca: &Path,
) -> Result<h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>, String> {
    let tls = crate::client_config(ca, &[b"h3"], &[&rustls::version::TLS13]);
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(
        rustls::ClientConfig::clone(&tls),
    ))
    .map_err(|e| e.to_string())?;
    let mut endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).map_err(|e| e.to_string())?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let conn = endpoint
        .connect(addr, sni)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        drop(endpoint);
    });
    Ok(send)
}

/// Sends `req` (with `body`, if any) and reads the whole answer.
pub async fn h3_send(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    req: http::Request<()>,
    body: Option<Bytes>,
) -> Result<H2Reply, String> {
    let mut stream = send.send_request(req).await.map_err(|e| e.to_string())?;
    if let Some(b) = body {
        stream.send_data(b).await.map_err(|e| e.to_string())?;
    }
    stream.finish().await.map_err(|e| e.to_string())?;
    let resp = stream.recv_response().await.map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
        body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    let trailers = stream.recv_trailers().await.map_err(|e| e.to_string())?;
    Ok(H2Reply {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: body.into(),
        trailers,
    })
}

/// A GET of `https://{authority}{path}`.
pub fn h3_get(authority: &str, path: &str) -> http::Request<()> {
    http::Request::get(format!("https://{authority}{path}"))
        .body(())
        .unwrap()
}

/// An HTTP/3 client that keeps its TLS session tickets across connections, for 0-RTT.
pub struct H3Client {
    endpoint: quinn::Endpoint,
}

/// A connection of an [`H3Client`], and whether its requests went out in 0-RTT data.
pub struct H3Conn {
    pub send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    /// `Some` when the connection was opened with 0-RTT: resolves, once the handshake is
    /// complete, to whether the server accepted the early data.
    pub zero_rtt: Option<quinn::ZeroRttAccepted>,
}

impl H3Client {
    /// A client trusting only the CA file `ca`, with early data enabled.
    pub fn new(ca: &Path) -> Result<H3Client, String> {
        let mut tls = rustls::ClientConfig::clone(&crate::client_config(
            ca,
            &[b"h3"],
            &[&rustls::version::TLS13],
        ));
        tls.enable_early_data = true;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls))
            .map_err(|e| e.to_string())?;
        let mut endpoint =
            quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).map_err(|e| e.to_string())?;
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        Ok(H3Client { endpoint })
    }

    /// Connects; with a ticket from an earlier connection, requests are sent in 0-RTT data
    /// before the handshake completes.
    pub async fn connect(&self, addr: SocketAddr, sni: &str) -> Result<H3Conn, String> {
        let connecting = self
            .endpoint
            .connect(addr, sni)
            .map_err(|e| e.to_string())?;
        let (conn, zero_rtt) = match connecting.into_0rtt() {
            Ok((conn, accepted)) => (conn, Some(accepted)),
            Err(connecting) => (connecting.await.map_err(|e| e.to_string())?, None),
        };
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(H3Conn { send, zero_rtt })
    }
}
