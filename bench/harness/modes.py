"""What the self-contained comparison modes (`bench/run --tcp`, `--h3`) share: one worker each
on the same proxy core, proxies started and checked before measuring, alternating rounds
(the first contender rotates), medians, and the common parts of the summary, charts and report.

A mode's results are ctx.results[MODE] = case -> contender label -> one result per round;
a contender is a proxy (tcp: "haproxy") or a proxy and what else it is run with (h3:
"caddy-h2", the same Caddy process over HTTP/2).
"""

from __future__ import annotations

import collections
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from . import charts as ch
from . import peers, procs, report
from .loadgen import LoadError
from .measure import fmt_rate
from .procs import StartError
from .runner import SetupError
from .ui import fmt_s, say, warn

# --- set-up -------------------------------------------------------------------------------


def choose(requested: list[str], known: list[str], mode: str, *,
           need_veloxy: bool = True) -> list[str]:
    """The requested proxies that `mode` (e.g. "--tcp") compares; veloxy must be one (unless
    not `need_veloxy`; at least one then)."""
    wanted = [p for p in requested if p in known]
    for p in requested:
        if p not in known:
            warn(f"{mode} compares {', '.join(known)} only: {p} ignored")
    if need_veloxy and "veloxy" not in wanted:
        raise SetupError(f"{mode} needs veloxy among the proxies")
    if not wanted:
        raise SetupError(f"{mode} compares {', '.join(known)}: none of them requested")
    return wanted


def one_core(ctx, wanted: list[str]) -> None:
    """One worker each, every proxy on the same single core; all of `wanted` "ok" so far."""
    ctx.workers = 1
    ctx.proxy_cpus = ctx.proxy_cpus[:1]  # every proxy on the same single core
    for name in wanted:
        ctx.peer_status[name] = {"status": "ok", "reason": ""}


def workdir(ctx, stem: str) -> Path:
    """A new working directory ctx.tmp/STEM-SEQ."""
    ctx.seq += 1
    wd = ctx.tmp / f"{stem}-{ctx.seq}"
    wd.mkdir(parents=True)
    return wd


def veloxy_check(ctx, conf: Path, what: str, feature: str) -> None:
    """`veloxy check` on `conf`: a crisp error for a veloxy build without the mode's `feature`
    (the config is `what`, e.g. "the L4 config")."""
    r = subprocess.run([ctx.tools["veloxy"], "check", "--config", str(conf)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise StartError(f"`veloxy check` refuses {what} (a build without {feature}? rebuild, "
                         "or set VELOXY_BIN): " + (r.stdout + r.stderr).strip()[-400:])


def spawn(ctx, name: str, cmd: list[str], wd: Path, port: int, cpus: list[int],
          ready: Callable[[peers.Running], None], *, env: dict[str, str] | None = None,
          scheme: str = "http", errlog: Path | None = None) -> peers.Running:
    """Start `cmd` in `wd` (command.txt, output.log) pinned on `cpus` and wait for `ready(run)`
    (raises StartError); on failure the process is stopped and the error ends with the tail
    of `errlog` (default: output.log)."""
    (wd / "command.txt").write_text(" ".join(cmd) + "\n")
    log = wd / "output.log"
    errlog = errlog or log
    t0 = time.monotonic()
    p = procs.REGISTRY.spawn(cmd, cpus=cpus, env=env, log=log, cwd=str(wd))
    run = peers.Running(name, port, p, wd, log, scheme=scheme)
    try:
        ready(run)
    except StartError as e:
        procs.REGISTRY.stop(p)
        raise StartError(f"{e}\n--- {errlog} ---\n{procs.tail(errlog)}") from e
    run.started_s = time.monotonic() - t0
    return run


def start_checked(ctx, wanted: list[str], running: dict[str, peers.Running],
                  start: Callable[[str], peers.Running], check: Callable[[peers.Running], str | None],
                  *, variant: str, failing: str, status: str,
                  veloxy_required: bool = True) -> None:
    """Start each of `wanted` still "ok" (`start(name)`), keep its config and `check(run)` it
    (None, or what is wrong) before it goes into `running`. A proxy that fails to start or
    the check is stopped and marked in ctx.peer_status (the check: `status`, and the warning
    says NAME `failing`: ...); veloxy failing either is a SetupError (with `veloxy_required`;
    else it is marked like the others and the mode goes on without it)."""
    for name in wanted:
        if ctx.peer_status[name]["status"] != "ok":
            continue
        try:
            r = start(name)
        except StartError as e:
            if name == "veloxy" and veloxy_required:
                raise SetupError(f"veloxy failed to start: {e}") from e
            warn(f"{name} failed to start: {e}")
            ctx.peer_status[name] = {"status": "start failed", "reason": str(e)[-400:]}
            continue
        report.save_config(ctx, r, variant=variant)
        bad = check(r)
        if bad:
            peers.stop(r)
            if name == "veloxy" and veloxy_required:
                raise SetupError(f"veloxy {failing}: {bad}")
            warn(f"{name} {failing}: {bad}")
            ctx.peer_status[name] = {"status": status, "reason": bad}
            continue
        running[name] = r


# --- rounds -------------------------------------------------------------------------------

def rotation(labels: list[str], i: int) -> list[str]:
    """Round i's order: the first contender rotates, so none always runs first (or last)."""
    k = i % len(labels) if labels else 0
    return labels[k:] + labels[:k]


def alternate(ctx, results: dict[str, dict[str, list]], running: dict[str, peers.Running],
              contenders: dict[str, tuple[str, dict[str, str]]], *, rounds_n: int,
              per_run: float, plan: str, one: Callable[..., dict], line: Callable[[dict], str],
              upstream: tuple[str, subprocess.Popen, Path]) -> None:
    """`rounds_n` alternating rounds: in each, every case of `results` for every contender in
    rotation() order. `contenders`: label -> (proxy name, tags: what else the label stands
    for, e.g. {"protocol": "h2"}); `one(run, case, **tags)` measures one run (a LoadError is
    kept as that round's error) into results[case][label], `line(result)` is its progress
    line; `per_run` = seconds per run for the time left, `plan` = the runs' settings for the
    opening line. `upstream` = (what, process, log): its exit ends the mode (SetupError); a
    proxy that exits is marked crashed and not run again. results.json after every round."""
    labels = list(contenders)
    for case in results:
        results[case] = {lb: [] for lb in labels}
    total = per_run * len(labels) * len(results) * rounds_n
    say(f"{rounds_n} round(s) x {len(results)} cases x {labels}, {plan}: ~{fmt_s(total)}")
    if rounds_n < 3:
        warn(f"{rounds_n} round(s): a smoke check, not a measurement (use --rounds 3 or more)")
    left = total
    up_what, up_proc, up_log = upstream
    for i in range(rounds_n):
        for case in results:
            for label in rotation(labels, i):
                name, tags = contenders[label]
                if name not in running:
                    continue
                say(f"[~{fmt_s(left)} left] round {i + 1}/{rounds_n}: {case}: {label}")
                try:
                    r = one(running[name], case, **tags)
                except LoadError as e:
                    r = {"error": str(e), "case": case, **tags}
                r["round"] = i + 1
                results[case][label].append(r)
                say("    " + line(r))
                left -= per_run
                if up_proc.poll() is not None:
                    raise SetupError(f"{up_what} exited during round {i + 1}: {procs.tail(up_log)}")
                if not running[name].alive():
                    where = " / ".join([case, *tags.values()])
                    msg = (f"exited (code {running[name].proc.returncode}) during round "
                           f"{i + 1} / {where}: {procs.tail(running[name].log, 4)}")
                    warn(f"{name} {msg}")
                    ctx.peer_status[name] = {"status": "crashed", "reason": msg}
                    peers.stop(running.pop(name))
        report.write_results(ctx)


# --- summary and report -------------------------------------------------------------------

def median_of(rs: list[dict], key: str, sub: str | None = None) -> float | None:
    """The median of r[key] (r[key][sub] with `sub`) over the rounds without an error."""
    vals = []
    for r in rs:
        if r.get("error"):
            continue
        v = r.get(key)
        if sub is not None:
            v = (v or {}).get(sub)
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def medians(results: dict, more: Callable[[list[dict]], dict] | None = None
            ) -> dict[str, dict[str, dict]]:
    """case -> contender -> median req/s ("rps"), CPU us per request ("cpu_us"), `more(good
    rounds)`'s keys, errors (sum over the good rounds), rounds ok, rounds."""
    out: dict[str, dict[str, dict]] = {}
    for case, per in results.items():
        out[case] = {}
        for label, rs in per.items():
            good = [r for r in rs if not r.get("error")]
            m = {"rps": median_of(rs, "rps"), "cpu_us": median_of(rs, "cpu_us_per_req")}
            m.update(more(good) if more else {})
            m.update({"errors": sum(r.get("errors", 0) for r in good), "ok": len(good),
                      "rounds": len(rs)})
            out[case][label] = m
    return out


def medians_with_latency(results: dict) -> dict[str, dict[str, dict]]:
    """[`medians`] plus requests per core, p50, p99, proxy CPU % and the most frequent
    busiest core (the --h3 and --cache tables)."""
    def more(good):
        busiest = collections.Counter(r.get("bottleneck") for r in good if r.get("bottleneck"))
        return {"per_core": median_of(good, "req_per_core"),
                "p50": median_of(good, "latency_ms", "p50"),
                "p99": median_of(good, "latency_ms", "p99"),
                "cpu_pct": median_of(good, "proxy_cpu_pct"),
                "busiest": busiest.most_common(1)[0][0] if busiest else None}

    return medians(results, more)


def status_lines(ctx, rounds_n: int) -> list[str]:
    """The summary's warnings: too few rounds, proxies not measured (and why)."""
    lines = []
    if rounds_n < 3:
        lines.append(f"ONLY {rounds_n} ROUND(S): a smoke check, the numbers are noise")
    for name, st in ctx.peer_status.items():
        if st.get("status") != "ok":
            lines.append(f"{name}: {st['status']}: {st['reason'][:300]}")
    return lines


def per_round(rs: list[dict]) -> str:
    """Each round's rate / CPU us per request, or "failed"."""
    return ", ".join("failed" if r.get("error") else
                     f"{fmt_rate(r['rps'])}/{r.get('cpu_us_per_req') or 0:.1f}" for r in rs)


def failures(per: dict[str, list[dict]]) -> list[str]:
    """One "failed: ..." line per failed round of a case."""
    return [f"failed: {lb} round {r['round']}: {r['error'][:160]}" for lb, rs in per.items()
            for r in rs if r.get("error")]


def bar_charts(ctx, mode: str, medians: Callable[[dict], dict], order: list[str],
               specs: list[tuple[str, str, str, str, str, Callable | None]],
               series_name: Callable[[str], str] = str) -> list[tuple[str, str]]:
    """One grouped bar chart per spec (file, title, y label, key of `medians(results)`,
    caption, bar label format or None) of ctx.results[mode]: one bar group per contender
    measured (in `order`), one series per case (named `series_name(case)`). Returns (caption,
    file) of the charts made."""
    results = ctx.results.get(mode) or {}
    if not ch.HAVE or not results:
        return []
    meds = medians(results)
    groups = [g for g in order if any(g in per for per in results.values())]
    made = []
    for fname, title, ylabel, key, caption, fmt in specs:
        series = {series_name(c): [(meds[c].get(g) or {}).get(key) for g in groups] for c in meds}
        kw = {"fmt": fmt} if fmt else {}
        if ch.grouped_bars(ctx.outdir / fname, title, ylabel, groups, series, **kw):
            made.append((caption, fname))
    return made


def md(ctx, title: str, intro: str, text: str, made: list[tuple[str, str]],
       settings: dict[str, str], configs: str) -> str:
    """report.md: title, machine and command, `intro`, the summary `text`, the charts, the
    proxies (status, note, `settings`), `configs` (where the configs come from), versions."""
    m = report.meta(ctx)
    mach = m["machine"]
    vers = "\n".join(f"- {k}: {v}" for k, v in ctx.versions.items())
    peers_md = "\n".join(f"| {n} | {st['status']} | {st.get('reason') or '-'} | "
                         f"{settings.get(n, '-')} |" for n, st in ctx.peer_status.items())
    charts_md = "".join(f"![{t}]({f})\n\n" for t, f in made)
    return (f"# {title}: {m['name']}\n\n"
            f"Machine: {mach['cpu']}, {mach['cores']} cores, Linux {mach['kernel']}. "
            f"Command: `bench/run {' '.join(ctx.argv)}`\n\n"
            f"{intro}\n\n"
            f"```\n{text}\n```\n\n{charts_md}"
            "## Proxies\n\n| Proxy | Status | Note | Settings |\n|---|---|---|---|\n"
            f"{peers_md}\n\n{configs}\n\n## Versions\n\n"
            f"{vers}\n")


def finish(ctx, args, summarize, make_charts, make_md) -> int:
    """Print the summary, draw the charts, write report.md and results.json."""
    text = summarize(ctx, args)
    print("\n" + text, flush=True)
    made = make_charts(ctx)
    (ctx.outdir / "report.md").write_text(make_md(ctx, args, text, made))
    report.write_results(ctx)
    say(f"report: {ctx.outdir / 'report.md'}")
    return 0
