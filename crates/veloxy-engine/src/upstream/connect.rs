//! Opening upstream connections: TCP or a unix socket, then the group's PROXY header, then
//! TLS for `https://` backends, within a backend's `max_connections` and the group's connect
//! timeout.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpStream, UnixStream};
use tokio::time::timeout;

use crate::error::{ErrorKind, ProxyError};
use crate::tls::UpstreamIo;
use tokio::io::AsyncWriteExt;

use crate::upstream::addr::BackendAddr;
use crate::upstream::group::UpstreamGroup;
use crate::upstream::pool::{release_slot, reserve_slot, UpstreamConn};
use crate::upstream::proxy_header::{self, Origin};

/// Opens a connection to `backend`: TCP or a unix socket, the PROXY header naming `origin`
/// when the group sends one, then TLS for `https://` servers (ALPN per the group's protocol).
/// The caller bounds the whole by the connect timeout.
pub(crate) async fn connect_io(
    group: &UpstreamGroup,
    backend: usize,
    origin: Option<Origin>,
    tcp_connected: &mut Option<tokio::time::Instant>,
) -> std::io::Result<UpstreamIo> {
    let b = &group.backends[backend];
    let proxy_header = origin
        .filter(|_| group.proxy_protocol > 0)
        .map(|o| proxy_header::header(group.proxy_protocol, o.client, o.local));
    let mut s = match &b.addr {
        BackendAddr::Tcp(a) => TcpStream::connect(*a).await?,
        BackendAddr::Unix(path) => {
            let mut s = UnixStream::connect(path).await?;
            if let Some(h) = proxy_header {
                s.write_all(&h).await?;
            }
            return Ok(UpstreamIo::Unix(s));
        }
    };
    // Once per upstream connection, never per request.
    let _ = s.set_nodelay(true);
    if let Some(h) = proxy_header {
        s.write_all(&h).await?;
    }
    match (&group.tls, &b.tls_name) {
        (Some(config), Some(name)) => {
            *tcp_connected = Some(tokio::time::Instant::now());
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let tls = connector.connect(name.clone(), s).await?;
            Ok(UpstreamIo::Tls(Box::new(tls)))
        }
        _ => Ok(UpstreamIo::Plain(s)),
    }
}

/// What a connect counts. The worker's metrics implement it (in `crate::metrics`), so this
/// layer keeps no counters of its own and does not reach up for them.
pub(crate) trait ConnectCounts {
    /// A connection to a backend was opened.
    fn connected(&self);
    /// A connect failed for want of local resources (descriptors, ports, memory).
    fn local_error(&self);
}

/// Opens a new connection to `backend`, within its `max_connections` and the group's connect
/// timeout. On failure: the error, and whether it counts against the backend's health (a
/// backend at its connection limit is busy, not broken; a host out of descriptors or ports
/// has said nothing about the backend). Every upstream protocol connects through here.
/// `origin`: the client a PROXY header names, for groups that send one (see [`origin`]).
pub(crate) async fn connect_backend(
    metrics: &impl ConnectCounts,
    group: &UpstreamGroup,
    backend: usize,
    origin: Option<Origin>,
) -> Result<UpstreamConn, (ProxyError, bool)> {
    let health = &group.health.backends[backend];
    if !reserve_slot(health, group.max_connections) {
        return Err((ProxyError::upstream(ErrorKind::BackendFull), false));
    }
    let mut tcp_connected = None;
    let io = connect_io(group, backend, origin, &mut tcp_connected);
    match timeout(group.connect_timeout, io).await {
        Ok(Ok(s)) => {
            metrics.connected();
            let mut conn = UpstreamConn::with_reserved_slot(s, health.clone()).for_origin(origin);
            conn.tcp_connected = tcp_connected;
            Ok(conn)
        }
        failed => {
            release_slot(health);
            let (kind, counts) = match failed {
                Err(_) => (ErrorKind::ConnectTimeout, true),
                Ok(Err(e)) if crate::error::is_local_resource_error(&e) => {
                    metrics.local_error();
                    (ErrorKind::LocalResources(e), false)
                }
                Ok(Err(e)) => (ErrorKind::Connect(e), true),
                Ok(Ok(_)) => unreachable!("handled above"),
            };
            Err((ProxyError::upstream(kind), counts))
        }
    }
}

/// The origin a request's upstream connection must carry: `None` unless the group sends
/// PROXY headers. The client is the real one (`client_ip` from a trusted proxy's header, with
/// the peer's port); `local` is the address the client connected to.
pub(crate) fn origin(
    group: &UpstreamGroup,
    peer: SocketAddr,
    client_ip: Option<IpAddr>,
    local: Option<SocketAddr>,
) -> Option<Origin> {
    if group.proxy_protocol == 0 {
        return None;
    }
    Some(Origin {
        client: client_ip.map_or(peer, |ip| SocketAddr::new(ip, peer.port())),
        local: local.unwrap_or(peer),
    })
}
