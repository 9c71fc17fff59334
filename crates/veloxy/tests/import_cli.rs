//! `veloxy import` as a command (issue 33): output and report destinations, detection, the
//! JSON report, `--strict`, parse errors (exit 2 with FILE:LINE:COL), placeholders without
//! and with `--env`, and generated secret files written 0600 beside the output. The
//! translations themselves are pinned by each importer's golden cases and differential tests.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use veloxy_testkit::*;

fn import(dir: &Path, args: &[&str]) -> Output {
    Command::new(VELOXY)
        .arg("import")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("veloxy import runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const NGINX: &str = "events {}\nhttp {\n  server {\n    listen 8080;\n    server_name example.com;\n    location / {\n      return 200 \"hello\\n\";\n    }\n  }\n}\n";

#[test]
fn stdout_and_stderr_by_default_files_with_o_and_report() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nginx.conf"), NGINX).unwrap();
    // Detected from the content; TOML on stdout, the report on stderr.
    let out = import(dir.path(), &["nginx.conf"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toml = text(&out.stdout);
    assert!(toml.contains("# from nginx.conf:"), "{toml}");
    assert!(toml.contains("[[routes]]"), "{toml}");
    let report = text(&out.stderr);
    assert!(
        report.contains("nginx.conf:7:7: return: translated"),
        "{report}"
    );
    assert!(
        report.lines().last().unwrap().starts_with("imported: "),
        "{report}"
    );
    // -o and --report write files; the output passes check.
    let out = import(
        dir.path(),
        &[
            "nginx.conf",
            "--from",
            "nginx",
            "-o",
            "out/veloxy.toml",
            "--report",
            "r.json",
            "--format",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("r.json")).unwrap()).unwrap();
    assert!(
        json["summary"]["translated"].as_u64().unwrap() >= 1,
        "{json}"
    );
    let entry = &json["entries"][0];
    assert!(entry["file"].is_string() && entry["line"].is_u64() && entry["outcome"].is_string());
    let check = Command::new(VELOXY)
        .args(["check", "--config"])
        .arg(dir.path().join("out/veloxy.toml"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
}

#[test]
fn parse_errors_exit_2_with_the_place() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.conf"),
        "http {\n  server {\n    listen 80\n  }\n",
    )
    .unwrap();
    let out = import(dir.path(), &["bad.conf", "--from", "nginx"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.starts_with("bad.conf:"), "{err}");
    let loc: Vec<&str> = err.splitn(4, ':').collect();
    assert!(
        loc[1].parse::<u32>().is_ok() && loc[2].parse::<u32>().is_ok(),
        "{err}"
    );
    // Content no importer recognizes: exit 2, and the hint names --from.
    std::fs::write(dir.path().join("x.txt"), "hello\n").unwrap();
    let out = import(dir.path(), &["x.txt"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--from"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn strict_exits_1_when_something_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let conf = "events {}\nhttp {\n  server {\n    listen 8080;\n    location ~ \\.php$ {\n      fastcgi_pass 127.0.0.1:9000;\n    }\n    location / {\n      return 200 ok;\n    }\n  }\n}\n";
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let out = import(dir.path(), &["nginx.conf", "-o", "v.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = text(&out.stderr);
    assert!(report.contains("fastcgi_pass: refused:"), "{report}");
    let out = import(dir.path(), &["nginx.conf", "-o", "v.toml", "--strict"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        dir.path().join("v.toml").exists(),
        "the output is still written"
    );
}

#[test]
fn placeholders_and_generated_secrets() {
    let dir = tempfile::tempdir().unwrap();
    // A Caddyfile with an inline bcrypt hash and an environment placeholder.
    let caddy = "{\n\tauto_https off\n}\nhttp://:8080 {\n\tbasicauth /admin/* {\n\t\talice $2a$14$Zkx19XLiW6VYouLHR5NmfOFU0z2GTNmpkT/5qqR7hx4IjWJPDhjvG\n\t}\n\treverse_proxy {$BACKEND}\n}\n";
    std::fs::write(dir.path().join("Caddyfile"), caddy).unwrap();
    let out = import(
        dir.path(),
        &["Caddyfile", "--from", "caddyfile", "-o", "v.toml"],
    );
    let report = text(&out.stderr);
    assert!(
        report.contains("BACKEND"),
        "refused by name without --env: {report}"
    );
    let out = Command::new(VELOXY)
        .args([
            "import",
            "Caddyfile",
            "--from",
            "caddyfile",
            "-o",
            "v.toml",
            "--env",
        ])
        .env("BACKEND", "127.0.0.1:9000")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toml = std::fs::read_to_string(dir.path().join("v.toml")).unwrap();
    assert!(toml.contains("127.0.0.1:9000"), "{toml}");
    let users = toml
        .lines()
        .find_map(|l| l.split("users_file = \"").nth(1))
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no users_file in {toml}"));
    let path = dir.path().join(users);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", path.display());
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .starts_with("alice:$2"));
}

/// An nginx config written as an envsubst template (the official image's templates): an
/// upper-case `${NAME}` is the environment's, refused by name without `--env` (exit 1 with
/// `--strict`) and resolved with it; a lower-case `${name}` stays an nginx variable.
#[test]
fn nginx_template_placeholders() {
    let dir = tempfile::tempdir().unwrap();
    let conf = "events {}\nhttp {\n  upstream app { server ${UPSTREAM}; }\n  server {\n    listen 8080;\n    location / {\n      proxy_pass http://app;\n      proxy_set_header X-Url \"${scheme}://${host}\";\n    }\n  }\n}\n";
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let out = import(
        dir.path(),
        &["nginx.conf", "--from", "nginx", "-o", "v.toml", "--strict"],
    );
    let report = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("server: refused: environment placeholder UPSTREAM"),
        "{report}"
    );
    let out = Command::new(VELOXY)
        .args(["import", "nginx.conf", "--from", "nginx", "-o", "v.toml"])
        .args(["--strict", "--env"])
        .env("UPSTREAM", "127.0.0.1:9000")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toml = std::fs::read_to_string(dir.path().join("v.toml")).unwrap();
    assert!(toml.contains("\"127.0.0.1:9000\""), "{toml}");
    assert!(toml.contains("{scheme}://{host}"), "{toml}");
}
