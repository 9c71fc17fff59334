//! FastCGI routes (issue 38) against a real php-fpm (Debian's `php-fpm`) running PHP scripts:
//! the CGI parameters, PATH_INFO by `split_path`, the front controller, request bodies,
//! redirects and cookies, statuses, a 2 MiB answer, stderr in the log, connection reuse, and
//! a dead FastCGI server; over HTTP/1.1 and HTTP/2.

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
    _dir: tempfile::TempDir,
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
    let bin = php_fpm_binary()?;
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = dir.path().join("php-fpm.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\nerror_log = {}/php-fpm.log\ndaemonize = no\n\
             [www]\nlisten = 127.0.0.1:{port}\npm = static\npm.max_children = 2\n\
             catch_workers_output = no\nclear_env = yes\n",
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
    let fpm = PhpFpm {
        child,
        addr,
        _dir: dir,
    };
    eventually(Duration::from_secs(10), || TcpStream::connect(addr).is_ok()).then_some(fpm)
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
