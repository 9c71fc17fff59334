"""`bench/run --backends`: the cost of picking a backend in a large group, for each policy.

veloxy alone (`workers = 1`, pinned to the proxy core), two instances at a time: one whose
upstream group has 4 backends (the suite's 4 veloxy-upstream instances), one whose group has
10,000 (LARGE_PROCS veloxy-upstream processes on the load core(s), each listening on
10,000 / LARGE_PROCS ports of 127.0.0.1 with `--also` and `--ports-file`: every port is a
backend). One policy at a time, the two alternate in rounds (the first one rotates); wrk with
lua/scale-routes.lua sends GET /k{i} (one of PATHS paths at random, so `consistent_hash` on
`hash_key = "path"` spreads over the group too). Policies: round_robin, least_conn, p2c_ewma,
consistent_hash, random, round_robin and random with weights 1, 2, 3 (over the backends in
turn), and sticky (round_robin with a `sticky` cookie; wrk sends no cookie, so each request
is picked and gets its Set-Cookie).

Per round: CPU per request of the proxy (utime+stime / requests) and utime alone; per policy
the ratio 10,000 / 4 of the medians (goal: at most GOAL, i.e. within 10%). The large group
keeps `keepalive = 2` idle connections per backend (up to a few more than 10,000 upstream
connections in all: the 4-backend group has the suite's keep-alive), and every run starts
after a warm-up of at least WARMUP_MIN seconds, so that (at the rates of a release build)
nearly every backend has its connection before the measured run.

Results: ctx.results["backends"] = {"policies": [...], "rounds": {policy: {"4": [rounds],
"10000": [rounds]}}}; report.md and results.json.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from . import modes, peers, procs, report, runner, scale
from .procs import StartError
from .runner import SetupError
from .ui import fmt_s, say

LARGE = 10_000
SMALL_N = 4
LARGE_PROCS = 2  # upstream processes for the large group: 5,000 listeners + connections each
PATHS = 20_000  # distinct request paths (consistent_hash on the path)
GOAL = 1.10  # CPU per request, 10,000 backends / 4, at most
LARGE_KEEPALIVE = 2
WARMUP_MIN = 5.0  # seconds of warm-up at least, so that the large group's pool is full
POLICIES = ["round_robin", "least_conn", "p2c_ewma", "consistent_hash", "random",
            "round_robin_weighted", "random_weighted", "sticky"]
SMALL_POLICIES = ["round_robin", "consistent_hash"]


def chosen_policies(args) -> list[str]:
    """`--policies a,b` (in POLICIES, in that order as given), else the default set."""
    if not args.policies:
        return SMALL_POLICIES if args.small else POLICIES
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise SetupError(f"--policies: unknown {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def start_large(ctx, n: int) -> tuple[list[str], list]:
    """LARGE_PROCS veloxy-upstream processes listening on `n` ports in all: (addresses, procs)."""
    per = -(-n // LARGE_PROCS)
    addrs: list[str] = []
    ps = []
    for k in range(LARGE_PROCS):
        count = min(per, n - len(addrs))
        ports_file = ctx.tmp / f"large-ports-{k}.txt"
        log = ctx.tmp / f"upstream-large-{k}.log"
        cmd = [ctx.tools["upstream"], "--listen", "127.0.0.1:0", "--name", f"large{k}",
               "--also", str(count - 1), "--ports-file", str(ports_file)]
        p = procs.REGISTRY.spawn(cmd, cpus=ctx.load_cpus, log=log)
        deadline = time.monotonic() + 60
        while not (log.exists() and "listening" in log.read_text()):
            if p.poll() is not None or time.monotonic() > deadline:
                raise SetupError(f"the large group's upstream {k} did not start: {procs.tail(log)}")
            time.sleep(0.1)
        ports = ports_file.read_text().split()
        if len(ports) != count:
            raise SetupError(f"upstream {k} listens on {len(ports)} ports, not {count}")
        addrs += [f"127.0.0.1:{port}" for port in ports]
        ps.append(p)
    for a in (addrs[0], addrs[-1]):
        procs.wait_http_ok(f"http://{a}/", ps[0], timeout=10, need=1)
    return addrs, ps


def veloxy_conf(path: Path, *, port: int, servers: list[str], policy: str,
                keepalive: int) -> Path:
    """One route, one upstream group of `servers` with `policy` (POLICIES' names)."""
    weighted = policy.endswith("_weighted")
    name = policy.removesuffix("_weighted")
    if name == "sticky":
        name = "round_robin"
    if weighted:
        listed = ", ".join(f'{{ addr = "{a}", weight = {1 + i % 3} }}'
                           for i, a in enumerate(servers))
    else:
        listed = ", ".join(f'"{a}"' for a in servers)
    out = ["# bench/run --backends (harness/backends.py)", "[server]", "workers = 1", "",
           "[listeners.web]", f'addr = "127.0.0.1:{port}"', "", "[[routes]]",
           'upstream = "app"', "", "[upstreams.app]", f"servers = [{listed}]",
           f'policy = "{name}"', f"keepalive = {keepalive}"]
    if policy == "consistent_hash":
        out.append('hash_key = "path"')
    if policy == "sticky":
        out.append('sticky = { cookie = "veloxy_srv" }')
    path.write_text("\n".join(out) + "\n")
    return path


def start(ctx, policy: str, servers: list[str], keepalive: int, tag: str) -> peers.Running:
    wd = modes.workdir(ctx, f"veloxy-{tag}-{policy}")
    port = procs.free_port()
    conf = veloxy_conf(wd / "veloxy.toml", port=port, servers=servers, policy=policy,
                       keepalive=keepalive)
    cmd = [ctx.tools["veloxy"], "run", "--config", str(conf)]

    def ready(run: peers.Running) -> None:
        procs.wait_port(port, run.proc, 120)
        scale.wait_answer(port, run.proc, "b.test", "/k0", 120)

    run = modes.spawn(ctx, f"veloxy-{tag}", cmd, wd, port, ctx.proxy_cpus, ready)
    run.conf = conf
    return run


def run(ctx, args, requested: list[str]) -> int:
    modes.choose(requested, ["veloxy"], "--backends")
    runner.install_tools(ctx, ["wrk"], allow=not args.no_install, builds=False,
                         build_ws=not args.no_build)
    for t in ("wrk", "veloxy", "upstream"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --backends: {ctx.tool_info[t].reason}")
    modes.one_core(ctx, ["veloxy"])
    need = LARGE // LARGE_PROCS * 2 + 200
    if ctx.nofile < need:
        raise SetupError(f"--backends needs an open-file limit of {need} (ulimit -n is "
                         f"{ctx.nofile}): each upstream process holds a listener and a "
                         "connection per backend")
    policies = chosen_policies(args)
    runner.start_upstreams(ctx)
    small = ctx.upstreams.addrs[:SMALL_N]
    say(f"starting {LARGE:,} backends: {LARGE_PROCS} veloxy-upstream processes on core(s) "
        f"{ctx.load_cpus}")
    large, _ = start_large(ctx, LARGE)
    wd = modes.workdir(ctx, "targets")
    targets = scale.write_targets(wd / "targets.txt",
                                  [("b.test", f"/k{i}") for i in range(PATHS)])
    # Every backend used before measuring (else the large group's runs pay for connects):
    # at 10,000 requests/s, 5 s is 5 requests a backend, which leaves random draws under 1%
    # of the backends unvisited. Both groups get the same warm-up.
    warmup = max(args.warmup, WARMUP_MIN)
    data = ctx.results["backends"] = {
        "policies": policies, "rounds": {}, "large": LARGE, "small": len(small),
        "settings": {"connections": args.connections, "rounds": args.rounds,
                     "duration_s": args.duration, "warmup_s": warmup,
                     "large_keepalive": LARGE_KEEPALIVE, "keepalive": ctx.keepalive}}
    per = warmup + args.duration + 1
    say(f"--backends: {len(policies)} policies x 2 groups x {args.rounds} round(s): "
        f"~{fmt_s(len(policies) * 2 * args.rounds * per)} plus start-up")
    for policy in policies:
        running: dict[str, peers.Running] = {}
        try:
            for tag, servers, ka in (("4", small, ctx.keepalive),
                                     (str(LARGE), large, LARGE_KEEPALIVE)):
                try:
                    running[tag] = start(ctx, policy, servers, ka, tag)
                except StartError as e:
                    raise SetupError(f"veloxy with {policy} over {len(servers):,} backends "
                                     f"failed to start: {e}") from e
            results: dict[str, dict] = {policy: {}}
            modes.alternate(
                ctx, results, running, {t: (t, {}) for t in running},
                rounds_n=args.rounds, per_run=per,
                plan=f"{policy}, {args.connections} connections, {args.duration:g}s + "
                     f"{warmup:g}s warm-up each",
                one=lambda r, case: scale.one_round(ctx, r, targets,
                                                    connections=args.connections,
                                                    duration=args.duration, warmup=warmup),
                line=scale.round_line,
                upstream=("veloxy-upstream u1", ctx.upstreams.procs[0],
                          ctx.tmp / "upstream-u1.log"))
            data["rounds"][policy] = results[policy]
        finally:
            for r in running.values():
                peers.stop(r)
            report.write_results(ctx)
    return modes.finish(ctx, args, summarize, lambda ctx: [], _md)


def _median(rs: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rs if not r.get("error") and r.get(key)]
    return statistics.median(xs) if xs else None


def summarize(ctx, args) -> str:
    data = ctx.results.get("backends") or {}
    lines = [f"--backends: veloxy, 1 worker on core(s) {ctx.proxy_cpus}, one group of "
             f"{data.get('small')} and one of {data.get('large', LARGE):,} backends, "
             f"{args.connections} connections, {args.rounds} alternating round(s) of "
             f"{args.duration:g}s (median)"]
    lines += modes.status_lines(ctx, args.rounds)
    lines += ["", f"{'policy':22} {'CPU/req 4':>10} {'CPU/req 10k':>12} {'ratio':>7} "
              f"{'user 4':>8} {'user 10k':>9} {'ratio':>7}  goal (ratio <= {GOAL:.2f})"]
    for policy, per in (data.get("rounds") or {}).items():
        a, b = per.get("4") or [], per.get(str(LARGE)) or []
        c4, c10 = _median(a, "cpu_us_per_req"), _median(b, "cpu_us_per_req")
        u4, u10 = _median(a, "cpu_user_us_per_req"), _median(b, "cpu_user_us_per_req")
        ratio = c10 / c4 if c4 and c10 else None
        uratio = u10 / u4 if u4 and u10 else None
        f = lambda x: "-" if x is None else f"{x:.2f}us"  # noqa: E731
        g = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        verdict = "-" if ratio is None else ("met" if ratio <= GOAL else "NOT met")
        lines.append(f"{policy:22} {f(c4):>10} {f(c10):>12} {g(ratio):>7} {f(u4):>8} "
                     f"{f(u10):>9} {g(uratio):>7}  {verdict}")
        lines += modes.failures(per)
    return "\n".join(lines)


def _md(ctx, args, text: str, made: list[tuple[str, str]]) -> str:
    return modes.md(
        ctx, "Backend group scale",
        f"veloxy, one worker pinned to the proxy core, with one upstream group of 4 backends "
        f"and one of {LARGE:,} (ports of 127.0.0.1 served by {LARGE_PROCS} veloxy-upstream "
        f"processes), for each balancing policy; wrk (`lua/scale-routes.lua`) requests one of "
        f"{PATHS:,} paths at random (`consistent_hash` hashes the path). CPU per request = "
        "utime+stime of veloxy over the measured run / requests; alternating rounds, medians; "
        f"the goal is a ratio {LARGE:,} / 4 of at most {GOAL:.2f}. The large group keeps "
        f"`keepalive = {LARGE_KEEPALIVE}` idle connections per backend.",
        text, made, {"veloxy": "`workers = 1`; one route, one group; `policy` as named "
                               "(`_weighted`: weights 1, 2, 3 in turn; `sticky`: round_robin "
                               "with a cookie, none sent)"},
        "Configs: in the run's working directories (written by `harness/backends.py`).")
