//! OpenTelemetry tracing (issue 40) against a real OpenTelemetry Collector (`.ci/otelcol.sh`):
//! the span tree of real requests over HTTP/1.1 and HTTP/2, the trace context the backend
//! receives (its own span, posted to the collector, lands under veloxy's attempt span), an
//! incoming `traceparent` continued or (`trust_incoming = false`) replaced, retries and errors
//! marked, the access log's ids, sampling at 0 and its change on reload, a route's own
//! `tracing`, and a dead collector costing requests nothing.

use veloxy_testkit::otel::Span;
use veloxy_testkit::*;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A port nothing listens on.
fn dead_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn config(endpoint: &str, tracing_keys: &str, servers: &[SocketAddr], extra: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n[server.tracing]\notlp_endpoint = \"{endpoint}\"\n\
         service_name = \"edge\"\nresource = {{ \"deployment.environment\" = \"test\" }}\n{tracing_keys}\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\npath = \"/api\"\nupstream = \"app\"\n[upstreams.app]\nservers = [{}]\n{extra}\n",
        list.join(", ")
    )
}

/// The origin: answers 200 and keeps every request (its headers are checked).
fn origin() -> ScriptOrigin {
    script_origin(|_| Scripted::ok("hello"))
}

fn one<'a>(spans: &'a [Span], what: &str, f: impl Fn(&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| f(s)).collect();
    assert_eq!(found.len(), 1, "one {what} in {spans:#?}");
    found[0]
}

/// `00-TRACE-SPAN-FLAGS` split.
fn traceparent(v: &str) -> (String, String, String) {
    let p: Vec<&str> = v.split('-').collect();
    assert_eq!(p.len(), 4, "{v}");
    assert_eq!(p[0], "00", "{v}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

#[test]
fn http1_span_tree_continues_the_client_trace_and_the_backend_joins_it() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let extra = format!(
        "[server.access_log]\npath = {:?}\nformat = \"json\"\n",
        log.to_str().unwrap()
    );
    let conf = config(&col.endpoint(), "sample_ratio = 0.0", &[up.addr], "")
        .replace("[listeners.web]", &format!("{extra}[listeners.web]"));
    let v = veloxy(&conf);
    let r = request(
        v.addr,
        &format!(
            "GET /api/items?x=1 HTTP/1.1\r\nHost: app.test\r\ntraceparent: 00-{CLIENT_TRACE}-{CLIENT_SPAN}-01\r\n\
             tracestate: vendor=abc\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(r.status, 200);
    // The backend got veloxy's context, not the client's: same trace, a new parent.
    let seen = &up.requests()[0];
    let tp: Vec<&str> = seen
        .headers
        .iter()
        .filter(|(n, _)| n == "traceparent")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(tp.len(), 1, "one traceparent upstream: {:?}", seen.headers);
    let (trace, parent, flags) = traceparent(tp[0]);
    assert_eq!(trace, CLIENT_TRACE);
    assert_ne!(parent, CLIENT_SPAN);
    assert_eq!(flags, "01");
    assert_eq!(seen.header("tracestate"), Some("vendor=abc"));
    // The backend's own span, as its instrumentation would export it.
    col.post_span("backend", &trace, "1111222233334444", &parent, "GET /items");

    let spans = col.wait("veloxy's two spans and the backend's", |s| s.len() >= 3);
    let server = one(&spans, "server span", |s| {
        s.kind == 2 && s.resource.get("service.name").map(String::as_str) == Some("edge")
    });
    assert_eq!(server.trace_id, CLIENT_TRACE);
    assert_eq!(
        server.parent_span_id, CLIENT_SPAN,
        "continues the client's span"
    );
    assert_eq!(server.name, "GET /api");
    assert_eq!(server.attr("http.request.method"), Some("GET"));
    assert_eq!(server.attr("url.path"), Some("/api/items"));
    assert_eq!(server.attr("url.query"), Some("x=1"));
    assert_eq!(server.attr("url.scheme"), Some("http"));
    assert_eq!(server.attr("http.route"), Some("/api"));
    assert_eq!(server.attr("server.address"), Some("app.test"));
    assert_eq!(server.attr("client.address"), Some("127.0.0.1"));
    assert_eq!(server.attr("network.protocol.version"), Some("1.1"));
    assert_eq!(server.attr("http.response.status_code"), Some("200"));
    assert_eq!(
        server.attr("veloxy.backend"),
        Some(up.addr.to_string().as_str())
    );
    assert_eq!(
        server
            .resource
            .get("deployment.environment")
            .map(String::as_str),
        Some("test")
    );
    assert_eq!(server.status, 0, "unset: not an error");
    let attempt = one(&spans, "attempt span", |s| s.kind == 3);
    assert_eq!(attempt.trace_id, CLIENT_TRACE);
    assert_eq!(
        attempt.parent_span_id, server.span_id,
        "the attempt is the exchange's child"
    );
    assert_eq!(
        attempt.span_id, parent,
        "the upstream's traceparent names the attempt span"
    );
    assert_eq!(
        attempt.attr("veloxy.backend"),
        Some(up.addr.to_string().as_str())
    );
    assert_eq!(attempt.attr("http.response.status_code"), Some("200"));
    let events: Vec<&str> = attempt.events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(events, ["connected", "request sent", "response head"]);
    assert_eq!(
        attempt.events[0]
            .1
            .get("veloxy.connection.reused")
            .map(String::as_str),
        Some("false"),
        "a new connection"
    );
    assert!(attempt.attr("veloxy.retry").is_none());
    assert!(attempt.start_ns >= server.start_ns && attempt.end_ns <= server.end_ns);
    let backend = one(&spans, "backend span", |s| {
        s.resource.get("service.name").map(String::as_str) == Some("backend")
    });
    assert_eq!(
        backend.parent_span_id, attempt.span_id,
        "the backend's span is under the attempt"
    );
    assert_eq!(backend.trace_id, server.trace_id);

    // The access log names the same trace and span; an unsampled request (ratio 0) and one
    // with no route have the fields, empty.
    for path in ["/api/unsampled", "/no-route"] {
        request(
            v.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"),
        );
    }
    let mut text = String::new();
    assert!(eventually(Duration::from_secs(5), || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().count() >= 3
    }));
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["trace_id"], CLIENT_TRACE);
    assert_eq!(lines[0]["span_id"], server.span_id.as_str());
    for j in &lines[1..] {
        assert_eq!(
            (&j["trace_id"], &j["span_id"]),
            (&serde_json::json!(""), &serde_json::json!("")),
            "{j}"
        );
    }
    assert_eq!(lines[2]["status"], 404);
}

#[test]
fn http2_exchange_with_trust_incoming_false_starts_a_new_trace() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let v = veloxy(&config(
        &col.endpoint(),
        "sample_ratio = 1.0\ntrust_incoming = false",
        &[up.addr],
        "",
    ));
    let authority = format!("app.test:{}", v.addr.port());
    let status = runtime().block_on(async {
        let mut c = h2_connect(v.addr, None).await;
        let mut req = h2_get(&authority, "/api/h2", false);
        req.headers_mut().insert(
            "traceparent",
            format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
                .parse()
                .unwrap(),
        );
        h2_send(&mut c, req, None).await.unwrap().status
    });
    assert_eq!(status, 200);
    let spans = col.wait("the server and attempt spans", |s| s.len() >= 2);
    let server = one(&spans, "server span", |s| s.kind == 2);
    assert_ne!(server.trace_id, CLIENT_TRACE, "a new trace");
    assert_eq!(server.parent_span_id, "", "a root span");
    assert_eq!(server.attr("network.protocol.version"), Some("2"));
    assert_eq!(server.attr("server.address"), Some("app.test"));
    assert_eq!(
        server.attr("server.port"),
        Some(v.addr.port().to_string().as_str())
    );
    let attempt = one(&spans, "attempt span", |s| s.kind == 3);
    assert_eq!(attempt.parent_span_id, server.span_id);
    let seen = &up.requests()[0];
    let (trace, parent, _) = traceparent(seen.header("traceparent").expect("traceparent upstream"));
    assert_eq!(trace, server.trace_id, "the client's context is replaced");
    assert_eq!(parent, attempt.span_id);
    assert_eq!(
        seen.headers
            .iter()
            .filter(|(n, _)| n == "traceparent")
            .count(),
        1
    );
}

#[test]
fn retries_are_marked_and_a_dead_upstream_is_an_error() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let dead = dead_addr();
    let extra = format!(
        "retries = 1\n[[routes]]\npath = \"/down\"\nupstream = \"down\"\n[upstreams.down]\nservers = [\"{}\"]\n",
        dead_addr()
    );
    let v = veloxy(&config(
        &col.endpoint(),
        "sample_ratio = 1.0",
        &[dead, up.addr],
        &extra,
    ));
    // Whatever the policy picks, some of these go to the dead server first and are retried.
    for _ in 0..4 {
        let r = request(
            v.addr,
            "GET /api/r HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
    }
    let r = request(
        v.addr,
        "GET /down HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 502);
    let spans = col.wait("three exchanges", |s| {
        s.iter().filter(|s| s.kind == 2).count() >= 3
    });
    let retried: Vec<&Span> = spans
        .iter()
        .filter(|s| s.attr("veloxy.retry") == Some("true"))
        .collect();
    assert!(!retried.is_empty(), "a retried attempt in {spans:#?}");
    let retry = retried[0];
    assert_eq!(retry.attr("http.request.resend_count"), Some("1"));
    assert_eq!(
        retry.attr("veloxy.backend"),
        Some(up.addr.to_string().as_str())
    );
    let failed: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == 3 && s.trace_id == retry.trace_id && s.span_id != retry.span_id)
        .collect();
    assert_eq!(
        failed.len(),
        1,
        "the first attempt of the retried exchange: {spans:#?}"
    );
    assert_eq!(failed[0].status, 2, "an error");
    assert!(failed[0].attr("error.type").is_some(), "{:?}", failed[0]);
    assert_eq!(
        failed[0].parent_span_id, retry.parent_span_id,
        "both attempts are the exchange's children"
    );
    // The retry's request names the retry's own attempt span.
    let seen: Vec<(String, String, String)> = up
        .requests()
        .iter()
        .filter_map(|r| r.header("traceparent").map(traceparent))
        .filter(|(t, _, _)| *t == retry.trace_id)
        .collect();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].1, retry.span_id,
        "the retry's traceparent names its attempt"
    );
    let down = one(&spans, "the 502", |s| {
        s.kind == 2 && s.attr("http.response.status_code") == Some("502")
    });
    assert_eq!(down.status, 2);
    assert_eq!(down.attr("error.type"), Some("502"));
    assert_eq!(down.attr("http.route"), Some("/down"));
}

#[test]
fn ratio_zero_exports_nothing_a_route_overrides_it_and_reload_changes_it() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let route =
        "[[routes]]\npath = \"/always\"\nupstream = \"app\"\ntracing = { sample_ratio = 1.0 }\n\
                 [[routes]]\npath = \"/never\"\nupstream = \"app\"\ntracing = false\n";
    let conf = |ratio: &str| {
        config(
            &col.endpoint(),
            &format!("sample_ratio = {ratio}"),
            &[up.addr],
            route,
        )
    };
    let v = veloxy(&conf("0.0"));
    let get = |path: &str| {
        let r = request(
            v.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(r.status, 200);
    };
    for _ in 0..5 {
        get("/api/unsampled");
    }
    get("/never");
    get("/always");
    let spans = col.wait("the /always exchange", |s| {
        s.iter().any(|s| s.name == "GET /always")
    });
    assert!(
        up.requests()
            .iter()
            .filter(|r| r.path() != "/always")
            .all(|r| r.header("traceparent").is_none()),
        "unsampled requests go upstream without a trace context"
    );
    // A sampled client parent is followed (parent_based) whatever the ratio.
    let r = request(
        v.addr,
        &format!("GET /api/parent HTTP/1.1\r\nHost: a\r\ntraceparent: 00-{CLIENT_TRACE}-{CLIENT_SPAN}-01\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(r.status, 200);
    reload_with(&v, &conf("1.0"), "reloaded");
    get("/api/after-reload");
    get("/never");
    let spans2 = col.wait("the exchange after the reload", |s| {
        s.iter()
            .any(|s| s.attr("url.path") == Some("/api/after-reload"))
    });
    assert!(spans.len() <= spans2.len());
    for s in &spans2 {
        assert_ne!(
            s.attr("url.path"),
            Some("/api/unsampled"),
            "ratio 0 exported {s:?}"
        );
        assert_ne!(
            s.attr("http.route"),
            Some("/never"),
            "tracing = false exported {s:?}"
        );
    }
    assert!(spans2
        .iter()
        .any(|s| s.trace_id == CLIENT_TRACE && s.kind == 2));
}

#[test]
fn a_dead_collector_costs_requests_nothing_and_drops_are_counted() {
    let up = origin();
    // A collector that never answers (bound, never accepting): its port cannot be taken by
    // another test's server meanwhile, as a closed one could, and each export times out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let v = veloxy(&config(&endpoint, "sample_ratio = 1.0", &[up.addr], ""));
    let t0 = Instant::now();
    for i in 0..50 {
        let r = request(
            v.addr,
            &format!("GET /api/{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(r.status, 200);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "50 requests took {:?}",
        t0.elapsed()
    );
    let admin = admin_addr(&v);
    let mut text = String::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            text = request(
                admin,
                "GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            )
            .body_str();
            text.lines()
                .find(|l| l.starts_with("veloxy_tracing_spans_dropped_total "))
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        }),
        "dropped spans counted:\n{text}\nveloxy's log:\n{}",
        v.proc.log_text()
    );
    drop(silent);
}

#[test]
fn otlp_grpc_endpoint_exports_too() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let v = veloxy(&config(
        &format!("grpc://{}", col.grpc),
        "sample_ratio = 1.0",
        &[up.addr],
        "",
    ));
    let r = request(
        v.addr,
        "GET /api/grpc HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let spans = col.wait("the spans over gRPC", |s| s.len() >= 2);
    one(&spans, "server span", |s| {
        s.kind == 2 && s.attr("url.path") == Some("/api/grpc")
    });
}

#[test]
fn http3_exchanges_and_veloxy_own_answers_have_spans() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let log = certs.path().join("access.log");
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[server.access_log]\npath = {:?}\n\
         [server.tracing]\notlp_endpoint = \"{}\"\nsample_ratio = 1.0\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listeners.web.tls]\ncert = {:?}\nkey = {:?}\n\
         [[routes]]\npath = \"/fixed\"\nrespond = {{ status = 204 }}\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        log.to_str().unwrap(),
        col.endpoint(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        up.addr
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let ca = pki.ca_pem.clone();
    let statuses = runtime().block_on(async {
        let mut c = h3_connect(web, "localhost", &ca).await.unwrap();
        let a = h3_send(&mut c, h3_get("localhost", "/h3/proxied"), None)
            .await
            .unwrap();
        let b = h3_send(&mut c, h3_get("localhost", "/fixed"), None)
            .await
            .unwrap();
        (a.status, b.status)
    });
    assert_eq!(statuses, (200, 204));
    let spans = col.wait("two exchanges over HTTP/3", |s| {
        s.iter().filter(|s| s.kind == 2).count() >= 2 && s.iter().any(|s| s.kind == 3)
    });
    let proxied = one(&spans, "the proxied exchange", |s| {
        s.kind == 2 && s.attr("url.path") == Some("/h3/proxied")
    });
    assert_eq!(proxied.attr("network.protocol.version"), Some("3"));
    assert_eq!(proxied.attr("url.scheme"), Some("https"));
    let attempt = one(&spans, "attempt span", |s| s.kind == 3);
    assert_eq!(attempt.parent_span_id, proxied.span_id);
    let (trace, parent, _) = traceparent(up.requests()[0].header("traceparent").unwrap());
    assert_eq!(
        (trace.as_str(), parent.as_str()),
        (proxied.trace_id.as_str(), attempt.span_id.as_str())
    );
    let fixed = one(&spans, "the fixed answer", |s| {
        s.kind == 2 && s.attr("url.path") == Some("/fixed")
    });
    assert_eq!(fixed.attr("http.response.status_code"), Some("204"));
    assert_eq!(fixed.name, "GET /fixed");
    // The combined access log ends with the trace and span ids.
    let mut text = String::new();
    assert!(eventually(Duration::from_secs(5), || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().count() >= 2
    }));
    let line = text.lines().find(|l| l.contains("/fixed")).unwrap();
    assert!(
        line.ends_with(&format!(" \"{}\" \"{}\"", fixed.trace_id, fixed.span_id)),
        "{line}"
    );
}

#[test]
fn reload_moves_the_export_to_another_collector() {
    let Some(first) = Collector::start() else {
        return;
    };
    let Some(second) = Collector::start() else {
        return;
    };
    let up = origin();
    let conf = |c: &Collector| config(&c.endpoint(), "sample_ratio = 1.0", &[up.addr], "");
    let v = veloxy(&conf(&first));
    let get = |path: &str| {
        let r = request(
            v.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(r.status, 200);
    };
    get("/api/first");
    first.wait("the first exchange", |s| {
        s.iter().any(|s| s.attr("url.path") == Some("/api/first"))
    });
    reload_with(
        &v,
        &conf(&second).replace("service_name = \"edge\"", "service_name = \"edge2\""),
        "reloaded",
    );
    get("/api/second");
    let spans = second.wait("the exchange after the reload", |s| {
        s.iter().any(|s| s.attr("url.path") == Some("/api/second"))
    });
    let server = one(&spans, "server span", |s| s.kind == 2);
    assert_eq!(
        server.resource.get("service.name").map(String::as_str),
        Some("edge2")
    );
    assert!(first
        .spans()
        .iter()
        .all(|s| s.attr("url.path") != Some("/api/second")));
}

#[test]
fn forward_auth_and_the_queue_are_child_spans() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let auth = script_origin(|r| match r.header("authorization") {
        Some("Bearer ok") => Scripted::new(200),
        _ => Scripted::new(401),
    });
    let extra = format!(
        "[[routes]]\npath = \"/guarded\"\nupstream = \"app\"\nmax_concurrency = 4\n\
         forward_auth = {{ upstream = \"auth\", path = \"/verify\" }}\n\
         [upstreams.auth]\nservers = [\"{}\"]\n",
        auth.addr
    );
    let v = veloxy(&config(
        &col.endpoint(),
        "sample_ratio = 1.0",
        &[up.addr],
        &extra,
    ));
    let ok = request(
        v.addr,
        "GET /guarded/a HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ok\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(ok.status, 200);
    let denied = request(
        v.addr,
        "GET /guarded/b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(denied.status, 401);
    let spans = col.wait("both exchanges", |s| {
        s.iter().filter(|s| s.kind == 2).count() >= 2
    });
    let passed = one(&spans, "the passed exchange", |s| {
        s.kind == 2 && s.attr("url.path") == Some("/guarded/a")
    });
    let children =
        |id: &str| -> Vec<&Span> { spans.iter().filter(|s| s.parent_span_id == id).collect() };
    let names: Vec<&str> = children(&passed.span_id)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    for n in ["forward_auth", "queue wait", "upstream attempt"] {
        assert!(names.contains(&n), "{n} under the exchange: {names:?}");
    }
    let fa = children(&passed.span_id)
        .into_iter()
        .find(|s| s.name == "forward_auth")
        .unwrap();
    assert_eq!(fa.attr("veloxy.forward_auth.allowed"), Some("true"));
    let refused = one(&spans, "the denied exchange", |s| {
        s.kind == 2 && s.attr("url.path") == Some("/guarded/b")
    });
    let fa = one(&spans, "the denied forward_auth", |s| {
        s.parent_span_id == refused.span_id && s.name == "forward_auth"
    });
    assert_eq!(fa.attr("veloxy.forward_auth.allowed"), Some("false"));
    assert_eq!(fa.attr("http.response.status_code"), Some("401"));
    assert_eq!(refused.attr("http.response.status_code"), Some("401"));
}

#[test]
fn a_cache_fill_is_traced_and_a_hit_says_so() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = script_origin(|_| {
        let mut s = Scripted::ok("cached body");
        s.headers
            .push(("Cache-Control".into(), "max-age=60".into()));
        s
    });
    let extra = "[caches.main]\nmemory = \"8MiB\"\n[[routes]]\npath = \"/c\"\nupstream = \"app\"\ncache = { store = \"main\" }\n";
    let v = veloxy(&config(
        &col.endpoint(),
        "sample_ratio = 1.0",
        &[up.addr],
        extra,
    ));
    for _ in 0..2 {
        let r = request(
            v.addr,
            "GET /c/page HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"cached body");
    }
    assert_eq!(up.requests().len(), 1, "the second is a hit");
    let spans = col.wait("both exchanges", |s| {
        s.iter().filter(|s| s.kind == 2).count() >= 2
    });
    let miss = one(&spans, "the fill", |s| {
        s.kind == 2 && s.attr("veloxy.cache.status") == Some("MISS")
    });
    let hit = one(&spans, "the hit", |s| {
        s.kind == 2 && s.attr("veloxy.cache.status") == Some("HIT")
    });
    let attempt = one(&spans, "the fill's attempt", |s| s.kind == 3);
    assert_eq!(attempt.parent_span_id, miss.span_id);
    assert!(
        spans.iter().all(|s| s.parent_span_id != hit.span_id),
        "a hit asks no backend"
    );
    let (trace, parent, _) = traceparent(up.requests()[0].header("traceparent").unwrap());
    assert_eq!(
        (trace, parent),
        (miss.trace_id.clone(), attempt.span_id.clone())
    );
}

/// A stop (SIGTERM) right after requests: the spans still in the worker's batch and the
/// exporter's queue reach the collector before the process exits.
#[test]
fn spans_of_the_last_requests_are_exported_at_shutdown() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let mut v = veloxy(&config(
        &col.endpoint(),
        "sample_ratio = 1.0",
        &[up.addr],
        "",
    ));
    for i in 0..5 {
        let r = request(
            v.addr,
            &format!("GET /api/last-{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(r.status, 200);
    }
    signal(v.proc.pid(), "-TERM");
    let exited = eventually(Duration::from_secs(10), || {
        v.proc.child.try_wait().is_ok_and(|s| s.is_some())
    });
    assert!(exited, "veloxy did not stop");
    col.wait("the five server spans", |s| {
        (0..5).all(|i| {
            let path = format!("/api/last-{i}");
            s.iter()
                .any(|s| s.kind == 2 && s.attr("url.path") == Some(path.as_str()))
        })
    });
}

/// `propagate = ["b3"]`: a client's single `b3` field and its `X-B3-*` fields are continued
/// (their sampled flag decides, the ratio is 0), and the upstream request carries veloxy's
/// `b3` naming the attempt span, in place of the client's fields.
#[test]
fn b3_from_the_client_is_continued_and_written_upstream() {
    let Some(col) = Collector::start() else {
        return;
    };
    let up = origin();
    let v = veloxy(&config(
        &col.endpoint(),
        "sample_ratio = 0.0\npropagate = [\"b3\"]",
        &[up.addr],
        "",
    ));
    let r = request(
        v.addr,
        &format!(
            "GET /api/single HTTP/1.1\r\nHost: app.test\r\nb3: {CLIENT_TRACE}-{CLIENT_SPAN}-1\r\n\
             Connection: close\r\n\r\n"
        ),
    );
    assert_eq!(r.status, 200);
    let r = request(
        v.addr,
        "GET /api/multi HTTP/1.1\r\nHost: app.test\r\nX-B3-TraceId: a3ce929d0e0e4736\r\n\
         X-B3-SpanId: 1111222233334444\r\nX-B3-Sampled: 1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let seen = up.requests();
    let b3 = |i: usize| {
        let all: Vec<&str> = seen[i]
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("b3"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(all.len(), 1, "one b3 upstream: {:?}", seen[i].headers);
        let p: Vec<String> = all[0].split('-').map(str::to_owned).collect();
        assert_eq!(p.len(), 3, "{}", all[0]);
        assert_eq!(p[2], "1", "{}", all[0]);
        (p[0].clone(), p[1].clone())
    };
    let (single_trace, single_parent) = b3(0);
    assert_eq!(single_trace, CLIENT_TRACE);
    assert_ne!(single_parent, CLIENT_SPAN);
    let (multi_trace, multi_parent) = b3(1);
    assert_eq!(multi_trace, "0000000000000000a3ce929d0e0e4736");
    assert!(
        seen[1]
            .headers
            .iter()
            .all(|(n, _)| !n.to_ascii_lowercase().starts_with("x-b3-")),
        "the client's X-B3 fields are replaced: {:?}",
        seen[1].headers
    );
    assert!(
        seen[0].header("traceparent").is_none(),
        "tracecontext is not listed"
    );

    let spans = col.wait("two exchanges and their attempts", |s| s.len() >= 4);
    for (path, trace, client, parent) in [
        ("/api/single", CLIENT_TRACE, CLIENT_SPAN, &single_parent),
        (
            "/api/multi",
            multi_trace.as_str(),
            "1111222233334444",
            &multi_parent,
        ),
    ] {
        let server = one(&spans, "server span", |s| {
            s.kind == 2 && s.attr("url.path") == Some(path)
        });
        assert_eq!(server.trace_id, trace);
        assert_eq!(server.parent_span_id, client, "continues the client's span");
        let attempt = one(&spans, "attempt span", |s| {
            s.kind == 3 && s.parent_span_id == server.span_id
        });
        assert_eq!(
            &attempt.span_id, parent,
            "the upstream's b3 names the attempt"
        );
    }
}

/// An attempt's event names, in order, and whether its `connected` was a reused connection.
fn events(s: &Span) -> (Vec<&str>, Option<&str>) {
    let names = s.events.iter().map(|(n, _)| n.as_str()).collect();
    let reused = s.events.iter().find(|(n, _)| n == "connected");
    let reused = reused.and_then(|(_, a)| a.get("veloxy.connection.reused"));
    (names, reused.map(String::as_str))
}

#[test]
fn tls_and_http2_group_attempts_show_connect_handshake_and_first_byte() {
    let Some(col) = Collector::start() else {
        return;
    };
    // The backend terminates TLS (and speaks HTTP/2 there): a second veloxy in front of
    // the test upstream.
    let app = upstream(&["--name", "inner"]);
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("backend", &["backend.test"], KeyKind::Ecdsa);
    let inner = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        cert.display(),
        key.display(),
        app.addr
    ));
    let group = |name: &str, protocol: &str| {
        format!(
            "[upstreams.{name}]\nservers = [\"https://{}\"]\ntls_verify = false\nprotocol = \"{protocol}\"\n",
            inner.addr
        )
    };
    let extra = format!(
        "[[routes]]\npath = \"/tls\"\nupstream = \"tls\"\n[[routes]]\npath = \"/h2\"\nupstream = \"h2\"\n{}{}",
        group("tls", "http1"),
        group("h2", "h2")
    );
    let v = veloxy(&config(
        &col.endpoint(),
        "sample_ratio = 1.0",
        &[app.addr],
        &extra,
    ));
    for path in ["/tls/a", "/tls/b", "/h2/a", "/h2/b"] {
        let r = get(v.addr, path);
        assert_eq!(r.status, 200, "{path}: {}", r.body_str());
        assert_eq!(r.header("x-upstream"), Some("inner"));
    }
    let spans = col.wait("four exchanges", |s| {
        s.iter().filter(|s| s.kind == 3).count() >= 4
    });
    let attempt = |path: &str| {
        let server = one(&spans, path, |s| {
            s.kind == 2 && s.attr("url.path") == Some(path)
        });
        one(&spans, "its attempt", |s| {
            s.kind == 3 && s.parent_span_id == server.span_id
        })
    };
    // A new TLS connection: the TCP connect, then the handshake, then the request.
    let first = attempt("/tls/a");
    assert_eq!(
        events(first),
        (
            vec![
                "connected",
                "tls handshake",
                "request sent",
                "response head"
            ],
            Some("false")
        )
    );
    let at = |s: &Span, name: &str| s.events.iter().position(|(n, _)| n == name);
    assert!(at(first, "connected") < at(first, "tls handshake"));
    // The pooled one: no handshake.
    assert_eq!(
        events(attempt("/tls/b")),
        (
            vec!["connected", "request sent", "response head"],
            Some("true")
        )
    );
    // HTTP/2 groups: the connection (new, then the same one) and the first byte.
    assert_eq!(
        events(attempt("/h2/a")),
        (vec!["connected", "response head"], Some("false"))
    );
    assert_eq!(
        events(attempt("/h2/b")),
        (vec!["connected", "response head"], Some("true"))
    );
}

/// An L4 stream connection has a server span (`TCP LISTENER`, the bytes each way) and an
/// attempt span per connect try: a dead backend's failure, then the one that took it.
#[test]
fn stream_connections_have_spans() {
    use std::io::{Read, Write};
    let Some(col) = Collector::start() else {
        return;
    };
    let echo = tcp_echo("127.0.0.1");
    let dead = dead_addr();
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[server.tracing]\notlp_endpoint = \"{}\"\nsample_ratio = 1.0\n\
         [listeners.db]\naddr = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         [[streams]]\nlistener = \"db\"\nupstream = \"echo\"\n\
         [upstreams.echo]\nservers = [\"{dead}\", \"{echo}\"]\nretries = 1\npolicy = \"round_robin\"\n",
        col.endpoint()
    ));
    // Round robin starts at the dead backend: the first connection tries it first.
    let mut c = std::net::TcpStream::connect(v.addr).unwrap();
    c.write_all(b"hello stream").unwrap();
    let mut got = [0u8; 12];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello stream");
    drop(c);
    let spans = col.wait("the stream's spans", |s| {
        s.iter().any(|s| s.kind == 2) && s.iter().filter(|s| s.kind == 3).count() >= 1
    });
    let server = one(&spans, "stream span", |s| s.kind == 2);
    assert_eq!(server.name, "TCP db");
    assert_eq!(server.attr("network.transport"), Some("tcp"));
    assert_eq!(server.attr("veloxy.stream.bytes_received"), Some("12"));
    assert_eq!(server.attr("veloxy.stream.bytes_sent"), Some("12"));
    assert_eq!(
        server.attr("veloxy.backend"),
        Some(echo.to_string().as_str())
    );
    assert_eq!(server.status, 0, "relayed: no error");
    assert!(server.attr("http.request.method").is_none());
    let attempts: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == 3 && s.parent_span_id == server.span_id)
        .collect();
    let took = attempts
        .iter()
        .find(|a| a.attr("veloxy.backend") == Some(echo.to_string().as_str()))
        .expect("the attempt on the live backend");
    assert_eq!(events(took).0, ["connected"]);
    if let Some(failed) = attempts
        .iter()
        .find(|a| a.attr("veloxy.backend") == Some(dead.to_string().as_str()))
    {
        assert!(failed.attr("error.type").is_some(), "{failed:#?}");
        assert_eq!(took.attr("http.request.resend_count"), Some("1"));
    }
}
