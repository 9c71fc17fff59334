//! Static file serving over the real binary: path safety, HTTP semantics (types, validators,
//! conditionals, ranges), content codings and sidecars, the cache, listings, `try_files`,
//! `compress = true` on a proxied route, and `veloxy serve`.

use veloxy_testkit::*;

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

const SECRET: &str = "TOPSECRET-outside-the-root";
const HIDDEN: &str = "HIDDENSECRET-dot-file";
const SIDECAR_MARKER: &str = "/* served from the .br sidecar */";

fn text(n: usize, seed: &str) -> String {
    let mut s = String::with_capacity(n + 64);
    let mut i = 0usize;
    while s.len() < n {
        s.push_str(&format!(
            "{seed} line {i}: function f{i}() {{ return {}; }}\n",
            i * 7
        ));
        i += 1;
    }
    s.truncate(n);
    s
}

fn binary(n: usize) -> Vec<u8> {
    let mut x = 0x1234_5678u32;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn brotli_bytes(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
        std::io::Write::write_all(&mut w, data).unwrap();
    }
    out
}

fn decode(encoding: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match encoding {
        None => out = body.to_vec(),
        Some("gzip") => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
        }
        Some("br") => {
            brotli::Decompressor::new(body, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        Some("zstd") => out = zstd::stream::decode_all(body).unwrap(),
        Some(other) => panic!("unexpected coding {other}"),
    }
    out
}

/// A site under a temp dir, with a secret next to (outside) the root.
struct Site {
    _dir: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
}

impl Site {
    fn file(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

fn site() -> Site {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let root = base.join("site");
    let w = |rel: &str, data: &[u8]| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    std::fs::write(base.join("secret.txt"), SECRET).unwrap();
    w("index.html", text(2000, "<p>index</p>").as_bytes());
    w("app.js", text(40_000, "app").as_bytes());
    w("small.txt", b"tiny");
    w("data.bin", &binary(100_000));
    w("big.txt", text(3 * 1024 * 1024, "big").as_bytes());
    w(".env", HIDDEN.as_bytes());
    w(
        ".well-known/security.txt",
        b"Contact: mailto:x@example.test\n",
    );
    w("sub/page.html", text(1000, "<p>page</p>").as_bytes());
    w("docs/<b>&\"x'.txt", b"odd name");
    w("docs/plain.txt", b"plain");
    // The .gz sidecar is written before the file (so it is older: ignored), the .br after.
    w("pre.css.gz", b"stale gzip sidecar, not even gzip");
    std::thread::sleep(Duration::from_millis(20));
    w("pre.css", text(5000, "body { color: red }").as_bytes());
    w("pre.css.br", &brotli_bytes(SIDECAR_MARKER.as_bytes()));
    std::os::unix::fs::symlink(base.join("secret.txt"), root.join("link-out")).unwrap();
    std::os::unix::fs::symlink(root.join("index.html"), root.join("link-in")).unwrap();
    std::os::unix::fs::symlink(base.join("."), root.join("dir-out")).unwrap();
    let spa = base.join("spa");
    std::fs::create_dir_all(spa.join("assets")).unwrap();
    std::fs::write(spa.join("index.html"), "<div id=app></div> SPA shell").unwrap();
    std::fs::write(spa.join("assets/app.js"), "console.log('spa')").unwrap();
    Site {
        _dir: dir,
        base,
        root,
    }
}

fn config(s: &Site) -> String {
    let root = s.root.display();
    let spa = s.base.join("spa");
    let spa = spa.display();
    format!(
        r#"[server]
workers = 1
[listeners.web]
addr = "127.0.0.1:0"
[[routes]]
path = "/"
root = "{root}"
cache_control = "public, max-age=60"
[[routes]]
path = "/spa/"
root = "{spa}"
try_files = ["$uri.html", "/index.html"]
[[routes]]
path = "/browse/"
root = "{root}"
browse = true
[[routes]]
path = "/follow/"
root = "{root}"
follow_symlinks = true
[[routes]]
path = "/hidden/"
root = "{root}"
allow_hidden = true
[[routes]]
path = "/plain/"
root = "{root}"
compress = false
precompressed = false
"#
    )
}

fn start() -> (Site, Veloxy) {
    let s = site();
    let v = veloxy(&config(&s));
    (s, v)
}

/// GET (or another method) with extra headers, on a fresh connection.
fn req(v: &Veloxy, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: files.test\r\nConnection: close\r\n");
    for (n, val) in headers {
        raw.push_str(&format!("{n}: {val}\r\n"));
    }
    raw.push_str("\r\n");
    request(v.addr, &raw)
}

fn get_h(v: &Veloxy, path: &str, headers: &[(&str, &str)]) -> Response {
    req(v, "GET", path, headers)
}

#[test]
fn traversal_attacks_are_refused() {
    let (s, v) = start();
    let attacks = [
        "/../secret.txt",
        "/../../secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/secret.txt",
        "/.%2e/secret.txt",
        "/%2e./secret.txt",
        "/sub/%2e%2e/%2e%2e/secret.txt",
        "/%252e%252e/secret.txt",
        "/%252e%252e%252fsecret.txt",
        "/..%2fsecret.txt",
        "/%2e%2e%2fsecret.txt",
        "/sub%2f..%2f..%2fsecret.txt",
        "/..%5csecret.txt",
        "/%5c..%5csecret.txt",
        "/%2e%2e%5csecret.txt",
        "/..\\secret.txt",
        "/%c0%ae%c0%ae/secret.txt",
        "/%e0%80%ae%e0%80%ae/secret.txt",
        "/..%c0%afsecret.txt",
        "/index.html%00",
        "/%00/../secret.txt",
        "/./../secret.txt",
        "//../secret.txt",
        "/..;/secret.txt",
        "/link-out",
        "/link-out/../secret.txt",
        "/dir-out/secret.txt",
        "/.env",
        "/%2eenv",
        "/sub/../.env",
        "/sub/%2e%2e/.env",
        "/spa/../secret.txt",
        "/browse/../../secret.txt",
        "/browse/dir-out/",
        "http://files.test/../secret.txt",
    ];
    assert!(attacks.len() >= 20);
    let base = s.base.display().to_string();
    for a in attacks {
        let r = get_h(&v, a, &[]);
        assert!(
            [400, 403, 404].contains(&r.status),
            "{a}: status {}",
            r.status
        );
        let body = r.body_str();
        assert!(!body.contains(SECRET), "{a} leaked the secret");
        assert!(!body.contains(HIDDEN), "{a} leaked the dot file");
        assert!(!body.contains(&base), "{a} leaked a path: {body}");
    }
    // NUL and a raw backslash straight on the wire.
    for raw in [
        &b"GET /a\0b HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"GET /..\\..\\secret.txt HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let mut c = Client::connect(v.addr);
        c.send(raw);
        if let Some(r) = c.try_read_response(false) {
            assert!([400, 403, 404].contains(&r.status), "{}", r.status);
            assert!(!r.body_str().contains(SECRET));
        }
    }
    // Still serving normally afterwards.
    assert_eq!(get_h(&v, "/index.html", &[]).status, 200);
}

#[test]
fn serves_files_with_type_validators_and_keep_alive() {
    let (s, v) = start();
    let index = std::fs::read(s.file("index.html")).unwrap();
    let mut c = Client::connect(v.addr);
    c.send(b"GET /index.html HTTP/1.1\r\nHost: files.test\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, index);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("cache-control"), Some("public, max-age=60"));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    assert!(r.header("date").is_some());
    let etag = r.header("etag").unwrap().to_owned();
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "strong: {etag}"
    );
    let lm = r.header("last-modified").unwrap().to_owned();
    assert!(lm.ends_with(" GMT"), "{lm}");
    // Same connection: HEAD has the headers and no body, then GET / gives the index.
    c.send(b"HEAD /index.html HTTP/1.1\r\nHost: files.test\r\n\r\n");
    let h = c.read_response(true);
    assert_eq!(h.status, 200);
    assert_eq!(h.header("content-length"), Some(&*index.len().to_string()));
    assert_eq!(h.header("etag"), Some(&*etag));
    c.send(b"GET / HTTP/1.1\r\nHost: files.test\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!((r.status, r.body.len()), (200, index.len()));
    // Types by extension.
    for (path, ty) in [
        ("/app.js", "text/javascript; charset=utf-8"),
        ("/pre.css", "text/css; charset=utf-8"),
        ("/data.bin", "application/octet-stream"),
        ("/small.txt", "text/plain; charset=utf-8"),
    ] {
        c.send(format!("GET {path} HTTP/1.1\r\nHost: files.test\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        assert_eq!(r.header("content-type"), Some(ty), "{path}");
    }
    // A directory without its slash redirects; a symlink inside the root is fine.
    c.send(b"GET /sub?x=1 HTTP/1.1\r\nHost: files.test\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/sub/?x=1"));
    c.send(b"GET /link-in HTTP/1.1\r\nHost: files.test\r\n\r\n");
    assert_eq!(c.read_response(false).body, index);
    // Other methods: 405 with Allow, connection kept.
    c.send(b"DELETE /index.html HTTP/1.1\r\nHost: files.test\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    // Missing: 404 without a path in the body.
    c.send(b"GET /nope.html HTTP/1.1\r\nHost: files.test\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.status, 404);
    assert!(!r.body_str().contains(&s.base.display().to_string()));
    // A GET with a body is answered, and the connection closed (the body is never read).
    c.send(b"GET /small.txt HTTP/1.1\r\nHost: files.test\r\nContent-Length: 5\r\n\r\nhello");
    let r = c.read_response(false);
    assert_eq!((r.status, r.body_str().as_str()), (200, "tiny"));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed());
    // The large file goes through sendfile: intact.
    let big = std::fs::read(s.file("big.txt")).unwrap();
    let r = get_h(&v, "/plain/big.txt", &[]);
    assert_eq!(r.body.len(), big.len());
    assert!(r.body == big, "big file differs");
}

#[test]
fn unreadable_file_is_forbidden() {
    use std::os::unix::fs::PermissionsExt;
    let (s, v) = start();
    let p = s.file("locked.txt");
    std::fs::write(&p, "locked").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&p).is_ok() {
        return skip("running as root: file permissions are not enforced, no 403 to check");
    }
    let r = get_h(&v, "/locked.txt", &[]);
    assert_eq!(r.status, 403);
    assert!(!r.body_str().contains("locked.txt"));
}

fn multipart_parts(r: &Response) -> Vec<(String, Vec<u8>)> {
    let ct = r.header("content-type").unwrap();
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .expect("multipart content type");
    let delim = format!("--{boundary}");
    let body = &r.body;
    let mut parts = Vec::new();
    let mut pos = find(body, delim.as_bytes(), 0).unwrap();
    loop {
        pos += delim.len();
        if body[pos..].starts_with(b"--") {
            break;
        }
        let head_end = find(body, b"\r\n\r\n", pos).unwrap();
        let head = String::from_utf8_lossy(&body[pos..head_end]).into_owned();
        let range = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Range: "))
            .unwrap()
            .to_owned();
        let next = find(body, format!("\r\n{delim}").as_bytes(), head_end).unwrap();
        parts.push((range, body[head_end + 4..next].to_vec()));
        pos = next + 2;
    }
    parts
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

#[test]
fn byte_ranges() {
    let (s, v) = start();
    let data = std::fs::read(s.file("data.bin")).unwrap();
    let len = data.len();
    let range = |h: &str| get_h(&v, "/data.bin", &[("Range", h)]);

    let r = range("bytes=0-9");
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        Some(&*format!("bytes 0-9/{len}"))
    );
    assert_eq!(r.body, &data[..10]);
    let r = range("bytes=-10");
    assert_eq!(
        r.header("content-range"),
        Some(&*format!("bytes {}-{}/{len}", len - 10, len - 1))
    );
    assert_eq!(r.body, &data[len - 10..]);
    let r = range("bytes=99000-");
    assert_eq!(r.body, &data[99_000..]);
    let r = range("bytes=99990-200000");
    assert_eq!(r.body, &data[99_990..]);
    let r = range(&format!("bytes=-{}", len * 2));
    assert_eq!((r.status, r.body.len()), (206, len));
    for bad in ["bytes=100000-", "bytes=200000-300000", "bytes=-0"] {
        let r = range(bad);
        assert_eq!(r.status, 416, "{bad}");
        assert_eq!(r.header("content-range"), Some(&*format!("bytes */{len}")));
    }
    // Malformed or abusive: ignored, full 200.
    for ignored in [
        "bytes=5-1",
        "items=0-1",
        "bytes=x-y",
        "bytes=0-99999,0-99999",
    ] {
        let r = range(ignored);
        assert_eq!((r.status, r.body.len()), (200, len), "{ignored}");
    }
    // Several ranges: multipart/byteranges, in request order.
    let r = range("bytes=0-1, 10-19, -5");
    assert_eq!(r.status, 206);
    let parts = multipart_parts(&r);
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[0], (format!("bytes 0-1/{len}"), data[0..2].to_vec()));
    assert_eq!(
        parts[1],
        (format!("bytes 10-19/{len}"), data[10..20].to_vec())
    );
    assert_eq!(parts[2].1, &data[len - 5..]);
    assert_eq!(r.header("content-length"), Some(&*r.body.len().to_string()));
    // If-Range: a matching ETag or date keeps the range, anything else gets the whole file.
    let full = get_h(&v, "/data.bin", &[]);
    let etag = full.header("etag").unwrap();
    let lm = full.header("last-modified").unwrap();
    let r = get_h(
        &v,
        "/data.bin",
        &[("Range", "bytes=0-9"), ("If-Range", etag)],
    );
    assert_eq!((r.status, r.body.len()), (206, 10));
    let r = get_h(&v, "/data.bin", &[("Range", "bytes=0-9"), ("If-Range", lm)]);
    assert_eq!(r.status, 206);
    let r = get_h(
        &v,
        "/data.bin",
        &[("Range", "bytes=0-9"), ("If-Range", "\"stale\"")],
    );
    assert_eq!((r.status, r.body.len()), (200, len));
    let weak = format!("W/{etag}");
    let r = get_h(
        &v,
        "/data.bin",
        &[("Range", "bytes=0-9"), ("If-Range", &weak)],
    );
    assert_eq!(r.status, 200, "a weak validator never matches If-Range");
    // HEAD ignores Range. Ranges on a sendfile-served file, single and multiple.
    let r = req(&v, "HEAD", "/data.bin", &[("Range", "bytes=0-9")]);
    assert_eq!(r.status, 200);
    let big = std::fs::read(s.file("big.txt")).unwrap();
    let r = get_h(&v, "/big.txt", &[("Range", "bytes=2000000-2000099")]);
    assert_eq!((r.status, &r.body[..]), (206, &big[2_000_000..2_000_100]));
    let r = get_h(&v, "/big.txt", &[("Range", "bytes=5-9,3000000-")]);
    let parts = multipart_parts(&r);
    assert_eq!(parts[0].1, &big[5..10]);
    assert_eq!(parts[1].1, &big[3_000_000..]);
    // A range request is answered uncompressed even when the client accepts codings.
    let r = get_h(
        &v,
        "/app.js",
        &[("Range", "bytes=0-99"), ("Accept-Encoding", "gzip, br")],
    );
    assert_eq!((r.status, r.header("content-encoding")), (206, None));
}

#[test]
fn conditional_requests() {
    let (_s, v) = start();
    let full = get_h(&v, "/data.bin", &[]);
    let etag = full.header("etag").unwrap().to_owned();
    let lm = full.header("last-modified").unwrap().to_owned();
    let status = |h: &[(&str, &str)]| get_h(&v, "/data.bin", h).status;

    assert_eq!(status(&[("If-None-Match", &etag)]), 304);
    let list = format!("\"a\", {etag}, \"b\"");
    assert_eq!(status(&[("If-None-Match", &list)]), 304);
    assert_eq!(status(&[("If-None-Match", "*")]), 304);
    let weak = format!("W/{etag}");
    assert_eq!(status(&[("If-None-Match", &weak)]), 304, "weak comparison");
    assert_eq!(status(&[("If-None-Match", "\"other\"")]), 200);
    assert_eq!(status(&[("If-Modified-Since", &lm)]), 304);
    assert_eq!(
        status(&[("If-Modified-Since", "Thu, 01 Jan 2015 00:00:00 GMT")]),
        200
    );
    assert_eq!(
        status(&[("If-None-Match", "\"other\""), ("If-Modified-Since", &lm)]),
        200,
        "If-None-Match takes precedence"
    );
    assert_eq!(status(&[("If-Match", "\"other\"")]), 412);
    assert_eq!(status(&[("If-Match", &etag)]), 200);
    assert_eq!(
        status(&[("If-Unmodified-Since", "Thu, 01 Jan 2015 00:00:00 GMT")]),
        412
    );
    let r = get_h(&v, "/data.bin", &[("If-None-Match", &etag)]);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(&*etag));
    assert_eq!(r.header("cache-control"), Some("public, max-age=60"));
    // A compressed variant has its own tag: revalidating it gives 304 for that coding only.
    let gz = get_h(&v, "/app.js", &[("Accept-Encoding", "gzip")]);
    let gz_tag = gz.header("etag").unwrap().to_owned();
    assert_ne!(Some(&*gz_tag), get_h(&v, "/app.js", &[]).header("etag"));
    let h = [
        ("Accept-Encoding", "gzip"),
        ("If-None-Match", gz_tag.as_str()),
    ];
    assert_eq!(get_h(&v, "/app.js", &h).status, 304);
    let h = [
        ("Accept-Encoding", "br"),
        ("If-None-Match", gz_tag.as_str()),
    ];
    assert_eq!(get_h(&v, "/app.js", &h).status, 200);
}

#[test]
fn content_negotiation_and_compressed_bodies() {
    let (s, v) = start();
    let app = std::fs::read(s.file("app.js")).unwrap();
    for (accept, want) in [
        (None, None),
        (Some("gzip"), Some("gzip")),
        (Some("br"), Some("br")),
        (Some("zstd"), Some("zstd")),
        (Some("gzip, deflate, br, zstd"), Some("br")),
        (Some("gzip, zstd"), Some("zstd")),
        (Some("br;q=0, gzip"), Some("gzip")),
        (Some("gzip;q=0.5, zstd;q=0.9"), Some("zstd")),
        (Some("*"), Some("br")),
        (Some("*;q=0.5, br;q=0"), Some("zstd")),
        (Some("*;q=0"), None),
        (Some("identity"), None),
        (Some("gzip;q=0.5, identity"), None),
        (Some("gzip;q=0, br;q=0, zstd;q=0"), None),
        (Some("deflate"), None),
    ] {
        let headers: Vec<(&str, &str)> = accept.iter().map(|a| ("Accept-Encoding", *a)).collect();
        let r = get_h(&v, "/app.js", &headers);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-encoding"),
            want,
            "Accept-Encoding: {accept:?}"
        );
        assert_eq!(r.header("vary"), Some("Accept-Encoding"));
        let body = decode(want, &r.body);
        assert!(body == app, "{accept:?}: decoded body differs");
        if want.is_some() {
            assert!(r.body.len() < app.len() / 3, "{want:?} compresses");
        }
    }
    // HEAD announces the coded length.
    let g = get_h(&v, "/app.js", &[("Accept-Encoding", "gzip")]);
    let h = req(&v, "HEAD", "/app.js", &[("Accept-Encoding", "gzip")]);
    assert_eq!(h.header("content-length"), Some(&*g.body.len().to_string()));
    // Not compressed: binary types, tiny files, and a route with compress = false.
    for path in ["/data.bin", "/small.txt", "/plain/app.js"] {
        let r = get_h(&v, path, &[("Accept-Encoding", "gzip, br, zstd")]);
        assert_eq!(r.header("content-encoding"), None, "{path}");
    }
    assert_eq!(get_h(&v, "/data.bin", &[]).header("vary"), None);
}

#[test]
fn precompressed_sidecars() {
    let (s, v) = start();
    let css = std::fs::read(s.file("pre.css")).unwrap();
    // The .br sidecar is newer: used as is (its content differs from the file, on purpose).
    let r = get_h(&v, "/pre.css", &[("Accept-Encoding", "br")]);
    assert_eq!(r.header("content-encoding"), Some("br"));
    assert_eq!(decode(Some("br"), &r.body), SIDECAR_MARKER.as_bytes());
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    // The .gz sidecar is older than the file: ignored, gzip is made from the file.
    let r = get_h(&v, "/pre.css", &[("Accept-Encoding", "gzip")]);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(decode(Some("gzip"), &r.body), css);
    // A sidecar is preferred by negotiation like any coding.
    let r = get_h(&v, "/pre.css", &[("Accept-Encoding", "gzip, br")]);
    assert_eq!(r.header("content-encoding"), Some("br"));
    // precompressed = false (and compress = false): identity.
    let r = get_h(&v, "/plain/pre.css", &[("Accept-Encoding", "br")]);
    assert_eq!((r.header("content-encoding"), r.body.clone()), (None, css));
    // A sidecar for a file above the in-memory limit is sent from its file.
    let big = std::fs::read(s.file("big.txt")).unwrap();
    let packed = zstd::bulk::compress(&big, 3).unwrap();
    std::fs::write(s.file("big.txt.zst"), &packed).unwrap();
    assert!(eventually(Duration::from_secs(5), || {
        get_h(&v, "/big.txt", &[("Accept-Encoding", "zstd")]).header("content-encoding")
            == Some("zstd")
    }));
    let r = get_h(&v, "/big.txt", &[("Accept-Encoding", "zstd")]);
    assert!(decode(Some("zstd"), &r.body) == big);
}

#[test]
fn cache_notices_changed_and_deleted_files() {
    let (s, v) = start();
    let p = s.file("changing.txt");
    std::fs::write(&p, "version one").unwrap();
    let first = get_h(&v, "/changing.txt", &[]);
    assert_eq!(first.body_str(), "version one");
    let tag1 = first.header("etag").unwrap().to_owned();
    // Served from the cache meanwhile; the new content shows within the revalidation period.
    std::fs::write(&p, "version two, longer").unwrap();
    assert!(
        eventually(Duration::from_secs(5), || get_h(&v, "/changing.txt", &[])
            .body_str()
            == "version two, longer"),
        "the change never showed"
    );
    let second = get_h(&v, "/changing.txt", &[]);
    assert_ne!(second.header("etag"), Some(&*tag1));
    // The compressed variant follows the content too.
    let js = s.file("changing.js");
    let v1 = text(10_000, "one");
    std::fs::write(&js, &v1).unwrap();
    let r = get_h(&v, "/changing.js", &[("Accept-Encoding", "gzip")]);
    assert_eq!(decode(Some("gzip"), &r.body), v1.as_bytes());
    let v2 = text(12_000, "two");
    std::fs::write(&js, &v2).unwrap();
    assert!(eventually(Duration::from_secs(5), || {
        let r = get_h(&v, "/changing.js", &[("Accept-Encoding", "gzip")]);
        decode(Some("gzip"), &r.body) == v2.as_bytes()
    }));
    // Deleted: 404 once revalidated.
    std::fs::remove_file(&p).unwrap();
    assert!(eventually(Duration::from_secs(5), || get_h(
        &v,
        "/changing.txt",
        &[]
    )
    .status
        == 404));
}

#[test]
fn symlinks_and_dot_files() {
    let (_s, v) = start();
    let r = get_h(&v, "/link-out", &[]);
    assert_eq!(r.status, 403);
    assert!(!r.body_str().contains(SECRET));
    assert_eq!(get_h(&v, "/dir-out/secret.txt", &[]).status, 403);
    // follow_symlinks = true serves them.
    let r = get_h(&v, "/follow/link-out", &[]);
    assert_eq!((r.status, r.body_str().as_str()), (200, SECRET));
    assert_eq!(get_h(&v, "/follow/dir-out/secret.txt", &[]).status, 200);
    // Dot files: 404 by default, served with allow_hidden; .well-known always.
    assert_eq!(get_h(&v, "/.env", &[]).status, 404);
    let r = get_h(&v, "/hidden/.env", &[]);
    assert_eq!((r.status, r.body_str().as_str()), (200, HIDDEN));
    assert_eq!(get_h(&v, "/.well-known/security.txt", &[]).status, 200);
}

#[test]
fn try_files_falls_back_for_single_page_apps() {
    let (_s, v) = start();
    for path in ["/spa/", "/spa/some/deep/route", "/spa/settings?tab=2"] {
        let r = get_h(&v, path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body_str().contains("SPA shell"), "{path}");
        assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    }
    assert_eq!(
        get_h(&v, "/spa/assets/app.js", &[]).body_str(),
        "console.log('spa')"
    );
    // `$uri.html`: /spa/index resolves to index.html through the first pattern.
    assert!(get_h(&v, "/spa/index", &[])
        .body_str()
        .contains("SPA shell"));
    // Fallbacks never bypass the path rules.
    assert_eq!(get_h(&v, "/spa/%2e%2e/secret.txt", &[]).status, 400);
    assert_eq!(get_h(&v, "/spa/.env", &[]).status, 404);
}

#[test]
fn directory_listing_is_opt_in_and_escaped() {
    let (_s, v) = start();
    assert_eq!(get_h(&v, "/docs/", &[]).status, 404, "off by default");
    let r = get_h(&v, "/browse/docs/", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let html = r.body_str();
    assert!(html.contains("&lt;b&gt;&amp;&quot;x&#39;.txt"), "{html}");
    assert!(!html.contains("<b>"), "raw markup from a file name: {html}");
    assert!(html.contains("href=\"./%3Cb%3E%26%22x%27.txt\""), "{html}");
    assert!(html.contains("plain.txt"));
    // Hidden entries are not listed; a directory with an index shows the index.
    let root = get_h(&v, "/browse/", &[]).body_str();
    assert!(!root.contains(".env"));
    let r = get_h(&v, "/browse/docs/plain.txt", &[]);
    assert_eq!(r.body_str(), "plain");
}

#[test]
fn compress_filter_on_a_proxied_route() {
    let up = upstream(&["--name", "u1"]);
    let cfg = format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\ncompress = true\n[[routes]]\npath = \"/raw/\"\nupstream = \"app\"\n[upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    );
    let v = veloxy(&cfg);
    let pattern: Vec<u8> = (0..300_000u64).map(|i| b'a' + (i % 26) as u8).collect();
    let mut c = Client::connect(v.addr);
    for (target, encoding) in [
        ("/size/300000?text=1", "gzip"),
        ("/size/300000?text=1", "br"),
        ("/size/300000?text=1", "zstd"),
        ("/size/300000?text=1&chunked=1", "gzip"),
        ("/size/300000?text=1&chunked=1", "br"),
    ] {
        c.send(
            format!("GET {target} HTTP/1.1\r\nHost: t\r\nAccept-Encoding: {encoding}\r\n\r\n")
                .as_bytes(),
        );
        let r = c.read_response(false);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), Some(encoding), "{target}");
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        assert_eq!(r.header("content-length"), None);
        assert_eq!(r.header("vary"), Some("Accept-Encoding"));
        assert!(r.body.len() < 30_000, "{encoding}: {} bytes", r.body.len());
        assert!(
            decode(Some(encoding), &r.body) == pattern,
            "{target} {encoding}"
        );
    }
    // Close-delimited upstream body: compressed, then the connection closes.
    let r = request(
        v.addr,
        "GET /size/300000?text=1&close=1 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: zstd\r\n\r\n",
    );
    assert!(decode(Some("zstd"), &r.body) == pattern);
    // Not compressed: client without Accept-Encoding (but Vary is set), binary types, HEAD,
    // HTTP/1.0, and routes without the option.
    let r = request(v.addr, "GET /size/5000?text=1 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.header("content-length"), Some("5000"));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    for raw in [
        "GET /size/5000 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n",
        "HEAD /size/5000?text=1 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n",
        "GET /size/5000?text=1 HTTP/1.0\r\nAccept-Encoding: gzip\r\n\r\n",
        "GET /raw/size/5000?text=1 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n",
        "GET /size/100?text=1 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n",
    ] {
        let r = request(v.addr, raw);
        assert_eq!(r.header("content-encoding"), None, "{raw}");
    }
}

#[test]
fn compress_filter_streams_without_buffering() {
    // 64 MiB through the filter: the proxy's memory stays far below the body size.
    let up = upstream(&["--name", "u1"]);
    let cfg = format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\ncompress = true\n[upstreams.app]\nservers = [\"{}\"]\n",
        up.addr
    );
    let v = veloxy(&cfg);
    let before = v.proc.rss_kib();
    let len = 64u64 << 20;
    let r = request(
        v.addr,
        &format!("GET /size/{len}?text=1 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"),
    );
    let body = decode(Some("gzip"), &r.body);
    assert_eq!(body.len() as u64, len);
    let growth = v.proc.rss_kib().saturating_sub(before);
    assert!(growth < 16 * 1024, "RSS grew by {growth} KiB");
}

#[test]
fn serve_command() {
    let s = site();
    let dir = tempfile::tempdir().unwrap();
    let root = s.root.display().to_string();
    let v = veloxy_cmd(
        std::process::Command::new(VELOXY),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--root",
            &root,
            "--workers",
            "1",
        ],
        dir,
    );
    let r = get_h(&v, "/", &[("Accept-Encoding", "gzip")]);
    assert_eq!(r.status, 200);
    let index = std::fs::read(s.file("index.html")).unwrap();
    assert_eq!(decode(r.header("content-encoding"), &r.body), index);
    assert_eq!(get_h(&v, "/../secret.txt", &[]).status, 400);
    assert_eq!(get_h(&v, "/docs/", &[]).status, 404);
    // --browse and --fallback.
    let dir = tempfile::tempdir().unwrap();
    let spa = s.base.join("spa").display().to_string();
    let v = veloxy_cmd(
        std::process::Command::new(VELOXY),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--root",
            &spa,
            "--workers",
            "1",
            "--browse",
            "--fallback",
            "index.html",
        ],
        dir,
    );
    assert!(get_h(&v, "/deep/link", &[])
        .body_str()
        .contains("SPA shell"));
    assert!(get_h(&v, "/assets/", &[]).body_str().contains("app.js"));
}

#[test]
fn file_route_metrics_count_requests() {
    let s = site();
    let cfg = config(&s).replace(
        "[server]\nworkers = 1\n",
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n",
    );
    let v = veloxy(&cfg);
    let _ = get_h(&v, "/index.html", &[]);
    let _ = get_h(&v, "/missing", &[]);
    let admin = eventually_admin(&v);
    // Counted once the response is written: poll rather than race the scrape.
    let ok_line =
        "veloxy_requests_total{listener=\"web\",route=\"0\",upstream=\"\",status=\"2xx\"} 1";
    let missing_line = "route=\"0\",upstream=\"\",status=\"4xx\"} 1";
    let mut m = String::new();
    let counted = eventually(Duration::from_secs(5), || {
        m = get(admin, "/metrics").body_str();
        m.contains(ok_line) && m.contains(missing_line)
    });
    assert!(counted, "{m}");
}

fn eventually_admin(v: &Veloxy) -> std::net::SocketAddr {
    let mut addr = None;
    assert!(eventually(Duration::from_secs(5), || {
        addr = v.proc.log_text().lines().find_map(|l| {
            l.contains("admin endpoint")
                .then(|| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
                .flatten()
                .and_then(|a| a.parse().ok())
        });
        addr.is_some()
    }));
    addr.unwrap()
}

/// A `path_regex` file route serves the whole request path under its root (nginx's
/// `location ~* \.(css|js)$ { expires 30d; }` under a server `root`, as `veloxy import`
/// writes it), with the route's own cache_control; other paths go to the other routes.
#[test]
fn path_regex_file_routes_serve_the_whole_path_under_root() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("site/assets")).unwrap();
    std::fs::write(dir.path().join("site/assets/app.css"), "body{}").unwrap();
    std::fs::write(dir.path().join("site/index.html"), "<p>home</p>").unwrap();
    let root = dir.path().join("site");
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\npath_regex = '(?i)\\.(css|js)$'\nroot = \"{0}\"\ncache_control = \"max-age=2592000\"\n\
         [[routes]]\nroot = \"{0}\"\n",
        root.display()
    ));
    let r = get(v.addr, "/assets/app.css");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.body_str(), "body{}");
    assert_eq!(r.header("cache-control"), Some("max-age=2592000"));
    let r = get(v.addr, "/assets/APP.CSS");
    assert_eq!(r.status, 404, "the regex matches, the file name does not");
    assert_eq!(
        r.header("cache-control"),
        None,
        "a 404 carries no file cache_control"
    );
    let r = get(v.addr, "/");
    assert_eq!(r.body_str(), "<p>home</p>");
    assert_eq!(r.header("cache-control"), None);
    let r = get(v.addr, "/../../etc/passwd.css");
    assert_ne!(r.status, 200, "no way out of the root");
}
