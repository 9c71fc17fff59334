"""`bench/run --vs-nginx --ratelimit`: the bench scenario `ratelimit-global`, what a global rate
limit (token buckets in Redis) costs over a local one.

Three veloxy processes, one worker each, all pinned to the same proxy core and running side by
side, in alternating wrk rounds (the first contender rotates; medians), the same 4 upstreams:

- veloxy:           no rate limit;
- veloxy-rl-local:  `rate_limit = { rate = "2000/s", burst = 2000, key = "header:x-key" }`;
- veloxy-rl-global: the same limit with `scope = "global"` and `[server.redis]` (`timeout =
  "50ms"`; `on_store_error` left at its default, `local`), against a real redis-server started
  by the harness on the load core (`--save "" --appendonly no`).

Every request of every contender carries `x-key: kN`, cycling over K keys (lua/ratelimit-keys.lua),
so each key gets about 1,000 req/s: K = the plain veloxy's rate in a short calibration run / 1000
(at least 1). The limit (2,000/s per key) is above what a key gets, so requests pass: the 429s
and other non-2xx answers are counted (expected: none). Every contender also has `[server] admin`
on loopback (no per-request work), so the harness reads veloxy's own counters before and after
each run (`veloxy_rate_limited_total`, `veloxy_ratelimit_store_fallbacks_total`,
`veloxy_redis_errors_total`), and Redis' command count and CPU (on the load core; not part of the
proxy's CPU per request).

Reported: requests/s, requests/s per key, p50/p99, the proxy's CPU time per request (utime+stime
of its process tree over the measured run / requests, as in the other modes; veloxy's Redis client
thread included), and CPU per request ratios: veloxy-rl-global / veloxy-rl-local (goal: at most
1.05) and veloxy-rl-local / veloxy.

Then a Redis outage: veloxy-rl-global alone (the other two stopped), wrk with OUTAGE_CONNECTIONS
connections for a few seconds with Redis up (the control), then again with redis-server
SIGKILLed halfway: max latency, p99 and non-2xx answers of each run, and the requests veloxy
decided by `on_store_error` meanwhile. Goal: no request slower than the Redis `timeout` (50 ms).
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import loadgen, measure, modes, peers, procs, report, runner
from .measure import fmt_ms, fmt_rate, fmt_us
from .procs import StartError
from .runner import SetupError
from .sysstat import CLK_TCK, proc_ticks
from .ui import say, warn

BENCH = Path(__file__).resolve().parent.parent
KEYS_LUA = BENCH / "lua" / "ratelimit-keys.lua"

MODE = "ratelimit-global"  # ctx.results key (the bench scenario's name) and its one case
OUTAGE = "redis-outage"
ENV = "ratelimit-env"
PLAIN, LOCAL, GLOBAL = "veloxy", "veloxy-rl-local", "veloxy-rl-global"
LABELS = [PLAIN, LOCAL, GLOBAL]
REDIS = "redis-server"

KEY_HEADER = "x-key"
RATE = 2000  # per second and key
BURST = 2000
PER_KEY = 1000  # the request rate each key should get
DEFAULT_KEYS = 48  # when calibration fails (~50k req/s on one core / 1000)
TIMEOUT_MS = 50  # [server.redis] timeout
GOAL_GLOBAL_LOCAL = 1.05  # veloxy-rl-global CPU per request / veloxy-rl-local's, at most
CALIBRATE_S = 1
OUTAGE_CONNECTIONS = 8
OUTAGE_MAX_S = 5
COUNTERS = {"rate_limited": "veloxy_rate_limited_total",
            "fallbacks": "veloxy_ratelimit_store_fallbacks_total",
            "redis_errors": "veloxy_redis_errors_total"}

# (numerator, denominator, goal or None) of the CPU per request ratios reported.
RATIOS = [(GLOBAL, LOCAL, GOAL_GLOBAL_LOCAL), (LOCAL, PLAIN, None), (GLOBAL, PLAIN, None)]


# --- configs ------------------------------------------------------------------------------

def rate_limit(scope: str | None) -> str:
    """The route's `rate_limit` line (`scope` None: local, the default)."""
    tail = f', scope = "{scope}"' if scope else ""
    return (f'rate_limit = {{ rate = "{RATE}/s", burst = {BURST}, key = "header:{KEY_HEADER}"'
            f"{tail} }}")


def extras(label: str, *, admin_port: int, redis_port: int) -> dict[str, str]:
    """The snippets of peers/veloxy.toml.tmpl for a contender: every one gets the admin endpoint
    (for its counters); the limit on the route; [server.redis] for the global one."""
    server = f'admin = "127.0.0.1:{admin_port}"'
    route = ""
    if label == LOCAL:
        route = rate_limit(None)
    elif label == GLOBAL:
        server += (f'\n[server.redis]\nurl = "redis://127.0.0.1:{redis_port}/0"\n'
                   f'timeout = "{TIMEOUT_MS}ms"')
        route = rate_limit("global")
    elif label != PLAIN:
        raise KeyError(label)
    return {"SERVER_EXTRA": server, "ROUTE_EXTRA": route}


def keys_for(rps: float | None, per_key: float = PER_KEY) -> int:
    """How many keys give each about `per_key` req/s at `rps` in total (DEFAULT_KEYS without a
    rate)."""
    if not rps or rps <= 0:
        return DEFAULT_KEYS
    return max(1, round(rps / per_key))


def outage_seconds(duration: float) -> int:
    """Length of each outage run (wrk takes whole seconds): --duration, within 2..OUTAGE_MAX_S."""
    return max(2, min(OUTAGE_MAX_S, math.ceil(duration)))


# --- Redis (a tiny RESP client: PING, DBSIZE, INFO) ----------------------------------------

class RespError(RuntimeError):
    """An error reply (`-ERR ...`) from Redis."""


def resp_encode(*args: str) -> bytes:
    """A command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def resp_parse(buf: bytes, i: int = 0) -> tuple[object, int] | None:
    """One RESP2 reply at buf[i:]: (value, index after it), or None when incomplete. Simple
    strings and bulk strings are str (a null bulk string None), integers int, arrays lists, an
    error reply a RespError (returned, not raised)."""
    end = buf.find(b"\r\n", i)
    if end < 0:
        return None
    kind, line = buf[i:i + 1], buf[i + 1:end].decode(errors="replace")
    nxt = end + 2
    if kind == b"+":
        return line, nxt
    if kind == b"-":
        return RespError(line), nxt
    if kind == b":":
        return int(line), nxt
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, nxt
        if len(buf) < nxt + n + 2:
            return None
        return buf[nxt:nxt + n].decode(errors="replace"), nxt + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, nxt
        items = []
        for _ in range(n):
            got = resp_parse(buf, nxt)
            if got is None:
                return None
            item, nxt = got
            items.append(item)
        return items, nxt
    raise ValueError(f"not a RESP reply: {buf[i:i + 40]!r}")


def redis_call(port: int, *args: str, timeout: float = 2.0) -> object:
    """One command to the Redis on 127.0.0.1:`port`; raises OSError, RespError."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(resp_encode(*args))
        buf = b""
        while True:
            got = resp_parse(buf)
            if got is not None:
                value = got[0]
                if isinstance(value, RespError):
                    raise value
                return value
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("Redis closed the connection")
            buf += chunk


def parse_info(text: str) -> dict[str, str]:
    """`INFO` output: field -> value (sections and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and ":" in line:
            k, _, v = line.partition(":")
            out[k] = v
    return out


def script_calls(info: dict[str, str]) -> int:
    """Calls of scripts (EVAL, EVALSHA and their _RO forms: veloxy's lease requests) in `INFO
    commandstats` fields (`cmdstat_evalsha: calls=N,usec=...`)."""
    n = 0
    for k, v in info.items():
        if k.startswith("cmdstat_eval"):
            for part in v.split(","):
                name, _, val = part.partition("=")
                if name == "calls":
                    n += int(val)
    return n


def redis_stats(redis: peers.Running | None) -> dict:
    """Redis' CPU ticks (its process) and script calls so far (veloxy's lease requests; None if
    it does not answer)."""
    if redis is None:
        return {"ticks": None, "leases": None}
    ticks = proc_ticks(procs.tree_pids(redis.proc.pid)) if redis.alive() else None
    try:
        info = parse_info(str(redis_call(redis.port, "INFO", "commandstats", timeout=1.0)))
        leases = script_calls(info)
    except (OSError, RespError, ValueError):
        leases = None
    return {"ticks": ticks, "leases": leases}


def start_redis(ctx) -> peers.Running:
    """redis-server on a free port, pinned to the load core(s): no persistence, loopback only."""
    port = procs.free_port()
    wd = modes.workdir(ctx, REDIS)
    cmd = [ctx.tools["redis"], "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--daemonize", "no", "--dir", str(wd)]

    def ready(run: peers.Running) -> None:
        procs.wait_port(port, run.proc, 10)
        deadline = time.monotonic() + 10
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                if redis_call(port, "PING", timeout=1.0) == "PONG":
                    return
            except (OSError, RespError) as e:
                last = str(e)
            time.sleep(0.05)
        raise StartError(f"redis-server on {port} does not answer PING ({last})")

    return modes.spawn(ctx, REDIS, cmd, wd, port, ctx.load_cpus, ready)


# --- veloxy's counters (admin /metrics) ----------------------------------------------------

def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: metric name -> the sum of its series (labels ignored)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        name = parts[0].split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(parts[1])
        except ValueError:
            continue
    return out


def scrape(admin_port: int | None) -> dict[str, float] | None:
    if not admin_port:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=3) as r:
            return parse_metrics(r.read().decode(errors="replace"))
    except (OSError, ValueError):
        return None


def counters_delta(before: dict | None, after: dict | None) -> dict[str, int | None]:
    """COUNTERS' increase between two scrapes (None where either scrape lacks it)."""
    out: dict[str, int | None] = {}
    for key, name in COUNTERS.items():
        if before is None or after is None or name not in before or name not in after:
            out[key] = None
        else:
            out[key] = int(after[name] - before[name])
    return out


# --- measurement --------------------------------------------------------------------------

def wrk_load(ctx, run: peers.Running, keys: int, *, connections: int, seconds: float) -> dict:
    return loadgen.wrk(run.base_url + "/", connections=connections, duration=seconds,
                       threads=len(ctx.load_cpus), cpus=ctx.load_cpus, script=KEYS_LUA,
                       env={"WRK_RL_KEYS": str(keys), "WRK_RL_HEADER": KEY_HEADER})


def measured_run(ctx, run: peers.Running, admin_port: int | None, redis: peers.Running | None,
                 load) -> dict:
    """measure.measured(load) plus veloxy's counters and Redis' lease requests (script calls)
    and CPU over the run."""
    m0, r0 = scrape(admin_port), redis_stats(redis)
    res = measure.measured(ctx, run, load)
    r1, m1 = redis_stats(redis), scrape(admin_port)
    res.update(counters_delta(m0, m1))
    n = res.get("requests") or 0
    leases = (r1["leases"] - r0["leases"]
              if r0["leases"] is not None and r1["leases"] is not None else None)
    ticks = r1["ticks"] - r0["ticks"] if r0["ticks"] is not None and r1["ticks"] is not None else None
    res["redis_leases"] = leases
    res["redis_leases_per_1k"] = leases * 1000 / n if leases is not None and n else None
    res["redis_cpu_us_per_req"] = ticks / CLK_TCK * 1e6 / n if ticks is not None and n else None
    cpu = res.get("cpu_us_per_req")
    res["req_per_core"] = 1e6 / cpu if cpu else None
    return res


def one_round(ctx, run: peers.Running, case: str, *, admin_port: int | None,
              redis: peers.Running, keys: int, connections: int, duration: float,
              warmup: float) -> dict:
    if warmup > 0:
        wrk_load(ctx, run, keys, connections=connections, seconds=warmup)
    res = measured_run(ctx, run, admin_port, redis,
                       lambda: wrk_load(ctx, run, keys, connections=connections, seconds=duration))
    res.update({"case": case, "connections": connections, "path": "/", "keys": keys})
    res["per_key_rps"] = res["rps"] / keys if res.get("rps") else None
    if not res.get("requests"):
        res["error"] = "no request completed"
    return res


def check_global(run: peers.Running, redis: peers.Running, timeout: float = 3.0) -> str | None:
    """Does the global contender take its leases from our Redis? A few requests with a fresh
    key (any answer will do: until the key's first lease is back, veloxy may answer 429), then
    a bucket must appear in Redis. None, or what is wrong."""
    key = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    for _ in range(3):
        req = urllib.request.Request(run.base_url + "/", headers={KEY_HEADER: key})
        try:
            with urllib.request.urlopen(req, timeout=3) as r:
                r.read()
        except urllib.error.HTTPError as e:
            e.read()
        except OSError as e:
            return f"GET / with {KEY_HEADER}: {key}: {e}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            n = redis_call(redis.port, "DBSIZE", timeout=1.0)
        except (OSError, RespError) as e:
            return f"Redis DBSIZE failed: {e}"
        if isinstance(n, int) and n > 0:
            return None
        time.sleep(0.05)
    return f"no bucket in Redis {timeout:g}s after requests with a new key (no lease taken)"


def outage(ctx, run: peers.Running, admin_port: int | None, redis: peers.Running, *,
           keys: int, seconds: int) -> dict:
    """Two runs of veloxy-rl-global under OUTAGE_CONNECTIONS connections: `up` (Redis up, the
    control) and `down` (redis-server SIGKILLed at half the run)."""
    out: dict = {"connections": OUTAGE_CONNECTIONS, "seconds": seconds, "timeout_ms": TIMEOUT_MS,
                 "keys": keys}

    def load() -> dict:
        return wrk_load(ctx, run, keys, connections=OUTAGE_CONNECTIONS, seconds=seconds)

    killed: dict = {}

    def kill() -> None:
        killed["at_s"] = round(time.monotonic() - killed["t0"], 3)
        try:
            os.killpg(redis.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            killed["note"] = "redis-server was already gone"

    timer = threading.Timer(seconds / 2, kill)

    def load_and_kill() -> dict:
        killed["t0"] = time.monotonic()
        timer.start()
        return load()

    for phase, what, fn in (("up", "Redis up (control)", load),
                            ("down", f"redis-server SIGKILLed after {seconds / 2:g}s", load_and_kill)):
        say(f"Redis outage: {GLOBAL}, {OUTAGE_CONNECTIONS} connections, {seconds}s, {what}")
        try:
            res = measured_run(ctx, run, admin_port, redis, fn)
        except loadgen.LoadError as e:
            res = {"error": str(e)}
        finally:
            if phase == "down":
                timer.cancel()
        res["per_key_rps"] = res["rps"] / keys if res.get("rps") else None
        out[phase] = res
        if phase == "down":
            try:
                redis.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                killed.setdefault("note", "redis-server did not exit after SIGKILL")
            res["redis_killed_at_s"] = killed.get("at_s")
            if killed.get("note"):
                res["note"] = killed["note"]
            if "at_s" not in killed:
                res["error"] = (res.get("error", "") + " redis-server was not killed (the run "
                                "ended first)").strip()
        say("    " + outage_line(res))
    out["verdict"] = outage_verdict(out)
    return out


def under_limit_429s(res: dict) -> int:
    """429s of a run in which each key got less than the limit's rate (refusals the limit
    should not make); 0 otherwise. veloxy's count, else wrk's non-2xx."""
    n = res.get("rate_limited")
    if n is None:
        n = res.get("non2xx") or 0
    per_key = res.get("per_key_rps")
    return n if n and per_key is not None and per_key < RATE else 0


def outage_verdict(out: dict) -> str:
    """"met" when no request of the outage run took longer than the Redis timeout (and none
    timed out or failed at the socket level); "NOT met"; or why it says nothing."""
    down = out.get("down") or {}
    if down.get("error") or not down.get("requests"):
        return "NOT measured (" + (down.get("error") or "no request completed")[:200] + ")"
    if down.get("fallbacks") == 0:
        return ("NOT exercised (veloxy decided no request by on_store_error: it did not see "
                "Redis go down)")
    mx = (down.get("latency_ms") or {}).get("max")
    if mx is None:
        return "NOT measured (no max latency)"
    if mx <= out.get("timeout_ms", TIMEOUT_MS) and not down.get("socket_errors"):
        return "met"
    return "NOT met"


# --- report -------------------------------------------------------------------------------

def one_line(r: dict) -> str:
    if r.get("error"):
        return f"error: {r['error'][:160]}"
    lat = r.get("latency_ms") or {}
    redis = ""
    if r.get("redis_leases_per_1k"):
        redis = (f", redis {r['redis_leases_per_1k']:.1f} leases/1k req, "
                 f"{fmt_us(r.get('redis_cpu_us_per_req'))}/req")
    return (f"{fmt_rate(r.get('rps'))} req/s ({fmt_rate(r.get('per_key_rps'))}/key), cpu/req "
            f"{fmt_us(r.get('cpu_us_per_req'))}, p50 {fmt_ms(lat.get('p50'))}, p99 "
            f"{fmt_ms(lat.get('p99'))}, non-2xx {r.get('non2xx', 0)} (429: "
            f"{_n(r.get('rate_limited'))}), proxy cpu {r.get('proxy_cpu_pct', 0):.0f}%, busiest "
            f"{r.get('bottleneck')}{redis}")


def outage_line(r: dict) -> str:
    if r.get("error"):
        return f"error: {r['error'][:200]}"
    lat = r.get("latency_ms") or {}
    killed = r.get("redis_killed_at_s")
    return (f"{fmt_rate(r.get('rps'))} req/s ({fmt_rate(r.get('per_key_rps'))}/key), p50 "
            f"{fmt_ms(lat.get('p50'))}, p99 "
            f"{fmt_ms(lat.get('p99'))}, max {fmt_ms(lat.get('max'))}, non-2xx "
            f"{r.get('non2xx', 0)} (429: {_n(r.get('rate_limited'))}), socket errors "
            f"{r.get('socket_errors', 0)}, on_store_error decisions {_n(r.get('fallbacks'))}, "
            f"failed Redis requests {_n(r.get('redis_errors'))}"
            + (f"; Redis killed at {killed:.2f}s" if killed is not None else ""))


def _n(v) -> str:
    return "?" if v is None else str(v)


def _sum(rs: list[dict], key: str) -> int | None:
    vals = [r.get(key) for r in rs]
    return sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None


def medians(results: dict) -> dict[str, dict[str, dict]]:
    """modes.medians_with_latency plus the median req/s per key, Redis lease requests per 1,000
    requests and Redis CPU per request, and sums over the good rounds of requests, non-2xx,
    socket errors, 429s, on_store_error decisions and failed Redis requests."""
    out = modes.medians_with_latency(results)
    for case, per in results.items():
        for label, rs in per.items():
            good = [r for r in rs if not r.get("error")]
            m = out[case][label]
            m["per_key"] = modes.median_of(good, "per_key_rps")
            m["redis_per_1k"] = modes.median_of(good, "redis_leases_per_1k")
            m["redis_us"] = modes.median_of(good, "redis_cpu_us_per_req")
            m["requests"] = sum(r.get("requests") or 0 for r in good)
            m["non2xx"] = sum(r.get("non2xx") or 0 for r in good)
            m["socket_errors"] = sum(r.get("socket_errors") or 0 for r in good)
            for key in COUNTERS:
                m[key] = _sum(good, key)
    return out


def ratios(med: dict[str, dict]) -> list[tuple[str, str, float, float | None]]:
    """(numerator, denominator, CPU per request ratio, goal) of RATIOS where both have a CPU per
    request."""
    out = []
    for num, den, goal in RATIOS:
        a, b = (med.get(num) or {}).get("cpu_us"), (med.get(den) or {}).get("cpu_us")
        if a and b:
            out.append((num, den, a / b, goal))
    return out


def summarize(ctx, args) -> str:
    results = ctx.results.get(MODE) or {}
    env = ctx.results.get(ENV) or {}
    meds = medians(results)
    rounds_n = max(1, args.rounds)
    keys = env.get("keys", "?")
    lines = [f"ratelimit-global: veloxy without a rate limit, with a local limit and with a global "
             f"limit (Redis), 1 worker each on core(s) {ctx.proxy_cpus}; wrk + 4 upstreams + "
             f"redis-server on core(s) {ctx.load_cpus}; {args.connections} connections, "
             f"{rounds_n} alternating round(s) of {args.duration:g}s (median)",
             f"limit: rate = \"{RATE}/s\", burst = {BURST}, key = \"header:{KEY_HEADER}\" (global: "
             f"Redis timeout {TIMEOUT_MS} ms, on_store_error local); requests cycle over {keys} "
             f"keys ({env.get('keys_from', '?')}), for ~{PER_KEY}/s per key"]
    lines += modes.status_lines(ctx, rounds_n)
    goals = []
    for case, per in results.items():
        if not per:
            continue
        lines.append("")
        lines.append(f"{'':17} {'req/s':>8} {'per key':>8} {'p50':>8} {'p99':>8} {'CPU/req':>8} "
                     f"{'non-2xx':>8} {'429':>6} {'leases/1k':>9} {'redis CPU':>10}  busiest   "
                     "per round (req/s / CPU us)")
        for label, rs in per.items():
            m = meds[case][label]
            r1k = "-" if m["redis_per_1k"] is None else f"{m['redis_per_1k']:.1f}"
            lines.append(f"{label:17} {fmt_rate(m['rps']):>8} {fmt_rate(m['per_key']):>8} "
                         f"{fmt_ms(m['p50']):>8} {fmt_ms(m['p99']):>8} {fmt_us(m['cpu_us']):>8} "
                         f"{m['non2xx']:>8} {_n(m['rate_limited']):>6} {r1k:>9} "
                         f"{fmt_us(m['redis_us']):>10}  {m['busiest'] or '-':9} "
                         f"{modes.per_round(rs)}")
        for num, den, r, goal in ratios(meds[case]):
            text = f"{num} CPU/req / {den} CPU/req = {r:.3f}"
            if goal is not None:
                verdict = "met" if r <= goal else "NOT met"
                text += f" (goal: at most {goal:.2f}: {verdict})"
                goals.append(f"global/local CPU {r:.3f} {verdict}")
            lines.append(text)
        g = meds[case].get(GLOBAL)
        if g and g.get("rps"):
            lines.append(f"{GLOBAL} during the rounds: on_store_error decisions "
                         f"{_n(g['fallbacks'])}, failed Redis requests {_n(g['redis_errors'])} "
                         "(expected: 0)")
        bad = [f"{lb} {m['non2xx']} non-2xx ({_n(m['rate_limited'])} x 429)"
               for lb, m in meds[case].items()
               if m["requests"] and m["non2xx"] > 0.001 * m["requests"]]
        if bad:
            lines.append("WARNING: more than 0.1% non-2xx (the limit bit: keys above "
                         f"{RATE}/s?): " + "; ".join(bad))
        lines += modes.failures(per)
    out = ctx.results.get(OUTAGE)
    if out:
        lines += ["", f"Redis outage ({GLOBAL}, {out['connections']} connections, "
                      f"{out['seconds']}s wrk each; redis-server SIGKILLed halfway through the "
                      "second run):"]
        lines.append("  Redis up:     " + outage_line(out.get("up") or {}))
        lines.append("  Redis killed: " + outage_line(out.get("down") or {}))
        mx = ((out.get("down") or {}).get("latency_ms") or {}).get("max")
        shown = "?" if mx is None or (out.get("down") or {}).get("error") else f"{mx:.2f}"
        lines.append(f"Redis outage: max latency {shown} ms (timeout {out['timeout_ms']} ms): "
                     f"{out['verdict']}")
        for phase, what in (("down", "the Redis-killed run"), ("up", "the control run")):
            n = under_limit_429s(out.get(phase) or {})
            if n:
                lines.append(f"NOTE: {n} x 429 in {what}, though each key got "
                             f"{fmt_rate((out.get(phase) or {}).get('per_key_rps'))} req/s, below "
                             f"its limit ({RATE}/s): refusals the limit should not make")
        goals.append(f"outage max latency {shown} ms {out['verdict']}")
    lines.append("")
    head = (f"goals (global limit CPU/req at most {GOAL_GLOBAL_LOCAL:.2f}x the local one; a Redis "
            f"outage adds no latency beyond the {TIMEOUT_MS} ms timeout): ")
    lines.append(head + ("; ".join(goals) if goals else "NOT measured"))
    return "\n".join(lines)


def make_charts(ctx) -> list[tuple[str, str]]:
    return modes.bar_charts(ctx, MODE, medians, LABELS, [
        ("ratelimit_cpu_per_req.png", "ratelimit-global: proxy CPU per request (1 worker)",
         "microseconds of CPU", "cpu_us", "Proxy CPU per request (ratelimit-global)",
         lambda v: f"{v:.1f}"),
        ("ratelimit_rps.png", "ratelimit-global: requests/s (1 worker)", "requests/s", "rps",
         "Requests/s per contender (ratelimit-global)", None),
        ("ratelimit_p99.png", "ratelimit-global: p99 latency", "milliseconds", "p99",
         "p99 latency per contender (ratelimit-global)", lambda v: f"{v:.2f}"),
    ])


SETTINGS = {
    PLAIN: "`[server] workers = 1`, `admin` on loopback; the suite's veloxy settings, no limit",
    LOCAL: f"as veloxy, plus the route's `{rate_limit(None)}`",
    GLOBAL: f"as veloxy, plus `{rate_limit('global')}` and `[server.redis] url = "
            f"\"redis://127.0.0.1:PORT/0\"`, `timeout = \"{TIMEOUT_MS}ms\"` (`on_store_error`: "
            "default, local)",
    REDIS: "`redis-server --port P --bind 127.0.0.1 --save \"\" --appendonly no`, pinned to the "
           "load core(s)",
}


def _md(ctx, args, text: str, made: list[tuple[str, str]]) -> str:
    env = ctx.results.get(ENV) or {}
    return modes.md(
        ctx, "ratelimit-global",
        "What a global rate limit costs over a local one (issue: \"Global rate limiting costs "
        "under 5% more CPU per request than a local limit at 1000 req/s per key, and a Redis "
        "outage adds no latency beyond `timeout` to any request\"). Three veloxy processes, one "
        "worker each, pinned to the same proxy core and measured in alternating wrk rounds "
        f"({args.connections} keep-alive connections, after a warm-up; medians): `{PLAIN}` (no "
        f"limit), `{LOCAL}` and `{GLOBAL}` (token buckets in Redis, leased ~50 ms at a time by "
        "the worker from a client thread). Every request carries `x-key: kN` cycling over "
        f"{env.get('keys', '?')} keys (`lua/ratelimit-keys.lua`; the count = the plain veloxy's "
        f"rate in a {CALIBRATE_S} s calibration run / {PER_KEY}), so each key gets about "
        f"{PER_KEY} req/s, below the limit ({RATE}/s per key): no 429 is expected. 429s come "
        "from veloxy's `veloxy_rate_limited_total` (every contender has `[server] admin` on "
        "loopback for its counters). leases/1k = Redis script calls (veloxy's lease requests, "
        "`INFO commandstats`) per 1,000 requests; redis CPU = redis-server's CPU time per "
        "request (/proc), on the load core and not part of the proxy's CPU per request.\n\n"
        "CPU per request = the proxy process tree's utime+stime over the measured run / "
        "requests (veloxy's Redis client thread included).\n\n"
        f"Redis outage: `{GLOBAL}` alone, wrk with {OUTAGE_CONNECTIONS} connections for "
        f"{env.get('outage_s', '?')} s with Redis up (control), then again with redis-server "
        "SIGKILLed halfway; max latency, p99 and non-2xx of each run, and the requests veloxy "
        "decided by `on_store_error` (`veloxy_ratelimit_store_fallbacks_total`). A killed Redis "
        "refuses connections at once; a hung one (no answer: the `timeout` path) is not "
        "exercised here.",
        text, made, SETTINGS,
        "Configs: `configs/` (veloxy from `bench/peers/veloxy.toml.tmpl` with the snippets of "
        "`harness/ratelimit.py`; redis-server's command line in `configs/redis-server/`).")


# --- the mode -----------------------------------------------------------------------------

def run(ctx, args) -> int:
    rounds_n = max(1, args.rounds)
    runner.install_tools(ctx, ["wrk", "redis"], allow=not args.no_install, builds=False,
                         build_ws=not args.no_build)
    for t in ("wrk", "redis", "veloxy", "upstream"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --vs-nginx --ratelimit: "
                             f"{ctx.tool_info[t].reason}")
    modes.one_core(ctx, LABELS)
    runner.start_upstreams(ctx)
    results: dict[str, dict[str, list]] = {MODE: {}}
    ctx.results[MODE] = results
    env = ctx.results[ENV] = {"rate": RATE, "burst": BURST, "key": f"header:{KEY_HEADER}",
                              "timeout_ms": TIMEOUT_MS, "per_key_target": PER_KEY,
                              "connections": args.connections}
    running: dict[str, peers.Running] = {}
    admin: dict[str, int] = {}
    redis = None
    try:
        try:
            redis = start_redis(ctx)
        except StartError as e:
            raise SetupError(f"redis-server failed to start: {e}") from e
        report.save_config(ctx, redis)
        ctx.peer_status[REDIS] = {"status": "ok", "reason": f"127.0.0.1:{redis.port}, core(s) "
                                                            f"{procs.cpu_list(ctx.load_cpus)}"}
        say(f"redis-server on 127.0.0.1:{redis.port} (core(s) {procs.cpu_list(ctx.load_cpus)})")
        for label in LABELS:
            admin[label] = procs.free_port()
            try:
                r = peers.start(ctx, "veloxy", extra=extras(label, admin_port=admin[label],
                                                            redis_port=redis.port))
            except StartError as e:
                hint = (" (a veloxy build without [server.redis] / rate_limit scope = \"global\"? "
                        "rebuild, or set VELOXY_BIN)" if label == GLOBAL else "")
                raise SetupError(f"{label} failed to start{hint}: {e}") from e
            r.name = label
            running[label] = r
            report.save_config(ctx, r)
            if scrape(admin[label]) is None:
                warn(f"{label}: no /metrics on its admin port {admin[label]}: no 429 counts")
        bad = check_global(running[GLOBAL], redis)
        if bad:
            raise SetupError(f"{GLOBAL} does not use Redis: {bad}")
        ctx.peer_status[GLOBAL]["reason"] = "checked: a new key's lease appeared in Redis"

        say(f"calibration: {PLAIN}, {CALIBRATE_S}s wrk, {args.connections} connections")
        try:
            cal = wrk_load(ctx, running[PLAIN], DEFAULT_KEYS, connections=args.connections,
                           seconds=CALIBRATE_S)
            keys = keys_for(cal.get("rps"))
            env["calibration_rps"] = cal.get("rps")
            env["keys_from"] = (f"{PLAIN} did {fmt_rate(cal.get('rps'))} req/s in calibration, / "
                                f"{PER_KEY}")
        except loadgen.LoadError as e:
            warn(f"calibration failed ({e}): {DEFAULT_KEYS} keys")
            keys = DEFAULT_KEYS
            env["keys_from"] = "calibration failed: the default"
        env["keys"] = keys
        say(f"{keys} keys ({env['keys_from']})")

        modes.alternate(
            ctx, results, running, {lb: (lb, {}) for lb in LABELS}, rounds_n=rounds_n,
            per_run=args.warmup + max(1, math.ceil(args.duration)) + 1,
            plan=(f"{args.connections} connections, {keys} keys, {args.duration:g}s + "
                  f"{args.warmup:g}s warm-up each"),
            one=lambda run, case: one_round(ctx, run, case, admin_port=admin.get(run.name),
                                            redis=redis, keys=keys,
                                            connections=args.connections,
                                            duration=args.duration, warmup=args.warmup),
            line=one_line, upstream=(REDIS, redis.proc, redis.log))

        if GLOBAL in running:
            for lb in (PLAIN, LOCAL):
                if lb in running:
                    peers.stop(running.pop(lb))
            env["outage_s"] = outage_seconds(args.duration)
            ctx.results[OUTAGE] = outage(ctx, running[GLOBAL], admin.get(GLOBAL), redis,
                                         keys=keys, seconds=env["outage_s"])
            ctx.peer_status[REDIS]["reason"] += "; SIGKILLed for the outage run"
            report.write_results(ctx)
    finally:
        for r in running.values():
            peers.stop(r)
        if redis is not None:
            peers.stop(redis)
    return modes.finish(ctx, args, summarize, make_charts, _md)
