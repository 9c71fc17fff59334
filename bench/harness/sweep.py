"""`bench/run --sweep`: veloxy, nginx and HAProxy (one worker each on the same core, the same 4
upstreams) across connection counts, then a fixed-rate ramp at fractions of each proxy's own
ceiling. Issue 18's tables: requests/s, p99, p99.9 and CPU per request at 64, 256, 1000, 4000
and 10000 connections (alternating wrk rounds, medians), and the latency-corrected p99 at a
fixed rate of 25/50/75/90% of each proxy's ceiling (its median wrk requests/s at the smallest
connection count), and at the same rates for all (those fractions of the lowest ceiling), each
step the median of rotating rounds. The fixed-rate generator is bench/pacer (oha when pacer
cannot be built: oha's own core filled from about half the ceilings up). A step where the
generator fell behind its rate with its core full is marked: its latency is the generator's
queue.

The machine's hard limit on open files (20000 here) bounds the largest count: wrk holds one
descriptor per connection and the proxy one per client plus its upstream pool, each in its own
process, so 10000 fits; a count the limit cannot hold is skipped and said so in the report.
"""

from __future__ import annotations

import statistics

from . import charts as ch
from . import measure, modes, peers, procs, report, runner
from .loadgen import LoadError
from .measure import fmt_ms, fmt_rate, fmt_us
from .procs import StartError
from .runner import SetupError
from .ui import fmt_s, say, warn

SWEEP_PEERS = ["veloxy", "nginx", "haproxy"]
DEFAULT_COUNTS = [64, 256, 1000, 4000, 10000]
RAMP_FRACTIONS = [0.25, 0.5, 0.75, 0.9]
RAMP_CONNECTIONS = 64
# Descriptors a proxy or wrk needs beside one per connection (listeners, upstream pools, logs).
FD_SLACK = 600


def counts(args) -> list[int]:
    spec = getattr(args, "sweep_connections", None)
    if not spec:
        return list(DEFAULT_COUNTS)
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError as e:
        raise SetupError(f"--sweep-connections wants a comma list of numbers: {spec!r}") from e
    if not out or min(out) < 1:
        raise SetupError(f"--sweep-connections wants positive numbers: {spec!r}")
    return out


def _med(rs: list[dict], key) -> float | None:
    vals = [v for v in (key(r) for r in rs if not r.get("error")) if v is not None]
    return statistics.median(vals) if vals else None


def _p(r: dict, q: str) -> float | None:
    return (r.get("latency_ms") or {}).get(q)


def _round(ctx, args, running, names, n: int, i: int) -> None:
    for name in names[i % len(names):] + names[:i % len(names)]:  # rotate who goes first
        say(f"  {n} connections, round {i + 1}/{args.rounds}: {name}")
        try:
            r = measure.wrk(ctx, running[name], "/", connections=n, duration=args.duration,
                            warmup=args.warmup, timeout_s=8)
        except LoadError as e:
            r = {"error": str(e)}
        r["round"] = i + 1
        ctx.results["sweep"].setdefault(str(n), {}).setdefault(name, []).append(r)
        say("    " + report.one_line(r))
        if not running[name].alive():
            raise SetupError(f"{name} exited at {n} connections: {procs.tail(running[name].log)}")


# A ramp step whose load-generator core was this busy measured the generator, not the proxy.
GENERATOR_BUSY_PCT = 95


def _step(ctx, args, run, rate: float, fraction: float) -> dict:
    """One fixed-rate run: pacer when it could be built (it keeps up where oha fell behind),
    else oha."""
    try:
        if "pacer" in ctx.tools:
            r = measure.pacer(ctx, run, "/", rate=rate, connections=RAMP_CONNECTIONS,
                              duration=args.duration, warmup=1)
        else:
            r = measure.oha(ctx, run, "/", rate=rate, connections=RAMP_CONNECTIONS,
                            duration=args.duration)
    except LoadError as e:
        return {"error": str(e), "fraction": fraction}
    busy = (r.get("core_busy") or {})
    r["load_busy_pct"] = max((busy.get(str(c), 0.0) for c in ctx.load_cpus), default=0.0)
    r["proxy_busy_pct"] = max((busy.get(str(c), 0.0) for c in ctx.proxy_cpus), default=0.0)
    # The generator behind its schedule with its own core full: the latency is its queue.
    r["generator_bound"] = (r["load_busy_pct"] >= GENERATOR_BUSY_PCT
                            and r["rps"] < 0.97 * rate)
    r["fraction"] = fraction
    r.pop("samples", None)
    return r


def _ramp_cell(rounds: list[dict], fraction: float) -> dict:
    """One ramp step over its rounds: median p99 and p99.9; generator-bound when most were."""
    ok = [r for r in rounds if not r.get("error")]
    cell = {"fraction": fraction, "rounds": rounds}
    if not ok:
        cell["error"] = rounds[-1].get("error", "failed")
        return cell
    cell["latency_ms"] = {q: _med(ok, lambda r, q=q: _p(r, q)) for q in ("p50", "p99", "p99.9")}
    cell["p99_rounds"] = [_p(r, "p99") for r in ok]
    cell["rps"] = _med(ok, lambda r: r["rps"])
    cell["cpu"] = _med(ok, lambda r: r.get("cpu_us_per_req"))
    cell["proxy_core_busy"] = _med(ok, lambda r: r.get("proxy_busy_pct"))
    cell["generator_bound"] = 2 * sum(1 for r in ok if r.get("generator_bound")) > len(ok)
    return cell


def _ramp(ctx, args, running, names) -> None:
    """Two ramps: at fractions of each proxy's own ceiling (each proxy as loaded as the others,
    relative to what it can do), and at the same rates for all (fractions of the lowest
    ceiling: the latency each gives at one offered load). Each step runs `args.rounds` times,
    the proxies in rotating order, and reports the medians."""
    low = str(min(int(k) for k in ctx.results["sweep"]))
    ramp = ctx.results["ramp"] = {}
    same = ctx.results["ramp_same"] = {}
    ctx.results["ramp_tool"] = "pacer" if "pacer" in ctx.tools else "oha"
    for name in names:
        ceiling = _med(ctx.results["sweep"][low].get(name, []), lambda r: r["rps"])
        if not ceiling:
            ramp[name] = {"error": f"no ceiling at {low} connections"}
            continue
        ramp[name] = {"ceiling": ceiling, "steps": []}
    ok = [n for n in names if "ceiling" in ramp[n]]
    base = min(ramp[n]["ceiling"] for n in ok) if ok else None
    if len(ok) > 1:
        same.update({n: {"base": base, "steps": []} for n in ok})
    for f in RAMP_FRACTIONS:
        own: dict[str, list] = {n: [] for n in ok}
        fixed: dict[str, list] = {n: [] for n in same}
        for i in range(args.rounds):
            for name in ok[i % len(ok):] + ok[:i % len(ok)]:
                ceiling = ramp[name]["ceiling"]
                say(f"  ramp {name}: {int(f * 100)}% of {fmt_rate(ceiling)}, "
                    f"round {i + 1}/{args.rounds}")
                own[name].append(_step(ctx, args, running[name], ceiling * f, f))
                if name in same:
                    say(f"  same-rate ramp {name}: {fmt_rate(base * f)}")
                    fixed[name].append(_step(ctx, args, running[name], base * f, f))
        for name in ok:
            ramp[name]["steps"].append(_ramp_cell(own[name], f))
        for name in same:
            same[name]["steps"].append(_ramp_cell(fixed[name], f))


def run(ctx, args, requested: list[str]) -> int:
    names = modes.choose(requested, SWEEP_PEERS, "--sweep")
    runner.install_tools(ctx, ["wrk", "oha", "pacer", *names], allow=not args.no_install,
                         builds=True, build_ws=not args.no_build)
    for t in ("wrk", "upstream", *names):
        if t not in ctx.tools:
            if t in ("wrk", "upstream", "veloxy"):
                raise SetupError(f"{t} is required for --sweep: {ctx.tool_info[t].reason}")
            warn(f"{t} left out: {ctx.tool_info[t].reason}")
            names.remove(t)
    modes.one_core(ctx, names)
    wanted = counts(args)
    ok = [n for n in wanted if n + FD_SLACK <= ctx.nofile]
    ctx.results["sweep_skipped"] = {str(n): f"ulimit -n {ctx.nofile} cannot hold it"
                                    for n in wanted if n not in ok}
    for n, why in ctx.results["sweep_skipped"].items():
        warn(f"{n} connections skipped: {why}")
    # The peers may use every descriptor: the clients of the largest count plus their upstream
    # connections (nginx's worker_connections counts both); running out is an error they report.
    ctx.maxconn = max(1024, ctx.nofile - FD_SLACK)
    runner.start_upstreams(ctx)
    running = {}
    ctx.results["sweep"] = {}
    try:
        for name in names:
            try:
                running[name] = peers.start(ctx, name)
            except StartError as e:
                raise SetupError(f"{name} failed to start: {e}") from e
            report.save_config(ctx, running[name])
        per = (args.warmup + args.duration + 1) * len(names)
        total = per * args.rounds * len(ok) + 2 * (args.duration + 2) * len(names) * len(
            RAMP_FRACTIONS) * args.rounds
        say(f"sweep {ok} x {names}, {args.rounds} rounds of {args.duration:g}s: ~{fmt_s(total)}")
        for n in ok:
            for i in range(args.rounds):
                _round(ctx, args, running, names, n, i)
        if "pacer" in ctx.tools or "oha" in ctx.tools:
            _ramp(ctx, args, running, names)
        else:
            ctx.results["ramp"] = {"error": ctx.tool_info["oha"].reason}
    finally:
        for r in running.values():
            peers.stop(r)
    text = summarize(ctx, args)
    print("\n" + text, flush=True)
    _charts(ctx)
    (ctx.outdir / "report.md").write_text(_md(ctx, args, text))
    report.write_results(ctx)
    say(f"report: {ctx.outdir / 'report.md'}")
    return 0


def medians(ctx) -> dict[str, dict[str, dict]]:
    """connections -> proxy -> {rps, p99, p999, cpu, errors} (medians over the rounds)."""
    out: dict[str, dict[str, dict]] = {}
    for n, per in ctx.results.get("sweep", {}).items():
        for name, rs in per.items():
            out.setdefault(n, {})[name] = {
                "rps": _med(rs, lambda r: r["rps"]),
                "p99": _med(rs, lambda r: _p(r, "p99")),
                "p999": _med(rs, lambda r: _p(r, "p99.9")),
                "cpu": _med(rs, lambda r: r.get("cpu_us_per_req")),
                "errors": sum(r.get("socket_errors", 0) + r.get("non2xx", 0) for r in rs
                              if not r.get("error")),
                "failed_rounds": sum(1 for r in rs if r.get("error")),
            }
    return out


def summarize(ctx, args) -> str:
    med = medians(ctx)
    names = sorted({p for per in med.values() for p in per}, key=SWEEP_PEERS.index)
    lines = [f"sweep: 1 worker each on core(s) {ctx.proxy_cpus}, wrk + 4 upstreams on core(s) "
             f"{ctx.load_cpus}, {args.rounds} rotating rounds of {args.duration:g}s (median)",
             "connections  proxy      req/s      p99    p99.9   CPU/req  errors  "
             "nginx CPU/req / veloxy's"]
    for n in sorted(med, key=int):
        row = med[n]
        for name in names:
            m = row.get(name)
            if not m:
                continue
            ratio = ""
            if name == "veloxy" and row.get("nginx", {}).get("cpu") and m["cpu"]:
                ratio = f"{row['nginx']['cpu'] / m['cpu']:.2f}"
                if row.get("haproxy", {}).get("cpu"):
                    ratio += f" (HAProxy's: {row['haproxy']['cpu'] / m['cpu']:.2f})"
            fails = f" ({m['failed_rounds']} failed)" if m["failed_rounds"] else ""
            lines.append(f"{n:>11}  {name:8} {fmt_rate(m['rps']):>8} {fmt_ms(m['p99']):>8} "
                         f"{fmt_ms(m['p999']):>8} {fmt_us(m['cpu']):>9} {m['errors']:>7}"
                         f"{fails}  {ratio}")
    for n, why in (ctx.results.get("sweep_skipped") or {}).items():
        lines.append(f"{n:>11}  skipped: {why}")
    ramp = ctx.results.get("ramp") or {}
    if "error" in ramp:
        lines.append(f"ramp: {ramp['error']}")
    elif ramp:
        tool = ctx.results.get("ramp_tool", "oha")
        lines.append(f"ramp ({tool}, {RAMP_CONNECTIONS} connections, fixed rate with latency "
                     f"correction, median of {args.rounds} rotating rounds, at fractions of "
                     "each proxy's own ceiling): p99")
        lines += _ramp_table(ramp, "ceiling")
        same = ctx.results.get("ramp_same") or {}
        if same:
            base = next(iter(same.values()))["base"]
            lines.append(f"same-rate ramp (the same offered rates for every proxy: fractions of "
                         f"the lowest ceiling, {fmt_rate(base)}): p99")
            lines += _ramp_table(same, "base")
            lines.append("same-rate ramp: the proxy's CPU per request (it falls as the load "
                         "rises: fewer wake-ups per request)")
            lines += _ramp_table(same, "base", cpu=True)
        if any(st.get("generator_bound") for r in [*ramp.values(), *same.values()]
               for st in r.get("steps", [])):
            lines.append(f"* {tool} fell behind its rate with its core >= {GENERATOR_BUSY_PCT}% "
                         "busy: that p99 is the load generator's queue, not the proxy's")
    return "\n".join(lines)


def _ramp_table(ramp: dict, key: str, cpu: bool = False) -> list[str]:
    lines = [f"proxy      {'ceiling' if key == 'ceiling' else '   rate'}  "
             + "  ".join(f"{int(f * 100):>7}%" for f in RAMP_FRACTIONS)]
    for name, r in ramp.items():
        if r.get("error"):
            lines.append(f"{name:9}  {r['error']}")
            continue
        cells = ["  failed " if st.get("error") else
                 f"{fmt_us(st.get('cpu')):>8}" if cpu else
                 f"{fmt_ms(_p(st, 'p99')) + ('*' if st.get('generator_bound') else ''):>8}"
                 for st in r["steps"]]
        lines.append(f"{name:9} {fmt_rate(r[key]):>8}  " + "  ".join(cells))
    return lines


def _charts(ctx) -> None:
    med = medians(ctx)
    xs = sorted(med, key=int)
    for key, title, unit in (("p99", "p99 by connections", "ms"), ("p999", "p99.9 by connections", "ms"),
                             ("cpu", "CPU per request by connections", "us")):
        series = {}
        for n in xs:
            for name, m in med[n].items():
                if m[key] is not None:
                    series.setdefault(name, []).append((int(n), m[key]))
        if series:
            ch.lines(ctx.outdir / f"sweep_{key}.png", title, "connections", unit, series)
    for key, fname, title in (("ramp", "ramp_p99.png", "fixed-rate p99 at % of own ceiling"),
                              ("ramp_same", "ramp_same_p99.png",
                               "fixed-rate p99 at % of the lowest ceiling")):
        series = {name: [(st["fraction"] * 100, _p(st, "p99")) for st in r.get("steps", [])
                         if not st.get("error")]
                  for name, r in (ctx.results.get(key) or {}).items() if "steps" in r}
        if any(series.values()):
            ch.lines(ctx.outdir / fname, title, "offered load (%)", "ms", series, logy=True)


def _md(ctx, args, text: str) -> str:
    m = report.meta(ctx)
    mach = m["machine"]
    vers = "\n".join(f"- {k}: {v}" for k, v in ctx.versions.items())
    return (f"# Connection sweep: {m['name']}\n\n"
            f"Machine: {mach['cpu']}, {mach['cores']} cores, Linux {mach['kernel']}. "
            f"Command: `bench/run {' '.join(ctx.argv)}`\n\n```\n{text}\n```\n\n"
            "Charts: `sweep_p99.png`, `sweep_p999.png`, `sweep_cpu.png`, `ramp_p99.png`, "
            "`ramp_same_p99.png`. "
            f"Configs: `configs/` (rendered from `bench/peers/`).\n\n## Versions\n\n{vers}\n")
