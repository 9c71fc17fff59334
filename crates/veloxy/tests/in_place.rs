//! Changes applied in place (issue 36): a backend set changed through the runtime API, or a
//! reload, keeps each worker's state of the groups it leaves alone (picker, in-flight counts,
//! idle connections), and the changed group keeps the idle connections of the backends it
//! kept. The worker's state of a group lives with the group, not with the config generation.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use veloxy_testkit::*;

fn get_on(web: SocketAddr, host: &str, path: &str) -> Response {
    request(
        web,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
}

/// The backend of `lc.test` that answers the next three requests, which must all be the same.
/// Sets group `app`'s servers to `a` and `b` through the runtime API.
fn put_app_servers(v: &Veloxy, a: SocketAddr, b: SocketAddr) {
    let r = admin_call(
        v,
        "PUT",
        "/upstreams/app/servers",
        &format!("[\"{a}\", \"{b}\"]"),
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
}

/// The first of at most four answers through `web` that backend `name` gave.
fn answer_from(web: SocketAddr, name: &str) -> Response {
    (0..4)
        .map(|_| get_on(web, "x", "/"))
        .find(|r| r.header("x-upstream") == Some(name))
        .unwrap_or_else(|| panic!("{name} serves"))
}

fn lc_pick(web: SocketAddr) -> String {
    let picks: Vec<String> = (0..3)
        .map(|_| {
            let r = get_on(web, "lc.test", "/");
            assert_eq!(r.status, 200, "{}", r.body_str());
            r.header("x-upstream").unwrap_or("").to_owned()
        })
        .collect();
    assert!(picks.iter().all(|p| *p == picks[0]), "{picks:?}");
    picks[0].clone()
}

#[test]
fn a_change_to_one_group_keeps_every_other_groups_state() {
    let (x, y, a, b) = (
        upstream(&["--name", "x"]),
        upstream(&["--name", "y"]),
        upstream(&["--name", "a"]),
        upstream(&["--name", "b"]),
    );
    let config = format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nhost = \"lc.test\"\nupstream = \"lc\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.lc]\nservers = [\"{}\", \"{}\"]\npolicy = \"least_conn\"\n\
         [upstreams.app]\nservers = [\"{}\"]\n",
        x.addr, y.addr, a.addr
    );
    let v = veloxy(&config);
    let web = logged_addr(&v, "listening listener=web addr=");

    // One request held in flight on one backend of the least_conn group (`/hang` never
    // answers): least_conn sends everything else to the other one.
    let mut held = TcpStream::connect(web).unwrap();
    held.write_all(b"GET /hang HTTP/1.1\r\nHost: lc.test\r\n\r\n")
        .unwrap();
    let busy_seen = eventually(Duration::from_secs(5), || {
        let body = admin_call(&v, "GET", "/upstreams", "").body_str();
        body.contains("\"in_flight\":1")
    });
    assert!(busy_seen, "the held request never showed in /upstreams");
    let free = lc_pick(web);
    let app_conn = get_on(web, "x", "/").header("x-conn-id").map(str::to_owned);

    // Another group's set changes through the runtime API: a new config generation.
    put_app_servers(&v, a.addr, b.addr);
    assert_eq!(
        lc_pick(web),
        free,
        "least_conn forgot the request in flight when another group changed"
    );
    // The changed group kept the idle connection to the backend it kept.
    let again = answer_from(web, "a");
    assert_eq!(again.header("x-conn-id").map(str::to_owned), app_conn);

    // A reload that leaves the group alone keeps its state too.
    reload_with(&v, &config, "reloaded ");
    assert_eq!(
        lc_pick(web),
        free,
        "least_conn forgot the request in flight over a reload that left its group alone"
    );
    drop(held);
}

/// `checks_passed` of the backend at `addr`, from `/upstreams` (0 while it is not listed).
fn checks_passed(v: &Veloxy, addr: SocketAddr) -> u64 {
    backend_figure(v, addr, "checks_passed")
}

/// A figure (`field`) of the backend at `addr`, from `/upstreams` (0 while it is not listed).
fn backend_figure(v: &Veloxy, addr: SocketAddr, field: &str) -> u64 {
    let body = admin_call(v, "GET", "/upstreams", "").body_str();
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let groups = json.get("upstreams").and_then(|g| g.as_array()).cloned();
    let backends = groups
        .unwrap_or_default()
        .into_iter()
        .flat_map(|g| g["backends"].as_array().cloned().unwrap_or_default());
    backends
        .filter(|b| b["addr"].as_str() == Some(&addr.to_string()))
        .map(|b| b[field].as_u64().unwrap_or(0))
        .max()
        .unwrap_or(0)
}

#[test]
fn a_change_restarts_only_the_changed_groups_probes() {
    let (a1, a2, b1) = (
        upstream(&["--name", "a1"]),
        upstream(&["--name", "a2"]),
        upstream(&["--name", "b1"]),
    );
    let config = format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nhost = \"a.test\"\nupstream = \"a\"\n\
         [[routes]]\nupstream = \"b\"\n\
         [upstreams.a]\nservers = [\"{}\"]\nhealth = {{ path = \"/health\", interval = \"60s\" }}\n\
         [upstreams.b]\nservers = [\"{}\"]\nhealth = {{ path = \"/health\", interval = \"60s\" }}\n",
        a1.addr, b1.addr
    );
    let v = veloxy(&config);
    // Every backend is probed once at start, then every 60 s.
    assert!(eventually(Duration::from_secs(5), || {
        checks_passed(&v, a1.addr) == 1 && checks_passed(&v, b1.addr) == 1
    }));
    let r = admin_call(
        &v,
        "PUT",
        "/upstreams/a/servers",
        &format!("[\"{}\", \"{}\"]", a1.addr, a2.addr),
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    // The new backend is probed at once: the health thread has taken the change.
    assert!(eventually(Duration::from_secs(5), || checks_passed(
        &v, a2.addr
    ) == 1));
    assert_eq!(
        checks_passed(&v, b1.addr),
        1,
        "the probes of a group the change left alone restarted"
    );
}

/// A backend added in place to a group in use gets a connection before any request is sent
/// to it (each worker opens one to each new backend of a group it pools connections for),
/// and its first request goes over that connection instead of connecting first.
#[test]
fn a_backend_added_in_place_is_connected_before_its_first_request() {
    let (a, b) = (upstream(&["--name", "a"]), upstream(&["--name", "b"]));
    let config = format!(
        "[server]\nworkers = 1\nadmin = \"127.0.0.1:0\"\n\
         [listeners.web]\naddr = \"127.0.0.1:0\"\n\
         [[routes]]\nupstream = \"app\"\n\
         [upstreams.app]\nservers = [\"{}\"]\n",
        a.addr
    );
    let v = veloxy(&config);
    let web = logged_addr(&v, "listening listener=web addr=");
    // The group is in use: the worker holds an idle connection to `a`.
    assert_eq!(get_on(web, "x", "/").status, 200);
    assert_eq!(backend_figure(&v, b.addr, "open_connections"), 0);

    put_app_servers(&v, a.addr, b.addr);
    let warmed = eventually(Duration::from_secs(5), || {
        backend_figure(&v, b.addr, "open_connections") == 1
    });
    assert!(
        warmed,
        "no connection to the new backend before a request was sent to it"
    );
    // The first request `b` answers came over that connection: the first it accepted.
    let first = answer_from(web, "b");
    assert_eq!(first.header("x-conn-id"), Some("1"));
    assert_eq!(backend_figure(&v, b.addr, "open_connections"), 1);
}
