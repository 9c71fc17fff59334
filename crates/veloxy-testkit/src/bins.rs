//! Where the `veloxy` and `veloxy-upstream` executables are, and building the latter.
//!
//! `env!("CARGO_BIN_EXE_<name>")` exists only in the integration tests of the package that
//! defines the binary, so this library finds both binaries at run time instead:
//!
//! * [`VELOXY`]: `$CARGO_BIN_EXE_veloxy` when cargo set it for the running test (cargo sets it
//!   at run time too, for the integration tests of the `veloxy` package), otherwise `veloxy` in
//!   the directory of the running test's profile: the test executable is
//!   `target/<profile>/deps/<test>-<hash>`, so that is the grandparent directory of
//!   [`std::env::current_exe`]. Cargo builds (and rebuilds) it before it runs the integration
//!   tests of the `veloxy` package; nothing here builds it.
//! * [`UPSTREAM`]: cargo never builds another package's binary for a test, so the first use in
//!   a test process runs `cargo build -p veloxy-testkit --bin veloxy-upstream` (the cargo that
//!   runs the tests, `$CARGO`, with the running test's profile) and uses the executable it
//!   reports. When everything is fresh this is a no-op of a fraction of a second; otherwise it
//!   compiles the upstream (the first time, or after its sources changed). Setting
//!   `VELOXY_TEST_UPSTREAM_BIN=/path/to/veloxy-upstream` skips the build and uses that file.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One of the workspace's executables, located on first use. Usable wherever a program path
/// is: `Command::new(VELOXY)`, `Path::new(&UPSTREAM)`, `format!("{VELOXY}")`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bin(Which);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Veloxy,
    Upstream,
}

/// The `veloxy` executable (package `veloxy`). Valid in the integration tests of `veloxy`.
pub const VELOXY: Bin = Bin(Which::Veloxy);

/// The `veloxy-upstream` test backend (package `veloxy-testkit`), built on first use.
pub const UPSTREAM: Bin = Bin(Which::Upstream);

impl Bin {
    /// The executable's name.
    pub fn name(self) -> &'static str {
        match self.0 {
            Which::Veloxy => "veloxy",
            Which::Upstream => "veloxy-upstream",
        }
    }

    /// The executable's path; panics with an explanation when it cannot be found or built.
    pub fn path(self) -> &'static Path {
        static VELOXY_PATH: OnceLock<PathBuf> = OnceLock::new();
        static UPSTREAM_PATH: OnceLock<PathBuf> = OnceLock::new();
        match self.0 {
            Which::Veloxy => VELOXY_PATH.get_or_init(locate_veloxy),
            Which::Upstream => UPSTREAM_PATH.get_or_init(build_upstream),
        }
    }
}

impl AsRef<OsStr> for Bin {
    fn as_ref(&self) -> &OsStr {
        self.path().as_os_str()
    }
}

impl AsRef<Path> for Bin {
    fn as_ref(&self) -> &Path {
        self.path()
    }
}

impl fmt::Display for Bin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.path().display().fmt(f)
    }
}

/// `target/<profile>`: the directory holding the running test's `deps/` directory.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the running test executable");
    exe.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} is not in target/<profile>/deps/", exe.display()))
        .to_path_buf()
}

fn locate_veloxy() -> PathBuf {
    let path = match std::env::var_os("CARGO_BIN_EXE_veloxy") {
        Some(p) => PathBuf::from(p),
        None => profile_dir().join("veloxy"),
    };
    assert!(
        path.is_file(),
        "{} not found: cargo builds `veloxy` for the integration tests of the `veloxy` \
         package (cargo test -p veloxy); from anywhere else, build it first (cargo build -p veloxy)",
        path.display()
    );
    path
}

fn build_upstream() -> PathBuf {
    if let Some(p) = std::env::var_os("VELOXY_TEST_UPSTREAM_BIN") {
        let path = PathBuf::from(p);
        assert!(
            path.is_file(),
            "VELOXY_TEST_UPSTREAM_BIN={} is not a file",
            path.display()
        );
        return path;
    }
    let profile_dir = profile_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "--quiet",
        "--message-format=json-render-diagnostics",
    ])
    .arg("--manifest-path")
    .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
    .args(["-p", "veloxy-testkit", "--bin", "veloxy-upstream"]);
    // `cargo test` builds into target/debug, `cargo test --release` into target/release,
    // `--profile NAME` into target/NAME: build the upstream with the same profile.
    match profile_dir.file_name().and_then(OsStr::to_str) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(name) => {
            cmd.args(["--profile", name]);
        }
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "running {} to build veloxy-upstream: {e} (set VELOXY_TEST_UPSTREAM_BIN to use a \
             prebuilt one)",
            Path::new(&cargo).display()
        )
    });
    assert!(
        out.status.success(),
        "building veloxy-upstream failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // One JSON message per line; the binary's `compiler-artifact` names the executable.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "veloxy-upstream")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported no veloxy-upstream executable:\n{stdout}"));
    assert!(
        path.is_file(),
        "{} not found after building it",
        path.display()
    );
    path
}
