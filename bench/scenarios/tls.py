"""TLS: HTTPS termination in front of the same plain HTTP/1.1 keep-alive upstreams.

Every proxy serves one ECDSA P-256 self-signed certificate for localhost/127.0.0.1, made
with openssl for this run (in the run's temp dir; a copy of the certificate, not the key,
goes to results/<name>/tls-cert.pem). Steps:

1. HTTPS + HTTP/1.1: wrk (no ALPN: http/1.1), keep-alive connections, after a warm-up;
2. HTTPS + HTTP/2: h2load, a few connections with several concurrent streams each (-m),
   fixed duration, after a warm-up; p50/p99 from h2load's per-request log (--log-file);
3. handshakes: wrk with `Connection: close`, so every request opens a new TLS connection
   (wrk reuses its OpenSSL SSL object, so it may resume the last session where the proxy
   issues tickets: what a real client that keeps its session would cost).

Proxy CPU time per request and ratios against nginx in the same run, as in the ceiling
scenario. Goal (issue 4): veloxy at 1.2x nginx's requests/s with TLS on the same cores,
and a lower p99.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from harness import charts as ch
from harness import measure
from harness.measure import fmt_ms, fmt_rate, fmt_us, ratio

NAME = "tls"
TITLE = "TLS termination (HTTPS + HTTP/1.1 with wrk, HTTPS + HTTP/2 with h2load, GET /)"
ORDER = 60
TARGETS = "proxies"
SCHEME = "https"  # the runner starts the proxies with https readiness probes
# The peers whose TLS settings are below; others (Envoy, Pingora, Traefik) are not run.
TLS_PEERS = ["veloxy", "nginx", "haproxy", "caddy"]
GOAL_RPS = 1.2
_BASE = {"supported": TLS_PEERS, "h1_connections": 64, "h2_clients": 16, "h2_streams": 10,
         "hs_connections": 32}
PROFILES = {
    # smoke: veloxy only, one short wrk step over HTTPS (smoke does not install h2load).
    "smoke": {**_BASE, "h1_connections": 16, "duration": 1, "warmup": 0, "hs_duration": 0,
              "h2": False, "proxies": ["veloxy"]},
    "quick": {**_BASE, "duration": 3, "warmup": 1, "hs_duration": 2, "h2": True,
              "proxies": ["veloxy", "nginx"]},
    "full": {**_BASE, "duration": 10, "warmup": 2, "hs_duration": 8, "h2": True},
}
KINDS = {"h1": "HTTPS + HTTP/1.1 (wrk, keep-alive)",
         "h2": "HTTPS + HTTP/2 (h2load)",
         "handshake": "New TLS connection per request (wrk, Connection: close)"}

SETTINGS_NOTES = {
    "veloxy": "`[listeners.web.tls] cert`, `key` (rustls, aws-lc-rs): TLS 1.2 and 1.3, ALPN h2 "
              "and http/1.1, session tickets and a TLS 1.2 session cache (defaults), 128 "
              "streams per HTTP/2 connection (default)",
    "nginx": "`listen ... ssl http2` (nginx < 1.25.1; `http2 on` after), `ssl_certificate`, "
             "`ssl_certificate_key`, `ssl_protocols TLSv1.2 TLSv1.3` (1.22's default lacks 1.3), "
             "`ssl_session_cache shared:SSL:10m`, session tickets on (default), "
             "128 streams per connection (default)",
    "haproxy": "`bind ... ssl crt <cert+key PEM> alpn h2,http/1.1`; defaults: TLS 1.2 minimum, "
               "session cache (tune.ssl.cachesize 20000) and tickets on, 100 streams per "
               "connection",
    "caddy": "`https://127.0.0.1:PORT` site with `tls CERT KEY` (no ACME, `auto_https off`: no "
             "redirects), `servers { protocols h1 h2 }` (no HTTP/3 listener), defaults: TLS 1.2 "
             "and 1.3, session tickets on, 250 streams per connection (Go's default)",
}


def _nginx_new_http2(ctx) -> bool:
    """nginx >= 1.25.1 takes `http2 on;` (the `listen ... http2` form is deprecated)."""
    v = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", (getattr(ctx, "versions", None) or {}).get("nginx", ""))
    return bool(v) and tuple(int(x) for x in v.groups()) >= (1, 25, 1)


def make_cert(dest, cn: str = "localhost",
              san: str = "DNS:localhost,IP:127.0.0.1") -> dict[str, str]:
    """One ECDSA P-256 self-signed certificate for `cn` / `san` (default localhost and
    127.0.0.1; openssl): cert.pem, key.pem (PKCS#8) and bundle.pem (cert + key, for HAProxy)."""
    dest.mkdir(parents=True, exist_ok=True)
    cert, key, bundle = dest / "cert.pem", dest / "key.pem", dest / "bundle.pem"
    cmd = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
           "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "30",
           "-subj", f"/CN={cn}", "-addext", f"subjectAltName={san}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or not cert.exists() or not key.exists():
        raise RuntimeError(f"openssl req failed ({r.returncode}): {(r.stderr or r.stdout)[-300:]}")
    bundle.write_text(cert.read_text() + key.read_text())
    return {"cert": str(cert), "key": str(key), "bundle": str(bundle)}


def requires(ctx):
    if getattr(ctx, "tls_files", None):
        return None
    if not shutil.which("openssl"):
        return "openssl is not installed (needed to make the certificate)"
    try:
        ctx.tls_files = make_cert(ctx.tmp / "tls")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return f"cannot make the certificate: {e}"
    try:
        shutil.copy2(ctx.tls_files["cert"], ctx.outdir / "tls-cert.pem")
    except OSError:
        pass
    return None


def tls_settings(name: str, files: dict[str, str], nginx_http2_on: bool = False) -> dict | None:
    """The template snippets that make proxy `name` serve HTTPS with `files`."""
    cert, key = files["cert"], files["key"]
    if name == "veloxy":
        return {"LISTENER_EXTRA": f'[listeners.web.tls]\ncert = "{cert}"\nkey = "{key}"'}
    if name == "nginx":
        lines = ["http2 on;"] if nginx_http2_on else []
        lines += [f"ssl_certificate {cert};", f"ssl_certificate_key {key};",
                  "ssl_protocols TLSv1.2 TLSv1.3;", "ssl_session_cache shared:SSL:10m;"]
        return {"LISTEN_OPTS": " ssl" if nginx_http2_on else " ssl http2",
                "SERVER_EXTRA": "\n".join(lines)}
    if name == "haproxy":
        return {"BIND_OPTS": f" ssl crt {files['bundle']} alpn h2,http/1.1"}
    if name == "caddy":
        return {"SCHEME": "https", "SITE_EXTRA": f"tls {cert} {key}",
                "GLOBAL_EXTRA": "servers {\n\tprotocols h1 h2\n}"}
    return None


def peer_config(ctx, cfg, name):
    files = getattr(ctx, "tls_files", None) or {"cert": "cert.pem", "key": "key.pem",
                                                "bundle": "bundle.pem"}
    return tls_settings(name, files, _nginx_new_http2(ctx))


def steps(ctx, cfg):
    d, w = cfg["duration"], cfg["warmup"]
    tools = getattr(ctx, "tools", None)
    out = [{"label": f"https h1 wrk c={cfg['h1_connections']} {d}s", "kind": "h1",
            "connections": cfg["h1_connections"], "seconds": d + w + 0.5}]
    if cfg["h2"] and (tools is None or "h2load" in tools):
        out.append({"label": f"https h2 h2load c={cfg['h2_clients']} m={cfg['h2_streams']} {d}s",
                    "kind": "h2", "connections": cfg["h2_clients"], "streams": cfg["h2_streams"],
                    "seconds": d + w + 1.0})
    if cfg["hs_duration"]:
        out.append({"label": f"https handshake per request wrk c={cfg['hs_connections']} "
                             f"{cfg['hs_duration']}s",
                    "kind": "handshake", "connections": cfg["hs_connections"],
                    "seconds": cfg["hs_duration"] + 0.5})
    return out


def run_step(ctx, cfg, run, step):
    kind = step["kind"]
    if kind == "h1":
        return measure.wrk(ctx, run, "/", connections=step["connections"],
                           duration=cfg["duration"], warmup=cfg["warmup"])
    if kind == "h2":
        return measure.h2load(ctx, run, "/", clients=step["connections"],
                              streams=step["streams"], duration=cfg["duration"],
                              warmup=cfg["warmup"])
    return measure.wrk(ctx, run, "/", connections=step["connections"],
                       duration=cfg["hs_duration"], headers=["Connection: close"])


def _pick(results: dict, name: str, kind: str) -> dict | None:
    return next((r for r in results.get(name, []) if r.get("kind") == kind), None)


def _kinds(results: dict) -> list[str]:
    return [k for k in KINDS if any(_pick(results, n, k) for n in results)]


def _negotiated(r: dict) -> str:
    t = r.get("tls") or {}
    if not t.get("protocol"):
        return "-"
    alpn = t.get("alpn") or "no ALPN"
    warn = "" if alpn == "h2" else " **(not h2)**"
    return f"{t['protocol']}, {t.get('cipher') or '?'}, {alpn}{warn}"


def goal_lines(results: dict) -> list[str]:
    out = []
    for kind in _kinds(results):
        vx, ng = _pick(results, "veloxy", kind), _pick(results, "nginx", kind)
        if not vx or not ng or vx.get("error") or ng.get("error") or not ng.get("rps"):
            continue
        r = vx["rps"] / ng["rps"]
        p_vx, p_ng = vx["latency_ms"].get("p99"), ng["latency_ms"].get("p99")
        p99 = "p99 not measured"
        if p_vx is not None and p_ng is not None:
            p99 = (f"p99 {fmt_ms(p_vx)} vs {fmt_ms(p_ng)}: "
                   f"{'lower' if p_vx < p_ng else 'NOT lower'}")
        met = "met" if r >= GOAL_RPS and p_vx is not None and p_ng is not None and p_vx < p_ng \
            else "NOT met"
        out.append(f"- {KINDS[kind]}: veloxy / nginx requests/s = **{r:.2f}x** "
                   f"(goal {GOAL_RPS:.1f}x), {p99}: **{met}**")
    return out


def report(ctx, cfg, results):
    out = [
        "Every proxy terminates TLS with the same ECDSA P-256 self-signed certificate "
        "(`tls-cert.pem`) and proxies to the same plain HTTP/1.1 keep-alive upstreams. "
        f"HTTP/1.1: wrk, {cfg['h1_connections']} keep-alive connections, {cfg['duration']}s after "
        f"a {cfg['warmup']}s warm-up. HTTP/2: h2load, {cfg['h2_clients']} connections x "
        f"{cfg['h2_streams']} concurrent streams, {cfg['duration']}s after a warm-up; its "
        "percentiles come from h2load's per-request log (time from request to the end of the "
        "response). Handshakes: wrk with `Connection: close`, "
        f"{cfg['hs_connections']} connections, {cfg['hs_duration']}s (no warm-up): one TLS "
        "connection per request (wrk keeps its OpenSSL session object, so the proxy may resume "
        "it); when the load core is the busiest (the client's own handshakes), requests/s says "
        "more about wrk than the proxy: compare CPU/req. "
        "CPU/req = the proxy's CPU time over the measured run / requests completed.\n"]
    if cfg.get("proxies") and not getattr(ctx, "explicit_proxies", False):
        out.append(f"This profile runs on {', '.join(cfg['proxies'])} only (to keep it short); "
                   f"the full run covers {', '.join(TLS_PEERS)}.\n")
    for kind in _kinds(results):
        nginx = _pick(results, "nginx", kind) or {}
        out.append(f"**{KINDS[kind]}**\n")
        neg = " | Negotiated (h2load)" if kind == "h2" else ""
        out.append("| Proxy | Requests/Sec | Errors | p50 | p99 | CPU/req | req/s vs nginx "
                   f"| p99 vs nginx | CPU/req vs nginx{neg} | Bottleneck (busiest core) |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if neg else "") + "---|")
        for name in results:
            r = _pick(results, name, kind)
            if r is None:
                first = (results.get(name) or [{}])[0]
                if first.get("error"):
                    out.append(f"| {name} | failed: {first['error'][:80]} |" + " |" * (9 if neg else 8))
                continue
            if r.get("error"):
                out.append(f"| {name} | failed: {r['error'][:80]} |" + " |" * (9 if neg else 8))
                continue
            lat = r.get("latency_ms") or {}
            errs = f"{r['non2xx']} non-2xx / {r['socket_errors']} socket"
            p99_vs = ratio(lat.get("p99"), (nginx.get("latency_ms") or {}).get("p99"))
            cpu_vs = ratio(nginx.get("cpu_us_per_req"), r.get("cpu_us_per_req"))
            extra = f" | {_negotiated(r)}" if neg else ""
            out.append(f"| {name} | {fmt_rate(r['rps'])} | {errs} | {fmt_ms(lat.get('p50'))} "
                       f"| {fmt_ms(lat.get('p99'))} | {fmt_us(r.get('cpu_us_per_req'))} "
                       f"| {ratio(r['rps'], nginx.get('rps'))} | {p99_vs} | {cpu_vs}{extra} "
                       f"| {r.get('bottleneck', '-')} |")
        out.append("")
    out.append("req/s vs nginx: this proxy's requests/s / nginx's; p99 vs nginx: this proxy's p99 / "
               "nginx's (below 1.00x = lower); CPU/req vs nginx: nginx's CPU per request / this "
               "proxy's (above 1.00x = cheaper than nginx).\n")
    goals = goal_lines(results)
    if goals:
        out.append(f"**Goal: veloxy at {GOAL_RPS:.1f}x nginx's requests/s with TLS on the same "
                   "cores, and a lower p99**\n")
        out += goals
        out.append("")
    out.append("**TLS settings of each proxy** (configs in `configs/PROXY-tls/`)\n")
    out.append("| Proxy | Settings |")
    out.append("|---|---|")
    for name in results:
        out.append(f"| {name} | {SETTINGS_NOTES.get(name, '-')} |")
    out.append("")
    return "\n".join(out)


def charts(ctx, cfg, results, outdir):
    names = [n for n in results if any(not r.get("error") for r in results[n])]
    kinds = _kinds(results)
    labels = {"h1": "HTTP/1.1 (wrk)", "h2": "HTTP/2 (h2load)", "handshake": "handshake/request"}
    made = []

    def ok(n, k):
        r = _pick(results, n, k) or {}
        return {} if r.get("error") else r

    def series(key):
        return {labels[k]: [ok(n, k).get(key) for n in names] for k in kinds}

    if ch.grouped_bars(outdir / "tls_rps.png", "TLS: requests/s", "requests/s", names,
                       series("rps")):
        made.append(("Requests/s per proxy over HTTPS (tls)", "tls_rps.png"))
    p99 = {labels[k]: [(ok(n, k).get("latency_ms") or {}).get("p99") for n in names]
           for k in kinds}
    if ch.grouped_bars(outdir / "tls_p99.png", "TLS: p99 latency", "p99 (ms)", names, p99,
                       fmt=lambda v: f"{v:.1f}"):
        made.append(("p99 latency over HTTPS (tls)", "tls_p99.png"))
    if ch.grouped_bars(outdir / "tls_cpu_per_req.png", "TLS: proxy CPU time per request",
                       "microseconds of CPU per request", names, series("cpu_us_per_req"),
                       fmt=lambda v: f"{v:.0f}"):
        made.append(("Proxy CPU time per request over HTTPS (tls)", "tls_cpu_per_req.png"))
    return made
