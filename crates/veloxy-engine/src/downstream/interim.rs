//! Interim responses to HTTP/1.1 clients: an upstream's 1xx forwarded before the final head,
//! and the `103 Early Hints` of an `early_hints` route ([`crate::hints`]).

use crate::downstream::connection::{Downstream, Prepared};
use crate::downstream::relay::write_down;
use crate::error::ProxyError;
use crate::worker::{Generation, Worker};

/// `early_hints`: the `103 Early Hints` of the path's last 200 answer, if it had preload or
/// preconnect links, before the upstream is asked (HTTP/1.1 clients only).
pub(crate) async fn send_hints(
    worker: &Worker,
    gen: &Generation,
    down: &mut Downstream,
    p: &Prepared,
) {
    let Some(links) = crate::exchange::early_hints(gen, &p.target) else {
        return;
    };
    let mut out = worker.take_vec();
    crate::hints::write_h1(&links, &mut out);
    let _ = write_down(down, &out).await;
    worker.give_vec(out);
}

/// Writes the interim responses waiting in `q` (a cache fill's, queued by the upstream
/// reader) to the HTTP/1.1 client, before the final answer.
pub(crate) async fn drain(worker: &Worker, down: &mut Downstream, q: &crate::hints::Interims) {
    let mut out = worker.take_vec();
    while let Some(res) = q.take() {
        crate::http1::interim::write_response(&res, &mut out);
    }
    if !out.is_empty() {
        let _ = write_down(down, &out).await;
    }
    worker.give_vec(out);
}

/// Whether the upstream's interim head `head` goes to the client of `p`, counting it in
/// `forwarded`: HTTP/1.0 clients get no 1xx, `100 Continue` is veloxy's own to send, and at
/// most [`crate::hints::MAX_FORWARDED`] go to one response.
pub(crate) fn forwards(p: &Prepared, forwarded: &mut u8, head: &[u8]) -> bool {
    let yes = p.version >= 1
        && *forwarded < crate::hints::MAX_FORWARDED
        && crate::http1::interim::status(head).is_some();
    *forwarded += u8::from(yes);
    yes
}

/// Forwards an upstream's interim (1xx) head `head` to the HTTP/1.1 client, without its
/// hop-by-hop fields and before the final head (response rules do not apply to it).
pub(crate) async fn forward(
    worker: &Worker,
    down: &mut Downstream,
    head: &[u8],
) -> Result<(), ProxyError> {
    let mut out = worker.take_vec();
    let written = match crate::http1::interim::write_h1(head, &mut out) {
        true => write_down(down, &out).await,
        false => Ok(()),
    };
    worker.give_vec(out);
    written
}
