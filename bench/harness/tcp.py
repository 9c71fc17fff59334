"""`bench/run --tcp`: L4 (TCP) proxying, veloxy vs HAProxy (`mode tcp`) vs nginx (`stream {}`).

One worker each, all three pinned to the same proxy core, running side by side, in alternating
wrk rounds (the first proxy of each round rotates), in front of one upstream: nginx serving
the run's files over plain HTTP and over HTTPS (its own self-signed certificate for SNI),
pinned with wrk on the load cores. Every request sends `Connection: close`, so each file is
one new TCP connection through the proxy (and, for SNI, one TLS handshake with the upstream,
relayed untouched). Cases:

- plain-1m:   plain TCP listener, GET /1m.bin (1 MiB): transfers/s, MiB/s, CPU per transfer;
- plain-conn: plain TCP listener, GET /100.bin (100 bytes): new connections/s, CPU per connection;
- sni-1m / sni-conn: the same over TLS with SNI `bench.test`: the proxy peeks the ClientHello
  and relays the connection to the upstream's HTTPS port, which terminates TLS.

CPU per transfer (connection) = utime+stime of the proxy's process tree (/proc/PID/stat) over
the measured run / transfers completed, as in the other scenarios. Before measuring, each
proxy relays /1m.bin once on each listener and the bytes are compared with the file; for SNI
the certificate presented must be the upstream's (not the proxy's): proof of passthrough.
Goal: haproxy CPU per transfer / veloxy CPU per transfer >= 1.0 in every case.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import socket
import ssl
import statistics
import subprocess
import time
from pathlib import Path

from . import charts as ch
from . import loadgen, measure, peers, procs, report, runner
from .install import Installer
from .loadgen import WRK_LUA, LoadError
from .measure import fmt_rate, fmt_us
from .procs import StartError
from .runner import SetupError
from .ui import fmt_s, say, warn

TCP_PEERS = ["veloxy", "haproxy", "nginx"]
SNI = "bench.test"
MIB = 1024 * 1024
FILES = {"1m.bin": MIB, "100.bin": 100}
GOAL = 1.0  # haproxy CPU per transfer / veloxy CPU per transfer
# case -> (listener: "plain" | "sni", file, what one request is)
CASES = {
    "plain-1m": ("plain", "1m.bin", "transfer"),
    "plain-conn": ("plain", "100.bin", "connection"),
    "sni-1m": ("sni", "1m.bin", "transfer"),
    "sni-conn": ("sni", "100.bin", "connection"),
}
TITLES = {
    "plain-1m": "plain TCP, 1 MiB per connection (GET /1m.bin, Connection: close)",
    "plain-conn": "plain TCP, new connections (GET /100.bin, 100 bytes, Connection: close)",
    "sni-1m": f"SNI passthrough ({SNI}), 1 MiB per TLS connection",
    "sni-conn": f"SNI passthrough ({SNI}), new TLS connections (100 bytes each)",
}
TEMPLATES = {"veloxy": ("veloxy-tcp.toml.tmpl", "veloxy.toml"),
             "haproxy": ("haproxy-tcp.cfg.tmpl", "haproxy.cfg"),
             "nginx": ("nginx-tcp.conf.tmpl", "nginx.conf")}
SETTINGS_NOTES = {
    "veloxy": "`[listeners.l4] protocol = \"tcp\"` + `[[streams]] listener = \"l4\"`; a TLS "
              f"listener with `[[streams]] sni = [\"{SNI}\"]` (ClientHello peeked, relayed "
              "untouched); defaults otherwise",
    "haproxy": "`mode tcp`; SNI: `tcp-request inspect-delay 5s`, `tcp-request content accept if "
               f"{{ req.ssl_hello_type 1 }}`, `use_backend tlsfiles if {{ req.ssl_sni -i {SNI} }}`; "
               "defaults otherwise (no splicing)",
    "nginx": "`stream {}` (ngx_stream_module), `proxy_pass`; SNI: `ssl_preread on` + `map "
             "$ssl_preread_server_name`; defaults otherwise",
}


# --- files, certificates, configs ---------------------------------------------------------

def make_files(root: Path, seed: int = 13) -> dict[str, str]:
    """The upstream's files (random bytes, seeded) and an index.html for the readiness
    probes; returns file name -> sha256."""
    root.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    out = {}
    for name, size in FILES.items():
        data = rnd.randbytes(size)
        (root / name).write_bytes(data)
        out[name] = hashlib.sha256(data).hexdigest()
    (root / "index.html").write_text("veloxy bench tcp upstream\n")
    return out


def make_certs(tmp: Path) -> dict[str, dict[str, str]]:
    """Two certificates: the proxy's own (veloxy's TLS listener, for names it does not pass
    through) and the upstream's for SNI; distinct so the probe can tell who answered."""
    from scenarios import tls  # the tls scenario's openssl helper

    return {"proxy": tls.make_cert(tmp / "tls-proxy"),
            "upstream": tls.make_cert(tmp / "tls-upstream", cn=SNI, san=f"DNS:{SNI}")}


def stream_module(nginx_v: str, exists=os.path.exists) -> tuple[str | None, str]:
    """From `nginx -V` output: (the line to put first in the config, "" when the stream
    module is built in; None when nginx has no usable stream module) and a reason/note."""
    if "--with-stream_ssl_preread_module" not in nginx_v:
        return None, "nginx was built without ngx_stream_ssl_preread_module (SNI passthrough)"
    if re.search(r"--with-stream(\s|$)", nginx_v):
        return "", "stream module built in"
    if "--with-stream=dynamic" not in nginx_v:
        return None, "nginx was built without the stream module (--with-stream)"
    m = re.search(r"--modules-path=(\S+)", nginx_v)
    if m:
        mdir = m.group(1)
    else:
        p = re.search(r"--prefix=(\S+)", nginx_v)
        mdir = (p.group(1) if p else "/usr/local/nginx") + "/modules"
    so = f"{mdir}/ngx_stream_module.so"
    if not exists(so):
        return None, f"nginx has the stream module as a dynamic module, but {so} is missing " \
                     "(Debian: apt-get install libnginx-mod-stream)"
    return f"load_module {so};", f"dynamic module {so}"


def nginx_stream(ctx, allow: bool) -> tuple[str | None, str]:
    """stream_module() for the installed nginx; installs libnginx-mod-stream if missing and
    installs are allowed (apt-get, root)."""
    def probe():
        try:
            r = subprocess.run([ctx.tools["nginx"], "-V"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"nginx -V failed: {e}"
        return stream_module(r.stdout + r.stderr)

    line, why = probe()
    if line is None and "libnginx-mod-stream" in why and allow:
        inst = Installer(ctx.cache, allow_install=True)
        say(f"installing libnginx-mod-stream (log: {inst.logs / 'apt.log'})")
        rc = inst.apt_pkg("libnginx-mod-stream")
        inst._stop_system_services(inst.logs / "apt.log")
        line, why2 = probe()
        if line is None:
            why = f"{why2}; apt-get install libnginx-mod-stream: rc={rc}"
        else:
            why = why2 + " (installed libnginx-mod-stream)"
    return line, why


def values(ctx, name: str, wd: Path, port: int, tls_port: int, up: dict, certs: dict,
           load_module: str = "") -> dict[str, object]:
    """Template values for proxy `name` (see bench/peers/*-tcp.*.tmpl)."""
    v: dict[str, object] = {"WORKERS": ctx.workers, "PORT": port, "TLS_PORT": tls_port,
                            "UPSTREAM": up["plain"], "TLS_UPSTREAM": up["tls"], "SNI": SNI}
    if name == "veloxy":
        v.update({"CERT": certs["proxy"]["cert"], "KEY": certs["proxy"]["key"]})
    elif name == "haproxy":
        v.update({"WORKDIR": wd, "MAXCONN": peers._maxconn(ctx)})
    elif name == "nginx":
        v.update({"WORKDIR": wd, "NOFILE": ctx.nofile, "MAXCONN": peers._maxconn(ctx),
                  "LOAD_MODULE": load_module})
    return v


def command(ctx, name: str, conf: Path) -> list[str]:
    if name == "veloxy":
        return [ctx.tools["veloxy"], "run", "--config", str(conf)]
    if name == "haproxy":
        return [ctx.tools["haproxy"], "-db", "-f", str(conf)]
    wd = conf.parent
    return [ctx.tools["nginx"], "-p", f"{wd}/", "-e", str(wd / "error.log"), "-c", str(conf)]


def render(ctx, name: str, wd: Path, port: int, tls_port: int, up: dict, certs: dict,
           load_module: str = "") -> tuple[list[str], Path]:
    tmpl, fname = TEMPLATES[name]
    conf = peers.render_file(tmpl, wd / fname,
                             values(ctx, name, wd, port, tls_port, up, certs, load_module))
    return command(ctx, name, conf), conf


def _two_ports() -> tuple[int, int]:
    a = procs.free_port()
    for _ in range(20):
        b = procs.free_port()
        if b != a:
            return a, b
    raise StartError("no second free port")


# --- probes -------------------------------------------------------------------------------

def fetch(port: int, path: str, *, sni: str | None = None, timeout: float = 5,
          limit: int = 2 * MIB + 65536) -> tuple[int, bytes, bytes | None]:
    """GET path from 127.0.0.1:port over plain TCP, or TLS with `sni` (no verification),
    `Connection: close`, read to EOF (at most `limit` bytes): (status, body, DER certificate
    the server presented or None)."""
    deadline = time.monotonic() + timeout
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    cert = None
    try:
        s = raw
        if sni is not None:
            c = ssl.create_default_context()
            c.check_hostname = False
            c.verify_mode = ssl.CERT_NONE
            s = c.wrap_socket(raw, server_hostname=sni)
            cert = s.getpeercert(binary_form=True)
        host = sni or "127.0.0.1"
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        buf = bytearray()
        while len(buf) < limit and time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ssl.SSLError:
                break  # a close without close_notify: the data read so far stands
            if not chunk:
                break
            buf += chunk
    finally:
        raw.close()
    head, _, body = bytes(buf).partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return (int(m.group(1)) if m else 0), body, cert


def _pem_der(pem_path: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(Path(pem_path).read_text())


def verify(port: int, tls_port: int, sums: dict[str, str], upstream_cert: str) -> str | None:
    """Relay /1m.bin once through each listener; None when the bytes are the file's and the
    SNI connection reached the upstream (its certificate), else what is wrong."""
    want = sums["1m.bin"]
    for label, sni in (("plain", None), ("sni", SNI)):
        p = port if sni is None else tls_port
        try:
            status, body, cert = fetch(p, "/1m.bin", sni=sni)
        except OSError as e:
            return f"{label}: GET /1m.bin failed: {e}"
        if status != 200:
            return f"{label}: GET /1m.bin answered {status or 'no HTTP status'}"
        if hashlib.sha256(body).hexdigest() != want:
            return f"{label}: GET /1m.bin: {len(body)} bytes that are not the file's"
        if sni is not None and cert != _pem_der(upstream_cert):
            return "sni: the certificate presented is not the upstream's (not passed through)"
    return None


def wait_sni(tls_port: int, proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StartError(f"exited with code {proc.returncode} during start-up")
        try:
            status, _, _ = fetch(tls_port, "/100.bin", sni=SNI, timeout=2)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    raise StartError(f"SNI {SNI} on 127.0.0.1:{tls_port} not answering 200 after "
                     f"{timeout:.0f}s (last: {last})")


# --- processes ----------------------------------------------------------------------------

def start_upstream(ctx, root: Path, certs: dict) -> tuple[peers.Running, dict[str, str]]:
    """nginx serving `root` over HTTP and HTTPS, pinned with the load generator."""
    ctx.seq += 1
    wd = ctx.tmp / f"upstream-nginx-{ctx.seq}"
    wd.mkdir(parents=True)
    port, tls_port = _two_ports()
    conf = peers.render_file("nginx-files.conf.tmpl", wd / "nginx.conf", {
        "WORKERS": len(ctx.load_cpus), "WORKDIR": wd, "NOFILE": ctx.nofile,
        "MAXCONN": peers._maxconn(ctx), "PORT": port, "TLS_PORT": tls_port, "ROOT": root,
        "SNI": SNI, "CERT": certs["upstream"]["cert"], "KEY": certs["upstream"]["key"]})
    cmd = command(ctx, "nginx", conf)
    (wd / "command.txt").write_text(" ".join(cmd) + "\n")
    log = wd / "output.log"
    p = procs.REGISTRY.spawn(cmd, cpus=ctx.load_cpus, log=log, cwd=str(wd))
    run = peers.Running("upstream-nginx", port, p, wd, log)
    try:
        procs.wait_port(port, p, 10)
        procs.wait_port(tls_port, p, 10)
        procs.wait_http_ok(f"http://127.0.0.1:{port}/", p, 10)
        wait_sni(tls_port, p, 10)
    except StartError as e:
        procs.REGISTRY.stop(p)
        raise StartError(f"{e}\n--- {wd / 'error.log'} ---\n{procs.tail(wd / 'error.log')}") from e
    return run, {"plain": f"127.0.0.1:{port}", "tls": f"127.0.0.1:{tls_port}"}


def start_proxy(ctx, name: str, up: dict, certs: dict, load_module: str = "") -> peers.Running:
    ctx.seq += 1
    wd = ctx.tmp / f"{name}-tcp-{ctx.seq}"
    wd.mkdir(parents=True)
    port, tls_port = _two_ports()
    cmd, conf = render(ctx, name, wd, port, tls_port, up, certs, load_module)
    (wd / "command.txt").write_text(" ".join(cmd) + "\n")
    if name == "veloxy":  # a crisp error for a veloxy build without [[streams]]
        r = subprocess.run([ctx.tools["veloxy"], "check", "--config", str(conf)],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise StartError("`veloxy check` refuses the L4 config (a build without "
                             "[[streams]]? rebuild, or set VELOXY_BIN): "
                             + (r.stdout + r.stderr).strip()[-400:])
    log = wd / "output.log"
    t0 = time.monotonic()
    p = procs.REGISTRY.spawn(cmd, cpus=ctx.proxy_cpus, log=log, cwd=str(wd))
    run = peers.Running(name, port, p, wd, log)
    run.tls_port = tls_port
    try:
        procs.wait_port(port, p, 15)
        procs.wait_port(tls_port, p, 15)
        procs.wait_http_ok(f"http://127.0.0.1:{port}/", p, 15)
        wait_sni(tls_port, p, 15)
    except StartError as e:
        procs.REGISTRY.stop(p)
        raise StartError(f"{e}\n--- {log} ---\n{procs.tail(log)}") from e
    run.started_s = time.monotonic() - t0
    return run


# --- measurement --------------------------------------------------------------------------

def sni_script(tmp: Path) -> Path:
    """A wrk script: lua/report.lua (WRKJSON summary) plus a resolver that connects to
    127.0.0.1 whatever the URL's host, so that https://bench.test:PORT/ sends SNI bench.test
    (wrk sets SNI from the URL's host) without any name resolution."""
    path = tmp / "wrk-sni.lua"
    path.write_text(f'dofile("{WRK_LUA}")\n'
                    "local resolve = wrk.resolve\n"
                    'function wrk.resolve(host, service) resolve("127.0.0.1", service) end\n')
    return path


def one_round(ctx, run, case: str, *, connections: int, duration: float, warmup: float,
              script: Path) -> dict:
    listener, fname, _ = CASES[case]
    if listener == "plain":
        url, scr = f"http://127.0.0.1:{run.port}/{fname}", None
    else:
        url, scr = f"https://{SNI}:{run.tls_port}/{fname}", script
    kw = dict(connections=connections, threads=len(ctx.load_cpus), cpus=ctx.load_cpus,
              headers=["Connection: close"], script=scr)
    if warmup > 0:
        loadgen.wrk(url, duration=warmup, **kw)
    res = measure.measured(ctx, run, lambda: loadgen.wrk(url, duration=duration, **kw))
    res.update({"connections": connections, "path": "/" + fname, "case": case})
    n = res.get("requests") or 0
    res["bytes_per_req"] = res["bytes"] / n if n else None
    if not n:
        res["error"] = "no transfer completed"
    elif res["bytes_per_req"] < FILES[fname]:
        res["error"] = (f"transfers averaged {res['bytes_per_req']:.0f} bytes, less than the "
                        f"{FILES[fname]}-byte file")
    return res


def rotation(labels: list[str], i: int) -> list[str]:
    """Round i's order: the first proxy rotates, so none always runs first (or last)."""
    k = i % len(labels) if labels else 0
    return labels[k:] + labels[:k]


def run(ctx, args, requested: list[str]) -> int:
    rounds_n = max(1, args.rounds)
    wanted = [p for p in requested if p in TCP_PEERS]
    for p in requested:
        if p not in TCP_PEERS:
            warn(f"--tcp compares {', '.join(TCP_PEERS)} only: {p} ignored")
    if "veloxy" not in wanted:
        raise SetupError("--tcp needs veloxy among the proxies")
    allow = not args.no_install
    runner.install_tools(ctx, ["wrk", "nginx", "haproxy"], allow=allow, builds=False,
                         build_ws=not args.no_build)
    for t in ("wrk", "nginx", "veloxy"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --tcp (nginx is also the upstream): "
                             f"{ctx.tool_info[t].reason}")
    ctx.workers = 1
    ctx.proxy_cpus = ctx.proxy_cpus[:1]  # every proxy on the same single core
    for name in wanted:
        ctx.peer_status[name] = {"status": "ok", "reason": ""}
    if "haproxy" in wanted and "haproxy" not in ctx.tools:
        ctx.peer_status["haproxy"] = {"status": "skipped", "reason": ctx.tool_info["haproxy"].reason}
    load_module = ""
    if "nginx" in wanted:
        mod_line, why = nginx_stream(ctx, allow)
        if mod_line is None:
            ctx.peer_status["nginx"] = {"status": "skipped", "reason": why}
        else:
            load_module = mod_line
            ctx.peer_status["nginx"]["reason"] = why
    for name, st in ctx.peer_status.items():
        if st["status"] != "ok":
            warn(f"{name} skipped: {st['reason']}")

    try:
        certs = make_certs(ctx.tmp)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"cannot make the certificates (openssl): {e}") from e
    sums = make_files(ctx.tmp / "files")
    try:
        upstream, up = start_upstream(ctx, ctx.tmp / "files", certs)
    except StartError as e:
        raise SetupError(f"the upstream nginx failed to start: {e}") from e
    ctx.upstreams = peers.Upstreams(addrs=[up["plain"], up["tls"]], procs=[upstream.proc])
    report.save_config(ctx, upstream)
    say(f"upstream nginx on core(s) {procs.cpu_list(ctx.load_cpus)}: HTTP {up['plain']}, "
        f"HTTPS {up['tls']} (SNI {SNI})")

    running: dict[str, peers.Running] = {}
    results: dict[str, dict[str, list]] = {c: {} for c in CASES}
    ctx.results["tcp"] = results
    try:
        for name in wanted:
            if ctx.peer_status[name]["status"] != "ok":
                continue
            try:
                r = start_proxy(ctx, name, up, certs, load_module if name == "nginx" else "")
            except StartError as e:
                if name == "veloxy":
                    raise SetupError(f"veloxy failed to start: {e}") from e
                warn(f"{name} failed to start: {e}")
                ctx.peer_status[name] = {"status": "start failed", "reason": str(e)[-400:]}
                continue
            report.save_config(ctx, r, variant="tcp")
            bad = verify(r.port, r.tls_port, sums, certs["upstream"]["cert"])
            if bad:
                peers.stop(r)
                if name == "veloxy":
                    raise SetupError(f"veloxy does not relay the files intact: {bad}")
                warn(f"{name} does not relay the files intact: {bad}")
                ctx.peer_status[name] = {"status": "wrong bytes", "reason": bad}
                continue
            running[name] = r
        labels = [n for n in wanted if n in running]
        for c in CASES:
            results[c] = {n: [] for n in labels}
        per_run = args.warmup + max(1, args.duration) + 0.5
        total = per_run * len(labels) * len(CASES) * rounds_n
        say(f"{rounds_n} round(s) x {len(CASES)} cases x {labels}, {args.connections} connections, "
            f"{args.duration:g}s + {args.warmup:g}s warm-up each: ~{fmt_s(total)}")
        if rounds_n < 3:
            warn(f"{rounds_n} round(s): a smoke check, not a measurement (use --rounds 3 or more)")
        left = total
        script = sni_script(ctx.tmp)
        for i in range(rounds_n):
            for case in CASES:
                for name in rotation(labels, i):
                    if name not in running:
                        continue
                    say(f"[~{fmt_s(left)} left] round {i + 1}/{rounds_n}: {case}: {name}")
                    try:
                        r = one_round(ctx, running[name], case, connections=args.connections,
                                      duration=args.duration, warmup=args.warmup, script=script)
                    except LoadError as e:
                        r = {"error": str(e), "case": case}
                    r["round"] = i + 1
                    results[case][name].append(r)
                    say("    " + one_line(r, CASES[case][2]))
                    left -= per_run
                    if upstream.proc.poll() is not None:
                        raise SetupError(f"the upstream nginx exited during round {i + 1}: "
                                         f"{procs.tail(upstream.workdir / 'error.log')}")
                    if not running[name].alive():
                        msg = (f"exited (code {running[name].proc.returncode}) during round "
                               f"{i + 1} / {case}: {procs.tail(running[name].log, 4)}")
                        warn(f"{name} {msg}")
                        ctx.peer_status[name] = {"status": "crashed", "reason": msg}
                        peers.stop(running.pop(name))
            report.write_results(ctx)
    finally:
        for r in running.values():
            peers.stop(r)
        peers.stop(upstream)
    text = summarize(ctx, args)
    print("\n" + text, flush=True)
    made = make_charts(ctx)
    (ctx.outdir / "report.md").write_text(_md(ctx, args, text, made))
    report.write_results(ctx)
    say(f"report: {ctx.outdir / 'report.md'}")
    return 0


# --- report -------------------------------------------------------------------------------

def one_line(r: dict, unit: str) -> str:
    if r.get("error"):
        return f"error: {r['error'][:160]}"
    mibs = r.get("transfer_bps", 0) / MIB
    return (f"{fmt_rate(r.get('rps'))} {unit}s/s, {mibs:.0f} MiB/s, errors {r.get('errors', 0)}, "
            f"cpu/{unit} {fmt_us(r.get('cpu_us_per_req'))}, proxy cpu {r.get('proxy_cpu_pct', 0):.0f}%, "
            f"busiest {r.get('bottleneck')}")


def _med(rs: list[dict], key: str) -> float | None:
    vals = [r.get(key) for r in rs if not r.get("error") and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def medians(results: dict) -> dict[str, dict[str, dict]]:
    """case -> proxy -> median rps, MiB/s, CPU us per request, errors (sum), rounds ok."""
    out: dict[str, dict[str, dict]] = {}
    for case, per in results.items():
        out[case] = {}
        for name, rs in per.items():
            bps = _med(rs, "transfer_bps")
            out[case][name] = {"rps": _med(rs, "rps"), "mibs": bps / MIB if bps is not None else None,
                               "cpu_us": _med(rs, "cpu_us_per_req"),
                               "errors": sum(r.get("errors", 0) for r in rs if not r.get("error")),
                               "ok": sum(1 for r in rs if not r.get("error")), "rounds": len(rs)}
    return out


def cpu_ratio(med: dict[str, dict], other: str) -> float | None:
    """`other`'s CPU per request / veloxy's (above 1 = veloxy cheaper)."""
    v, o = (med.get("veloxy") or {}).get("cpu_us"), (med.get(other) or {}).get("cpu_us")
    return o / v if v and o else None


def summarize(ctx, args) -> str:
    results = ctx.results.get("tcp") or {}
    meds = medians(results)
    rounds_n = max(1, args.rounds)
    lines = [f"TCP (L4) proxying: 1 worker each on core(s) {ctx.proxy_cpus}, wrk + the upstream "
             f"nginx on core(s) {ctx.load_cpus}, {args.connections} connections, {rounds_n} "
             f"alternating round(s) of {args.duration:g}s (median), Connection: close "
             "(one TCP connection per request)"]
    if rounds_n < 3:
        lines.append(f"ONLY {rounds_n} ROUND(S): a smoke check, the numbers are noise")
    for name, st in ctx.peer_status.items():
        if st.get("status") != "ok":
            lines.append(f"{name}: {st['status']}: {st['reason'][:300]}")
    goals = []
    for case, per in results.items():
        unit = CASES[case][2]
        lines.append("")
        lines.append(TITLES[case])
        lines.append(f"{'':10} {unit + 's/s':>14} {'MiB/s':>8} {'CPU/' + unit:>15} {'errors':>7}   "
                     "per round (rate, CPU us)")
        for name, rs in per.items():
            m = meds[case][name]
            per_round = ", ".join("failed" if r.get("error") else
                                  f"{fmt_rate(r['rps'])}/{r.get('cpu_us_per_req') or 0:.1f}"
                                  for r in rs)
            mibs = "-" if m["mibs"] is None else f"{m['mibs']:.0f}"
            lines.append(f"{name:10} {fmt_rate(m['rps']):>14} {mibs:>8} {fmt_us(m['cpu_us']):>15} "
                         f"{m['errors']:>7}   {per_round}")
        for other in ("haproxy", "nginx"):
            r = cpu_ratio(meds[case], other)
            if r is None:
                continue
            goal = ""
            if other == "haproxy":
                met = r >= GOAL
                goal = f" (goal >= {GOAL:.1f}: {'met' if met else 'NOT met'})"
                goals.append(f"{case}: {r:.2f} {'met' if met else 'NOT met'}")
            lines.append(f"{other} CPU/{unit} / veloxy CPU/{unit} = {r:.2f}{goal}")
        fails = [f"{n} round {r['round']}: {r['error'][:160]}" for n, rs in per.items()
                 for r in rs if r.get("error")]
        lines += [f"failed: {f}" for f in fails]
    if goals:
        lines.append("")
        lines.append("goal, haproxy CPU / veloxy CPU >= 1.0: " + "; ".join(goals))
    return "\n".join(lines)


def make_charts(ctx) -> list[tuple[str, str]]:
    results = ctx.results.get("tcp") or {}
    if not ch.HAVE or not results:
        return []
    meds = medians(results)
    names = [n for n in TCP_PEERS if any(n in per for per in results.values())]
    labels = {"plain-1m": "plain 1 MiB", "plain-conn": "plain conn", "sni-1m": "SNI 1 MiB",
              "sni-conn": "SNI conn"}
    made = []

    def series(key):
        return {labels[c]: [(meds[c].get(n) or {}).get(key) for n in names] for c in results}

    if ch.grouped_bars(ctx.outdir / "tcp_rate.png", "TCP: transfers (1 MiB) or connections per second",
                       "per second", names, series("rps")):
        made.append(("Transfers/s (1 MiB) and connections/s per proxy (tcp)", "tcp_rate.png"))
    if ch.grouped_bars(ctx.outdir / "tcp_cpu.png", "TCP: proxy CPU time per transfer / connection",
                       "microseconds of CPU", names, series("cpu_us"), fmt=lambda v: f"{v:.0f}"):
        made.append(("Proxy CPU per transfer / connection (tcp)", "tcp_cpu.png"))
    return made


def _md(ctx, args, text: str, made: list[tuple[str, str]]) -> str:
    m = report.meta(ctx)
    mach = m["machine"]
    vers = "\n".join(f"- {k}: {v}" for k, v in ctx.versions.items())
    peers_md = "\n".join(f"| {n} | {st['status']} | {st.get('reason') or '-'} | "
                         f"{SETTINGS_NOTES.get(n, '-')} |" for n, st in ctx.peer_status.items())
    charts_md = "".join(f"![{t}]({f})\n\n" for t, f in made)
    sizes = ", ".join(f"`/{k}` {v:,} bytes" for k, v in FILES.items())
    return (f"# TCP (L4) proxying: {m['name']}\n\n"
            f"Machine: {mach['cpu']}, {mach['cores']} cores, Linux {mach['kernel']}. "
            f"Command: `bench/run {' '.join(ctx.argv)}`\n\n"
            "Every request is `GET` with `Connection: close` (wrk), so each one is a new TCP "
            "connection through the proxy to the upstream nginx (files: " + sizes + "); for SNI "
            f"a TLS connection with SNI `{SNI}` that the proxy relays untouched to the upstream's "
            "HTTPS port (the upstream terminates TLS). CPU per transfer/connection = the proxy "
            "process tree's utime+stime over the measured run / requests completed. Goal: "
            f"haproxy CPU / veloxy CPU >= {GOAL:.1f}.\n\n"
            "Where the busiest core is the load core (the SNI cases on a small machine: wrk and "
            "the upstream do the TLS handshakes and encryption there), the proxies run below "
            "100% of their core and the rates say more about the load core than the proxies; "
            "compare CPU per transfer/connection there, at similar rates.\n\n"
            f"```\n{text}\n```\n\n{charts_md}"
            "## Proxies\n\n| Proxy | Status | Note | Settings |\n|---|---|---|---|\n"
            f"{peers_md}\n\nConfigs: `configs/` (rendered from `bench/peers/*-tcp.*.tmpl`; the "
            "upstream from `bench/peers/nginx-files.conf.tmpl`).\n\n## Versions\n\n"
            f"{vers}\n")
