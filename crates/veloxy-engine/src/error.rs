//! One error type for an exchange: which side failed ([`Side`]), what failed ([`ErrorKind`],
//! precise enough to choose the status), and why (the cause chain: the I/O error, hyper's
//! error, the body's error, kept as the error's `source`, never flattened to a string).
//! Logs print [`ProxyError::report`]: the kind and every cause, so they say why, not only
//! what.

use std::io;

/// True for a failure to open a connection that is this host's doing, not the peer's: out of
/// file descriptors (EMFILE, ENFILE), socket buffers (ENOBUFS), memory (ENOMEM), or local
/// ports (EADDRNOTAVAIL on connect). Such a failure says nothing about the backend, so it must
/// not count against its health.
pub fn is_local_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
}

/// Which side of the proxy an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client: bad request, client went away, client too slow.
    Downstream,
    /// A backend: refused, timed out, reset, sent garbage.
    Upstream,
    /// veloxy itself: a step of its own failed (a response coder), not either peer.
    Internal,
}

/// What went wrong, precise enough to choose the status code.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    /// A request the codec refuses (framing, syntax, authority, chunked body): 400.
    #[error("malformed request: {0}")]
    BadRequest(&'static str),
    /// The request head exceeds `max_header_bytes`: 431.
    #[error("request head too large")]
    HeadTooLarge,
    /// The request target exceeds `max_uri_bytes`: 414.
    #[error("request URI too long")]
    UriTooLong,
    /// The request head did not complete within `header_timeout`: 408.
    #[error("timed out reading the request head")]
    HeaderTimeout,
    /// No request body bytes for `body_timeout`: 408.
    #[error("timed out reading the request body")]
    BodyTimeout,
    /// The client accepted no response bytes for `send_timeout` (recorded as 408).
    #[error("timed out sending the response: the client stopped reading")]
    SendTimeout,
    /// No route matches the host and path (or the listener is gone after a reload): 404.
    #[error("no route for this host and path")]
    NoRoute,
    /// Every backend of the group is down or ejected: 503.
    #[error("no backend available")]
    NoBackend,
    /// The backend refused or reset the connection attempt: 502.
    #[error("connect failed: {0}")]
    Connect(io::Error),
    /// Connecting failed for want of something of this host's, not the backend's: file
    /// descriptors, socket buffers, memory, local ports (see [`is_local_resource_error`]).
    #[error("cannot connect upstream, out of local resources: {0}")]
    LocalResources(io::Error),
    /// The connection to the backend took longer than `connect_timeout`: 504.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The backend sent nothing for `read_timeout` (or no final head within it): 504.
    #[error("timed out waiting for the upstream")]
    ReadTimeout,
    /// A write to the backend made no progress for `write_timeout`: 504.
    #[error("timed out writing to the upstream")]
    WriteTimeout,
    /// The backend closed the connection before a complete response: 502.
    #[error("upstream closed the connection before responding")]
    UpstreamClosed,
    /// The backend's response could not be parsed or relayed safely: 502.
    #[error("invalid response from upstream: {0}")]
    BadResponse(&'static str),
    /// An I/O error on either side: 400 downstream, 502 upstream, 500 internal.
    #[error("i/o error: {0}")]
    Io(io::Error),
    /// An HTTP/2 or HTTP/3 stream or connection failed (reset, protocol error, the peer
    /// went away); the cause says how: 400 downstream, 502 upstream.
    #[error("stream failed")]
    Stream,
    /// Refused with this status by a hook or a protocol rule (CONNECT over HTTP/2: 501).
    #[error("rejected by a filter with status {0}")]
    Rejected(u16),
    /// A request that is not replay-safe arrived in TLS early data (QUIC 0-RTT): 425, and the
    /// client sends it again once the handshake is complete (RFC 8470).
    #[error("too early: a request that is not replay-safe was sent in 0-RTT early data")]
    TooEarly,
    /// The route's `allow` / `deny` refuse the client's address: 403.
    #[error("forbidden: this address may not use this route")]
    Forbidden,
    /// The request body is larger than the route or bridge accepts: 413.
    #[error("request body too large for this route")]
    BodyTooLarge,
    /// The route's `max_concurrency` is reached and its queue is full or timed out: 503.
    #[error("overloaded: too many requests in flight on this route")]
    Overloaded,
    /// The listener is at `max_connections`: 503.
    #[error("too many connections")]
    TooManyConnections,
    /// The route's rate limit is exceeded: 429.
    #[error("rate limit exceeded")]
    RateLimited,
    /// The backend is at its `max_connections` and no other could take the request: 503.
    #[error("backend at its connection limit")]
    BackendFull,
    /// An access check could not be made (forward_auth's service down, slow or answering
    /// garbage; the credential check pool full): 503, never a pass.
    #[error("access check unavailable: {0}")]
    AuthUnavailable(&'static str),
    /// The backend answered a status in `retry_on` and no retry was possible: that status.
    #[error("upstream answered {0} and no other backend could take the retry")]
    UpstreamStatus(u16),
}

/// A cause kept inside a [`ProxyError`].
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failed request: what happened, on which side, and why. Whether a retry is safe is
/// decided from how an attempt failed, in one place: `exchange::attempt`.
#[derive(Debug, thiserror::Error)]
#[error("{side:?} error: {kind}")]
pub struct ProxyError {
    /// The side that failed.
    pub side: Side,
    /// What failed.
    pub kind: ErrorKind,
    /// Why, when the kind does not carry it already (hyper's error, a body's error).
    #[source]
    pub cause: Option<Cause>,
}

impl ProxyError {
    /// Logs the error by its side: an upstream error as a warning naming the group and the
    /// backend (left out when none was picked), an internal one as an error, a client's at
    /// debug level.
    pub(crate) fn log(&self, upstream: &str, backend: Option<impl std::fmt::Display>) {
        match self.side {
            Side::Upstream => tracing::warn!(
                upstream,
                backend = backend.map(tracing::field::display),
                error = %self.report(),
                "upstream error"
            ),
            Side::Internal => tracing::error!(error = %self.report(), "internal error"),
            Side::Downstream => tracing::debug!(error = %self.report(), "downstream error"),
        }
    }

    /// An error of the client side.
    pub fn downstream(kind: ErrorKind) -> Self {
        ProxyError {
            side: Side::Downstream,
            kind,
            cause: None,
        }
    }

    /// An error of the backend side.
    pub fn upstream(kind: ErrorKind) -> Self {
        ProxyError {
            side: Side::Upstream,
            kind,
            cause: None,
        }
    }

    /// An error of veloxy's own.
    pub fn internal(kind: ErrorKind) -> Self {
        ProxyError {
            side: Side::Internal,
            kind,
            cause: None,
        }
    }

    /// The error with `cause` as its source.
    pub fn because(mut self, cause: impl Into<Cause>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    /// The kind and every cause, `kind: cause: cause's cause`, for logs.
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }

    /// True when the downstream connection must close after this error: its byte stream can
    /// no longer be trusted (malformed or oversized input, timeouts, I/O errors).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::BadRequest(_)
                | ErrorKind::HeadTooLarge
                | ErrorKind::UriTooLong
                | ErrorKind::HeaderTimeout
                | ErrorKind::BodyTimeout
                | ErrorKind::SendTimeout
                | ErrorKind::Io(_)
                | ErrorKind::Stream
                | ErrorKind::Rejected(417 | 501)
                | ErrorKind::BodyTooLarge
        )
    }

    /// True for refusals by overload protection (counted as shed load).
    pub fn is_shed(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::NoBackend
                | ErrorKind::Overloaded
                | ErrorKind::TooManyConnections
                | ErrorKind::BackendFull
                | ErrorKind::AuthUnavailable(_)
        )
    }

    /// The status answered to the client for this error (when an answer can still be sent:
    /// not once the client is gone or a response is half sent).
    pub fn status(&self) -> u16 {
        match &self.kind {
            ErrorKind::BadRequest(_) => 400,
            ErrorKind::HeadTooLarge => 431,
            ErrorKind::UriTooLong => 414,
            ErrorKind::HeaderTimeout | ErrorKind::BodyTimeout => 408,
            // Nobody reads an answer to a client that stopped reading; 408 is what the access
            // log and metrics record.
            ErrorKind::SendTimeout => 408,
            ErrorKind::NoRoute => 404,
            // Like the other 503s, a temporary condition of this proxy: Retry-After says so.
            ErrorKind::NoBackend
            | ErrorKind::Overloaded
            | ErrorKind::TooManyConnections
            | ErrorKind::BackendFull
            | ErrorKind::AuthUnavailable(_)
            | ErrorKind::LocalResources(_) => 503,
            ErrorKind::RateLimited => 429,
            ErrorKind::UpstreamStatus(s) => *s,
            ErrorKind::Connect(_) | ErrorKind::UpstreamClosed | ErrorKind::BadResponse(_) => 502,
            ErrorKind::ConnectTimeout | ErrorKind::ReadTimeout | ErrorKind::WriteTimeout => 504,
            ErrorKind::Io(_) | ErrorKind::Stream => match self.side {
                Side::Downstream => 400,
                Side::Upstream => 502,
                Side::Internal => 500,
            },
            ErrorKind::Rejected(s) => *s,
            ErrorKind::BodyTooLarge => 413,
            ErrorKind::Forbidden => 403,
            ErrorKind::TooEarly => 425,
        }
    }
}

/// [`ProxyError::report`]: the kind, then each cause of the chain after a colon.
pub struct Report<'a>(&'a ProxyError);

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.kind)?;
        let mut next = std::error::Error::source(self.0);
        while let Some(cause) = next {
            write!(f, ": {cause}")?;
            next = cause.source();
        }
        Ok(())
    }
}
