//! The exchange core: what happens to a request between the downstream codec that parsed it
//! and the upstream client that forwards it, written once for every protocol.
//!
//! A downstream codec (HTTP/1 in [`crate::downstream::connection`], HTTP/2 in the `http2` module, HTTP/3
//! later) turns its request into a protocol-neutral [`Head`] and calls [`admit`]: listener
//! lookup, route match, rate limit, the `on_request` hook (file routes included), and for a
//! proxied route the first backend choice. The codec then either serves the file or runs the
//! [`attempt`] loop (attempts on backends, retries, outlier feedback), and ends with
//! [`Record::finish`] (access log, metrics, `on_done`). Each of those exists in one place, as
//! do the route's concurrency slot ([`hold_slot`]), the HTTP/2 upstream attempt ([`h2`]) and
//! the limits on a streamed HTTP/2 or HTTP/3 request body ([`body`]).

pub(crate) mod answer;
mod apply;
pub(crate) mod attempt;
pub(crate) mod body;
pub(crate) mod drive;
pub(crate) mod edit;
pub(crate) mod fill;
pub(crate) mod forward_auth;
pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod record;

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) use crate::message::{Answer, Fields, Head};
use apply::{real_client, response_edit, upstream_edit};
pub(crate) use record::Record;

use crate::error::{ErrorKind, ProxyError};
use crate::hooks::{RequestCtx, RequestInfo};
use crate::limits::ConcurrencyLimit;
use crate::router::RouteTarget;
use crate::static_files::StaticRoute;
use crate::upstream::balancer::PickContext;
use crate::upstream::RequestKeys;
use crate::worker::{Generation, Worker};

impl crate::rules::Request for Head<'_> {
    fn method(&self) -> &str {
        self.method
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields.get(name)
    }
    fn query(&self) -> &str {
        memchr::memchr(b'?', self.target.as_bytes()).map_or("", |i| &self.target[i + 1..])
    }
}

/// The downstream connection a request came on.
pub(crate) struct Peer<'a> {
    pub addr: SocketAddr,
    /// The address the client connected to, when some group sends PROXY headers.
    pub local: Option<SocketAddr>,
    /// `addr`'s IP, formatted once per connection.
    pub client_ip: &'a str,
    pub listener: &'a str,
    /// The listener's index in the current config, cached per generation.
    pub listener_index: &'a Cell<(u64, usize)>,
    /// The connection is TLS (`{scheme}` is https).
    pub tls: bool,
    /// The port the listener is bound to (`{server_port}`).
    pub server_port: u16,
}

/// Where an admitted request goes.
pub(crate) enum Admitted {
    /// A file route: the codec answers from the filesystem.
    Files(Arc<StaticRoute>),
    /// veloxy's own answer: a redirect or a fixed response.
    Answer(Answer),
    /// An answer from the route's cache (a fresh hit, or a purge).
    Cached(crate::static_files::Response),
    Proxy(ProxyTarget),
}

/// Adds a field line (`Name: value\r\n`) to the request's answer, whatever answers it.
pub(crate) fn add_answer_line(record: &mut Record, line: &[u8]) {
    if line.is_empty() {
        return;
    }
    match &mut record.edit {
        Some(e) => e.lines_mut().extend_from_slice(line),
        None => record.edit = Some(edit::ResponseEdit::with_lines(line.to_vec())),
    }
}

/// A proxied request's destination and the limits it runs under.
#[derive(Clone)]
pub(crate) struct ProxyTarget {
    pub upstream: usize,
    /// The first backend to try.
    pub backend: usize,
    /// Hash of the group's `hash_key` for this request (0 when the group does not hash).
    pub hash: u64,
    /// The route's concurrency limit; admission to it waits in the codec's task.
    pub concurrency: Option<Arc<ConcurrencyLimit>>,
    /// The route compresses eligible responses, in `encoding` when the client accepts one.
    pub compress: bool,
    pub encoding: Option<crate::compress::Encoding>,
    /// The request target to send upstream when the route rewrites it (`strip_prefix`,
    /// `rewrite`); `None`: the client's.
    pub path: Option<edit::UpstreamTarget>,
    /// `request_headers` and the request ID; `None` when neither is configured.
    pub edit: Option<edit::UpstreamEdit>,
    /// `max_body_bytes`: a body that grows past it gets 413 and the connection closes.
    pub max_body: Option<u64>,
    /// The client a PROXY header names, for groups that send one (their connections are
    /// opened and reused for this client only).
    pub origin: Option<crate::upstream::proxy_header::Origin>,
    /// `forward_auth`: the subrequest the codec runs before forwarding (see
    /// [`forward_auth`]); taken when run.
    pub forward_auth: Option<Box<forward_auth::AuthRequest>>,
    /// The route caches and the request goes upstream through the cache: the codec runs
    /// [`crate::cache::fill::run`] instead of forwarding (taken when run).
    pub cache: Option<Box<crate::cache::fill::Fill>>,
    /// The route is a search route and this request a bulk to split or a search body to
    /// clamp: the codec reads the body whole and runs it instead of forwarding (taken when
    /// run).
    pub search: Option<Box<crate::search::Job>>,
    /// A fresh cache hit on a route with `forward_auth`: held until the auth service lets
    /// the request pass, then answered instead of forwarding (taken when run). A hit is never
    /// served before every access rule of its route has run.
    pub hit: Option<Box<crate::static_files::Response>>,
}

impl ProxyTarget {
    /// Where an attempt on `backend` goes.
    pub(crate) fn to(&self, backend: usize) -> h1::Backend {
        h1::Backend {
            upstream: self.upstream,
            backend,
            origin: self.origin,
        }
    }

    /// forward_auth let the request pass: its copied fields (`lines`) go on every upstream
    /// request made for it, the cache fill's included.
    pub(crate) fn authorized(&mut self, lines: &[u8]) {
        if let Some(fill) = self.cache.as_mut() {
            fill.add_lines(lines);
        }
    }
}

/// The first backend: the one a `sticky` cookie names while it is usable, else the group's
/// policy's pick. Returns it and whether the cookie chose it.
fn choose_backend(
    gen: &Generation,
    upstream: usize,
    head: &Head,
    client: SocketAddr,
    hash: u64,
) -> (Option<usize>, Option<usize>) {
    let group = &gen.snapshot.upstreams[upstream];
    let excluded = group.health.down_mask();
    let stuck = group.sticky.as_ref().and_then(|s| {
        let b = s.backend(crate::http1::cookie_value(
            head.fields.cookies(),
            &s.cookie,
        )?)?;
        (excluded & (1 << b) == 0).then_some(b)
    });
    let mut groups = gen.groups.borrow_mut();
    let state = &mut groups[upstream];
    state.budget.earn();
    let picked = stuck.or_else(|| {
        state.pick(&PickContext {
            client,
            excluded,
            hash,
        })
    });
    (picked, stuck)
}

/// The request is the route's from here on: counted under it (refusals before this, no route
/// or rate limited, count as unrouted), its group named for the log, and the `on_request`
/// hook run.
fn enter_route(
    worker: &Worker,
    snapshot: &crate::config::Snapshot,
    peer: &Peer,
    head: &Head,
    listener: &str,
    route: &crate::router::Route,
    record: &mut Record,
) -> Result<(), ProxyError> {
    record.route = Some(route.index);
    let group = match &route.target {
        RouteTarget::Proxy { upstream, .. } => Some(&snapshot.upstreams[*upstream]),
        _ => None,
    };
    if let Some(g) = group {
        if record.logs() {
            record.upstream.clone_from(&g.name);
        }
    }
    if let Some(hooks) = &worker.shared.hooks {
        record.ctx = Some(run_on_request(hooks.as_ref(), peer, head, listener, group)?);
    }
    Ok(())
}

/// The listener's index in `gen`; `None` when a reload removed it (its routes are gone).
fn listener_index(gen: &Generation, peer: &Peer) -> Option<usize> {
    let (cached_gen, cached) = peer.listener_index.get();
    if cached_gen == gen.number {
        return Some(cached);
    }
    let i = gen
        .snapshot
        .listeners
        .iter()
        .position(|l| l.name == peer.listener)?;
    peer.listener_index.set((gen.number, i));
    Some(i)
}

/// Admission: route match, rate limit, `on_request`, and for a proxied route the first
/// backend. Fills `record.route`, `record.ctx` and `record.upstream`.
pub(crate) fn admit(
    worker: &Worker,
    gen: &Generation,
    peer: &Peer,
    head: &Head,
    record: &mut Record,
) -> Result<Admitted, ProxyError> {
    let no_route = || ProxyError::downstream(ErrorKind::NoRoute);
    let snapshot = &gen.snapshot;
    let listener = &snapshot.listeners[listener_index(gen, peer).ok_or_else(no_route)?];
    // ACME http-01, before routes and redirects (one atomic load when none is pending).
    if let Some(key_auth) = worker.shared.live.certs().http01(head.target) {
        return Ok(Admitted::Answer(Answer::fixed(
            200,
            &bytes::Bytes::from(key_auth),
            "application/octet-stream",
        )));
    }
    if let Some(port) = listener.redirect_https {
        return Ok(Admitted::Answer(Answer::to_https(head, port)));
    }
    let routing_path = crate::router::request_path(head.target.as_bytes());
    let mut slots = [None; crate::rules::MAX_SLOTS];
    let (route, captured) = listener
        .router
        .find(head.host, &routing_path, head, &mut slots)
        .ok_or_else(no_route)?;
    // Behind trusted proxies, the client is the one their header names.
    let real = real_client(&snapshot.settings, peer, head);
    let client_ip = real.as_ref().map_or(peer.client_ip, |(_, s)| s.as_str());
    let client = real
        .as_ref()
        .map_or(peer.addr, |(ip, _)| SocketAddr::new(*ip, peer.addr.port()));
    if let Some(access) = route.rules.as_ref().and_then(|r| r.access.as_ref()) {
        if !access.permits(client.ip()) {
            return Err(ProxyError::downstream(ErrorKind::Forbidden));
        }
    }
    let keys = || RequestKeys {
        client_ip,
        path: head.path(),
        header: |h: &str| head.fields.get(h),
        cookies: head.fields.cookies(),
    };
    if let Some(rl) = &route.limits.rate {
        let key = keys().rate_key(&rl.key);
        match &route.limits.global {
            Some(g) => g.check(key, || rl.check(key)),
            None => rl.check(key),
        }
        .map_err(|_| ProxyError::downstream(ErrorKind::RateLimited))?;
    }
    enter_route(worker, snapshot, peer, head, &listener.name, route, record)?;
    let id_field = snapshot.settings.request_id.as_deref();
    let id = id_field.map(|f| edit::request_id(head.fields.get(&f.to_ascii_lowercase())));
    let vars = answer::RequestVars {
        head,
        peer,
        captures: captured.then_some(crate::rules::Captures {
            path: &routing_path,
            slots: &slots,
        }),
        request_id: id.as_deref().unwrap_or(""),
        client_ip,
    };
    record.client_ip = real.as_ref().map(|(ip, _)| *ip);
    let rules = route.rules.as_ref();
    // HTTP/1.1 and HTTP/2 answers on an HTTP/3 listener advertise it.
    let alt_svc = (listener.http3.is_some() && head.version != 3).then_some(peer.server_port);
    if let Some(answer) = apply::gate(
        route,
        head,
        record,
        (id_field, id.is_some()),
        alt_svc,
        &vars,
    )? {
        return Ok(Admitted::Answer(answer));
    }
    let mut path;
    let (upstream, compress) = match &route.target {
        RouteTarget::Files(files) => return Ok(Admitted::Files(files.clone())),
        RouteTarget::Redirect { to, status } => {
            let location = to.render(&vars);
            return Ok(Admitted::Answer(Answer::redirect(*status, location)));
        }
        RouteTarget::Respond {
            status,
            body,
            content_type,
        } => return Ok(Admitted::Answer(Answer::fixed(*status, body, content_type))),
        RouteTarget::Proxy {
            upstream,
            compress,
            target,
        } => {
            path = target
                .as_ref()
                .map(|rule| edit::UpstreamTarget::new(rule, head.target, &vars));
            (*upstream, *compress)
        }
    };
    let mut search = None;
    if let Some(s) = rules.and_then(|r| r.search.as_ref()) {
        let effective = path.as_deref().unwrap_or(head.target);
        match crate::search::admit(s, head, effective) {
            crate::search::Step::Pass => {}
            crate::search::Step::Deny(api) => {
                return Ok(Admitted::Answer(crate::search::denied(&api)))
            }
            crate::search::Step::Target(t) => path = Some(edit::UpstreamTarget::from_string(t)),
            step => search = Some((s, step, effective.to_owned())),
        }
    }
    // HTTP/1.0 clients cannot take the chunked stream a coder produces.
    let encoding = (compress && head.version >= 1 && head.method != "HEAD")
        .then(|| {
            crate::compress::Accepted::parse(head.fields.get("accept-encoding")).choose(|_| true)
        })
        .flatten();
    // With forward_auth, a hit waits for the auth service's word (held in the target).
    let mut hit = None;
    let fill = match rules.and_then(|r| r.cache.as_ref()) {
        None => None,
        Some(rc) => {
            match crate::cache::lookup::admit(
                rc,
                head,
                rc.key.render(&vars),
                (client.ip(), encoding),
            ) {
                crate::cache::lookup::Step::Answer(r)
                    if rules.is_some_and(|r| r.forward_auth.is_some()) =>
                {
                    hit = Some(Box::new(r));
                    None
                }
                crate::cache::lookup::Step::Answer(r) => return Ok(Admitted::Cached(r)),
                crate::cache::lookup::Step::Bypass => {
                    add_answer_line(record, &rc.status_line("BYPASS"));
                    None
                }
                crate::cache::lookup::Step::Fill(f) => Some(f),
            }
        }
    };
    let upstream_edit = (rules.is_some_and(|r| r.request.is_some() || r.forward_auth.is_some())
        || id.is_some())
    .then(|| upstream_edit(route, id_field, &vars));
    let group = &snapshot.upstreams[upstream];
    let hash = if group.uses_hash {
        keys().hash(&group.hash_key)
    } else {
        0
    };
    let (picked, stuck) = choose_backend(gen, upstream, head, client, hash);
    // A held hit needs no backend: it is served while every backend is down, as any hit is.
    let Some(backend) = picked.or(hit.as_ref().map(|_| 0)) else {
        record.request_id = id;
        return Err(ProxyError::upstream(ErrorKind::NoBackend));
    };
    if let (Some(s), None, Some(_)) = (&group.sticky, stuck, picked) {
        // A new (or replaced) affinity: the answer names the chosen backend.
        let edit = record
            .edit
            .get_or_insert_with(|| response_edit(route, id_field, &vars));
        s.set_cookie(backend, edit.lines_mut());
    }
    record.request_id = id;
    let mut target = ProxyTarget {
        upstream,
        backend,
        hash,
        concurrency: route.limits.concurrency.clone(),
        compress,
        encoding,
        path,
        edit: upstream_edit,
        max_body: rules.and_then(|r| r.max_body),
        forward_auth: rules
            .and_then(|r| r.forward_auth.as_ref())
            .map(|fa| Box::new(forward_auth::AuthRequest::new(fa, head, peer, client_ip))),
        origin: crate::upstream::connect::origin(
            &snapshot.upstreams[upstream],
            peer.addr,
            real.as_ref().map(|(ip, _)| *ip),
            peer.local,
        ),
        cache: None,
        hit,
        search: search.and_then(|(s, step, effective)| {
            let node = &group.backends[backend].addr;
            crate::search::Job::new(step, s, (head, &effective), node, group.read_timeout)
        }),
    };
    if let Some(mut f) = fill {
        let fwd = (
            peer.client_ip,
            if peer.tls { "https" } else { "http" },
            snapshot.settings.underscores_in_headers,
        );
        let hooks = record.ctx.as_ref().map(|c| c.upstream_headers.as_slice());
        let host = group.backends[backend].authority();
        f.set_head(apply::fill_head(head, &target, fwd, hooks, &host));
        target.cache = Some(f);
    }
    Ok(Admitted::Proxy(target))
}

/// Why a request stops at [`verified`].
pub(crate) enum Denied {
    /// veloxy's answer (401 with the route's challenge).
    Answer(Answer),
    /// An error answer (429 over the rate of checks, 503 when the check pool is full).
    Error(ProxyError),
}

impl Denied {
    /// The refusal as an answer of veloxy's own (an error counted in the worker's metrics).
    pub(crate) fn into_answer(self, worker: &Worker) -> Answer {
        match self {
            Denied::Answer(a) => a,
            Denied::Error(e) => {
                worker.count_error(&e);
                let body = bytes::Bytes::from(format!("{}\n", e.kind));
                Answer::fixed(e.status(), &body, "text/plain; charset=utf-8")
            }
        }
    }
}

/// Runs the credential check admission left in the record (if any), off the worker: every
/// codec calls this right after [`admit`], before it answers anything, so nothing (a file, a
/// cache hit, a backend's answer) reaches a client whose credentials have not passed.
pub(crate) async fn verified(record: &mut Record) -> Result<(), Denied> {
    let Some(v) = record.verify.take() else {
        return Ok(());
    };
    let realm = v.realm.clone();
    v.run().await.map_err(|f| match f {
        crate::auth::Failed::Wrong => Denied::Answer(Answer::unauthorized(&realm)),
        crate::auth::Failed::TooMany => {
            Denied::Error(ProxyError::downstream(ErrorKind::RateLimited))
        }
        crate::auth::Failed::Busy => Denied::Error(ProxyError::downstream(
            ErrorKind::AuthUnavailable("basic_auth: the credential check pool is full"),
        )),
    })
}

/// How much of a request body is read before an upstream connection is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buffering {
    /// None: the body streams to the upstream as it arrives.
    Stream,
    /// The whole body (its declared length is within the limit).
    Whole,
    /// A body of unknown length, up to this many bytes; what is left streams.
    UpTo(usize),
}

/// The `request_buffering` decision, the same for every protocol. `length`: the body's
/// declared length (`None`: unknown). With `"auto"`, a body within the group's
/// `retry_body_limit` is read first (so a slow sender costs no upstream connection, and the
/// request stays retryable), and one of unknown length up to that limit; with `"off"`, only
/// the body of a retryable request (idempotent, small, retries on) is.
pub(crate) fn body_buffering(
    setting: crate::config::RequestBuffering,
    length: Option<u64>,
    idempotent: bool,
    group: &crate::config::UpstreamGroup,
) -> Buffering {
    use crate::config::RequestBuffering;
    let limit = group.retry_body_limit;
    let small = length.is_some_and(|n| n <= limit as u64);
    match setting {
        RequestBuffering::Auto if small => Buffering::Whole,
        RequestBuffering::Auto if length.is_none() => Buffering::UpTo(limit),
        RequestBuffering::Off if small && idempotent && group.retries > 0 => Buffering::Whole,
        _ => Buffering::Stream,
    }
}

/// A held slot of a route's `max_concurrency`, released when dropped.
pub(crate) type Slot = Option<crate::limits::OwnedAdmission>;

/// Takes a slot of the route's concurrency limit (if it has one) into `held`, unless it holds
/// one already: 503 when the queue is full or `queue_timeout` passes.
///
/// Every codec calls this at the same point of an exchange: after the part of the request
/// body read before anything goes upstream ([`body_buffering`]; a search job's whole body),
/// so a slow sender holds no slot, and before the search job, the cache fill (a collapsed
/// follower included: it is a request in flight on the route) or the first attempt. The
/// slot is held until the answer is complete; a fill that lets the request go upstream
/// hands its slot on to the forward, which does not take a second one.
pub(crate) async fn hold_slot(
    limit: &Option<Arc<ConcurrencyLimit>>,
    held: &mut Slot,
) -> Result<(), ProxyError> {
    if let (Some(l), None) = (limit, held.as_ref()) {
        let admission = l
            .admit_owned()
            .await
            .map_err(|_| ProxyError::downstream(ErrorKind::Overloaded))?;
        *held = Some(admission);
    }
    Ok(())
}

/// The `on_request` phase. Only error statuses can be answered without a body of the hook's
/// own, so anything else becomes a 500.
fn run_on_request(
    hooks: &dyn crate::hooks::Hooks,
    peer: &Peer,
    head: &Head,
    listener: &str,
    group: Option<&crate::config::UpstreamGroup>,
) -> Result<Box<RequestCtx>, ProxyError> {
    let mut ctx = Box::<RequestCtx>::default();
    let owned: Vec<httparse::Header>;
    let headers = match head.fields {
        Fields::H1(h) => h,
        Fields::H2(map) => {
            owned = map
                .iter()
                .map(|(n, v)| httparse::Header {
                    name: n.as_str(),
                    value: v.as_bytes(),
                })
                .collect();
            &owned
        }
    };
    let info = RequestInfo {
        method: head.method,
        path: head.target,
        version: head.version,
        client: peer.addr,
        listener,
        upstream: group.map_or("", |g| g.name.as_str()),
        headers,
    };
    hooks.on_request(&info, &mut ctx).map_err(|s| {
        let s = if (400..=599).contains(&s) { s } else { 500 };
        ProxyError::downstream(ErrorKind::Rejected(s))
    })?;
    Ok(ctx)
}

/// The `on_response` phase: what the route's response rules and the hooks do to a response
/// with `status`. `None` when nothing does anything (no rules, no hooks).
pub(crate) fn on_response<'c>(
    worker: &Worker,
    record: &'c mut Record,
    status: u16,
) -> Option<edit::ResponseView<'c>> {
    let hooks = match (worker.shared.hooks.as_ref(), record.ctx.as_deref_mut()) {
        (Some(hooks), Some(ctx)) => {
            hooks.on_response(status, ctx);
            Some(&ctx.response_headers[..])
        }
        _ => None,
    };
    if hooks.is_none() && record.edit.is_none() {
        return None;
    }
    Some(edit::ResponseView {
        edit: record.edit.as_ref(),
        hooks: hooks.unwrap_or(&[]),
        backend: record.backend.as_ref(),
    })
}

/// A static answer (a file route's, or veloxy's own) with its body replaced by the route's
/// error page for its status, if it has one.
pub(crate) fn with_error_page(
    record: &Record,
    r: crate::static_files::Response,
) -> crate::static_files::Response {
    match error_page(record, r.status) {
        None => r,
        Some(page) => {
            let head_only = matches!(r.body, crate::static_files::Body::Empty)
                && r.headers
                    .iter()
                    .any(|(n, v)| *n == "content-length" && &v[..] != b"0");
            Answer::page(r.status, page).into_response(head_only)
        }
    }
}

/// The route's error page for `status`, if it has one.
pub(crate) fn error_page(record: &Record, status: u16) -> Option<&crate::rules::ErrorPage> {
    if status < 400 {
        return None;
    }
    record.edit.as_ref()?.rules.as_ref()?.error_page(status)
}
