//! FastCGI routes (issue 38) against a real php-fpm (Debian's `php-fpm`) running PHP scripts:
//! the CGI parameters, PATH_INFO by `split_path`, the front controller, request bodies,
//! redirects and cookies, statuses, a 2 MiB answer, stderr in the log, connection reuse, and
//! a dead FastCGI server; over HTTP/1.1 and HTTP/2. Streamed responses (a script that
//! flushes, 100 MB through bounded memory) and `try_files` (nginx's front controller).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use veloxy_testkit::*;

/// A php-fpm master with a few workers on a loopback port, serving `root`; killed on drop.
struct PhpFpm {
    child: Child,
    addr: SocketAddr,
    /// Set when it listens on a unix socket instead (`addr` is then unused).
    socket: Option<PathBuf>,
    dir: tempfile::TempDir,
}

impl PhpFpm {
    /// php-fpm's access log: one line a request it ran.
    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for PhpFpm {
    fn drop(&mut self) {
        // The master and its workers, which would serve on without it.
        // SAFETY: kill(2) on the process group this test made; no memory is involved.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn php_fpm_binary() -> Option<PathBuf> {
    let dir = std::fs::read_dir("/usr/sbin").ok()?;
    dir.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("php-fpm"))
    })
}

fn php_fpm() -> Option<PhpFpm> {
    php_fpm_with(2)
}

/// php-fpm with a static pool of `children` on a loopback port.
fn php_fpm_with(children: usize) -> Option<PhpFpm> {
    php_fpm_on(children, false)
}

/// php-fpm with a static pool of `children`, on a unix socket in its folder when `unix`.
///
/// Ready means php-fpm's own log says "ready to handle connections", written after it bound
/// its socket. A connect is not proof: the port is picked by binding port 0 and letting it go,
/// so another test's socket can take it in between (php-fpm then exits with "Address already
/// in use" while the other socket answered the probe), and a probe can even connect to itself
/// when the kernel hands it the same port as its source. A lost port is retried on a new one.
fn php_fpm_on(children: usize, unix: bool) -> Option<PhpFpm> {
    let bin = php_fpm_binary()?;
    (0..5).find_map(|_| php_fpm_try(&bin, children, unix))
}

/// One start of php-fpm; `None` when it exited or did not get ready in time.
fn php_fpm_try(bin: &Path, children: usize, unix: bool) -> Option<PhpFpm> {
    let dir = tempfile::tempdir().unwrap();
    let socket = unix.then(|| dir.path().join("php-fpm.sock"));
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = match &socket {
        Some(path) => path.display().to_string(),
        None => format!("127.0.0.1:{port}"),
    };
    let conf = dir.path().join("php-fpm.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\nerror_log = {}/php-fpm.log\ndaemonize = no\n\
             [www]\nlisten = {listen}\npm = static\npm.max_children = {children}\n\
             catch_workers_output = no\nclear_env = yes\naccess.log = {}/access.log\naccess.format = \"%m %r %f\"\n",
            dir.path().display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let child = Command::new(bin)
        .process_group(0)
        .args(["--nodaemonize", "--allow-to-run-as-root", "-n", "-y"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut fpm = PhpFpm {
        child,
        addr,
        socket,
        dir,
    };
    let log = fpm.dir.path().join("php-fpm.log");
    let mut exited = false;
    let ready = eventually(Duration::from_secs(10), || {
        exited = !matches!(fpm.child.try_wait(), Ok(None));
        exited
            || std::fs::read_to_string(&log)
                .is_ok_and(|l| l.contains("ready to handle connections"))
    });
    if !ready || exited {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        eprintln!("php-fpm did not start (retried on a new port): {log}");
        return None;
    }
    Some(fpm)
}

fn scripts(root: &Path) {
    let files = [
        (
            "vars.php",
            r#"<?php header('Content-Type: application/json');
$keys = ['SCRIPT_FILENAME','SCRIPT_NAME','PATH_INFO','QUERY_STRING','REQUEST_METHOD','REQUEST_URI',
 'CONTENT_TYPE','CONTENT_LENGTH','REMOTE_ADDR','HTTPS','SERVER_PORT','HTTP_X_TEST','HTTP_COOKIE','APP_ENV','HTTP_HOST'];
$out = []; foreach ($keys as $k) { $out[$k] = $_SERVER[$k] ?? ''; }
echo json_encode($out);"#,
        ),
        (
            "upload.php",
            "<?php $b = file_get_contents('php://input'); echo strlen($b), ' ', md5($b);",
        ),
        (
            "redirect.php",
            "<?php setcookie('sid', 'abc'); header('Location: /there'); echo 'moved';",
        ),
        (
            "teapot.php",
            "<?php http_response_code(418); echo 'teapot';",
        ),
        ("big.php", "<?php echo str_repeat('x', 2 * 1024 * 1024);"),
        ("index.php", "<?php echo 'front ', $_SERVER['REQUEST_URI'];"),
        ("err.php", "<?php error_log('oops from php'); echo 'ok';"),
    ];
    for (name, text) in files {
        std::fs::write(root.join(name), text).unwrap();
    }
}

/// A site with one FastCGI route to `fpm` serving `root`, `route_extra` on the route.
fn php_site(fpm: &PhpFpm, root: &Path, route_extra: &str) -> Site {
    Site::start(
        "",
        "",
        &format!(
            "[[routes]]\nupstream = \"php\"\n{route_extra}\n\
             fastcgi = {{ root = \"{}\" }}\n\
             [upstreams.php]\nprotocol = \"fastcgi\"\nservers = [\"{}\"]\n",
            root.display(),
            fpm.addr
        ),
    )
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn php_behind_fastcgi_over_http1_and_http2() {
    let Some(fpm) = php_fpm() else {
        skip("php_behind_fastcgi_over_http1_and_http2: no php-fpm (apt-get install php-fpm)");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    scripts(root.path());
    let site = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\nupstream = \"php\"\n\
             fastcgi = {{ root = \"{}\", params = {{ APP_ENV = \"prod\" }} }}\n\
             [upstreams.php]\nprotocol = \"fastcgi\"\nservers = [\"{}\"]\n",
            root.path().display(),
            fpm.addr
        ),
    );
    let root_s = root.path().display().to_string();

    // The CGI parameters, PATH_INFO split off, the route's own parameter.
    let (status, raw) = site.h1(
        "/vars.php/extra/path?a=1&b=2",
        "X-Test: yes\r\nCookie: c=1\r\n",
    );
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw_header(&raw, "content-type"), Some("application/json"));
    let v = json(raw_body(&raw));
    assert_eq!(v["SCRIPT_FILENAME"], format!("{root_s}/vars.php"));
    assert_eq!(v["SCRIPT_NAME"], "/vars.php");
    assert_eq!(v["PATH_INFO"], "/extra/path");
    assert_eq!(v["QUERY_STRING"], "a=1&b=2");
    assert_eq!(v["REQUEST_METHOD"], "GET");
    assert_eq!(v["REQUEST_URI"], "/vars.php/extra/path?a=1&b=2");
    assert_eq!(v["REMOTE_ADDR"], "127.0.0.1");
    assert_eq!(v["HTTPS"], "on");
    assert_eq!(v["HTTP_X_TEST"], "yes");
    assert_eq!(v["HTTP_COOKIE"], "c=1");
    assert_eq!(v["APP_ENV"], "prod");
    assert_eq!(v["HTTP_HOST"], "localhost");

    // HTTP/2: split cookies joined, the same parameters.
    let r = site.h2("/vars.php?x=1", &[("cookie", "a=1"), ("cookie", "b=2")]);
    assert_eq!(r.status, 200);
    let v = json(&r.body_str());
    assert_eq!(v["HTTP_COOKIE"], "a=1; b=2");
    assert_eq!(v["QUERY_STRING"], "x=1");

    // A body: sent whole, read back by the script (HTTP/1.1 and HTTP/2).
    let body: String = (0..300_000u32)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let digest = md5_hex(body.as_bytes());
    let (status, raw) = site.h1_raw(&format!(
        "POST /upload.php HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw_body(&raw), format!("{} {digest}", body.len()));
    let mut req = h2_get("localhost", "/upload.php", true);
    *req.method_mut() = http::Method::POST;
    let r = site.h2_req(req, Some(bytes::Bytes::from(body.clone())));
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), format!("{} {digest}", body.len()));

    // Redirects and cookies; a status of the script's own.
    let (status, raw) = site.h1("/redirect.php", "");
    assert_eq!(status, 302, "{raw}");
    assert_eq!(raw_header(&raw, "location"), Some("/there"));
    assert!(
        raw_header(&raw, "set-cookie").is_some_and(|c| c.starts_with("sid=abc")),
        "{raw}"
    );
    let (status, raw) = site.h1("/teapot.php", "");
    assert_eq!((status, raw_body(&raw)), (418, "teapot"));

    // The front controller: any other path goes to /index.php with its URI.
    let (status, raw) = site.h1("/articles/42?x=y", "");
    assert_eq!((status, raw_body(&raw)), (200, "front /articles/42?x=y"));
    let r = site.h2("/some/page", &[]);
    assert_eq!(r.body_str(), "front /some/page");

    // A large answer; stderr in veloxy's log.
    let r = site.h2("/big.php", &[]);
    assert_eq!((r.status, r.body.len()), (200, 2 * 1024 * 1024));
    let (status, raw) = site.h1("/err.php", "");
    assert_eq!((status, raw_body(&raw)), (200, "ok"));
    assert!(
        eventually(Duration::from_secs(5), || site
            .v
            .proc
            .log_text()
            .contains("oops from php")),
        "stderr not logged"
    );

    // The FastCGI server gone: a fast 502, not a hang.
    drop(fpm);
    let (status, _) = site.h1("/vars.php", "");
    assert!(matches!(status, 502 | 503), "{status}");
}

/// MD5 as PHP's md5() prints it (hand-rolled: one use, in a test).
fn md5_hex(data: &[u8]) -> String {
    let out = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(data)?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&out.stdout)[..32].to_owned()
}

#[test]
fn fastcgi_keys_are_checked() {
    let cases = [
        (
            "[[routes]]\nupstream = \"php\"\n[upstreams.php]\nprotocol = \"fastcgi\"\nservers = [\"127.0.0.1:9000\"]\n",
            "routes[0].upstream: \"php\" is a FastCGI group: the route needs fastcgi",
        ),
        (
            "[[routes]]\nupstream = \"app\"\nfastcgi = { root = \"/srv\" }\n[upstreams.app]\nservers = [\"127.0.0.1:9000\"]\n",
            "routes[0].fastcgi: is for routes to a FastCGI group",
        ),
        (
            "[[routes]]\nupstream = \"php\"\nfastcgi = { root = \"srv\" }\n[upstreams.php]\nprotocol = \"fastcgi\"\nservers = [\"127.0.0.1:9000\"]\n",
            "routes[0].fastcgi.root: must be an absolute path",
        ),
    ];
    for (rest, want) in cases {
        let text = format!("[listeners.web]\naddr = \"127.0.0.1:0\"\n{rest}");
        let out = check(&text);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{text}\n{err}");
    }
}

/// Reads from `s` until `done` says the bytes so far are enough (10 s at most a read).
fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut chunk = [0u8; 16 * 1024];
    while !done(buf) {
        let n = s.read(&mut chunk).expect("read within 10 s");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Issue 38: a FastCGI response streams: a script's flushed output reaches the client while
/// the script still runs (it waits for a file the test creates only once it has seen the
/// first chunk), over HTTP/1.1 (chunked, the connection reused after) and HTTP/2; a 100 MB
/// answer goes through with veloxy's memory bounded (HTTP/1.0: up to the close).
#[test]
fn fastcgi_responses_stream() {
    let Some(fpm) = php_fpm() else {
        skip("fastcgi_responses_stream: no php-fpm (apt-get install php-fpm)");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    scripts(root.path());
    std::fs::write(
        root.path().join("stream.php"),
        "<?php header('Content-Type: text/plain'); echo \"first\\n\"; flush();\n\
         for ($i = 0; $i < 1000 && !file_exists($_GET['f']); $i++) { usleep(10000); }\n\
         echo file_exists($_GET['f']) ? \"last\\n\" : \"gave up\\n\";",
    )
    .unwrap();
    std::fs::write(
        root.path().join("huge.php"),
        "<?php $b = str_repeat('y', 65536); for ($i = 0; $i < 1600; $i++) { echo $b; }",
    )
    .unwrap();
    let site = php_site(&fpm, root.path(), "");
    let plain = site.addr("plain");
    let flags = tempfile::tempdir().unwrap();

    // HTTP/1.1: the first chunk before the script ends, chunked, then the connection's next
    // request.
    let flag = flags.path().join("h1");
    let mut s = TcpStream::connect(plain).unwrap();
    let req = format!(
        "GET /stream.php?f={} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        flag.display()
    );
    std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| contains(b, "first\n"));
    let text = String::from_utf8_lossy(&buf).to_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    assert!(!text.contains("last"), "{text}");
    std::fs::write(&flag, "go").unwrap();
    read_until(&mut s, &mut buf, |b| b.ends_with(b"0\r\n\r\n"));
    assert!(
        contains(&buf, "last\n"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    let mut next = Vec::new();
    std::io::Write::write_all(
        &mut s,
        b"GET /teapot.php HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    read_until(&mut s, &mut next, |b| contains(b, "teapot"));
    assert!(next.starts_with(b"HTTP/1.1 418"));

    // HTTP/2: the first DATA before the script ends.
    let flag = flags.path().join("h2");
    let config = default_client(&site.pki.ca_pem, &[b"h2"]);
    let web = site.addr("web");
    let path = format!("/stream.php?f={}", flag.display());
    let body = runtime().block_on(async {
        let client = h2_connect(web, Some((config, "localhost"))).await;
        let mut client = client.ready().await.unwrap();
        let (resp, _) = client
            .send_request(h2_get("localhost", &path, true), true)
            .unwrap();
        let resp = within(10, resp).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        let mut recv = resp.into_body();
        let mut got = Vec::new();
        while !contains(&got, "first\n") {
            let chunk = within(10, recv.data()).await.unwrap().unwrap().unwrap();
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        assert!(!contains(&got, "last"));
        std::fs::write(&flag, "go").unwrap();
        while let Some(chunk) = within(10, recv.data()).await.unwrap() {
            let chunk = chunk.unwrap();
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        got
    });
    assert_eq!(String::from_utf8_lossy(&body), "first\nlast\n");

    // 100 MB through bounded memory, read slowly enough for the pipe to fill.
    let before = site.v.proc.rss_kib();
    let mut s = TcpStream::connect(plain).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    std::io::Write::write_all(&mut s, b"GET /huge.php HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let (mut total, mut peak) = (0u64, before);
    let mut chunk = vec![0u8; 256 * 1024];
    loop {
        let n = std::io::Read::read(&mut s, &mut chunk).expect("read within 20 s");
        if n == 0 {
            break;
        }
        total += n as u64;
        if total % (8 << 20) < n as u64 {
            peak = peak.max(site.v.proc.rss_kib());
        }
    }
    let body_len = 1600 * 65536u64;
    assert!(total > body_len, "{total}");
    let head = total - body_len;
    assert!(head < 1024, "{total}");
    eprintln!("huge: veloxy RSS {before} KiB before, {peak} KiB at most while streaming 100 MiB");
    assert!(
        peak < before + 32 * 1024,
        "veloxy grew from {before} to {peak} KiB for a streamed body"
    );
}

/// Issue 38: `try_files = ["$uri", "$uri/", "/index.php"]`, nginx's front controller: a
/// static file is served by veloxy (php-fpm's access log never sees it), a script is run
/// (never its source served), a directory's index.php runs, anything else goes to
/// /index.php with REQUEST_URI and the query as they came; a path out of the root is
/// refused. Over HTTP/1.1 and HTTP/2.
#[test]
fn fastcgi_try_files_front_controller() {
    let Some(fpm) = php_fpm() else {
        skip("fastcgi_try_files_front_controller: no php-fpm (apt-get install php-fpm)");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let files = [
        (
            "index.php",
            r#"<?php header('Content-Type: application/json');
echo json_encode(['front' => true, 'uri' => $_SERVER['REQUEST_URI'], 'query' => $_SERVER['QUERY_STRING'],
  'script' => $_SERVER['SCRIPT_NAME'], 'x' => $_GET['x'] ?? null]);"#,
        ),
        ("style.css", "body { color: teal }\n"),
        ("secret.php", "<?php echo 'ran';"),
        (
            "docs/index.php",
            "<?php echo 'docs ', $_SERVER['SCRIPT_NAME'];",
        ),
    ];
    std::fs::create_dir(root.path().join("docs")).unwrap();
    for (name, text) in files {
        std::fs::write(root.path().join(name), text).unwrap();
    }
    let site = php_site(
        &fpm,
        root.path(),
        "try_files = [\"$uri\", \"$uri/\", \"/index.php\"]",
    );

    // A static file: veloxy's, with its type; php-fpm sees nothing of it.
    let (status, raw) = site.h1("/style.css", "");
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw_body(&raw), "body { color: teal }\n");
    assert!(raw_header(&raw, "content-type").is_some_and(|t| t.starts_with("text/css")));
    let r = site.h2("/style.css", &[]);
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (200, "body { color: teal }\n")
    );

    // The front controller, with the request's URI and query.
    let (status, raw) = site.h1("/some/route?x=1", "");
    assert_eq!(status, 200, "{raw}");
    let v = json(raw_body(&raw));
    assert_eq!(v["uri"], "/some/route?x=1");
    assert_eq!(v["query"], "x=1");
    assert_eq!(v["x"], "1");
    assert_eq!(v["script"], "/index.php");
    let r = site.h2("/blog/2024/hello?x=2&y=3", &[]);
    let v = json(&r.body_str());
    assert_eq!(v["uri"], "/blog/2024/hello?x=2&y=3");
    assert_eq!(v["query"], "x=2&y=3");

    // A script runs (its source is never served); a directory runs its index.php.
    let (status, raw) = site.h1("/secret.php", "");
    assert_eq!((status, raw_body(&raw)), (200, "ran"));
    let (status, raw) = site.h1("/docs/", "");
    assert_eq!((status, raw_body(&raw)), (200, "docs /docs/index.php"));

    // Out of the root: refused, nothing read.
    for path in ["/../../../etc/passwd", "/%2e%2e/%2e%2e/%2e%2e/etc/passwd"] {
        let (status, raw) = site.h1(path, "");
        assert!(matches!(status, 400 | 404), "{path}: {raw}");
        assert!(!raw.contains("root:"), "{path}: {raw}");
    }

    // php-fpm ran the scripts, never the stylesheet.
    assert!(
        eventually(Duration::from_secs(5), || fpm
            .access_log()
            .contains("/docs/index.php")),
        "{}",
        fpm.access_log()
    );
    assert!(
        !fpm.access_log().contains("style.css"),
        "{}",
        fpm.access_log()
    );
}

/// `f`, waited on for at most `secs` seconds.
fn within<F: std::future::Future>(secs: u64, f: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(Duration::from_secs(secs), f)
}

/// One FastCGI request straight to php-fpm (as another web server sharing the pool would
/// send it): whether an answer came within `wait`.
fn direct_fastcgi_answers(fpm: &PhpFpm, script: &Path, wait: Duration) -> bool {
    use std::io::{Read, Write};
    let record = |kind: u8, body: &[u8]| {
        let mut r = vec![
            1,
            kind,
            0,
            1,
            (body.len() >> 8) as u8,
            body.len() as u8,
            0,
            0,
        ];
        r.extend_from_slice(body);
        r
    };
    let mut params = Vec::new();
    let script = script.display().to_string();
    for (k, v) in [
        ("SCRIPT_FILENAME", script.as_str()),
        ("REQUEST_METHOD", "GET"),
        ("SCRIPT_NAME", "/index.php"),
        ("REQUEST_URI", "/direct"),
    ] {
        params.extend_from_slice(&[k.len() as u8, v.len() as u8]);
        params.extend_from_slice(k.as_bytes());
        params.extend_from_slice(v.as_bytes());
    }
    let mut req = record(1, &[0, 1, 0, 0, 0, 0, 0, 0]);
    req.extend(record(4, &params));
    req.extend(record(4, &[]));
    req.extend(record(5, &[]));
    let Ok(mut c) = TcpStream::connect(fpm.addr) else {
        return false;
    };
    c.set_read_timeout(Some(wait)).unwrap();
    c.write_all(&req).unwrap();
    let mut buf = [0u8; 4096];
    let mut got = Vec::new();
    while let Ok(n) = c.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&got).contains("front /direct") {
            return true;
        }
    }
    false
}

/// A php-fpm child serves one connection until it closes, so an idle pooled FastCGI
/// connection holds a child: with a pool of one child, nothing else (another worker, another
/// web server) gets an answer while veloxy keeps it. FastCGI groups keep no idle connections
/// by default (nginx's default too).
#[test]
fn fastcgi_groups_hold_no_idle_php_children_by_default() {
    let Some(fpm) = php_fpm_with(1) else {
        skip("fastcgi_groups_hold_no_idle_php_children_by_default: no php-fpm");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    scripts(root.path());
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"php\"\nfastcgi = {{ root = \"{}\" }}\n\
         [upstreams.php]\nprotocol = \"fastcgi\"\nservers = [\"{}\"]\n",
        root.path().display(),
        fpm.addr
    ));
    let script = root.path().join("index.php");
    for i in 0..3 {
        let r = get(v.addr, "/index.php");
        assert_eq!(r.status, 200, "request {i}: {}", r.body_str());
        assert!(
            direct_fastcgi_answers(&fpm, &script, Duration::from_secs(3)),
            "php-fpm's only child is held by veloxy after request {i}"
        );
    }
}

/// `servers = ["unix:PATH"]`, as the issue writes it: php-fpm on a unix socket, over HTTP/1.1
/// and HTTP/2.
#[test]
fn php_fpm_on_a_unix_socket_over_http1_and_http2() {
    let Some(fpm) = php_fpm_on(2, true) else {
        skip("php_fpm_on_a_unix_socket_over_http1_and_http2: no php-fpm");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    scripts(root.path());
    let socket = fpm.socket.as_ref().unwrap().display().to_string();
    let site = Site::start(
        "",
        "",
        &format!(
            "[[routes]]\nupstream = \"php\"\n\
             fastcgi = {{ root = \"{}\", index = \"index.php\", split_path = \"^(.+\\\\.php)(/.*)$\" }}\n\
             [upstreams.php]\nprotocol = \"fastcgi\"\nservers = [\"unix:{socket}\"]\n",
            root.path().display()
        ),
    );
    let (status, raw) = site.h1("/vars.php/x?q=1", "");
    assert_eq!(status, 200, "{raw}");
    let v = json(raw_body(&raw));
    assert_eq!(v["PATH_INFO"], "/x");
    assert_eq!(v["QUERY_STRING"], "q=1");
    let r = site.h2("/vars.php/y", &[]);
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(json(&r.body_str())["PATH_INFO"], "/y");
}

/// A FastCGI request of a sampled exchange has its `upstream attempt` span under the server
/// span, with the connection and first-byte events (issue 40).
#[test]
fn fastcgi_attempts_are_traced() {
    let Some(col) = veloxy_testkit::otel::Collector::start() else {
        return;
    };
    let Some(fpm) = php_fpm() else { return };
    let root = tempfile::tempdir().unwrap();
    scripts(root.path());
    let server = format!(
        "[server.tracing]\notlp_endpoint = \"{}\"\nsample_ratio = 1.0",
        col.endpoint()
    );
    let site = Site::start(
        &server,
        "",
        &format!(
            "[[routes]]\nupstream = \"php\"\nfastcgi = {{ root = \"{}\" }}\n\
             [upstreams.php]\nprotocol = \"fastcgi\"\nservers = [\"{}\"]\n",
            root.path().display(),
            fpm.addr
        ),
    );
    let plain = site.addr("plain");
    for _ in 0..2 {
        let r = get(plain, "/teapot.php");
        assert_eq!(r.status, 418, "{}", r.body_str());
    }
    let spans = col.wait("two exchanges and their attempts", |s| s.len() >= 4);
    let servers: Vec<_> = spans.iter().filter(|s| s.kind == 2).collect();
    assert_eq!(servers.len(), 2, "{spans:#?}");
    for server in &servers {
        let attempts: Vec<_> = spans
            .iter()
            .filter(|s| s.kind == 3 && s.parent_span_id == server.span_id)
            .collect();
        assert_eq!(attempts.len(), 1, "{spans:#?}");
        let a = attempts[0];
        assert_eq!(a.name, "upstream attempt");
        assert_eq!(a.attr("http.response.status_code"), Some("200"), "{a:#?}");
        let names: Vec<&str> = a.events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["connected", "response head"], "{a:#?}");
        let reused = a.events[0]
            .1
            .get("veloxy.connection.reused")
            .map(String::as_str);
        assert!(reused.is_some(), "{a:#?}");
    }
}
