"""`bench/run --h3`: HTTP/3 (QUIC), veloxy against Caddy, and against veloxy's own HTTP/2.

One worker each (veloxy `workers = 1`, Caddy `GOMAXPROCS=1`), both pinned to the same proxy
core and running side by side; oha (built with its `http3` feature) and the one upstream (the
workspace's veloxy-upstream) on the load core(s). Each proxy has one TLS listener with the same
self-signed certificate that serves HTTP/2 (ALPN h2) and HTTP/3 (UDP, same port number), and
the same two routes:

- fixed: GET /fixed answers a fixed 100-byte body from the proxy itself (veloxy `respond`,
  Caddy `respond`): the protocol's own cost, no upstream;
- proxy: GET / goes to the upstream (~100-byte JSON) over HTTP/1.1 keep-alive.

Contenders: veloxy-h3, veloxy-h2 (the same veloxy process, `oha --http2`), caddy-h3, caddy-h2;
the same client (oha: `-c` connections, `-p` concurrent requests on each, closed loop) for every
one, in alternating rounds (the first contender rotates each round; medians). CPU per request =
utime+stime of the proxy's process tree (/proc/PID/stat) over the measured run / requests, as in
the other modes; "per core" = 1 s / CPU per request, what one busy core of the proxy serves.

Before measuring, every contender must answer 200s over the protocol claimed: oha with
`--http-version 3` (an h3-only client: it never falls back) and `--http2`, plus a TLS handshake
offering h2 that must select h2, and a UDP socket on the port owned by the proxy's processes.
Goals: veloxy HTTP/3 CPU per request / veloxy HTTP/2 CPU per request <= 2.0; veloxy HTTP/3
requests per core >= 3x Caddy's HTTP/3.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

from . import measure, modes, peers, procs, runner
from .install import Installer, versions
from .loadgen import LoadError, parse_oha
from .measure import fmt_ms, fmt_rate, fmt_us
from .procs import StartError
from .runner import SetupError
from .ui import say, warn

H3_PEERS = ["veloxy", "caddy"]
PROTOS = ["h3", "h2"]
FIXED_PATH = "/fixed"
# 100 bytes, plain ASCII without quotes or backslashes (the same literal in TOML and Caddyfile).
BODY = ("veloxy bench h3 fixed response " * 4)[:99] + "."
CASES = {"fixed": FIXED_PATH, "proxy": "/"}
TITLES = {"fixed": f"fixed response (GET {FIXED_PATH}, 100-byte body from the proxy, no upstream)",
          "proxy": "proxied (GET / to the upstream, ~100-byte JSON, HTTP/1.1 keep-alive)"}
GOAL_H3_H2 = 2.0  # veloxy HTTP/3 CPU per request / veloxy HTTP/2 CPU per request, at most
GOAL_VS_CADDY = 3.0  # veloxy HTTP/3 requests per core / Caddy's HTTP/3, at least
TEMPLATES = {"veloxy": ("veloxy-h3.toml.tmpl", "veloxy.toml"),
             "caddy": ("Caddyfile-h3.tmpl", "Caddyfile")}
SETTINGS_NOTES = {
    "veloxy": "`[listeners.web] http3 = true` + `[listeners.web.tls] cert, key` (rustls; QUIC by "
              "quinn, HTTP/3 by h3; one SO_REUSEPORT UDP socket per worker), `workers = 1`; "
              f"`[[routes]] path_exact = \"{FIXED_PATH}\"` `respond`, `[[routes]] upstream` with "
              "`keepalive`; defaults otherwise (128 streams per connection, h2 and h3)",
    "caddy": "`servers { protocols h1 h2 h3; timeouts { idle 1s } }`, `https://127.0.0.1:PORT` "
             f"site with `bind 127.0.0.1`, `tls CERT KEY`, `respond {FIXED_PATH} ... 200`, "
             "`reverse_proxy` with keep-alive, `GOMAXPROCS=1`; defaults otherwise (quic-go, Go's "
             "TLS). `bind`: else no certificate for a QUIC client without SNI; `idle 1s`: else "
             "oha waits 30 s after each run for quic-go to close its connections",
}
ORDER = [f"{n}-{p}" for n in H3_PEERS for p in PROTOS]


# --- configs ------------------------------------------------------------------------------

def values(ctx, name: str, port: int, upstream: str, cert: dict[str, str]) -> dict[str, object]:
    """Template values for proxy `name` (bench/peers/veloxy-h3.toml.tmpl, Caddyfile-h3.tmpl)."""
    return {"WORKERS": ctx.workers, "PORT": port, "UPSTREAM": upstream, "KEEPALIVE": ctx.keepalive,
            "CERT": cert["cert"], "KEY": cert["key"], "FIXED_PATH": FIXED_PATH, "BODY": BODY}


def command(ctx, name: str, conf: Path) -> tuple[list[str], dict[str, str]]:
    if name == "veloxy":
        return [ctx.tools["veloxy"], "run", "--config", str(conf)], {}
    return ([ctx.tools["caddy"], "run", "--config", str(conf), "--adapter", "caddyfile"],
            peers._go_env(ctx, conf.parent))


def render(ctx, name: str, wd: Path, port: int, upstream: str,
           cert: dict[str, str]) -> tuple[list[str], dict[str, str], Path]:
    tmpl, fname = TEMPLATES[name]
    conf = peers.render_file(tmpl, wd / fname, values(ctx, name, port, upstream, cert))
    cmd, env = command(ctx, name, conf)
    return cmd, env, conf


# --- oha ----------------------------------------------------------------------------------

def oha_cmd(binary: str, url: str, proto: str, *, connections: int, streams: int,
            duration: float, timeout_s: float = 4) -> list[str]:
    """oha, closed loop (no -q) for `duration` seconds (whole, at least 1): `connections`
    connections with `streams` concurrent requests each, HTTP/3 (`--http-version 3`: QUIC only,
    no fallback) or HTTP/2 (`--http2`, ALPN h2), self-signed certificate accepted, no
    Accept-Encoding, JSON summary."""
    cmd = [binary, "-z", f"{whole(duration)}s", "-c", str(connections), "-p", str(streams),
           "--no-tui", "--output-format", "json", "--insecure", "--disable-compression",
           "-t", f"{timeout_s:g}s"]
    cmd += ["--http-version", "3"] if proto == "h3" else ["--http2"]
    cmd.append(url)
    return cmd


def whole(duration: float) -> int:
    return max(1, math.ceil(duration))


def oha_run(binary: str, url: str, proto: str, *, cpus: list[int], connections: int,
            streams: int, duration: float, timeout_s: float = 4, grace: float = 40,
            on_deadline=None) -> dict:
    """oha_cmd() pinned on `cpus`; `on_deadline()` is called when its `-z` time is up (or when
    it exits, if earlier): the end of a measurement window. oha then closes its connections
    politely (HTTP/3: GOAWAY, then it waits for the server to close each QUIC connection) and
    prints its summary. quic-go (Caddy) does not close on a client's GOAWAY: Caddy closes idle
    HTTP/3 connections after its `idle` timeout (1 s in Caddyfile-h3.tmpl; Caddy 2.6 ignores it
    for HTTP/3 and oha waits for the 30 s QUIC idle timeout), so oha gets `grace` seconds after
    its deadline (it does not act on SIGINT in that state). Requests/s are taken over the `-z`
    time, not oha's total (which counts that wait)."""
    cmd = oha_cmd(binary, url, proto, connections=connections, streams=streams,
                  duration=duration, timeout_s=timeout_s)
    env = dict(os.environ, TOKIO_WORKER_THREADS=str(max(1, len(cpus))))
    t0 = time.monotonic()
    try:
        p = subprocess.Popen(procs.pinned(cmd, cpus), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, start_new_session=True,
                             stdin=subprocess.DEVNULL)
    except OSError as e:
        raise LoadError(f"cannot execute oha: {e}") from e
    procs.REGISTRY.procs.append(p)
    try:
        deadline = t0 + whole(duration)
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if on_deadline is not None:
            on_deadline()
        try:
            out, err = p.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            procs.REGISTRY.stop(p, grace=1.0)
            raise LoadError(f"oha still running {grace:.0f}s after its deadline (waiting for the "
                            "server to close its connections?)") from None
    except BaseException:
        procs.REGISTRY.stop(p, grace=0.5)
        raise
    finally:
        if p in procs.REGISTRY.procs:
            procs.REGISTRY.procs.remove(p)
    shutdown_s = time.monotonic() - deadline
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    if p.returncode != 0:
        raise LoadError(f"oha exited {p.returncode}: {(err or out)[-600:]}")
    try:
        res = parse_oha(out)
    except (ValueError, KeyError) as e:
        raise LoadError(f"cannot parse oha output ({e}): {(out or err)[-400:]}") from e
    # Every response came within the -z time; oha's total also counts its shutdown.
    dur = min(res["duration_s"], float(whole(duration)))
    res["oha_total_s"] = res["duration_s"]
    res["duration_s"] = dur
    codes = res.get("status_codes") or {}
    res["rps"] = sum(codes.values()) / dur
    res["ok_rps"] = sum(v for k, v in codes.items() if k.startswith("2")) / dur
    res["protocol"] = proto
    res["oha_shutdown_s"] = round(max(0.0, shutdown_s), 2)
    return res


# --- probes -------------------------------------------------------------------------------

def udp_inodes(port: int, tables: tuple[str, ...] = ("/proc/net/udp", "/proc/net/udp6")) -> set[str]:
    """Socket inodes of the UDP sockets bound to local port `port` (any address)."""
    out = set()
    for t in tables:
        try:
            lines = Path(t).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(f[9])
    return out


def owned_sockets(pids: list[int], inodes: set[str]) -> int:
    """How many of `inodes` are open in the processes `pids`."""
    want = {f"socket:[{i}]" for i in inodes}
    seen = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link in want:
                seen.add(link)
    return len(seen)


def selected_alpn(port: int, offer: tuple[str, ...] = ("h2", "http/1.1"),
                  timeout: float = 5) -> str | None:
    """The ALPN protocol 127.0.0.1:port selects among `offer` (TLS, no verification)."""
    c = ssl.create_default_context()
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    c.set_alpn_protocols(list(offer))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw, \
            c.wrap_socket(raw, server_hostname="localhost") as s:
        return s.selected_alpn_protocol()


def check_answers(res: dict, fixed: bool) -> str | None:
    """None when an oha probe got only 200s (at least 10), no failed request and, for the fixed
    route, exactly BODY's length per response; else what is wrong."""
    codes = res.get("status_codes") or {}
    ok = codes.get("200", 0)
    if ok >= 10 and set(codes) == {"200"} and not res.get("socket_errors"):
        if fixed and res.get("bytes") != ok * len(BODY):
            return f"{res.get('bytes')} body bytes for {ok} responses, not {ok} x {len(BODY)}"
        if not res.get("bytes"):
            return "200s with no body"
        return None
    errs = "; ".join(f"{k} x{v}" for k, v in (res.get("errors_detail") or {}).items()
                     if "deadline" not in k)
    return f"{ok} answered 200 (statuses {codes or 'none'}{'; errors: ' + errs if errs else ''})"


def verify(ctx, run, oha: str) -> str | None:
    """None when `run` answers GET on every case over HTTP/3 and HTTP/2 (oha, 1 s each),
    selects h2 by ALPN and owns a UDP socket on its port; else what is wrong."""
    try:
        alpn = selected_alpn(run.port)
    except OSError as e:
        return f"TLS handshake offering h2 failed: {e}"
    if alpn != "h2":
        return f"ALPN offering h2, http/1.1 selected {alpn!r}, not h2"
    deadline = time.monotonic() + 5
    while True:
        n = owned_sockets(run.pids(), udp_inodes(run.port))
        if n or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not n:
        return f"no UDP socket on port {run.port} owned by the proxy (HTTP/3 not listening)"
    run.udp_sockets = n
    for case, path in CASES.items():
        for proto in PROTOS:
            try:
                res = oha_run(oha, run.base_url + path, proto, cpus=ctx.load_cpus, connections=2,
                              streams=1, duration=1, timeout_s=2)
            except LoadError as e:
                return f"{proto} GET {path}: {e}"
            bad = check_answers(res, case == "fixed")
            if bad:
                return f"{proto} GET {path} ({case}): {bad}"
    return None


# --- processes ----------------------------------------------------------------------------

def start_proxy(ctx, name: str, upstream: str, cert: dict[str, str]) -> peers.Running:
    wd = modes.workdir(ctx, f"{name}-h3")
    port = procs.free_port()
    cmd, env, conf = render(ctx, name, wd, port, upstream, cert)
    if name == "veloxy":  # a crisp error for a veloxy build without http3
        modes.veloxy_check(ctx, conf, "the HTTP/3 config", "http3")
    timeout = peers.STARTUP_TIMEOUT.get(name, 15)

    def ready(run: peers.Running) -> None:
        procs.wait_port(port, run.proc, timeout)
        procs.wait_http_ok(run.base_url + FIXED_PATH, run.proc, timeout)

    return modes.spawn(ctx, name, cmd, wd, port, ctx.proxy_cpus, ready, env=env, scheme="https")


def udp_buffers() -> dict[str, int | None]:
    """The kernel's socket buffer ceilings (quinn and quic-go ask for more than the default)."""
    out: dict[str, int | None] = {}
    for k in ("rmem_max", "wmem_max", "rmem_default", "wmem_default"):
        try:
            out[k] = int(Path(f"/proc/sys/net/core/{k}").read_text())
        except (OSError, ValueError):
            out[k] = None
    return out


# --- measurement --------------------------------------------------------------------------

def one_round(ctx, run, oha: str, case: str, proto: str, *, connections: int, streams: int,
              duration: float, warmup: float) -> dict:
    url = run.base_url + CASES[case]
    kw = dict(cpus=ctx.load_cpus, connections=connections, streams=streams)
    if warmup > 0:
        oha_run(oha, url, proto, duration=warmup, **kw)
    # The measured window ends at oha's deadline, not after its shutdown.
    res = measure.measured(ctx, run, lambda stop: oha_run(oha, url, proto, duration=duration,
                                                          on_deadline=stop, **kw), window=True)
    res.update({"connections": connections, "streams": streams, "path": CASES[case],
                "case": case, "protocol": proto})
    cpu = res.get("cpu_us_per_req")
    res["req_per_core"] = 1e6 / cpu if cpu else None
    ok = (res.get("status_codes") or {}).get("200", 0)
    if not ok:
        res["error"] = "no request answered 200"
    return res


def run(ctx, args, requested: list[str]) -> int:
    rounds_n = max(1, args.rounds)
    streams = max(1, getattr(args, "streams", 1) or 1)
    wanted = modes.choose(requested, H3_PEERS, "--h3")
    allow = not args.no_install
    # Caddy as in the other modes: the cached `go install ...@latest` build (made now if
    # missing and installs are allowed), else Debian's (whose HTTP/3 may not work with oha's).
    runner.install_tools(ctx, ["caddy"] if "caddy" in wanted else [], allow=allow, builds=allow,
                         build_ws=not args.no_build)
    inst = Installer(ctx.cache, allow_install=allow)
    oha_tool = inst.oha_h3()
    ctx.tool_info["oha-h3"] = oha_tool
    ctx.versions = versions(ctx.tool_info)
    for t in ("veloxy", "upstream"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --h3: {ctx.tool_info[t].reason}")
    if not oha_tool.ok:
        raise SetupError(f"oha with HTTP/3 is required for --h3: {oha_tool.reason}")
    oha = oha_tool.path
    if not shutil.which("openssl"):
        raise SetupError("openssl is required for --h3 (the certificate)")
    modes.one_core(ctx, wanted)
    ctx.n_upstreams = 1
    if "caddy" in wanted and "caddy" not in ctx.tools:
        ctx.peer_status["caddy"] = {"status": "skipped", "reason": ctx.tool_info["caddy"].reason}
        warn(f"caddy skipped: {ctx.tool_info['caddy'].reason}")

    from scenarios import tls  # the tls scenario's openssl helper

    try:
        cert = tls.make_cert(ctx.tmp / "tls")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"cannot make the certificate (openssl): {e}") from e
    shutil.copy2(cert["cert"], ctx.outdir / "tls-cert.pem")
    try:
        up_proc, up_addr = peers.start_upstream(ctx.tools["upstream"], "u1", ctx.load_cpus, ctx.tmp)
    except StartError as e:
        raise SetupError(f"the upstream failed to start: {e}") from e
    ctx.upstreams = peers.Upstreams(addrs=[up_addr], procs=[up_proc])
    say(f"upstream (veloxy-upstream) on core(s) {procs.cpu_list(ctx.load_cpus)}: {up_addr}")
    ctx.results["h3_env"] = {"udp_buffers": udp_buffers(), "body_bytes": len(BODY),
                             "oha": oha, "streams": streams}

    def check(r: peers.Running) -> str | None:
        bad = verify(ctx, r, oha)
        if not bad:
            ctx.peer_status[r.name]["reason"] = (f"h3 (UDP, {r.udp_sockets} socket(s)) and h2 "
                                                 "(ALPN) checked: 200s on every case")
            say(f"{r.name}: HTTP/3 and HTTP/2 answer on 127.0.0.1:{r.port} "
                f"({r.udp_sockets} UDP socket(s))")
        return bad

    running: dict[str, peers.Running] = {}
    results: dict[str, dict[str, list]] = {c: {} for c in CASES}
    ctx.results["h3"] = results
    try:
        modes.start_checked(ctx, wanted, running, lambda name: start_proxy(ctx, name, up_addr, cert),
                            check, variant="h3", failing="does not answer as claimed",
                            status="protocol check failed")
        modes.alternate(
            ctx, results, running,
            {f"{n}-{p}": (n, {"protocol": p}) for n in wanted if n in running for p in PROTOS},
            rounds_n=rounds_n,
            # + oha's shutdown (up to 1.5 s after its deadline: see oha_run) after each oha run
            per_run=(whole(args.warmup) + 1.5 if args.warmup > 0 else 0) + whole(args.duration) + 2,
            plan=(f"{args.connections} connections x {streams} stream(s), {args.duration:g}s + "
                  f"{args.warmup:g}s warm-up each"),
            one=lambda run, case, protocol: one_round(
                ctx, run, oha, case, protocol, connections=args.connections, streams=streams,
                duration=args.duration, warmup=args.warmup),
            line=one_line, upstream=("the upstream", up_proc, ctx.tmp / "upstream-u1.log"))
    finally:
        for r in running.values():
            peers.stop(r)
        procs.REGISTRY.stop(up_proc)
    return modes.finish(ctx, args, summarize, make_charts, _md)


# --- report -------------------------------------------------------------------------------

def one_line(r: dict) -> str:
    if r.get("error"):
        return f"error: {r['error'][:160]}"
    lat = r.get("latency_ms") or {}
    return (f"{fmt_rate(r.get('rps'))} req/s, errors {r.get('errors', 0)}, cpu/req "
            f"{fmt_us(r.get('cpu_us_per_req'))} ({fmt_rate(r.get('req_per_core'))}/core), p50 "
            f"{fmt_ms(lat.get('p50'))}, p99 {fmt_ms(lat.get('p99'))}, proxy cpu "
            f"{r.get('proxy_cpu_pct', 0):.0f}%, busiest {r.get('bottleneck')}")


def medians(results: dict) -> dict[str, dict[str, dict]]:
    """case -> contender -> median req/s, CPU us per request, requests per core, p50, p99,
    proxy CPU %, errors (sum), most frequent busiest core, rounds ok."""
    return modes.medians_with_latency(results)


def _get(med: dict, label: str, key: str) -> float | None:
    return (med.get(label) or {}).get(key)


def h3_h2_ratio(med: dict, name: str = "veloxy") -> float | None:
    """`name`'s HTTP/3 CPU per request / its HTTP/2 CPU per request."""
    a, b = _get(med, f"{name}-h3", "cpu_us"), _get(med, f"{name}-h2", "cpu_us")
    return a / b if a and b else None


def vs_caddy(med: dict, key: str = "per_core") -> float | None:
    """veloxy-h3 / caddy-h3 on `key` (per_core: requests per CPU-second; rps: requests/s)."""
    a, b = _get(med, "veloxy-h3", key), _get(med, "caddy-h3", key)
    return a / b if a and b else None


def summarize(ctx, args) -> str:
    results = ctx.results.get("h3") or {}
    meds = medians(results)
    rounds_n = max(1, args.rounds)
    streams = (ctx.results.get("h3_env") or {}).get("streams", getattr(args, "streams", 1))
    lines = [f"HTTP/3 vs HTTP/2 (veloxy) and vs Caddy: 1 worker each on core(s) {ctx.proxy_cpus}, "
             f"oha + the upstream on core(s) {ctx.load_cpus}, {args.connections} connections x "
             f"{streams} concurrent request(s), {rounds_n} alternating round(s) of "
             f"{args.duration:g}s (median)"]
    lines += modes.status_lines(ctx, rounds_n)
    goals = []
    for case, per in results.items():
        lines.append("")
        lines.append(TITLES[case])
        lines.append(f"{'':10} {'req/s':>9} {'CPU/req':>9} {'req/s/core':>11} {'p50':>8} {'p99':>8} "
                     f"{'proxy%':>7} {'errors':>7}  busiest   per round (req/s / CPU us)")
        for label, rs in per.items():
            m = meds[case][label]
            per_round = modes.per_round(rs)
            cpu = "-" if m["cpu_pct"] is None else f"{m['cpu_pct']:.0f}%"
            lines.append(f"{label:10} {fmt_rate(m['rps']):>9} {fmt_us(m['cpu_us']):>9} "
                         f"{fmt_rate(m['per_core']):>11} {fmt_ms(m['p50']):>8} {fmt_ms(m['p99']):>8} "
                         f"{cpu:>7} {m['errors']:>7}  {m['busiest'] or '-':9} {per_round}")
        r = h3_h2_ratio(meds[case])
        if r is not None:
            met = r <= GOAL_H3_H2
            lines.append(f"veloxy HTTP/3 CPU/req / veloxy HTTP/2 CPU/req = {r:.2f} "
                         f"(goal <= {GOAL_H3_H2:.1f}: {'met' if met else 'NOT met'})")
            goals.append(f"{case} h3/h2 CPU {r:.2f} {'met' if met else 'NOT met'}")
        rc = h3_h2_ratio(meds[case], "caddy")
        if rc is not None:
            lines.append(f"caddy HTTP/3 CPU/req / caddy HTTP/2 CPU/req = {rc:.2f}")
        v = vs_caddy(meds[case])
        if v is not None:
            met = v >= GOAL_VS_CADDY
            raw = vs_caddy(meds[case], "rps")
            raw_s = f"{raw:.2f}x" if raw else "-"
            lines.append(f"veloxy HTTP/3 / caddy HTTP/3 requests per core = {v:.2f}x "
                         f"(goal >= {GOAL_VS_CADDY:.1f}x: {'met' if met else 'NOT met'}); "
                         f"requests/s {raw_s}")
            goals.append(f"{case} vs caddy {v:.2f}x {'met' if met else 'NOT met'}")
        lines += modes.failures(per)
    if goals:
        lines.append("")
        lines.append(f"goals (h3/h2 CPU <= {GOAL_H3_H2:.1f}; vs caddy h3 per core >= "
                     f"{GOAL_VS_CADDY:.1f}x): " + "; ".join(goals))
    return "\n".join(lines)


def make_charts(ctx) -> list[tuple[str, str]]:
    return modes.bar_charts(ctx, "h3", medians, ORDER, [
        ("h3_rps.png", "HTTP/3 and HTTP/2: requests/s (1 core each)", "requests/s", "rps",
         "Requests/s per contender (h3)", None),
        ("h3_cpu_per_req.png", "HTTP/3 and HTTP/2: proxy CPU per request", "microseconds of CPU",
         "cpu_us", "Proxy CPU per request (h3)", lambda v: f"{v:.1f}"),
        ("h3_per_core.png", "Requests per core (1 s / CPU per request)", "requests/s per core",
         "per_core", "Requests per core (h3)", None),
    ])


def _md(ctx, args, text: str, made: list[tuple[str, str]]) -> str:
    env = ctx.results.get("h3_env") or {}
    bufs = ", ".join(f"{k} {v}" for k, v in (env.get("udp_buffers") or {}).items())
    return modes.md(
        ctx, "HTTP/3",
        "veloxy and Caddy, 1 worker each (`workers = 1`, `GOMAXPROCS=1`) on the same proxy "
        "core, each with one TLS listener (the same self-signed ECDSA P-256 certificate, "
        "`tls-cert.pem`) serving HTTP/2 and HTTP/3 (UDP, same port number). oha (built with "
        "`--features http3`) is the client for both protocols: closed loop, `-c` connections "
        "with `-p` concurrent requests each, `--http-version 3` (QUIC only, no fallback) or "
        f"`--http2`, `--insecure`, `--disable-compression`. Cases: `GET {FIXED_PATH}` (a "
        f"{len(BODY)}-byte body answered by the proxy: the protocol's cost) and `GET /` "
        "proxied to one veloxy-upstream (~100-byte JSON, HTTP/1.1 keep-alive) on the load "
        "core. Before measuring, each proxy answered 200s over h3 and h2 on both paths, "
        "selected h2 by ALPN and owned a UDP socket on its port.\n\n"
        "CPU per request = the proxy process tree's utime+stime over the measured run / "
        "requests; requests per core = 1 s / CPU per request (what one fully busy core "
        "serves at that cost; equal to requests/s when the proxy's core is the bottleneck). "
        "Where the busiest core is the load core (oha's QUIC client is expensive), the "
        "proxies run below 100% of their core and requests/s measure the client; compare "
        "CPU per request and requests per core there. Goals: veloxy HTTP/3 CPU per request "
        f"/ veloxy HTTP/2 CPU per request <= {GOAL_H3_H2:.1f}; veloxy HTTP/3 requests per core "
        f">= {GOAL_VS_CADDY:.1f}x Caddy's HTTP/3.",
        text, made, SETTINGS_NOTES,
        "Configs: `configs/` (rendered from `bench/peers/veloxy-h3.toml.tmpl` and "
        "`bench/peers/Caddyfile-h3.tmpl`). Kernel socket buffer limits (net.core, bytes; "
        f"left as they are, the same for both): {bufs or '?'}.")
