//! `mirror`: copies of a route's requests sent to shadow groups (nginx's `mirror`, Envoy's
//! `request_mirror_policies`, Gateway API's `RequestMirror`), their answers read and dropped.
//!
//! * **Which requests.** A request is copied only once it has passed every check of its
//!   route (access rules, rate limit, `basic_auth`, `forward_auth`, whose fields it carries
//!   as the primary does) and is about to go to the route's group. The one check after the
//!   copy is the route's `max_concurrency` queue: a request it then refuses (503) has been
//!   copied. A request that is refused, answered by veloxy, or answered by the cache
//!   (a hit, or a miss the cache fills itself) is not copied; one the cache lets through
//!   (uncacheable, bypassed) is. Search, FastCGI and upgrade (WebSocket) requests are not
//!   copied. Each table of `mirror` samples its own `percent` with the worker's RNG.
//! * **What is sent.** The request as the primary gets it on an HTTP/1.1 hop: the method,
//!   the target after `strip_prefix`/`rewrite`, the client's end-to-end fields with the
//!   route's `request_headers` edits, the hooks' fields and the X-Forwarded-* fields, the
//!   client's Host unchanged unless the table sets `host` (Envoy's `-shadow` suffix is not
//!   added), as plain HTTP/1.1 on a
//!   fresh connection with `Connection: close`, rendered at admission.
//! * **The body** (`body = true`, the default): one with a declared length up to
//!   [`BODY_LIMIT`] is read before the primary is sent (as `request_buffering = "auto"` does
//!   for small bodies) and given to both; one of unknown length is read up to the bound on
//!   routes to HTTP/1 groups (which buffer it so anyway) and the rest streamed after it, but
//!   on routes to `h2`/`h2c` groups (gRPC streams) only what has arrived is looked at, so a
//!   stream is never held. A body that is larger, or not whole at hand, is not copied
//!   (`veloxy_mirror_skipped_total`), the primary unaffected. `body = false` sends the head
//!   only.
//! * **Never in the way.** Each copy is a task of its own on the worker: the primary's
//!   answer never waits for it and is never changed by it. At most [`MAX_IN_FLIGHT`] copies
//!   are in flight per worker (more are dropped, `veloxy_mirror_dropped_total`); each has a
//!   deadline, the shadow group's `connect_timeout` plus its `read_timeout`.

use std::rc::Rc;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Head, Peer, ProxyTarget};
use crate::rules::Mirror;
use crate::upstream::balancer::PickContext;
use crate::worker::{Generation, Worker};

/// A codec's read of the request body for a copy ([`super::drive::Codec::mirror_body`]).
pub(crate) enum MirrorRead {
    /// The whole body (empty for a request without one).
    Copy(Bytes),
    /// No copy: the body is longer than the limit, of unknown length and not at hand, or its
    /// read failed. The attempts meet a failure on their own read.
    Uncopied,
    /// The client stalled past its `body_timeout` while the copy was read. The driver then
    /// tells the codec ([`super::drive::Codec::body_stalled`]) so that the attempts do not
    /// wait for the rest a second time: the client gets its 408 after one timeout.
    Stalled,
}

/// The largest request body copied to a mirror.
pub(crate) const BODY_LIMIT: usize = 64 * 1024;

/// The most mirror copies in flight on one worker.
pub(crate) const MAX_IN_FLIGHT: usize = 256;

/// The most of a shadow's answer kept to see where it ends; the rest is read and dropped.
const ANSWER_PEEK: usize = 16 * 1024;

/// The copies of one request, rendered at admission.
#[derive(Clone)]
pub(crate) struct Copies {
    shots: Vec<Shot>,
    /// What the primary's pick used (the client, the route's hash): a `consistent_hash`,
    /// `ip_hash` or `sticky` shadow group spreads the copies as the primary group does the
    /// requests, not all onto one backend.
    client: std::net::SocketAddr,
    hash: u64,
}

#[derive(Clone)]
struct Shot {
    upstream: usize,
    /// The request head without framing and without its final blank line.
    head: Vec<u8>,
    body: bool,
}

impl Copies {
    /// Some copy sends the request body.
    pub(crate) fn wants_body(&self) -> bool {
        self.shots.iter().any(|s| s.body)
    }

    /// Adds `forward_auth`'s fields (whole `Name: value\r\n` lines) to every copy, as to
    /// the primary: the copies were rendered at admission, before the auth service answered.
    pub(crate) fn add_lines(&mut self, lines: &[u8]) {
        for s in &mut self.shots {
            s.head.extend_from_slice(lines);
        }
    }
}

/// The copies of a proxied request (`t` made already) on a route with `mirror`, sampled
/// by each table's `percent`; `None` when none is taken.
pub(crate) fn admit(
    gen: &Generation,
    mirrors: &[Mirror],
    head: &Head,
    t: &ProxyTarget,
    (peer, client): (&Peer, std::net::SocketAddr),
    hook_lines: Option<&[u8]>,
) -> Option<Box<Copies>> {
    if head.method == "CONNECT" || head.fields.get("upgrade").is_some() {
        return None;
    }
    let mut shots = Vec::new();
    for m in mirrors {
        let taken = m.percent >= 100.0 || (m.percent > 0.0 && fastrand::f64() * 100.0 < m.percent);
        if !taken {
            continue;
        }
        let group = &gen.snapshot.upstreams[m.upstream];
        let host = group
            .backends
            .first()
            .map(|b| b.authority())
            .unwrap_or_default();
        let options = super::h1_head::HeadOptions {
            method: head.method,
            framing: crate::http1::BodyKind::None,
            unconditional: false,
            fallback_host: &host,
            client_ip: peer.client_ip,
            proto: if peer.tls { "https" } else { "http" },
            keep_underscores: gen.snapshot.settings.underscores_in_headers,
            hook_lines,
        };
        let mut out = Vec::with_capacity(512);
        match &m.host {
            None => super::h1_head::write(head, t, &options, &mut out),
            Some(host) => {
                let head = Head {
                    host: host.as_bytes(),
                    ..*head
                };
                super::h1_head::write(&head, t, &options, &mut out);
            }
        }
        shots.push(Shot {
            upstream: m.upstream,
            head: out,
            body: m.body,
        });
    }
    (!shots.is_empty()).then(|| {
        Box::new(Copies {
            shots,
            client,
            hash: t.hash,
        })
    })
}

/// Starts the copies, each a task of its own: `body` is the request body, `None` when it
/// could not be copied (the copies that want it are skipped).
pub(crate) fn send(worker: &Rc<Worker>, gen: &Rc<Generation>, copies: Copies, body: Option<Bytes>) {
    let m = &worker.metrics;
    let (client, hash) = (copies.client, copies.hash);
    for shot in copies.shots {
        let body = match (shot.body, &body) {
            (false, _) => Bytes::new(),
            (true, Some(b)) => b.clone(),
            (true, None) => {
                m.mirror_skipped.inc();
                continue;
            }
        };
        if worker.mirrors.get() >= MAX_IN_FLIGHT {
            m.mirror_dropped.inc();
            continue;
        }
        m.mirrored.inc();
        worker.mirrors.set(worker.mirrors.get() + 1);
        let (worker, gen) = (worker.clone(), gen.clone());
        tokio::task::spawn_local(async move {
            let group = &gen.snapshot.upstreams[shot.upstream];
            let deadline = group.connect_timeout + group.read_timeout;
            let pick = (client, hash);
            let sent = tokio::time::timeout(deadline, run(&worker, &gen, &shot, body, pick)).await;
            if !matches!(sent, Ok(Ok(()))) {
                worker.metrics.mirror_failed.inc();
                tracing::debug!(group = %group.name, "mirror: the copy failed or timed out");
            }
            worker.mirrors.set(worker.mirrors.get() - 1);
        });
    }
}

/// One copy: a backend of the shadow group, the request, its answer read to its end and
/// dropped.
async fn run(
    worker: &Worker,
    gen: &Generation,
    shot: &Shot,
    body: Bytes,
    (client, hash): (std::net::SocketAddr, u64),
) -> Result<(), ()> {
    let group = &gen.snapshot.upstreams[shot.upstream];
    let backend = gen
        .group(shot.upstream)
        .pick(&PickContext {
            client,
            excluded: group.health.down_set(),
            hash,
        })
        .ok_or(())?;
    let mut conn =
        crate::upstream::connect::connect_backend(&*worker.metrics, group, backend, None)
            .await
            .map_err(|_| ())?;
    let mut head = Vec::with_capacity(shot.head.len() + 64);
    head.extend_from_slice(&shot.head);
    if !body.is_empty() {
        crate::http1::write_framing(crate::http1::BodyKind::Length(body.len() as u64), &mut head);
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    conn.stream.write_all(&head).await.map_err(|_| ())?;
    conn.stream.write_all(&body).await.map_err(|_| ())?;
    let mut buf = Vec::with_capacity(4096);
    let mut scratch = [0u8; 4096];
    loop {
        let n = if buf.len() < ANSWER_PEEK {
            (&mut conn.stream)
                .take((ANSWER_PEEK - buf.len()) as u64)
                .read_buf(&mut buf)
                .await
        } else {
            conn.stream.read(&mut scratch).await
        };
        match n {
            Ok(0) if buf.is_empty() => return Err(()),
            Ok(0) => return Ok(()),
            Ok(_) if buf.len() < ANSWER_PEEK && super::forward_auth::complete(&buf) => {
                return Ok(())
            }
            Ok(_) => {}
            Err(_) => return Err(()),
        }
    }
}
