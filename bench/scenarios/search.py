"""Search-gateway shape: GET /_search (~500-byte JSON answer) and POST /_bulk with
1 KB, 100 KB and 1 MB bodies, at 100 and 1000 connections (wrk + lua body script)."""

from __future__ import annotations

import math

from harness import charts as ch
from harness import loadgen, measure
from harness.measure import fmt_bytes, fmt_ms, fmt_rate, fmt_us, ratio

NAME = "search"
TITLE = "Search-gateway shape (wrk: GET /_search, POST /_bulk)"
ORDER = 30
TARGETS = "proxies"
KB = 1024
PROFILES = {
    "smoke": {"connections": [16], "bodies": [KB], "duration": 1, "warmup": 0},
    "quick": {"connections": [100, 1000], "bodies": [KB, 100 * KB, 1024 * KB],
              "duration": 1, "warmup": 0},
    "full": {"connections": [100, 1000], "bodies": [KB, 100 * KB, 1024 * KB],
             "duration": 8, "warmup": 2},
}


def _size(n: int) -> str:
    return f"{n // (1024 * KB)}MB" if n >= 1024 * KB else f"{n // KB}KB"


def _cases(cfg):
    cases = [("GET /_search", "GET", "/_search", None)]
    cases += [(f"POST /_bulk {_size(b)}", "POST", "/_bulk", b) for b in cfg["bodies"]]
    return cases


# Rough proxied upload rate on a small machine: a step lasts at least a few "rounds"
# (every connection sending one body), or big bodies over 1000 connections complete nothing.
UPLOAD_BPS = 0.5e9
MIN_ROUNDS = 3


def duration_for(cfg, body: int | None, conns: int) -> int:
    rounds = MIN_ROUNDS * conns * (body or 0) / UPLOAD_BPS
    return max(cfg["duration"], math.ceil(rounds))


def steps(ctx, cfg):
    out = []
    for case, method, path, body in _cases(cfg):
        for c in cfg["connections"]:
            d = duration_for(cfg, body, c)
            out.append({"label": f"{case} c={c} {d}s", "case": case, "method": method,
                        "path": path, "body": body, "connections": c, "duration": d,
                        "seconds": d + cfg["warmup"] + 0.4})
    return out


def run_step(ctx, cfg, run, step):
    body = loadgen.make_body(ctx.cache, step["body"]) if step["body"] else None
    # Large bodies over 1000 connections can queue for seconds: a longer timeout, so the
    # errors column counts real failures rather than the load generator giving up early.
    timeout = 10 if step["body"] and step["body"] > 10 * KB else 4
    res = measure.wrk(ctx, run, step["path"], connections=step["connections"],
                      duration=step["duration"], warmup=cfg["warmup"], method=step["method"],
                      body_file=body, timeout_s=timeout)
    res["case"] = step["case"]
    res["body_bytes"] = step["body"] or 0
    return res


def report(ctx, cfg, results):
    out = ["Upload throughput = requests/s x body size. Errors = non-2xx / socket errors "
           "(connect, read, write, timeout). Large bodies over many connections run longer "
           f"(at least {MIN_ROUNDS} rounds of every connection sending one body).\n"]
    for case, _m, _p, body in _cases(cfg):
        for c in cfg["connections"]:
            rows = {n: next((r for r in rs if r.get("case") == case and r.get("connections") == c),
                            None) for n, rs in results.items()}
            nginx = rows.get("nginx")
            out.append(f"**{case}, {c} connections**\n")
            out.append("| Proxy | Requests/Sec | Transfer/Sec | Errors | p99 | CPU/req "
                       "| req/s vs nginx | Bottleneck |")
            out.append("|---|---:|---:|---:|---:|---:|---:|---|")
            for name, r in rows.items():
                if r is None:
                    continue
                if r.get("error"):
                    out.append(f"| {name} | failed: {r['error'][:80]} | | | | | | |")
                    continue
                xfer = f"{fmt_bytes(r['transfer_bps'])}/s"
                if body:
                    xfer += f" (up {fmt_bytes(r['rps'] * body)}/s)"
                out.append(f"| {name} | {fmt_rate(r['rps'])} | {xfer} "
                           f"| {r['non2xx']} / {r['socket_errors']} | {fmt_ms(r['latency_ms'].get('p99'))} "
                           f"| {fmt_us(r.get('cpu_us_per_req'))} "
                           f"| {ratio(r['rps'], nginx and nginx.get('rps'))} | {r['bottleneck']} |")
            out.append("")
    return "\n".join(out)


def charts(ctx, cfg, results, outdir):
    names = [n for n in results if any(not r.get("error") for r in results[n])]
    made = []
    for c in cfg["connections"]:
        series = {}
        for case, *_ in _cases(cfg):
            series[case] = [next((r.get("rps") for r in results[n]
                                  if r.get("case") == case and r.get("connections") == c), None)
                            for n in names]
        fname = f"search_rps_c{c}.png"
        if ch.grouped_bars(outdir / fname, f"Search gateway: requests/s at {c} connections",
                           "requests/s", names, series):
            made.append((f"Search-gateway requests/s at {c} connections", fname))
    return made
