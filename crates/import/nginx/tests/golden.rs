//! Golden cases: `tests/golden/CASE/input/` -> `expected.toml` + `expected.report`, and
//! every output loads in the engine (see `veloxy_import::golden`). `VELOXY_BLESS=1` rewrites.

#[test]
fn golden_cases() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    veloxy_import::golden::run_goldens(&dir, &veloxy_import_nginx::Nginx);
}
