//! Helpers shared by tests/cache.rs and tests/cache_stale.rs (included with `#[path]`): a
//! veloxy with one cached route in front of a [`ScriptOrigin`], and one request over HTTP/1.1
//! or HTTP/2 (h2c, prior knowledge) read into the kit's [`Response`].

#![allow(dead_code)]

use std::time::Duration;

use veloxy_testkit::*;

/// Bound on any one exchange.
pub const WAIT: Duration = Duration::from_secs(20);

/// Sleep that takes a `max-age=1` response past its freshness, whatever the cache's clock
/// granularity (up to a second).
pub const PAST_ONE_SECOND: Duration = Duration::from_millis(1500);

/// What [`start_with`] puts in the config besides the defaults.
#[derive(Default)]
pub struct Setup<'a> {
    /// `[server] workers` (0: 1).
    pub workers: usize,
    /// Extra lines after `[caches.main]`'s keys (more keys, or further sections).
    pub caches: &'a str,
    /// Extra entries of the default route's `cache = { store = "main", ... }`.
    pub route: &'a str,
    /// Further `[[routes]]` tables.
    pub routes: &'a str,
}

/// The config: an admin endpoint, listener `web` (HTTP/1.1 and h2c), cache `main` (64 MiB,
/// objects up to 1 MiB) and the catch-all route to `origin` through it.
pub fn cache_config(origin: &ScriptOrigin, s: &Setup) -> String {
    let route = if s.route.is_empty() {
        String::new()
    } else {
        format!(", {}", s.route)
    };
    format!(
        "[server]\nworkers = {workers}\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [caches.main]\nmemory = \"64MiB\"\nmax_object = \"1MiB\"\n{caches}\n\
         {routes}\n\
         [[routes]]\nupstream = \"app\"\ncache = {{ store = \"main\"{route} }}\n\
         [upstreams.app]\nservers = [\"{addr}\"]\n",
        workers = s.workers.max(1),
        caches = s.caches,
        routes = s.routes,
        addr = origin.addr,
    )
}

/// veloxy in front of `origin`; `route`: extra entries of the route's `cache = { .. }`
/// (`""`, or e.g. `default_ttl = "30s"`).
pub fn start(origin: &ScriptOrigin, route: &str) -> Veloxy {
    start_with(
        origin,
        Setup {
            route,
            ..Setup::default()
        },
    )
}

pub fn start_with(origin: &ScriptOrigin, s: Setup) -> Veloxy {
    veloxy(&cache_config(origin, &s))
}

/// How a request reaches veloxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

/// One request with no body (see [`fetch_body`]).
pub fn fetch(v: &Veloxy, p: Proto, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    fetch_body(v, p, method, path, headers, b"")
}

/// One request on a fresh connection to listener `web`, fully read. The host is veloxy's
/// address (`127.0.0.1:PORT`) unless `headers` has a `Host`.
pub fn fetch_body(
    v: &Veloxy,
    p: Proto,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let addr = v.addr.to_string();
    let host = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map_or(addr.as_str(), |(_, v)| *v);
    let others = headers
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case("host"));
    match p {
        Proto::H1 => {
            let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
            for (n, v) in others {
                raw.push_str(&format!("{n}: {v}\r\n"));
            }
            if !body.is_empty() {
                raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
            }
            raw.push_str("Connection: close\r\n\r\n");
            let mut c = Client::connect(v.addr);
            c.send(raw.as_bytes());
            c.send(body);
            c.read_response(method == "HEAD")
        }
        Proto::H2 => {
            let mut req = http::Request::builder()
                .method(method)
                .uri(format!("http://{host}{path}"))
                .body(())
                .unwrap();
            for (n, v) in others {
                req.headers_mut().append(
                    http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    http::HeaderValue::from_str(v).unwrap(),
                );
            }
            let body = (!body.is_empty()).then(|| bytes::Bytes::copy_from_slice(body));
            let r = runtime().block_on(async {
                tokio::time::timeout(WAIT, async {
                    let mut c = h2_connect(v.addr, None).await;
                    h2_send(&mut c, req, body).await.expect("HTTP/2 response")
                })
                .await
                .expect("HTTP/2 exchange within the time limit")
            });
            h2_response(r)
        }
    }
}

/// An HTTP/2 reply as the kit's HTTP/1 [`Response`] (no raw head).
pub fn h2_response(r: H2Reply) -> Response {
    Response {
        status: r.status,
        headers: r
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: r.body.to_vec(),
        head: String::new(),
    }
}

/// GET over HTTP/1.1.
pub fn get1(v: &Veloxy, path: &str, headers: &[(&str, &str)]) -> Response {
    fetch(v, Proto::H1, "GET", path, headers)
}

/// The cache status (`X-Cache`) of a response.
pub fn x_cache(r: &Response) -> Option<&str> {
    r.header("x-cache")
}

/// `(status, body, X-Cache)`, for one-line assertions.
pub fn summary(r: &Response) -> (u16, String, Option<&str>) {
    (r.status, r.body_str(), x_cache(r))
}

/// A request to the admin endpoint.
pub fn admin(v: &Veloxy, method: &str, path: &str) -> Response {
    request(
        admin_addr(v),
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )
}
