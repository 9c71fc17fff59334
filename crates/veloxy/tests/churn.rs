//! Backend churn through the runtime API (issue 36): a group of 1,000 live backends drained,
//! enabled and replaced thousands of times at up to 1,000 changes a second while clients
//! send requests, and not one request fails. The backends are 1,024 listening sockets of this
//! test (each answers with its own index), so every backend a change brings in is real.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use veloxy_testkit::*;

/// Backends listed in the group at any time.
const GROUP: usize = 1_000;
/// Listening sockets: the group's, and spares that a replacement brings in.
const SOCKETS: usize = 1_024;
/// Changes made by the churn (drains, enables, replacements of the whole set).
const CHANGES: usize = 3_000;

/// Answers every HTTP/1.1 request on `SOCKETS` listeners (keep-alive) with `200` and the
/// listener's index as `X-Upstream: bN` and body. Runs on its own thread until the process
/// ends; returns the addresses.
fn origins() -> Vec<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut addrs = Vec::new();
            for i in 0..SOCKETS {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addrs.push(l.local_addr().unwrap());
                tokio::spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        tokio::spawn(serve(s, i));
                    }
                });
            }
            tx.send(addrs).unwrap();
            std::future::pending::<()>().await
        })
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

/// One connection: answers each request head (no bodies in this test) until the peer closes.
async fn serve(mut s: tokio::net::TcpStream, i: usize) {
    let answer = format!(
        "HTTP/1.1 200 OK\r\nX-Upstream: b{i}\r\nContent-Length: {}\r\n\r\nb{i}",
        format!("b{i}").len()
    );
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            if s.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The JSON list of the group's servers: `GROUP` sockets from `start` (wrapping).
fn set_json(addrs: &[SocketAddr], start: usize) -> String {
    let list: Vec<String> = (0..GROUP)
        .map(|k| format!("\"{}\"", addrs[(start + k) % SOCKETS]))
        .collect();
    format!("[{}]", list.join(","))
}

#[test]
fn a_thousand_changes_a_second_fail_no_request() {
    let addrs = origins();
    let servers: Vec<String> = addrs[..GROUP].iter().map(|a| format!("\"{a}\"")).collect();
    let config = format!(
        "[server]\nworkers = 2\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [{}]\n",
        servers.join(", ")
    );
    let v = veloxy(&config);
    let web = logged_addr(&v, "listening listener=web addr=");
    assert_eq!(get(web, "/").status, 200);

    // Two clients in a loop (60 s at most) until the churn ends.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (stop, served, failures) = (stop.clone(), served.clone(), failures.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                    let r = get(web, "/");
                    if r.status == 200 && r.header("x-upstream").is_some() {
                        served.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{} {}", r.status, r.body_str()));
                    }
                }
            })
        })
        .collect();

    // The churn, paced at 1,000 changes a second at most: every tenth change replaces the
    // whole set (the window of sockets moves by one: one backend out, one in); the others
    // drain a backend of the current set and enable it again on the next change.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(40);
    let mut start = 0;
    let mut last_drained = None::<SocketAddr>;
    for k in 0..CHANGES {
        let due = started + Duration::from_millis(k as u64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        assert!(
            Instant::now() < deadline,
            "the churn took over 40 s ({k} changes)"
        );
        let r = if k % 10 == 9 {
            start = (start + 1) % SOCKETS;
            last_drained = None;
            admin_call(
                &v,
                "PUT",
                "/upstreams/app/servers",
                &set_json(&addrs, start),
            )
        } else if let Some(a) = last_drained.take() {
            admin_call(
                &v,
                "POST",
                &format!("/upstreams/app/servers/{a}/enable"),
                "",
            )
        } else {
            let a = addrs[(start + (k * 37) % GROUP) % SOCKETS];
            last_drained = Some(a);
            admin_call(&v, "POST", &format!("/upstreams/app/servers/{a}/drain"), "")
        };
        assert_eq!(r.status, 200, "change {k}: {}", r.body_str());
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    let served = served.load(Ordering::Relaxed);
    eprintln!(
        "{CHANGES} changes in {:.2} s ({:.0} a second), {served} requests served, {} failed",
        took.as_secs_f64(),
        CHANGES as f64 / took.as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "failed requests: {:?}",
        &failures[..failures.len().min(10)]
    );
    assert!(
        served >= 100,
        "only {served} requests were served during the churn"
    );

    // The last set is the one served: a set of three takes every request from the next one on.
    let three = format!("[\"{}\", \"{}\", \"{}\"]", addrs[5], addrs[6], addrs[7]);
    let r = admin_call(&v, "PUT", "/upstreams/app/servers", &three);
    assert_eq!(r.status, 200, "{}", r.body_str());
    let settled = eventually(Duration::from_secs(5), || {
        (0..30).all(|_| {
            let up = get(web, "/").header("x-upstream").unwrap_or("").to_owned();
            ["b5", "b6", "b7"].contains(&up.as_str())
        })
    });
    assert!(settled, "requests still go outside the set of three");
}
