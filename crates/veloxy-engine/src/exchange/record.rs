//! Recording a finished exchange, the same way for every protocol: the access log line, the
//! request metrics and the `on_done` hook. Nothing else writes them.

use std::net::SocketAddr;

use tokio::time::Instant;

use crate::hooks::{RequestCtx, RequestSummary};
use crate::worker::Worker;

/// What the access log needs from a request, copied only when the log is on.
pub(crate) struct LogFields {
    method: String,
    target: String,
    /// 0: HTTP/1.0, 1: HTTP/1.1, 2: HTTP/2.
    version: u8,
    referer: Vec<u8>,
    user_agent: Vec<u8>,
}

/// One exchange's record, carried from admission to its end.
pub(crate) struct Record {
    pub started: Instant,
    /// The route's index in the file; `None` when the request was refused before routing.
    pub route: Option<usize>,
    log: Option<Box<LogFields>>,
    /// The hooks' per-request state, when hooks are installed and the request got that far.
    pub ctx: Option<Box<RequestCtx>>,
    /// The upstream group, for the access log.
    pub upstream: String,
    /// The backend of the last attempt.
    pub backend: Option<crate::upstream::addr::BackendAddr>,
    /// The downstream connection's bytes-sent counter when the exchange began (HTTP/1, where
    /// the counter spans the connection).
    pub bytes_before: u64,
    /// The route's response edits (header rules, error pages, request ID), when it has any.
    pub edit: Option<super::edit::ResponseEdit>,
    /// The request ID (`[server] request_id`).
    pub request_id: Option<String>,
    /// The client's address from a trusted proxy's header (`None`: the peer's).
    pub client_ip: Option<std::net::IpAddr>,
    /// A `basic_auth` credential check admission left to run off the worker: the codec runs
    /// it ([`super::verified`]) before it answers anything, from a file, the cache or a
    /// backend.
    pub verify: Option<Box<crate::auth::Verify>>,
    /// An unsafe request on a caching route: what its response invalidates (RFC 9111 4.4).
    pub invalidate: Option<Box<crate::cache::invalidate::Pending>>,
    /// `[server.tracing]` is on (the access log writes trace ids).
    pub traced: bool,
    /// The exchange was sampled: its trace, its spans so far.
    pub trace: Option<crate::otel::TraceRef>,
}

impl Record {
    /// Starts a record; the access log fields are copied only when the log is on.
    pub fn start(
        worker: &Worker,
        fields: impl FnOnce() -> (String, String, u8, Vec<u8>, Vec<u8>),
    ) -> Record {
        let log = worker.shared.access_log.as_ref().map(|_| {
            let (method, target, version, referer, user_agent) = fields();
            Box::new(LogFields {
                method,
                target,
                version,
                referer,
                user_agent,
            })
        });
        Record {
            log,
            ..Record::unlogged()
        }
    }

    /// A record for a request too malformed to log (counted, not logged).
    pub fn unlogged() -> Record {
        Record {
            started: Instant::now(),
            ..Record::placeholder()
        }
    }

    /// What is left in place of a record moved out (`std::mem::replace`) and never finished:
    /// its start time comes from the coarse clock, which costs no clock read.
    pub fn placeholder() -> Record {
        Record {
            started: crate::clock::coarse_instant().into(),
            route: None,
            log: None,
            ctx: None,
            upstream: String::new(),
            backend: None,
            bytes_before: 0,
            edit: None,
            request_id: None,
            client_ip: None,
            verify: None,
            invalidate: None,
            traced: false,
            trace: None,
        }
    }

    /// True when the access log is on (so the upstream's name is worth copying).
    pub fn logs(&self) -> bool {
        self.log.is_some()
    }

    /// Writes the access log line, counts the request and runs `on_done`. Call once, at the
    /// end of the exchange (`status` 0: nothing could be answered).
    pub fn finish(&mut self, worker: &Worker, client: SocketAddr, status: u16, bytes_sent: u64) {
        let duration = self.started.elapsed();
        let client = self
            .client_ip
            .map_or(client, |ip| SocketAddr::new(ip, client.port()));
        match self.route {
            Some(r) => worker.metrics.request(r, status),
            None => worker.metrics.unrouted(status),
        }
        worker.metrics.request_duration.observe(duration);
        let ids = self.trace.take().and_then(|t| self.end_trace(&t, status));
        let ids = ids.as_ref().map(|i| (i.trace(), i.span()));
        if let (Some(log), Some(f)) = (&worker.shared.access_log, self.log.take()) {
            let entry = crate::access_log::Entry {
                client,
                method: &f.method,
                target: &f.target,
                version: f.version,
                status,
                bytes_sent,
                duration,
                referer: &f.referer,
                user_agent: &f.user_agent,
                upstream: &self.upstream,
                backend: self.backend.as_ref(),
                request_id: self.request_id.as_deref(),
                bytes_received: None,
                trace: self.traced.then(|| ids.unwrap_or(("", ""))),
            };
            if !log.log(&entry) {
                worker.metrics.access_log_dropped.inc();
            }
        }
        if let (Some(hooks), Some(ctx)) = (&worker.shared.hooks, self.ctx.as_deref_mut()) {
            let summary = RequestSummary {
                status,
                duration,
                backend: self.backend.clone(),
            };
            hooks.on_done(&summary, ctx);
        }
    }

    /// Ends a sampled exchange's span and queues its spans for export; returns the trace and span ids when the access log writes them.
    #[cold]
    fn end_trace(&self, t: &crate::otel::Trace, status: u16) -> Option<crate::otel::span::HexIds> {
        if let Some(b) = &self.backend {
            t.server(|s| s.backend = Some(b.clone()));
        }
        t.finish(status);
        self.log.is_some().then(|| t.ids())
    }
}
