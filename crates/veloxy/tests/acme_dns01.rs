//! ACME DNS-01 and wildcard certificates (issue 38) against a real ACME server: pebble, whose
//! validator asks pebble-challtestsrv's DNS; veloxy's `dns = { command }` provider is a script
//! that sets and clears the TXT records through challtestsrv's management API, and veloxy
//! waits until its `resolvers` answer the record before telling the CA.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use veloxy_testkit::*;

/// A provider command: logs `ACTION FQDN VALUE` to `log` and sets or clears the TXT record on
/// challtestsrv at `mgmt`; with `fail`, exits 1 on `set`.
fn hook(dir: &Path, mgmt: SocketAddr, log: &Path, fail: bool) -> std::path::PathBuf {
    let path = dir.join("dns-hook");
    std::fs::write(
        &path,
        format!(
            "#!/usr/bin/env python3\n\
             import json, sys, urllib.request\n\
             action, fqdn, value = sys.argv[1:4]\n\
             open({log:?}, 'a').write(f'{{action}} {{fqdn}} {{value}}\\n')\n\
             if action == 'set' and {fail}:\n    print('provider refused', file=sys.stderr); sys.exit(1)\n\
             body = {{'host': fqdn + '.', 'value': value}} if action == 'set' else {{'host': fqdn + '.'}}\n\
             path = '/set-txt' if action == 'set' else '/clear-txt'\n\
             urllib.request.urlopen(urllib.request.Request('http://{mgmt}' + path, data=json.dumps(body).encode(), method='POST'), timeout=5)\n",
            log = log.display().to_string(),
            fail = if fail { "True" } else { "False" },
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
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
    Pebble::start(&PebbleSetup {
        port: free_port(),
        http_port: free_port(),
        tls_port: free_port(),
        ..Default::default()
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
    let p = Pebble::start(&PebbleSetup {
        port: free_port(),
        http_port: free_port(),
        tls_port: free_port(),
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
