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
    let mut excluded = group.health.down_set();
    for _ in 0..=group.retries {
        let pick = gen.group(upstream).pick(&PickContext {
            client: down.peer,
            excluded: excluded.clone(),
            hash: 0,
        });
        let Some(backend) = pick else { break };
        // The backend learns the client's address when the group sends a PROXY header.
        let origin = crate::upstream::connect::origin(group, down.peer, None, down.local);
        match crate::upstream::connect::connect_backend(&*worker.metrics, group, backend, origin)
            .await
        {
            Ok(mut conn) => {
                worker.metrics.upgrades.inc();
                let received =
                    crate::downstream::relay::tunnel(down, &mut conn.stream, group.idle_timeout)
                        .await;
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
