//! ACME DNS-01 and wildcard certificates (issue 38) against a real ACME server: pebble, whose
//! validator asks pebble-challtestsrv's DNS; veloxy's `dns = { command }` provider is a script
//! that sets and clears the TXT records through challtestsrv's management API, and veloxy
//! waits until its `resolvers` answer the record before telling the CA.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use veloxy_testkit::*;

/// A provider command: logs `ACTION FQDN VALUE` to `log` and sets or clears the TXT record on
/// challtestsrv at `mgmt`; with `fail`, or while the file [`provider_down`] of `dir` exists,
/// exits 1 on `set`.
fn hook(dir: &Path, mgmt: SocketAddr, log: &Path, fail: bool) -> std::path::PathBuf {
    let path = dir.join("dns-hook");
    std::fs::write(
        &path,
        format!(
            "#!/usr/bin/env python3\n\
             import json, os, sys, urllib.request\n\
             action, fqdn, value = sys.argv[1:4]\n\
             open({log:?}, 'a').write(f'{{action}} {{fqdn}} {{value}}\\n')\n\
             if action == 'set' and ({fail} or os.path.exists({down:?})):\n    print('provider refused', file=sys.stderr); sys.exit(1)\n\
             body = {{'host': fqdn + '.', 'value': value}} if action == 'set' else {{'host': fqdn + '.'}}\n\
             path = '/set-txt' if action == 'set' else '/clear-txt'\n\
             urllib.request.urlopen(urllib.request.Request('http://{mgmt}' + path, data=json.dumps(body).encode(), method='POST'), timeout=5)\n",
            log = log.display().to_string(),
            down = provider_down(dir).display().to_string(),
            fail = if fail { "True" } else { "False" },
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// While this file exists, [`hook`]'s `set` fails.
fn provider_down(dir: &Path) -> std::path::PathBuf {
    dir.join("provider-down")
}

fn config(p: &Pebble, hook: &Path, storage: &Path, names: &str) -> String {
    format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\nresolvers = [\"{dns}\"]\n\
         [server.acme]\ndirectory = \"{dir}\"\nca_file = \"{ca}\"\nstorage = \"{storage}\"\n\
         challenge = \"dns-01\"\ndns = {{ command = [\"{hook}\"] }}\npropagation_timeout = \"20s\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n[listeners.web.tls]\nacme = {names}\n\
         [[routes]]\nrespond = {{ body = \"hello\" }}\n",
        dns = p.dns,
        dir = p.directory,
        ca = p.ca_pem.display(),
        storage = storage.display(),
        hook = hook.display(),
    )
}

/// pebble for DNS-01 only (its validator's HTTP and TLS ports are never used).
fn pebble() -> Option<Pebble> {
    pebble_with(PebbleSetup::default())
}

/// Pebble on free ports, with `setup`'s other fields (a port set there is kept).
fn pebble_with(setup: PebbleSetup) -> Option<Pebble> {
    let port = |p: u16| if p == 0 { free_port() } else { p };
    Pebble::start(&PebbleSetup {
        port: port(setup.port),
        http_port: port(setup.http_port),
        tls_port: port(setup.tls_port),
        ..setup
    })
}

#[test]
fn dns01_issues_a_wildcard_and_an_exact_name_and_clears_the_records() {
    let Some(p) = pebble() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hook.log");
    let hook = hook(dir.path(), p.dns_management, &log, false);
    let storage = dir.path().join("acme");
    let v = veloxy(&config(
        &p,
        &hook,
        &storage,
        "[\"*.example.test\", \"example.org\"]",
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let root = dir.path().join("root.pem");
    p.write_root(&root);
    for name in ["www.example.test", "api.example.test", "example.org"] {
        let issued = eventually(Duration::from_secs(60), || {
            get_verified(web, name, &root).is_ok_and(|b| b == "hello")
        });
        assert!(issued, "{name}: no certificate: {}", v.proc.log_text());
    }
    // A name the wildcard does not cover (two labels down) gets none that verifies.
    assert!(get_verified(web, "a.b.example.test", &root).is_err());
    let calls = std::fs::read_to_string(&log).unwrap();
    for record in [
        "_acme-challenge.example.test",
        "_acme-challenge.example.org",
    ] {
        assert!(calls.contains(&format!("set {record} ")), "{calls}");
        assert!(
            eventually(Duration::from_secs(10), || std::fs::read_to_string(&log)
                .unwrap()
                .contains(&format!("clear {record} "))),
            "{record} not cleared: {calls}"
        );
    }
}

#[test]
fn a_failing_dns_provider_is_reported_and_nothing_is_asked_of_the_ca() {
    let Some(p) = pebble() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hook.log");
    let hook = hook(dir.path(), p.dns_management, &log, true);
    let v = veloxy(&config(
        &p,
        &hook,
        &dir.path().join("acme"),
        "[\"*.example.test\"]",
    ));
    let seen = eventually(Duration::from_secs(30), || {
        v.proc.log_text().contains("provider refused")
    });
    assert!(
        seen,
        "the provider's error is not in the log: {}",
        v.proc.log_text()
    );
    // The record was set (and failed): it is cleared all the same.
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("clear _acme-challenge.example.test ")
    }));
}

/// `dns = { rfc2136 }` against a real BIND 9 primary for `example.test`, which pebble's
/// validator asks directly.
fn rfc2136_config(p: &Pebble, bind: &Bind, key_file: &Path, storage: &Path, names: &str) -> String {
    format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [server.acme]\ndirectory = \"{dir}\"\nca_file = \"{ca}\"\nstorage = \"{storage}\"\n\
         challenge = \"dns-01\"\npropagation_timeout = \"20s\"\n\
         dns = {{ rfc2136 = {{ server = \"{server}\", zone = \"{zone}\", key_name = \"{key}\", \
         key_file = \"{key_file}\", algorithm = \"hmac-sha256\" }} }}\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n[listeners.web.tls]\nacme = {names}\n\
         [[routes]]\nrespond = {{ body = \"hello\" }}\n",
        dir = p.directory,
        ca = p.ca_pem.display(),
        storage = storage.display(),
        server = bind.addr,
        zone = bind.zone,
        key = bind.key_name,
        key_file = key_file.display(),
    )
}

/// BIND and a pebble that validates against it.
fn bind_and_pebble() -> Option<(Bind, Pebble)> {
    let bind = Bind::start("example.test", "hmac-sha256")?;
    let p = pebble_with(PebbleSetup {
        dns_server: Some(bind.addr),
        ..Default::default()
    })?;
    Some((bind, p))
}

#[test]
fn rfc2136_issues_a_name_and_its_wildcard_through_bind_and_deletes_the_records() {
    let Some((bind, p)) = bind_and_pebble() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let v = veloxy(&rfc2136_config(
        &p,
        &bind,
        &bind.key_file,
        &dir.path().join("acme"),
        "[\"example.test\", \"*.example.test\"]",
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let root = dir.path().join("root.pem");
    p.write_root(&root);
    for name in ["example.test", "a.example.test"] {
        let issued = eventually(Duration::from_secs(90), || {
            get_verified(web, name, &root).is_ok_and(|b| b == "hello")
        });
        assert!(
            issued,
            "{name}: no certificate: {}\nnamed: {}",
            v.proc.log_text(),
            bind.log_text()
        );
    }
    // Both orders added their value at the one name; each deleted its own record (by rdata,
    // never the whole RRset), so none is left.
    assert!(
        eventually(Duration::from_secs(10), || bind
            .dig("_acme-challenge.example.test", "TXT")
            .is_empty()),
        "records left: {:?}\n{}",
        bind.dig("_acme-challenge.example.test", "TXT"),
        bind.log_text()
    );
    let named = bind.log_text();
    let count = |what: &str| named.matches(what).count();
    assert_eq!(
        count("adding an RR at '_acme-challenge.example.test' TXT"),
        2,
        "{named}"
    );
    assert_eq!(
        count("deleting an RR at _acme-challenge.example.test TXT"),
        2,
        "{named}"
    );
    assert_eq!(count("deleting rrset"), 0, "{named}");
}

#[test]
fn rfc2136_with_a_wrong_tsig_secret_logs_badsig_and_issues_nothing() {
    let Some((bind, p)) = bind_and_pebble() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The right key name and algorithm, another secret (a bare base64 key file).
    let wrong = dir.path().join("wrong.key");
    std::fs::write(&wrong, "d3Jvbmcgc2VjcmV0IHdyb25nIHNlY3JldCB3cm9uZyE=\n").unwrap();
    let v = veloxy(&rfc2136_config(
        &p,
        &bind,
        &wrong,
        &dir.path().join("acme"),
        "[\"example.test\"]",
    ));
    let web = logged_addr(&v, "listening listener=web addr=");
    let seen = eventually(Duration::from_secs(30), || {
        v.proc.log_text().lines().any(|l| {
            l.contains("issuance failed name=example.test") && l.contains("NOTAUTH, BADSIG")
        })
    });
    assert!(
        seen,
        "no BADSIG in the log: {}\nnamed: {}",
        v.proc.log_text(),
        bind.log_text()
    );
    let log = v.proc.log_text();
    assert!(log.contains("veloxy-acme"), "the key is not named: {log}");
    let root = dir.path().join("root.pem");
    p.write_root(&root);
    assert!(get_verified(web, "example.test", &root).is_err());
    assert!(bind.dig("_acme-challenge.example.test", "TXT").is_empty());
}

/// The leaf certificate (DER) `addr` serves for `sni`, verified against `root`.
fn served(addr: SocketAddr, sni: &str, root: &Path) -> Option<Vec<u8>> {
    let client = default_client(root, &[b"http/1.1"]);
    let (c, _) = tls_connect(addr, sni, client).ok()?;
    Some(c.conn.peer_certificates()?.first()?.to_vec())
}

/// The `ACTION FQDN` lines the hook logged, counted.
fn calls(log: &Path, what: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("{what} ")))
        .count()
}

#[test]
fn a_listener_with_its_own_dns01_beside_the_servers_http01_in_one_process() {
    let plain_port = free_port();
    let Some(p) = pebble_with(PebbleSetup {
        http_port: plain_port,
        ..Default::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hook.log");
    let hook = hook(dir.path(), p.dns_management, &log, false);
    let conf = format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\nresolvers = [\"{dns}\"]\n\
         [server.acme]\ndirectory = \"{dir}\"\nca_file = \"{ca}\"\nstorage = \"{storage}\"\n\
         challenge = \"http-01\"\n\
         [listeners.plain]\naddr = \"127.0.0.1:{plain_port}\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n[listeners.web.tls]\nacme = [\"www.example.org\"]\n\
         [listeners.wild]\naddr = \"127.0.0.1:0\"\n[listeners.wild.tls.acme]\n\
         names = [\"*.example.test\"]\nchallenge = \"dns-01\"\n\
         dns = {{ command = [\"{hook}\"] }}\npropagation_timeout = \"20s\"\n\
         [[routes]]\nrespond = {{ body = \"hello\" }}\n",
        dns = p.dns,
        dir = p.directory,
        ca = p.ca_pem.display(),
        storage = dir.path().join("acme").display(),
        hook = hook.display(),
    );
    let v = veloxy(&conf);
    let web = logged_addr(&v, "listening listener=web addr=");
    let wild = logged_addr(&v, "listening listener=wild addr=");
    let root = dir.path().join("root.pem");
    p.write_root(&root);
    for (addr, name) in [(web, "www.example.org"), (wild, "a.example.test")] {
        let issued = eventually(Duration::from_secs(60), || {
            get_verified(addr, name, &root).is_ok_and(|b| b == "hello")
        });
        assert!(
            issued,
            "{name}: no certificate: {}\n{}",
            v.proc.log_text(),
            p.log_text()
        );
    }
    let text = v.proc.log_text();
    let ordered = |name: &str, challenge: &str| {
        text.lines().any(|l| {
            l.contains(&format!(
                "ordering a certificate name={name} challenge=\"{challenge}\""
            ))
        })
    };
    assert!(ordered("www.example.org", "http-01"), "{text}");
    assert!(ordered("*.example.test", "dns-01"), "{text}");
    // Only the wildcard went through the DNS provider.
    let hooked = std::fs::read_to_string(&log).unwrap();
    assert!(
        hooked.contains("set _acme-challenge.example.test "),
        "{hooked}"
    );
    assert!(!hooked.contains("example.org"), "{hooked}");
}

/// A veloxy with a dns-01 wildcard `*.example.test` on listener `web`, through [`hook`].
fn dns01_wildcard(p: &Pebble, dir: &Path) -> (Veloxy, SocketAddr, std::path::PathBuf) {
    let log = dir.join("hook.log");
    let hook = hook(dir, p.dns_management, &log, false);
    let v = veloxy(&config(p, &hook, &dir.join("acme"), "[\"*.example.test\"]"));
    let web = logged_addr(&v, "listening listener=web addr=");
    (v, web, log)
}

#[test]
fn a_dns01_certificate_is_renewed_with_its_records_set_and_cleared_again() {
    // 30 s certificates: renewal is due after 10 s (a third of the lifetime).
    let Some(p) = pebble_with(PebbleSetup {
        validity_s: Some(30),
        ..Default::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (v, web, log) = dns01_wildcard(&p, dir.path());
    let root = dir.path().join("root.pem");
    p.write_root(&root);
    let sni = "www.example.test";
    let mut first = None;
    let issued = eventually(Duration::from_secs(60), || {
        first = served(web, sni, &root);
        first.is_some()
    });
    assert!(issued, "{}\n{}", v.proc.log_text(), p.log_text());
    let first = first.unwrap();
    let renewed = eventually(Duration::from_secs(60), || {
        served(web, sni, &root).is_some_and(|c| c != first)
    });
    assert!(renewed, "{}\n{}", v.proc.log_text(), p.log_text());
    assert_eq!(
        get_verified(web, sni, &root).as_deref(),
        Ok("hello"),
        "the renewed certificate serves"
    );
    // Each order set its record and cleared it again.
    assert!(
        calls(&log, "set") >= 2,
        "{:?}",
        std::fs::read_to_string(&log)
    );
    let cleared = eventually(Duration::from_secs(10), || {
        calls(&log, "clear") >= calls(&log, "set")
    });
    assert!(cleared, "{:?}", std::fs::read_to_string(&log));
}

#[test]
fn a_failing_provider_at_renewal_keeps_the_old_certificate_and_retries_until_it_works() {
    // 60 s certificates: renewal is due after 20 s.
    let Some(p) = pebble_with(PebbleSetup {
        validity_s: Some(60),
        ..Default::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (v, web, log) = dns01_wildcard(&p, dir.path());
    let admin = admin_addr(&v);
    let root = dir.path().join("root.pem");
    p.write_root(&root);
    let sni = "www.example.test";
    let mut first = None;
    let issued = eventually(Duration::from_secs(60), || {
        first = served(web, sni, &root);
        first.is_some()
    });
    assert!(issued, "{}\n{}", v.proc.log_text(), p.log_text());
    let first = first.unwrap();
    // The provider goes down before the renewal is due.
    std::fs::write(provider_down(dir.path()), "").unwrap();
    let failure = |l: &&str| {
        l.contains("ACME: issuance failed name=*.example.test")
            && l.contains("dns-hook set _acme-challenge.example.test failed")
            && l.contains("provider refused")
    };
    // Two failures: the order is retried (1 s, then 2 s later: a failing provider is not a
    // refusal by the CA, which would wait minutes).
    let failed_twice = eventually(Duration::from_secs(60), || {
        v.proc.log_text().lines().filter(failure).count() >= 2
    });
    assert!(failed_twice, "{}", v.proc.log_text());
    // The old certificate still serves, and still verifies.
    assert_eq!(served(web, sni, &root).as_ref(), Some(&first));
    assert_eq!(get_verified(web, sni, &root).as_deref(), Ok("hello"));
    let r = request(
        admin,
        "GET /certificates HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    let body = r.body_str();
    assert!(
        body.contains("dns-hook set _acme-challenge.example.test failed"),
        "{body}"
    );
    // Each failed set was cleared all the same.
    let sets = calls(&log, "set");
    assert!(
        eventually(Duration::from_secs(10), || calls(&log, "clear") >= sets),
        "{:?}",
        std::fs::read_to_string(&log)
    );
    // The provider is back: a retry renews.
    std::fs::remove_file(provider_down(dir.path())).unwrap();
    let renewed = eventually(Duration::from_secs(60), || {
        served(web, sni, &root).is_some_and(|c| c != first)
    });
    assert!(renewed, "{}\n{}", v.proc.log_text(), p.log_text());
    assert!(v.proc.log_text().contains("ACME: certificate obtained"));
}

#[test]
fn two_instances_sharing_redis_make_one_dns01_order_and_serve_one_certificate() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // 60 s certificates: one renewal after 20 s, by one of the two.
    let Some(p) = pebble_with(PebbleSetup {
        validity_s: Some(60),
        ..Default::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hook.log");
    let hook = hook(dir.path(), p.dns_management, &log, false);
    let conf = config(&p, &hook, Path::new("redis"), "[\"*.example.test\"]")
        + &format!("[server.redis]\nurl = \"{}\"\n", redis.url());
    // Each with its own local folder: nothing is shared through the file system.
    let member = |name: &str| {
        let home = dir.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        let mut cmd = std::process::Command::new(VELOXY);
        cmd.env("XDG_DATA_HOME", &home);
        let v = veloxy_with(cmd, &conf, &[]);
        let web = logged_addr(&v, "listening listener=web addr=");
        (v, web)
    };
    let (a, a_web) = member("a");
    let (b, b_web) = member("b");
    let root = dir.path().join("root.pem");
    p.write_root(&root);
    let logs = || {
        format!(
            "a:\n{}\nb:\n{}\nhook:\n{}\npebble:\n{}",
            a.proc.log_text(),
            b.proc.log_text(),
            std::fs::read_to_string(&log).unwrap_or_default(),
            p.log_text()
        )
    };
    let sni = "www.example.test";
    let issued = || p.log_text().matches("Issued certificate serial").count();
    let mut first = None;
    let both = eventually(Duration::from_secs(60), || {
        let (x, y) = (served(a_web, sni, &root), served(b_web, sni, &root));
        first = x.clone();
        x.is_some() && x == y
    });
    assert!(both, "{}", logs());
    let first = first.unwrap();
    assert_eq!(issued(), 1, "one order for two instances: {}", logs());
    assert_eq!(calls(&log, "set"), 1, "one record set: {}", logs());
    // The renewal: again one order and one record, and both serve the new certificate.
    let renewed = eventually(Duration::from_secs(60), || {
        let (x, y) = (served(a_web, sni, &root), served(b_web, sni, &root));
        x.as_ref().is_some_and(|x| *x != first) && x == y
    });
    assert!(renewed, "{}", logs());
    assert_eq!(issued(), 2, "{}", logs());
    assert_eq!(calls(&log, "set"), 2, "{}", logs());
}
