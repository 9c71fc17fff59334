//! A generated 5,000-server config imports correctly and its output loads in the engine
//! (correctness only: the timing is measured by hand on a release build, not asserted here).

use std::fmt::Write as _;

use veloxy_import::{Importer, Options};

#[test]
fn five_thousand_servers() {
    let dir = tempfile::tempdir().unwrap();
    let mut conf = String::from("events {}\nhttp {\n  upstream app { server 127.0.0.1:8080; }\n");
    for i in 0..5000 {
        let _ = write!(
            conf,
            "  server {{\n    listen 80;\n    server_name site{i}.example.com;\n    \
             location / {{ proxy_pass http://app; proxy_set_header Host $host; }}\n    \
             location /api/ {{ proxy_pass http://127.0.0.1:9000/; }}\n  }}\n"
        );
    }
    conf.push_str("}\n");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, &conf).unwrap();
    let opts = Options {
        out_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let imported = veloxy_import_nginx::Nginx.import(&[path], &opts).unwrap();
    assert!(!imported.report.has_refused(), "{}", imported.report.text());
    let c = &imported.config;
    // Two routes per server, and the first server is the default (any host).
    assert_eq!(c.routes.len(), 10_000);
    assert!(c.routes[0].get("host").is_none());
    assert_eq!(
        c.routes[2].get("host").and_then(|h| h.as_str()),
        Some("site1.example.com")
    );
    assert_eq!(c.upstreams.len(), 2);
    let toml = c.to_toml();
    let out = dir.path().join("veloxy.toml");
    std::fs::write(&out, &toml).unwrap();
    veloxy_engine::config::load_file(&out).unwrap();
}

#[test]
fn a_parse_error_names_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, "http {\n  server {\n    listen 80\n  }\n}\n").unwrap();
    let e = veloxy_import_nginx::Nginx
        .import(std::slice::from_ref(&path), &Options::default())
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{}:4:3: ", path.display())),
        "{text}"
    );
    assert!(matches!(e, veloxy_import::ImportError::Parse(_)));
}

#[test]
fn detection() {
    let n = veloxy_import_nginx::Nginx;
    let p = std::path::Path::new("site.conf");
    assert!(n.detect(
        p,
        "server {\n listen 80;\n location / { proxy_pass http://a; }\n}\n"
    ));
    assert!(n.detect(p, "http {\n  include conf.d/*.conf;\n}\n"));
    assert!(!n.detect(p, "example.com {\n  reverse_proxy localhost:8080\n}\n"));
    assert!(!n.detect(p, "frontend web\n  bind :80\n"));
}
