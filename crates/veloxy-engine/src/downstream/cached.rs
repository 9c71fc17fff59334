//! HTTP/1 requests on a caching route that go upstream through the cache: the fill (see
//! [`crate::cache::fill`]), then its answer, or the usual forward when the cache lets go.

use std::rc::Rc;

use crate::cache::fill::Filled;
use crate::downstream::connection::{Downstream, Prepared};
use crate::downstream::files::StaticReply;
use crate::exchange::Record;
use crate::http1::BodyKind;
use crate::worker::{Generation, Worker};

/// Runs the fill of `p` (which has one); returns whether the connection stays open.
pub(crate) async fn forward(
    worker: &Rc<Worker>,
    gen: &Rc<Generation>,
    down: &mut Downstream,
    mut p: Prepared,
) -> bool {
    let fill = p.target.cache.take().expect("a request with a fill");
    // GET or HEAD: no body to read before the slot. A forward keeps it.
    let filled = match crate::exchange::hold_slot(&p.target.concurrency, &mut p.slot).await {
        Ok(()) => crate::cache::fill::run(worker, gen, &p.target, fill).await,
        Err(e) => Err(e),
    };
    match filled {
        Ok(Filled::Answer(r)) => {
            let record = std::mem::replace(&mut p.record, Record::unlogged());
            let reply = StaticReply::for_response(worker, r, &p, record);
            crate::downstream::files::serve(worker, down, reply).await
        }
        Ok(Filled::Forward(line)) => {
            crate::exchange::add_answer_line(&mut p.record, &line);
            crate::downstream::proxy::forward(worker, gen, down, p).await
        }
        Err(e) => {
            tracing::warn!(error = %e.kind, "upstream error (cache fill)");
            let close = e.closes_connection() || !p.keep_alive || p.body != BodyKind::None;
            crate::downstream::proxy::fail_prepared(worker, down, &mut p, &e, close).await
        }
    }
}
