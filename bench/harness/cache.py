"""`bench/run --cache`: the HTTP response cache, veloxy against nginx `proxy_cache` and Varnish.

One worker each (veloxy `workers = 1`, nginx `worker_processes 1`, Varnish: one thread pool
whose threads all share the same core, see below), all pinned to the same proxy core and running
side by side, in alternating wrk rounds (the first contender rotates; medians). wrk and the
upstreams run on the load core(s): veloxy-upstream (`/size/N` answers N bytes and no
Cache-Control, so every proxy keeps answers for its default TTL, 10 minutes) and, for the miss
storm only, the harness's counting upstream (harness/cachestorm.py). Cache storage is memory
for all three: veloxy `[caches.bench] memory = "256MiB"`, nginx `proxy_cache_path` on tmpfs
(/dev/shm) with a `keys_zone`, Varnish `-s malloc,256m`.

Cases:

- hit-1k:   GET /size/1000, a cached 1,000-byte object;
- hit-100k: GET /size/100000, a cached 100,000-byte object;
- mix-90:   90% of the requests over 16 warm keys (/size/1000?k=0..15), every 10th a key never
  asked before (/size/1000?miss=...): a cold miss fetched from the upstream and stored
  (lua/cache-mix.lua).

Before measuring, each contender must answer 200 with the right body on every case's paths and
serve repeated GETs from its cache: veloxy-upstream stamps every answer (x-upstream, x-conn-id,
x-conn-seq), so three GETs of a path must carry the same stamp (the upstream answered once);
a contender that does not cache is marked in the report, never measured. The stamp of the
case's first path is checked again after each measured run (a hit case refetched during its
run is an error). Then the miss storm: STORM_N concurrent GETs of one cold key whose upstream
answer takes STORM_DELAY_MS, counting how many reached the upstream (nginx needs
`proxy_cache_lock on`, which it has here; Varnish coalesces by itself).

Metrics per case and contender: requests/s, p50/p99 (wrk), the proxy's CPU time per request
(utime+stime of its process tree over the measured run / requests, as in the other modes),
errors; veloxy/nginx and veloxy/varnish ratios of requests/s and of CPU per request. Goals (the
hit cases): veloxy requests/s >= 1.3x nginx's and >= 1.2x Varnish's with a lower p99; the miss
storm sends exactly one request upstream.
"""

from __future__ import annotations

import collections
import http.client
import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import quote

from . import cachestorm, loadgen, measure, modes, peers, procs, report, runner
from .cachestorm import cache_label
from .loadgen import LoadError
from .measure import fmt_ms, fmt_rate, fmt_us
from .procs import StartError
from .runner import SetupError
from .ui import say, warn

BENCH = Path(__file__).resolve().parent.parent
CACHE_PEERS = ["veloxy", "nginx", "varnish"]
CACHE_ONLY = ["varnish"]  # peers of --cache alone (not in peers.ALL_PROXIES)
MIX_LUA = BENCH / "lua" / "cache-mix.lua"

MEMORY_MIB = 256  # cache memory of each contender
MAX_OBJECT = "8MiB"  # veloxy's largest cacheable answer (nginx and Varnish: no such limit)
TTL_S = 600  # default TTL (answers without Cache-Control): 10 minutes everywhere
SMALL, LARGE = 1000, 100_000
WARM_KEYS = 16  # mix-90: the warm keys
MISS_EVERY = 10  # mix-90: every 10th request is a cold miss
STORM_N = 500  # concurrent GETs of one cold key
STORM_DELAY_MS = 200  # the counting upstream's answer time
STORM_BODY = 1000
NGINX_KEYS_ZONE_MB = 64  # ~8,000 keys per MB: room for every miss key of a long run
VARNISH_SPARE_THREADS = 16  # Varnish threads beyond one per client connection (fetches, storm)
VARNISH_QUEUE = 1000  # sessions that may wait for a Varnish thread (default 20: then dropped)
GOAL_VS_NGINX = 1.3  # veloxy hit requests/s / nginx's, at least
GOAL_VS_VARNISH = 1.2  # veloxy hit requests/s / Varnish's, at least
GOALS = {"nginx": GOAL_VS_NGINX, "varnish": GOAL_VS_VARNISH}

CASES = {"hit-1k": f"/size/{SMALL}", "hit-100k": f"/size/{LARGE}", "mix-90": f"/size/{SMALL}"}
SIZES = {"hit-1k": SMALL, "hit-100k": LARGE, "mix-90": SMALL}
HIT_CASES = ("hit-1k", "hit-100k")
TITLES = {
    "hit-1k": f"cache hits: GET /size/{SMALL} ({SMALL:,}-byte object, warm)",
    "hit-100k": f"cache hits: GET /size/{LARGE} ({LARGE:,}-byte object, warm)",
    "mix-90": (f"90% hits: {WARM_KEYS} warm keys /size/{SMALL}?k=N, every {MISS_EVERY}th request "
               f"a cold key /size/{SMALL}?miss=... (fetched from the upstream and stored)"),
}
STARTUP_TIMEOUT = {"veloxy": 15, "nginx": 15, "varnish": 30}
STAMP = ("x-upstream", "x-conn-id", "x-conn-seq")  # veloxy-upstream's per-answer fields
_SEQ = itertools.count(1)


def nonce() -> str:
    """A string no earlier request of this run has used (miss keys, storm keys)."""
    return f"{os.getpid():x}{time.time_ns() // 1000:x}{next(_SEQ)}"


def warm_paths(case: str) -> list[str]:
    """The paths a case expects to find in the cache."""
    if case == "mix-90":
        return [f"{CASES[case]}?k={i}" for i in range(WARM_KEYS)]
    return [CASES[case]]


def varnish_threads(connections: int) -> int:
    """Varnish's fixed thread count: a worker thread per client connection being served (a
    keep-alive connection under load keeps its thread) plus spare ones for backend fetches."""
    return max(5, connections + VARNISH_SPARE_THREADS)  # 5: Varnish's minimum thread_pool_min


# --- configs ------------------------------------------------------------------------------

def _host_port(addr: str) -> tuple[str, str]:
    host, _, port = addr.rpartition(":")
    return host, port


def nginx_extra(storm: str, cache_dir: Path, keepalive: int) -> dict[str, str]:
    """The snippets of bench/peers/nginx.conf.tmpl (the suite's nginx, same settings) that make
    it a cache: a tmpfs cache path, the cache on the whole server (both locations), the
    storm's location and upstream."""
    http = "\n".join([
        "# --cache: cached answers are files on tmpfs, sent with sendfile (Debian's default;",
        "# not its tcp_nopush: on loopback it held 100 KB answers back, ~3x fewer requests/s).",
        "sendfile on;",
        f"proxy_cache_path {cache_dir} levels=1:2 keys_zone=bench:{NGINX_KEYS_ZONE_MB}m "
        f"max_size={MEMORY_MIB}m inactive={TTL_S // 60}m use_temp_path=off;",
        "upstream storm {",
        f"    server {storm};",
        f"    keepalive {keepalive};",
        "}",
    ])
    server = "\n".join([
        "proxy_cache bench;",
        f"proxy_cache_valid 200 {TTL_S // 60}m;",
        "# one request upstream per missing key; the others wait for it (the miss storm)",
        "proxy_cache_lock on;",
        "add_header X-Cache-Status $upstream_cache_status;",
        "",
        "location /storm/ {",
        "    proxy_pass http://storm;",
        "    proxy_http_version 1.1;",
        '    proxy_set_header Connection "";',
        "    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "}",
    ])
    return {"HTTP_EXTRA": http, "SERVER_EXTRA": server}


def varnish_cmd(binary: str, port: int, vcl: Path, workdir: Path, threads: int) -> list[str]:
    """varnishd in the foreground: no jail (runs as the harness's user, like the suite's nginx),
    no management port, memory storage, the default TTL, one thread pool of `threads` threads
    (min = max: none created or reaped during a run)."""
    return [binary, "-F", "-j", "none", "-a", f"127.0.0.1:{port}", "-T", "none",
            "-f", str(vcl), "-n", str(workdir), "-s", f"malloc,{MEMORY_MIB}m", "-t", str(TTL_S),
            "-p", "thread_pools=1", "-p", f"thread_pool_min={threads}",
            "-p", f"thread_pool_max={threads}", "-p", f"thread_queue_limit={VARNISH_QUEUE}"]


def render(ctx, name: str, wd: Path, port: int, up: str, storm: str, shm: Path,
           connections: int) -> tuple[list[str], dict[str, str], Path]:
    """Write `name`'s config into `wd`: (command, environment, config file)."""
    if name == "veloxy":
        conf = peers.render_file("veloxy-cache.toml.tmpl", wd / "veloxy.toml", {
            "WORKERS": ctx.workers, "PORT": port, "UPSTREAM": up, "STORM_UPSTREAM": storm,
            "KEEPALIVE": ctx.keepalive, "CACHE_MEMORY": f"{MEMORY_MIB}MiB",
            "MAX_OBJECT": MAX_OBJECT, "TTL": f"{TTL_S // 60}m"})
        return [ctx.tools["veloxy"], "run", "--config", str(conf)], {}, conf
    if name == "nginx":
        cmd, env = peers._nginx(ctx, wd, port, [up],
                                nginx_extra(storm, shm / wd.name, ctx.keepalive))
        return cmd, env, wd / "nginx.conf"
    if name == "varnish":
        (ah, ap), (sh, sp) = _host_port(up), _host_port(storm)
        conf = peers.render_file("varnish-cache.vcl.tmpl", wd / "varnish.vcl", {
            "APP_HOST": ah, "APP_PORT": ap, "STORM_HOST": sh, "STORM_PORT": sp})
        cmd = varnish_cmd(ctx.tools["varnish"], port, conf, shm / wd.name,
                          varnish_threads(connections))
        return cmd, {}, conf
    raise KeyError(name)


def shm_dir(ctx) -> Path:
    """A directory on tmpfs for nginx's cache files and Varnish's working directory (its
    shared-memory log): /dev/shm/<the run's temp dir name>, else the run's temp dir."""
    base = Path("/dev/shm")
    if base.is_dir() and os.access(base, os.W_OK):
        d = base / ctx.tmp.name
    else:
        d = ctx.tmp / "shm"
        warn(f"/dev/shm is not writable: nginx's cache files go to {d} (maybe not tmpfs)")
    d.mkdir(parents=True, exist_ok=True)
    return d


# --- probes -------------------------------------------------------------------------------

def http_get(port: int, path: str, timeout: float = 5) -> tuple[int, dict[str, str], bytes]:
    """GET 127.0.0.1:port`path`: (status, {lowercase field: value}, body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers={"User-Agent": "veloxy-bench-cache"})
        r = c.getresponse()
        body = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        c.close()


def stamp(fields: dict[str, str]) -> tuple[str, ...] | None:
    """veloxy-upstream's stamp of an answer (x-upstream, x-conn-id, x-conn-seq): unique per
    answer it sends, so an answer served again from a cache carries the same one."""
    if any(k not in fields for k in STAMP):
        return None
    return tuple(fields[k] for k in STAMP)


def check_cached(get, path: str, size: int, times: int = 3) -> tuple[str | None, str | None]:
    """GET `path` `times` times with `get(path) -> (status, fields, body)`: (what is wrong or
    None, the cache status of the last answer). Wrong: not 200, not `size` bytes, no stamp, or
    a stamp that changed (the upstream answered again: not cached)."""
    answers = []
    for _ in range(times):
        try:
            status, fields, body = get(path)
        except (OSError, http.client.HTTPException) as e:
            return f"GET {path} failed: {e}", None
        if status != 200:
            return f"GET {path} answered {status}", cache_label(fields)
        if len(body) != size:
            return f"GET {path}: {len(body)} body bytes, not {size}", cache_label(fields)
        answers.append(fields)
    label = cache_label(answers[-1])
    stamps = [stamp(f) for f in answers]
    if stamps[0] is None:
        return (f"GET {path}: no {'/'.join(STAMP)} fields in the answer (not veloxy-upstream's?)",
                label)
    if len(set(stamps)) != 1:
        seqs = ", ".join(s[2] if s else "-" for s in stamps)
        return (f"not cached: {times} GETs of {path} reached the upstream {len(set(stamps))} "
                f"times (x-conn-seq {seqs}; cache status {label or 'none'})", label)
    return None, label


def verify(ctx, run, tag: str) -> str | None:
    """None when `run` answers every case's paths with 200 and the right body from its cache,
    a never-seen key with 200 (a miss) and the storm route with 200; else what is wrong."""
    get = lambda p: http_get(run.port, p)  # noqa: E731
    labels = collections.Counter()
    for case in CASES:
        for i, path in enumerate(warm_paths(case)):
            bad, label = check_cached(get, path, SIZES[case], times=3 if i == 0 else 1)
            if bad:
                return f"{case}: {bad}"
            if i == 0:
                labels[label or "no cache status field"] += 1
    cold = f"/size/{SMALL}?miss=check-{tag}-{nonce()}"
    bad, label = check_cached(get, cold, SMALL, times=1)
    if bad:
        return f"a cold key: {bad}"
    probe = f"/storm/probe-{run.name}-{nonce()}"
    try:
        status, _, body = get(probe)
    except (OSError, http.client.HTTPException) as e:
        return f"the storm route: GET {probe} failed: {e}"
    if status != 200 or len(body) != STORM_BODY:
        return f"the storm route: GET {probe} answered {status} with {len(body)} bytes"
    run.cache_labels = dict(labels)
    run.cold_label = label
    return None


def warm(run, case: str) -> tuple[str, ...] | None:
    """GET each of the case's warm paths once (a hit, or a refill if it expired) and return
    the stamp of the first; LoadError when one does not answer 200."""
    first = None
    for path in warm_paths(case):
        try:
            status, fields, _ = http_get(run.port, path)
        except (OSError, http.client.HTTPException) as e:
            raise LoadError(f"warming GET {path} failed: {e}") from e
        if status != 200:
            raise LoadError(f"warming GET {path} answered {status}")
        if first is None:
            first = stamp(fields)
    return first


# --- processes ----------------------------------------------------------------------------

def start_proxy(ctx, name: str, up: str, storm: str, shm: Path, connections: int) -> peers.Running:
    wd = modes.workdir(ctx, f"{name}-cache")
    port = procs.free_port()
    cmd, env, conf = render(ctx, name, wd, port, up, storm, shm, connections)
    if name == "veloxy":  # a crisp error for a veloxy build without the response cache
        modes.veloxy_check(ctx, conf, "the cache config", "the response cache ([caches], route "
                           "`cache`)")
    timeout = STARTUP_TIMEOUT.get(name, 15)

    def ready(run: peers.Running) -> None:
        procs.wait_port(port, run.proc, timeout)
        procs.wait_http_ok(run.base_url + "/", run.proc, timeout)

    errlog = wd / "error.log" if name == "nginx" else None
    return modes.spawn(ctx, name, cmd, wd, port, ctx.proxy_cpus, ready, env=env, errlog=errlog)


def py_env() -> dict[str, str]:
    """For `python -m harness.cachestorm`: bench/ on the module path."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))}


def start_storm_upstream(ctx) -> tuple[peers.Running, str]:
    """The counting upstream (harness/cachestorm.py serve) on the load core(s)."""
    wd = modes.workdir(ctx, "storm-upstream")
    port = procs.free_port()
    cmd = [sys.executable, "-m", "harness.cachestorm", "serve", "--listen", f"127.0.0.1:{port}",
           "--delay-ms", str(STORM_DELAY_MS), "--body", str(STORM_BODY)]

    def ready(run: peers.Running) -> None:
        procs.wait_port(port, run.proc, 10)
        procs.wait_http_ok(f"http://127.0.0.1:{port}{cachestorm.COUNT_PATH}", run.proc, 10, need=1)

    run = modes.spawn(ctx, "storm-upstream", cmd, wd, port, ctx.load_cpus, ready, env=py_env())
    return run, f"127.0.0.1:{port}"


def upstream_count(addr: str, path: str) -> int:
    _, port = _host_port(addr)
    status, _, body = http_get(int(port), f"{cachestorm.COUNT_PATH}?path={quote(path, safe='/')}")
    if status != 200:
        raise OSError(f"the counting upstream answered {status}")
    return int(json.loads(body).get(path, 0))


def miss_storm(ctx, run, storm_addr: str) -> dict:
    """STORM_N concurrent GETs of one key no one asked for before (the cache is cold for it),
    from a pinned client process on the load core(s); the counting upstream says how many
    reached it."""
    path = f"/storm/{run.name}-{nonce()}"
    cmd = [sys.executable, "-m", "harness.cachestorm", "storm", "--port", str(run.port),
           "--path", path, "-n", str(STORM_N), "--timeout", "15"]
    rc, out, err = procs.run_bounded(cmd, timeout=60, cpus=ctx.load_cpus, env=py_env())
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if rc != 0 or not lines:
        return {"path": path, "error": f"storm client exited {rc}: {(err or out)[-400:]}"}
    res = json.loads(lines[-1])
    time.sleep(0.2)  # nothing should still be on its way upstream; be sure
    try:
        res["upstream_requests"] = upstream_count(storm_addr, path)
    except (OSError, ValueError, http.client.HTTPException) as e:
        res["error"] = f"cannot read the counting upstream: {e}"
    return res


# --- measurement --------------------------------------------------------------------------

def mix_env() -> dict[str, str]:
    return {"WRK_CACHE_NONCE": nonce(), "WRK_CACHE_MISS_EVERY": str(MISS_EVERY),
            "WRK_CACHE_KEYS": str(WARM_KEYS), "WRK_CACHE_PATH": CASES["mix-90"]}


def one_round(ctx, run, case: str, *, connections: int, duration: float, warmup: float) -> dict:
    url = run.base_url + CASES[case]
    mix = case == "mix-90"

    def load(secs: float) -> dict:
        return loadgen.wrk(url, connections=connections, duration=secs,
                           threads=len(ctx.load_cpus), cpus=ctx.load_cpus,
                           script=MIX_LUA if mix else None, env=mix_env() if mix else None)

    before = warm(run, case)  # the case's objects are in the cache (re-fetched if expired)
    if warmup > 0:
        load(warmup)
    res = measure.measured(ctx, run, lambda: load(duration))
    res.update({"connections": connections, "path": CASES[case], "case": case})
    after = warm(run, case)
    res["refetched"] = before != after
    n = res.get("requests") or 0
    res["bytes_per_req"] = res["bytes"] / n if n else None
    cpu = res.get("cpu_us_per_req")
    res["req_per_core"] = 1e6 / cpu if cpu else None
    if not n:
        res["error"] = "no request completed"
    elif res["bytes_per_req"] < SIZES[case]:
        res["error"] = (f"answers averaged {res['bytes_per_req']:.0f} bytes, less than the "
                        f"{SIZES[case]}-byte body")
    elif res["refetched"] and case in HIT_CASES:
        res["error"] = (f"the upstream answered {CASES[case]} again during the run (evicted or "
                        "expired?): not a cache-hit measurement")
    return res


def run(ctx, args, requested: list[str]) -> int:
    rounds_n = max(1, args.rounds)
    wanted = modes.choose(requested, CACHE_PEERS, "--cache", need_veloxy=False)
    allow = not args.no_install
    runner.install_tools(ctx, ["wrk", *[p for p in ("nginx", "varnish") if p in wanted]],
                         allow=allow, builds=False, build_ws=not args.no_build)
    for t in ("wrk", "upstream"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --cache: {ctx.tool_info[t].reason}")
    modes.one_core(ctx, wanted)
    ctx.n_upstreams = 1
    for name in wanted:
        if name not in ctx.tools:
            ctx.peer_status[name] = {"status": "skipped", "reason": ctx.tool_info[name].reason}
            warn(f"{name} skipped: {ctx.tool_info[name].reason}")

    shm = shm_dir(ctx)
    up_proc = storm_run = None
    running: dict[str, peers.Running] = {}
    results: dict[str, dict[str, list]] = {c: {} for c in CASES}
    storms: dict[str, dict] = {}
    ctx.results["cache"] = results
    ctx.results["cache_storm"] = storms
    ctx.results["cache_env"] = {
        "shm": str(shm), "memory_mib": MEMORY_MIB, "ttl_s": TTL_S, "connections": args.connections,
        "varnish_threads": varnish_threads(args.connections), "storm_n": STORM_N,
        "storm_delay_ms": STORM_DELAY_MS, "warm_keys": WARM_KEYS, "miss_every": MISS_EVERY}
    try:
        try:
            up_proc, up_addr = peers.start_upstream(ctx.tools["upstream"], "u1", ctx.load_cpus,
                                                    ctx.tmp)
            storm_run, storm_addr = start_storm_upstream(ctx)
        except StartError as e:
            raise SetupError(f"an upstream failed to start: {e}") from e
        ctx.upstreams = peers.Upstreams(addrs=[up_addr, storm_addr],
                                        procs=[up_proc, storm_run.proc])
        say(f"upstreams on core(s) {procs.cpu_list(ctx.load_cpus)}: veloxy-upstream {up_addr}, "
            f"counting upstream (storm) {storm_addr}; cache files and Varnish's workdir in {shm}")

        def check(r: peers.Running) -> str | None:
            bad = verify(ctx, r, r.name)
            if not bad:
                seen = ", ".join(f"{k} x{v}" for k, v in r.cache_labels.items())
                ctx.peer_status[r.name]["reason"] = (
                    "checked: 200s with the right bodies, repeated GETs served from the cache "
                    f"(upstream stamp unchanged; cache status of the 3rd GET: {seen}; a cold key: "
                    f"{r.cold_label or 'no cache status field'})")
                say(f"{r.name}: caches on 127.0.0.1:{r.port} (3rd GET of a path: {seen})")
            return bad

        modes.start_checked(
            ctx, wanted, running,
            lambda name: start_proxy(ctx, name, up_addr, storm_addr, shm, args.connections),
            check, variant="cache", failing="does not cache as configured", status="not caching",
            veloxy_required=False)
        if not running:
            raise SetupError("no contender is running: " + "; ".join(
                f"{n}: {st['status']}: {st['reason'][:300]}" for n, st in ctx.peer_status.items()))
        say(f"miss storm: {STORM_N} concurrent GETs of one cold key per contender (the upstream "
            f"answers after {STORM_DELAY_MS} ms)")
        for name, r in running.items():
            storms[name] = miss_storm(ctx, r, storm_addr)
            say(f"    {name}: {storm_line(storms[name])}")
        report.write_results(ctx)
        modes.alternate(
            ctx, results, running, {n: (n, {}) for n in CACHE_PEERS if n in running},
            rounds_n=rounds_n, per_run=args.warmup + max(1, args.duration) + 1,
            plan=(f"{args.connections} connections, {args.duration:g}s + {args.warmup:g}s "
                  "warm-up each"),
            one=lambda run, case: one_round(ctx, run, case, connections=args.connections,
                                            duration=args.duration, warmup=args.warmup),
            line=one_line, upstream=("veloxy-upstream", up_proc, ctx.tmp / "upstream-u1.log"))
    finally:
        for r in running.values():
            peers.stop(r)
        peers.stop(storm_run)
        if up_proc is not None:
            procs.REGISTRY.stop(up_proc)
        shutil.rmtree(shm, ignore_errors=True)
    return modes.finish(ctx, args, summarize, make_charts, _md)


# --- report -------------------------------------------------------------------------------

def storm_line(s: dict) -> str:
    if s.get("error") and s.get("upstream_requests") is None:
        return f"error: {s['error'][:200]}"
    lat = s.get("latency_ms") or {}
    cache = ", ".join(f"{k} x{v}" for k, v in sorted((s.get("cache") or {}).items()))
    errs = ", ".join(f"{k} x{v}" for k, v in (s.get("errors") or {}).items())
    return (f"{s.get('upstream_requests')} upstream request(s) for {s.get('n')} GETs; "
            f"{s.get('ok', 0)} x 200 ({cache or 'no cache status'}); errors {errs or 0}; "
            f"p50 {fmt_ms(lat.get('p50'))}, max {fmt_ms(lat.get('max'))}")


def one_line(r: dict) -> str:
    if r.get("error"):
        return f"error: {r['error'][:160]}"
    lat = r.get("latency_ms") or {}
    note = ", REFETCHED during the run" if r.get("refetched") else ""
    return (f"{fmt_rate(r.get('rps'))} req/s, errors {r.get('errors', 0)}, cpu/req "
            f"{fmt_us(r.get('cpu_us_per_req'))}, p50 {fmt_ms(lat.get('p50'))}, p99 "
            f"{fmt_ms(lat.get('p99'))}, proxy cpu {r.get('proxy_cpu_pct', 0):.0f}%, busiest "
            f"{r.get('bottleneck')}{note}")


def medians(results: dict) -> dict[str, dict[str, dict]]:
    """case -> contender -> median req/s, CPU us per request, requests per core, p50, p99,
    proxy CPU %, errors (sum), most frequent busiest core, rounds ok."""
    return modes.medians_with_latency(results)


def versus(med: dict[str, dict], other: str) -> dict | None:
    """veloxy against `other` in one case: requests/s ratio, CPU per request ratio (veloxy /
    other: below 1 = veloxy cheaper), both p99s, whether veloxy's p99 is lower, and the goal
    (requests/s >= GOALS[other] and a lower p99) met or not. None when either has no rate."""
    v, o = med.get("veloxy") or {}, med.get(other) or {}
    if not v.get("rps") or not o.get("rps"):
        return None
    cpu = v["cpu_us"] / o["cpu_us"] if v.get("cpu_us") and o.get("cpu_us") else None
    lower = (v["p99"] < o["p99"]) if v.get("p99") is not None and o.get("p99") is not None else None
    rps = v["rps"] / o["rps"]
    goal = GOALS.get(other)
    return {"rps": rps, "cpu": cpu, "p99": (v.get("p99"), o.get("p99")), "p99_lower": lower,
            "goal": goal, "met": bool(goal and rps >= goal and lower)}


def storm_goal(storms: dict[str, dict]) -> str | None:
    """"met" when veloxy's storm sent exactly one request upstream, else "NOT met"; None
    without a veloxy storm."""
    s = storms.get("veloxy")
    if not s or s.get("upstream_requests") is None:
        return None
    return "met" if s["upstream_requests"] == 1 and not s.get("error") else "NOT met"


def summarize(ctx, args) -> str:
    results = ctx.results.get("cache") or {}
    storms = ctx.results.get("cache_storm") or {}
    env = ctx.results.get("cache_env") or {}
    meds = medians(results)
    rounds_n = max(1, args.rounds)
    lines = [f"HTTP cache: veloxy vs nginx (proxy_cache) vs Varnish, 1 worker each on core(s) "
             f"{ctx.proxy_cpus} (Varnish: {env.get('varnish_threads', '?')} threads, one pool, "
             f"same core), wrk + the upstreams on core(s) {ctx.load_cpus}, {args.connections} "
             f"connections, {rounds_n} alternating round(s) of {args.duration:g}s (median)"]
    lines += modes.status_lines(ctx, rounds_n)
    goals = []
    if storms:
        lines += ["", f"miss storm: {STORM_N} concurrent GETs of one cold key (the upstream answers "
                  f"after {STORM_DELAY_MS} ms with Cache-Control: max-age=60)"]
        counts = ", ".join(
            f"{n} {s.get('upstream_requests', '?')}" + (" (proxy_cache_lock on)" if n == "nginx"
                                                         else "")
            for n, s in storms.items())
        lines.append(f"upstream requests for {STORM_N} concurrent cold misses: {counts}")
        for n, s in storms.items():
            lines.append(f"  {n:8} {storm_line(s)}")
        g = storm_goal(storms)
        if g:
            lines.append(f"goal, veloxy sends exactly 1 request upstream: {g}")
            goals.append(f"storm {storms['veloxy']['upstream_requests']} upstream {g}")
    for case, per in results.items():
        if not per:
            continue
        lines += ["", TITLES[case]]
        lines.append(f"{'':9} {'req/s':>9} {'p50':>8} {'p99':>8} {'CPU/req':>9} {'req/s/core':>11} "
                     f"{'proxy%':>7} {'errors':>7}  busiest   per round (req/s / CPU us)")
        for label, rs in per.items():
            m = meds[case][label]
            cpu = "-" if m["cpu_pct"] is None else f"{m['cpu_pct']:.0f}%"
            lines.append(f"{label:9} {fmt_rate(m['rps']):>9} {fmt_ms(m['p50']):>8} "
                         f"{fmt_ms(m['p99']):>8} {fmt_us(m['cpu_us']):>9} "
                         f"{fmt_rate(m['per_core']):>11} {cpu:>7} {m['errors']:>7}  "
                         f"{m['busiest'] or '-':9} {modes.per_round(rs)}")
        for other in ("nginx", "varnish"):
            v = versus(meds[case], other)
            if v is None:
                continue
            vp, op = v["p99"]
            cpu = f"{v['cpu']:.2f}x" if v["cpu"] is not None else "-"
            text = (f"veloxy / {other}: requests/s {v['rps']:.2f}x, p99 {fmt_ms(vp)} vs "
                    f"{fmt_ms(op)}, CPU/req {cpu} (below 1: veloxy cheaper)")
            if case in HIT_CASES:
                verdict = "met" if v["met"] else "NOT met"
                text += f"; goal >= {v['goal']:.1f}x with a lower p99: {verdict}"
                goals.append(f"{case} vs {other} {v['rps']:.2f}x {verdict}")
            lines.append(text)
        lines += modes.failures(per)
    lines.append("")
    head = (f"goals (hit req/s >= {GOAL_VS_NGINX:.1f}x nginx and >= {GOAL_VS_VARNISH:.1f}x "
            "varnish with a lower p99; the miss storm sends exactly 1 request upstream): ")
    if goals:
        lines.append(head + "; ".join(goals))
    else:
        st = (ctx.peer_status.get("veloxy") or {})
        why = f"veloxy {st.get('status', 'not requested')}" if st.get("status") != "ok" \
            else "no comparison measured"
        lines.append(head + f"NOT measured ({why})")
    return "\n".join(lines)


def make_charts(ctx) -> list[tuple[str, str]]:
    return modes.bar_charts(ctx, "cache", medians, CACHE_PEERS, [
        ("cache_rps.png", "HTTP cache: requests/s (1 core each)", "requests/s", "rps",
         "Requests/s per contender (cache)", None),
        ("cache_p99.png", "HTTP cache: p99 latency", "milliseconds", "p99",
         "p99 latency per contender (cache)", lambda v: f"{v:.2f}"),
        ("cache_cpu_per_req.png", "HTTP cache: proxy CPU per request", "microseconds of CPU",
         "cpu_us", "Proxy CPU per request (cache)", lambda v: f"{v:.1f}"),
    ])


def settings_notes(env: dict) -> dict[str, str]:
    threads = env.get("varnish_threads", "?")
    return {
        "veloxy": f"`[caches.bench] memory = \"{MEMORY_MIB}MiB\"`, `max_object = \"{MAX_OBJECT}\"`; "
                  f"routes with `cache = {{ store = \"bench\", default_ttl = \"{TTL_S // 60}m\" }}`; "
                  "`workers = 1`, upstream `keepalive`; defaults otherwise",
        "nginx": f"`proxy_cache_path` on tmpfs (/dev/shm) `keys_zone=bench:{NGINX_KEYS_ZONE_MB}m "
                 f"max_size={MEMORY_MIB}m use_temp_path=off`, `proxy_cache_valid 200 "
                 f"{TTL_S // 60}m`, `proxy_cache_lock on`, `add_header X-Cache-Status`, `sendfile "
                 "on` (Debian's default, for the cache files; not its `tcp_nopush on`, which "
                 "held 100 KB answers back on loopback: ~3x fewer requests/s), "
                 "`worker_processes 1` (plus nginx's cache manager and loader processes, on the "
                 "same core and counted), the suite's nginx settings otherwise",
        "varnish": f"`varnishd -F -j none -T none -s malloc,{MEMORY_MIB}m -t {TTL_S} -p "
                   f"thread_pools=1 -p thread_pool_min={threads} -p thread_pool_max={threads} -p "
                   f"thread_queue_limit={VARNISH_QUEUE}`, workdir (`-n`, its shared-memory log) "
                   "on tmpfs; VCL: two backends, `X-Cache` in vcl_deliver; the built-in VCL "
                   "otherwise; shared-memory log (VSL) at its defaults",
    }


def _md(ctx, args, text: str, made: list[tuple[str, str]]) -> str:
    env = ctx.results.get("cache_env") or {}
    threads = env.get("varnish_threads", "?")
    return modes.md(
        ctx, "HTTP cache",
        "veloxy, nginx and Varnish, each with a memory cache of "
        f"{MEMORY_MIB} MiB in front of the same upstream (veloxy-upstream: `/size/N` answers N "
        "bytes with no Cache-Control, so each keeps answers for its default TTL, "
        f"{TTL_S // 60} minutes), all pinned to the same proxy core and measured in alternating "
        f"wrk rounds ({args.connections} keep-alive connections, after a warm-up; medians). "
        "Cases: `hit-1k` and `hit-100k` (one warm object of 1,000 / 100,000 bytes), `mix-90` "
        f"(`lua/cache-mix.lua`: {WARM_KEYS} warm keys, every {MISS_EVERY}th request a key "
        "never asked before, fetched and stored).\n\n"
        "Before measuring, every contender answered each case's paths with 200 and the right "
        "body, and served repeated GETs from its cache: veloxy-upstream stamps every answer "
        "(`x-upstream`, `x-conn-id`, `x-conn-seq`), and three GETs of a path had to carry the "
        "same stamp; the stamp is checked again after each measured run (a hit case whose "
        "object was fetched again is an error). A contender that does not cache is listed "
        "below with the reason, not measured.\n\n"
        f"Miss storm (before the rounds): {STORM_N} connections to the contender, then one GET "
        "of the same never-seen key written on all of them at once; the key's upstream is the "
        f"harness's counting upstream (`harness/cachestorm.py`, on the load core), which "
        f"answers after {STORM_DELAY_MS} ms with `Cache-Control: max-age=60` and counts what "
        "reaches it. nginx collapses concurrent misses only with `proxy_cache_lock on` (set "
        "here; its waiters poll the lock every 500 ms, hence their latency); Varnish always "
        "does (waiting list).\n\n"
        "CPU per request = the proxy process tree's utime+stime over the measured run / "
        "requests; requests per core = 1 s / CPU per request. Where the busiest core is the "
        "load core (wrk), the proxies run below 100% of theirs and requests/s measure the "
        "client: compare CPU per request there.\n\n"
        f"One thread for Varnish is impossible: a Varnish worker thread serves one connection "
        "at a time (a busy keep-alive connection keeps its thread) and backend fetches take "
        f"threads of their own. It gets one thread pool of {threads} threads (the client "
        f"connections + {VARNISH_SPARE_THREADS}; min = max, so none is created during a run; "
        f"`thread_queue_limit={VARNISH_QUEUE}` so the storm's connections wait for a thread "
        "instead of being dropped), all pinned to the same single core as the others: one "
        "core each, not one thread each.\n\n"
        f"Goals (the hit cases): veloxy requests/s >= {GOAL_VS_NGINX:.1f}x nginx's and >= "
        f"{GOAL_VS_VARNISH:.1f}x Varnish's, with a lower p99; the miss storm sends exactly one "
        "request upstream.",
        text, made, settings_notes(env),
        "Configs: `configs/` (veloxy from `bench/peers/veloxy-cache.toml.tmpl`, nginx from the "
        "suite's `bench/peers/nginx.conf.tmpl` with the cache snippets of `harness/cache.py`, "
        "Varnish from `bench/peers/varnish-cache.vcl.tmpl` and the command line in "
        "`command.txt`).")

