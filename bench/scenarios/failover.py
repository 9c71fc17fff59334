"""Failover: a fixed-rate load (oha, latency correction) during which one of the 4
upstreams is SIGKILLed, then restarted on the same port. What did clients get?

Each proxy uses its own health-check and retry features (PEER_CONFIG, documented in the
report and bench/README.md). Availability = 2xx / all requests (requests cut by the end of
the run are not counted). After the restart, the scenario probes through the proxy
(GET / every 50 ms, `x-upstream` response header) to see when the restarted backend is
back in rotation.
"""

from __future__ import annotations

import threading
import time
import urllib.request

from harness import charts as ch
from harness import measure, outcomes, peers
from harness.loadgen import LoadError
from harness.measure import fmt_ms, fmt_rate
from harness.outcomes import LABELS, fmt_pct
from harness.procs import StartError
from scenarios.ramp import base_rate

NAME = "failover"
TITLE = "Failover (oha fixed rate, one of the 4 upstreams SIGKILLed mid-run, then restarted)"
ORDER = 40
TARGETS = "proxies"
TOOLS = ["oha"]
# The peers the issue compares veloxy with; quick mode runs only these to stay short.
RESILIENCE_PEERS = ["veloxy", "nginx", "haproxy", "caddy"]
_BASE = {"fraction": 0.35, "rate": 2000, "connections": 64, "timeout": 2,
         "kill_at": 0.25, "restart_at": 0.6}
PROFILES = {
    # smoke: veloxy only (CI checks it keeps 100% through the kill), a low rate, 3 s.
    "smoke": {**_BASE, "fraction": 0.1, "duration": 3, "proxies": ["veloxy"]},
    "quick": {**_BASE, "duration": 8, "proxies": RESILIENCE_PEERS},
    "full": {**_BASE, "duration": 20},
}
VICTIM = 1  # index of the upstream killed: u2
PROBE_EVERY_S = 0.05

# Health checking / retries per proxy for this scenario: template snippets (see
# bench/peers/*.tmpl placeholders) and what they mean, for the report.
PEER_CONFIG = {
    "veloxy": {"UPSTREAM_EXTRA": """
[upstreams.app.health]
path = "/health"
interval = "1s"
timeout = "500ms"
healthy = 2
unhealthy = 2"""},
    "haproxy": {"BACKEND_EXTRA": """
option httpchk GET /health
default-server check inter 1s fall 2 rise 2
option redispatch 1
retries 2
retry-on conn-failure empty-response"""},
    "caddy": {"PROXY_EXTRA": """
lb_retries 2
fail_duration 10s
health_uri /health
health_interval 1s
health_timeout 500ms
health_passes 2
health_fails 2"""},
}
HEALTH_NOTES = {
    "veloxy": "active `GET /health` every 1s (timeout 500ms, 2 fails down / 2 passes up); "
              "defaults: passive outlier ejection (5 consecutive failures, 10s), "
              "`retries = 2` on another backend (connect errors; resets before a response "
              "byte and 502/503/504 for idempotent requests)",
    "nginx": "OSS defaults: passive `max_fails=1 fail_timeout=10s`, "
             "`proxy_next_upstream error timeout` (retries on the next server)",
    "haproxy": "`option httpchk GET /health`, `check inter 1s fall 2 rise 2`, `retries 2`, "
               "`option redispatch 1`, `retry-on conn-failure empty-response`",
    "caddy": "active `health_uri /health` every 1s (timeout 500ms, 2 fails / 2 passes), "
             "passive `fail_duration 10s` (max_fails 1), `lb_retries 2`",
    "envoy": "defaults: no active health check, no outlier detection, no retry policy",
    "pingora": "defaults of the bench peer: no health check, no retry",
    "traefik": "defaults: no health check, no retry middleware",
}


def requires(ctx):
    return None if ctx.tools.get("oha") else "oha is not available"


def peer_config(ctx, cfg, name):
    return PEER_CONFIG.get(name)


def steps(ctx, cfg):
    d = cfg["duration"]
    return [{"label": f"oha fixed rate {d}s, kill u{VICTIM + 1} at {cfg['kill_at'] * d:g}s, "
                      f"restart at {cfg['restart_at'] * d:g}s", "seconds": d + 1.0}]


def _rate(ctx, cfg) -> float:
    if getattr(ctx, "failover_rate", None) is None:
        base, who = base_rate(ctx)
        if base:
            ctx.failover_rate = base * cfg["fraction"]
            ctx.failover_rate_from = (f"{int(cfg['fraction'] * 100)}% of the slowest proxy's "
                                      f"ceiling ({who}, {fmt_rate(base)} req/s)")
        else:
            ctx.failover_rate = float(cfg["rate"])
            ctx.failover_rate_from = "the profile's fixed rate: no ceiling scenario in this run"
    return ctx.failover_rate


def _wait_until(t: float, load: threading.Thread) -> None:
    while load.is_alive() and time.monotonic() < t:
        time.sleep(min(0.02, max(0.0, t - time.monotonic())))


def _probe(base_url: str, victim: str) -> str | None:
    """One GET / through the proxy: the x-upstream that answered, or None."""
    try:
        with urllib.request.urlopen(base_url + "/", timeout=1) as r:
            r.read()
            return r.headers.get("x-upstream")
    except OSError:
        return None


def run_step(ctx, cfg, run, step):
    ups = ctx.upstreams
    i = VICTIM % len(ups.procs)
    victim = f"u{i + 1}"
    d = cfg["duration"]
    rate = _rate(ctx, cfg)
    box: dict = {}

    def load():
        try:
            box["r"] = measure.oha(ctx, run, "/", rate=rate, connections=cfg["connections"],
                                   duration=d, timeout_s=cfg["timeout"])
        except BaseException as e:  # re-raised in the scenario thread below
            box["e"] = e

    th = threading.Thread(target=load, name="failover-load", daemon=True)
    t0 = time.monotonic()
    th.start()
    killed = restarted = recovery = None
    restart_error = None
    probes = hits = 0
    try:
        _wait_until(t0 + d * cfg["kill_at"], th)
        if th.is_alive():
            peers.kill_upstream(ups, i)
            killed = time.monotonic() - t0
            _wait_until(t0 + d * cfg["restart_at"], th)
    finally:
        if killed is not None:
            try:
                peers.restart_upstream(ctx.tools["upstream"], ups, i, ctx.load_cpus, ctx.tmp)
                restarted = time.monotonic() - t0
            except StartError as e:  # left dead: the runner restarts every upstream
                restart_error = str(e)
    while th.is_alive() and restarted is not None:
        got = _probe(run.base_url, victim)
        probes += 1
        if got == victim:
            hits += 1
            if recovery is None:
                recovery = time.monotonic() - t0 - restarted
        time.sleep(PROBE_EVERY_S)
    th.join(timeout=d + 45)
    if "e" in box:
        raise box["e"]
    if "r" not in box:
        raise LoadError("oha did not finish")
    r = box["r"]
    r.update({"outcomes": outcomes.of_result(r, d), "victim": victim, "killed_s": killed,
              "restarted_s": restarted, "restart_error": restart_error,
              "recovery_s": recovery, "probes": probes, "probe_hits": hits,
              "rate_from": getattr(ctx, "failover_rate_from", "")})
    if restart_error:
        r["error"] = f"could not restart {victim}: {restart_error}"
    return r


def _first(rs):
    return next((r for r in rs if not r.get("error")), None)


def _recovery_text(r) -> str:
    if r.get("restarted_s") is None:
        return "not restarted"
    if r.get("recovery_s") is not None:
        return f"after {r['recovery_s']:.1f}s ({r['probe_hits']}/{r['probes']} probes)"
    left = r["duration_s"] - r["restarted_s"]
    return f"not within the {left:.1f}s left (0/{r['probes']} probes)"


def report(ctx, cfg, results):
    d = cfg["duration"]
    out = []
    rate = getattr(ctx, "failover_rate", None)
    out.append(
        f"oha at a fixed {fmt_rate(rate)} req/s ({getattr(ctx, 'failover_rate_from', '?')}) for "
        f"{d}s over {cfg['connections']} connections, client timeout {cfg['timeout']}s, latency "
        f"correction on. At {cfg['kill_at'] * d:g}s upstream u{VICTIM + 1} (of 4) is SIGKILLed "
        f"(its sockets close at once: pooled connections and in-flight requests fail); at "
        f"{cfg['restart_at'] * d:g}s it is restarted on the same port. Availability = 2xx / all "
        "requests (requests still in flight at the end of the run are not counted; requests "
        "oha could not send because every connection was busy count as failed: \"not sent\", "
        "less those scheduled in the run's last 5 ms). "
        "\"Back in rotation\": after the restart, GET / through the proxy every "
        f"{PROBE_EVERY_S * 1000:.0f} ms; the time until one is answered by u{VICTIM + 1}.\n")
    if cfg.get("proxies") and not getattr(ctx, "explicit_proxies", False):
        out.append(f"This profile runs on {', '.join(cfg['proxies'])} only (to keep it short); "
                   "the full run covers every proxy.\n")
    out.append("| Proxy | Availability | Requests | Non-2xx statuses | Client timeouts "
               "| Conn. refused | Conn. closed/reset | Other errors | Not sent | p50 | p99 | max "
               "| Back in rotation |")
    out.append("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, rs in results.items():
        r = _first(rs)
        if r is None:
            err = rs[0].get("error", "no result") if rs else "no result"
            out.append(f"| {name} | failed: {err[:100]} |" + " |" * 11)
            continue
        o = r["outcomes"]
        lat = r["latency_ms"]
        codes = outcomes.codes_text(r.get("status_codes") or {}) or "-"
        out.append(f"| {name} | {fmt_pct(o['availability'])} | {o['total']:,} | {codes} "
                   f"| {o['timeouts']} | {o['conn_refused']} | {o['conn_closed']} "
                   f"| {o['other_errors']} | {o['unsent']} | {fmt_ms(lat.get('p50'))} "
                   f"| {fmt_ms(lat.get('p99'))} "
                   f"| {fmt_ms(lat.get('max'))} | {_recovery_text(r)} |")
    out.append("")
    out.append("**What clients saw**\n")
    for name, rs in results.items():
        r = _first(rs)
        if r is not None:
            out.append(f"- **{name}**: {outcomes.describe(r)}")
    out.append("")
    vx = _first(results.get("veloxy", []))
    if vx is not None:
        o = vx["outcomes"]
        met = o["availability"] == 1.0
        bad = ", ".join(f"{n:,} {LABELS[k]}" for k, n in outcomes.not_ok(o))
        out.append(f"**Goal: veloxy keeps 100% availability through the backend kill: "
                   f"{'met' if met else 'NOT met'}** ({fmt_pct(o['availability'], 3)}"
                   f"{'; ' + bad if bad else ''}).\n")
    out.append("**Health checking and retries used by each proxy** (configs in "
               "`configs/PROXY-failover/`)\n")
    out.append("| Proxy | Settings |")
    out.append("|---|---|")
    for name in results:
        out.append(f"| {name} | {HEALTH_NOTES.get(name, '-')} |")
    out.append("")
    return "\n".join(out)


def charts(ctx, cfg, results, outdir):
    names = [n for n, rs in results.items() if _first(rs)]
    vals = [100 * (_first(results[n])["outcomes"]["availability"] or 0) for n in names]
    if ch.grouped_bars(outdir / "failover_availability.png",
                       "Failover: availability (share of 2xx) through a backend kill",
                       "availability (%)", names, {"availability": vals},
                       fmt=lambda v: fmt_pct(v / 100)):
        return [("Availability through a backend kill (failover)", "failover_availability.png")]
    return []
