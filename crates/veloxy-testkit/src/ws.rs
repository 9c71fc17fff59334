//! A WebSocket echo server, the upstream of WebSocket tests.

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};

use crate::runtime;

/// A WebSocket echo server on its own thread; answers every message with the same message.
pub fn ws_echo_server() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                        return;
                    };
                    while let Some(Ok(m)) = ws.next().await {
                        if m.is_close() {
                            // Sends the close answer tungstenite queued (RFC 6455 5.5.1).
                            let _ = ws.flush().await;
                            break;
                        }
                        if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    });
    addr
}
