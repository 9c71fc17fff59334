//! L4 streams: a `protocol = "tcp"` listener relays each connection's bytes both ways to a
//! backend of its `[[streams]]` group. Balancing, health (down backends are skipped),
//! `connect_timeout`, `max_connections` and `idle_timeout` apply; a failed connect moves on to
//! another backend (`retries` times), then the client connection closes.

use crate::downstream::connection::Downstream;
use crate::upstream::balancer::PickContext;
use crate::worker::Worker;

/// Relays `down` to a backend of group `upstream` until either side closes or the relay idles
/// out.
pub(crate) async fn serve(worker: &Worker, down: &mut Downstream, upstream: usize) {
    let gen = worker.current();
    let group = &gen.snapshot.upstreams[upstream];
    let started = tokio::time::Instant::now();
    let trace = match gen.snapshot.settings.tracing {
        None => None,
        Some(_) => {
            let port = down.local.map_or(down.listener.port, |l| l.port());
            let name = &down.listener.name;
            crate::exchange::trace::stream(&gen.snapshot, name, down.peer, port, started)
        }
    };
    let mut excluded = group.health.down_set();
    for tried in 0..=group.retries {
        let pick = gen.group(upstream).pick(&PickContext {
            client: down.peer,
            excluded: excluded.clone(),
            hash: 0,
        });
        let Some(backend) = pick else { break };
        // The backend learns the client's address when the group sends a PROXY header.
        let origin = crate::upstream::connect::origin(group, down.peer, None, down.local);
        let span = trace.as_ref().map(|t| t.attempt());
        let connected =
            crate::upstream::connect::connect_backend(&*worker.metrics, group, backend, origin)
                .await;
        if let (Some(t), Some(span)) = (&trace, span) {
            attempt_span(t, span, (group, backend), tried, &connected);
        }
        match connected {
            Ok(mut conn) => {
                worker.metrics.upgrades.inc();
                let received =
                    crate::downstream::relay::tunnel(down, &mut conn.stream, group.idle_timeout)
                        .await;
                if let Some(t) = &trace {
                    let addr = &group.backends[backend].addr;
                    crate::exchange::trace::stream_end(t, addr, received, down.bytes_sent);
                }
                log(
                    worker,
                    down,
                    &group.name,
                    &group.backends[backend].addr,
                    received,
                    started,
                );
                return;
            }
            Err((e, _)) => {
                tracing::warn!(upstream = %group.name, error = %e.report(), "stream: connect failed");
                excluded.insert(backend);
            }
        }
    }
    if let Some(t) = &trace {
        t.finish(0); // no backend took it: `incomplete`
    }
}

/// A stream's connect attempt as an `upstream attempt` span: its connection events, or why
/// it failed.
#[cold]
fn attempt_span(
    t: &crate::otel::Trace,
    span: crate::otel::Phase,
    (group, backend): (&crate::config::UpstreamGroup, usize),
    tried: u32,
    connected: &Result<crate::upstream::pool::UpstreamConn, (crate::error::ProxyError, bool)>,
) {
    use crate::exchange::trace::{attempt, AttemptEnd};
    let addr = &group.backends[backend].addr;
    match connected {
        Ok(conn) => {
            crate::exchange::trace::connected(t, conn, false);
            attempt(t, span, addr, tried, AttemptEnd::Status(0));
        }
        Err((e, _)) => attempt(t, span, addr, tried, AttemptEnd::Failed(e)),
    }
}

/// The stream's access log line: protocol `TCP`, the listener as the target, bytes each way
/// and the duration.
fn log(
    worker: &Worker,
    down: &Downstream,
    upstream: &str,
    backend: &crate::upstream::addr::BackendAddr,
    received: u64,
    started: tokio::time::Instant,
) {
    let Some(log) = &worker.shared.access_log else {
        return;
    };
    let entry = crate::access_log::Entry {
        client: down.peer,
        method: "TCP",
        target: &down.listener.name,
        version: crate::access_log::STREAM,
        status: 0,
        bytes_sent: down.bytes_sent,
        duration: started.elapsed(),
        referer: b"",
        user_agent: b"",
        upstream,
        backend: Some(backend),
        request_id: None,
        trace: None,
        bytes_received: Some(received),
    };
    if !log.log(&entry) {
        worker.metrics.access_log_dropped.inc();
    }
}
