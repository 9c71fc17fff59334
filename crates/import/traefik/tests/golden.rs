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
