//! Interim responses and `103 Early Hints`, through real processes: a 103 an HTTP/1.1
//! upstream sends before its 200 reaches HTTP/1.1 clients (raw socket and `curl -v`), without
//! its hop-by-hop fields; HTTP/1.0 clients get none; `Expect: 100-continue` is answered as
//! before (one 100, veloxy's); a route with `early_hints = true` sends a 103 itself from the
//! preload/preconnect Link fields of the path's last 200 answer (not from a 404).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use veloxy_testkit::*;

const LINK: &str = "</style.css>; rel=preload; as=style";

/// An HTTP/1.1 upstream that answers every request with, first, a 103 (with a Link field and
/// a hop-by-hop field), then after a short wait a 200 with `body`, on one connection per
/// request (`Connection: close`).
fn hinting_upstream(body: &'static str) -> SocketAddr {
    raw_upstream(Duration::from_millis(50), move |_| {
        vec![
            format!("HTTP/1.1 103 Early Hints\r\nLink: {LINK}\r\nKeep-Alive: timeout=5\r\n\r\n"),
            final_answer("text/plain", body),
        ]
    })
}

/// A 200 with `body` that closes its connection.
fn final_answer(content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// An HTTP/1.1 upstream writing the parts `answer` makes of each request's target, `gap`
/// apart (the last one a final answer that closes the connection).
fn raw_upstream(
    gap: Duration,
    answer: impl Fn(&str) -> Vec<String> + Send + Sync + 'static,
) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for s in l.incoming().take(64) {
            let Ok(mut s) = s else { continue };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                    if s.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8_lossy(&head);
                let target = head.split(' ').nth(1).unwrap_or("/");
                for (i, part) in answer(target).iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(gap);
                    }
                    let _ = s.write_all(part.as_bytes());
                    let _ = s.flush();
                }
            });
        }
    });
    addr
}

fn config(upstream: SocketAddr, route: &str) -> String {
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"app\"\n{route}\n\
         [upstreams.app]\nservers = [\"{upstream}\"]\n"
    )
}

/// Sends `raw` and reads everything until the connection closes (bounded by a timeout).
fn exchange(addr: SocketAddr, raw: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn an_upstream_103_reaches_http11_clients_before_the_final_head() {
    let up = hinting_upstream("page");
    let v = veloxy(&config(up, ""));
    let got = exchange(
        v.addr,
        "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    let expected = format!("HTTP/1.1 103 Early Hints\r\nLink: {LINK}\r\n\r\nHTTP/1.1 200 OK\r\n");
    assert!(got.starts_with(&expected), "{got}");
    assert!(
        !got.contains("Keep-Alive: timeout"),
        "hop-by-hop field forwarded: {got}"
    );
    assert!(got.ends_with("\r\n\r\npage"), "{got}");
}

#[test]
fn http10_clients_get_no_interim_response() {
    let up = hinting_upstream("page");
    let v = veloxy(&config(up, ""));
    let got = exchange(v.addr, "GET / HTTP/1.0\r\nHost: a\r\n\r\n");
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(!got.contains("103"), "{got}");
    assert!(got.ends_with("page"), "{got}");
}

#[test]
fn expect_continue_is_answered_once_by_veloxy() {
    // An upstream that answers its own 100 Continue first: veloxy's is the only one the
    // client sees (before its body), then the upstream's 103 and 200.
    let up = hinting_upstream("posted");
    let v = veloxy(&config(up, ""));
    let mut s = TcpStream::connect(v.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\
          Connection: close\r\n\r\n",
    )
    .unwrap();
    let mut first = [0u8; 25];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"body").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let rest = String::from_utf8_lossy(&rest);
    assert!(!rest.contains("100 Continue"), "{rest}");
    assert!(rest.starts_with("HTTP/1.1 103 Early Hints\r\n"), "{rest}");
    assert!(rest.ends_with("posted"), "{rest}");
}

#[test]
fn curl_shows_the_103_over_http11() {
    if !require("curl", "--version", "curl is not installed") {
        return;
    }
    let up = hinting_upstream("page");
    let v = veloxy(&config(up, ""));
    let out = std::process::Command::new("curl")
        .args(["-sv", "--http1.1", "--max-time", "10"])
        .arg(format!("http://{}/", v.addr))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let i103 = err.find("< HTTP/1.1 103 Early Hints").expect(&err);
    let i200 = err.find("< HTTP/1.1 200 OK").expect(&err);
    assert!(i103 < i200, "{err}");
    assert!(err.contains(&format!("< Link: {LINK}")), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "page");
}

/// An origin whose `/page` answers 200 with preload, preconnect and other Link fields, and
/// `/missing` 404 with a preload Link field; it sends no 103 of its own.
fn linking_origin() -> ScriptOrigin {
    script_origin(|r| {
        let (status, body) = match r.path() {
            "/missing" => (404, "no"),
            _ => (200, "page"),
        };
        let mut s = Scripted::ok(body)
            .header(
                "link",
                "</app.js>; rel=preload; as=script, </next>; rel=next",
            )
            .header("link", "<https://cdn.example>; rel=preconnect");
        s.status = status;
        s
    })
}

#[test]
fn early_hints_route_sends_the_last_200s_links_before_asking_the_upstream() {
    let o = linking_origin();
    let v = veloxy(&config(o.addr, "early_hints = true"));
    let get = |path: &str| {
        exchange(
            v.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        )
    };
    let first = get("/page?v=1");
    assert!(first.starts_with("HTTP/1.1 200 "), "no 103 yet: {first}");
    let second = get("/page?v=2");
    let hints = "HTTP/1.1 103 Early Hints\r\nLink: </app.js>; rel=preload; as=script\r\n\
                 Link: <https://cdn.example>; rel=preconnect\r\n\r\nHTTP/1.1 200 ";
    assert!(second.starts_with(hints), "{second}");
    // A 404 teaches nothing, and HTTP/1.0 clients get no 103.
    assert!(get("/missing").starts_with("HTTP/1.1 404"));
    let again = get("/missing");
    assert!(again.starts_with("HTTP/1.1 404"), "{again}");
    let old = exchange(v.addr, "GET /page HTTP/1.0\r\nHost: a\r\n\r\n");
    assert!(old.starts_with("HTTP/1.1 200 "), "{old}");
    // Other methods get none.
    let head = exchange(
        v.addr,
        "HEAD /page HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
}

#[test]
fn without_early_hints_the_route_sends_none() {
    let o = linking_origin();
    let v = veloxy(&config(o.addr, ""));
    for _ in 0..2 {
        let got = exchange(
            v.addr,
            "GET /page HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
    }
}

/// Sends `req` over HTTP/3 and reads every head up to the final one: the statuses and Link
/// fields of each, then the body.
async fn h3_heads(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
    req: http::Request<()>,
) -> (Vec<(u16, Vec<String>)>, String) {
    use bytes::Buf;
    let mut stream = send.send_request(req).await.unwrap();
    stream.finish().await.unwrap();
    let mut heads = Vec::new();
    for _ in 0..4 {
        let res = stream.recv_response().await.unwrap();
        let links = res.headers().get_all("link").iter();
        let links = links.map(|v| v.to_str().unwrap().to_owned()).collect();
        heads.push((res.status().as_u16(), links));
        if res.status().as_u16() >= 200 {
            break;
        }
    }
    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    (heads, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn http3_clients_get_the_upstreams_103_and_the_routes_early_hints() {
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let (up, o) = (hinting_upstream("page"), linking_origin());
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\npath = \"/hinted/\"\nupstream = \"linking\"\nearly_hints = true\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"{up}\"]\n[upstreams.linking]\nservers = [\"{}\"]\n",
        cert.display(),
        key.display(),
        o.addr
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    runtime().block_on(async {
        let mut c = h3_connect(web, "localhost", &pki.ca_pem).await.unwrap();
        let (heads, body) = h3_heads(&mut c, h3_get("localhost", "/")).await;
        assert_eq!(heads, [(103, vec![LINK.to_owned()]), (200, vec![])]);
        assert_eq!(body, "page");
        let (heads, _) = h3_heads(&mut c, h3_get("localhost", "/hinted/a")).await;
        assert_eq!(
            heads.len(),
            1,
            "no 103 before the path's first 200: {heads:?}"
        );
        let (heads, body) = h3_heads(&mut c, h3_get("localhost", "/hinted/a")).await;
        let hints = vec![
            "</app.js>; rel=preload; as=script".to_owned(),
            "<https://cdn.example>; rel=preconnect".to_owned(),
        ];
        assert_eq!(heads[0], (103, hints), "{heads:?}");
        assert_eq!((heads.len(), heads[1].0, body.as_str()), (2, 200, "page"));
    });
}

#[test]
fn http2_clients_get_the_final_answer_without_the_103() {
    // hyper's HTTP/2 server cannot send an informational response: the 103 is dropped, the
    // answer is whole.
    let up = hinting_upstream("page");
    let v = veloxy(&config(up, ""));
    let r = runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        h2_send(&mut c, h2_get("a", "/", false), None)
            .await
            .unwrap()
    });
    assert_eq!((r.status, r.body_str().as_str()), (200, "page"));
}

/// The SHA-256 of the certificate's public key, base64 (Chromium's
/// `--ignore-certificate-errors-spki-list`, which QUIC connections need to accept it).
fn spki_hash(cert: &std::path::Path) -> Option<String> {
    let script = format!(
        "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der \
         | openssl dgst -sha256 -binary | base64",
        cert.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .ok()?;
    let hash = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !hash.is_empty()).then_some(hash)
}

/// Runs headless Chromium on `url` with a net log into `netlog`, at most 60 s.
fn chromium(
    url: &str,
    (port, spki): (u16, &str),
    profile: &std::path::Path,
    netlog: &std::path::Path,
) {
    let mut child = std::process::Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--ignore-certificate-errors",
            &format!("--ignore-certificate-errors-spki-list={spki}"),
            "--host-resolver-rules=MAP localhost 127.0.0.1",
            "--enable-quic",
            &format!("--origin-to-force-quic-on=localhost:{port}"),
            &format!("--user-data-dir={}", profile.display()),
            &format!("--log-net-log={}", netlog.display()),
            "--dump-dom",
            url,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("chromium starts");
    let done = eventually(Duration::from_secs(60), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !done {
        let _ = child.kill();
        let _ = child.wait();
        panic!("chromium did not finish within 60 s");
    }
}

/// One event of a Chromium net log: time (ms), source id, type name, params.
type NetEvent = (u64, u64, String, serde_json::Value);

fn net_events(netlog: &std::path::Path) -> Vec<NetEvent> {
    let log: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(netlog).unwrap()).unwrap();
    let names: std::collections::HashMap<u64, String> = log["constants"]["logEventTypes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (v.as_u64().unwrap(), k.clone()))
        .collect();
    let events = log["events"].as_array().unwrap().iter();
    events
        .map(|e| {
            let time = e["time"].as_str().and_then(|t| t.parse().ok()).unwrap_or(0);
            let kind = names
                .get(&e["type"].as_u64().unwrap())
                .cloned()
                .unwrap_or_default();
            (
                time,
                e["source"]["id"].as_u64().unwrap_or(0),
                kind,
                e["params"].clone(),
            )
        })
        .collect()
}

/// The style sheet's type, and a lifetime so the page can use the preloaded copy.
const CSS: &str = "text/css\r\nCache-Control: max-age=60";

const PAGE: &str = "<!doctype html><html><head><link rel=\"stylesheet\" href=\"/style.css\">\
                    </head><body>hinted</body></html>";

/// A TLS listener with HTTP/2 and HTTP/3 in front of `up` (`route`: more keys of the route),
/// and Chromium's SPKI hash of its certificate; `None` (the test reported skipped) without
/// chromium or openssl.
fn browser_site(
    up: SocketAddr,
    route: &str,
) -> Option<(Veloxy, SocketAddr, String, tempfile::TempDir)> {
    if !require("chromium", "--version", "chromium is not installed")
        || !require("openssl", "version", "openssl is not installed")
    {
        return None;
    }
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let Some(spki) = spki_hash(&cert) else {
        skip("openssl could not hash the certificate's key");
        return None;
    };
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\nhttp3 = true\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"app\"\n{route}\n[upstreams.app]\nservers = [\"{up}\"]\n",
        cert.display(),
        key.display(),
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    Some((v, web, spki, certs))
}

/// Loads `https://localhost:PORT/` in Chromium (a fresh profile) and checks its net log: a
/// 103 with the style sheet's preload came over HTTP/3 and reached the page's request, and
/// the preload started before the page's final head. Returns the times (ms) of the three.
fn load_and_check(
    web: SocketAddr,
    spki: &str,
    dir: &std::path::Path,
    run: &str,
) -> (u64, u64, u64) {
    let netlog = dir.join(format!("netlog-{run}.json"));
    let url = format!("https://localhost:{}/", web.port());
    chromium(
        &url,
        (web.port(), spki),
        &dir.join(format!("profile-{run}")),
        &netlog,
    );
    let events = net_events(&netlog);
    let has = |p: &serde_json::Value, text: &str| p.to_string().contains(text);
    // The 103 came over HTTP/3 (QPACK-decoded HEADERS on the QUIC session) ...
    let over_h3 = events.iter().find(|(_, _, kind, p)| {
        kind == "HTTP3_HEADERS_DECODED" && has(p, ":status: 103") && has(p, "rel=preload")
    });
    assert!(
        over_h3.is_some(),
        "{run}: no 103 HEADERS over HTTP/3 in the net log"
    );
    // ... and reached the page's request as Early Hints,
    let (t103, page, _, _) = events
        .iter()
        .find(|(_, _, kind, p)| {
            kind == "HTTP_TRANSACTION_READ_EARLY_HINTS_RESPONSE_HEADERS" && has(p, "style.css")
        })
        .expect("the page's request read no Early Hints");
    let t200 = events
        .iter()
        .find(|(_, src, kind, _)| src == page && kind == "HTTP_TRANSACTION_READ_RESPONSE_HEADERS")
        .map(|e| e.0)
        .expect("the page's final head");
    // ... whose preload started before the page's final head arrived.
    let preload = events.iter().find(|(t, _, kind, p)| {
        kind == "URL_REQUEST_START_JOB" && has(p, "/style.css") && t >= t103
    });
    let tpre = preload.expect("no request for the preloaded style sheet").0;
    assert!(
        tpre < t200,
        "{run}: preload at {tpre} ms, page at {t200} ms"
    );
    // The page used the preloaded copy: the style sheet crossed the network once.
    let fetched = events.iter().filter(|(_, _, kind, p)| {
        kind == "HTTP3_HEADERS_DECODED" && has(p, "content-type: text/css")
    });
    assert_eq!(
        fetched.count(),
        1,
        "{run}: the style sheet was fetched again"
    );
    eprintln!(
        "{run}: 103 at {t103} ms, preload of /style.css at {tpre} ms, page's 200 at {t200} ms"
    );
    (*t103, tpre, t200)
}

#[test]
fn chromium_receives_an_upstreams_early_hints_over_http3_and_preloads_before_the_page() {
    // The page's 200 comes 700 ms after its 103: the preload starts in between.
    let up = raw_upstream(Duration::from_millis(700), |target| match target {
        "/style.css" => vec![final_answer(CSS, "body { color: teal }")],
        _ => vec![
            format!("HTTP/1.1 103 Early Hints\r\nLink: {LINK}\r\n\r\n"),
            final_answer("text/html", PAGE),
        ],
    });
    let Some((_v, web, spki, dir)) = browser_site(up, "") else {
        return;
    };
    load_and_check(web, &spki, dir.path(), "upstream-103");
}

#[test]
fn chromium_receives_the_early_hints_veloxy_learned_on_its_second_visit() {
    // No 103 from this upstream: the page's 200 (after 700 ms) carries the Link field.
    let up = raw_upstream(Duration::from_millis(700), |target| match target {
        "/style.css" => vec![final_answer(CSS, "body { color: teal }")],
        _ => vec![
            String::new(),
            final_answer("text/html", PAGE).replacen("\r\n", &format!("\r\nLink: {LINK}\r\n"), 1),
        ],
    });
    let Some((_v, web, spki, dir)) = browser_site(up, "early_hints = true") else {
        return;
    };
    // The first visit teaches veloxy the Link field (Chromium sees no 103 then) ...
    let netlog = dir.path().join("netlog-first.json");
    let url = format!("https://localhost:{}/", web.port());
    chromium(
        &url,
        (web.port(), &spki),
        &dir.path().join("profile-first"),
        &netlog,
    );
    let first = net_events(&netlog);
    assert!(
        !first
            .iter()
            .any(|(_, _, kind, _)| kind == "HTTP_TRANSACTION_READ_EARLY_HINTS_RESPONSE_HEADERS"),
        "Early Hints on the first visit"
    );
    // ... the second gets it in veloxy's own 103, before the upstream answers.
    load_and_check(web, &spki, dir.path(), "learned-103");
}

#[test]
fn response_rules_leave_the_103_alone() {
    let up = hinting_upstream("page");
    let v = veloxy(&config(
        up,
        "response_headers = { add = { \"X-Rule\" = \"on\" } }",
    ));
    let got = exchange(
        v.addr,
        "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    let (interim, last) = got.split_once("HTTP/1.1 200 OK\r\n").expect(&got);
    assert_eq!(
        interim,
        format!("HTTP/1.1 103 Early Hints\r\nLink: {LINK}\r\n\r\n")
    );
    assert!(last.to_ascii_lowercase().contains("x-rule: on"), "{got}");
}

#[test]
fn a_cache_fill_passes_the_103_through_and_stores_the_final_answer_only() {
    let up = hinting_upstream("cached page");
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [caches.main]\nmemory = \"4MiB\"\ncache_status_header = \"X-Cache-Status\"\n\
         [[routes]]\nupstream = \"app\"\ncache = {{ store = \"main\", default_ttl = \"1m\" }}\n\
         [upstreams.app]\nservers = [\"{up}\"]\n"
    ));
    let get = || {
        exchange(
            v.addr,
            "GET /c HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
    };
    let first = get();
    // The client whose request fills gets the upstream's 103 (RFC 9110 15.2: a proxy
    // forwards interim responses), then the 200.
    assert!(first.starts_with("HTTP/1.1 103 "), "{first}");
    assert!(first.contains("\r\n\r\nHTTP/1.1 200 OK\r\n"), "{first}");
    assert!(first.ends_with("cached page"), "{first}");
    let hit = get();
    assert!(hit.starts_with("HTTP/1.1 200 OK\r\n"), "{hit}");
    assert!(hit.contains("X-Cache-Status: HIT"), "{hit}");
    assert!(hit.ends_with("\r\n\r\ncached page"), "{hit}");
}

#[test]
fn a_reload_turns_early_hints_on() {
    let o = linking_origin();
    let v = veloxy(&config(o.addr, ""));
    let get = || {
        exchange(
            v.addr,
            "GET /page HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
    };
    assert!(get().starts_with("HTTP/1.1 200 "));
    assert!(get().starts_with("HTTP/1.1 200 "));
    reload_with(&v, &config(o.addr, "early_hints = true"), "reloaded");
    assert!(
        get().starts_with("HTTP/1.1 200 "),
        "a fresh memory after the reload"
    );
    let hinted = get();
    assert!(
        hinted.starts_with("HTTP/1.1 103 Early Hints\r\n"),
        "{hinted}"
    );
    reload_with(&v, &config(o.addr, ""), "reloaded");
    assert!(get().starts_with("HTTP/1.1 200 "));
}
