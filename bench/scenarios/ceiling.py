"""Ceiling: wrk closed loop at fixed connection counts, the maximum each proxy sustains.

Also measures wrk straight to one upstream ("direct", pinned where the proxy runs)
as the physical ceiling of the setup, and reports each proxy's share of it.
"""

from __future__ import annotations

from harness import charts as ch
from harness import measure
from harness.measure import fmt_bytes, fmt_ms, fmt_rate, fmt_us, ratio

NAME = "ceiling"
TITLE = "Ceiling (wrk, closed loop, GET / ~100-byte JSON)"
ORDER = 10
TARGETS = "proxies+direct"
PROFILES = {
    "smoke": {"connections": [16], "duration": 2, "warmup": 1},
    "quick": {"connections": [64, 256], "duration": 3, "warmup": 1},
    "full": {"connections": [64, 256], "duration": 12, "warmup": 3},
}


def steps(ctx, cfg):
    return [{"label": f"wrk c={c} {cfg['duration']}s", "connections": c,
             "seconds": cfg["duration"] + cfg["warmup"] + 0.5} for c in cfg["connections"]]


def run_step(ctx, cfg, run, step):
    return measure.wrk(ctx, run, "/", connections=step["connections"],
                       duration=cfg["duration"], warmup=cfg["warmup"])


def best_rps(results: dict, name: str) -> float | None:
    vals = [r.get("rps") for r in results.get(name, []) if r.get("rps") and not r.get("error")]
    return max(vals) if vals else None


def _by_conn(results: dict, name: str, c: int) -> dict | None:
    for r in results.get(name, []):
        if r.get("connections") == c:
            return r
    return None


def report(ctx, cfg, results):
    out = []
    direct_note = ("`direct` = wrk straight to one upstream instance pinned on the proxy "
                   "core(s): the physical ceiling of this setup.")
    out.append(direct_note + " CPU/req = utime+stime of the proxy's whole process tree over the "
               "run divided by requests completed. Bottleneck = busiest core during the run.\n")
    for c in cfg["connections"]:
        nginx = _by_conn(results, "nginx", c)
        direct = _by_conn(results, "direct", c)
        out.append(f"**{c} connections**\n")
        out.append("| Proxy | Requests/Sec | Transfer/Sec | Errors | p99 | CPU/req "
                   "| req/s vs nginx | CPU/req vs nginx | share of direct | Bottleneck (busiest core) |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for name in results:
            r = _by_conn(results, name, c)
            if r is None:
                continue
            if r.get("error"):
                out.append(f"| {name} | failed: {r['error'][:80]} | | | | | | | | |")
                continue
            errs = f"{r['non2xx']} non-2xx / {r['socket_errors']} socket"
            vs_rps = ratio(r["rps"], nginx and nginx.get("rps"))
            # CPU ratio as nginx/this: > 1 means this proxy uses less CPU per request.
            vs_cpu = ratio(nginx and nginx.get("cpu_us_per_req"), r.get("cpu_us_per_req"))
            share = f"{100 * r['rps'] / direct['rps']:.0f}%" if direct and direct.get("rps") else "-"
            if name == "direct":
                vs_cpu, share = "-", "100%"
            out.append(f"| {name} | {fmt_rate(r['rps'])} | {fmt_bytes(r['transfer_bps'])}/s | {errs} "
                       f"| {fmt_ms(r['latency_ms'].get('p99'))} | {fmt_us(r.get('cpu_us_per_req'))} "
                       f"| {vs_rps} | {vs_cpu} | {share} | {r['bottleneck']} |")
        out.append("")
    out.append("CPU/req vs nginx is nginx's CPU per request divided by this proxy's "
               "(above 1.00x = cheaper than nginx).\n")
    return "\n".join(out)


def charts(ctx, cfg, results, outdir):
    names = [n for n in results if any(not r.get("error") for r in results[n])]
    series = {f"{c} connections": [(_by_conn(results, n, c) or {}).get("rps") for n in names]
              for c in cfg["connections"]}
    made = []
    if ch.grouped_bars(outdir / "ceiling_rps.png", "Ceiling: requests/s (wrk)", "requests/s",
                           names, series):
        made.append(("Requests/s per proxy (ceiling)", "ceiling_rps.png"))
    cpu = {f"{c} connections": [(_by_conn(results, n, c) or {}).get("cpu_us_per_req")
                                for n in names] for c in cfg["connections"]}
    if ch.grouped_bars(outdir / "ceiling_cpu_per_req.png", "CPU time per request",
                           "microseconds of CPU per request", names, cpu):
        made.append(("Proxy CPU time per request (ceiling)", "ceiling_cpu_per_req.png"))
    return made
