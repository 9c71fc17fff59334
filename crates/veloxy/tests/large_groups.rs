//! Upstream groups past 64 backends (issue 36): the set of down backends, the retry loop's
//! set of tried backends and every policy work by index whatever the group's size (there was
//! a 64-backend limit, one bit each in a u64).

use std::time::Duration;

use veloxy_testkit::*;

/// A group of `n` servers where only the last (past the first 64) answers: the others refuse
/// connections. Active checks mark them down; then every request, under every policy, goes
/// to the one that answers, with no retry needed.
#[test]
fn a_group_of_two_hundred_serves_from_its_last_backend() {
    let live = upstream(&["--name", "last"]);
    // Ports that refuse, held for the whole test (bound, never listening).
    let dead: Vec<_> = (0..199).map(|_| refusing_addr()).collect();
    let mut servers: Vec<String> = dead.iter().map(|(a, _)| format!("\"{a}\"")).collect();
    servers.push(format!("\"{}\"", live.addr));
    for policy in [
        "round_robin",
        "least_conn",
        "p2c_ewma",
        "consistent_hash",
        "random",
    ] {
        let config = format!(
            "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n\
             [[routes]]\nupstream = \"app\"\n\
             [upstreams.app]\npolicy = \"{policy}\"\nretries = 0\nservers = [{}]\n\
             [upstreams.app.health]\ninterval = \"100ms\"\nunhealthy = 1\n",
            servers.join(", ")
        );
        let v = veloxy(&config);
        // Ready once the checks have marked the 199 down: 20 answers from `last` in a row.
        let ready = eventually(Duration::from_secs(20), || {
            (0..20).all(|_| {
                let r = get(v.addr, "/");
                r.status == 200 && r.header("x-upstream") == Some("last")
            })
        });
        assert!(
            ready,
            "{policy}: the live backend (index 199) does not get every request"
        );
    }
}
