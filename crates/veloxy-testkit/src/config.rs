//! Small veloxy configs for tests.

use std::net::SocketAddr;

/// A config with one listener on an ephemeral port and one upstream group.
pub fn simple_config(servers: &[SocketAddr], extra_upstream: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n[upstreams.app]\nservers = [{}]\n{extra_upstream}\n",
        list.join(", ")
    )
}

/// A config with one listener and one upstream group over `servers`, with extra group keys.
pub fn group_config(servers: &[SocketAddr], group_keys: &str, route_keys: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\n[[routes]]\nupstream = \"app\"\n{route_keys}\n[upstreams.app]\nservers = [{}]\n{group_keys}\n",
        list.join(", ")
    )
}
