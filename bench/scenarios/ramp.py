"""Ramp: fixed-rate steps with oha (latency correction against coordinated omission),
from 10% to 120% of the slowest proxy's ceiling measured in the same run."""

from __future__ import annotations

from harness import charts as ch
from harness import measure
from harness.measure import fmt_ms, fmt_rate

NAME = "ramp"
TITLE = "Ramp (oha, fixed rate with latency correction, GET /)"
ORDER = 20
TARGETS = "proxies"
TOOLS = ["oha"]  # installed/built by the harness before the run
PROFILES = {
    "smoke": {"fractions": [0.5], "duration": 2, "connections": 16},
    "quick": {"fractions": [0.5, 1.2], "duration": 3, "connections": 64},
    "full": {"fractions": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2],
             "duration": 8, "connections": 64},
}
CALIBRATE_S = 2


def requires(ctx):
    if not ctx.tools.get("oha"):
        return "oha is not available"
    return None


def base_rate(ctx) -> tuple[float | None, str]:
    """The slowest proxy's ceiling (best wrk requests/s) from the ceiling scenario."""
    ceil = ctx.results.get("ceiling") or {}
    best = {}
    for name, rs in ceil.items():
        if name == "direct":
            continue
        vals = [r["rps"] for r in rs if r.get("rps") and not r.get("error")]
        if vals:
            best[name] = max(vals)
    if not best:
        return None, ""
    slowest = min(best, key=best.get)
    return best[slowest], slowest


def steps(ctx, cfg):
    return [{"label": f"oha {int(f * 100)}% of base rate, {cfg['duration']}s", "fraction": f,
             "seconds": cfg["duration"] + 0.6} for f in cfg["fractions"]]


def run_step(ctx, cfg, run, step):
    if getattr(ctx, "ramp_base", None) is None:
        base, who = base_rate(ctx)
        if base is None:
            # No ceiling numbers in this run: calibrate on the first proxy with a short wrk.
            r = measure.wrk(ctx, run, "/", connections=cfg["connections"], duration=CALIBRATE_S)
            base, who = r["rps"], f"{run.name} (calibration, no ceiling scenario)"
        ctx.ramp_base, ctx.ramp_base_from = base, who
    rate = max(1.0, ctx.ramp_base * step["fraction"])
    res = measure.oha(ctx, run, "/", rate=rate, connections=cfg["connections"],
                      duration=cfg["duration"])
    res["fraction"] = step["fraction"]
    return res


def _ok(rs):
    return [r for r in rs if not r.get("error")]


def report(ctx, cfg, results):
    base = getattr(ctx, "ramp_base", None)
    out = []
    if base:
        out.append(f"Base rate = {fmt_rate(base)} req/s, the ceiling of the slowest proxy "
                   f"({getattr(ctx, 'ramp_base_from', '?')}). Each step offers a fixed rate for "
                   f"{cfg['duration']}s over {cfg['connections']} connections; latencies are "
                   "corrected for coordinated omission (oha --latency-correction).\n")
    fr = cfg["fractions"]
    out.append("**p99 latency at each offered load** (errors in brackets when any)\n")
    out.append("| Proxy | " + " | ".join(f"{int(f * 100)}%" for f in fr) + " |")
    out.append("|---|" + "---:|" * len(fr))
    for name, rs in results.items():
        by = {r.get("fraction"): r for r in rs}
        cells = []
        for f in fr:
            r = by.get(f)
            if not r or r.get("error"):
                cells.append("failed" if r else "-")
                continue
            cell = fmt_ms(r["latency_ms"].get("p99"))
            if r["errors"]:
                cell += f" ({100 * r['error_rate']:.1f}%)"
            cells.append(cell)
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("")
    for name, rs in results.items():
        out.append(f"<details><summary>{name}: every step</summary>\n")
        out.append("| Offered | Achieved | p50 | p90 | p99 | p99.9 | Errors | proxy CPU% "
                   "| proxy RSS | upstream CPU% | Busiest core |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rs:
            if r.get("error"):
                out.append(f"| {int(100 * r.get('fraction', 0))}% | failed: {r['error'][:60]} "
                           "| | | | | | | | | |")
                continue
            lat = r["latency_ms"]
            out.append(
                f"| {fmt_rate(r['offered_rps'])} | {fmt_rate(r['ok_rps'])} | {fmt_ms(lat.get('p50'))} "
                f"| {fmt_ms(lat.get('p90'))} | {fmt_ms(lat.get('p99'))} | {fmt_ms(lat.get('p99.9'))} "
                f"| {100 * r['error_rate']:.2f}% ({r['non2xx']} non-2xx, {r['timeouts']} timeouts) "
                f"| {r['proxy_cpu_pct']:.0f}% | {r['proxy_rss_max_mb']:.0f}MB "
                f"| {r['upstreams_cpu_pct']:.0f}% | {r['bottleneck']} |")
        out.append("\n</details>\n")
    return "\n".join(out)


def charts(ctx, cfg, results, outdir):
    made = []
    p99 = {n: [(r["offered_rps"], r["latency_ms"].get("p99")) for r in _ok(rs)]
           for n, rs in results.items()}
    if ch.lines(outdir / "ramp_p99.png", "p99 latency vs offered load",
                    "offered load (requests/s)", "p99 latency (ms, log)", p99, logy=True):
        made.append(("p99 latency against offered load", "ramp_p99.png"))
    cpu = {n: [(r["offered_rps"], r["proxy_cpu_pct"]) for r in _ok(rs)] for n, rs in results.items()}
    if ch.lines(outdir / "ramp_cpu.png", "Proxy CPU vs offered load",
                    "offered load (requests/s)", "proxy CPU % (100% = one core)", cpu):
        made.append(("Proxy CPU% against offered load", "ramp_cpu.png"))
    rss = {n: [(r["offered_rps"], r["proxy_rss_max_mb"]) for r in _ok(rs)] for n, rs in results.items()}
    if ch.lines(outdir / "ramp_rss.png", "Proxy memory vs offered load",
                    "offered load (requests/s)", "proxy RSS (MB, max)", rss):
        made.append(("Proxy RSS against offered load", "ramp_rss.png"))
    return made
