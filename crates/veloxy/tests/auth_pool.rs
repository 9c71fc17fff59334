//! basic_auth under attack (issue 31, items 3 and 4): a bcrypt check runs off the worker, on
//! the credential check pool (threads named `veloxy-auth-N`), so a flood of wrong passwords
//! does not stall other requests; and an unknown user costs a bcrypt like a known one, so the
//! time of a 401 does not tell which user names exist.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use veloxy_testkit::*;

/// A users file with `alice` hashed at bcrypt cost `cost`; `None` without htpasswd.
fn users(dir: &std::path::Path, cost: &str) -> Option<std::path::PathBuf> {
    let path = dir.join("htpasswd");
    if !htpasswd(&path, "alice", "wonder", &["-c", "-B", "-C", cost]) {
        skip("Apache's htpasswd (apache2-utils) is not installed");
        return None;
    }
    Some(path)
}

fn start(users: &std::path::Path) -> Veloxy {
    veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\npath = \"/admin/\"\nrespond = {{ body = \"admin\" }}\n\
         basic_auth = {{ realm = \"r\", users_file = \"{}\" }}\n\
         [[routes]]\nrespond = {{ body = \"open\" }}\n",
        users.display()
    ))
}

/// The names of the process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .collect()
}

#[test]
fn a_bcrypt_check_in_flight_does_not_stall_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    // Cost 14: about a second of CPU a check.
    let Some(users) = users(dir.path(), "14") else {
        return;
    };
    let v = start(&users);
    let mut slow = std::net::TcpStream::connect(v.addr).unwrap();
    let wrong = basic_credentials("alice", "guess");
    write!(
        slow,
        "GET /admin/ HTTP/1.1\r\nHost: a\r\nAuthorization: {wrong}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    // Ready when the check pool has started: its threads exist once a check is queued.
    let pid = v.proc.pid();
    assert!(
        eventually(Duration::from_secs(10), || thread_names(pid)
            .iter()
            .any(|n| n.starts_with("veloxy-auth"))),
        "no credential check thread: {:?}",
        thread_names(pid)
    );
    // The one worker answers another route while the check runs.
    let r = get(v.addr, "/other");
    assert_eq!((r.status, r.body_str().as_str()), (200, "open"));
    slow.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(
        matches!(slow.read(&mut buf), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the check finished before the other route's answer: it did not run beside the worker"
    );
    slow.set_nonblocking(false).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (status, _) = read_to_close(&mut slow);
    assert_eq!(status, 401);
}

#[test]
fn an_unknown_user_costs_a_bcrypt_like_a_known_one() {
    let dir = tempfile::tempdir().unwrap();
    // Cost 12: a quarter of a second a check, against well under a millisecond for a
    // lookup that finds no user.
    let Some(users) = users(dir.path(), "12") else {
        return;
    };
    let v = start(&users);
    let timed = |user: &str| {
        let started = Instant::now();
        let r = request(
            v.addr,
            &format!(
                "GET /admin/ HTTP/1.1\r\nHost: a\r\nAuthorization: {}\r\nConnection: close\r\n\r\n",
                basic_credentials(user, "guess")
            ),
        );
        assert_eq!(r.status, 401);
        started.elapsed()
    };
    let known = timed("alice");
    let unknown = timed("mallory");
    // A lower bound only: a loaded machine makes both slower, never the unknown one faster
    // than a bcrypt of this cost.
    assert!(
        unknown >= known / 4 && unknown >= Duration::from_millis(20),
        "unknown user answered in {unknown:?}, known in {known:?}"
    );
}
