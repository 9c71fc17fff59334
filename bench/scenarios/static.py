"""Static site: HTTPS + HTTP/2 with compression, veloxy vs nginx vs Caddy as web servers.

A generated site (harness/site.py, seeded: the same bytes every run): an HTML page (~30 KB),
six minified-looking CSS/JS bundles (14-270 KB, gzip ~3-4x), four JPEG/PNG images of random
bytes (7-88 KB, incompressible) and an SVG sprite, written to the run's temp dir. Every server
serves that directory over HTTPS + HTTP/2 with the tls scenario's certificate and its own
compression settings:

- veloxy: a file route (`root`), defaults: compress on (gzip 6, brotli 5, zstd 3, each variant
  compressed once and cached in memory), file cache 64 MiB;
- nginx: `gzip on` with `gzip_comp_level` NGINX_GZIP_LEVEL (nginx's default, 1) for the text
  types, sendfile, open_file_cache; nginx has no brotli without a third-party module and
  compresses every response anew;
- Caddy: `file_server` + `encode gzip` (Caddy's default level 5), also compressed per response.

Before measuring, each file is fetched once with curl (HTTP/2, the step's Accept-Encoding,
--compressed) and the decoded body compared with the original: a server that serves wrong
bytes fails the step. Then h2load cycles through the site's URLs (each connection requests
them in turn) with `accept-encoding: gzip, deflate, br` (step "br": what browsers send, minus
zstd) and `accept-encoding: gzip` (step "gzip": the same algorithm everywhere). Reported:
requests/s, p50/p99 (h2load --log-file), DATA bytes per request, compression ratio of the
mix (uncompressed bytes of the requests made / DATA bytes received), proxy CPU per request,
ratios vs nginx and Caddy. Goal (issue 6): veloxy >= nginx's requests/s with an equal or
better compression ratio, and >= 2x Caddy's requests/s.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from harness import charts as ch
from harness import measure, site
from harness.loadgen import LoadError
from harness.measure import fmt_bytes, fmt_ms, fmt_rate, fmt_us, ratio
from scenarios import tls

NAME = "static"
TITLE = "Static site (HTTPS + HTTP/2 with compression, h2load)"
ORDER = 70
TARGETS = "proxies"
SCHEME = "https"
TOOLS = ["h2load"]
STATIC_PEERS = ["veloxy", "nginx", "caddy"]
TEMPLATES = {"veloxy": "veloxy-static.toml.tmpl", "nginx": "nginx-static.conf.tmpl",
             "caddy": "Caddyfile-static.tmpl"}
SEED = 6
NGINX_GZIP_LEVEL = 1  # nginx's default gzip_comp_level (the "gzip on")
CADDY_ENCODINGS = "gzip"  # the "encode gzip" (default level 5)
GOAL_VS_CADDY = 2.0
# step kind -> Accept-Encoding sent by curl (verification) and h2load
ENCODINGS = {"br": "gzip, deflate, br", "gzip": "gzip"}
KINDS = {"br": "accept-encoding: gzip, deflate, br",
         "gzip": "accept-encoding: gzip"}
_BASE = {"supported": STATIC_PEERS, "clients": 16, "streams": 10, "kinds": ["br", "gzip"]}
PROFILES = {
    "quick": {**_BASE, "duration": 3, "warmup": 1, "proxies": ["veloxy", "nginx"]},
    "full": {**_BASE, "duration": 10, "warmup": 2},
}

SETTINGS_NOTES = {
    "veloxy": "`[[routes]] path = \"/\" root = SITE` (file route defaults: `compress = true`: "
              "br 5 / zstd 3 / gzip 6 by Accept-Encoding, each variant compressed once per file "
              "version and kept in the 64 MiB `cache_bytes` with the file contents; "
              "`precompressed = true`, no sidecar files in the site), `[listeners.web.tls]`",
    "nginx": f"`root SITE`, `gzip on`, `gzip_comp_level {NGINX_GZIP_LEVEL}` (nginx's default), "
             "`gzip_types` text/css application/javascript application/json image/svg+xml "
             "image/x-icon (text/html always), `gzip_min_length 256`, `gzip_vary on`, `sendfile on`, "
             "`open_file_cache max=1000` (valid 1s), `listen ... ssl http2`, "
             "`ssl_session_cache`; every response compressed anew, no brotli (not built in)",
    "caddy": f"`root * SITE`, `encode {CADDY_ENCODINGS}` (Caddy's default gzip level 5, minimum "
             "length 512), `file_server`, `tls CERT KEY`, `protocols h1 h2`; every response "
             "compressed anew",
}


def requires(ctx):
    if not shutil.which("curl"):
        return "curl is not installed (needed to check the served bytes)"
    why = tls.requires(ctx)  # the certificate, shared with the tls scenario
    if why:
        return why
    root = ctx.tmp / "static-site"
    ctx.static_site = {"root": str(root), "files": site.make_site(root, SEED)}
    return None


def peer_config(ctx, cfg, name):
    files = getattr(ctx, "tls_files", None) or {"cert": "cert.pem", "key": "key.pem",
                                                "bundle": "bundle.pem"}
    out = dict(tls.tls_settings(name, files, tls._nginx_new_http2(ctx)) or {})
    out["ROOT"] = (getattr(ctx, "static_site", None) or {}).get("root", "site")
    if name == "nginx":
        out["GZIP_LEVEL"] = NGINX_GZIP_LEVEL
    if name == "caddy":
        out["ENCODINGS"] = CADDY_ENCODINGS
    return out


def steps(ctx, cfg):
    tools = getattr(ctx, "tools", None)
    if tools is not None and "h2load" not in tools:
        return []
    d = cfg["duration"]
    return [{"label": f"{kind} h2load c={cfg['clients']} m={cfg['streams']} {d}s", "kind": kind,
             "connections": cfg["clients"], "streams": cfg["streams"],
             "seconds": d + cfg["warmup"] + 2.0}
            for kind in cfg["kinds"]]


def parse_curl_headers(text: str) -> dict[str, str]:
    """The last response head of a curl -D dump: lower-case header name -> value."""
    heads = [h for h in text.replace("\r\n", "\n").split("\n\n") if h.strip()]
    out: dict[str, str] = {}
    for line in (heads[-1] if heads else "").splitlines()[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out


def check_one(original: bytes, accept: str, code: str, version: str, headers: dict[str, str],
              body: bytes) -> str | None:
    """What is wrong with one verification fetch (None: fine)."""
    if code != "200":
        return f"status {code}"
    if version != "2":
        return f"HTTP version {version}, not 2"
    enc = headers.get("content-encoding", "identity").lower()
    offered = {x.split(";")[0].strip().lower() for x in accept.split(",")} | {"identity"}
    if enc not in offered:
        return f"content-encoding {enc!r} not offered ({accept})"
    if body != original:
        return f"decoded body differs ({len(body)} bytes, expected {len(original)})"
    return None


def verify(ctx, run, accept: str) -> dict:
    """Fetch every site file once (curl, HTTP/2, --compressed) and compare the decoded body
    with the original. Returns {"files": {path: {...}}, "problems": [...]}."""
    files = ctx.static_site["files"]
    work = ctx.tmp / f"verify-{run.name}-{ctx.seq}"
    work.mkdir(parents=True, exist_ok=True)
    out: dict = {"files": {}, "problems": []}
    for path, original in files.items():
        hdr, body = work / "head.txt", work / "body.bin"
        for f in (hdr, body):
            f.unlink(missing_ok=True)
        cmd = ["curl", "-sS", "-k", "--http2", "--compressed", "-H", f"accept-encoding: {accept}",
               "-D", str(hdr), "-o", str(body), "--max-time", "10",
               "-w", "%{http_code} %{http_version} %{size_download}",
               run.base_url + site.url_path(path)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            out["problems"].append(f"{path}: curl timed out")
            continue
        parts = r.stdout.split()
        if r.returncode != 0 or len(parts) != 3:
            out["problems"].append(f"{path}: curl exited {r.returncode}: {r.stderr.strip()[:160]}")
            continue
        code, version, wire = parts
        head = parse_curl_headers(hdr.read_text(errors="replace")) if hdr.exists() else {}
        got = body.read_bytes() if body.exists() else b""
        bad = check_one(original, accept, code, version, head, got)
        out["files"][path] = {"size": len(original), "wire": int(float(wire)),
                              "encoding": head.get("content-encoding", "identity").lower(),
                              "content_type": head.get("content-type", "")}
        if bad:
            out["problems"].append(f"{path}: {bad}")
    shutil.rmtree(work, ignore_errors=True)
    return out


def mix_stats(files: dict[str, bytes], res: dict) -> dict:
    """Derived numbers of one h2load run over the site's URLs (requested in turn, so the mix
    is the file list; the per-connection remainder is at most one file per URL and
    connection): DATA bytes per request, the mean uncompressed size of a request and the
    compression ratio of the mix."""
    n = res.get("requests") or 0
    data = res.get("data_bytes")
    mean = sum(len(b) for b in files.values()) / len(files) if files else 0
    out = {"mean_size": mean, "data_per_req": None, "compression_ratio": None}
    if n and data:
        out["data_per_req"] = data / n
        out["compression_ratio"] = n * mean / data
    return out


def run_step(ctx, cfg, run, step):
    accept = ENCODINGS[step["kind"]]
    files = ctx.static_site["files"]
    v = verify(ctx, run, accept)
    served = {p: f for p, f in v["files"].items()}
    if v["problems"]:
        return {"error": "wrong response: " + "; ".join(v["problems"])[:600], "verify": served}
    paths = [site.url_path(p) for p in files]
    res = measure.h2load(ctx, run, paths, clients=step["connections"], streams=step["streams"],
                         duration=cfg["duration"], warmup=cfg["warmup"],
                         headers=[f"accept-encoding: {accept}"])
    if res.get("data_bytes") is None:
        raise LoadError("h2load printed no data byte count")
    res.update(mix_stats(files, res))
    wire = sum(f["wire"] for f in served.values())
    res["verify"] = served
    res["expected_data_per_req"] = wire / len(served) if served else None
    res["text_ratio"] = text_ratio(files, served)
    res["accept_encoding"] = accept
    return res


def text_ratio(files: dict[str, bytes], served: dict) -> float | None:
    """Compression ratio over the compressible files alone (HTML, CSS, JS, SVG), from the
    verification fetches."""
    texts = [p for p in files if not p.endswith((".jpg", ".png"))]
    wire = sum(served[p]["wire"] for p in texts if p in served)
    return sum(len(files[p]) for p in texts) / wire if wire else None


def encodings_summary(served: dict) -> str:
    counts: dict[str, int] = {}
    for f in served.values():
        counts[f["encoding"]] = counts.get(f["encoding"], 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _pick(results: dict, name: str, kind: str) -> dict | None:
    return next((r for r in results.get(name, []) if r.get("kind") == kind), None)


def _kinds(results: dict) -> list[str]:
    return [k for k in KINDS if any(_pick(results, n, k) for n in results)]


def _ok(r: dict | None) -> dict:
    return {} if not r or r.get("error") else r


def goal_lines(results: dict) -> list[str]:
    out = []
    for kind in _kinds(results):
        vx = _ok(_pick(results, "veloxy", kind))
        ng = _ok(_pick(results, "nginx", kind))
        cd = _ok(_pick(results, "caddy", kind))
        if not vx:
            continue
        parts, met = [], True
        if ng.get("rps"):
            r = vx["rps"] / ng["rps"]
            cr_v, cr_n = vx.get("compression_ratio"), ng.get("compression_ratio")
            parts.append(f"veloxy / nginx requests/s = **{r:.2f}x** (goal >= 1.00x)")
            if cr_v and cr_n:
                parts.append(f"compression ratio {cr_v:.2f} vs nginx {cr_n:.2f} "
                             f"({'equal or better' if cr_v >= cr_n * 0.995 else '**worse**'})")
            met = met and r >= 1.0 and bool(cr_v and cr_n and cr_v >= cr_n * 0.995)
        else:
            met = False
            parts.append("nginx not measured")
        if cd.get("rps"):
            r = vx["rps"] / cd["rps"]
            parts.append(f"veloxy / Caddy requests/s = **{r:.2f}x** (goal >= {GOAL_VS_CADDY:.1f}x)")
            met = met and r >= GOAL_VS_CADDY
        else:
            met = False
            parts.append("Caddy not measured")
        out.append(f"- {KINDS[kind]}: " + "; ".join(parts) + f": **{'met' if met else 'NOT met'}**")
    return out


def report(ctx, cfg, results):
    files = (getattr(ctx, "static_site", None) or {}).get("files") or site.site_files(SEED)
    total = sum(len(b) for b in files.values())
    out = [
        f"A generated site ({len(files)} files, {fmt_bytes(total)} in all, the same bytes every "
        f"run: `bench/harness/site.py`, seed {SEED}) served over HTTPS + HTTP/2 (the tls "
        "scenario's certificate) by each server's own file serving and compression. h2load, "
        f"{cfg['clients']} connections x {cfg['streams']} concurrent streams, each connection "
        f"requesting the {len(files)} URLs in turn, {cfg['duration']}s after a {cfg['warmup']}s "
        "warm-up, with the Accept-Encoding of the step. Before that, curl fetched each file with "
        "the same Accept-Encoding and checked that the decoded body equals the original. "
        "Data/req = DATA bytes received (response bodies as sent, compressed or not; headers "
        "excluded) / requests; ratio = uncompressed bytes of the requests made / DATA bytes "
        "(the whole mix, images included: they are served as they are); text ratio = the same "
        "over the HTML/CSS/JS/SVG files alone (from the curl fetches). CPU/req = the server's "
        "CPU time over the measured run / requests completed.\n"]
    if cfg.get("proxies") and not getattr(ctx, "explicit_proxies", False):
        out.append(f"This profile runs on {', '.join(cfg['proxies'])} only (to keep it short); "
                   f"the full run covers {', '.join(STATIC_PEERS)}.\n")
    for kind in _kinds(results):
        nginx = _ok(_pick(results, "nginx", kind))
        caddy = _ok(_pick(results, "caddy", kind))
        out.append(f"**{KINDS[kind]}**\n")
        out.append("| Server | Requests/Sec | Errors | p50 | p99 | Data/req | Ratio | Text ratio "
                   "| CPU/req | req/s vs nginx | req/s vs Caddy | CPU/req vs nginx | Encodings "
                   "served | Bottleneck (busiest core) |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for name in results:
            r = _pick(results, name, kind)
            if r is None:
                first = (results.get(name) or [{}])[0]
                if first.get("error"):
                    out.append(f"| {name} | failed: {first['error'][:120]} |" + " |" * 12)
                continue
            if r.get("error"):
                out.append(f"| {name} | failed: {r['error'][:200]} |" + " |" * 12)
                continue
            lat = r.get("latency_ms") or {}
            cr, tr = r.get("compression_ratio"), r.get("text_ratio")
            out.append(
                f"| {name} | {fmt_rate(r['rps'])} | {r['non2xx']} non-2xx / {r['socket_errors']} "
                f"socket | {fmt_ms(lat.get('p50'))} | {fmt_ms(lat.get('p99'))} "
                f"| {fmt_bytes(r.get('data_per_req'))} | {f'{cr:.2f}x' if cr else '-'} "
                f"| {f'{tr:.2f}x' if tr else '-'} | {fmt_us(r.get('cpu_us_per_req'))} "
                f"| {ratio(r['rps'], nginx.get('rps'))} | {ratio(r['rps'], caddy.get('rps'))} "
                f"| {ratio(nginx.get('cpu_us_per_req'), r.get('cpu_us_per_req'))} "
                f"| {encodings_summary(r.get('verify') or {})} | {r.get('bottleneck', '-')} |")
        out.append("")
    out.append("req/s vs X: this server's requests/s / X's; CPU/req vs nginx: nginx's CPU per "
               "request / this server's (above 1.00x = cheaper than nginx).\n")
    busy = load_bound(ctx, results)
    if busy:
        out.append("Load generator near saturation (h2load's core(s) >= 85% busy: the server may "
                   "have more to give than these requests/s): " + ", ".join(busy) + ".\n")
    goals = goal_lines(results)
    if goals:
        out.append("**Goal (issue 6): veloxy at or above nginx's requests/s with an equal or "
                   f"better compression ratio, and at least {GOAL_VS_CADDY:.0f}x Caddy's**\n")
        out += goals
        out.append("")
    out += file_table(files, results)
    out.append("**Settings of each server** (configs in `configs/SERVER-static/`; templates "
               "`bench/peers/*-static*.tmpl`)\n")
    out.append("| Server | Settings |")
    out.append("|---|---|")
    for name in results:
        out.append(f"| {name} | {SETTINGS_NOTES.get(name, '-')} |")
    out.append("")
    out.append(f"Fairness: nginx keeps its default `gzip_comp_level {NGINX_GZIP_LEVEL}` (the fastest "
               "gzip, so its requests/s is as high as its per-response compression allows and "
               "its bytes on the wire show the price; level 6 would match veloxy's gzip bytes at "
               "several times the CPU). nginx and Caddy compress each response as it is sent; "
               "veloxy compresses each file variant once and serves it from memory. nginx's "
               "equivalent would be `gzip_static` with prebuilt .gz files, which the issue's "
               "setup (`gzip on`) does not have.\n")
    return "\n".join(out)


def load_bound(ctx, results: dict, limit: float = 85.0) -> list[str]:
    """"SERVER (KIND): core N X%" for the steps whose load-generator cores were >= limit busy."""
    cores = {str(c) for c in getattr(ctx, "load_cpus", [])}
    out = []
    for name, rs in results.items():
        for r in rs:
            if r.get("error") or not r.get("core_busy"):
                continue
            hot = [f"core {c} {v:.0f}%" for c, v in r["core_busy"].items()
                   if c in cores and v >= limit]
            if hot:
                out.append(f"{name} ({r.get('kind')}): {', '.join(hot)}")
    return out


def file_table(files: dict[str, bytes], results: dict) -> list[str]:
    """Bytes served per file and server (from the curl fetches), per step."""
    cols = [(n, k) for k in _kinds(results) for n in results
            if (_ok(_pick(results, n, k)).get("verify"))]
    if not cols:
        return []
    out = ["**Bytes served per file** (curl, body as received, and its Content-Encoding)\n",
           "| File | Size | " + " | ".join(f"{n} ({k})" for n, k in cols) + " |",
           "|---|---:|" + "---:|" * len(cols)]
    for path, data in files.items():
        cells = []
        for n, k in cols:
            f = _ok(_pick(results, n, k))["verify"].get(path)
            cells.append("-" if not f else
                         f"{fmt_bytes(f['wire'])}" + ("" if f["encoding"] == "identity"
                                                      else f" {f['encoding']}"))
        out.append(f"| {site.url_path(path)} | {fmt_bytes(len(data))} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def charts(ctx, cfg, results, outdir: Path):
    names = [n for n in results if any(not r.get("error") for r in results[n])]
    kinds = _kinds(results)
    labels = {"br": "gzip, deflate, br", "gzip": "gzip only"}
    made = []

    def series(key):
        return {labels[k]: [_ok(_pick(results, n, k)).get(key) for n in names] for k in kinds}

    if ch.grouped_bars(outdir / "static_rps.png", "Static site over HTTPS + HTTP/2: requests/s",
                       "requests/s", names, series("rps")):
        made.append(("Requests/s per server (static)", "static_rps.png"))
    p99 = {labels[k]: [(_ok(_pick(results, n, k)).get("latency_ms") or {}).get("p99")
                       for n in names] for k in kinds}
    if ch.grouped_bars(outdir / "static_p99.png", "Static site: p99 latency", "p99 (ms)", names,
                       p99, fmt=lambda v: f"{v:.1f}"):
        made.append(("p99 latency per server (static)", "static_p99.png"))
    if ch.grouped_bars(outdir / "static_bytes_per_req.png",
                       "Static site: DATA bytes per request (lower = better compression)",
                       "bytes per request", names, series("data_per_req"),
                       fmt=lambda v: f"{v / 1000:.1f}k"):
        made.append(("Bytes on the wire per request (static)", "static_bytes_per_req.png"))
    if ch.grouped_bars(outdir / "static_cpu_per_req.png", "Static site: server CPU time per request",
                       "microseconds of CPU per request", names, series("cpu_us_per_req"),
                       fmt=lambda v: f"{v:.0f}"):
        made.append(("Server CPU time per request (static)", "static_cpu_per_req.png"))
    return made
