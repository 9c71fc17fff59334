//! Golden cases: `tests/golden/CASE/input/` -> `expected.toml` + `expected.report`, and
//! every output loads in the engine (see `veloxy_import::golden`). `VELOXY_BLESS=1` rewrites.

#[test]
fn golden_cases() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    veloxy_import::golden::run_goldens(&dir, &veloxy_import_traefik::Traefik);
}

/// A dynamic file that is not YAML is a parse error naming FILE:LINE:COL (exit 2).
#[test]
fn a_file_that_does_not_parse_names_its_place() {
    use veloxy_import::{ImportError, Importer, Options};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dynamic.yml");
    std::fs::write(
        &path,
        "http:\n  routers:\n    app:\n      rule: \"Host(`a`)\n      service: [app\n",
    )
    .unwrap();
    let err = veloxy_import_traefik::Traefik
        .import(std::slice::from_ref(&path), &Options::default())
        .unwrap_err();
    let ImportError::Parse(p) = err else {
        panic!("expected a parse error, got {err}");
    };
    assert_eq!(&*p.loc.file, path.display().to_string());
    assert!(p.loc.line >= 4, "{p}");
    let toml = dir.path().join("dynamic.toml");
    std::fs::write(
        &toml,
        "[http.routers.app]\nrule = \"Host(`a`)\"\nservice = \n",
    )
    .unwrap();
    let err = veloxy_import_traefik::Traefik
        .import(&[toml], &Options::default())
        .unwrap_err();
    assert!(
        matches!(err, ImportError::Parse(ref p) if p.loc.line == 3),
        "{err}"
    );
}

/// Detection takes static files, dynamic files and compose files with traefik labels, and
/// leaves other YAML (Kubernetes, Envoy, plain compose files) and nginx alone.
#[test]
fn detection() {
    use std::path::Path;
    use veloxy_import::Importer;
    let t = veloxy_import_traefik::Traefik;
    let yes = [
        (
            "traefik.yml",
            "entryPoints:\n  web:\n    address: \":80\"\n",
        ),
        (
            "dynamic.yml",
            "http:\n  routers:\n    a:\n      rule: \"Host(`a`)\"\n",
        ),
        ("traefik.toml", "[entryPoints.web]\n  address = \":80\"\n"),
        ("rules.toml", "[http.routers.a]\n  rule = \"Host(`a`)\"\n"),
        (
            "docker-compose.yml",
            "services:\n  app:\n    labels:\n      - \"traefik.http.routers.a.rule=Host(`a`)\"\n",
        ),
    ];
    for (name, text) in yes {
        assert!(t.detect(Path::new(name), text), "{name} should be detected");
    }
    let no = [
        (
            "docker-compose.yml",
            "services:\n  db:\n    image: postgres\n",
        ),
        (
            "ingress.yaml",
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\n",
        ),
        ("envoy.yaml", "static_resources:\n  listeners: []\n"),
        ("nginx.conf", "http { server { listen 80; } }\n"),
    ];
    for (name, text) in no {
        assert!(
            !t.detect(Path::new(name), text),
            "{name} should not be detected"
        );
    }
}

/// A `tls.certificates` file missing at import keeps its paths: the listener's default when
/// no other certificate is known, else served for the TLS routers' hosts no other
/// certificate names; the line says so (not refused).
#[test]
fn a_certificate_missing_at_import_is_kept_by_path() {
    use veloxy_import::{Importer, Options};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dynamic.yml");
    std::fs::write(
        &path,
        "http:\n  routers:\n    app:\n      rule: \"Host(`app.example.com`)\"\n      entryPoints: [websecure]\n      service: app\n      tls: {}\n  services:\n    app:\n      loadBalancer:\n        servers:\n          - url: \"http://10.0.0.5:8080\"\ntls:\n  certificates:\n    - certFile: /etc/certs/app.pem\n      keyFile: /etc/certs/app.key\n",
    )
    .unwrap();
    let opts = Options {
        out_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let out = veloxy_import_traefik::Traefik
        .import(std::slice::from_ref(&path), &opts)
        .unwrap();
    let toml = out.config.to_toml();
    assert!(toml.contains("cert = \"/etc/certs/app.pem\""), "{toml}");
    assert!(toml.contains("key = \"/etc/certs/app.key\""), "{toml}");
    let report = out.report.text();
    assert!(!out.report.has_refused(), "{report}");
    assert!(
        report.contains("tls.certificates: translated with a difference: the certificate could not be read at import (/etc/certs/app.pem: No such file or directory (os error 2)); it is served as listener websecure's default certificate, for every name (check its names)"),
        "{report}"
    );
}
