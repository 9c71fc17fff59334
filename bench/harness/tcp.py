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
import subprocess
import time
from pathlib import Path

from . import loadgen, measure, modes, peers, procs, report, runner
from .install import Installer
from .loadgen import WRK_LUA
from .measure import fmt_rate, fmt_us
from .procs import StartError
from .runner import SetupError
from .ui import say, warn

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
    wd = modes.workdir(ctx, "upstream-nginx")
    port, tls_port = _two_ports()
    conf = peers.render_file("nginx-files.conf.tmpl", wd / "nginx.conf", {
        "WORKERS": len(ctx.load_cpus), "WORKDIR": wd, "NOFILE": ctx.nofile,
        "MAXCONN": peers._maxconn(ctx), "PORT": port, "TLS_PORT": tls_port, "ROOT": root,
        "SNI": SNI, "CERT": certs["upstream"]["cert"], "KEY": certs["upstream"]["key"]})
    run = modes.spawn(ctx, "upstream-nginx", command(ctx, "nginx", conf), wd, port, ctx.load_cpus,
                      lambda r: wait_both(r, tls_port, 10), errlog=wd / "error.log")
    return run, {"plain": f"127.0.0.1:{port}", "tls": f"127.0.0.1:{tls_port}"}


def start_proxy(ctx, name: str, up: dict, certs: dict, load_module: str = "") -> peers.Running:
    wd = modes.workdir(ctx, f"{name}-tcp")
    port, tls_port = _two_ports()
    cmd, conf = render(ctx, name, wd, port, tls_port, up, certs, load_module)
    if name == "veloxy":  # a crisp error for a veloxy build without [[streams]]
        modes.veloxy_check(ctx, conf, "the L4 config", "[[streams]]")
    run = modes.spawn(ctx, name, cmd, wd, port, ctx.proxy_cpus,
                      lambda r: wait_both(r, tls_port, 15))
    run.tls_port = tls_port
    return run


def wait_both(run: peers.Running, tls_port: int, timeout: float) -> None:
    """Wait until `run` answers on its plain port (HTTP) and on `tls_port` (SNI)."""
    procs.wait_port(run.port, run.proc, timeout)
    procs.wait_port(tls_port, run.proc, timeout)
    procs.wait_http_ok(f"http://127.0.0.1:{run.port}/", run.proc, timeout)
    wait_sni(tls_port, run.proc, timeout)


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


def run(ctx, args, requested: list[str]) -> int:
    rounds_n = max(1, args.rounds)
    wanted = modes.choose(requested, TCP_PEERS, "--tcp")
    allow = not args.no_install
    runner.install_tools(ctx, ["wrk", "nginx", "haproxy"], allow=allow, builds=False,
                         build_ws=not args.no_build)
    for t in ("wrk", "nginx", "veloxy"):
        if t not in ctx.tools:
            raise SetupError(f"{t} is required for --tcp (nginx is also the upstream): "
                             f"{ctx.tool_info[t].reason}")
    modes.one_core(ctx, wanted)
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
        modes.start_checked(
            ctx, wanted, running,
            lambda name: start_proxy(ctx, name, up, certs, load_module if name == "nginx" else ""),
            lambda r: verify(r.port, r.tls_port, sums, certs["upstream"]["cert"]),
            variant="tcp", failing="does not relay the files intact", status="wrong bytes")
        script = sni_script(ctx.tmp)
        modes.alternate(
            ctx, results, running, {n: (n, {}) for n in wanted if n in running},
            rounds_n=rounds_n, per_run=args.warmup + max(1, args.duration) + 0.5,
            plan=(f"{args.connections} connections, {args.duration:g}s + {args.warmup:g}s "
                  "warm-up each"),
            one=lambda run, case: one_round(ctx, run, case, connections=args.connections,
                                            duration=args.duration, warmup=args.warmup,
                                            script=script),
            line=lambda r: one_line(r, CASES[r["case"]][2]),
            upstream=("the upstream nginx", upstream.proc, upstream.workdir / "error.log"))
    finally:
        for r in running.values():
            peers.stop(r)
        peers.stop(upstream)
    return modes.finish(ctx, args, summarize, make_charts, _md)


# --- report -------------------------------------------------------------------------------

def one_line(r: dict, unit: str) -> str:
    if r.get("error"):
        return f"error: {r['error'][:160]}"
    mibs = r.get("transfer_bps", 0) / MIB
    return (f"{fmt_rate(r.get('rps'))} {unit}s/s, {mibs:.0f} MiB/s, errors {r.get('errors', 0)}, "
            f"cpu/{unit} {fmt_us(r.get('cpu_us_per_req'))}, proxy cpu {r.get('proxy_cpu_pct', 0):.0f}%, "
            f"busiest {r.get('bottleneck')}")


def medians(results: dict) -> dict[str, dict[str, dict]]:
    """case -> proxy -> median rps, MiB/s, CPU us per request, errors (sum), rounds ok."""
    def mibs(good):
        bps = modes.median_of(good, "transfer_bps")
        return {"mibs": bps / MIB if bps is not None else None}

    return modes.medians(results, mibs)


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
    lines += modes.status_lines(ctx, rounds_n)
    goals = []
    for case, per in results.items():
        unit = CASES[case][2]
        lines.append("")
        lines.append(TITLES[case])
        lines.append(f"{'':10} {unit + 's/s':>14} {'MiB/s':>8} {'CPU/' + unit:>15} {'errors':>7}   "
                     "per round (rate, CPU us)")
        for name, rs in per.items():
            m = meds[case][name]
            per_round = modes.per_round(rs)
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
        lines += modes.failures(per)
    if goals:
        lines.append("")
        lines.append("goal, haproxy CPU / veloxy CPU >= 1.0: " + "; ".join(goals))
    return "\n".join(lines)


def make_charts(ctx) -> list[tuple[str, str]]:
    labels = {"plain-1m": "plain 1 MiB", "plain-conn": "plain conn", "sni-1m": "SNI 1 MiB",
              "sni-conn": "SNI conn"}
    return modes.bar_charts(ctx, "tcp", medians, TCP_PEERS, [
        ("tcp_rate.png", "TCP: transfers (1 MiB) or connections per second", "per second", "rps",
         "Transfers/s (1 MiB) and connections/s per proxy (tcp)", None),
        ("tcp_cpu.png", "TCP: proxy CPU time per transfer / connection", "microseconds of CPU",
         "cpu_us", "Proxy CPU per transfer / connection (tcp)", lambda v: f"{v:.0f}"),
    ], labels.get)


def _md(ctx, args, text: str, made: list[tuple[str, str]]) -> str:
    sizes = ", ".join(f"`/{k}` {v:,} bytes" for k, v in FILES.items())
    return modes.md(
        ctx, "TCP (L4) proxying",
        "Every request is `GET` with `Connection: close` (wrk), so each one is a new TCP "
        "connection through the proxy to the upstream nginx (files: " + sizes + "); for SNI "
        f"a TLS connection with SNI `{SNI}` that the proxy relays untouched to the upstream's "
        "HTTPS port (the upstream terminates TLS). CPU per transfer/connection = the proxy "
        "process tree's utime+stime over the measured run / requests completed. Goal: "
        f"haproxy CPU / veloxy CPU >= {GOAL:.1f}.\n\n"
        "Where the busiest core is the load core (the SNI cases on a small machine: wrk and "
        "the upstream do the TLS handshakes and encryption there), the proxies run below "
        "100% of their core and the rates say more about the load core than the proxies; "
        "compare CPU per transfer/connection there, at similar rates.",
        text, made, SETTINGS_NOTES,
        "Configs: `configs/` (rendered from `bench/peers/*-tcp.*.tmpl`; the upstream from "
        "`bench/peers/nginx-files.conf.tmpl`).")
