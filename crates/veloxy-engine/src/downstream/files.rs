//! Writing a static [`Response`] on an HTTP/1 connection: head serialization, then the body
//! from memory or with `sendfile(2)` from the file, on a plain `TcpStream`.
//!
//! The head goes out with `MSG_MORE` when a file body follows, so head and first file bytes
//! share a packet although the socket has `TCP_NODELAY`. Small in-memory bodies are appended
//! to the head and sent in one write.

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::deadline::timeout;
use crate::downstream::connection::Downstream;
use crate::exchange::Record;
use crate::http1::request::RequestView;
use crate::http1::{itoa, reason, BodyKind};
use crate::static_files::{Body, Part, Response, StaticRoute};
use crate::worker::Worker;

/// In-memory bodies up to this size are copied behind the head and sent in one write.
const COALESCE: usize = 64 * 1024;

/// A static response ready to be written, with what the connection needs to finish it.
pub(crate) struct StaticReply {
    pub response: crate::static_files::Response,
    /// The connection stays open afterwards: the client wants it and sent no body (a request
    /// body is never read on a file route; closing discards it safely).
    pub keep_alive: bool,
    /// The response head, serialized, with the route's rules and the hooks applied.
    pub head: Vec<u8>,
    pub record: Record,
    /// The request's HTTP/1 minor version and method, for a reply that replaces this one
    /// ([`StaticReply::replaced`]).
    version: u8,
    is_head: bool,
}

/// Answers `req` from a file route (no I/O on the socket yet).
pub(crate) fn reply(
    worker: &Worker,
    files: &StaticRoute,
    req: &RequestView,
    record: Record,
) -> StaticReply {
    let request = crate::static_files::Request {
        method: req.method,
        target: req.path,
        headers: &req.headers,
    };
    let response = crate::static_files::respond(files, &request);
    StaticReply::new(worker, response, req, record)
}

/// An answer of veloxy's own (redirect, fixed response) as a reply: written like a file
/// route's, with its Content-Length, and no body for HEAD.
pub(crate) fn answer(
    worker: &Worker,
    answer: crate::exchange::Answer,
    req: &RequestView,
    record: Record,
) -> StaticReply {
    StaticReply::new(worker, answer.into_response(req.is_head()), req, record)
}

/// The request a reply answers: its HTTP version, whether it is a HEAD, and whether the
/// connection may stay open after the reply.
#[derive(Clone, Copy)]
struct ReplyTo {
    version: u8,
    is_head: bool,
    keep_alive: bool,
}

impl StaticReply {
    /// A reply ready to write, with the `on_response` hooks' fields (also a cached answer
    /// decided at admission).
    pub(crate) fn new(
        worker: &Worker,
        response: crate::static_files::Response,
        req: &RequestView,
        record: Record,
    ) -> StaticReply {
        let to = ReplyTo {
            version: req.version,
            is_head: req.is_head(),
            keep_alive: req.keep_alive && req.body == BodyKind::None,
        };
        StaticReply::build(worker, response, to, record)
    }

    /// A cached answer to a request already prepared for forwarding (a cache fill's).
    pub(crate) fn for_response(
        worker: &Worker,
        response: crate::static_files::Response,
        p: &crate::downstream::connection::Prepared,
        record: Record,
    ) -> StaticReply {
        let to = ReplyTo {
            version: p.version,
            is_head: p.is_head,
            keep_alive: p.keep_alive && p.body == BodyKind::None,
        };
        StaticReply::build(worker, response, to, record)
    }

    /// An answer of veloxy's own to a request already prepared for forwarding (a
    /// forward_auth refusal).
    pub(crate) fn for_answer(
        worker: &Worker,
        answer: crate::exchange::Answer,
        p: &crate::downstream::connection::Prepared,
        record: Record,
    ) -> StaticReply {
        StaticReply::for_response(worker, answer.into_response(p.is_head), p, record)
    }

    fn build(
        worker: &Worker,
        response: crate::static_files::Response,
        to: ReplyTo,
        mut record: Record,
    ) -> StaticReply {
        let ReplyTo {
            version,
            is_head,
            keep_alive,
        } = to;
        let response = crate::exchange::with_error_page(&record, response);
        let mut head = Vec::new();
        write_head(&response, version, keep_alive, &mut head);
        if let Some(view) = crate::exchange::on_response(worker, &mut record, response.status) {
            // Edited before the blank line that ends the head.
            head.truncate(head.len() - 2);
            view.apply_h1(&mut head);
            head.extend_from_slice(b"\r\n");
        }
        StaticReply {
            response,
            keep_alive,
            head,
            record,
            version,
            is_head,
        }
    }

    /// Another answer to the same request (a refusal decided after the reply was made).
    pub(crate) fn replaced(self, worker: &Worker, answer: crate::exchange::Answer) -> StaticReply {
        let response = answer.into_response(self.is_head);
        let to = ReplyTo {
            version: self.version,
            is_head: self.is_head,
            keep_alive: self.keep_alive,
        };
        StaticReply::build(worker, response, to, self.record)
    }
}

/// Writes the reply, counts it, logs it. Returns whether the connection stays open.
pub(crate) async fn serve(worker: &Worker, down: &mut Downstream, mut reply: StaticReply) -> bool {
    let mut out = worker.take_vec();
    out.extend_from_slice(&reply.head);
    let status = reply.response.status;
    let limit = down.send_timeout;
    let result = match &mut down.stream {
        crate::tls::DownstreamIo::Plain(tcp) => {
            write_body(tcp, &mut out, &reply.response.body, limit).await
        }
        io => write_body_copied(io, &mut out, &reply.response.body, limit).await,
    };
    worker.give_vec(out);
    let (ok, written) = match result {
        Ok(n) => (true, n),
        Err((n, e)) => {
            tracing::debug!(client = %down.peer, error = %e, "static response cut short");
            (false, n)
        }
    };
    down.metrics.bytes_out.add(written);
    down.bytes_sent += written;
    crate::downstream::connection::finish_record(worker, down, &mut reply.record, status);
    ok && reply.keep_alive
}

thread_local! {
    /// The `Date` of the current second.
    static DATE: RefCell<(u64, http::HeaderValue)> =
        const { RefCell::new((u64::MAX, http::HeaderValue::from_static(""))) };
}

/// Calls `f` with the `Date` field's value now, formatted once a second per worker.
fn with_date<R>(f: impl FnOnce(&http::HeaderValue) -> R) -> R {
    let now = SystemTime::now();
    let secs = crate::static_files::conditional::secs(now);
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let text = httpdate::fmt_http_date(now);
            *d = (
                secs,
                http::HeaderValue::from_str(&text).expect("an HTTP date is ASCII"),
            );
        }
        f(&d.1)
    })
}

/// The `Date` field's value now.
pub(crate) fn date_value() -> http::HeaderValue {
    with_date(Clone::clone)
}

fn push_date(out: &mut Vec<u8>) {
    with_date(|date| {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(date.as_bytes());
        out.extend_from_slice(b"\r\n");
    });
}

/// Serializes the status line, the response's headers, `date`, `server` and the connection
/// headers, and the blank line.
pub(crate) fn write_head(r: &Response, version: u8, keep_alive: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa(u64::from(r.status)).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason(r.status).as_bytes());
    out.extend_from_slice(b"\r\n");
    // A stored answer keeps its upstream's Server and Date; everything else is veloxy's.
    let stored = |name: &[u8]| {
        r.raw[0].starts_with(&name[1..]) || memchr::memmem::find(&r.raw[0], name).is_some()
    };
    if !stored(b"\nserver:") {
        out.extend_from_slice(b"server: veloxy\r\n");
    }
    if !stored(b"\ndate:") {
        push_date(out);
    }
    for (name, value) in &r.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    for lines in &r.raw {
        out.extend_from_slice(lines);
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == 0 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

type WriteError = (u64, std::io::Error);

/// Sends `head` (already serialized in `out`) and the body. Returns the bytes written, or the
/// bytes written before the error.
async fn write_body(
    stream: &TcpStream,
    out: &mut Vec<u8>,
    body: &Body,
    limit: Duration,
) -> Result<u64, WriteError> {
    let mut written = 0u64;
    match body {
        Body::Empty => send(stream, out, false, &mut written, limit).await?,
        Body::Bytes(b) if b.len() <= COALESCE => {
            out.extend_from_slice(b);
            send(stream, out, false, &mut written, limit).await?;
        }
        // Head and body in one sendmsg: a large cached answer costs one syscall, not two.
        Body::Bytes(b) => send_two(stream, out, b, &mut written, limit).await?,
        Body::File { file, offset, len } => {
            send(stream, out, true, &mut written, limit).await?;
            sendfile(stream, file, *offset, *len, &mut written, limit).await?;
        }
        Body::Multipart(parts) => {
            for p in parts {
                match p {
                    Part::Bytes(b) => out.extend_from_slice(b),
                    Part::File { file, offset, len } => {
                        send(stream, out, true, &mut written, limit).await?;
                        out.clear();
                        sendfile(stream, file, *offset, *len, &mut written, limit).await?;
                    }
                }
            }
            send(stream, out, false, &mut written, limit).await?;
        }
    }
    Ok(written)
}

/// [`write_body`] for streams that cannot take `sendfile` (TLS): file bytes are read in
/// chunks and written through the stream.
async fn write_body_copied<S>(
    stream: &mut S,
    out: &mut Vec<u8>,
    body: &Body,
    limit: Duration,
) -> Result<u64, WriteError>
where
    S: tokio::io::AsyncWrite + Unpin,
{
    let mut written = 0u64;
    match body {
        Body::Empty => copy_out(stream, out, &mut written, limit).await?,
        Body::Bytes(b) => {
            out.extend_from_slice(b);
            copy_out(stream, out, &mut written, limit).await?;
        }
        Body::File { file, offset, len } => {
            copy_out(stream, out, &mut written, limit).await?;
            copy_file(stream, file, *offset, *len, &mut written, limit).await?;
        }
        Body::Multipart(parts) => {
            for p in parts {
                match p {
                    Part::Bytes(b) => out.extend_from_slice(b),
                    Part::File { file, offset, len } => {
                        copy_out(stream, out, &mut written, limit).await?;
                        out.clear();
                        copy_file(stream, file, *offset, *len, &mut written, limit).await?;
                    }
                }
            }
            copy_out(stream, out, &mut written, limit).await?;
        }
    }
    Ok(written)
}

pub(crate) async fn copy_out<S>(
    stream: &mut S,
    buf: &[u8],
    written: &mut u64,
    limit: Duration,
) -> Result<(), WriteError>
where
    S: tokio::io::AsyncWrite + Unpin,
{
    match timeout(limit, crate::tls::send_all(stream, buf)).await {
        Ok(Ok(())) => {
            *written += buf.len() as u64;
            Ok(())
        }
        Ok(Err(e)) => Err((*written, e)),
        Err(_) => Err((*written, std::io::ErrorKind::TimedOut.into())),
    }
}

/// Reads `len` bytes of `file` from `offset` in 64 KiB chunks (page-cache reads, as nginx does
/// without aio) and writes them to `stream`.
async fn copy_file<S>(
    stream: &mut S,
    file: &std::fs::File,
    offset: u64,
    len: u64,
    written: &mut u64,
    limit: Duration,
) -> Result<(), WriteError>
where
    S: tokio::io::AsyncWrite + Unpin,
{
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut pos, end) = (offset, offset + len);
    while pos < end {
        let want = ((end - pos) as usize).min(buf.len());
        let n = file
            .read_at(&mut buf[..want], pos)
            .map_err(|e| (*written, e))?;
        if n == 0 {
            return Err((*written, std::io::ErrorKind::UnexpectedEof.into()));
        }
        copy_out(stream, &buf[..n], written, limit).await?;
        pos += n as u64;
    }
    Ok(())
}

/// Writes all of `buf`, with `MSG_MORE` when more data follows at once.
async fn send(
    stream: &TcpStream,
    mut buf: &[u8],
    more: bool,
    written: &mut u64,
    limit: Duration,
) -> Result<(), WriteError> {
    let flags = libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    let fd = stream.as_raw_fd();
    while !buf.is_empty() {
        let io = stream.async_io(Interest::WRITABLE, || {
            // SAFETY: `buf` is a live slice; `fd` is the stream's open socket.
            let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), flags) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match timeout(limit, io).await {
            Ok(Ok(n)) => {
                buf = &buf[n..];
                *written += n as u64;
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err((*written, e)),
            Err(_) => return Err((*written, std::io::ErrorKind::TimedOut.into())),
        }
    }
    Ok(())
}

/// Sends `head` then `body` with vectored writes (`sendmsg` of two iovecs), waiting for
/// writability between partial sends.
async fn send_two(
    stream: &TcpStream,
    head: &[u8],
    body: &[u8],
    written: &mut u64,
    limit: Duration,
) -> Result<(), WriteError> {
    let fd = stream.as_raw_fd();
    let total = head.len() + body.len();
    let mut done = 0usize;
    while done < total {
        let (h, b) = if done < head.len() {
            (&head[done..], body)
        } else {
            (&head[..0], &body[done - head.len()..])
        };
        let io = stream.async_io(Interest::WRITABLE, || {
            let mut iov = [
                libc::iovec {
                    iov_base: h.as_ptr() as *mut libc::c_void,
                    iov_len: h.len(),
                },
                libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                },
            ];
            // SAFETY: a zeroed msghdr is valid; it points at `iov`, which outlives the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = 2;
            // SAFETY: `fd` is the stream's open socket; the iovecs point at live slices.
            let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match timeout(limit, io).await {
            Ok(Ok(n)) => {
                done += n;
                *written += n as u64;
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err((*written, e)),
            Err(_) => return Err((*written, std::io::ErrorKind::TimedOut.into())),
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` with `sendfile(2)`, waiting for writability
/// between partial sends. A file that shrank under us ends the response with an error (the
/// promised Content-Length cannot be met; the caller closes the connection).
async fn sendfile(
    stream: &TcpStream,
    file: &std::fs::File,
    offset: u64,
    len: u64,
    written: &mut u64,
    limit: Duration,
) -> Result<(), WriteError> {
    let (sock, fd) = (stream.as_raw_fd(), file.as_raw_fd());
    let mut off = offset as libc::off_t;
    let end = offset + len;
    while (off as u64) < end {
        let count = ((end - off as u64).min(1 << 30)) as usize;
        let io = stream.async_io(Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the duration; `off` is a valid pointer.
            let n = unsafe { libc::sendfile(sock, fd, &mut off, count) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match timeout(limit, io).await {
            Ok(Ok(0)) => {
                return Err((*written, std::io::ErrorKind::UnexpectedEof.into()));
            }
            Ok(Ok(n)) => *written += n as u64,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err((*written, e)),
            Err(_) => return Err((*written, std::io::ErrorKind::TimedOut.into())),
        }
    }
    Ok(())
}
