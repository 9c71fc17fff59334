//! The connection to `[server.redis]`: one thread with its own runtime and a reconnecting
//! multiplexed connection (redis-rs' `ConnectionManager`), fed through a channel, so no worker
//! ever waits on Redis: workers send lease requests and read the answers from shared slots.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::global_limit::Slot;

/// `[server.redis]`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSpec {
    /// `redis://` (or `rediss://`) URL, credentials included when configured.
    pub url: String,
    /// `timeout`: the longest wait for one answer (default 50ms).
    pub timeout: Duration,
    /// `pool`: connections (each multiplexed) the client thread keeps (default 8).
    pub pool: usize,
    /// `ca_file`: for `rediss://`, the CA certificates (PEM) the server is verified against
    /// (default: the system's roots), read at load.
    pub ca_pem: Option<Vec<u8>>,
    /// Where `ca_pem` was read from (absolute).
    pub ca_file: Option<std::path::PathBuf>,
}

/// A client for `spec` (over TLS for `rediss://`, trusting `ca_file` when given).
pub(crate) fn open(spec: &RedisSpec) -> redis::RedisResult<redis::Client> {
    match &spec.ca_pem {
        Some(pem) if spec.url.starts_with("rediss://") => redis::Client::build_with_tls(
            spec.url.as_str(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            },
        ),
        _ => redis::Client::open(spec.url.as_str()),
    }
}

/// `url` with its password replaced by `****` (for `veloxy check --print`).
pub(crate) fn redacted(url: &str) -> String {
    match url.split_once("://").and_then(|(scheme, rest)| {
        let (user, host) = rest.split_once('@')?;
        let name = user.split_once(':').map_or(user, |(n, _)| n);
        Some(format!("{scheme}://{name}:****@{host}"))
    }) {
        Some(r) => r,
        None => url.to_owned(),
    }
}

/// One lease request: take up to `want` tokens from the bucket `key`.
struct Lease {
    key: String,
    rate: f64,
    burst: f64,
    want: u32,
    slot: Arc<Slot>,
}

/// The client of one Redis server.
pub struct RedisClient {
    spec: RedisSpec,
    tx: tokio::sync::mpsc::UnboundedSender<Lease>,
    /// Lease requests that failed (timeout, connection refused, script error).
    pub errors: AtomicU64,
    /// A request failed: the connections are dropped and made afresh (at most once a
    /// second), rather than trusting them to recover by themselves.
    broken: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClient").finish_non_exhaustive()
    }
}

/// A token bucket in Redis, refilled from Redis' own clock (`TIME`), so instances with skewed
/// clocks agree: takes up to ARGV[3] tokens and returns how many it took.
const TAKE: &str = r"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil then tokens = burst; ts = now end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local grant = math.min(want, math.floor(tokens))
tokens = tokens - grant
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return grant
";

impl RedisClient {
    fn start(spec: RedisSpec) -> Arc<RedisClient> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = Arc::new(RedisClient {
            spec,
            tx,
            errors: AtomicU64::new(0),
            broken: std::sync::atomic::AtomicBool::new(false),
        });
        let c = client.clone();
        let spawned = std::thread::Builder::new()
            .name("veloxy-redis".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                if let Ok(rt) = rt {
                    rt.block_on(run(c, rx));
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "redis: cannot start the client thread");
        }
        client
    }

    /// `timeout` in milliseconds (at least 1).
    pub(crate) fn timeout_ms(&self) -> u64 {
        (self.spec.timeout.as_millis() as u64).max(1)
    }

    /// Asks for tokens; the answer lands in `slot` (or marks it failed).
    pub(crate) fn lease(&self, key: String, (rate, burst): (f64, f64), want: u32, slot: Arc<Slot>) {
        let _ = self.tx.send(Lease {
            key,
            rate,
            burst,
            want,
            slot,
        });
    }
}

async fn run(client: Arc<RedisClient>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Lease>) {
    let script = redis::Script::new(TAKE);
    // One connection before the first lease, so a fresh start does not fall back; the rest of
    // the pool in the background (a TLS handshake each), replacing it when ready.
    let mut conns: Vec<redis::aio::ConnectionManager> = connect(&client.spec, 1).await;
    let mut next = 0usize;
    let mut last_try = tokio::time::Instant::now();
    let mut connecting: Option<tokio::sync::oneshot::Receiver<Vec<redis::aio::ConnectionManager>>> =
        None;
    if !conns.is_empty() && client.spec.pool > 1 {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spec = client.spec.clone();
        tokio::spawn(async move {
            let _ = tx.send(connect(&spec, spec.pool).await);
        });
        connecting = Some(rx);
    }
    while let Some(lease) = rx.recv().await {
        if client.broken.swap(false, Ordering::AcqRel) {
            conns.clear();
        }
        if let Some(rx) = connecting.as_mut() {
            match rx.try_recv() {
                // An empty set (the pool failed to connect) keeps what there is.
                Ok(made) if made.is_empty() => connecting = None,
                Ok(made) => (conns, connecting) = (made, None),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => connecting = None,
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
            }
        }
        // While Redis is unreachable, one connection attempt a second, in the background:
        // leases meanwhile fail at once (their limits fall back as `on_store_error` says)
        // rather than wait, so no request waits for a reconnection.
        if conns.is_empty() && connecting.is_none() && last_try.elapsed() >= Duration::from_secs(1)
        {
            last_try = tokio::time::Instant::now();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let spec = client.spec.clone();
            tokio::spawn(async move {
                let _ = tx.send(connect(&spec, spec.pool).await);
            });
            connecting = Some(rx);
        }
        if conns.is_empty() {
            fail(&client, &lease);
            continue;
        }
        next = (next + 1) % conns.len();
        let mut conn = conns[next].clone();
        let (script, client) = (script.clone(), client.clone());
        tokio::spawn(async move {
            let mut invocation = script.key(&lease.key);
            invocation.arg(lease.rate).arg(lease.burst).arg(lease.want);
            let call = invocation.invoke_async::<i64>(&mut conn);
            match tokio::time::timeout(client.spec.timeout, call).await {
                Ok(Ok(granted)) => lease.slot.granted(granted.max(0)),
                _ => fail(&client, &lease),
            }
        });
    }
}

fn fail(client: &RedisClient, lease: &Lease) {
    client.errors.fetch_add(1, Ordering::Relaxed);
    client.broken.store(true, Ordering::Release);
    lease.slot.failed();
}

/// Up to `n` connections (fewer if one fails).
async fn connect(spec: &RedisSpec, n: usize) -> Vec<redis::aio::ConnectionManager> {
    let c = match open(spec) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "redis: unusable client settings");
            return Vec::new();
        }
    };
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(spec.timeout.max(Duration::from_millis(100)))
        .set_response_timeout(spec.timeout)
        .set_number_of_retries(1);
    let mut out = Vec::new();
    for _ in 0..n.max(1) {
        let made = tokio::time::timeout(
            spec.timeout.max(Duration::from_millis(200)),
            redis::aio::ConnectionManager::new_with_config(c.clone(), config.clone()),
        )
        .await;
        match made {
            Ok(Ok(m)) => out.push(m),
            _ => break,
        }
    }
    out
}

impl RedisClient {
    /// A client for `spec`: its thread starts now (the runtime makes one per spec and keeps
    /// it across reloads; compiling a config makes none).
    pub(crate) fn new(spec: &RedisSpec) -> Arc<RedisClient> {
        RedisClient::start(spec.clone())
    }

    /// The settings it was made with.
    pub(crate) fn spec(&self) -> &RedisSpec {
        &self.spec
    }
}
