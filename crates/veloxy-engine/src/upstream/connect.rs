//! Opening upstream connections: TCP (then TLS for `https://` backends), within a backend's
//! `max_connections` and the group's connect timeout.

use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::error::{ErrorKind, ProxyError};
use crate::metrics::WorkerMetrics;
use crate::tls::UpstreamIo;
use crate::upstream::group::UpstreamGroup;
use crate::upstream::pool::{release_slot, reserve_slot, UpstreamConn};

/// Opens a connection to `backend`: TCP, then TLS for `https://` servers (ALPN per the
/// group's protocol). The caller bounds the whole by the connect timeout.
pub(crate) async fn connect_io(
    group: &UpstreamGroup,
    backend: usize,
) -> std::io::Result<UpstreamIo> {
    let b = &group.backends[backend];
    let s = TcpStream::connect(b.addr).await?;
    // Once per upstream connection, never per request.
    let _ = s.set_nodelay(true);
    match (&group.tls, &b.tls_name) {
        (Some(config), Some(name)) => {
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let tls = connector.connect(name.clone(), s).await?;
            Ok(UpstreamIo::Tls(Box::new(tls)))
        }
        _ => Ok(UpstreamIo::Plain(s)),
    }
}

/// Opens a new connection to `backend`, within its `max_connections` and the group's connect
/// timeout. On failure: the error, and whether it counts against the backend's health (a
/// backend at its connection limit is busy, not broken; a host out of descriptors or ports
/// has said nothing about the backend). Every upstream protocol connects through here.
pub(crate) async fn connect_backend(
    metrics: &WorkerMetrics,
    group: &UpstreamGroup,
    backend: usize,
) -> Result<UpstreamConn, (ProxyError, bool)> {
    let health = &group.health.backends[backend];
    if !reserve_slot(health, group.max_connections) {
        return Err((ProxyError::upstream(ErrorKind::BackendFull), false));
    }
    match timeout(group.connect_timeout, connect_io(group, backend)).await {
        Ok(Ok(s)) => {
            metrics.upstream_connects.inc();
            Ok(UpstreamConn::with_reserved_slot(s, health.clone()))
        }
        failed => {
            release_slot(health);
            let (kind, counts) = match failed {
                Err(_) => (ErrorKind::ConnectTimeout, true),
                Ok(Err(e)) if crate::error::is_local_resource_error(&e) => {
                    metrics.upstream_local_errors.inc();
                    (ErrorKind::LocalResources(e), false)
                }
                Ok(Err(e)) => (ErrorKind::Connect(e), true),
                Ok(Ok(_)) => unreachable!("handled above"),
            };
            Err((ProxyError::upstream(kind), counts))
        }
    }
}
