//! Writing a FastCGI response to an HTTP/1 client as its body arrives: the head at once, then
//! each chunk of the body as the FastCGI server sends it ([`FcgiStream`]), chunked for
//! HTTP/1.1 and up to the connection's close for HTTP/1.0. The next chunk is read only once
//! the previous one is written, so memory stays bounded by a record whatever the body's size.

use bytes::Bytes;

use crate::downstream::connection::{Downstream, Prepared};
use crate::downstream::files::{copy_out, StaticReply};
use crate::exchange::fastcgi_body::FcgiStream;
use crate::exchange::Record;
use crate::worker::Worker;

/// Answers the prepared request `p` with the FastCGI response head `r` and its body from
/// `body`. Returns whether the connection stays open.
pub(crate) async fn serve(
    worker: &Worker,
    down: &mut Downstream,
    mut p: Prepared,
    mut r: crate::static_files::Response,
    mut body: Box<FcgiStream>,
) -> bool {
    let with_body = !p.is_head && !matches!(r.status, 100..=199 | 204 | 304);
    let chunked = with_body && p.version >= 1;
    if chunked {
        r.headers
            .push(("transfer-encoding", Bytes::from_static(b"chunked")));
    } else if with_body {
        // HTTP/1.0: the body ends with the connection.
        p.keep_alive = false;
    }
    let record = std::mem::replace(&mut p.record, Record::placeholder());
    let mut reply = StaticReply::for_response(worker, r, &p, record);
    let status = reply.response.status;
    let limit = down.send_timeout;
    let mut out = worker.take_vec();
    out.extend_from_slice(&reply.head);
    let mut written = 0u64;
    let io = &mut down.stream;
    let result = async {
        copy_out(io, &out, &mut written, limit).await?;
        if !with_body {
            return Ok(());
        }
        loop {
            out.clear();
            match body.next().await {
                Some(Ok(data)) if chunked => {
                    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                    out.extend_from_slice(&data);
                    out.extend_from_slice(b"\r\n");
                }
                Some(Ok(data)) => out.extend_from_slice(&data),
                Some(Err(e)) => {
                    return Err((written, std::io::Error::other(e.report().to_string())))
                }
                None if chunked => {
                    out.extend_from_slice(b"0\r\n\r\n");
                    copy_out(io, &out, &mut written, limit).await?;
                    break;
                }
                None => break,
            }
            if !out.is_empty() {
                copy_out(io, &out, &mut written, limit).await?;
            }
        }
        Ok(())
    }
    .await;
    worker.give_vec(out);
    let ok = match result {
        Ok(()) => true,
        Err((_, e)) => {
            tracing::debug!(client = %down.peer, error = %e, "FastCGI response cut short");
            false
        }
    };
    down.metrics.bytes_out.add(written);
    down.bytes_sent += written;
    crate::downstream::connection::finish_record(worker, down, &mut reply.record, status);
    // A body not read to its end (HEAD, 204) leaves the FastCGI connection unusable: the
    // stream closes it when dropped.
    ok && reply.keep_alive
}
