//! The disk tier of the response cache (`[caches.NAME] disk = { path, size }`): entries
//! survive a restart, a corrupt entry is a miss (and deleted), the directory stays under its
//! size, and a disk that fails to write costs only the copy on disk.

use std::path::Path;
use std::time::Duration;

use veloxy_testkit::*;

#[path = "support/cache.rs"]
mod support;
use support::*;

fn disk_lines(dir: &Path, size: &str) -> String {
    format!(
        "disk = {{ path = \"{}\", size = \"{size}\" }}\n",
        dir.display()
    )
}

/// The `.vxc` entry files under `dir`.
fn entry_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(sub.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if f.path().extension().is_some_and(|e| e == "vxc") {
                out.push(f.path());
            }
        }
    }
    out
}

fn metric(v: &Veloxy, name: &str) -> f64 {
    let text = admin(v, "GET", "/metrics").body_str();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One Host for both processes: the default key has the port a request names, and each
/// process listens on a port of its own.
const HOST: [(&str, &str); 1] = [("Host", "cache.test")];

#[test]
fn entries_survive_a_restart_and_a_corrupt_entry_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let o = script_origin(|r| {
        Scripted::ok(format!("v{}", r.seq)).header("cache-control", "max-age=600")
    });
    let lines = disk_lines(dir.path(), "64MiB");
    let setup = || Setup {
        caches: &lines,
        ..Setup::default()
    };
    let v = start_with(&o, setup());
    assert_eq!(
        summary(&get1(&v, "/a", &HOST)),
        (200, "v1".into(), Some("MISS"))
    );
    assert_eq!(
        summary(&get1(&v, "/b", &HOST)),
        (200, "v2".into(), Some("MISS"))
    );
    assert!(
        eventually(Duration::from_secs(10), || entry_files(dir.path()).len()
            == 2),
        "both entries written: {:?}",
        entry_files(dir.path())
    );
    drop(v);

    // A new process: the objects come from the disk, over HTTP/1.1 and HTTP/2.
    let v = start_with(&o, setup());
    assert_eq!(
        summary(&get1(&v, "/a", &HOST)),
        (200, "v1".into(), Some("HIT"))
    );
    let r = fetch(&v, Proto::H2, "GET", "/b", &HOST);
    assert_eq!(summary(&r), (200, "v2".into(), Some("HIT")));
    assert_eq!(o.hits(), 2, "nothing went upstream after the restart");
    drop(v);

    // Every entry damaged by one flipped byte: each is a miss and is replaced.
    for f in entry_files(dir.path()) {
        let mut data = std::fs::read(&f).unwrap();
        let mid = data.len() / 2;
        data[mid] ^= 0x20;
        std::fs::write(&f, data).unwrap();
    }
    let v = start_with(&o, setup());
    assert_eq!(
        summary(&get1(&v, "/a", &HOST)),
        (200, "v3".into(), Some("MISS"))
    );
    assert_eq!(
        summary(&get1(&v, "/a", &HOST)),
        (200, "v3".into(), Some("HIT"))
    );
    assert!(
        eventually(Duration::from_secs(10), || metric(
            &v,
            "veloxy_cache_disk_errors_total"
        ) >= 2.0),
        "corrupt entries counted"
    );
}

#[test]
fn the_directory_stays_under_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let o =
        script_origin(|_| Scripted::ok(vec![b'x'; 400_000]).header("cache-control", "max-age=600"));
    let lines = disk_lines(dir.path(), "1MiB");
    let v = start_with(
        &o,
        Setup {
            caches: &lines,
            ..Setup::default()
        },
    );
    for p in ["/1", "/2", "/3", "/4"] {
        assert_eq!(get1(&v, p, &[]).status, 200);
    }
    assert!(
        eventually(Duration::from_secs(10), || {
            let files = entry_files(dir.path());
            let total: u64 = files
                .iter()
                .map(|f| f.metadata().map_or(0, |m| m.len()))
                .sum();
            files.len() == 2 && total <= 1 << 20
        }),
        "{:?}",
        entry_files(dir.path())
    );
    assert!(metric(&v, "veloxy_cache_disk_bytes") <= f64::from(1u32 << 20));
}

#[test]
fn a_disk_that_cannot_be_written_only_loses_the_disk_copy() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("c");
    let o = script_origin(|r| {
        Scripted::ok(format!("v{}", r.seq)).header("cache-control", "max-age=600")
    });
    let lines = disk_lines(&cache_dir, "64MiB");
    let v = start_with(
        &o,
        Setup {
            caches: &lines,
            ..Setup::default()
        },
    );
    // The directory becomes a file: every write fails (ENOTDIR), as on a broken disk.
    std::fs::remove_dir_all(&cache_dir).unwrap();
    std::fs::write(&cache_dir, b"not a directory").unwrap();
    assert_eq!(
        summary(&get1(&v, "/a", &[])),
        (200, "v1".into(), Some("MISS"))
    );
    assert_eq!(
        summary(&get1(&v, "/a", &[])),
        (200, "v1".into(), Some("HIT"))
    );
    assert!(
        eventually(Duration::from_secs(10), || metric(
            &v,
            "veloxy_cache_disk_errors_total"
        ) >= 1.0),
        "the failed write is counted"
    );
}

/// Files under `dir` (two levels), whatever their name.
fn all_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if sub.path().is_file() {
            out.push(sub.path());
        }
        for f in std::fs::read_dir(sub.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            out.push(f.path());
        }
    }
    out
}

/// Issue 31, item 13: a write that fails midway (a full disk) leaves no temporary file behind,
/// and is counted. The disk is a 64 KiB tmpfs the test mounts (root only; skipped without).
#[test]
fn a_failed_disk_write_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(dir.path())
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        skip("cannot mount a small tmpfs (needs root)");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).output();
        }
    }
    let _unmount = Unmount(dir.path());
    // 200 KiB answers: stored in memory (max_object 1 MiB), too big for the disk.
    let o = script_origin(|r| {
        Scripted::ok(vec![b'x'; 200 * 1024])
            .header("cache-control", "max-age=600")
            .header("x-n", r.seq.to_string())
    });
    let lines = disk_lines(dir.path(), "64MiB");
    let v = start_with(
        &o,
        Setup {
            caches: &lines,
            ..Setup::default()
        },
    );
    for path in ["/a", "/b", "/c"] {
        assert_eq!(get1(&v, path, &HOST).status, 200);
    }
    assert!(
        eventually(Duration::from_secs(10), || metric(
            &v,
            "veloxy_cache_disk_errors_total"
        ) >= 3.0),
        "the failed writes are counted"
    );
    let left: Vec<_> = all_files(dir.path())
        .into_iter()
        .filter(|f| f.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    assert_eq!(get1(&v, "/a", &HOST).header("x-cache"), Some("HIT"));
}

/// Issue 34: the disk directory is made when veloxy starts (`veloxy check` makes none), and a
/// reload keeps the store, its entries and its directory.
#[test]
fn run_makes_the_directory_and_a_reload_keeps_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("new/cache");
    let o = script_origin(|r| {
        Scripted::ok(format!("v{}", r.seq)).header("cache-control", "max-age=600")
    });
    let lines = disk_lines(&cache, "64MiB");
    let setup = || Setup {
        caches: &lines,
        ..Setup::default()
    };
    let v = start_with(&o, setup());
    assert!(cache.is_dir(), "the disk directory is made at start");
    assert_eq!(get1(&v, "/a", &HOST).status, 200);
    assert_eq!(x_cache(&get1(&v, "/a", &HOST)), Some("HIT"));
    reload_with(&v, &cache_config(&o, &setup()), "reloaded");
    assert_eq!(
        summary(&get1(&v, "/a", &HOST)),
        (200, "v1".into(), Some("HIT"))
    );
    assert_eq!(o.hits(), 1, "the store and its entry outlived the reload");
}

/// A disk path that cannot be a directory is refused by `veloxy check`, which still creates
/// nothing.
#[test]
fn check_refuses_a_disk_path_under_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let config = dir.path().join("veloxy.toml");
    std::fs::write(
        &config,
        format!(
            "[listeners.web]\naddr = \"127.0.0.1:0\"\n\
             [caches.main]\ndisk = {{ path = \"{}\" }}\n\
             [[routes]]\nrespond = {{ body = \"hello\" }}\n",
            file.join("cache").display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(VELOXY)
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("caches.main.disk.path: cannot use the directory")
            && text.contains("is not a directory"),
        "{text}"
    );
}

#[test]
fn an_unsafe_request_invalidates_the_disk_copy_too() {
    let dir = tempfile::tempdir().unwrap();
    let o = script_origin(|r| match r.method.as_str() {
        "GET" => Scripted::ok(format!("v{}", r.seq)).header("cache-control", "max-age=600"),
        _ => Scripted::new(204),
    });
    let lines = disk_lines(dir.path(), "64MiB");
    let setup = || Setup {
        caches: &lines,
        ..Setup::default()
    };
    let v = start_with(&o, setup());
    for p in ["/a", "/keep"] {
        assert_eq!(x_cache(&get1(&v, p, &HOST)), Some("MISS"));
    }
    assert!(
        eventually(Duration::from_secs(10), || entry_files(dir.path()).len()
            == 2),
        "both entries written"
    );
    let r = fetch(&v, Proto::H1, "PUT", "/a", &HOST);
    assert_eq!(r.status, 204);
    assert_eq!(
        entry_files(dir.path()).len(),
        1,
        "the disk copy is gone at once"
    );
    drop(v);
    // A new process finds only the other entry on disk.
    let v = start_with(&o, setup());
    assert_eq!(x_cache(&get1(&v, "/keep", &HOST)), Some("HIT"));
    assert_eq!(x_cache(&get1(&v, "/a", &HOST)), Some("MISS"));
}
