//! A reload compiles only what changed (issue 36): the route entries of a large config whose
//! text is unchanged are taken from the running snapshot, the others compiled. The reloaded
//! config must serve exactly as a fresh load of it would, and the routes left alone must
//! keep answering while it is swapped in.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veloxy_testkit::*;

fn get_on(web: SocketAddr, host: &str, path: &str) -> Response {
    request(
        web,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
}

/// `hosts` hosts with two paths each to group `app`, `g.test` to group `other`; `edit`
/// gets each route's text (host index, path) and may change or drop it; `tail` is added.
fn config(
    hosts: usize,
    groups: &str,
    edit: impl Fn(usize, &str, String) -> Option<String>,
    tail: &str,
) -> String {
    let mut out = String::from(
        "[server]\nworkers = 2\nadmin = \"127.0.0.1:0\"\n\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\n",
    );
    for i in 0..hosts {
        for p in ["/a/", "/b/"] {
            let route =
                format!("[[routes]]\nhost = \"h{i}.test\"\npath = \"{p}\"\nupstream = \"app\"\n\n");
            out.extend(edit(i, p, route));
        }
    }
    out.push_str("[[routes]]\nhost = \"g.test\"\nupstream = \"other\"\n\n");
    out.push_str(tail);
    out.push_str(groups);
    out
}

/// 6,000 routes: parsed with the file.
#[test]
fn a_reload_takes_unchanged_routes_and_serves_the_new_config() {
    reload_scenario(3000);
}

/// 18,000 routes (over 1 MiB): parsed a run of entries at a time.
#[test]
fn a_large_files_reload_takes_unchanged_routes_too() {
    reload_scenario(9000);
}

fn reload_scenario(hosts: usize) {
    let (a, b1, b2, n) = (
        upstream(&["--name", "a"]),
        upstream(&["--name", "b1"]),
        upstream(&["--name", "b2"]),
        upstream(&["--name", "n"]),
    );
    let groups = |other: SocketAddr, extra: &str| {
        format!(
            "{extra}[upstreams.app]\nservers = [\"{}\"]\n\n[upstreams.other]\nservers = [\"{other}\"]\n",
            a.addr
        )
    };
    let first = config(hosts, &groups(b1.addr, ""), |_, _, r| Some(r), "");
    let v = veloxy(&first);
    let web = logged_addr(&v, "listening listener=web addr=");
    assert_eq!(
        get_on(web, "h7.test", "/b/x").header("x-upstream"),
        Some("a")
    );
    assert_eq!(get_on(web, "h3.test", "/a/").status, 200);
    assert_eq!(get_on(web, "g.test", "/").header("x-upstream"), Some("b1"));

    // Requests to routes the reload leaves alone, until it is done: none may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut failed = Vec::new();
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed)
                && sent.load(Ordering::Relaxed) < 50_000
                && started.elapsed() < Duration::from_secs(60)
            {
                let n = sent.fetch_add(1, Ordering::Relaxed);
                let host = format!("h{}.test", 100 + n % 2000);
                let r = get_on(web, &host, "/a/");
                if r.status != 200 || r.header("x-upstream") != Some("a") {
                    failed.push(format!("{host}: {} {:?}", r.status, r.header("x-upstream")));
                }
            }
            failed
        })
    };
    assert!(eventually(Duration::from_secs(5), || sent
        .load(Ordering::Relaxed)
        > 20));

    // One route changed, one host removed, one added (to a new group named before `app`, so
    // every group's index moves), a route added to h11, and group `other`'s backend changed.
    let second = config(
        hosts,
        &groups(
            b2.addr,
            &format!("[upstreams.aaa]\nservers = [\"{}\"]\n\n", n.addr),
        ),
        |i, p, r| match (i, p) {
            (7, "/b/") => Some(r.replace(
                "upstream = \"app\"\n",
                "respond = { status = 200, body = \"changed\" }\n",
            )),
            (3, _) => None,
            (11, "/b/") => Some(format!(
                "{r}[[routes]]\nhost = \"h11.test\"\npath = \"/c/\"\n\
                 respond = {{ status = 200, body = \"c\" }}\n\n"
            )),
            _ => Some(r),
        },
        "[[routes]]\nhost = \"new.test\"\nupstream = \"aaa\"\n\n",
    );
    let before = v.proc.log_text().matches("reloaded ").count();
    reload_with(&v, &second, "reloaded ");
    // Some requests after the swap too.
    let at_swap = sent.load(Ordering::Relaxed);
    assert!(eventually(Duration::from_secs(10), || sent
        .load(Ordering::Relaxed)
        > at_swap + 50));
    stop.store(true, Ordering::Relaxed);
    let failed = load.join().unwrap();
    let sent = sent.load(Ordering::Relaxed);
    assert!(
        failed.is_empty(),
        "{} of {sent} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );

    // The reload took the unchanged entries: all but the changed one and the added one.
    let log = v.proc.log_text();
    let line = log
        .lines()
        .filter(|l| l.contains("reloaded "))
        .nth(before)
        .unwrap_or("");
    let entries = 2 * hosts + 1;
    // All but h3's two (gone), h7's /b/ (changed), h11's /c/ and new.test's (added).
    let unchanged = 2 * hosts - 2;
    // Every host's routing order but h11's (a route more) and new.test's is taken as it
    // was: h7's too, whose paths are the same (only a target changed).
    let tables = hosts + 1;
    assert!(
        line.contains(&format!(
            "({unchanged} of {entries} route entries unchanged, \
             {} of {tables} hosts' routing tables reused)",
            tables - 2
        )),
        "{line}"
    );

    let changed = get_on(web, "h7.test", "/b/x");
    assert_eq!(
        (changed.status, changed.body_str().as_str()),
        (200, "changed")
    );
    assert_eq!(
        get_on(web, "h7.test", "/a/").header("x-upstream"),
        Some("a")
    );
    assert_eq!(get_on(web, "h3.test", "/a/").status, 404);
    assert_eq!(get_on(web, "h3.test", "/b/").status, 404);
    assert_eq!(get_on(web, "new.test", "/").header("x-upstream"), Some("n"));
    assert_eq!(get_on(web, "h11.test", "/c/x").body_str(), "c");
    assert_eq!(
        get_on(web, "h11.test", "/b/").header("x-upstream"),
        Some("a")
    );
    assert_eq!(get_on(web, "h11.test", "/d/").status, 404);
    assert_eq!(get_on(web, "g.test", "/").header("x-upstream"), Some("b2"));
    // Every 37th host, both paths: still to `app` (its index moved), nothing else matches.
    for i in (0..hosts).step_by(37).filter(|&i| i != 3) {
        for p in ["/a/", "/b/"] {
            let r = get_on(web, &format!("h{i}.test"), p);
            let want = if (i, p) == (7, "/b/") {
                None
            } else {
                Some("a")
            };
            assert_eq!(r.header("x-upstream"), want, "h{i}.test{p}");
        }
        assert_eq!(get_on(web, &format!("h{i}.test"), "/c/").status, 404);
    }

    // A reload of the same text takes every entry; one that changes [server] takes none.
    reload_with(&v, &second, "reloaded ");
    let log = v.proc.log_text();
    assert!(
        log.contains(&format!(
            "({entries} of {entries} route entries unchanged, \
             {tables} of {tables} hosts' routing tables reused)"
        )),
        "{log}"
    );
    let third = second.replace(
        "workers = 2\n",
        "workers = 2\nkeepalive_timeout = \"30s\"\n",
    );
    reload_with(&v, &third, "reloaded ");
    let log = v.proc.log_text();
    assert!(
        log.contains(&format!(
            "(0 of {entries} route entries unchanged, 0 of {tables} hosts' routing tables reused)"
        )),
        "{log}"
    );
    assert_eq!(
        get_on(web, "h8.test", "/b/").header("x-upstream"),
        Some("a")
    );
    assert_eq!(get_on(web, "new.test", "/").header("x-upstream"), Some("n"));
}

/// An error in a route of a large file (parsed a run at a time) names the line, column and
/// key a whole parse would.
#[test]
fn a_large_files_bad_route_is_named_by_line_and_key() {
    let groups = "[upstreams.app]\nservers = [\"127.0.0.1:9\"]\n";
    let cases = [
        ("pth = 1\n", "routes[12345].pth: unknown field `pth`"),
        (
            "upstream = \"nope\"\n",
            "routes[12345].upstream: upstream \"nope\" is not defined",
        ),
    ];
    for (bad, want) in cases {
        let text = config(
            9000,
            groups,
            |i, p, r| match (i, p) {
                (6172, "/b/") => Some(r.replace("upstream = \"app\"\n", bad)),
                _ => Some(r),
            },
            "",
        );
        assert!(text.len() > 1 << 20);
        let at = text.find(bad).unwrap();
        let line = text[..at].matches('\n').count() + 1;
        let column = if bad.starts_with("upstream") { 12 } else { 1 };
        let out = check(&text);
        let shown = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success());
        assert!(
            shown.contains(&format!("veloxy.toml:{line}:{column}: {want}")),
            "want line {line}: {shown}"
        );
    }
}
