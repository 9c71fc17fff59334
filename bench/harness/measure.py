"""One measured load run: load generator + /proc sampling of proxy and upstreams."""

from __future__ import annotations

from collections.abc import Callable

from . import loadgen
from .sysstat import Sampler, bottleneck


def core_roles(ctx) -> dict[int, str]:
    roles = {}
    for c in ctx.load_cpus:
        roles[c] = "load+upstreams"
    for c in ctx.proxy_cpus:
        roles[c] = "proxy" if c not in roles else "proxy+load"
    return roles


def measured(ctx, run, load: Callable[..., dict], *, window: bool = False) -> dict:
    """Run `load()` while sampling CPU of the proxy tree, the upstreams and each core. With
    `window`, `load(stop)` is given a callback that ends the sampling early: the end of the
    measured time when the load generator takes longer to finish (see h3.oha_run)."""
    groups = {"proxy": run.pids, "upstreams": ctx.upstreams.pids}
    if run.name == "direct":
        groups = {"proxy": run.pids, "upstreams": lambda: []}
    s = Sampler(groups).start()
    stats: dict = {}

    def stop():
        if not stats:
            stats.update(s.stop())

    try:
        res = load(stop) if window else load()
    finally:
        stop()
    res.update(stats)
    done = res.get("requests") or 0
    res["cpu_us_per_req"] = (stats["proxy_cpu_s"] * 1e6 / done) if done else None
    res["bottleneck"] = bottleneck(stats["core_busy"], core_roles(ctx))
    res["samples"] = [
        {k: v for k, v in x.items() if k in ("t", "cores", "proxy_cpu", "proxy_rss", "upstreams_cpu")}
        for x in s.samples
    ]
    return res


def wrk(ctx, run, path: str = "/", *, connections: int, duration: float, warmup: float = 0,
        method: str = "GET", body_file=None, timeout_s: int = 4,
        headers: list[str] | None = None) -> dict:
    url = run.base_url + path
    kw = dict(connections=connections, threads=len(ctx.load_cpus), cpus=ctx.load_cpus,
              method=method, body_file=body_file, timeout_s=timeout_s, headers=headers)
    if warmup > 0:
        loadgen.wrk(url, duration=warmup, **kw)
    res = measured(ctx, run, lambda: loadgen.wrk(url, duration=duration, **kw))
    res.update({"connections": connections, "path": path, "method": method})
    return res


def h2load(ctx, run, path: str | list[str] = "/", *, clients: int, streams: int,
           duration: float, warmup: float = 0, h1: bool = False,
           headers: list[str] | None = None) -> dict:
    """h2load (HTTP/2 unless h1) against the running proxy; the warm-up is a separate,
    unmeasured h2load run so that the CPU accounting covers the measured run only.
    `path` may be a list: each connection requests the paths in turn."""
    url = run.base_url + path if isinstance(path, str) else [run.base_url + p for p in path]
    kw = dict(clients=clients, streams=streams, threads=len(ctx.load_cpus), cpus=ctx.load_cpus,
              h1=h1, headers=headers)
    if warmup > 0:
        loadgen.h2load(url, duration=warmup, **kw)
    log = ctx.tmp / f"h2load-{run.name}-{ctx.seq}.tsv"
    res = measured(ctx, run, lambda: loadgen.h2load(url, duration=duration, log_file=log, **kw))
    res.update({"connections": clients, "streams": streams,
                "path": path if isinstance(path, str) else f"{len(path)} paths", "method": "GET"})
    return res


def oha(ctx, run, path: str = "/", *, rate: float, connections: int, duration: float,
        method: str = "GET", body_file=None, timeout_s: float = 2, breakdown: bool = False) -> dict:
    url = run.base_url + path
    res = measured(ctx, run, lambda: loadgen.oha(
        url, rate=rate, connections=connections, duration=duration, cpus=ctx.load_cpus,
        method=method, body_file=body_file, binary=ctx.tools["oha"], timeout_s=timeout_s,
        breakdown=breakdown))
    res.update({"connections": connections, "path": path, "method": method})
    return res


def pacer(ctx, run, path: str = "/", *, rate: float, connections: int, duration: float,
          warmup: float = 1) -> dict:
    """pacer at a fixed rate; its warm-up second is inside its own run (one connection set),
    so the CPU sampling covers it too: the sampled CPU is scaled to the measured window."""
    url = run.base_url + path
    res = measured(ctx, run, lambda: loadgen.pacer(
        url, rate=rate, connections=connections, duration=duration, cpus=ctx.load_cpus,
        binary=ctx.tools["pacer"], warmup=warmup))
    res.update({"connections": connections, "path": path, "method": "GET"})
    if res.get("cpu_us_per_req"):
        res["cpu_us_per_req"] *= duration / (duration + warmup)
    return res


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:,.0f}"


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}B"


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}ms"
    if x >= 10:
        return f"{x:.1f}ms"
    return f"{x:.2f}ms"


def fmt_us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}us"


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"
