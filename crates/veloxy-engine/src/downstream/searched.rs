//! HTTP/1 requests the search gateway runs itself (see [`crate::search`]): the body is read
//! whole, up to the job's limit (a declared length was checked at admission; a chunked body
//! is counted as it arrives: 413 past the limit, as over HTTP/2), the job splits or clamps it
//! and talks to the nodes, and its answer goes to the client like any answer of veloxy's own.

use std::rc::Rc;

use bytes::{Buf, Bytes};

use crate::downstream::connection::{Downstream, Prepared};
use crate::downstream::files::StaticReply;
use crate::downstream::proxy::Fail;
use crate::downstream::relay::{read_body_more, write_down};
use crate::error::ProxyError;
use crate::exchange::Record;
use crate::http1::body::{request_body_error, BodyState};
use crate::http1::BodyKind;
use crate::worker::Worker;

/// Runs the search job of `p` (which has one); returns whether the connection stays open.
pub(crate) async fn forward(worker: &Rc<Worker>, down: &mut Downstream, mut p: Prepared) -> bool {
    let job = p.target.search.take().expect("a request with a search job");
    let body = match read_body(down, &mut p, job.body_limit()).await {
        Ok(body) => {
            // Read whole: the connection can take the next request.
            p.body = BodyKind::None;
            let slot = crate::exchange::hold_slot(&p.target.concurrency, &mut p.slot).await;
            slot.map(|()| body).map_err(Fail::BeforeResponse)
        }
        Err(e) => Err(e),
    };
    match body {
        Ok(body) => {
            let answer = job.run(body).await;
            let record = std::mem::replace(&mut p.record, Record::unlogged());
            let reply = StaticReply::for_answer(worker, answer, &p, record);
            crate::downstream::files::serve(worker, down, reply).await
        }
        Err(Fail::Abort(_)) => false,
        Err(Fail::BeforeResponse(e)) => {
            // Unless the body was read whole (a 503 for want of a slot), the connection cannot
            // take another request.
            let close = p.body != BodyKind::None || !p.keep_alive;
            crate::downstream::proxy::fail_prepared(worker, down, &mut p, &e, close).await
        }
    }
}

/// The request body, decoded, read within the client's body timeout; more than `limit`
/// decoded bytes is a 413.
async fn read_body(down: &mut Downstream, p: &mut Prepared, limit: u64) -> Result<Bytes, Fail> {
    let bad = |e| Fail::BeforeResponse(request_body_error(e));
    let mut state = BodyState::new(p.body, true);
    let mut out = Vec::new();
    if p.expect_continue && !state.is_done() {
        p.expect_continue = false;
        write_down(down, b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|e: ProxyError| Fail::Abort(e))?;
    }
    loop {
        let n = state.take_into(&down.rbuf, &mut out).map_err(bad)?;
        down.rbuf.advance(n);
        if out.len() as u64 > limit {
            return Err(Fail::BeforeResponse(ProxyError::downstream(
                crate::error::ErrorKind::BodyTooLarge,
            )));
        }
        if state.is_done() {
            return Ok(out.into());
        }
        read_body_more(down).await?;
    }
}
