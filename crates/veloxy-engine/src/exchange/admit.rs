//! Admission, once for every protocol, in named phases: the listener's own answers (ACME
//! http-01, the HTTPS redirect), the route match, the client checks (access rules, rate
//! limit), entering the route (counted under it, the `on_request` hook), the route's answers
//! (rules, redirects, fixed responses, file routes), the search gateway's step, the cache
//! lookup, and the first backend choice. What comes after is the driver's
//! ([`super::drive`]).

use std::net::SocketAddr;

use super::apply::{self, real_client, response_edit, upstream_edit};
use super::{
    answer, edit, forward_auth, Admitted, Answer, Fields, Head, Peer, ProxyTarget, Record,
};
use crate::error::{ErrorKind, ProxyError};
use crate::hooks::{RequestCtx, RequestInfo};
use crate::router::{Route, RouteTarget};
use crate::upstream::balancer::PickContext;
use crate::upstream::RequestKeys;
use crate::worker::{Generation, Worker};

/// Admission: fills `record.route`, `record.ctx`, `record.upstream` and `record.request_id`
/// and says where the request goes.
pub(crate) fn admit(
    worker: &Worker,
    gen: &Generation,
    peer: &Peer,
    head: &Head,
    record: &mut Record,
) -> Result<Admitted, ProxyError> {
    let no_route = || ProxyError::downstream(ErrorKind::NoRoute);
    let snapshot = &gen.snapshot;
    // The access log's trace columns are there for every request (empty when unsampled).
    record.traced = snapshot.settings.tracing.is_some();
    let listener = &snapshot.listeners[listener_index(gen, peer).ok_or_else(no_route)?];
    if let Some(answer) = listener_answer(worker, listener, peer, head) {
        return Ok(Admitted::Answer(answer));
    }
    let routing_path = crate::router::request_path(head.target.as_bytes());
    let mut slots = [None; crate::rules::MAX_SLOTS];
    let (route, captured) = listener
        .router
        .find(head.host, &routing_path, head, &mut slots)
        .ok_or_else(no_route)?;
    // Behind trusted proxies, the client is the one their header names.
    let real = real_client(&snapshot.settings, peer, head);
    let client = Client {
        ip: real.as_ref().map_or(peer.client_ip, |(_, s)| s.as_str()),
        addr: real
            .as_ref()
            .map_or(peer.addr, |(ip, _)| SocketAddr::new(*ip, peer.addr.port())),
        real: real.as_ref().map(|(ip, _)| *ip),
    };
    check_client(route, head, &client)?;
    enter_route(worker, snapshot, peer, head, &listener.name, route, record)?;
    if snapshot.settings.tracing.is_some() {
        super::trace::admit(snapshot, route, head, peer, client.ip, record);
    }
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
        client_ip: client.ip,
    };
    record.client_ip = client.real;
    // HTTP/1.1 and HTTP/2 answers on an HTTP/3 listener advertise it.
    let alt_svc = (listener.http3.is_some() && head.version != 3).then_some(peer.server_port);
    if let Some(answer) = apply::gate(route, head, record, id_field, alt_svc, &vars)? {
        return Ok(Admitted::Answer(answer));
    }
    let proxied = match route_answer(route, head, &vars) {
        Routed::Proxy(p) => p,
        Routed::Answered(admitted) => return Ok(admitted),
    };
    let ctx = Proxying {
        gen,
        peer,
        head,
        route,
        vars: &vars,
        client: &client,
        id_field,
        has_id: id.is_some(),
        trace: record.trace.clone(),
    };
    let target = ctx.target(proxied, record);
    record.request_id = id;
    target
}

/// The client as admission sees it: the peer, or behind trusted proxies the one their
/// header names.
struct Client<'a> {
    /// Its IP, formatted.
    ip: &'a str,
    addr: SocketAddr,
    /// The address the trusted proxies' header named, if any.
    real: Option<std::net::IpAddr>,
}

/// The listener's own answers, before any route: an ACME http-01 challenge's (one atomic
/// load when none is pending), and the redirect of a `redirect_https` listener.
fn listener_answer(
    worker: &Worker,
    listener: &crate::config::ListenerSpec,
    peer: &Peer,
    head: &Head,
) -> Option<Answer> {
    if let Some(key_auth) = worker.shared.live.certs().http01(head.target) {
        return Some(Answer::fixed(
            200,
            &bytes::Bytes::from(key_auth),
            "application/octet-stream",
        ));
    }
    // Plain HTTP on a TLS listener (`plain_http`): only "redirect" and "serve" get here.
    if listener.plain_http == Some(crate::config::PlainHttp::Redirect) && !peer.tls {
        return Some(Answer::to_https(head, peer.server_port));
    }
    Some(Answer::to_https(head, listener.redirect_https?))
}

/// The route's access rules and rate limit, for this client.
fn check_client(route: &Route, head: &Head, client: &Client) -> Result<(), ProxyError> {
    if let Some(access) = route.rules.as_ref().and_then(|r| r.access.as_ref()) {
        if !access.permits(client.addr.ip()) {
            return Err(ProxyError::downstream(ErrorKind::Forbidden));
        }
    }
    if let Some(rl) = &route.limits.rate {
        let key = request_keys(head, client).rate_key(&rl.key);
        match &route.limits.global {
            Some(g) => g.check(key, || rl.check(key)),
            None => rl.check(key),
        }
        .map_err(|_| ProxyError::downstream(ErrorKind::RateLimited))?;
    }
    Ok(())
}

fn request_keys<'a>(
    head: &'a Head<'a>,
    client: &'a Client<'a>,
) -> RequestKeys<'a, impl Fn(&str) -> Option<&'a [u8]> + 'a, crate::message::Cookies<'a>> {
    RequestKeys {
        client_ip: client.ip,
        path: head.path(),
        header: move |h: &str| head.fields.get(h),
        cookies: head.fields.cookies(),
    }
}

/// A proxied route's group, compression and rewritten request target.
struct Proxied {
    upstream: usize,
    compress: bool,
    path: Option<edit::UpstreamTarget>,
}

/// What the route's target makes of the request. Returned once per request and matched at
/// once, so its size costs one move: boxing the answer would cost an allocation instead.
#[allow(clippy::large_enum_variant)]
enum Routed {
    /// A file route, a redirect or a fixed response.
    Answered(Admitted),
    Proxy(Proxied),
}

/// The route's target: the answer of a file route, a redirect or a fixed response; the
/// group of a proxied route.
fn route_answer(route: &Route, head: &Head, vars: &answer::RequestVars) -> Routed {
    match &route.target {
        RouteTarget::Files(files) => Routed::Answered(Admitted::Files(files.clone())),
        RouteTarget::Redirect { to, status } => {
            Routed::Answered(Admitted::Answer(Answer::redirect(*status, to.render(vars))))
        }
        RouteTarget::Respond {
            status,
            body,
            content_type,
        } => Routed::Answered(Admitted::Answer(Answer::fixed(*status, body, content_type))),
        RouteTarget::Proxy {
            upstream,
            compress,
            target,
        } => Routed::Proxy(Proxied {
            upstream: *upstream,
            compress: *compress,
            path: target
                .as_ref()
                .map(|rule| edit::UpstreamTarget::new(rule, head.target, vars)),
        }),
    }
}

/// What the proxied phases of admission share.
struct Proxying<'a> {
    gen: &'a Generation,
    peer: &'a Peer<'a>,
    head: &'a Head<'a>,
    route: &'a Route,
    vars: &'a answer::RequestVars<'a, 'a>,
    client: &'a Client<'a>,
    id_field: Option<&'a str>,
    /// `[server] request_id` is on: the request has an ID.
    has_id: bool,
    /// The exchange is sampled: the upstream request carries its trace context.
    trace: Option<crate::otel::TraceRef>,
}

/// The search gateway's step: `Err` with the answer to a denied API; a job for a bulk or a
/// search to clamp; a changed target.
type SearchStep<'a> = Option<(
    &'a std::sync::Arc<crate::search::SearchRoute>,
    crate::search::Step,
    String,
)>;

/// The cache step's outcome.
pub(super) enum CacheStep {
    /// Not cached (or bypassed): forward.
    Pass,
    /// A fresh hit (or a purge's answer): serve it now.
    Hit(crate::static_files::Response),
    /// A hit held until forward_auth lets the request pass.
    Held(Box<crate::static_files::Response>),
    /// Go upstream through the cache.
    Fill(Box<crate::cache::fill::Fill>),
}

impl Proxying<'_> {
    /// The search step, the cache lookup, the backend choice, and the target they make.
    fn target(&self, p: Proxied, record: &mut Record) -> Result<Admitted, ProxyError> {
        let Proxied {
            upstream,
            compress,
            mut path,
        } = p;
        let search = match self.search(&mut path) {
            Ok(s) => s,
            Err(answer) => return Ok(Admitted::Answer(answer)),
        };
        let fastcgi = match self.fastcgi() {
            Ok(job) => job,
            Err(admitted) => return Ok(*admitted),
        };
        let head = self.head;
        // HTTP/1.0 clients cannot take the chunked stream a coder produces.
        let encoding = (compress && head.version >= 1 && head.method != "HEAD")
            .then(|| {
                crate::compress::Accepted::parse(head.fields.get("accept-encoding"))
                    .choose(|_| true)
            })
            .flatten();
        let step = self.cache(encoding, record);
        if let Some(t) = &record.trace {
            super::trace::cache_status(t, &step);
        }
        let (hit, fill) = match step {
            CacheStep::Pass => (None, None),
            CacheStep::Hit(r) => return Ok(Admitted::Cached(r)),
            CacheStep::Held(r) => (Some(r), None),
            CacheStep::Fill(f) => (None, Some(f)),
        };
        let group = &self.gen.snapshot.upstreams[upstream];
        let hash = match group.uses_hash {
            true => request_keys(head, self.client).hash(&group.hash_key),
            false => 0,
        };
        let (picked, stuck) = choose_backend(self.gen, upstream, head, self.client.addr, hash);
        // A held hit needs no backend: it is served while every backend is down, as any hit is.
        let Some(backend) = picked.or(hit.as_ref().map(|_| 0)) else {
            return Err(ProxyError::upstream(ErrorKind::NoBackend));
        };
        if let (Some(s), None, Some(_)) = (&group.sticky, stuck, picked) {
            // A new (or replaced) affinity: the answer names the chosen backend.
            let edit = record
                .edit
                .get_or_insert_with(|| response_edit(self.route, self.id_field, self.vars));
            s.set_cookie(backend, edit.lines_mut());
        }
        let mut target = self.make(upstream, backend, hash, compress, encoding, path);
        target.hit = hit;
        target.fastcgi = fastcgi;
        target.search = search.and_then(|(s, step, effective)| {
            let node = &group.backends[backend].addr;
            crate::search::Job::new(step, s, (head, &effective), node, group.read_timeout)
        });
        if let Some(m) = self.route.rules.as_ref().and_then(|r| r.mirror.as_deref()) {
            let hooks = record.ctx.as_ref().map(|c| c.upstream_headers.as_slice());
            let plain = target.search.is_none() && target.fastcgi.is_none() && target.hit.is_none();
            target.mirror = plain
                .then(|| {
                    super::mirror::admit(
                        self.gen,
                        m,
                        head,
                        &target,
                        (self.peer, self.client.addr),
                        hooks,
                    )
                })
                .flatten();
        }
        if let Some(mut f) = fill {
            let peer = self.peer;
            let host = group.backends[backend].authority();
            // A QUERY's fill sends its body (read later, of the declared length).
            let (method, framing) = match crate::cache::query::cacheable_length(head) {
                Some(n) if f.is_query() => ("QUERY", crate::http1::BodyKind::Length(n)),
                _ => ("GET", crate::http1::BodyKind::None),
            };
            let options = super::h1_head::HeadOptions {
                method,
                framing,
                unconditional: true,
                fallback_host: &host,
                client_ip: peer.client_ip,
                proto: if peer.tls { "https" } else { "http" },
                keep_underscores: self.gen.snapshot.settings.underscores_in_headers,
                hook_lines: record.ctx.as_ref().map(|c| c.upstream_headers.as_slice()),
            };
            let mut out = Vec::with_capacity(512);
            super::h1_head::write(head, &target, &options, &mut out);
            f.set_head(out);
            target.cache = Some(f);
        }
        Ok(Admitted::Proxy(target))
    }

    /// The route's search gateway step (if it has one): `Err` with a denied API's answer.
    fn search(&self, path: &mut Option<edit::UpstreamTarget>) -> Result<SearchStep<'_>, Answer> {
        let Some(s) = self.route.rules.as_ref().and_then(|r| r.search.as_ref()) else {
            return Ok(None);
        };
        let effective = path.as_deref().unwrap_or(self.head.target);
        Ok(match crate::search::admit(s, self.head, effective) {
            crate::search::Step::Pass => None,
            crate::search::Step::Deny(api) => return Err(crate::search::denied(&api)),
            crate::search::Step::Target(t) => {
                *path = Some(edit::UpstreamTarget::from_string(t));
                None
            }
            step => Some((s, step, effective.to_owned())),
        })
    }

    /// A FastCGI route's job, its script chosen by `try_files` (if it has them); `Err` with
    /// the file `try_files` serves, or the refusal of a path outside the root.
    fn fastcgi(&self) -> Result<Option<Box<super::fastcgi::Job>>, Box<Admitted>> {
        let rules = self.route.rules.as_ref();
        let Some(f) = rules.and_then(|r| r.fastcgi.as_deref()) else {
            return Ok(None);
        };
        let script = match &f.try_files {
            None => None,
            Some(t) => match crate::fastcgi::try_files(f, t, self.head.target) {
                crate::fastcgi::Tried::File => {
                    return Err(Box::new(Admitted::Files(t.files.clone())))
                }
                crate::fastcgi::Tried::Refused => {
                    let body = bytes::Bytes::from_static(b"bad request path\n");
                    let answer = Answer::fixed(400, &body, "text/plain; charset=utf-8");
                    return Err(Box::new(Admitted::Answer(answer)));
                }
                crate::fastcgi::Tried::Script(s) => s,
            },
        };
        let max_body = rules.and_then(|r| r.max_body);
        let job = super::fastcgi::Job::new(f, self.head, self.peer, max_body, script.as_deref());
        Ok(Some(Box::new(job)))
    }

    /// The route's cache lookup (if it caches). With forward_auth, a hit waits for the auth
    /// service's word (held).
    fn cache(&self, encoding: Option<crate::compress::Encoding>, record: &mut Record) -> CacheStep {
        use crate::cache::lookup::Step;
        let rules = self.route.rules.as_ref();
        let Some(rc) = rules.and_then(|r| r.cache.as_ref()) else {
            return CacheStep::Pass;
        };
        let key = rc.key.render(self.vars);
        match crate::cache::lookup::admit(rc, self.head, key, (self.client.addr.ip(), encoding)) {
            Step::Answer(r) if rules.is_some_and(|r| r.forward_auth.is_some()) => {
                CacheStep::Held(Box::new(r))
            }
            Step::Answer(r) => CacheStep::Hit(r),
            Step::Bypass => {
                super::add_answer_line(record, &rc.status_line("BYPASS"));
                record.invalidate = crate::cache::invalidate::pending(
                    rc,
                    self.head.method,
                    self.head.target,
                    self.vars,
                );
                CacheStep::Pass
            }
            Step::Fill(f) => CacheStep::Fill(f),
        }
    }

    /// The target of a proxied request on `backend` (hit, search job and fill added by the
    /// caller).
    fn make(
        &self,
        upstream: usize,
        backend: usize,
        hash: u64,
        compress: bool,
        encoding: Option<crate::compress::Encoding>,
        path: Option<edit::UpstreamTarget>,
    ) -> ProxyTarget {
        let (route, head, peer) = (self.route, self.head, self.peer);
        let rules = route.rules.as_ref();
        let trace = self.trace.as_ref();
        let mut upstream_edit = (rules
            .is_some_and(|r| r.request.is_some() || r.forward_auth.is_some())
            || self.has_id
            || trace.is_some())
        .then(|| upstream_edit(route, self.id_field, self.vars));
        if let (Some(t), Some(e)) = (trace, upstream_edit.as_mut()) {
            e.trace(t);
        }
        ProxyTarget {
            upstream,
            backend,
            hash,
            concurrency: route.limits.concurrency.clone(),
            compress,
            encoding,
            path,
            edit: upstream_edit,
            max_body: rules.and_then(|r| r.max_body),
            forward_auth: rules.and_then(|r| r.forward_auth.as_ref()).map(|fa| {
                Box::new(forward_auth::AuthRequest::new(
                    fa,
                    head,
                    peer,
                    self.client.ip,
                ))
            }),
            origin: crate::upstream::connect::origin(
                &self.gen.snapshot.upstreams[upstream],
                peer.addr,
                self.client.real,
                peer.local,
            ),
            cache: None,
            hit: None,
            search: None,
            fastcgi: None,
            grpc_web: rules
                .filter(|r| r.grpc_web.is_some())
                .and_then(|_| super::grpc_web::detect(head.fields.get("content-type"))),
            mirror: None,
            hints: (rules.is_some_and(|r| r.early_hints) && head.method == "GET").then(|| {
                Box::new(crate::hints::HintKey {
                    route: route.index,
                    path: head.path().into(),
                })
            }),
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
    let excluded = group.health.down_set();
    let stuck = group.sticky.as_ref().and_then(|s| {
        let b = s.backend(crate::http1::cookie_value(
            head.fields.cookies(),
            &s.cookie,
        )?)?;
        (!excluded.contains(b)).then_some(b)
    });
    let mut state = gen.group(upstream);
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
        record.ctx = Some(run_on_request(
            hooks.as_ref(),
            peer,
            head,
            listener,
            group.map(|g| &**g),
        )?);
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
