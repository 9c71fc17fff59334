"""`bench/run --scale`: the cost of a large route table, veloxy against nginx and HAProxy.

One worker each (veloxy `workers = 1`, nginx `worker_processes 1`, HAProxy `nbthread 1`), all
pinned to the same proxy core, the 4 veloxy-upstream instances and wrk on the load core(s).

1. Route-table cost. Tables of 10, 1,000, 10,000 and 100,000 routes over at most 10,000 hosts
   (`h{i}.example.test`): up to 10,000 routes one route (path `/`) per host; 100,000 routes are
   10 path prefixes `/p0/` .. `/p9/` on each of the 10,000 hosts. Every route goes to the same
   upstream group of 4 servers. The configs are written directly (no templates: a 100,000-route
   file takes well under a second), with the suite's settings (bench/peers/*.tmpl: upstream
   keep-alive pool, X-Forwarded-For, no access log):
   - veloxy: one `[[routes]]` per host and path (`host`, `path`, `upstream`);
   - nginx: one `server` per host (`server_name`, one `location` per path), a default server
     answering 404, `server_names_hash_max_size`/`_bucket_size` raised so the names fit;
   - HAProxy: one frontend, `use_backend %[req.hdr(host),lower,concat(,txn.path),map_beg(MAP)]`
     over a map of `HOST/PATH -> app` lines (longest prefix: the same decision per request as
     a host + path prefix route), a default backend answering 404.
   An unknown host answers 404 everywhere (checked, so a proxy cannot pass by matching nothing).
   wrk with lua/scale-routes.lua picks a random route (Host + path) of the same generated list
   per request and counts the statuses: more than 0.1% non-200 fails the round. Paired
   rounds: every (proxy, size) is started first and stays up; each round measures each proxy
   at every size back to back (the first proxy rotates; sizes go up in even rounds and down in
   odd ones). Medians over rounds: CPU per request (utime+stime of the proxy's process tree
   over the measured run / requests, and utime alone), p99, requests/s; each size against
   nginx and HAProxy; and each proxy's CPU per request at the largest table / at the smallest
   as the median of the rounds' paired ratios (veloxy's goal: at most 1.05), beside the ratio
   of the medians. The time each proxy took to listen and answer, its peak RSS (VmHWM) and its
   RSS once answering (VmRSS, what a loaded table keeps) are kept for every size.

2. Load and reload of the 10,000-host config (one route per host, plus a route for the host
   `127.0.0.1`, which the pacer sends): config check time (`veloxy check --config`, `nginx -t`,
   `haproxy -c`), time to listen and to answer, peak RSS (VmHWM of every process of the proxy,
   summed, and the largest), reload time (veloxy: `POST /reload` on the admin endpoint, which
   answers once the new config is live; nginx: `nginx -s reload` until a new worker runs;
   HAProxy in master-worker mode (`-W`): SIGUSR2 to the master until a new worker runs; for
   nginx and HAProxy also until the old workers are gone), and the latency under a steady load
   (the pacer, bench/pacer: a fixed rate, latency counted from when each request was due) in a
   round without and a round with 3 reloads.

Results: ctx.results["scale"] = {"tables": {size: table facts and per-proxy start}, "routes":
{size: {proxy: [rounds]}}, "reload": {proxy: {...}}}; report.md, results.json and charts
(CPU per request against table size, one line per proxy).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

from . import charts as ch
from . import loadgen, measure, modes, peers, procs, report, runner
from .loadgen import LoadError
from .measure import fmt_ms, fmt_rate, fmt_us
from .procs import StartError
from .runner import SetupError
from .ui import fmt_s, say, warn

BENCH = Path(__file__).resolve().parent.parent
SCALE_PEERS = ["veloxy", "nginx", "haproxy"]
SCALE_LUA = BENCH / "lua" / "scale-routes.lua"

SIZES = [10, 1_000, 10_000, 100_000]
SMALL_SIZES = [10, 1_000]
MAX_HOSTS = 10_000
DOMAIN = "example.test"
PROBE_HOST = "127.0.0.1"  # phase 2: the pacer sends Host: 127.0.0.1:PORT (its URL)
RELOAD_HOSTS = 10_000
SMALL_RELOAD_HOSTS = 1_000
RELOADS = 3  # reloads during a reload round
RELOAD_RATE = 4000  # the pacer's fixed rate (requests/s) in phase 2
RELOAD_CONNS = 32
NON200_LIMIT = 0.001  # more non-200 answers than this share fails a round
GOAL_FLAT = 1.05  # veloxy CPU/req at the largest table / at the smallest, at most
STARTUP_TIMEOUT = 900.0  # seconds to listen and answer (veloxy took 63 s at 100,000 routes)
CHECK_TIMEOUT = 900.0
CHECK_RUNS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the route table ----------------------------------------------------------------------

def table(size: int) -> tuple[int, list[str]]:
    """(hosts, paths per host) of a table of `size` routes: one route per host up to
    MAX_HOSTS hosts, then size / MAX_HOSTS path prefixes /p0/, /p1/, ... on each."""
    if size <= MAX_HOSTS:
        return size, ["/"]
    if size % MAX_HOSTS:
        raise ValueError(f"a table above {MAX_HOSTS} routes must be a multiple of it: {size}")
    return MAX_HOSTS, [f"/p{i}/" for i in range(size // MAX_HOSTS)]


def host(i: int) -> str:
    return f"h{i}.{DOMAIN}"


def routes(size: int) -> list[tuple[str, str]]:
    """Every (host, path) route of the table, in config order."""
    hosts, paths = table(size)
    return [(host(i), p) for i in range(hosts) for p in paths]


def write_targets(path: Path, rts: list[tuple[str, str]]) -> Path:
    """The wrk script's list: "HOST PATH" per line (a path prefix is requested as is)."""
    path.write_text("".join(f"{h} {p}\n" for h, p in rts))
    return path


def veloxy_conf(path: Path, rts: list[tuple[str, str]], *, port: int, servers: list[str],
                keepalive: int, admin_port: int | None = None,
                probe: bool = False) -> Path:
    """veloxy: one [[routes]] per host and path (bench/peers/veloxy.toml.tmpl's settings)."""
    out = ["# bench/run --scale (harness/scale.py): one route per host and path",
           "[server]", "workers = 1"]
    if admin_port:
        out.append(f'admin = "127.0.0.1:{admin_port}"')
    out += ["", "[listeners.web]", f'addr = "127.0.0.1:{port}"', ""]
    for h, p in rts:
        out.append(f'[[routes]]\nhost = "{h}"\n' + (f'path = "{p}"\n' if p != "/" else "")
                   + 'upstream = "app"\n')
    if probe:
        out.append(f'[[routes]]\nhost = "{PROBE_HOST}"\nupstream = "app"\n')
    out += ["[upstreams.app]", "servers = [" + ", ".join(f'"{a}"' for a in servers) + "]",
            f"keepalive = {keepalive}", ""]
    path.write_text("\n".join(out))
    return path


def nginx_conf(path: Path, rts: list[tuple[str, str]], *, wd: Path, port: int,
               servers: list[str], keepalive: int, nofile: int, maxconn: int,
               probe: bool = False) -> Path:
    """nginx: one `server` per host with its `location`s; a default server answers 404
    (bench/peers/nginx.conf.tmpl's settings, the proxy_* directives once at http level)."""
    by_host: dict[str, list[str]] = {}
    for h, p in rts:
        by_host.setdefault(h, []).append(p)
    if probe:
        by_host.setdefault(PROBE_HOST, []).append("/")
    longest = max((len(h) for h in by_host), default=16)
    bucket = 64
    while bucket < longest + 32:
        bucket *= 2
    hash_max = 512
    while hash_max < 4 * len(by_host):
        hash_max *= 2
    listen = f"listen 127.0.0.1:{port}"
    out = [
        "# bench/run --scale (harness/scale.py): one server block per host",
        "daemon off;", "master_process on;", "user root;", "worker_processes 1;",
        f"worker_rlimit_nofile {nofile};", f"pid {wd}/nginx.pid;", f"error_log {wd}/error.log error;",
        "", "events {", f"    worker_connections {maxconn};", "}", "", "http {",
        "    access_log off;",
        f"    client_body_temp_path {wd}/client_body;", f"    proxy_temp_path {wd}/proxy_temp;",
        f"    fastcgi_temp_path {wd}/fastcgi_temp;", f"    uwsgi_temp_path {wd}/uwsgi_temp;",
        f"    scgi_temp_path {wd}/scgi_temp;",
        "    keepalive_requests 10000000;", "    keepalive_timeout 75s;",
        "    client_max_body_size 16m;",
        f"    server_names_hash_max_size {hash_max};",
        f"    server_names_hash_bucket_size {bucket};",
        "    proxy_http_version 1.1;", '    proxy_set_header Connection "";',
        "    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "    proxy_request_buffering off;", "",
        "    upstream backend {", *[f"        server {a};" for a in servers],
        f"        keepalive {keepalive * len(servers)};", "        keepalive_requests 10000000;",
        "        keepalive_timeout 60s;", "    }", "",
        "    server {", f"        {listen} default_server backlog=4096;", "        return 404;",
        "    }",
    ]
    for h, ps in by_host.items():
        out.append(f"    server {{ {listen}; server_name {h};")
        out += [f"        location {p} {{ proxy_pass http://backend; }}" for p in ps]
        out.append("    }")
    out += ["}", ""]
    path.write_text("\n".join(out))
    return path


def haproxy_conf(path: Path, map_path: Path, rts: list[tuple[str, str]], *, wd: Path,
                 port: int, servers: list[str], keepalive: int, maxconn: int,
                 probe: bool = False) -> Path:
    """HAProxy: one frontend choosing the backend from a map of "HOST/PATH app" lines by the
    longest prefix of host + path (map_beg), a default backend answering 404
    (bench/peers/haproxy.cfg.tmpl's settings)."""
    lines = [f"{h}{p} app\n" for h, p in rts]
    if probe:
        lines.append(f"{PROBE_HOST}:{port}/ app\n")
    map_path.write_text("".join(lines))
    out = [
        "# bench/run --scale (harness/scale.py): a host + path map",
        "global", "    nbthread 1", f"    maxconn {maxconn}", f"    pidfile {wd}/haproxy.pid", "",
        "defaults", "    mode http", "    option http-keep-alive", "    timeout connect 5s",
        "    timeout client 60s", "    timeout server 60s", "    timeout http-keep-alive 60s",
        "    timeout http-request 30s", "",
        "frontend web", f"    bind 127.0.0.1:{port}", f"    maxconn {maxconn}",
        "    option forwardfor",
        "    http-request set-var(txn.path) path",
        f"    use_backend %[req.hdr(host),lower,concat(,txn.path),map_beg({map_path})]",
        "    default_backend nomatch", "",
        "backend app", "    balance roundrobin", "    http-reuse always",
        f"    default-server pool-max-conn {keepalive} pool-purge-delay 60s",
        *[f"    server u{i + 1} {a}" for i, a in enumerate(servers)], "",
        "backend nomatch", "    http-request return status 404", "",
    ]
    path.write_text("\n".join(out))
    return path


def write_config(name: str, wd: Path, rts: list[tuple[str, str]], *, port: int,
                 servers: list[str], keepalive: int, nofile: int, maxconn: int,
                 admin_port: int | None = None, probe: bool = False) -> Path:
    """Write `name`'s config for the routes `rts` into `wd`; returns the config file."""
    if name == "veloxy":
        return veloxy_conf(wd / "veloxy.toml", rts, port=port, servers=servers,
                           keepalive=keepalive, admin_port=admin_port, probe=probe)
    if name == "nginx":
        return nginx_conf(wd / "nginx.conf", rts, wd=wd, port=port, servers=servers,
                          keepalive=keepalive, nofile=nofile, maxconn=maxconn, probe=probe)
    if name == "haproxy":
        return haproxy_conf(wd / "haproxy.cfg", wd / "routes.map", rts, wd=wd, port=port,
                            servers=servers, keepalive=keepalive, maxconn=maxconn, probe=probe)
    raise KeyError(name)


def run_cmd(ctx, name: str, conf: Path, wd: Path, *, master_worker: bool = False) -> list[str]:
    if name == "veloxy":
        return [ctx.tools["veloxy"], "run", "--config", str(conf)]
    if name == "nginx":
        return [ctx.tools["nginx"], "-p", f"{wd}/", "-e", str(wd / "error.log"), "-c", str(conf)]
    if name == "haproxy":
        return [ctx.tools["haproxy"], *(["-W"] if master_worker else []), "-db", "-f", str(conf)]
    raise KeyError(name)


def check_cmd(ctx, name: str, conf: Path, wd: Path) -> list[str]:
    if name == "veloxy":
        return [ctx.tools["veloxy"], "check", "--config", str(conf)]
    if name == "nginx":
        return [ctx.tools["nginx"], "-t", "-q", "-p", f"{wd}/", "-e", str(wd / "error.log"),
                "-c", str(conf)]
    if name == "haproxy":
        return [ctx.tools["haproxy"], "-c", "-q", "-f", str(conf)]
    raise KeyError(name)


# --- probes and /proc ---------------------------------------------------------------------

def get_status(port: int, hostname: str, path: str, timeout: float = 5) -> int:
    """GET `path` with Host `hostname` on a new connection to 127.0.0.1:port: the status."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers={"Host": hostname, "User-Agent": "veloxy-bench-scale"})
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def wait_answer(port: int, proc, hostname: str, path: str, timeout: float) -> None:
    """Until GET `path` with Host `hostname` answers 200 (StartError otherwise)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartError(f"exited with code {proc.returncode} during start-up")
        try:
            st = get_status(port, hostname, path)
            if st == 200:
                return
            last = f"HTTP {st}"
        except (OSError, http.client.HTTPException) as e:
            last = str(e)
        time.sleep(0.1)
    raise StartError(f"Host {hostname} {path} not answering 200 after {timeout:.0f}s (last: {last})")


def verify(port: int, rts: list[tuple[str, str]], n: int = 40) -> str | None:
    """None when the first, the last and `n` random routes answer 200 and an unknown host
    404; else what is wrong."""
    rng = random.Random(len(rts))
    sample = [rts[0], rts[-1], *rng.sample(rts, min(n, len(rts)))]
    for h, p in sample:
        try:
            st = get_status(port, h, p)
        except (OSError, http.client.HTTPException) as e:
            return f"GET {p} Host {h} failed: {e}"
        if st != 200:
            return f"GET {p} Host {h} answered {st}, not 200"
    try:
        st = get_status(port, f"unknown.{DOMAIN}", "/")
    except (OSError, http.client.HTTPException) as e:
        return f"GET / Host unknown.{DOMAIN} failed: {e}"
    if st != 404:
        return f"an unknown host answered {st}, not 404 (a catch-all route?)"
    return None


def _status_field(pid: int, key: str) -> int | None:
    """A kB field of /proc/PID/status (VmHWM, VmRSS) in bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory(pids: list[int]) -> dict:
    """Peak RSS (VmHWM) and RSS of a proxy's processes: summed (nginx's and HAProxy's master
    and workers share pages, so the sum counts those twice) and the largest one, in MB."""
    hwm = [v for v in (_status_field(p, "VmHWM") for p in pids) if v]
    rss = [v for v in (_status_field(p, "VmRSS") for p in pids) if v]
    mb = lambda xs, f: round(f(xs) / 1e6, 1) if xs else None  # noqa: E731
    return {"hwm_sum_mb": mb(hwm, sum), "hwm_max_mb": mb(hwm, max),
            "rss_sum_mb": mb(rss, sum), "processes": len(pids)}


def utime_ticks(pids: list[int]) -> int:
    """utime (user CPU, clock ticks) summed over `pids` (field 14 of /proc/PID/stat)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read().decode(errors="replace")
        except OSError:
            continue
        total += int(data[data.rfind(")") + 2:].split()[11])
    return total


# --- processes ----------------------------------------------------------------------------

def start(ctx, name: str, rts: list[tuple[str, str]], tag: str, *, probe: bool = False,
          admin: bool = False, master_worker: bool = False) -> peers.Running:
    """Write the config and start `name` pinned on the proxy core; waits until it listens
    and a route answers 200. run.listen_s / run.started_s: seconds to listen / to answer;
    run.conf, run.admin_port set."""
    wd = modes.workdir(ctx, f"{name}-{tag}")
    port = procs.free_port()
    admin_port = procs.free_port() if admin and name == "veloxy" else None
    t0 = time.monotonic()
    conf = write_config(name, wd, rts, port=port, servers=ctx.upstreams.addrs,
                        keepalive=ctx.keepalive, nofile=ctx.nofile,
                        maxconn=max(1024, (ctx.nofile - 200) // 2), admin_port=admin_port,
                        probe=probe)
    gen_s = time.monotonic() - t0
    cmd = run_cmd(ctx, name, conf, wd, master_worker=master_worker)
    first = rts[0]
    times: dict[str, float] = {}

    def ready(run: peers.Running) -> None:
        t = time.monotonic()
        procs.wait_port(port, run.proc, STARTUP_TIMEOUT)
        times["listen"] = time.monotonic() - t
        wait_answer(port, run.proc, first[0], first[1], STARTUP_TIMEOUT)

    errlog = wd / "error.log" if name == "nginx" else None
    run = modes.spawn(ctx, name, cmd, wd, port, ctx.proxy_cpus, ready, errlog=errlog)
    run.listen_s = times.get("listen")
    run.conf = conf
    run.admin_port = admin_port
    run.gen_s = gen_s
    return run


def save_configs(ctx, run, key: str, full: bool) -> None:
    """Keep the config in results/<name>/configs/KEY/: whole (small tables), else its first
    80 lines (`.head`; the generator in harness/scale.py writes the rest the same way)."""
    dest = ctx.outdir / "configs" / key
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("veloxy.toml", "nginx.conf", "haproxy.cfg", "routes.map", "command.txt"):
        src = run.workdir / f
        if not src.exists():
            continue
        if full or f == "command.txt":
            (dest / f).write_bytes(src.read_bytes())
        else:
            with open(src) as fh:
                head = [next(fh, "") for _ in range(80)]
            (dest / (f + ".head")).write_text("".join(head))


def note_load(ctx, when: str) -> None:
    """Keep the machine's 1-minute load average (other work on the cores shows up here)."""
    ctx.results["scale"].setdefault("loadavg", []).append([when, round(os.getloadavg()[0], 2)])


# --- phase 1: route-table cost --------------------------------------------------------------

def one_round(ctx, run, targets: Path, *, connections: int, duration: float,
              warmup: float) -> dict:
    """wrk + lua/scale-routes.lua over the table's routes; CPU per request (total and utime),
    status counts; an error when more than NON200_LIMIT of the answers are not 200."""
    status_file = targets.with_name(f"status-{run.name}-{time.monotonic_ns()}.json")
    url = run.base_url + "/"

    def load(secs: float, status: Path | None) -> dict:
        env = {"WRK_SCALE_TARGETS": str(targets), "WRK_SCALE_STATUS": str(status or "")}
        return loadgen.wrk(url, connections=connections, duration=secs,
                           threads=len(ctx.load_cpus), cpus=ctx.load_cpus, script=SCALE_LUA,
                           env=env)

    if warmup > 0:
        load(warmup, None)
    user: dict[str, int] = {}

    def measured_load() -> dict:
        u0 = utime_ticks(run.pids())
        r = load(duration, status_file)
        user["ticks"] = utime_ticks(run.pids()) - u0
        return r

    res = measure.measured(ctx, run, measured_load)
    res["connections"] = connections
    n = res.get("requests") or 0
    res["proxy_utime_s"] = user.get("ticks", 0) / CLK_TCK
    res["cpu_user_us_per_req"] = res["proxy_utime_s"] * 1e6 / n if n else None
    res.pop("samples", None)
    try:
        st = json.loads(status_file.read_text())
        status_file.unlink()
    except (OSError, ValueError):
        st = None
    res["status"] = st
    if not n:
        res["error"] = "no request completed"
    elif st is None:
        res["error"] = "the wrk script wrote no status counts"
    else:
        answered = st["ok"] + st["other"]
        res["non200"] = st["other"]
        res["non200_rate"] = st["other"] / answered if answered else 1.0
        if res["non200_rate"] > NON200_LIMIT or res.get("socket_errors"):
            res["error"] = (f"{st['other']} non-200 answers of {answered} ({st['codes']}), "
                            f"{res.get('socket_errors', 0)} socket errors: more than "
                            f"{NON200_LIMIT:.1%} fails the round")
    return res


def round_line(r: dict) -> str:
    if r.get("error") and not r.get("requests"):
        return f"error: {r['error'][:200]}"
    lat = r.get("latency_ms") or {}
    err = f", FAILED: {r['error'][:160]}" if r.get("error") else ""
    return (f"{fmt_rate(r.get('rps'))} req/s, cpu/req {fmt_us(r.get('cpu_us_per_req'))} "
            f"(user {fmt_us(r.get('cpu_user_us_per_req'))}), p99 {fmt_ms(lat.get('p99'))}, "
            f"non-200 {r.get('non200', '?')}, proxy cpu {r.get('proxy_cpu_pct', 0):.0f}%, "
            f"busiest {r.get('bottleneck')}{err}")


def start_size(ctx, size: int, wanted: list[str], sizes: list[int]
               ) -> tuple[Path, dict[str, peers.Running]]:
    """Every proxy of `wanted` started with the table of `size` routes and checked (a proxy
    that fails is recorded and left out): the wrk targets file and the running proxies."""
    data = ctx.results["scale"]
    hosts, paths = table(size)
    t0 = time.monotonic()
    rts = routes(size)
    wd = modes.workdir(ctx, f"table-{size}")
    targets = write_targets(wd / "targets.txt", rts)
    facts = {"routes": len(rts), "hosts": hosts, "paths_per_host": len(paths),
             "list_s": round(time.monotonic() - t0, 3), "start": {}}
    data["tables"][str(size)] = facts
    note_load(ctx, f"table {size}")
    say(f"table of {size:,} routes: {hosts:,} host(s) x {len(paths)} path(s)")
    running: dict[str, peers.Running] = {}
    for name in wanted:
        say(f"  starting {name} with {size:,} routes")
        try:
            r = start(ctx, name, rts, f"t{size}")
        except StartError as e:
            warn(f"{name} failed to start with {size:,} routes: {e}")
            facts["start"][name] = {"error": str(e)[-600:]}
            ctx.events.append(f"{name} failed to start with {size:,} routes: {str(e)[-300:]}")
            continue
        mem = memory(r.pids())
        facts["start"][name] = {"config_s": round(r.gen_s, 3), "listen_s": r.listen_s,
                                "ready_s": r.started_s, **mem,
                                "config_bytes": r.conf.stat().st_size}
        say(f"  {name}: listening after {r.listen_s:.2f}s, answering after "
            f"{r.started_s:.2f}s, peak RSS {mem['hwm_sum_mb']} MB")
        save_configs(ctx, r, f"{name}-{size}", full=size == min(sizes))
        bad = verify(r.port, rts)
        if bad:
            warn(f"{name} with {size:,} routes: {bad}")
            facts["start"][name]["error"] = f"check failed: {bad}"
            ctx.events.append(f"{name} with {size:,} routes: {bad}")
            peers.stop(r)
            continue
        running[name] = r
    return targets, running


def size_order(sizes: list[int], i: int) -> list[int]:
    """Round i's order of the table sizes for each proxy: ascending in even rounds,
    descending in odd ones, so neither size always runs first."""
    return list(sizes) if i % 2 == 0 else list(reversed(sizes))


def run_tables(ctx, args, sizes: list[int], wanted: list[str]) -> None:
    """Phase 1, paired: every (proxy, table size) is started first and kept running (idle
    when not measured), then each round measures every proxy at every size back to back
    (proxies in rotation, sizes in `size_order`). A proxy's sizes are thus measured seconds
    apart, under the same machine conditions, and the cost of a large table is read per round
    as a paired ratio (see `paired_ratios`): measured size after size, minutes apart, this
    machine's drift between the phases was as large as the effect measured (load average 1.96
    at the small table, 2.83 at the large one in scale-20261128c)."""
    data = ctx.results["scale"]
    runs: dict[tuple[str, int], peers.Running] = {}
    targets: dict[int, Path] = {}
    up_proc, up_log = ctx.upstreams.procs[0], ctx.tmp / "upstream-u1.log"
    try:
        for size in sizes:
            targets[size], running = start_size(ctx, size, wanted, sizes)
            runs.update({(name, size): r for name, r in running.items()})
            data["routes"][str(size)] = {n: [] for n in wanted if (n, size) in runs}
        if not runs:
            return
        per_run = args.warmup + args.duration + 1
        left = per_run * len(runs) * args.rounds
        say(f"{args.rounds} paired round(s) x {len(runs)} (proxy, size) runs, "
            f"{args.connections} connections, {args.duration:g}s + {args.warmup:g}s warm-up "
            f"each: ~{fmt_s(left)}")
        for i in range(args.rounds):
            for name in modes.rotation(wanted, i):
                for size in size_order(sizes, i):
                    run = runs.get((name, size))
                    if run is None:
                        continue
                    say(f"[~{fmt_s(left)} left] round {i + 1}/{args.rounds}: {size:,} routes: "
                        f"{name}")
                    try:
                        r = one_round(ctx, run, targets[size], connections=args.connections,
                                      duration=args.duration, warmup=args.warmup)
                    except LoadError as e:
                        r = {"error": str(e)}
                    r["round"] = i + 1
                    data["routes"][str(size)][name].append(r)
                    say("    " + round_line(r))
                    left -= per_run
                    if up_proc.poll() is not None:
                        raise SetupError(f"veloxy-upstream u1 exited during round {i + 1}: "
                                         f"{procs.tail(up_log)}")
                    if not run.alive():
                        msg = (f"exited (code {run.proc.returncode}) during round {i + 1} / "
                               f"{size} routes: {procs.tail(run.log, 4)}")
                        warn(f"{name} {msg}")
                        ctx.peer_status[name] = {"status": "crashed", "reason": msg}
                        peers.stop(runs.pop((name, size)))
            report.write_results(ctx)
        for (name, size), r in runs.items():
            data["tables"][str(size)]["start"][name]["after_rounds"] = memory(r.pids())
    finally:
        for r in runs.values():
            peers.stop(r)
        report.write_results(ctx)


# --- phase 2: load and reload ---------------------------------------------------------------

def new_pids(root: int, before: set[int], timeout: float) -> tuple[float | None, set[int]]:
    """Poll the process tree of `root` until a process not in `before` runs: (seconds, the
    new ones), or (None, set()) after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        now = set(procs.tree_pids(root))
        fresh = now - before
        if fresh:
            return time.monotonic() - t0, fresh
        time.sleep(0.005)
    return None, set()


def gone(pids: set[int], timeout: float) -> float | None:
    """Seconds until none of `pids` is alive (zombies count as gone), None after timeout."""
    t0 = time.monotonic()

    def alive(pid: int) -> bool:
        f = procs._stat_fields(str(pid))
        return f is not None and f[0] != "Z"

    while time.monotonic() - t0 < timeout:
        if not any(alive(p) for p in pids):
            return time.monotonic() - t0
        time.sleep(0.01)
    return None


def reload_once(ctx, name: str, run: peers.Running) -> dict:
    """One reload of the running proxy's (unchanged) config file, timed until the new config
    serves: veloxy POST /reload (answers once the new config is live), nginx `nginx -s
    reload` / HAProxy SIGUSR2 to the master until a new worker process runs (and, kept apart,
    until the old workers are gone)."""
    t0 = time.monotonic()
    if name == "veloxy":
        c = http.client.HTTPConnection("127.0.0.1", run.admin_port, timeout=120)
        try:
            c.request("POST", "/reload")
            resp = c.getresponse()
            body = resp.read().decode(errors="replace")
        finally:
            c.close()
        out = {"s": time.monotonic() - t0, "ok": resp.status == 200}
        if resp.status != 200:
            out["error"] = f"POST /reload answered {resp.status}: {body[:300]}"
        return out
    root = run.proc.pid
    before = set(procs.tree_pids(root))
    old_workers = before - {root}
    out: dict = {}
    if name == "nginx":
        wd = run.workdir
        cmd = [ctx.tools["nginx"], "-s", "reload", "-p", f"{wd}/", "-e", str(wd / "error.log"),
               "-c", str(run.conf)]
        r = subprocess.run(procs.pinned(cmd, ctx.proxy_cpus), capture_output=True, text=True,
                           timeout=120)
        out["command_s"] = time.monotonic() - t0
        if r.returncode != 0:
            return {**out, "s": None, "ok": False,
                    "error": f"nginx -s reload exited {r.returncode}: {(r.stderr or r.stdout)[-300:]}"}
    elif name == "haproxy":
        os.kill(root, signal.SIGUSR2)
    else:
        raise KeyError(name)
    waited = time.monotonic() - t0
    secs, fresh = new_pids(root, before, 120)
    if secs is None:
        return {**out, "s": None, "ok": False, "error": "no new worker within 120 s"}
    out["s"] = waited + secs
    out["new_pids"] = sorted(fresh)
    g = gone(old_workers, 30)
    out["old_gone_s"] = None if g is None else time.monotonic() - t0
    out["ok"] = True
    return out


def reload_round(ctx, name: str, run: peers.Running, *, seconds: float, reloads: int) -> dict:
    """The pacer at RELOAD_RATE for `seconds` (after its 1 s warm-up), with `reloads`
    reloads spread over the measured time (none when 0)."""
    done: list[dict] = []
    stop = threading.Event()

    def trigger() -> None:
        t0 = time.monotonic()
        for k in range(reloads):
            at = 1.0 + seconds * (k + 1) / (reloads + 1)
            if stop.wait(max(0.0, t0 + at - time.monotonic())):
                return
            try:
                rr = reload_once(ctx, name, run)
            except (OSError, subprocess.SubprocessError, http.client.HTTPException) as e:
                rr = {"s": None, "ok": False, "error": f"{type(e).__name__}: {e}"}
            rr["at_s"] = round(time.monotonic() - t0, 3)
            done.append(rr)

    th = threading.Thread(target=trigger, daemon=True)
    th.start()
    try:
        try:
            res = measure.pacer(ctx, run, "/", rate=RELOAD_RATE, connections=RELOAD_CONNS,
                                duration=seconds, warmup=1)
        except LoadError as e:
            res = {"error": str(e)}
    finally:
        th.join(timeout=seconds + 240)
        stop.set()
    res.pop("samples", None)
    res["reloads"] = done
    res["kind"] = "reload" if reloads else "steady"
    if reloads and len([d for d in done if d.get("ok")]) < reloads:
        res["reload_error"] = "; ".join(d.get("error", "?") for d in done if not d.get("ok")) \
            or f"{len(done)} of {reloads} reloads ran"
    return res


def time_checks(ctx, name: str, conf: Path, wd: Path, runs: int) -> dict:
    """The config check command `runs` times, pinned on the proxy core: each wall time."""
    cmd = procs.pinned(check_cmd(ctx, name, conf, wd), ctx.proxy_cpus)
    times, err = [], None
    for _ in range(runs):
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=CHECK_TIMEOUT)
        except subprocess.TimeoutExpired:
            err = f"no answer within {CHECK_TIMEOUT:.0f}s"
            break
        times.append(time.monotonic() - t0)
        if r.returncode != 0:
            err = f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"
            break
        out = (r.stdout + r.stderr).strip()
    res = {"command": " ".join(check_cmd(ctx, name, conf, wd)), "runs_s": times,
           "s": statistics.median(times) if times and not err else None}
    if err:
        res["error"] = err
    else:
        res["output"] = out[-300:]
    return res


def run_reload(ctx, args, wanted: list[str], hosts: int) -> None:
    data = ctx.results["scale"]["reload"]
    note_load(ctx, "reload")
    rts = routes(hosts)
    seconds = max(4.0, 2 * args.duration)
    rounds_n = args.rounds
    say(f"load and reload: {hosts:,} hosts (+ host {PROBE_HOST}), per proxy: the check x"
        f"{CHECK_RUNS}, start, then {rounds_n} x (a steady round, a round with {RELOADS} "
        f"reloads) of {seconds:g}s at {RELOAD_RATE:,} req/s (pacer, {RELOAD_CONNS} connections)")
    if "pacer" not in ctx.tools:
        warn("the pacer is not built: no latency under reload (bench/run --sweep builds it)")
    for name in wanted:
        d: dict = {"hosts": hosts}
        data[name] = d
        say(f"  {name}: starting with {hosts:,} hosts")
        try:
            run = start(ctx, name, rts, f"reload{hosts}", probe=True, admin=True,
                        master_worker=True)
        except StartError as e:
            warn(f"{name} failed to start with {hosts:,} hosts: {e}")
            d["error"] = f"start failed: {str(e)[-600:]}"
            continue
        try:
            d.update({"listen_s": run.listen_s, "ready_s": run.started_s,
                      "config_bytes": run.conf.stat().st_size, "start_memory": memory(run.pids())})
            save_configs(ctx, run, f"{name}-reload", full=False)
            chk = time_checks(ctx, name, run.conf, run.workdir, CHECK_RUNS)
            d["check"] = chk
            say(f"  {name}: listening after {run.listen_s:.2f}s, answering after "
                f"{run.started_s:.2f}s, peak RSS {d['start_memory']['hwm_sum_mb']} MB; check "
                + (f"{chk['s']:.2f}s" if chk.get("s") is not None else f"failed: {chk.get('error')}"))
            bad = verify(run.port, rts, n=20)
            if bad:
                d["error"] = f"check failed: {bad}"
                warn(f"{name} with {hosts:,} hosts: {bad}")
                continue
            d["rounds"] = []
            if "pacer" in ctx.tools:
                for i in range(rounds_n):
                    for n_reloads in ((0, RELOADS) if i % 2 == 0 else (RELOADS, 0)):
                        kind = "with reloads" if n_reloads else "steady"
                        say(f"  {name}: round {i + 1}/{rounds_n} {kind}")
                        r = reload_round(ctx, name, run, seconds=seconds, reloads=n_reloads)
                        r["round"] = i + 1
                        d["rounds"].append(r)
                        say("    " + reload_line(r))
                        if not run.alive():
                            d["error"] = f"exited during the reload rounds: {procs.tail(run.log, 4)}"
                            break
                    if d.get("error"):
                        break
            else:
                d["reloads"] = [reload_once(ctx, name, run) for _ in range(RELOADS)]
            d["end_memory"] = memory(run.pids())
        finally:
            peers.stop(run)
            report.write_results(ctx)


def reload_line(r: dict) -> str:
    if r.get("error"):
        return f"error: {r['error'][:200]}"
    lat = r.get("latency_ms") or {}
    rl = ", ".join("failed" if d.get("s") is None else f"{d['s']:.3f}s" for d in r.get("reloads", []))
    return (f"{fmt_rate(r.get('rps'))} req/s, p50 {fmt_ms(lat.get('p50'))}, p99 "
            f"{fmt_ms(lat.get('p99'))}, p99.9 {fmt_ms(lat.get('p99.9'))}, max "
            f"{fmt_ms(lat.get('max'))}, errors {r.get('errors', 0)}"
            + (f"; reloads {rl}" if rl else "") + (f"; {r['reload_error']}" if r.get("reload_error") else ""))


# --- the mode -----------------------------------------------------------------------------

def settings(args) -> tuple[list[int], int]:
    """(table sizes, hosts of the reload config) for the run."""
    if getattr(args, "scale_sizes", None):
        sizes = sorted({int(x.replace("_", "")) for x in args.scale_sizes.split(",") if x.strip()})
    else:
        sizes = SMALL_SIZES if args.small else SIZES
    return sizes, SMALL_RELOAD_HOSTS if args.small else RELOAD_HOSTS


def run(ctx, args, requested: list[str]) -> int:
    wanted = modes.choose(requested, SCALE_PEERS, "--scale")
    sizes, reload_hosts = settings(args)
    for s in sizes:
        table(s)  # a bad size is an error now, not after the first ones ran
    runner.install_tools(ctx, ["wrk", "pacer", *[p for p in ("nginx", "haproxy") if p in wanted]],
                         allow=not args.no_install, builds=False, build_ws=not args.no_build)
    for t in ("wrk", "veloxy", "upstream"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --scale: {ctx.tool_info[t].reason}")
    modes.one_core(ctx, wanted)
    for name in list(wanted):
        if name not in ctx.tools:
            ctx.peer_status[name] = {"status": "skipped", "reason": ctx.tool_info[name].reason}
            warn(f"{name} skipped: {ctx.tool_info[name].reason}")
            wanted.remove(name)
    runner.start_upstreams(ctx)
    ctx.results["scale"] = {"sizes": sizes, "reload_hosts": reload_hosts, "tables": {},
                            "routes": {}, "reload": {},
                            "settings": {"connections": args.connections, "rounds": args.rounds,
                                         "duration_s": args.duration, "warmup_s": args.warmup,
                                         "reload_rate": RELOAD_RATE,
                                         "reload_connections": RELOAD_CONNS, "reloads": RELOADS}}
    per = args.warmup + args.duration + 1
    est = len(sizes) * len(wanted) * args.rounds * per + len(wanted) * (
        args.rounds * 2 * (max(4.0, 2 * args.duration) + 2) + 10)
    say(f"--scale: tables {', '.join(f'{s:,}' for s in sizes)} routes, then load/reload of "
        f"{reload_hosts:,} hosts; {', '.join(wanted)}; ~{fmt_s(est)} plus start-up times "
        "(veloxy took about a minute to start with 100,000 routes)")
    run_tables(ctx, args, sizes, wanted)
    run_reload(ctx, args, wanted, reload_hosts)
    note_load(ctx, "end")
    return modes.finish(ctx, args, summarize, make_charts, _md)


# --- summary and report -------------------------------------------------------------------

def medians(ctx) -> dict[str, dict[str, dict]]:
    """size -> proxy -> median rps, cpu_us, user_us, p99, errors, ok rounds."""
    out: dict[str, dict[str, dict]] = {}
    for size, per in (ctx.results.get("scale", {}).get("routes") or {}).items():
        out[size] = {}
        for name, rs in per.items():
            m = modes.medians({size: {name: rs}})[size][name]
            m["user_us"] = modes.median_of(rs, "cpu_user_us_per_req")
            m["p99"] = modes.median_of(rs, "latency_ms", "p99")
            m["non200"] = sum(r.get("non200") or 0 for r in rs)
            out[size][name] = m
    return out


def _med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def reload_summary(d: dict) -> dict:
    """A proxy's phase-2 figures: median reload time, median old-workers-gone time, median
    p99/p99.9/max of the steady and the reload rounds, errors in each."""
    rounds = d.get("rounds") or []
    reloads = [x for r in rounds for x in r.get("reloads", [])] + d.get("reloads", [])
    out = {"reload_s": _med([x.get("s") for x in reloads if x.get("ok")]),
           "reload_max_s": max((x["s"] for x in reloads if x.get("ok") and x.get("s")), default=None),
           "old_gone_s": _med([x.get("old_gone_s") for x in reloads]),
           "reloads_ok": sum(1 for x in reloads if x.get("ok")), "reloads": len(reloads)}
    for kind in ("steady", "reload"):
        rs = [r for r in rounds if r.get("kind") == kind and not r.get("error")]
        for q in ("p50", "p99", "p99.9", "max"):
            out[f"{kind}_{q}"] = _med([(r.get("latency_ms") or {}).get(q) for r in rs])
        out[f"{kind}_errors"] = sum(r.get("errors", 0) for r in rs)
        out[f"{kind}_requests"] = sum(r.get("requests", 0) for r in rs)
    return out


def _r(a, b, digits=2) -> str:
    return f"{a / b:.{digits}f}" if a and b else "-"


def paired_ratios(sc: dict, name: str, lo: str, hi: str, key: str) -> list[float]:
    """`name`'s per-round ratios of `key` at table `hi` over table `lo`, for the rounds where
    both runs succeeded (phase 1 measures them back to back: see `run_tables`)."""
    per = sc.get("routes") or {}
    small = {r.get("round"): r for r in (per.get(lo) or {}).get(name, []) if not r.get("error")}
    out = []
    for r in (per.get(hi) or {}).get(name, []):
        b = small.get(r.get("round"))
        if b and not r.get("error") and r.get(key) and b.get(key):
            out.append(r[key] / b[key])
    return out


def flatness_lines(sc: dict, meds: dict, names: list[str], lo: str, hi: str) -> list[str]:
    """Each proxy's CPU per request at table `hi` over table `lo`: the median of the rounds'
    paired ratios (what veloxy's goal is judged on: the two runs of a pair are seconds apart,
    so the machine's drift between rounds cancels), and the ratio of the medians."""
    lines = []
    for n in names:
        a = ((meds.get(hi) or {}).get(n) or {})
        b = ((meds.get(lo) or {}).get(n) or {})
        if not (a.get("cpu_us") and b.get("cpu_us")):
            continue
        pairs = paired_ratios(sc, n, lo, hi, "cpu_us_per_req")
        users = paired_ratios(sc, n, lo, hi, "cpu_user_us_per_req")
        paired = statistics.median(pairs) if pairs else None
        goal = ""
        if n == "veloxy" and paired is not None:
            goal = (f" (goal at most {GOAL_FLAT:.2f}: "
                    f"{'met' if paired <= GOAL_FLAT else 'NOT met'})")
        shown = "-" if paired is None else f"{paired:.3f}"
        user = f"{statistics.median(users):.3f}" if users else "-"
        lines.append(f"{n}: CPU/req at {int(hi):,} routes / at {int(lo):,}: paired median "
                     f"{shown}, user {user}{goal}; ratio of medians "
                     f"{a['cpu_us'] / b['cpu_us']:.3f}, user "
                     f"{_r(a.get('user_us'), b.get('user_us'), 3)}; per round "
                     + ", ".join(f"{x:.3f}" for x in pairs))
    return lines


def summarize(ctx, args) -> str:
    sc = ctx.results.get("scale") or {}
    meds = medians(ctx)
    sizes = [str(s) for s in sc.get("sizes", [])]
    names = [n for n in SCALE_PEERS if any(n in (meds.get(s) or {}) for s in sizes)
             or n in (sc.get("reload") or {})]
    lines = [f"--scale: 1 worker each on core(s) {ctx.proxy_cpus}, wrk (lua/scale-routes.lua: "
             f"a random route per request) + 4 upstreams on core(s) {ctx.load_cpus}, "
             f"{args.connections} connections, {args.rounds} alternating round(s) of "
             f"{args.duration:g}s per table (median)"]
    lines += modes.status_lines(ctx, args.rounds)
    loads = sc.get("loadavg") or []
    if loads:
        lines.append("machine load average (1 min) at each step: "
                     + ", ".join(f"{w} {v:g}" for w, v in loads)
                     + f" ({os.cpu_count()} cores; the benchmark alone keeps about 2 busy: above that, "
                     "other work shared the cores and rates and latencies are noisy)")
    lines += ["", "1. route-table cost (CPU per request: utime+stime of the proxy / requests; "
              "user: utime only)",
              f"{'routes':>8} {'hosts':>6} {'proxy':8} {'req/s':>8} {'CPU/req':>9} {'user/req':>9} "
              f"{'p99':>8} {'non200':>7} {'listen':>8} {'peakRSS':>9} {'RSS':>8}  vs nginx  vs haproxy  "
              "per round (req/s / CPU us)"]
    for s in sizes:
        facts = (sc.get("tables") or {}).get(s, {})
        per = meds.get(s) or {}
        for n in names:
            st = (facts.get("start") or {}).get(n) or {}
            m = per.get(n)
            if m is None:
                if st.get("error"):
                    lines.append(f"{int(s):>8,} {facts.get('hosts', 0):>6,} {n:8} "
                                 f"FAILED: {st['error'][:150]}")
                continue
            vn = (per.get("nginx") or {}).get("cpu_us")
            vh = (per.get("haproxy") or {}).get("cpu_us")
            listen = st.get("listen_s")
            lines.append(
                f"{int(s):>8,} {facts.get('hosts', 0):>6,} {n:8} {fmt_rate(m['rps']):>8} "
                f"{fmt_us(m['cpu_us']):>9} {fmt_us(m['user_us']):>9} {fmt_ms(m['p99']):>8} "
                f"{m['non200']:>7} {('-' if listen is None else f'{listen:.2f}s'):>8} "
                f"{(str(st.get('hwm_sum_mb', '-')) + 'MB'):>9} "
                f"{(str(st.get('rss_sum_mb', '-')) + 'MB'):>8}  {_r(m['cpu_us'], vn):>8}  "
                f"{_r(m['cpu_us'], vh):>9}  {modes.per_round((sc['routes'][s] or {}).get(n, []))}")
        lines += modes.failures((sc.get("routes") or {}).get(s) or {})
    lines.append("(vs nginx / vs haproxy: this proxy's CPU per request / theirs at the same size; "
                 "below 1 = cheaper)")
    if len(sizes) >= 2:
        lines += flatness_lines(sc, meds, names, sizes[0], sizes[-1])
    rl = sc.get("reload") or {}
    if rl:
        hosts = sc.get("reload_hosts")
        lines += ["", f"2. load and reload of {hosts:,} hosts (one route each, + host {PROBE_HOST}); "
                  f"latency: pacer at {RELOAD_RATE:,} req/s, {RELOAD_CONNS} connections, a steady "
                  f"round and a round with {RELOADS} reloads (medians over rounds)",
                  f"{'proxy':8} {'check':>7} {'listen':>7} {'answer':>7} {'peakRSS':>8} "
                  f"{'(max 1)':>8} {'reload':>8} {'old gone':>9} {'steady p99':>11} "
                  f"{'reload p99':>11} {'p99.9':>15} {'max':>15} {'errors':>9}"]
        sums = {}
        for n in names:
            d = rl.get(n)
            if not d:
                continue
            if d.get("error") and not d.get("rounds"):
                lines.append(f"{n:8} FAILED: {d['error'][:200]}")
                continue
            s = sums[n] = reload_summary(d)
            mem = d.get("end_memory") or d.get("start_memory") or {}
            chk = (d.get("check") or {}).get("s")
            sec = lambda x: "-" if x is None else f"{x:.2f}s"  # noqa: E731
            lines.append(
                f"{n:8} {sec(chk):>7} {sec(d.get('listen_s')):>7} {sec(d.get('ready_s')):>7} "
                f"{str(mem.get('hwm_sum_mb', '-')) + 'MB':>8} {str(mem.get('hwm_max_mb', '-')) + 'MB':>8} "
                f"{sec(s['reload_s']):>8} {sec(s['old_gone_s']):>9} {fmt_ms(s['steady_p99']):>11} "
                f"{fmt_ms(s['reload_p99']):>11} "
                f"{fmt_ms(s['steady_p99.9']) + '/' + fmt_ms(s['reload_p99.9']):>15} "
                f"{fmt_ms(s['steady_max']) + '/' + fmt_ms(s['reload_max']):>15} "
                f"{str(s['steady_errors']) + '/' + str(s['reload_errors']):>9}")
            if d.get("error"):
                lines.append(f"    {n}: {d['error'][:200]}")
            for r in d.get("rounds") or []:
                if not r.get("error") and r.get("errors"):
                    det = {k: v for k, v in (r.get("errors_detail") or {}).items() if v}
                    lines.append(f"    {n} round {r.get('round')} {r.get('kind')}: {r['errors']} "
                                 f"failed requests of {r.get('requests')} (non-2xx "
                                 f"{r.get('non2xx', 0)}, {det or 'no socket errors'})")
                if r.get("error") or r.get("reload_error"):
                    lines.append(f"    {n} round {r.get('round')} {r.get('kind')}: "
                                 f"{(r.get('error') or r.get('reload_error'))[:200]}")
            if (d.get("check") or {}).get("error"):
                lines.append(f"    {n} check: {d['check']['error'][:200]}")
        lines.append("(peak RSS: VmHWM summed over the proxy's processes at the end, after the "
                     "reloads; (max 1): the largest single process; reload: until the new config "
                     "serves; old gone: until the old workers exited; p99.9 and max: steady / "
                     "with reloads; errors: steady / with reloads)")
        v, ng = sums.get("veloxy") or {}, sums.get("nginx") or {}
        if v.get("reload_s") and ng.get("reload_s"):
            nchk = ((rl.get("nginx") or {}).get("check") or {}).get("s") or 0
            lines.append(f"nginx reload / veloxy reload = {ng['reload_s'] / v['reload_s']:.1f}x; "
                         f"(nginx -t + reload) / veloxy reload = "
                         f"{(ng['reload_s'] + nchk) / v['reload_s']:.1f}x (goal: at least 5x)")
        if v.get("steady_p99") and v.get("reload_p99"):
            lines.append(f"veloxy p99 with reloads / steady = {v['reload_p99'] / v['steady_p99']:.2f} "
                         "(goal: no change)")
    return "\n".join(lines)


def make_charts(ctx) -> list[tuple[str, str]]:
    if not ch.HAVE:
        return []
    meds = medians(ctx)
    made = []
    for key, fname, title, ylabel in (
            ("cpu_us", "scale_cpu_per_req.png", "Proxy CPU per request against route-table size",
             "microseconds of CPU (utime+stime)"),
            ("user_us", "scale_user_per_req.png", "Proxy user CPU per request against route-table "
             "size", "microseconds of user CPU (utime)")):
        series = {n: [(int(s), (per.get(n) or {}).get(key)) for s, per in meds.items()]
                  for n in SCALE_PEERS if any(n in per for per in meds.values())}
        if ch.lines(ctx.outdir / fname, title, "routes in the table (log scale)", ylabel, series,
                    logx=True, zero=True):
            made.append((title, fname))
    return made


def _md(ctx, args, text: str, made: list[tuple[str, str]]) -> str:
    sizes = ", ".join(f"{s:,}" for s in (ctx.results.get("scale") or {}).get("sizes", []))
    return modes.md(
        ctx, "Route-table scale",
        f"veloxy, nginx and HAProxy, one worker each pinned to the same core, with route tables "
        f"of {sizes} routes over at most {MAX_HOSTS:,} hosts (`h{{i}}.{DOMAIN}`; one route, "
        f"path `/`, per host up to {MAX_HOSTS:,}; above, path prefixes `/p0/`, `/p1/`, ... on "
        "each host), all to the same 4 upstreams. wrk (`lua/scale-routes.lua`) picks a random "
        "route of the generated list per request (Host and path) and counts the statuses: "
        f"more than {NON200_LIMIT:.1%} non-200 fails a round; an unknown host must answer 404 "
        "before a proxy is measured. CPU per request = utime+stime of the proxy's processes over "
        "the measured run / requests (user: utime alone). Every (proxy, size) runs at once; "
        "each round measures each proxy at every size back to back (proxies rotating, sizes "
        "ascending and descending in turn); medians over rounds, and the cost of the large "
        "table as the median of each round's paired ratio.\n\n"
        "Load and reload: the config of the reload table (one route per host, plus the host "
        f"`{PROBE_HOST}` the pacer sends) is checked (`veloxy check --config`, `nginx -t`, "
        "`haproxy -c`, median of 3, pinned on the proxy core), started (time to listen, to "
        "answer a route, peak RSS = VmHWM), then reloaded 3 times in a round under a fixed-rate "
        "load (the pacer, latency from when each request was due) and compared with a round "
        "without reloads. veloxy reloads with `POST /reload` on its admin endpoint (the answer "
        "comes once the new config is live); nginx with `nginx -s reload` (which parses the "
        "config too), timed until a new worker process runs; HAProxy runs in master-worker mode "
        "(`-W`) and reloads on SIGUSR2 to the master, timed until a new worker runs. The old "
        "workers' exit is timed apart.",
        text, made, {
            "veloxy": "`workers = 1`; one `[[routes]]` per host and path; upstream `keepalive`; "
                      "the reload config adds `[server] admin` on loopback",
            "nginx": "`worker_processes 1`; one `server` per host (`server_name`, a `location` per "
                     "path), a `default_server` answering 404, `server_names_hash_max_size` / "
                     "`_bucket_size` raised to fit, proxy settings of `bench/peers/nginx.conf.tmpl`",
            "haproxy": "`nbthread 1`; one frontend, `use_backend %[req.hdr(host),lower,"
                       "concat(,txn.path),map_beg(routes.map)]` over `HOST/PATH app` lines, a "
                       "default backend answering 404; `-W` (master-worker) for the reload part",
        },
        "Configs: `configs/` (the smallest table whole, the others' first 80 lines as `.head`; "
        "they are written by `harness/scale.py`).")
