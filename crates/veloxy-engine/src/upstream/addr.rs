//! A backend's address: a TCP socket address, or the path of a unix socket
//! (`servers = ["unix:/run/app.sock"]`).

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Where a backend is reached. Displayed as written in the config (`127.0.0.1:8080`,
/// `unix:/run/app.sock`) in logs, metrics and the admin API.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BackendAddr {
    /// A TCP address (resolved at load time).
    Tcp(SocketAddr),
    /// A unix stream socket's path (absolute, or relative to the config file's folder).
    Unix(Arc<Path>),
}

impl BackendAddr {
    /// The TCP address, if the backend is reached over TCP.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            BackendAddr::Tcp(a) => Some(*a),
            BackendAddr::Unix(_) => None,
        }
    }
}

impl From<SocketAddr> for BackendAddr {
    fn from(a: SocketAddr) -> Self {
        BackendAddr::Tcp(a)
    }
}

impl fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendAddr::Tcp(a) => a.fmt(f),
            BackendAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl std::str::FromStr for BackendAddr {
    type Err = std::net::AddrParseError;

    /// `unix:PATH` or an IP socket address (no name resolution).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("unix:") {
            Some(path) => Ok(BackendAddr::Unix(Path::new(path).into())),
            None => s.parse().map(BackendAddr::Tcp),
        }
    }
}
