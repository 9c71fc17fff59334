//! The same minimal HTTP/1.1 keep-alive reverse proxy loop on two I/O layers, to price what
//! io_uring would save veloxy's HTTP/1 path (issue 18):
//!
//! `uring-experiment epoll|uring LISTEN UPSTREAM`: one thread; each client connection gets
//! its own keep-alive upstream connection; a request head (GET, no body) is forwarded as it
//! is, the answer (Content-Length framed) sent back as it is. No parsing beyond framing, no
//! header edits: what is left is the syscalls and wake-ups of each layer, nothing else.
//!
//! epoll: tokio's current-thread runtime (readiness, then read/write syscalls).
//! uring: tokio-uring (each read and write a submission; the ring is entered once per batch).

use std::net::SocketAddr;

const BUF: usize = 16 * 1024;

/// The end of the head in `buf[..n]`, and the Content-Length it declares.
fn framing(buf: &[u8]) -> Option<(usize, usize)> {
    let end = memchr::memmem::find(buf, b"\r\n\r\n")? + 4;
    let head = &buf[..end];
    let mut len = 0;
    for line in head.split(|b| *b == b'\n') {
        if line.len() > 15 && line[..15].eq_ignore_ascii_case(b"content-length:") {
            len = std::str::from_utf8(&line[15..]).ok()?.trim().parse().ok()?;
        }
    }
    Some((end, len))
}

mod epoll {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    pub fn run(listen: SocketAddr, upstream: SocketAddr) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let l = TcpListener::bind(listen).await.unwrap();
            loop {
                let (c, _) = l.accept().await.unwrap();
                let _ = c.set_nodelay(true);
                tokio::task::spawn_local(async move {
                    let _ = serve(c, upstream).await;
                });
            }
        });
    }

    async fn serve(mut c: TcpStream, upstream: SocketAddr) -> std::io::Result<()> {
        let mut u = TcpStream::connect(upstream).await?;
        u.set_nodelay(true)?;
        let mut buf = vec![0u8; BUF];
        loop {
            let mut n = 0;
            while memchr::memmem::find(&buf[..n], b"\r\n\r\n").is_none() {
                let r = c.read(&mut buf[n..]).await?;
                if r == 0 {
                    return Ok(());
                }
                n += r;
            }
            u.write_all(&buf[..n]).await?;
            let mut n = 0;
            loop {
                let r = u.read(&mut buf[n..]).await?;
                if r == 0 {
                    return Ok(());
                }
                n += r;
                if let Some((end, len)) = framing(&buf[..n]) {
                    if n >= end + len {
                        break;
                    }
                }
            }
            c.write_all(&buf[..n]).await?;
        }
    }
}

mod uring {
    use super::*;
    use tokio_uring::buf::BoundedBuf;
    use tokio_uring::net::{TcpListener, TcpStream};

    pub fn run(listen: SocketAddr, upstream: SocketAddr) {
        tokio_uring::start(async move {
            let l = TcpListener::bind(listen).unwrap();
            loop {
                let (c, _) = l.accept().await.unwrap();
                let _ = c.set_nodelay(true);
                tokio_uring::spawn(async move {
                    let _ = serve(c, upstream).await;
                });
            }
        });
    }

    async fn serve(c: TcpStream, upstream: SocketAddr) -> std::io::Result<()> {
        let u = TcpStream::connect(upstream).await?;
        u.set_nodelay(true)?;
        let mut buf = vec![0u8; BUF];
        loop {
            let mut n = 0;
            while memchr::memmem::find(&buf[..n], b"\r\n\r\n").is_none() {
                let (r, b) = c.read(buf.slice(n..)).await;
                buf = b.into_inner();
                let r = r?;
                if r == 0 {
                    return Ok(());
                }
                n += r;
            }
            let (r, b) = u.write_all(buf.slice(..n)).await;
            buf = b.into_inner();
            r?;
            let mut n = 0;
            loop {
                let (r, b) = u.read(buf.slice(n..)).await;
                buf = b.into_inner();
                let r = r?;
                if r == 0 {
                    return Ok(());
                }
                n += r;
                if let Some((end, len)) = framing(&buf[..n]) {
                    if n >= end + len {
                        break;
                    }
                }
            }
            let (r, b) = c.write_all(buf.slice(..n)).await;
            buf = b.into_inner();
            r?;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: uring-experiment epoll|uring LISTEN UPSTREAM");
        std::process::exit(2);
    }
    let (listen, upstream) = (args[2].parse().unwrap(), args[3].parse().unwrap());
    match args[1].as_str() {
        "epoll" => epoll::run(listen, upstream),
        "uring" => uring::run(listen, upstream),
        other => panic!("unknown mode {other}"),
    }
}
