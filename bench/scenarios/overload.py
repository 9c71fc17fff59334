"""Overload: offer more than a proxy admits and see what clients get.

On a 2-core box the load generator cannot outrun a fast proxy on CPU alone, so the
upstream is made slow instead: GET /delay/20 (each veloxy-upstream answers after 20 ms
and holds any number of such requests concurrently). Admission is then bounded by the
configured concurrency: N = 32 in-flight requests x 20 ms = 1,600 req/s. The steps offer
an unloaded baseline, then 2x and 4x that capacity at a fixed rate (oha, latency
correction, 2 s client timeout, enough connections that oha never runs out).

"Admitted" = requests answered 2xx; oha --stats-success-breakdown gives their latency
percentiles apart from the refusals. Goal (issue): veloxy's admitted p99 under overload
stays under 2x its unloaded p99.
"""

from __future__ import annotations

from harness import charts as ch
from harness import measure, outcomes
from harness.measure import fmt_ms, fmt_rate
from harness.outcomes import fmt_pct, ratio_text

NAME = "overload"
TITLE = "Overload (oha fixed rate past the admitted capacity, GET /delay/20)"
ORDER = 50
TARGETS = "proxies"
TOOLS = ["oha"]
RESILIENCE_PEERS = ["veloxy", "nginx", "haproxy", "caddy"]
DELAY_MS = 20
SLOTS = 32             # N: in-flight requests admitted (all workers together)
QUEUE = 8              # veloxy: requests that may wait for a slot (Envoy: pending requests)
QUEUE_TIMEOUT_MS = 50  # veloxy queue_timeout, HAProxy timeout queue
CAPACITY = SLOTS * 1000 / DELAY_MS  # admitted requests/s at most
GOAL_RATIO = 2.0
# Baseline: 300 req/s (under 1/5 of the capacity: ~6 requests in flight of 32) so that even
# the short quick step has 600 samples behind its p99.
_BASE = {"baseline_rate": 300, "baseline_connections": 16, "factors": [2, 4],
         "connections": 512, "timeout": 2}
PROFILES = {
    "quick": {**_BASE, "baseline_s": 2, "duration": 3, "proxies": RESILIENCE_PEERS},
    "full": {**_BASE, "baseline_s": 10, "duration": 10},
}

# Each proxy's own admission control, as template snippets (bench/peers/*.tmpl).
PEER_CONFIG = {
    # veloxy's default `queue = 0`: refuse at once. A queue (`queue = 8`,
    # `queue_timeout = "50ms"`) trades admitted latency (up to one service time of waiting)
    # for fewer 503s; the benchmark measures the default.
    "veloxy": {"ROUTE_EXTRA": f"max_concurrency = {SLOTS}"},
    "haproxy": {"BACKEND_EXTRA": f"default-server maxconn {SLOTS // 4}\n"
                                 f"timeout queue {QUEUE_TIMEOUT_MS}ms"},
    "nginx": {"HTTP_EXTRA": "limit_conn_zone $server_port zone=inflight:1m;",
              "LOCATION_EXTRA": f"limit_conn inflight {SLOTS};"},
    "envoy": {"CB_CONNECTIONS": SLOTS, "CB_REQUESTS": SLOTS, "CB_PENDING": QUEUE},
    "traefik": {"HTTP_EXTRA": f"middlewares:\n  inflight:\n    inFlightReq:\n      amount: {SLOTS}",
                "ROUTER_EXTRA": 'middlewares: ["inflight"]'},
}
LIMIT_NOTES = {
    "veloxy": f"route `max_concurrency = {SLOTS}` (default `queue = 0`): beyond it an immediate "
              "503 + Retry-After. With a queue (`queue`, `queue_timeout`) fewer requests are "
              "refused and admitted ones may wait up to `queue_timeout`",
    "haproxy": f"`maxconn {SLOTS // 4}` on each of the 4 servers, `timeout queue "
               f"{QUEUE_TIMEOUT_MS}ms`: the queue has no length bound, a request waits up to "
               f"{QUEUE_TIMEOUT_MS} ms, then 503",
    "nginx": f"`limit_conn` on one shared key ($server_port), {SLOTS}: counts requests being "
             "processed; beyond it an immediate 503 (OSS nginx has no queue)",
    "envoy": f"circuit breakers `max_connections`/`max_requests` {SLOTS}, "
             f"`max_pending_requests` {QUEUE} (pending requests wait without a timeout); "
             "overflow: immediate 503",
    "traefik": f"`inFlightReq` middleware, amount {SLOTS}: beyond it an immediate 429",
    "caddy": "none (defaults; Caddy has no admission limit, `max_conns_per_host` would queue "
             "without bound): bounded by CPU only",
    "pingora": "none (the bench peer has no admission control): bounded by CPU only",
}


def requires(ctx):
    return None if ctx.tools.get("oha") else "oha is not available"


def peer_config(ctx, cfg, name):
    return PEER_CONFIG.get(name)


def steps(ctx, cfg):
    out = [{"label": f"baseline {cfg['baseline_rate']} req/s, {cfg['baseline_s']}s",
            "factor": 0, "rate": cfg["baseline_rate"], "duration": cfg["baseline_s"],
            "conns": cfg["baseline_connections"], "seconds": cfg["baseline_s"] + 0.6}]
    for f in cfg["factors"]:
        rate = CAPACITY * f
        out.append({"label": f"{f}x capacity: {fmt_rate(rate)} req/s, {cfg['duration']}s",
                    "factor": f, "rate": rate, "duration": cfg["duration"],
                    "conns": cfg["connections"], "seconds": cfg["duration"] + 0.6})
    return out


def run_step(ctx, cfg, run, step):
    r = measure.oha(ctx, run, f"/delay/{DELAY_MS}", rate=step["rate"], connections=step["conns"],
                    duration=step["duration"], timeout_s=cfg["timeout"], breakdown=True)
    r["outcomes"] = outcomes.of_result(r, step["duration"])
    return r


def admitted_p99(r: dict) -> float | None:
    """p99 of the 2xx responses (oha's success breakdown), else of all responses when
    every response was a 2xx."""
    ok = r.get("ok_latency_ms") or {}
    if ok.get("p99") is not None:
        return ok["p99"]
    o = r.get("outcomes") or {}
    if o.get("ok") and o.get("ok") == o.get("total"):
        return (r.get("latency_ms") or {}).get("p99")
    return None


def summarize(rs: list[dict]) -> dict:
    """Baseline admitted p99 and, per overload factor, the ratio admitted p99 / baseline."""
    good = [r for r in rs if not r.get("error")]
    base = next((r for r in good if r.get("factor") == 0), None)
    b99 = admitted_p99(base) if base else None
    ratios = {}
    for r in good:
        if r.get("factor"):
            a = admitted_p99(r)
            ratios[r["factor"]] = (a / b99) if a and b99 else None
    return {"baseline_p99": b99, "ratios": ratios}


def _by_factor(rs, f):
    return next((r for r in rs if r.get("factor") == f and not r.get("error")), None)


def report(ctx, cfg, results):
    out = [
        f"Upstream route `GET /delay/{DELAY_MS}` ({DELAY_MS} ms per request, any concurrency). "
        f"Admission limit N = {SLOTS} in-flight requests -> capacity {SLOTS} x 1000/{DELAY_MS} = "
        f"{fmt_rate(CAPACITY)} req/s, low enough that the load generator (one core, shared with "
        f"the upstreams) can offer {max(cfg['factors'])}x that. Steps: baseline "
        f"{cfg['baseline_rate']} req/s for {cfg['baseline_s']}s ({cfg['baseline_connections']} "
        f"connections), then {', '.join(f'{f}x' for f in cfg['factors'])} capacity for "
        f"{cfg['duration']}s each ({cfg['connections']} connections), oha fixed rate with latency "
        f"correction, client timeout {cfg['timeout']}s. Admitted = 2xx answers; their p99 comes "
        "from `oha --stats-success-breakdown` (refusals and errors excluded); p50/p99 \"all\" "
        "cover every response (timeouts and connection errors have no latency in oha).\n",
        f"A request admitted at once takes ~{DELAY_MS} ms; the rest of its latency is queueing. "
        f"Under steady overload the {SLOTS} slots are refilled the moment they free, so their "
        f"release times stay bunched (they were all taken within a few ms): a request that "
        f"enters a queue just after a bunch waits up to ~one service time ({DELAY_MS} ms) for "
        f"the next, whatever the queue length; `queue_timeout`/`timeout queue` "
        f"({QUEUE_TIMEOUT_MS} ms) caps the wait. Proxies without a queue (nginx `limit_conn`, "
        f"Traefik) refuse instead of waiting. The goal: veloxy's admitted p99 under overload "
        f"< {GOAL_RATIO:g}x its baseline p99.\n",
    ]
    if cfg.get("proxies") and not getattr(ctx, "explicit_proxies", False):
        out.append(f"This profile runs on {', '.join(cfg['proxies'])} only (to keep it short); "
                   "the full run covers every proxy.\n")
    fs = cfg["factors"]
    out.append("| Proxy | Baseline p99 | " + " | ".join(
        f"{f}x: availability | {f}x: admitted p99 | {f}x: vs baseline" for f in fs) + " |")
    out.append("|---|---:|" + "---:|---:|---:|" * len(fs))
    for name, rs in results.items():
        s = summarize(rs)
        cells = [fmt_ms(s["baseline_p99"])]
        for f in fs:
            r = _by_factor(rs, f)
            if r is None:
                cells += ["failed", "", ""]
                continue
            cells += [fmt_pct(r["outcomes"]["availability"]), fmt_ms(admitted_p99(r)),
                      ratio_text(admitted_p99(r), s["baseline_p99"])]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("")
    vx = results.get("veloxy")
    if vx:
        s = summarize(vx)
        worst = max((v for v in s["ratios"].values() if v is not None), default=None)
        if worst is None:
            out.append("**Goal: veloxy admitted p99 < 2x baseline: not measured** (no baseline or "
                       "no admitted request).\n")
        else:
            met = worst < GOAL_RATIO and len(s["ratios"]) == len(fs)
            out.append(f"**Goal: veloxy's admitted p99 under overload < {GOAL_RATIO:g}x its "
                       f"unloaded p99: {'met' if met else 'NOT met'}** (worst {worst:.2f}x; "
                       f"baseline p99 {fmt_ms(s['baseline_p99'])}).\n")
    out.append("**Every step** (refused = 503/429 answers; conn. errors = refused + closed/reset "
               "connections; not sent = requests oha could not send before the end because "
               "every one of its connections was waiting, less those scheduled in the run's last 5 ms: "
               "they count as failed)\n")
    out.append("| Proxy | Step | Offered | 2xx/s | Availability | Refused | Other 5xx "
               "| Timeouts | Conn. errors | Not sent | p50 all | p99 all | p99 admitted "
               "| proxy CPU% |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, rs in results.items():
        for r in rs:
            step = "baseline" if r.get("factor") == 0 else f"{r.get('factor')}x"
            if r.get("error"):
                out.append(f"| {name} | {step} | failed: {r['error'][:80]} |" + " |" * 11)
                continue
            o, lat = r["outcomes"], r["latency_ms"]
            out.append(
                f"| {name} | {step} | {fmt_rate(r['offered_rps'])} | {fmt_rate(r['ok_rps'])} "
                f"| {fmt_pct(o['availability'])} | {o['refused']:,} | {o['other_5xx']:,} "
                f"| {o['timeouts']:,} | {o['conn_refused'] + o['conn_closed']:,} | {o['unsent']:,} "
                f"| {fmt_ms(lat.get('p50'))} | {fmt_ms(lat.get('p99'))} | {fmt_ms(admitted_p99(r))} "
                f"| {r.get('proxy_cpu_pct', 0):.0f}% |")
    out.append("")
    out.append(f"**What clients saw at {max(fs)}x**\n")
    for name, rs in results.items():
        r = _by_factor(rs, max(fs))
        if r is not None:
            out.append(f"- **{name}**: {outcomes.describe(r)}")
    out.append("")
    out.append("**Admission control used by each proxy** (configs in `configs/PROXY-overload/`)\n")
    out.append("| Proxy | Limit |")
    out.append("|---|---|")
    for name in results:
        out.append(f"| {name} | {LIMIT_NOTES.get(name, '-')} |")
    out.append("")
    return "\n".join(out)


def charts(ctx, cfg, results, outdir):
    names = [n for n, rs in results.items() if any(not r.get("error") for r in rs)]
    made = []
    steps_f = [0, *cfg["factors"]]
    label = {f: ("baseline" if f == 0 else f"{f}x capacity") for f in steps_f}
    avail = {label[f]: [100 * ((_by_factor(results[n], f) or {}).get("outcomes", {})
                               .get("availability") or 0) for n in names] for f in steps_f}
    if ch.grouped_bars(outdir / "overload_availability.png", "Overload: availability (share of 2xx)",
                       "availability (%)", names, avail, fmt=lambda v: fmt_pct(v / 100, 1)):
        made.append(("Availability at each offered load (overload)", "overload_availability.png"))
    p99 = {label[f]: [admitted_p99(_by_factor(results[n], f) or {}) for n in names]
           for f in steps_f}
    if ch.grouped_bars(outdir / "overload_admitted_p99.png",
                       "Overload: p99 of admitted (2xx) requests", "p99 (ms)", names, p99,
                       fmt=lambda v: f"{v:.0f}"):
        made.append(("p99 of admitted requests, baseline vs overload", "overload_admitted_p99.png"))
    return made
