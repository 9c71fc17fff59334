//! Automatic certificates (issue 14) against a real ACME server: Debian's pebble, with
//! pebble-challtestsrv resolving every name to 127.0.0.1. veloxy starts first (pebble must be
//! told veloxy's ports), so every test also starts with the CA down.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use veloxy_testkit::*;

/// A veloxy with an ACME listener `web` (plus a file certificate for `files.test`), a plain
/// listener `plain` that redirects everything to HTTPS (http-01 challenges must be answered
/// before that redirect), and the admin endpoint; returns it with its ports.
struct Setup {
    v: Veloxy,
    web: SocketAddr,
    plain: SocketAddr,
    admin: SocketAddr,
}

fn config(acme_port: u16, ca_pem: &Path, storage: &Path, acme: &str, extra: &str) -> String {
    let dir = storage.parent().unwrap();
    let pki = Pki::new(dir);
    let (cert, key) = pki.leaf("files", &["files.test"], KeyKind::Ecdsa);
    format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [server.acme]\nemail = \"ops@example.test\"\n\
         directory = \"https://127.0.0.1:{acme_port}/dir\"\nca_file = \"{}\"\nstorage = \"{}\"\n{extra}\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [listeners.web.tls]\nacme = {acme}\n\
         [[listeners.web.tls.certs]]\nhosts = [\"files.test\"]\ncert = \"{}\"\nkey = \"{}\"\n\
         [listeners.plain]\naddr = \"127.0.0.1:0\"\nredirect_https = true\n\
         [[routes]]\nrespond = {{ body = \"hello\" }}\n",
        ca_pem.display(),
        storage.display(),
        cert.display(),
        key.display(),
    )
}

fn start(config: &str) -> Setup {
    start_with(std::process::Command::new(VELOXY), config)
}

fn start_with(cmd: std::process::Command, config: &str) -> Setup {
    let v = veloxy_with(cmd, config, &[]);
    let web = logged_addr(&v, "listening listener=web addr=");
    let plain = logged_addr(&v, "listening listener=plain addr=");
    let admin = admin_addr(&v);
    Setup {
        v,
        web,
        plain,
        admin,
    }
}

/// The CA file pebble's own HTTPS is signed with must exist before veloxy loads the config:
/// a placeholder CA is written first and replaced by pebble's once it runs.
fn placeholder_ca(dir: &Path) -> std::path::PathBuf {
    let sub = dir.join("placeholder");
    std::fs::create_dir_all(&sub).unwrap();
    Pki::new(&sub).ca_pem
}

fn certificates(admin: SocketAddr) -> serde_json::Value {
    let r = request(
        admin,
        "GET /certificates HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    serde_json::from_str(&r.body_str()).unwrap()
}

fn acme_entry(admin: SocketAddr, name: &str) -> serde_json::Value {
    certificates(admin)["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "acme" && c["names"][0] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in /certificates"))
}

/// Pebble's root, written to `path`, once pebble runs.
fn trust_pebble(p: &Pebble, dir: &Path) -> std::path::PathBuf {
    let root = dir.join("pebble-root.pem");
    p.write_root(&root);
    root
}

#[test]
fn http01_issuance_with_the_ca_down_at_first_then_restart_reuses_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("acme");
    let acme_port = free_port();
    let ca = dir.path().join("pebble-ca.pem");
    std::fs::copy(placeholder_ca(dir.path()), &ca).unwrap();
    let conf = config(
        acme_port,
        &ca,
        &storage,
        "[\"a.example.test\"]",
        "challenge = \"http-01\"",
    );
    let s = start(&conf);
    // The CA is down: the failure is logged and retried; the file host is unaffected.
    assert!(eventually(Duration::from_secs(10), || s
        .v
        .proc
        .log_text()
        .contains("ACME: issuance failed")));
    let files_ca = dir.path().join("ca.pem");
    assert_eq!(
        get_verified(s.web, "files.test", &files_ca).as_deref(),
        Ok("hello")
    );
    let Some(p) = Pebble::start(&PebbleSetup {
        port: acme_port,
        http_port: s.plain.port(),
        tls_port: s.web.port(),
        ..Default::default()
    }) else {
        return;
    };
    std::fs::copy(&p.ca_pem, &ca).unwrap();
    let root = trust_pebble(&p, dir.path());
    let issued = eventually(Duration::from_secs(40), || {
        get_verified(s.web, "a.example.test", &root).is_ok()
    });
    assert!(
        issued,
        "no certificate:\n{}\n{}",
        s.v.proc.log_text(),
        p.log_text()
    );
    // HTTP/2 too, and curl verifies the chain against pebble's root.
    let h2 = runtime().block_on(async {
        let config = default_client(&root, &[b"h2"]);
        let mut c = h2_connect(s.web, Some((config, "a.example.test"))).await;
        h2_send(&mut c, h2_get("a.example.test", "/", true), None)
            .await
            .unwrap()
    });
    assert_eq!(h2.body_str(), "hello");
    curl_verifies(s.web, "a.example.test", &root);
    let entry = acme_entry(s.admin, "a.example.test");
    assert!(
        entry["issuer"].as_str().unwrap_or("").contains("Pebble"),
        "{entry}"
    );
    assert!(entry["last_error"].is_null(), "{entry}");
    let key = storage_files(&storage, "a.example.test.key");
    assert_eq!(mode(&key), 0o600);
    // A restart serves the stored certificate at once, without a new order.
    drop(s);
    let s = start(&conf);
    assert_eq!(
        get_verified(s.web, "a.example.test", &root).as_deref(),
        Ok("hello")
    );
    assert!(
        !s.v.proc.log_text().contains("ordering a certificate"),
        "{}",
        s.v.proc.log_text()
    );
}

fn storage_files(storage: &Path, file: &str) -> std::path::PathBuf {
    let folder = std::fs::read_dir(storage)
        .unwrap()
        .next()
        .expect("a directory folder")
        .unwrap()
        .path();
    folder.join("certs").join(file)
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn curl_verifies(addr: SocketAddr, name: &str, root: &Path) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(root)
        .args(["--resolve", &format!("{name}:{}:127.0.0.1", addr.port())])
        .arg(format!("https://{name}:{}/", addr.port()))
        .output();
    match out {
        Err(_) => skip("curl is not installed"),
        Ok(o) => assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "hello",
            "{}",
            String::from_utf8_lossy(&o.stderr)
        ),
    }
}

/// Starts veloxy and pebble for `acme` with `extra` `[server.acme]` keys.
fn running(
    dir: &Path,
    acme: &str,
    extra: &str,
    validity_s: Option<u64>,
    blocklist: &[&str],
) -> Option<(Setup, Pebble, std::path::PathBuf, String)> {
    running_with_ocsp(dir, acme, extra, validity_s, blocklist, None)
}

fn running_with_ocsp(
    dir: &Path,
    acme: &str,
    extra: &str,
    validity_s: Option<u64>,
    blocklist: &[&str],
    ocsp_url: Option<String>,
) -> Option<(Setup, Pebble, std::path::PathBuf, String)> {
    let storage = dir.join("acme");
    let acme_port = free_port();
    let ca = dir.join("pebble-ca.pem");
    std::fs::copy(placeholder_ca(dir), &ca).unwrap();
    let conf = config(acme_port, &ca, &storage, acme, extra);
    let s = start(&conf);
    let p = Pebble::start(&PebbleSetup {
        port: acme_port,
        http_port: s.plain.port(),
        tls_port: s.web.port(),
        validity_s,
        blocklist,
        ocsp_url,
        dns_server: None,
    })?;
    std::fs::copy(&p.ca_pem, &ca).unwrap();
    let root = trust_pebble(&p, dir);
    Some((s, p, root, conf))
}

#[test]
fn tls_alpn01_issuance() {
    let dir = tempfile::tempdir().unwrap();
    let Some((s, p, root, _)) = running(
        dir.path(),
        "[\"alpn.example.test\"]",
        "challenge = \"tls-alpn-01\"",
        None,
        &[],
    ) else {
        return;
    };
    let issued = eventually(Duration::from_secs(40), || {
        get_verified(s.web, "alpn.example.test", &root).is_ok()
    });
    assert!(issued, "{}\n{}", s.v.proc.log_text(), p.log_text());
}

#[test]
fn renewal_swaps_the_certificate_while_a_keepalive_connection_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    // 30 s certificates: renewal is due after 10 s (a third of the lifetime).
    let Some((s, p, root, _)) = running(
        dir.path(),
        "[\"renew.example.test\"]",
        "challenge = \"http-01\"",
        Some(30),
        &[],
    ) else {
        return;
    };
    let client = default_client(&root, &[b"http/1.1"]);
    let first = eventually(Duration::from_secs(40), || {
        tls_connect(s.web, "renew.example.test", client.clone()).is_ok()
    });
    assert!(first, "{}\n{}", s.v.proc.log_text(), p.log_text());
    let (mut kept, _) = tls_connect(s.web, "renew.example.test", client.clone()).unwrap();
    let serial = |c: &rustls::ClientConnection| c.peer_certificates().unwrap()[0].to_vec();
    let before = serial(&kept.conn);
    let renewed = eventually(Duration::from_secs(40), || {
        tls_connect(s.web, "renew.example.test", client.clone())
            .is_ok_and(|(c, _)| serial(&c.conn) != before)
    });
    assert!(renewed, "{}\n{}", s.v.proc.log_text(), p.log_text());
    // The connection opened on the old certificate still serves requests.
    use std::io::Write;
    kept.write_all(b"GET / HTTP/1.1\r\nHost: renew.example.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (status, raw) = read_to_close(&mut kept);
    assert_eq!((status, raw_body(&raw)), (200, "hello"));
}

#[test]
fn a_refused_order_shows_the_ca_error_and_a_reload_orders_only_the_new_host() {
    let dir = tempfile::tempdir().unwrap();
    let Some((s, p, root, conf)) = running(
        dir.path(),
        "[\"ok.example.test\", \"blocked.example.test\"]",
        "challenge = \"http-01\"",
        None,
        &["blocked.example.test"],
    ) else {
        return;
    };
    let refused = eventually(Duration::from_secs(30), || {
        acme_entry(s.admin, "blocked.example.test")["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("forbidden by policy"))
    });
    assert!(
        refused,
        "{}\n{}",
        certificates(s.admin),
        s.v.proc.log_text()
    );
    assert!(s.v.proc.log_text().contains("forbidden by policy"));
    assert!(eventually(Duration::from_secs(40), || get_verified(
        s.web,
        "ok.example.test",
        &root
    )
    .is_ok()));
    // A reload adding a name orders that name only.
    let orders = |name: &str| {
        s.v.proc
            .log_text()
            .matches(&format!("ordering a certificate name={name}"))
            .count()
    };
    let ok_orders = orders("ok.example.test");
    let conf2 = conf.replace(
        "\"blocked.example.test\"]",
        "\"blocked.example.test\", \"new.example.test\"]",
    );
    reload_with(&s.v, &conf2, "reloaded");
    assert!(
        eventually(Duration::from_secs(40), || get_verified(
            s.web,
            "new.example.test",
            &root
        )
        .is_ok()),
        "{}\n{}",
        s.v.proc.log_text(),
        p.log_text()
    );
    assert_eq!(
        orders("ok.example.test"),
        ok_orders,
        "ok was not ordered again"
    );
    assert_eq!(orders("new.example.test"), 1);
}

#[test]
fn one_line_proxy_with_acme_gets_a_certificate_and_redirects_http() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(&["--name", "app"]);
    let acme_port = free_port();
    let ca = dir.path().join("pebble-ca.pem");
    std::fs::copy(placeholder_ca(dir.path()), &ca).unwrap();
    let storage = dir.path().join("acme");
    let directory = format!("https://127.0.0.1:{acme_port}/dir");
    let (to, ca_s, storage_s) = (
        up.addr.to_string(),
        ca.display().to_string(),
        storage.display().to_string(),
    );
    let args = [
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--to",
        &to,
        "--workers",
        "1",
        "--acme",
        "one.example.test",
        "--acme-email",
        "ops@example.test",
        "--acme-directory",
        &directory,
        "--acme-ca-file",
        &ca_s,
        "--acme-storage",
        &storage_s,
        "--acme-http-listen",
        "127.0.0.1:0",
    ];
    let v = veloxy_cmd(
        std::process::Command::new(VELOXY),
        &args,
        tempfile::tempdir().unwrap(),
    );
    let main = logged_addr(&v, "listening listener=main addr=");
    let http = logged_addr(&v, "listening listener=http addr=");
    let Some(p) = Pebble::start(&PebbleSetup {
        port: acme_port,
        http_port: http.port(),
        tls_port: main.port(),
        ..Default::default()
    }) else {
        return;
    };
    std::fs::copy(&p.ca_pem, &ca).unwrap();
    let root = trust_pebble(&p, dir.path());
    // tls-alpn-01 by default: the certificate comes, and requests reach the backend.
    let client = default_client(&root, &[b"http/1.1"]);
    let served = eventually(Duration::from_secs(40), || {
        tls_connect(main, "one.example.test", client.clone()).is_ok_and(|(mut s, _)| {
            let (status, raw) = https1(&mut s, "one.example.test", "/");
            status == 200 && raw_header(&raw, "x-upstream") == Some("app")
        })
    });
    assert!(served, "{}\n{}", v.proc.log_text(), p.log_text());
    // The plain listener redirects to HTTPS.
    let r = request(
        http,
        "GET /x HTTP/1.1\r\nHost: one.example.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some("https://one.example.test/x"));
}

#[test]
fn ocsp_responses_are_stapled() {
    let dir = tempfile::tempdir().unwrap();
    let ocsp_port = free_port();
    let Some((s, p, root, _)) = running_with_ocsp(
        dir.path(),
        "[\"ocsp.example.test\"]",
        "challenge = \"http-01\"",
        None,
        &[],
        Some(format!("http://127.0.0.1:{ocsp_port}")),
    ) else {
        return;
    };
    assert!(
        eventually(Duration::from_secs(40), || get_verified(
            s.web,
            "ocsp.example.test",
            &root
        )
        .is_ok()),
        "{}",
        s.v.proc.log_text()
    );
    // A real OCSP responder (openssl ocsp) signing with pebble's intermediate, knowing the
    // issued certificate as good.
    let leaf = storage_files(&dir.path().join("acme"), "ocsp.example.test.crt");
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(&leaf)
        .output();
    let Ok(out) = out else {
        return skip("openssl is not installed");
    };
    let serial = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_owned();
    let d = dir.path();
    std::fs::write(d.join("inter.pem"), p.management_get("/intermediates/0")).unwrap();
    std::fs::write(
        d.join("inter-key.pem"),
        p.management_get("/intermediate-keys/0"),
    )
    .unwrap();
    std::fs::write(
        d.join("index.txt"),
        format!("V\t491231235959Z\t\t{serial}\tunknown\t/CN=ocsp.example.test\n"),
    )
    .unwrap();
    let responder = std::process::Command::new("openssl")
        .current_dir(d)
        .args([
            "ocsp",
            "-index",
            "index.txt",
            "-port",
            &ocsp_port.to_string(),
        ])
        .args([
            "-rsigner",
            "inter.pem",
            "-rkey",
            "inter-key.pem",
            "-CA",
            "inter.pem",
        ])
        .args(["-ndays", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _responder = Proc {
        child: responder,
        log: Default::default(),
    };
    let stapled = eventually(Duration::from_secs(40), || {
        let out = std::process::Command::new("openssl")
            .args(["s_client", "-connect", &s.web.to_string()])
            .args(["-servername", "ocsp.example.test", "-status"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains("OCSP Response Status: successful") && text.contains("Cert Status: good")
    });
    assert!(stapled, "{}", s.v.proc.log_text());
    assert!(s.v.proc.log_text().contains("OCSP response stapled"));
}

/// A veloxy with `storage = "redis"` and its own local folder (`XDG_DATA_HOME`), so nothing is
/// shared through the file system.
fn fleet_member(dir: &Path, conf: &str) -> Setup {
    std::fs::create_dir_all(dir).unwrap();
    let mut cmd = std::process::Command::new(VELOXY);
    cmd.env("XDG_DATA_HOME", dir);
    start_with(cmd, conf)
}

#[test]
fn two_instances_sharing_redis_order_one_certificate_and_both_take_the_renewal() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let acme_port = free_port();
    let ca = dir.path().join("pebble-ca.pem");
    std::fs::copy(placeholder_ca(dir.path()), &ca).unwrap();
    let name = "fleet.example.test";
    let conf = config(
        acme_port,
        &ca,
        &dir.path().join("unused"),
        &format!("[\"{name}\"]"),
        &format!(
            "challenge = \"http-01\"\n[server.redis]\nurl = \"{}\"",
            redis.url()
        ),
    )
    .replace(
        &format!("storage = \"{}\"", dir.path().join("unused").display()),
        "storage = \"redis\"",
    );
    let a = fleet_member(&dir.path().join("a"), &conf);
    let b = fleet_member(&dir.path().join("b"), &conf);
    // The CA validates through a's listeners only: if b wins the lock, a answers b's
    // challenge from the shared copy.
    let Some(p) = Pebble::start(&PebbleSetup {
        port: acme_port,
        http_port: a.plain.port(),
        tls_port: a.web.port(),
        validity_s: Some(30),
        ..Default::default()
    }) else {
        return;
    };
    std::fs::copy(&p.ca_pem, &ca).unwrap();
    let root = trust_pebble(&p, dir.path());
    let logs = || {
        format!(
            "a:\n{}\nb:\n{}\npebble:\n{}",
            a.v.proc.log_text(),
            b.v.proc.log_text(),
            p.log_text()
        )
    };
    let both = eventually(Duration::from_secs(60), || {
        get_verified(a.web, name, &root).is_ok() && get_verified(b.web, name, &root).is_ok()
    });
    assert!(both, "{}", logs());
    let serial = |s: &Setup| {
        let client = default_client(&root, &[b"http/1.1"]);
        let (c, _) = tls_connect(s.web, name, client).unwrap();
        c.conn.peer_certificates().unwrap()[0].to_vec()
    };
    let first = serial(&a);
    assert_eq!(serial(&b), first, "one certificate for both");
    let issued = p.log_text().matches("Issued certificate serial").count();
    assert_eq!(issued, 1, "one order for two instances: {}", logs());
    let took = format!("{}{}", a.v.proc.log_text(), b.v.proc.log_text());
    assert!(
        took.contains("certificate taken from shared storage"),
        "{}",
        logs()
    );

    // The 30 s certificate is renewed after 10 s by one of them; both serve the new one.
    let renewed = eventually(Duration::from_secs(60), || {
        let (x, y) = (serial(&a), serial(&b));
        x != first && x == y
    });
    assert!(renewed, "{}", logs());
}
