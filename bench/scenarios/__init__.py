"""Benchmark scenarios, found by discovery: every module in this package that
defines NAME, PROFILES, steps(), run_step() and report() is a scenario.

Adding a scenario is one file, bench/scenarios/NAME.py:

    NAME = "static"                 # id used in results and on the command line
    TITLE = "Static files"          # section title in report.md
    ORDER = 40                      # run order (ceiling=10 runs first; ramp uses its numbers)
    TARGETS = "proxies"             # or "proxies+direct" to also hit one upstream directly
    TOOLS = ["h2load"]              # optional: tools the harness must install first (ctx.tools[...])
    PROFILES = {"quick": {...}, "full": {...}}   # per-profile settings; absent = skipped
    def steps(ctx, cfg) -> list[dict]:           # each step: {"label": str, "seconds": est, ...}
    def run_step(ctx, cfg, run, step) -> dict:   # run = running proxy (run.base_url, run.pids())
    def report(ctx, cfg, results) -> str:        # results = {proxy: [step result, ...]}; markdown
    def charts(ctx, cfg, results, outdir) -> list[tuple[str, str]]   # optional: (title, png name)
    def requires(ctx) -> str | None:             # optional: reason to skip (e.g. tool missing)
    def peer_config(ctx, cfg, name) -> dict | None:   # optional: this scenario's own proxy settings,
        # as values for the optional snippet placeholders of bench/peers/*.tmpl (e.g.
        # {"ROUTE_EXTRA": "max_concurrency = 32"} for veloxy); None = the default config

A profile may hold "proxies": [...] to run on a subset only (to keep quick short); an
explicit --proxies on the command line overrides it.

`ctx` gives ctx.tools, ctx.proxy_cpus, ctx.load_cpus, ctx.upstreams, ctx.results
(earlier scenarios' results) and the helpers in harness.measure (measure.wrk / measure.oha).
"""

from __future__ import annotations

import importlib
import pkgutil

REQUIRED = ("NAME", "PROFILES", "steps", "run_step", "report")


def discover() -> list:
    mods = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if all(hasattr(mod, a) for a in REQUIRED):
            mods.append(mod)
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))
