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
    let mut excluded = group.health.down_mask();
    for _ in 0..=group.retries {
        let pick = gen.groups.borrow_mut()[upstream].picker.pick(&PickContext {
            client: down.peer,
            excluded,
            hash: 0,
        });
        let Some(backend) = pick else { break };
        match crate::upstream::connect::connect_backend(&worker.metrics, group, backend).await {
            Ok(mut conn) => {
                if group.proxy_protocol > 0 {
                    // The backend learns the client's address (a PROXY header first).
                    let local = down.stream.tcp().local_addr().unwrap_or(down.peer);
                    let h = crate::downstream::proxy_protocol::header(
                        group.proxy_protocol,
                        down.peer,
                        local,
                    );
                    if crate::tls::send_all(&mut conn.stream, &h).await.is_err() {
                        excluded |= 1 << backend;
                        continue;
                    }
                }
                worker.metrics.upgrades.inc();
                crate::downstream::relay::tunnel(down, &mut conn.stream, group.idle_timeout).await;
                tracing::debug!(
                    client = %down.peer,
                    backend = %group.backends[backend].addr,
                    bytes_sent = down.bytes_sent,
                    duration_ms = started.elapsed().as_millis() as u64,
                    "stream closed"
                );
                return;
            }
            Err((e, _)) => {
                tracing::warn!(upstream = %group.name, error = %e.kind, "stream: connect failed");
                excluded |= 1 << backend;
            }
        }
    }
}
