//! The built-in default of `veloxy run` without a config: two tiny demo backends on ephemeral
//! loopback ports, and a listener on 127.0.0.1:8080 that balances over them. Each backend
//! answers every request with a short JSON naming itself and echoing what the proxy added
//! (`X-Forwarded-For`), so `curl` shows the load balancing at work.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Starts `n` demo backends on a background thread; returns their addresses.
pub fn start_backends(n: usize) -> std::io::Result<Vec<SocketAddr>> {
    let mut listeners = Vec::new();
    for _ in 0..n {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.set_nonblocking(true)?;
        listeners.push(l);
    }
    let addrs = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::Builder::new()
        .name("veloxy-demo".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(_) => return,
            };
            rt.block_on(async move {
                let mut tasks = Vec::new();
                for (i, l) in listeners.into_iter().enumerate() {
                    if let Ok(l) = tokio::net::TcpListener::from_std(l) {
                        tasks.push(tokio::spawn(backend(l, format!("demo-{}", i + 1))));
                    }
                }
                for t in tasks {
                    let _ = t.await;
                }
            });
        })?;
    Ok(addrs)
}

async fn backend(listener: tokio::net::TcpListener, name: String) {
    while let Ok((mut s, _)) = listener.accept().await {
        let name = name.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            let mut have = 0;
            loop {
                let n = match s.read(&mut buf[have..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                have += n;
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut req = httparse::Request::new(&mut headers);
                let len = match req.parse(&buf[..have]) {
                    Ok(httparse::Status::Complete(len)) => len,
                    Ok(httparse::Status::Partial) if have < buf.len() => continue,
                    _ => return,
                };
                let xff = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("x-forwarded-for"))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
                    .unwrap_or_default();
                let body = format!(
                    "{{\"backend\":\"{name}\",\"method\":\"{}\",\"path\":{:?},\"x_forwarded_for\":{:?}}}\n",
                    req.method.unwrap_or(""),
                    req.path.unwrap_or(""),
                    xff
                );
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-upstream: {name}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
                // Demo requests carry no bodies worth reading; drop what was parsed.
                buf.copy_within(len..have, 0);
                have -= len;
            }
        });
    }
}

/// The default config, as TOML, for the demo backends.
pub fn default_config(backends: &[SocketAddr]) -> String {
    let servers: Vec<String> = backends.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[listeners.web]\naddr = \"127.0.0.1:8080\"\n\n[[routes]]\nupstream = \"demo\"\n\n[upstreams.demo]\nservers = [{}]\n",
        servers.join(", ")
    )
}
