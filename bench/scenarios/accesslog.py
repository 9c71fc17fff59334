"""Access log cost: veloxy with its access log on (combined format, to a file) against a
second veloxy with the log off (the default), measured alternately on the same cores
(rounds on, off, on, off, ...; medians). The goal from the operations issue: turning the log
on costs under 10% of requests/s. CPU time per request is reported too, since on a 2-core box
the load generator may be the bottleneck."""

from __future__ import annotations

import statistics

from harness import measure, peers
from harness.measure import fmt_rate, fmt_us

NAME = "accesslog"
TITLE = "Access log cost (veloxy, wrk closed loop, GET /)"
ORDER = 70
TARGETS = "proxies"
GOAL = 0.10
PROFILES = {
    "quick": {"connections": 64, "duration": 3, "warmup": 1, "rounds": 2, "proxies": ["veloxy"]},
    "full": {"connections": 64, "duration": 10, "warmup": 2, "rounds": 5, "proxies": ["veloxy"]},
}


def peer_config(ctx, cfg, name):
    if name != "veloxy":
        return None
    path = ctx.tmp / "veloxy-access.log"
    return {"SERVER_EXTRA": f'[server.access_log]\npath = "{path}"\nformat = "combined"'}


def steps(ctx, cfg):
    per = cfg["duration"] + cfg["warmup"] + 0.5
    return [{"label": f"wrk c={cfg['connections']} {cfg['duration']}s, log on/off x {cfg['rounds']}",
             "seconds": 2 * cfg["rounds"] * per + 1.5}]


def _median(rs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rs if r.get(key)]
    return statistics.median(vals) if vals else None


def run_step(ctx, cfg, run, step):
    off_run = peers.start(ctx, "veloxy")  # the default config: no access log
    try:
        on, off = [], []
        for _ in range(cfg["rounds"]):
            for target, sink in ((run, on), (off_run, off)):
                sink.append(measure.wrk(ctx, target, "/", connections=cfg["connections"],
                                        duration=cfg["duration"], warmup=cfg["warmup"]))
    finally:
        peers.stop(off_run)
    log = ctx.tmp / "veloxy-access.log"
    return {"rps": _median(on, "rps"), "cpu_us_per_req": _median(on, "cpu_us_per_req"),
            "off_rps": _median(off, "rps"), "off_cpu_us_per_req": _median(off, "cpu_us_per_req"),
            "rounds_on": [r.get("rps") for r in on], "rounds_off": [r.get("rps") for r in off],
            "log_lines": sum(1 for _ in log.open()) if log.exists() else 0}


def report(ctx, cfg, results):
    r = next((r for r in results.get("veloxy", []) if not r.get("error")), None)
    if not r or not r.get("rps") or not r.get("off_rps"):
        return "veloxy did not run with its access log (see the peers table).\n"
    cost = 1 - r["rps"] / r["off_rps"]
    cpu = (r.get("cpu_us_per_req") or 0) / (r.get("off_cpu_us_per_req") or 1) - 1
    met = "met" if cost < GOAL else "NOT met"
    return "\n".join([
        f"veloxy with `[server.access_log] format = \"combined\"` writing to a file, against "
        f"veloxy with the log off, {cfg['connections']} connections, {cfg['rounds']} alternating "
        f"rounds of {cfg['duration']}s (medians); {r['log_lines']:,} lines were written.\n",
        "| Access log | Requests/Sec | CPU/req | per round (req/s) |", "|---|---:|---:|---|",
        f"| off | {fmt_rate(r['off_rps'])} | {fmt_us(r.get('off_cpu_us_per_req'))} | "
        + ", ".join(fmt_rate(x) for x in r["rounds_off"]) + " |",
        f"| on | {fmt_rate(r['rps'])} | {fmt_us(r.get('cpu_us_per_req'))} | "
        + ", ".join(fmt_rate(x) for x in r["rounds_on"]) + " |",
        f"\nCost: {cost:+.1%} requests/s, {cpu:+.1%} CPU per request. "
        f"**Goal: under {GOAL:.0%} of requests/s: {met}.**\n",
    ]) + "\n"
