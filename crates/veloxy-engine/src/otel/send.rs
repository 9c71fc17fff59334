//! Sends encoded OTLP requests to the collector, on the exporter thread: OTLP/HTTP (a POST
//! of `application/x-protobuf` to `ENDPOINT/v1/traces`) over an HTTP/1.1 connection kept
//! alive, or OTLP/gRPC (the unary `TraceService/Export` call: the same message behind gRPC's
//! 5-byte frame prefix) over an HTTP/2 connection. Both use hyper's client connections; a
//! connection the collector closed while idle is replaced, and the request sent again once.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The gRPC method OTLP/gRPC trace export calls.
const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// A collector's answer is small; more is not read.
const MAX_ANSWER: usize = 64 * 1024;

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// The endpoint is not `http://host:port[/path]` or `grpc://host:port`.
    #[error("bad endpoint {0:?}")]
    Endpoint(String),
    /// No connection to the collector.
    #[error("cannot connect to the collector: {0}")]
    Connect(#[source] std::io::Error),
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(#[source] hyper::Error),
    /// The request could not be built.
    #[error("request: {0}")]
    Request(#[source] http::Error),
    /// The collector refused the request.
    #[error("the collector answered {0}")]
    Status(u16),
    /// The gRPC call failed.
    #[error("gRPC status {0}")]
    Grpc(String),
    /// The collector closed the connection before answering.
    #[error("the collector closed the connection")]
    Closed,
    /// The answer was too long.
    #[error("the collector's answer is too long")]
    TooLong,
}

enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// A collector's endpoint, and the connection to it when one is open.
pub(crate) struct Client {
    grpc: bool,
    authority: String,
    /// The request's target: the path for HTTP/1.1, the whole URI for HTTP/2.
    target: http::Uri,
    conn: Option<Conn>,
}

impl Client {
    /// A client for `endpoint` (checked at load: `http://` or `grpc://`); connects on the
    /// first send.
    pub(crate) fn new(endpoint: &str) -> Result<Client, SendError> {
        let bad = || SendError::Endpoint(endpoint.to_owned());
        let (grpc, rest) = match endpoint.strip_prefix("grpc://") {
            Some(rest) => (true, rest),
            None => (false, endpoint.strip_prefix("http://").ok_or_else(bad)?),
        };
        let uri: http::Uri = format!("http://{rest}").parse().map_err(|_| bad())?;
        let authority = uri.authority().ok_or_else(bad)?.to_string();
        let target = match grpc {
            true => format!("http://{authority}{GRPC_PATH}"),
            false => format!("{}/v1/traces", uri.path().trim_end_matches('/')),
        };
        Ok(Client {
            grpc,
            authority,
            target: target.parse().map_err(|_| bad())?,
            conn: None,
        })
    }

    /// Forgets the connection (an export that timed out leaves it in an unknown state).
    pub(crate) fn reset(&mut self) {
        self.conn = None;
    }

    /// Sends one encoded `ExportTraceServiceRequest`.
    pub(crate) async fn send(&mut self, message: &[u8]) -> Result<(), SendError> {
        let body = match self.grpc {
            true => {
                let mut b = Vec::with_capacity(5 + message.len());
                b.push(0); // not compressed
                b.extend_from_slice(&(message.len() as u32).to_be_bytes());
                b.extend_from_slice(message);
                Bytes::from(b)
            }
            false => Bytes::copy_from_slice(message),
        };
        for _ in 0..2 {
            let reused = self.conn.is_some();
            let conn = match self.conn.take() {
                Some(c) => c,
                None => self.connect().await?,
            };
            match self.exchange(conn, body.clone()).await {
                // A kept connection the collector had closed while idle: once more on a new
                // one (at worst the collector gets a batch twice).
                Err(SendError::Http(_)) if reused => continue,
                r => return r,
            }
        }
        Err(SendError::Closed)
    }

    async fn connect(&self) -> Result<Conn, SendError> {
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(SendError::Connect)?;
        let _ = tcp.set_nodelay(true);
        let io = TokioIo::new(tcp);
        if self.grpc {
            let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(SendError::Http)?;
            tokio::spawn(conn);
            Ok(Conn::H2(send))
        } else {
            let (send, conn) = http1::handshake(io).await.map_err(SendError::Http)?;
            tokio::spawn(conn);
            Ok(Conn::H1(send))
        }
    }

    /// One request on `conn`, kept for the next when it went well.
    async fn exchange(&mut self, conn: Conn, body: Bytes) -> Result<(), SendError> {
        let len = body.len();
        let req =
            http::Request::post(self.target.clone()).header(http::header::CONTENT_LENGTH, len);
        let answer = match conn {
            Conn::H1(mut send) => {
                send.ready().await.map_err(SendError::Http)?;
                let req = req
                    .header(HOST, &self.authority)
                    .header(CONTENT_TYPE, "application/x-protobuf")
                    .body(Full::new(body))
                    .map_err(SendError::Request)?;
                let answer = send.send_request(req).await.map_err(SendError::Http)?;
                let answer = read(answer).await?;
                self.conn = Some(Conn::H1(send));
                answer
            }
            Conn::H2(mut send) => {
                send.ready().await.map_err(SendError::Http)?;
                let req = req
                    .header(CONTENT_TYPE, "application/grpc")
                    .header("te", "trailers")
                    .body(Full::new(body))
                    .map_err(SendError::Request)?;
                let answer = send.send_request(req).await.map_err(SendError::Http)?;
                self.conn = Some(Conn::H2(send));
                read(answer).await?
            }
        };
        if !answer.0.is_success() {
            return Err(SendError::Status(answer.0.as_u16()));
        }
        if self.grpc {
            // The status is in the trailers, or in the head of a trailers-only answer.
            let status = answer
                .2
                .as_ref()
                .and_then(|t| t.get("grpc-status"))
                .or_else(|| answer.1.get("grpc-status"))
                .map(|v| v.as_bytes().to_vec())
                .unwrap_or_default();
            if status != b"0" {
                return Err(SendError::Grpc(
                    String::from_utf8_lossy(&status).into_owned(),
                ));
            }
        }
        Ok(())
    }
}

/// The answer's status, head fields and trailers, its body read and dropped.
async fn read(
    answer: http::Response<hyper::body::Incoming>,
) -> Result<(http::StatusCode, http::HeaderMap, Option<http::HeaderMap>), SendError> {
    let (parts, body) = answer.into_parts();
    let body = http_body_util::Limited::new(body, MAX_ANSWER);
    let collected = body
        .collect()
        .await
        .map_err(|e| match e.downcast::<hyper::Error>() {
            Ok(e) => SendError::Http(*e),
            Err(_) => SendError::TooLong,
        })?;
    let trailers = collected.trailers().cloned();
    Ok((parts.status, parts.headers, trailers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one HTTP/1.1 request with a `content-length` body; returns its target and body.
    async fn read_request(s: &mut tokio::net::TcpStream) -> (String, Vec<u8>) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    let target = head.split(' ').nth(1).unwrap_or("").to_owned();
                    return (target, buf[end + 4..end + 4 + len].to_vec());
                }
            }
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the client closed mid-request");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The collector answers each request, then closes the connection (as one whose idle
    /// timeout passed): the next export goes out on a new connection, not dropped.
    #[tokio::test]
    async fn a_kept_connection_the_collector_closed_is_replaced() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = l.accept().await.unwrap();
                got.push(read_request(&mut s).await);
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await
                    .unwrap();
                s.shutdown().await.unwrap();
            }
            got
        });
        let mut c = Client::new(&format!("http://{addr}/prefix/")).unwrap();
        c.send(b"one").await.unwrap();
        c.send(b"two").await.unwrap();
        let got = server.await.unwrap();
        let want = [
            ("/prefix/v1/traces".to_owned(), b"one".to_vec()),
            ("/prefix/v1/traces".to_owned(), b"two".to_vec()),
        ];
        assert_eq!(got, want);
    }
}
