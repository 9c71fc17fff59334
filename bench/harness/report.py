"""results.json, report.md, charts and the terminal summary."""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from pathlib import Path

from . import charts as ch
from .measure import fmt_bytes, fmt_ms, fmt_rate, fmt_us, ratio

CONFIG_FILES = ("nginx.conf", "haproxy.cfg", "envoy.yaml", "Caddyfile", "traefik.yml",
                "dynamic.yml", "veloxy.toml", "varnish.vcl", "command.txt")


def save_config(ctx, run, variant: str | None = None) -> None:
    """Keep the rendered config of each proxy (first start only) next to the report;
    a scenario's own settings go to configs/PROXY-SCENARIO/."""
    key = f"{run.name}-{variant}" if variant else run.name
    saved = ctx.__dict__.setdefault("_configs_saved", set())
    if key in saved:
        return
    saved.add(key)
    dest = ctx.outdir / "configs" / key
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in CONFIG_FILES:
        src = run.workdir / f
        if src.exists():
            shutil.copy2(src, dest / f)


def one_line(r: dict) -> str:
    if r.get("error"):
        return f"error: {r['error'][:160]}"
    lat = r.get("latency_ms", {})
    parts = [f"{fmt_rate(r.get('rps'))} req/s"]
    if r.get("offered_rps"):
        parts.insert(0, f"offered {fmt_rate(r['offered_rps'])}")
    parts += [f"p99 {fmt_ms(lat.get('p99'))}", f"errors {r.get('errors', 0)}",
              f"cpu/req {fmt_us(r.get('cpu_us_per_req'))}",
              f"proxy cpu {r.get('proxy_cpu_pct', 0):.0f}%", f"busiest {r.get('bottleneck')}"]
    return ", ".join(parts)


def machine() -> dict:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": mem,
            "kernel": platform.release(), "python": platform.python_version(),
            "hostname": platform.node()}


def meta(ctx) -> dict:
    return {
        "name": ctx.outdir.name, "profile": ctx.profile, "argv": ctx.argv,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ctx.started)),
        "duration_s": round(time.time() - ctx.started, 1), "interrupted": ctx.interrupted,
        "machine": machine(), "proxy_cpus": ctx.proxy_cpus, "load_cpus": ctx.load_cpus,
        "workers": ctx.workers, "keepalive": ctx.keepalive,
        "upstreams": ctx.upstreams.addrs if ctx.upstreams else [],
        "versions": ctx.versions,
        "tools": {k: {"path": t.path, "reason": t.reason, "install_s": round(t.seconds, 1),
                      "cached": t.cached} for k, t in ctx.tool_info.items()},
        "peers": ctx.peer_status, "events": ctx.events,
    }


def write_results(ctx) -> None:
    data = {"meta": meta(ctx), "results": ctx.results}
    tmp = ctx.outdir / "results.json.tmp"
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(ctx.outdir / "results.json")


def _scenario_section(ctx, sc) -> list[str]:
    res = ctx.results.get(sc.NAME)
    if res is None:
        return []
    out = [f"## {getattr(sc, 'TITLE', sc.NAME)}\n"]
    if "_skipped" in res:
        return out + [f"Skipped: {res['_skipped']}\n"]
    cfg = sc.PROFILES[ctx.profile]
    try:
        out.append(sc.report(ctx, cfg, res))
    except Exception as e:  # a broken report section must not lose the others
        out.append(f"(report failed: {type(e).__name__}: {e})")
    if hasattr(sc, "charts") and ch.HAVE:
        try:
            for title, fname in sc.charts(ctx, cfg, res, ctx.outdir):
                out.append(f"![{title}]({fname})\n")
        except Exception as e:
            out.append(f"(charts failed: {type(e).__name__}: {e})")
    return out


def summary_rows(ctx) -> list[tuple]:
    """(proxy, rps, transfer, errors, p99, cpu/req, vs nginx) at the highest ceiling load."""
    ceil = ctx.results.get("ceiling") or {}
    if not ceil or "_skipped" in ceil:
        return []
    conns = max((r.get("connections", 0) for rs in ceil.values() for r in rs), default=0)
    pick = {n: next((r for r in rs if r.get("connections") == conns), None) for n, rs in ceil.items()}
    nginx = pick.get("nginx") or {}
    rows = []
    for n, r in pick.items():
        if not r or r.get("error"):
            rows.append((n, "failed", "", "", "", "", ""))
            continue
        rows.append((n, fmt_rate(r["rps"]), f"{fmt_bytes(r['transfer_bps'])}/s",
                     str(r["errors"]), fmt_ms(r["latency_ms"].get("p99")),
                     fmt_us(r.get("cpu_us_per_req")), ratio(r["rps"], nginx.get("rps"))))
    return rows


def write_report(ctx, scenarios) -> Path:
    m = meta(ctx)
    mach = m["machine"]
    out = [f"# veloxy benchmark: {m['name']}\n"]
    if ctx.interrupted:
        out.append("**INTERRUPTED: partial results.**\n")
    out.append(f"- Profile: `{ctx.profile}`; command: `bench/run {' '.join(ctx.argv)}`")
    out.append(f"- Started {m['started']}, took {m['duration_s']:.0f}s")
    out.append(f"- Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory']}, "
               f"Linux {mach['kernel']}")
    out.append(f"- Core split (taskset): proxy on core(s) {ctx.proxy_cpus}; load generator and "
               f"{ctx.n_upstreams} upstreams on core(s) {ctx.load_cpus}")
    out.append(f"- Every proxy: {ctx.workers} worker(s)/thread(s), upstream keep-alive pool "
               f"{ctx.keepalive}, X-Forwarded-For, access log off "
               "(configs: `bench/peers/`, rendered copies in `configs/`)\n")
    rows = summary_rows(ctx)
    if rows:
        conns = max(r.get("connections", 0) for rs in ctx.results["ceiling"].values() for r in rs)
        out.append(f"## Summary (ceiling, {conns} connections)\n")
        out.append("| Proxy | Requests/Sec | Transfer/Sec | Errors | p99 | CPU/req | vs nginx |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out.append("")
    if ctx.events:
        out.append("## Incidents\n")
        out += [f"- {' '.join(e.split())[:500]}" for e in ctx.events]
        out.append("")
    out.append("## Peers\n")
    out.append("| Peer | Status | X-Forwarded-For seen by upstream | Notes |")
    out.append("|---|---|---|---|")
    xff_txt = {True: "yes", False: "**no**", None: "-"}
    for name, st in ctx.peer_status.items():
        note = " ".join(str(st.get("reason", "")).split())[:300].replace("|", "/")
        out.append(f"| {name} | {st['status']} | {xff_txt[st.get('xff')]} | {note} |")
    out.append("")
    for sc in scenarios:
        out += _scenario_section(ctx, sc)
    if not ch.HAVE:
        out.append("_Charts skipped: matplotlib is not installed._\n")
    out.append("## Versions\n")
    out.append("| Tool | Version | Install/build this run |")
    out.append("|---|---|---|")
    for k, t in m["tools"].items():
        ver = ctx.versions.get(k, "-" if t["path"] else f"unavailable: {t['reason'][:100]}")
        how = "cached" if t["cached"] else f"{t['install_s']:.0f}s"
        out.append(f"| {k} | {ver.replace('|', '/')} | {how} |")
    out.append("\nRaw numbers: `results.json` (per step, including /proc samples).\n")
    path = ctx.outdir / "report.md"
    path.write_text("\n".join(out))
    return path


def terminal_summary(ctx) -> str:
    lines = []
    rows = summary_rows(ctx)
    if rows:
        hdr = ("Proxy", "Requests/Sec", "Transfer/Sec", "Errors", "p99", "CPU/req", "vs nginx")
        widths = [max(len(str(x[i])) for x in [hdr, *rows]) for i in range(len(hdr))]
        fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
        lines.append(fmt.format(*hdr))
        lines += [fmt.format(*r) for r in rows]
    bad = [f"  {n}: {st['status']}: {' '.join(str(st['reason']).split())[:200]}"
           for n, st in ctx.peer_status.items() if st["status"] != "ok"]
    if bad:
        lines.append("Peers not measured:")
        lines += bad
    return "\n".join(lines)
