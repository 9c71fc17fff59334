"""Entry point: `bench/run [--quick|--smoke|--vs-nginx|--tcp|--h3|--cache|--scale|--backends] [options]` (see
bench/README.md)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import backends, cache, h3, report, runner, scale, sweep, tcp, vs_nginx
from .peers import ALL_PROXIES
from .runner import SetupError
from .ui import fmt_s, say

BENCH = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run", description=(
        "veloxy benchmark suite: veloxy against nginx, HAProxy, Envoy, Caddy, Pingora and "
        "Traefik. Default: the full run (under 40 minutes)."))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="short run of every scenario (< 6 min)")
    mode.add_argument("--smoke", action="store_true",
                      help="harness self-test: veloxy (+ nginx if installable), one short step "
                           "per scenario, ruff check; exits non-zero when broken")
    mode.add_argument("--vs-nginx", action="store_true",
                      help="veloxy vs nginx, 1 worker each, alternating wrk rounds, CPU per request")
    mode.add_argument("--tcp", action="store_true",
                      help="L4: veloxy vs HAProxy (mode tcp) vs nginx (stream), plain TCP and SNI "
                           "passthrough, 1 worker each, alternating wrk rounds, CPU per transfer")
    mode.add_argument("--h3", action="store_true",
                      help="HTTP/3: veloxy h3 vs veloxy h2 vs Caddy h3 (and h2), 1 worker each, "
                           "alternating oha rounds, CPU per request")
    mode.add_argument("--cache", action="store_true",
                      help="HTTP cache: veloxy vs nginx proxy_cache vs Varnish, 1 worker each, "
                           "cache hits (1 KB, 100 KB), a 90%%-hit mix and a miss storm")
    mode.add_argument("--search", action="store_true",
                      help="search gateway against a real 3-node OpenSearch cluster (runs "
                           "bench/search_cluster.py): bulk docs/s and search p99 through veloxy "
                           "route_to_shards / forward / query_cache, nginx, and directly")
    mode.add_argument("--cache-tests", action="store_true",
                      help="the HTTP caching test suite (cache-tests.fyi) against veloxy, nginx "
                           "proxy_cache and Varnish (runs bench/cache_tests.py; --suite DIR for a "
                           "checkout of the suite instead of its npm release)")
    mode.add_argument("--sweep", action="store_true",
                      help="veloxy vs nginx vs HAProxy, 1 worker each, across connection counts "
                           "(p99, p99.9, CPU per request), then a fixed-rate ramp at 25-90%% of "
                           "each proxy's own ceiling")
    mode.add_argument("--kube", action="store_true",
                      help="veloxy as a Kubernetes Ingress controller: 1,000 Ingresses on a real "
                           "kube-apiserver, load with EndpointSlice churn (bench/kube_load.py)")
    mode.add_argument("--scale", action="store_true",
                      help="route-table scale: veloxy vs nginx vs HAProxy, 1 worker each, CPU per "
                           "request with 10..100,000 routes over up to 10,000 hosts, then load, "
                           "check and reload times of a 10,000-host config and p99 during reloads")
    mode.add_argument("--backends", action="store_true",
                      help="backend-group scale: veloxy alone, 1 worker, CPU per request with a "
                           "group of 4 and of 10,000 backends for each balancing policy (ratio "
                           "10,000 / 4, goal at most 1.10)")
    p.add_argument("--proxies", help=f"comma list (default: all: {','.join(ALL_PROXIES)})")
    p.add_argument("--suite", help="--cache-tests: a checkout of http-tests/cache-tests")
    p.add_argument("--scenarios", help="comma list of scenario names (default: all)")
    p.add_argument("--cores", help="core split PROXY:LOAD, e.g. 0:1 or 0-3:4-15 "
                                   "(default: first half of the cores for the proxy)")
    p.add_argument("--workers", type=int, help="workers/threads per proxy (default: # proxy cores)")
    p.add_argument("--keepalive", type=int, default=128, help="upstream keep-alive pool size")
    p.add_argument("--upstreams", type=int, default=4, help="number of upstream instances")
    p.add_argument("--name", help="results directory name (default: PROFILE-DATE-TIME)")
    p.add_argument("--results-dir", help="parent directory of results (default: bench/results)")
    p.add_argument("--no-install", action="store_true", help="use only what is already installed")
    p.add_argument("--no-build", action="store_true",
                   help="do not cargo build the workspace if target/release binaries are missing")
    p.add_argument("--rounds", type=int, default=3,
                   help="--vs-nginx (>= 3), --tcp, --h3, --cache (>= 1; below 3 only a smoke "
                        "check): alternating rounds")
    p.add_argument("--duration", type=float, default=None,
                   help="--vs-nginx, --tcp, --h3, --cache: seconds per run (default 10); --scale: "
                        "per round and table (default 5; the reload rounds take twice that)")
    p.add_argument("--warmup", type=float, default=2,
                   help="--vs-nginx, --tcp, --h3, --cache: warm-up seconds per run")
    p.add_argument("--connections", type=int, default=64,
                   help="--vs-nginx, --tcp, --cache: wrk connections; --h3: oha connections (-c)")
    p.add_argument("--streams", type=int, default=1,
                   help="--h3: concurrent requests per connection (oha -p), for h3 and h2 alike")
    p.add_argument("--rules", action="store_true",
                   help="--vs-nginx: the route-rules scenario (regex, stripped prefix, header rules)")
    p.add_argument("--auth", action="store_true",
                   help="--vs-nginx: the basic-auth scenario (a bcrypt htpasswd route, one user, "
                        "every request with its credentials)")
    p.add_argument("--ratelimit", action="store_true",
                   help="--vs-nginx: the ratelimit-global scenario: veloxy without a rate limit, "
                        "with a local and with a global limit (a redis-server on the load core), "
                        "CPU per request, then a Redis outage under load (implies --vs-nginx)")
    p.add_argument("--tracing", action="store_true",
                   help="--vs-nginx: veloxy with OpenTelemetry tracing off, at sample_ratio 0.01 and "
                        "1.0 (OTLP/HTTP to a sink on the load side), and nginx: CPU per request")
    p.add_argument("--fastcgi", action="store_true",
                   help="--vs-nginx: the fastcgi scenario: veloxy (protocol = \"fastcgi\") vs nginx "
                        "(fastcgi_pass) to one php-fpm on the load core, a small PHP script, CPU "
                        "per request of the proxy (implies --vs-nginx)")
    p.add_argument("--strace", action="store_true",
                   help="--vs-nginx: also count syscalls per request (strace -c -f, short run)")
    p.add_argument("--sweep-connections",
                   help="--sweep: comma list of connection counts (default: 64,256,1000,4000,10000)")
    p.add_argument("--small", action="store_true",
                   help="--scale: a smoke check: tables of 10 and 1,000 routes, a 1,000-host "
                        "reload config, 1 round of 2 s; --backends: two policies, 1 round of 2 s")
    p.add_argument("--policies",
                   help="--backends: comma list of policies to measure (default: all: "
                        "round_robin,least_conn,p2c_ewma,consistent_hash,random,"
                        "round_robin_weighted,random_weighted,sticky)")
    p.add_argument("--scale-sizes",
                   help="--scale: comma list of table sizes in routes (default: "
                        "10,1000,10000,100000; above 10,000: a multiple of 10,000)")
    p.add_argument("--list", action="store_true", help="list scenarios and proxies, then exit")
    args = p.parse_args(argv)
    if args.scale_sizes and not args.scale:
        p.error("--scale-sizes is a --scale option")
    if args.policies and not args.backends:
        p.error("--policies is a --backends option")
    if args.small and not (args.scale or args.backends):
        p.error("--small is a --scale or --backends option")
    if (args.scale or args.backends) and args.small:
        args.rounds = 1
        if args.duration is None:
            args.duration = 2
        args.warmup = min(args.warmup, 1)
    if args.duration is None:
        args.duration = 5 if args.scale else 10
    if args.tracing:
        if args.rules or args.auth or args.ratelimit or args.fastcgi:
            p.error("--tracing is a scenario of its own")
        args.vs_nginx = True
        if not args.name:
            args.name = f"tracing-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.fastcgi:
        if args.rules or args.auth or args.ratelimit:
            p.error("--fastcgi is a scenario of its own: not with --rules, --auth or --ratelimit")
        if args.quick or args.smoke or args.tcp or args.h3 or args.cache or args.sweep or args.scale:
            p.error("--fastcgi is a --vs-nginx scenario")
        args.vs_nginx = True
        if not args.name:
            args.name = f"fastcgi-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.ratelimit:
        if args.rules or args.auth:
            p.error("--ratelimit is a scenario of its own: not with --rules or --auth")
        if args.quick or args.smoke or args.tcp or args.h3 or args.cache or args.sweep or args.scale:
            p.error("--ratelimit is a --vs-nginx scenario")
        args.vs_nginx = True
        if not args.name:
            args.name = f"ratelimit-global-{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def ruff_check() -> str | None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists() and not shutil.which(ruff):
        return "ruff is not installed (pip install ruff)"
    r = subprocess.run([ruff, "check", str(BENCH)], capture_output=True, text=True)
    if r.returncode != 0:
        return "ruff check failed:\n" + (r.stdout + r.stderr)[-3000:]
    return None


def unit_tests() -> str | None:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return None  # optional: the venv normally has it
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(BENCH / "tests")], capture_output=True, text=True, cwd=str(BENCH))
    if r.returncode != 0:
        return "harness unit tests failed:\n" + (r.stdout + r.stderr)[-3000:]
    return None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import scenarios as sc_pkg

    all_sc = sc_pkg.discover()
    if args.list:
        print("scenarios:", ", ".join(f"{s.NAME} ({'/'.join(s.PROFILES)})" for s in all_sc))
        print("proxies:  ", ", ".join(ALL_PROXIES))
        return 0
    if args.search:
        name = args.name or f"search-cluster-{time.strftime('%Y%m%d-%H%M%S')}"
        out = Path(args.results_dir) if args.results_dir else BENCH / "results"
        script = BENCH / "search_cluster.py"
        return subprocess.call([sys.executable, str(script), "--rounds", str(args.rounds),
                                "--duration", str(int(args.duration)), "--out", str(out / name)])
    if args.kube:
        name = args.name or f"kube-{time.strftime('%Y%m%d-%H%M%S')}"
        out = Path(args.results_dir) if args.results_dir else BENCH / "results"
        cmd = [sys.executable, str(BENCH / "kube_load.py"), "--out", str(out / name)]
        if args.duration is not None and "--duration" in " ".join(argv):
            cmd += ["--churn-seconds", str(args.duration)]
        return subprocess.call(cmd)
    if args.cache_tests:
        name = args.name or f"cache-tests-{time.strftime('%Y%m%d-%H%M%S')}"
        out = Path(args.results_dir) if args.results_dir else BENCH / "results"
        cmd = [sys.executable, str(BENCH / "cache_tests.py"), "--out", str(out / name)]
        if args.proxies:
            cmd += ["--proxies", args.proxies]
        if args.suite:
            cmd += ["--suite", args.suite]
        return subprocess.call(cmd)
    profile = ("smoke" if args.smoke else "quick" if args.quick
               else "vs-nginx" if args.vs_nginx else "tcp" if args.tcp else "h3" if args.h3
               else "cache" if args.cache else "sweep" if args.sweep
               else "scale" if args.scale else "backends" if args.backends else "full")
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)

    if args.proxies:
        requested = [x.strip() for x in args.proxies.split(",") if x.strip()]
        known = ALL_PROXIES + (cache.CACHE_ONLY if profile == "cache" else [])
        unknown = [x for x in requested if x not in known]
        if unknown:
            print(f"unknown proxies: {unknown}; known: {known}", file=sys.stderr)
            return 2
    elif profile == "smoke":
        requested = ["veloxy", "nginx"]
    elif profile == "vs-nginx":
        requested = ["veloxy", "nginx"]
    elif profile == "tcp":
        requested = list(tcp.TCP_PEERS)
    elif profile == "h3":
        requested = list(h3.H3_PEERS)
    elif profile == "cache":
        requested = list(cache.CACHE_PEERS)
    elif profile == "sweep":
        requested = list(sweep.SWEEP_PEERS)
    elif profile == "scale":
        requested = list(scale.SCALE_PEERS)
    elif profile == "backends":
        requested = ["veloxy"]
    else:
        requested = list(ALL_PROXIES)
    scenarios = [s for s in all_sc if profile in s.PROFILES]
    if args.scenarios:
        names = {x.strip() for x in args.scenarios.split(",")}
        unknown = names - {s.NAME for s in all_sc}
        if unknown:
            print(f"unknown scenarios: {sorted(unknown)}", file=sys.stderr)
            return 2
        scenarios = [s for s in scenarios if s.NAME in names]

    problems: list[str] = []
    ctx = None
    t0 = time.monotonic()
    try:
        if profile == "smoke":
            say("smoke: ruff check bench/")
            err = ruff_check()
            if err:
                problems.append(err)
            say("smoke: harness unit tests (pytest bench/tests)")
            err = unit_tests()
            if err:
                problems.append(err)
        ctx = runner.make_ctx(args, profile)
        ctx.argv = argv
        ctx.explicit_proxies = bool(args.proxies)
        nofile = ctx.nofile = runner.raise_nofile()
        say(f"bench {profile}: results -> {ctx.outdir} (cache {ctx.cache}, ulimit -n {nofile})")
        say(f"cores: proxy {ctx.proxy_cpus}, load generator + upstreams {ctx.load_cpus}; "
            f"{ctx.workers} worker(s) per proxy")
        if profile == "vs-nginx":
            return vs_nginx.run(ctx, args)
        if profile == "tcp":
            return tcp.run(ctx, args, requested)
        if profile == "h3":
            return h3.run(ctx, args, requested)
        if profile == "cache":
            return cache.run(ctx, args, requested)
        if profile == "sweep":
            return sweep.run(ctx, args, requested)
        if profile == "scale":
            return scale.run(ctx, args, requested)
        if profile == "backends":
            return backends.run(ctx, args, requested)
        wanted = ["wrk", *requested]
        if profile != "smoke":
            wanted.append("h2load")  # for HTTP/2 scenarios; installed up front with the others
        for s in scenarios:
            wanted += [t for t in getattr(s, "TOOLS", []) if t not in wanted]
        runner.install_tools(ctx, wanted, allow=not args.no_install,
                             builds=profile != "smoke", build_ws=not args.no_build)
        if "wrk" not in ctx.tools:
            raise SetupError("wrk is required: " + ctx.tool_info["wrk"].reason)
        proxies = runner.select_proxies(ctx, requested)
        if not proxies:
            raise SetupError("no proxy is available to benchmark")
        runner.start_upstreams(ctx)
        runner.run_scenarios(ctx, scenarios, proxies)
    except SetupError as e:
        say(f"ERROR: {e}")
        if ctx is not None:
            runner.cleanup(ctx)
        return 2
    except KeyboardInterrupt:
        say("interrupted: stopping every child process group")
        if ctx is not None:
            ctx.interrupted = True
    finally:
        if ctx is not None:
            runner.cleanup(ctx)
    if ctx is None:
        say("interrupted")
        return 130
    if ctx.interrupted:
        path = report.write_report(ctx, scenarios)
        report.write_results(ctx)
        say(f"partial report: {path}")
        return 130

    report.write_results(ctx)
    path = report.write_report(ctx, scenarios)
    print("\n" + report.terminal_summary(ctx), flush=True)
    say(f"done in {fmt_s(time.monotonic() - t0)}: {path}")
    if profile == "smoke":
        problems += runner.check_smoke(ctx, requested, runner.select_proxies(ctx, requested))
        if problems:
            print("\nSMOKE FAILED:\n- " + "\n- ".join(problems), file=sys.stderr)
            print("smoke: 0 passed, 1 failed")
            return 1
        print("smoke: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main(sys.argv[1:]))
