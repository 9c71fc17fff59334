//! Relaying bodies: the pumps that move them between downstream and upstream through
//! bounded buffers (their framing state is [`crate::http1::body::BodyState`]).

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::UpstreamGroup;
use crate::deadline::timeout;
use crate::downstream::connection::Downstream;
use crate::downstream::proxy::{up, Fail};
use crate::error::{ErrorKind, ProxyError};
use crate::http1::body::{request_body_error, reserve, BodyState, READ_CHUNK};
use crate::tls::UpstreamIo;

pub(crate) async fn write_down(down: &mut Downstream, data: &[u8]) -> Result<(), ProxyError> {
    match timeout(
        down.send_timeout,
        crate::tls::send_all(&mut down.stream, data),
    )
    .await
    {
        Ok(Ok(())) => {
            down.metrics.bytes_out.add(data.len() as u64);
            down.bytes_sent += data.len() as u64;
            Ok(())
        }
        Ok(Err(e)) => Err(ProxyError::downstream(ErrorKind::Io(e))),
        Err(_) => {
            down.metrics.send_timeouts.inc();
            Err(ProxyError::downstream(ErrorKind::SendTimeout))
        }
    }
}

/// Reads more of a request body into the client's read buffer, within `body_timeout`. A
/// stall gets a 408 (no response has started; an upstream connection holding a partial
/// request is dropped); a client that vanished mid-body leaves nobody to answer.
pub(crate) async fn read_body_more(down: &mut Downstream) -> Result<(), Fail> {
    reserve(&mut down.rbuf, READ_CHUNK);
    match timeout(down.body_timeout, down.stream.read_buf(&mut down.rbuf)).await {
        Ok(Ok(n)) if n > 0 => {
            down.metrics.bytes_in.add(n as u64);
            Ok(())
        }
        Err(_) => {
            down.metrics.body_timeouts.inc();
            Err(Fail::BeforeResponse(ProxyError::downstream(
                ErrorKind::BodyTimeout,
            )))
        }
        _ => Err(Fail::Abort(ProxyError::downstream(ErrorKind::BadRequest(
            "request body truncated",
        )))),
    }
}

/// Streams the rest of the request body from the client to the upstream, through the client's
/// read buffer (bounded: each read is forwarded before the next).
pub(crate) async fn relay_request_body(
    group: &UpstreamGroup,
    down: &mut Downstream,
    conn: &mut UpstreamIo,
    body: &mut BodyState,
) -> Result<(), Fail> {
    let mut extra = Vec::new();
    while !body.is_done() {
        if down.rbuf.is_empty() {
            read_body_more(down).await?;
        }
        extra.clear();
        let (n, verbatim) = body
            .take_request(&down.rbuf, &mut extra)
            .map_err(|e| Fail::BeforeResponse(request_body_error(e)))?;
        // A filtered trailer section goes in the same write as what precedes it (once per
        // body: everything else is sent from the read buffer as it is).
        if !extra.is_empty() {
            extra.splice(0..0, down.rbuf[..verbatim].iter().copied());
        }
        let out = if extra.is_empty() {
            &down.rbuf[..verbatim]
        } else {
            &extra[..]
        };
        match timeout(group.write_timeout, crate::tls::send_all(conn, out)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(up(ErrorKind::Io(e))),
            Err(_) => return Err(up(ErrorKind::WriteTimeout)),
        }
        down.rbuf.advance(n);
    }
    Ok(())
}

/// Streams the rest of the response body from the upstream to the client.
pub(crate) async fn relay_response_body(
    group: &UpstreamGroup,
    down: &mut Downstream,
    conn: &mut UpstreamIo,
    ubuf: &mut BytesMut,
    body: &mut BodyState,
    scratch: &mut Vec<u8>,
    mut encoder: Option<&mut crate::compress::StreamEncoder>,
) -> Result<(), Fail> {
    let abort_up = |kind| Fail::Abort(ProxyError::upstream(kind));
    while !body.is_done() {
        ubuf.clear();
        reserve(ubuf, READ_CHUNK * 2);
        let n = match timeout(group.read_timeout, conn.read_buf(ubuf)).await {
            Err(_) => return Err(abort_up(ErrorKind::ReadTimeout)),
            Ok(Err(e)) => return Err(abort_up(ErrorKind::Io(e))),
            Ok(Ok(n)) => n,
        };
        if n == 0 {
            if matches!(body, BodyState::UntilClose) {
                *body = BodyState::Done;
                if let Some(enc) = encoder.as_deref_mut() {
                    let tail = crate::downstream::proxy::compress_step(enc, &[], true)
                        .map_err(Fail::Abort)?;
                    write_down(down, &tail).await.map_err(Fail::Abort)?;
                }
                break;
            }
            return Err(abort_up(ErrorKind::UpstreamClosed));
        }
        let bad = |_| abort_up(ErrorKind::BadResponse("invalid chunked body"));
        if let Some(enc) = encoder.as_deref_mut() {
            // Compressing: payload only (the body state decodes chunked framing), encoded
            // and flushed per read, so nothing accumulates.
            scratch.clear();
            let used = body.take_into(ubuf, scratch).map_err(bad)?;
            ubuf.advance(used);
            let coded = crate::downstream::proxy::compress_step(enc, scratch, body.is_done())
                .map_err(Fail::Abort)?;
            write_down(down, &coded).await.map_err(Fail::Abort)?;
        } else if body.decodes() {
            scratch.clear();
            let used = body.take_into(ubuf, scratch).map_err(bad)?;
            ubuf.advance(used);
            write_down(down, scratch).await.map_err(Fail::Abort)?;
        } else {
            let used = body.take(ubuf).map_err(bad)?;
            write_down(down, &ubuf[..used]).await.map_err(Fail::Abort)?;
            ubuf.advance(used);
        }
    }
    Ok(())
}

/// Relays an upgraded connection (WebSocket) both ways until both sides have closed, an error
/// occurs, or nothing moves for `idle`. Each direction is half-closed when its reader ends.
/// Returns the bytes received from the client.
pub(crate) async fn tunnel(down: &mut Downstream, up: &mut UpstreamIo, idle: Duration) -> u64 {
    let mut received = 0u64;
    let mut from_down = vec![0u8; READ_CHUNK];
    let mut from_up = vec![0u8; READ_CHUNK];
    let (mut down_open, mut up_open) = (true, true);
    while down_open || up_open {
        tokio::select! {
            r = down.stream.read(&mut from_down), if down_open => match r {
                Ok(n) if n > 0 => {
                    down.metrics.bytes_in.add(n as u64);
                    received += n as u64;
                    // A peer that stops reading must not pin the tunnel: every write and
                    // shutdown is bounded by the idle limit too.
                    let sent = timeout(idle, crate::tls::send_all(up, &from_down[..n])).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        return received;
                    }
                }
                _ => {
                    down_open = false;
                    let _ = timeout(idle, up.shutdown()).await;
                }
            },
            r = up.read(&mut from_up), if up_open => match r {
                Ok(n) if n > 0 => {
                    let sent = timeout(idle, write_down(down, &from_up[..n])).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        return received;
                    }
                }
                _ => {
                    up_open = false;
                    let _ = timeout(idle, down.stream.shutdown()).await;
                }
            },
            _ = tokio::time::sleep(idle) => return received,
        }
    }
    received
}
