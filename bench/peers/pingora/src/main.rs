//! Minimal Pingora load balancer for veloxy's benchmark suite.
//!
//! Round robin over the upstreams, upstream keep-alive (pool size from a flag),
//! X-Forwarded-For appended, no access log, worker thread count from a flag.
//!
//! Usage:
//!   veloxy-bench-pingora --listen 127.0.0.1:8080 --threads 1 --keepalive 128 \
//!       --to 127.0.0.1:9001 --to 127.0.0.1:9002 [--pid-file /tmp/x.pid]

use std::sync::Arc;

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::{selection::RoundRobin, LoadBalancer};
use pingora::prelude::*;
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;

struct Lb(Arc<LoadBalancer<RoundRobin>>);

#[async_trait]
impl ProxyHttp for Lb {
    type CTX = ();
    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        let backend = self
            .0
            .select(b"", 256)
            .ok_or_else(|| Error::explain(ErrorType::ConnectNoRoute, "no upstream"))?;
        // Plain HTTP upstream (tls = false); SNI unused.
        Ok(Box::new(HttpPeer::new(backend, false, String::new())))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        _ctx: &mut Self::CTX,
    ) -> Result<()> {
        let ip = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string());
        if let Some(ip) = ip {
            let value = match upstream_request.headers.get("x-forwarded-for") {
                Some(prev) => format!("{}, {}", String::from_utf8_lossy(prev.as_bytes()), ip),
                None => ip,
            };
            upstream_request.insert_header("X-Forwarded-For", value)?;
        }
        Ok(())
    }
}

struct Args {
    listen: String,
    upstreams: Vec<String>,
    threads: usize,
    keepalive: usize,
    pid_file: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: veloxy-bench-pingora --listen ADDR --to ADDR [--to ADDR ...] \
         [--threads N] [--keepalive N] [--pid-file PATH]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = Args {
        listen: String::new(),
        upstreams: Vec::new(),
        threads: 1,
        keepalive: 128,
        pid_file: format!("/tmp/veloxy-bench-pingora-{}.pid", std::process::id()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--listen" => args.listen = val(),
            "--to" => args.upstreams.push(val()),
            "--threads" => args.threads = val().parse().unwrap_or_else(|_| usage()),
            "--keepalive" => args.keepalive = val().parse().unwrap_or_else(|_| usage()),
            "--pid-file" => args.pid_file = val(),
            _ => usage(),
        }
    }
    if args.listen.is_empty() || args.upstreams.is_empty() || args.threads == 0 {
        usage();
    }
    args
}

fn main() {
    let args = parse_args();

    let mut conf = ServerConf::new().expect("default server conf");
    conf.threads = args.threads;
    conf.upstream_keepalive_pool_size = args.keepalive;
    conf.pid_file = args.pid_file.clone();
    conf.upgrade_sock = format!("{}.upgrade.sock", args.pid_file);
    conf.grace_period_seconds = Some(0);
    conf.graceful_shutdown_timeout_seconds = Some(1);

    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let upstreams =
        LoadBalancer::try_from_iter(args.upstreams.iter().map(String::as_str)).expect("upstreams");
    let mut svc = http_proxy_service(&server.configuration, Lb(Arc::new(upstreams)));
    svc.add_tcp(&args.listen);
    server.add_service(svc);
    server.run_forever();
}
