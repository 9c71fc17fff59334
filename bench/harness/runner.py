"""The benchmark run: installs, upstreams, scenarios over proxies, results."""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from . import peers, procs, report
from .install import Installer, Tool, versions
from .loadgen import LoadError
from .peers import DIRECT
from .procs import StartError
from .ui import Progress, fmt_s, say, warn

BENCH = Path(__file__).resolve().parent.parent

PEER_TOOL = {"veloxy": "veloxy", "nginx": "nginx", "haproxy": "haproxy", "envoy": "envoy",
             "caddy": "caddy", "traefik": "traefik", "pingora": "pingora", DIRECT: "upstream"}


class SetupError(RuntimeError):
    pass


@dataclass
class Ctx:
    profile: str
    cache: Path
    outdir: Path
    tmp: Path
    proxy_cpus: list[int]
    load_cpus: list[int]
    workers: int
    keepalive: int
    n_upstreams: int = 4
    nofile: int = 20000
    maxconn: int | None = None  # peers' connection limit; None = peers._maxconn's default
    tool_info: dict[str, Tool] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    upstreams: peers.Upstreams | None = None
    results: dict = field(default_factory=dict)
    peer_status: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    seq: int = 0
    veloxy_cli: bool = False
    explicit_proxies: bool = False  # --proxies given: scenarios' own proxy subsets are ignored
    interrupted: bool = False
    events: list = field(default_factory=list)
    started: float = field(default_factory=time.time)
    argv: list[str] = field(default_factory=list)


def parse_cores(spec: str | None) -> tuple[list[int], list[int]]:
    """'0:1' or '0-3:4-7' -> (proxy cpus, load cpus). Default: first half for the proxy."""
    avail = sorted(os.sched_getaffinity(0))

    def expand(s: str) -> list[int]:
        out: list[int] = []
        for part in s.split(","):
            if "-" in part:
                a, b = part.split("-")
                out += list(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
        return out

    if spec:
        a, _, b = spec.partition(":")
        proxy, load = expand(a), expand(b)
    elif len(avail) == 1:
        proxy, load = avail, avail
    else:
        half = max(1, len(avail) // 2)
        proxy, load = avail[:half], avail[half:]
    bad = [c for c in proxy + load if c not in avail]
    if bad or not proxy or not load:
        raise SetupError(f"bad core split {spec!r}: cores available {avail}")
    return proxy, load


def raise_nofile(want: int = 65536) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for lim in ((max(want, hard), max(want, hard)), (hard, hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, lim)
            return lim[0]
        except (ValueError, OSError):
            continue
    return soft


def default_results_dir(profile: str) -> Path:
    """bench/results keeps the runs worth committing; a smoke run only checks the harness
    (CI runs it on every clone), so its output goes to the gitignored target/ instead of
    leaving untracked files behind."""
    if profile == "smoke":
        return BENCH.parent / "target" / "bench-smoke"
    return BENCH / "results"


def make_ctx(args, profile: str) -> Ctx:
    cache = Path(os.environ.get("VELOXY_BENCH_CACHE") or BENCH / ".cache").resolve()
    cache.mkdir(parents=True, exist_ok=True)
    proxy_cpus, load_cpus = parse_cores(args.cores)
    name = args.name or f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    outdir = Path(args.results_dir or default_results_dir(profile)) / name
    outdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="veloxy-bench-"))
    return Ctx(profile=profile, cache=cache, outdir=outdir, tmp=tmp, proxy_cpus=proxy_cpus,
               load_cpus=load_cpus, workers=args.workers or len(proxy_cpus),
               keepalive=args.keepalive, n_upstreams=args.upstreams)


def install_tools(ctx: Ctx, wanted: list[str], *, allow: bool, builds: bool, build_ws: bool) -> None:
    """Fill ctx.tools with what can be had; never raises for a single peer."""
    inst = Installer(ctx.cache, allow_install=allow)
    info: dict[str, Tool] = {}
    info.update(inst.workspace(build=build_ws))
    apt_names = [n for n in ("wrk", "nginx", "haproxy", "h2load", "strace", "varnish", "redis")
                 if n in wanted]
    info.update(inst.apt(apt_names))
    for n in ("envoy", "caddy", "pingora", "oha", "traefik", "pacer"):
        if n not in wanted:
            continue
        if builds:
            info[n] = getattr(inst, n)()
        else:
            saved = inst.allow
            inst.allow = False
            info[n] = getattr(inst, n)()
            inst.allow = saved
            if not info[n].ok:
                info[n].reason = ("not built yet (smoke mode builds no peers, only the veloxy "
                                  "workspace if needed; run --quick once)")
    ctx.tool_info = info
    ctx.tools = {k: t.path for k, t in info.items() if t.ok}
    ctx.versions = versions(info)
    for k, t in info.items():
        if not t.ok:
            warn(f"{k}: unavailable: {t.reason}")
        elif not t.cached:
            say(f"{k}: ready in {fmt_s(t.seconds)} ({t.path})")


def start_upstreams(ctx: Ctx) -> None:
    if "upstream" not in ctx.tools:
        raise SetupError("the test upstream binary is missing: "
                         + ctx.tool_info.get("upstream", Tool("upstream")).reason)
    say(f"starting {ctx.n_upstreams} upstreams on core(s) {procs.cpu_list(ctx.load_cpus)}")
    try:
        ctx.upstreams = peers.start_upstreams(ctx.tools["upstream"], ctx.n_upstreams,
                                              ctx.load_cpus, ctx.tmp)
    except StartError as e:
        raise SetupError(f"upstreams failed to start: {e}") from e
    say("upstreams: " + ", ".join(ctx.upstreams.addrs))


def upstreams_dead(ctx: Ctx) -> list[str]:
    dead = []
    for p, addr in zip(ctx.upstreams.procs, ctx.upstreams.addrs, strict=True):
        if p.poll() is not None:
            dead.append(f"{addr} (exit code {p.returncode})")
    return dead


def ensure_upstreams(ctx: Ctx, when: str) -> str | None:
    """Restart the upstreams if any died; returns a description of what happened."""
    dead = upstreams_dead(ctx)
    if not dead:
        return None
    logs = " | ".join(procs.tail(f, 3) for f in sorted(ctx.tmp.glob("upstream-*.log")))[-600:]
    msg = f"upstream(s) died {when}: {', '.join(dead)}; logs: {logs or '(empty)'}"
    warn(msg + "; restarting the upstreams")
    ctx.events.append(msg)
    keep = ctx.tmp / f"dead-upstreams-{len(ctx.events)}"
    keep.mkdir()
    for f in ctx.tmp.glob("upstream-*"):
        shutil.move(str(f), keep / f.name)
    for p in ctx.upstreams.procs:
        procs.REGISTRY.stop(p)
    start_upstreams(ctx)
    return msg


def select_proxies(ctx: Ctx, requested: list[str]) -> list[str]:
    out = []
    for name in requested:
        tool = PEER_TOOL[name]
        if tool in ctx.tools:
            out.append(name)
            ctx.peer_status.setdefault(name, {"status": "ok", "reason": ""})
        else:
            reason = ctx.tool_info.get(tool, Tool(tool, reason="not requested")).reason
            ctx.peer_status[name] = {"status": "unavailable", "reason": reason}
    return out


def scenario_targets(ctx: Ctx, cfg: dict, proxies: list[str]) -> list[str]:
    """The proxies a scenario runs on: its profile's "proxies" subset (to keep a profile
    short) unless the command line named the proxies explicitly; never a proxy outside the
    profile's "supported" list (the proxies the scenario has settings for, e.g. tls)."""
    supported = cfg.get("supported")
    if supported:
        proxies = [p for p in proxies if p in supported]
    only = cfg.get("proxies")
    if not only or ctx.explicit_proxies:
        return list(proxies)
    return [p for p in proxies if p in only]


def run_scenarios(ctx: Ctx, scenarios: list, proxies: list[str]) -> None:
    plans = []
    for sc in scenarios:
        cfg = sc.PROFILES[ctx.profile]
        why = sc.requires(ctx) if hasattr(sc, "requires") else None
        if why:
            warn(f"scenario {sc.NAME} skipped: {why}")
            ctx.results[sc.NAME] = {"_skipped": why}
            continue
        targets = scenario_targets(ctx, cfg, proxies)
        if getattr(sc, "TARGETS", "proxies") == "proxies+direct" and "upstream" in ctx.tools:
            targets.append(DIRECT)
        plans.append((sc, cfg, targets, sc.steps(ctx, cfg)))
    total = sum(len(t) * (sum(s["seconds"] for s in st) + 1.5) for _, _, t, st in plans)
    say(f"{len(plans)} scenario(s) x {len(proxies)} proxies, estimated {fmt_s(total)}")
    prog = Progress(total)
    for sc, cfg, targets, steps in plans:
        results: dict[str, list] = {}
        ctx.results[sc.NAME] = results
        for name in targets:
            est = sum(s["seconds"] for s in steps) + 1.5
            st = ctx.peer_status.get(name, {})
            if st.get("status") not in (None, "ok"):
                prog.step(f"{sc.NAME} | {name} | skipped ({st['status']})", est)
                prog.finish_step()
                continue
            prog.step(f"{sc.NAME} | {name} | starting", 1.5)
            ensure_upstreams(ctx, f"before {sc.NAME} / {name}")
            extra = sc.peer_config(ctx, cfg, name) if hasattr(sc, "peer_config") else None
            template = getattr(sc, "TEMPLATES", {}).get(name)
            try:
                run = peers.start(ctx, name, extra,
                                  scheme=getattr(sc, "SCHEME", "http") if name != DIRECT else "http",
                                  template=template)
            except StartError as e:
                own = bool(extra or template)
                warn(f"{name} failed to start{' with ' + sc.NAME + ' settings' if own else ''}: {e}")
                if own:  # only this scenario's config is broken: keep the peer for the others
                    results[name] = [{"error": f"start failed with {sc.NAME} settings: {e}",
                                      "step": "start"}]
                else:
                    ctx.peer_status[name] = {"status": "start failed", "reason": str(e)}
                prog.finish_step()
                prog.left = max(0.0, prog.left - (est - 1.5))
                continue
            prog.finish_step()
            if run.note:
                ctx.peer_status[name]["reason"] = run.note
            if name != DIRECT and not template:  # another template: not a proxy config
                ctx.peer_status[name]["xff"] = run.xff
                if run.xff is False:
                    warn(f"{name} does not add X-Forwarded-For (checked with GET /echo)")
            report.save_config(ctx, run, variant=sc.NAME if extra or template else None)
            rs: list = []
            results[name] = rs
            try:
                for i, step in enumerate(steps):
                    prog.step(f"{sc.NAME} | {name} | step {i + 1}/{len(steps)}: {step['label']}",
                              step["seconds"])
                    try:
                        r = sc.run_step(ctx, cfg, run, step)
                    except (LoadError, StartError) as e:
                        r = {"error": str(e)}
                        warn(f"{name}: {step['label']}: {e}")
                    except Exception as e:  # a scenario bug must not lose the other results
                        traceback.print_exc()
                        r = {"error": f"harness error: {type(e).__name__}: {e}"}
                    dead = upstreams_dead(ctx)
                    if dead:
                        r["error"] = (r.get("error", "") + f" upstream(s) died: {', '.join(dead)}").strip()
                    r.update({k: v for k, v in step.items() if k not in ("seconds", "label")})
                    r["step"] = step["label"]
                    rs.append(r)
                    prog.finish_step()
                    say("    " + report.one_line(r))
                    if dead:
                        break  # the proxy is restarted with fresh upstreams for the next target
                    if not run.alive():
                        msg = (f"exited (code {run.proc.returncode}) during {sc.NAME} / "
                               f"{step['label']}: {procs.tail(run.log, 4)}")
                        warn(f"{name} {msg}")
                        ctx.peer_status[name] = {"status": "crashed", "reason": msg}
                        prog.left = max(0.0, prog.left - sum(x["seconds"] for x in steps[i + 1:]))
                        break
            finally:
                peers.stop(run)
        report.write_results(ctx)


def check_smoke(ctx: Ctx, requested: list[str], proxies: list[str]) -> list[str]:
    """Problems that mean the harness (or veloxy) is broken."""
    problems = []
    if "veloxy" in requested and "veloxy" not in proxies:
        problems.append("veloxy is not available: "
                        + ctx.peer_status.get("veloxy", {}).get("reason", "?"))
    for name, st in ctx.peer_status.items():
        if name == "veloxy" and st["status"] != "ok":
            problems.append(f"veloxy {st['status']}: {st['reason']}")
    ran = 0
    for sc_name, res in ctx.results.items():
        if "_skipped" in res:
            continue
        for name, rs in res.items():
            for r in rs:
                ran += 1
                if r.get("error"):
                    problems.append(f"{sc_name}/{name}/{r.get('step')}: {r['error'][:200]}")
                elif not r.get("requests"):
                    problems.append(f"{sc_name}/{name}/{r.get('step')}: no request completed")
                elif name == "veloxy" and r.get("errors"):
                    problems.append(f"{sc_name}/veloxy/{r.get('step')}: {r['errors']} errors "
                                    f"({r.get('errors_detail')})")
    if not ran:
        problems.append("no measurement ran")
    for f in ("report.md", "results.json"):
        if not (ctx.outdir / f).exists():
            problems.append(f"{f} was not written")
    return problems


def cleanup(ctx: Ctx | None) -> None:
    procs.REGISTRY.kill_all()
    if ctx is not None:
        keep_logs(ctx)
        shutil.rmtree(ctx.tmp, ignore_errors=True)


def keep_logs(ctx: Ctx) -> None:
    """Copy the small log files of the run (proxies, upstreams) to results/<name>/logs/."""
    dest = ctx.outdir / "logs"
    for f in ctx.tmp.rglob("*"):
        if not f.is_file() or f.suffix not in (".log", ".out") or f.stat().st_size == 0:
            continue
        rel = f.relative_to(ctx.tmp)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(f, "rb") as src:
            data = src.read(512 * 1024)
        target.write_bytes(data)


def dump_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))
