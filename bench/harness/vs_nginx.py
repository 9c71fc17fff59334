"""`bench/run --vs-nginx`: veloxy against nginx, one worker each, the same 4 upstreams,
alternating wrk rounds (veloxy, nginx, veloxy, nginx, ...) with warm-up, CPU per request,
and optionally syscalls per request with strace -c -f. `--ratelimit` runs the bench scenario
`ratelimit-global` instead (veloxy without a limit, with a local and with a global limit; see
harness/ratelimit.py); `--fastcgi` runs veloxy and nginx to one php-fpm (harness/fastcgi.py)."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import time

from . import fastcgi, measure, peers, procs, ratelimit, report, runner
from .loadgen import LoadError
from .procs import StartError
from .runner import SetupError
from .ui import fmt_s, say

PAIR = ["veloxy", "nginx"]
STRACE_S = 3

# `--rules`: the route-rules scenario. A regex route whose prefix is stripped (by a rewrite of
# its capture), two request header rules and two response header rules, against nginx doing
# the same with `location ~`, `rewrite ... break`, `proxy_set_header` and `add_header ...
# always`; and each one's plain route on the same path, to price the rules themselves. The
# equivalents: `proxy_set_header` replaces the client's field (veloxy's `set`), `add_header`
# appends to the upstream's fields (veloxy's `add`).
RULES_PATH = "/api/v1/item"
VELOXY_RULES = """
[[routes]]
path_regex = "^/api/(.*)$"
upstream = "app"
rewrite = "/{re.1}"
request_headers = { set = { "X-Real-IP" = "{client_ip}", "X-Proxy" = "veloxy" } }
response_headers = { add = { "X-Frame-Options" = "DENY", "Strict-Transport-Security" = "max-age=63072000" } }
"""
NGINX_RULES = """
        location ~ ^/api/(.*)$ {
            rewrite ^/api/(.*)$ /$1 break;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Proxy nginx;
            proxy_request_buffering off;
            add_header X-Frame-Options DENY always;
            add_header Strict-Transport-Security "max-age=63072000" always;
        }
"""


# `--auth`: basic auth with a cached credential. Every request carries the same valid
# `Authorization` (so the plain runs send the same bytes); veloxy-auth checks it on a
# `basic_auth` route whose users file is a bcrypt htpasswd made by Apache's `htpasswd -B`
# (cost 5, its default). nginx-auth is nginx's `auth_basic` on the same file: nginx keeps no
# verified credentials, so each of its requests pays a bcrypt (glibc/libxcrypt crypt()).
AUTH_PATH = "/auth/item"
AUTH_USER, AUTH_PASSWORD = "bench", "s3cret-bench"
AUTH_HEADER = "Authorization: Basic YmVuY2g6czNjcmV0LWJlbmNo"  # base64("bench:s3cret-bench")


def _htpasswd(ctx) -> str:
    """The users file (made once per run, with Apache's htpasswd)."""
    path = ctx.tmp / "htpasswd"
    if not path.exists():
        try:
            out = subprocess.run(["htpasswd", "-nbB", AUTH_USER, AUTH_PASSWORD], check=True,
                                 capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError) as e:
            raise SetupError(f"--auth needs Apache's htpasswd (apt-get install apache2-utils): {e}") from e
        path.write_text(out + "\n")
    return str(path)


def _auth_entries(ctx) -> list[tuple[str, str, dict | None, str]]:
    users = _htpasswd(ctx)
    veloxy_auth = (f'\n[[routes]]\npath = "/auth/"\nupstream = "app"\n'
                   f'basic_auth = {{ realm = "bench", users_file = "{users}" }}\n')
    nginx_auth = (f"\n        location /auth/ {{\n            auth_basic bench;\n"
                  f"            auth_basic_user_file {users};\n"
                  "            proxy_pass http://backend;\n            proxy_http_version 1.1;\n"
                  '            proxy_set_header Connection "";\n'
                  "            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n"
                  "            proxy_request_buffering off;\n        }\n")
    return [("veloxy", "veloxy", None, AUTH_PATH),
            ("veloxy-auth", "veloxy", {"ROUTE_EXTRA": veloxy_auth}, AUTH_PATH),
            ("nginx", "nginx", None, AUTH_PATH),
            ("nginx-auth", "nginx", {"SERVER_EXTRA": nginx_auth}, AUTH_PATH)]


# `--tracing`: veloxy with OpenTelemetry tracing off, at sample_ratio 0.01 and at 1.0 (every
# request a server span and an attempt span, exported over OTLP/HTTP by veloxy's exporter
# thread, which runs in veloxy's process and is counted in its CPU), against nginx. The
# collector is a sink in the harness's process (on the load side) that reads each POST and
# answers 200: the cost measured is veloxy's, building, batching, encoding and sending.
TRACING_RATIOS = [("veloxy-trace-0.01", "0.01"), ("veloxy-trace-1", "1.0")]


def _otlp_sink() -> str:
    """Starts (once per process) an OTLP/HTTP sink on 127.0.0.1; its endpoint."""
    global _SINK
    if _SINK is None:
        import http.server
        import threading

        class Sink(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        _SINK = f"http://127.0.0.1:{server.server_address[1]}"
    return _SINK


_SINK: str | None = None


def _tracing_entries() -> list[tuple[str, str, dict | None, str]]:
    endpoint = _otlp_sink()
    out = [("veloxy", "veloxy", None, "/")]
    for label, ratio in TRACING_RATIOS:
        extra = f'\n[server.tracing]\notlp_endpoint = "{endpoint}"\nsample_ratio = {ratio}\n'
        out.append((label, "veloxy", {"SERVER_EXTRA": extra}, "/"))
    return out + [("nginx", "nginx", None, "/")]


def _entries(args, ctx=None) -> list[tuple[str, str, dict | None, str]]:
    """(label, peer, config extras, request path) of each contender."""
    if getattr(args, "auth", False):
        return _auth_entries(ctx)
    if getattr(args, "tracing", False):
        return _tracing_entries()
    if not getattr(args, "rules", False):
        return [(n, n, None, "/") for n in PAIR]
    return [("veloxy", "veloxy", None, RULES_PATH),
            ("veloxy-rules", "veloxy", {"ROUTE_EXTRA": VELOXY_RULES}, RULES_PATH),
            ("nginx", "nginx", None, RULES_PATH),
            ("nginx-rules", "nginx", {"SERVER_EXTRA": NGINX_RULES}, RULES_PATH)]


def _tids(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            out += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
    return out


def parse_strace_total(text: str) -> tuple[int, int] | None:
    """(calls, errors) from the 'total' line of `strace -c` output."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[-1] == "total":
            nums = [p for p in parts[:-1] if re.fullmatch(r"[\d.]+", p)]
            # % time, seconds, usecs/call, calls, [errors]
            ints = [int(p) for p in nums if p.isdigit()]
            if len(ints) >= 2:
                return ints[-2], ints[-1]
            if len(ints) == 1:
                return ints[0], 0
    return None


def strace_run(ctx, run, connections: int) -> dict:
    tids = _tids(run.pids())
    outf = ctx.tmp / f"strace-{run.name}.txt"
    cmd = ["strace", "-c", "-f", "-o", str(outf)]
    for t in tids:
        cmd += ["-p", str(t)]
    st = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          start_new_session=True)
    procs.REGISTRY.procs.append(st)
    try:
        time.sleep(1.0)
        if st.poll() is not None:
            return {"error": f"strace exited {st.returncode}: {st.stderr.read().decode()[-300:]}"}
        r = measure.wrk(ctx, run, "/", connections=connections, duration=STRACE_S)
        st.send_signal(signal.SIGINT)
        st.wait(timeout=15)
    finally:
        procs.REGISTRY.stop(st)
    tot = parse_strace_total(outf.read_text() if outf.exists() else "")
    if not tot or not r.get("requests"):
        return {"error": "could not read strace summary"}
    calls, errors = tot
    return {"requests": r["requests"], "syscalls": calls, "syscall_errors": errors,
            "syscalls_per_req": calls / r["requests"], "rps_under_strace": r["rps"],
            "summary": outf.read_text()[-4000:]}


def run(ctx, args) -> int:
    if getattr(args, "ratelimit", False):
        return ratelimit.run(ctx, args)
    if args.rounds < 3:
        say("--rounds below 3: using 3")
        args.rounds = 3
    wanted = ["wrk", "nginx"] + (["strace"] if args.strace else [])
    runner.install_tools(ctx, wanted, allow=not args.no_install, builds=False,
                         build_ws=not args.no_build)
    for t in ("wrk", "nginx", "veloxy", "upstream"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --vs-nginx: {ctx.tool_info[t].reason}")
    ctx.workers = 1
    ctx.proxy_cpus = ctx.proxy_cpus[:1]  # both proxies on the same single core
    runner.start_upstreams(ctx)
    running = {}
    fpm = None
    if getattr(args, "fastcgi", False):
        try:
            fpm, sock, root = fastcgi.start(ctx)
        except StartError as e:
            raise SetupError(str(e)) from e
        entries = fastcgi.entries(sock, root)
    else:
        entries = _entries(args, ctx)
    headers = [AUTH_HEADER] if getattr(args, "auth", False) else None
    labels = [e[0] for e in entries]
    paths = {e[0]: e[3] for e in entries}
    try:
        for label, peer, extra, _ in entries:
            try:
                running[label] = peers.start(ctx, peer, extra=extra)
            except StartError as e:
                raise SetupError(f"{label} failed to start: {e}") from e
            ctx.peer_status[label] = {"status": "ok", "reason": running[label].note}
            report.save_config(ctx, running[label])
        per_run = args.warmup + args.duration + 0.5
        total = per_run * len(labels) * args.rounds + (len(labels) * (STRACE_S + 3) if args.strace else 0)
        say(f"{args.rounds} rounds x {labels}, {args.connections} connections, "
            f"{args.duration:g}s + {args.warmup:g}s warm-up each: ~{fmt_s(total)}")
        rounds: dict[str, list] = {n: [] for n in labels}
        left = total
        for i in range(args.rounds):
            for name in labels:
                say(f"[~{fmt_s(left)} left] round {i + 1}/{args.rounds}: {name}")
                try:
                    r = measure.wrk(ctx, running[name], paths[name], connections=args.connections,
                                    duration=args.duration, warmup=args.warmup, headers=headers)
                except LoadError as e:
                    r = {"error": str(e)}
                r["round"] = i + 1
                rounds[name].append(r)
                say("    " + report.one_line(r))
                left -= per_run
                if not running[name].alive():
                    raise SetupError(f"{name} exited during round {i + 1}: "
                                     f"{procs.tail(running[name].log)}")
        ctx.results["vs-nginx"] = rounds
        if args.strace:
            if "strace" not in ctx.tools:
                ctx.results["strace"] = {"error": ctx.tool_info["strace"].reason}
            else:
                ctx.results["strace"] = {}
                for name in labels:
                    say(f"strace -c -f on {name} ({STRACE_S}s wrk)")
                    ctx.results["strace"][name] = strace_run(ctx, running[name], args.connections)
    finally:
        for r in running.values():
            peers.stop(r)
        if fpm is not None:
            peers.stop(fpm)
    text = summarize(ctx, args)
    print("\n" + text, flush=True)
    (ctx.outdir / "report.md").write_text(_md(ctx, args, text))
    report.write_results(ctx)
    say(f"report: {ctx.outdir / 'report.md'}")
    return 0


def _med(rs: list[dict], key) -> float | None:
    vals = [key(r) for r in rs if not r.get("error") and key(r) is not None]
    return statistics.median(vals) if vals else None


# The ratios reported when both contenders ran: (numerator, denominator, decimals, note).
RATIOS = [
    ("veloxy-rules", "veloxy", 3, "(goal: at most 1.05)"),
    ("nginx-rules", "nginx", 3, "(nginx's own price for the same rules)"),
    ("nginx-rules", "veloxy-rules", 2, "(goal: at least 1.1)"),
    ("veloxy-auth", "veloxy", 3, "(goal: below 1.05)"),
    ("nginx-auth", "veloxy-auth", 1, ""),
    ("veloxy-trace-0.01", "veloxy", 3, "(goal: at most 1.03)"),
    ("veloxy-trace-1", "veloxy", 3, "(goal: at most 1.15)"),
    ("nginx", "veloxy", 2, "(above 1 = veloxy uses less CPU per request)"),
    ("nginx-fastcgi", "veloxy-fastcgi", 2, "(above 1 = veloxy uses less CPU per request)"),
]


def summarize(ctx, args) -> str:
    rounds = ctx.results["vs-nginx"]
    labels = list(rounds)
    lines = [f"veloxy vs nginx: 1 worker each on core(s) {ctx.proxy_cpus}, wrk + 4 upstreams "
             f"on core(s) {ctx.load_cpus}, {args.connections} connections, "
             f"{args.rounds} alternating rounds of {args.duration:g}s (median)"]
    if getattr(args, "rules", False):
        lines.append(f"rules scenario: GET {RULES_PATH}; veloxy = plain route, veloxy-rules and "
                     "nginx-rules = regex match, prefix stripped, 2 request + 2 response header rules")
    hdr = f"{'':12} {'req/s':>10} {'p99':>9} {'CPU/req':>10}   per round (req/s, CPU us/req)"
    lines.append(hdr)
    med = {}
    for name in labels:
        rs = rounds[name]
        rps = _med(rs, lambda r: r["rps"])
        p99 = _med(rs, lambda r: r["latency_ms"].get("p99"))
        cpu = _med(rs, lambda r: r.get("cpu_us_per_req"))
        med[name] = cpu
        per = ", ".join("failed" if r.get("error") else
                        f"{measure.fmt_rate(r['rps'])}/{r.get('cpu_us_per_req') or 0:.1f}"
                        for r in rs)
        lines.append(f"{name:12} {measure.fmt_rate(rps):>10} {measure.fmt_ms(p99):>9} "
                     f"{measure.fmt_us(cpu):>10}   {per}")
    if getattr(args, "auth", False):
        lines.insert(1, f"auth scenario: GET {AUTH_PATH} with one valid Authorization; veloxy-auth = "
                        "basic_auth (bcrypt htpasswd, cached credential), nginx-auth = auth_basic")
    if getattr(args, "fastcgi", False):
        lines.insert(1, f"fastcgi scenario: GET {fastcgi.PATH} (a ~100-byte JSON from PHP), both "
                        f"to one php-fpm (static pool of {fastcgi.CHILDREN}, opcache, unix socket, "
                        f"pinned with wrk on core(s) {ctx.load_cpus}); CPU/req is the proxy's alone")
        rps = {n: _med(rounds[n], lambda r: r["rps"]) for n in labels}
        if rps.get("veloxy-fastcgi") and rps.get("nginx-fastcgi"):
            lines.append(f"veloxy-fastcgi req/s / nginx-fastcgi req/s = "
                         f"{rps['veloxy-fastcgi'] / rps['nginx-fastcgi']:.2f}")
    for num, den, digits, note in RATIOS:
        if med.get(num) and med.get(den):
            lines.append(f"{num} CPU/req / {den} CPU/req = {med[num] / med[den]:.{digits}f}"
                         + (f" {note}" if note else ""))
    st = ctx.results.get("strace")
    if st:
        if "error" in st:
            lines.append(f"strace: {st['error']}")
        for name in labels:
            s = (st or {}).get(name)
            if not s:
                continue
            if s.get("error"):
                lines.append(f"strace {name}: {s['error']}")
            else:
                lines.append(f"strace {name}: {s['syscalls_per_req']:.2f} syscalls/request "
                             f"({s['syscalls']} calls over {s['requests']} requests)")
    return "\n".join(lines)


def _md(ctx, args, text: str) -> str:
    m = report.meta(ctx)
    mach = m["machine"]
    vers = "\n".join(f"- {k}: {v}" for k, v in ctx.versions.items())
    st = ctx.results.get("strace") or {}
    straces = "".join(f"\n### strace -c -f: {n}\n\n```\n{s['summary']}\n```\n"
                      for n, s in st.items() if isinstance(s, dict) and s.get("summary"))
    return (f"# veloxy vs nginx: {m['name']}\n\n"
            f"Machine: {mach['cpu']}, {mach['cores']} cores, Linux {mach['kernel']}. "
            f"Command: `bench/run {' '.join(ctx.argv)}`\n\n```\n{text}\n```\n\n"
            f"Configs: `configs/` (rendered from `bench/peers/`).\n\n## Versions\n\n{vers}\n"
            f"{straces}")
