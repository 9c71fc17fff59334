//! Reloads of large configs: what they reuse, and (printed, not asserted) how long they take.

use std::path::Path;
use std::time::Instant;

use crate::config::Snapshot;
use crate::router::tests::Get;
use crate::upstream::balancer::PolicyRegistry;

/// `hosts` hosts with `paths` prefix routes each; host `changed` gets `/changed/` instead of
/// its first path.
fn config(hosts: usize, paths: usize, changed: Option<usize>) -> String {
    let mut out = String::from(
        "[listeners.web]\naddr = \"127.0.0.1:0\"\n\n[upstreams.app]\nservers = [\"127.0.0.1:9\"]\n\n",
    );
    for h in 0..hosts {
        for p in 0..paths {
            let path = match (changed == Some(h), p) {
                (true, 0) => "/changed/".to_owned(),
                _ => format!("/p{p}/"),
            };
            out.push_str(&format!(
                "[[routes]]\nhost = \"h{h}.test\"\npath = \"{path}\"\nupstream = \"app\"\n\n"
            ));
        }
    }
    out
}

fn compile(text: &str, previous: Option<&Snapshot>) -> Snapshot {
    let policies = PolicyRegistry::with_builtins();
    super::super::compile_str_after(Path::new("scale.toml"), text, &policies, previous)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// 100,000 routes over 10,000 hosts: a first load, then a reload that changes one host.
/// Prints the times (run with `--ignored --nocapture`; a debug build is slow, compare
/// before/after in the same build mode).
#[test]
#[ignore = "a timing, printed: run by hand"]
fn time_a_reload_of_100000_routes_changing_one_host() {
    let (hosts, paths) = (10_000, 10);
    let first = config(hosts, paths, None);
    let t = Instant::now();
    let mut running = compile(&first, None);
    println!(
        "100000 routes / 10000 hosts: load {:.3} s",
        t.elapsed().as_secs_f64()
    );
    // Three reloads, each changing another host than the one before.
    for changed in [4321, 17, 9876] {
        let text = config(hosts, paths, Some(changed));
        let t = Instant::now();
        let next = compile(&text, Some(&running));
        let took = t.elapsed();
        let taken = next.reuse.as_ref().map_or(0, |r| r.taken);
        println!(
            "reload changing host {changed}: {:.3} s ({taken} entries taken)",
            took.as_secs_f64()
        );
        running = next;
    }
    let b = running;
    assert_eq!(b.listeners[0].router.routes().len(), hosts * paths);
}

/// A reload through the compile (as SIGHUP, the admin API and the Kubernetes provider do it)
/// shares every unchanged host's routing order with the running snapshot and sorts the
/// changed host's routes again; the result routes as a fresh compile of the new text does.
#[test]
fn a_reload_shares_the_routing_order_of_unchanged_hosts() {
    let (hosts, paths) = (60, 3);
    let a = compile(&config(hosts, paths, None), None);
    assert_eq!(a.reused_hosts(), (0, hosts));
    let text = config(hosts, paths, Some(17));
    let b = compile(&text, Some(&a));
    assert_eq!(b.reused_hosts(), (hosts - 1, hosts));
    let (ra, rb) = (&a.listeners[0].router, &b.listeners[0].router);
    for h in 0..hosts {
        let name = format!("h{h}.test");
        let same =
            std::sync::Arc::ptr_eq(ra.host_order(&name).unwrap(), rb.host_order(&name).unwrap());
        assert_eq!(same, h != 17, "{name}");
    }
    let fresh = compile(&text, None);
    let find = |s: &Snapshot, host: &str, path: &str| {
        let mut slots = [None; crate::rules::MAX_SLOTS];
        (s.listeners[0]
            .router
            .find(host.as_bytes(), path.as_bytes(), &Get, &mut slots))
        .map(|(r, _)| (r.index, r.path.clone()))
    };
    for h in [0, 16, 17, 18, 59] {
        let host = format!("h{h}.test");
        for path in ["/p0/x", "/p1/", "/p2/y", "/changed/z", "/none"] {
            let got = find(&b, &host, path);
            assert_eq!(got, find(&fresh, &host, path), "{host}{path}");
        }
    }
    assert_eq!(
        find(&b, "h17.test", "/changed/z").map(|r| r.1),
        Some("/changed/".to_owned())
    );
    assert_eq!(find(&b, "h17.test", "/p0/"), None);
    assert_eq!(
        find(&b, "h59.test", "/p2/"),
        Some((59 * paths + 2, "/p2/".into()))
    );
    // A host added first moves every route's file position: the orders do not depend on
    // them, so all are still shared, and the routes carry their new positions.
    let shifted = text.replacen(
        "[[routes]]",
        "[[routes]]\nhost = \"first.test\"\nupstream = \"app\"\n\n[[routes]]",
        1,
    );
    let c = compile(&shifted, Some(&b));
    assert_eq!(c.reused_hosts(), (hosts, hosts + 1));
    assert_eq!(
        find(&c, "h59.test", "/p2/"),
        Some((59 * paths + 3, "/p2/".into()))
    );
    assert_eq!(find(&c, "first.test", "/x").map(|r| r.0), Some(0));
}

#[test]
fn groups_are_found_by_name_whatever_their_file_order() {
    let mut text = String::from("[listeners.web]\naddr = \"127.0.0.1:0\"\n\n");
    for name in ["zeta", "alpha", "m-9", "m-10", "Beta", "a.b"] {
        text.push_str(&format!(
            "[upstreams.\"{name}\"]\nservers = [\"127.0.0.1:9\"]\n\n"
        ));
    }
    text.push_str("[[routes]]\nupstream = \"zeta\"\n");
    let s = compile(&text, None);
    for (i, g) in s.upstreams.iter().enumerate() {
        assert_eq!(s.upstream_index(&g.name), Some(i), "{}", g.name);
    }
    assert_eq!(s.upstream_index("m-1"), None);
    assert_eq!(s.upstream_index(""), None);
}
