#!/usr/bin/env python3
"""`bench/run --kube`: veloxy as a Kubernetes Ingress controller under load (issue 37).

A real etcd + kube-apiserver (dev/kube/start.sh; binaries from `bash .ci/kube.sh`) in a network
namespace of its own (the script re-runs itself under `unshare -n`; TEST-NET addresses on its
`lo`, nothing leaves it). In it:

- **Objects**: N Services (default 1,000), each with one EndpointSlice of E ready endpoints
  (default 5: 192.0.2.10-14, port 20000+i) and one Ingress (`s{i}.bench.test`, path `/`
  Prefix, class `veloxy`). They are created before veloxy starts.
- **Backends**: one nginx (`worker_processes 1`) listening on 0.0.0.0 ports 20000+i and
  21000+i, answering 200 with the port it was reached on, so an answer says which
  EndpointSlice port served it.
- **veloxy**: `workers = 1`, pinned to the proxy core, `[providers.kubernetes]` with the
  admin kubeconfig, its listener on 192.0.2.2:8080. Everything else (API server, etcd, nginx,
  the load) runs on the other core; the API server, etcd and the churn's client threads at
  nice 19, and the load generator and the backends at SCHED_FIFO, so that their work (which
  a cluster does on other machines) does not delay the load generator and the backends.

Measured:
1. **Start**: seconds from `veloxy run` to every sampled host answering 200 (the first full
   list, translation, compile, swap), and veloxy's own `took_ms` of that first
   `kubernetes: config applied`; resident memory (VmRSS) and its peak (VmHWM) once serving.
2. **Steady load**: bench/pacer at a fixed rate over all N hosts in turn (`-H`), latency
   counted from when each request was due: p50/p99/max, failed requests.
3. **Churn**: the same load while R EndpointSlice changes a second (default 100, for S
   seconds, default 60) swap one endpoint address of a Service for another live one
   (192.0.2.15-19), from 4 API client threads on a fixed schedule. Failed requests, p99
   against the steady run's (goal: within 20%), API changes made and refused, and veloxy's
   rebuilds (`config applied` lines) with their `took_ms`.
4. **Controls**, the same load again: with the other core busy at nice 19 and no change;
   then with the same churn on N EndpointSlices of a namespace veloxy does not watch
   (`bench-other`), so that the API server, etcd and the churn's clients load the other core
   (where the load generator and the backends run) as in the churn while veloxy receives
   nothing. p99 churn / unwatched control is veloxy's own share of the churn's p99.
5. **Propagation** during the churn: every 5 s the port of one probe Service's slice flips
   between 20000+k and 21000+k; the time from the API's answer to the first answer from the
   new port (polled every 10 ms), goal under 1 s.

Output: OUT/report.md and OUT/results.json. Needs root (unshare -n), nginx, the kube
binaries, bench/pacer (built by bench/run) and a veloxy binary (VELOXY_BIN or
target/release/veloxy).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CACHE = Path(os.environ.get("VELOXY_CACHE", Path.home() / ".cache" / "veloxy"))
API_ADDR = "192.0.2.1"
PROXY_ADDR = "192.0.2.2"
PROXY_PORT = 8080
BASE_ADDRS = [f"192.0.2.{10 + k}" for k in range(5)]
SPARE_ADDRS = [f"192.0.2.{15 + k}" for k in range(5)]
PORT_A = 20000
PORT_B = 21000
NS = "bench"
# EndpointSlices veloxy does not watch (its `namespaces` is [NS]): the unwatched control's.
OTHER_NS = "bench-other"
DOMAIN = "bench.test"
PROXY_CPU = "0"
OTHER_CPU = "1"
# The load generator and the backends run on the other core at SCHED_FIFO (both sleep in
# epoll, neither spins): a wake-up of either preempts the API server, etcd and the churn's
# clients at once, work a cluster does on other machines. At nice 19 alone they still delayed
# the pacer's reads: the unwatched control (the same churn on slices veloxy does not watch)
# showed p99 1.35-1.79x steady with veloxy receiving nothing. veloxy keeps SCHED_OTHER.
LOAD_PREFIX = ["taskset", "-c", OTHER_CPU, "chrt", "-f", "10"]
GOAL_P99_RATIO = 1.20
GOAL_PROPAGATION_S = 1.0
GOAL_START_S = 1.0
GOAL_RSS_MB = 100.0


def say(msg: str) -> None:
    print(f"[kube-load] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def enter_netns() -> None:
    """Re-runs this script in a new network namespace (root), with TEST-NET addresses on lo."""
    if os.environ.get("VELOXY_KUBE_LOAD_NETNS") == "1":
        run(["ip", "link", "set", "lo", "up"])
        for a in [API_ADDR, PROXY_ADDR, *BASE_ADDRS, *SPARE_ADDRS]:
            run(["ip", "addr", "add", f"{a}/32", "dev", "lo"])
        return
    env = dict(os.environ, VELOXY_KUBE_LOAD_NETNS="1")
    os.execvpe("unshare", ["unshare", "-n", sys.executable, *sys.argv], env)


class Api:
    """A keep-alive HTTPS client of the API server (one per thread)."""

    def __init__(self, env: dict):
        url = env["APISERVER_URL"].removeprefix("https://")
        self.host, port = url.rsplit(":", 1)
        self.port = int(port)
        self.token = env["TOKEN"]
        self.ctx = ssl.create_default_context(cafile=env["CA_FILE"])
        self.conn: http.client.HTTPSConnection | None = None

    def call(self, method: str, path: str, body=None,
             ctype: str = "application/json") -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx,
                                                        timeout=10)
            try:
                self.conn.request(method, path, body=data, headers={
                    "Authorization": "Bearer " + self.token, "Content-Type": ctype})
                r = self.conn.getresponse()
                raw = r.read()
                try:
                    return r.status, json.loads(raw) if raw else {}
                except ValueError:
                    return r.status, {"message": raw.decode(errors="replace")}
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")


def slice_body(i: int, addrs: list[str], port: int, ns: str = NS) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"s{i}-a", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": f"s{i}"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addrs],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }


def create_objects(env: dict, n: int, endpoints: int) -> float:
    """The namespace, the IngressClass, and n Services, EndpointSlices and Ingresses (4
    threads). Returns the seconds it took."""
    t0 = time.monotonic()
    api = Api(env)
    code, _ = api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert code in (201, 409), code
    code, body = api.call("POST", "/apis/networking.k8s.io/v1/ingressclasses", {
        "metadata": {"name": "veloxy"}, "spec": {"controller": "veloxy.dev/ingress-controller"}})
    assert code in (201, 409), (code, body)
    errors: list[str] = []

    def make(lo: int, hi: int) -> None:
        c = Api(env)
        for i in range(lo, hi):
            for path, body in (
                (f"/api/v1/namespaces/{NS}/services", {
                    "metadata": {"name": f"s{i}"},
                    "spec": {"ports": [{"name": "http", "port": 80,
                                        "targetPort": PORT_A + i}]}}),
                (f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices",
                 slice_body(i, BASE_ADDRS[:endpoints], PORT_A + i)),
                (f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses", {
                    "metadata": {"name": f"s{i}"},
                    "spec": {"ingressClassName": "veloxy", "rules": [{
                        "host": f"s{i}.{DOMAIN}",
                        "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {
                            "service": {"name": f"s{i}", "port": {"name": "http"}}}}]}}]}}),
            ):
                code, resp = c.call("POST", path, body)
                if code not in (201, 409):
                    errors.append(f"{path} s{i}: {code} {resp.get('message', '')}")

    in_four_threads(make, n)
    if errors:
        raise SystemExit(f"creating objects failed: {errors[:5]}")
    return time.monotonic() - t0


def in_four_threads(make, n: int) -> None:
    """Runs make(lo, hi) over 0..n split into 4 ranges, one thread each, and waits for them."""
    step = (n + 3) // 4
    threads = [threading.Thread(target=make, args=(k, min(n, k + step)))
               for k in range(0, n, step)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def create_other_slices(env: dict, n: int, endpoints: int) -> None:
    """The same n EndpointSlices in OTHER_NS, which veloxy does not watch: the unwatched
    control churns them, so the API server, etcd and the churn's clients do the same work on
    the other core while veloxy receives nothing."""
    api = Api(env)
    code, _ = api.call("POST", "/api/v1/namespaces", {"metadata": {"name": OTHER_NS}})
    assert code in (201, 409), code
    errors: list[str] = []

    def make(lo: int, hi: int) -> None:
        c = Api(env)
        for i in range(lo, hi):
            code, resp = c.call("POST", f"/apis/discovery.k8s.io/v1/namespaces/{OTHER_NS}/endpointslices",
                                slice_body(i, BASE_ADDRS[:endpoints], PORT_A + i, OTHER_NS))
            if code not in (201, 409):
                errors.append(f"{OTHER_NS} slice s{i}: {code} {resp.get('message', '')}")

    in_four_threads(make, n)
    if errors:
        raise SystemExit(f"creating the unwatched slices failed: {errors[:5]}")


def nginx_backends(work: Path, n: int) -> subprocess.Popen:
    listens = "\n".join(f"    listen 0.0.0.0:{p} reuseport backlog=512;"
                        for i in range(n) for p in (PORT_A + i, PORT_B + i))
    conf = work / "nginx-backends.conf"
    conf.write_text(f"""worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
worker_rlimit_nofile 16384;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  server {{
{listens}
    location / {{ return 200 "$server_port\\n"; }}
  }}
}}
""")
    proc = subprocess.Popen([*LOAD_PREFIX, "nginx", "-c", str(conf), "-p", str(work)],
                            stdout=subprocess.DEVNULL, stderr=open(work / "nginx.out", "w"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"nginx exited: {(work / 'nginx.out').read_text()[-500:]}")
        try:
            socket.create_connection((BASE_ADDRS[0], PORT_B + n - 1), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nginx backends did not listen within 20 s")


def get(host: str, timeout: float = 2.0) -> tuple[int, str]:
    c = http.client.HTTPConnection(PROXY_ADDR, PROXY_PORT, timeout=timeout)
    try:
        c.request("GET", "/", headers={"Host": host})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace").strip()
    finally:
        c.close()


def status_of(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024  # MiB
    return out


APPLIED = re.compile(r"kubernetes: config applied.*?took_ms=\"?([0-9.]+)")
IN_PLACE = re.compile(r"kubernetes: servers changed in place.*?took_ms=\"?([0-9.]+)\"? apply_ms=\"?([0-9.]+)")
IN_PLACE_CPU = re.compile(r"kubernetes: servers changed in place.*?apply_cpu_ms=\"?([0-9.]+)")
# An EndpointSlice-only change applied without translating the objects again.
UNTRANSLATED = re.compile(r"kubernetes: servers changed in place.*translated=false")


def applied(log: Path) -> list[float]:
    return [float(m.group(1)) for m in APPLIED.finditer(log.read_text(errors="replace"))]


def in_place(log: Path) -> list[tuple[float, float]]:
    """(took_ms, apply_ms) of each in-place server change: the translation and the swap."""
    text = log.read_text(errors="replace")
    return [(float(m.group(1)), float(m.group(2))) for m in IN_PLACE.finditer(text)]


def in_place_cpu(log: Path) -> list[float]:
    """The swap's CPU time (the provider thread's, without the time workers preempted it) of
    each in-place change, where veloxy logs it."""
    text = log.read_text(errors="replace")
    return [float(m.group(1)) for m in IN_PLACE_CPU.finditer(text)]


def start_veloxy(veloxy: str, work: Path, env: dict, n: int) -> tuple[subprocess.Popen, float, Path]:
    conf = work / "veloxy.toml"
    conf.write_text(f"""[server]
workers = 1
log_level = "info"

[listeners.web]
addr = "{PROXY_ADDR}:{PROXY_PORT}"

[providers.kubernetes]
kubeconfig = "{env['KUBECONFIG']}"
namespaces = ["{NS}"]
ingress_class = "veloxy"
http_listener = "web"
""")
    log = work / "veloxy.log"
    t0 = time.monotonic()
    proc = subprocess.Popen(["taskset", "-c", PROXY_CPU, veloxy, "run", "--config", str(conf)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    sample = [0, n - 1, *random.Random(7).sample(range(n), min(n, 48))]
    pending = set(sample)
    deadline = t0 + 120
    while pending and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"veloxy exited: {log.read_text()[-1500:]}")
        for i in sorted(pending):
            try:
                code, body = get(f"s{i}.{DOMAIN}", timeout=1)
            except OSError:
                break
            if code == 200 and body == str(PORT_A + i):
                pending.discard(i)
            else:
                break
        if pending:
            time.sleep(0.01)
    if pending:
        raise SystemExit(f"veloxy did not serve {len(pending)} sampled hosts within 120 s: "
                         f"{log.read_text()[-1500:]}")
    return proc, time.monotonic() - t0, log


def pacer(binary: str, hosts: Path, rate: int, seconds: float, connections: int) -> dict:
    cmd = [*LOAD_PREFIX, binary, f"http://{PROXY_ADDR}:{PROXY_PORT}/",
           "-c", str(connections), "-r", str(rate), "-d", f"{seconds:g}", "-w", "1", "-t", "2",
           "-H", str(hosts)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if r.returncode != 0:
        raise SystemExit(f"pacer exited {r.returncode}: {r.stderr[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


class Churn:
    """EndpointSlice changes at a fixed rate from 4 threads; and the probe's port flips."""

    def __init__(self, env: dict, n: int, endpoints: int, rate: float, seconds: float,
                 ns: str = NS):
        self.env, self.n, self.endpoints, self.ns = env, n, endpoints, ns
        self.rate, self.seconds = rate, seconds
        self.made = 0
        self.refused: list[str] = []
        self.lateness: list[float] = []
        self.propagation: list[float | None] = []
        self.lock = threading.Lock()
        self.probe = n // 2
        # What each slice holds now (the churn thread of a slice is the only writer).
        self.addrs = {i: list(BASE_ADDRS[:endpoints]) for i in range(n)}
        self.ports = {i: PORT_A + i for i in range(n)}

    def change(self, api: Api, i: int, rng: random.Random) -> None:
        addrs = self.addrs[i]
        k = rng.randrange(len(addrs))
        free = [a for a in BASE_ADDRS + SPARE_ADDRS if a not in addrs]
        addrs[k] = rng.choice(free)
        code, resp = api.call("PUT", f"/apis/discovery.k8s.io/v1/namespaces/{self.ns}/endpointslices/s{i}-a",
                              slice_body(i, addrs, self.ports[i], self.ns))
        with self.lock:
            if code == 200:
                self.made += 1
            else:
                self.refused.append(f"{code} {resp.get('message', '')[:120]}")

    def worker(self, k: int, threads: int, windows: list[tuple[float, float]]) -> None:
        """Thread k of `threads`: its share of the rate in each (start, seconds) window, on a
        fixed schedule (lateness kept), one API connection for them all."""
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        api = Api(self.env)
        rng = random.Random(k)
        mine = [i for i in range(self.n) if i % threads == k and i != self.probe]
        per = self.rate / threads
        made = 0
        for start, seconds in windows:
            j = 0
            while True:
                due = start + j / per
                if due - start >= seconds:
                    break
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                else:
                    with self.lock:
                        self.lateness.append(now - due)
                self.change(api, mine[made % len(mine)], rng)
                j += 1
                made += 1

    def flip_probe(self, api: Api) -> float | None:
        i = self.probe
        new = PORT_B + i if self.ports[i] == PORT_A + i else PORT_A + i
        self.ports[i] = new
        code, _ = api.call("PUT", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/s{i}-a",
                           slice_body(i, self.addrs[i], new))
        t0 = time.monotonic()
        if code != 200:
            with self.lock:
                self.refused.append(f"probe flip: {code}")
            return None
        deadline = t0 + 10
        while time.monotonic() < deadline:
            try:
                status, body = get(f"s{i}.{DOMAIN}", timeout=1)
                if status == 200 and body == str(new):
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.01)
        return None

    def run(self, threads: int = 4, probe: bool = True) -> None:
        start = time.monotonic() + 0.2
        ts = [threading.Thread(target=self.worker, args=(k, threads, [(start, self.seconds)]))
              for k in range(threads)]
        for t in ts:
            t.start()
        api = Api(self.env)
        next_flip = start + 2.5
        while probe and time.monotonic() < start + self.seconds - 1:
            now = time.monotonic()
            if now < next_flip:
                time.sleep(min(0.1, next_flip - now))
                continue
            self.propagation.append(self.flip_probe(api))
            next_flip += 5
        for t in ts:
            t.join()

    def run_windows(self, windows: list[tuple[float, float]], threads: int = 4) -> None:
        """The churn in each (start, seconds) window only (no probe flips), until the last."""
        ts = [threading.Thread(target=self.worker, args=(k, threads, windows))
              for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()


PHASES = ("steady", "churn", "unwatched")


def interleaved(a, hosts: Path, churn: Churn, other: Churn) -> dict:
    """One pacer run cut into windows of `--window-seconds` that take the phases of PHASES in
    turn: no change, the churn of the watched slices, the churn of the unwatched ones (the
    pacer's `-P/-W/-G`: a latency histogram per phase, the first `--guard-seconds` of each
    window left out, and each window's p99). The phases are thus interleaved seconds apart
    over the whole run, and the VM's drift, which moved whole 20 s rounds' steady p99 between
    1.2 and 3.1 ms, falls on all three alike. The pacer's result, with "phases"."""
    w = a.window_seconds
    cycle = w * len(PHASES)
    seconds = max(1, round(a.interleaved_seconds / cycle)) * cycle
    cmd = [*LOAD_PREFIX, a.pacer, f"http://{PROXY_ADDR}:{PROXY_PORT}/",
           "-c", str(a.connections), "-r", str(a.rate), "-d", f"{seconds:g}", "-w", "1",
           "-t", "2", "-H", str(hosts), "-P", str(len(PHASES)), "-W", f"{w:g}",
           "-G", f"{a.guard_seconds:g}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # written at once after connecting, or pacer's error
    m = re.match(r"measure_from_monotonic ([0-9.]+)", first)
    if not m:
        proc.kill()
        raise SystemExit(f"pacer: {first.strip()} {proc.stderr.read()[-400:]}")
    t0 = float(m.group(1))
    windows = int(round(seconds / w))
    plan = {k: [(t0 + i * w, w) for i in range(windows) if i % len(PHASES) == k]
            for k in range(len(PHASES))}
    ts = [threading.Thread(target=ch.run_windows, args=(plan[k],))
          for k, ch in ((1, churn), (2, other))]
    for t in ts:
        t.start()
    try:
        out, err = proc.communicate(timeout=seconds + 60)
    finally:
        for t in ts:
            t.join()
    if proc.returncode != 0:
        raise SystemExit(f"pacer exited {proc.returncode}: {err[-500:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["seconds"] = seconds
    return res


def interleaved_lines(res: dict) -> list[str]:
    """The report's lines for the interleaved run (none without one)."""
    run = res.get("interleaved")
    if not run:
        return []
    ph = run["phases"]
    per = dict(zip(PHASES, ph["per_phase"], strict=True))
    p99 = {k: (v.get("latency_ms") or {}).get("p99") for k, v in per.items()}
    wp = ph["window_p99_ms"]
    k = len(PHASES)
    cycles = [wp[i:i + k] for i in range(0, len(wp) - k + 1, k)]
    by_cycle = {name: [c[j] / c[0] for c in cycles if c[0] and c[j]]
                for j, name in ((1, "churn"), (2, "unwatched"))}
    vs_unwatched = [c[1] / c[2] for c in cycles if c[1] and c[2]]

    def ratio(x, y):
        return x / y if x and y else None

    def row(name: str) -> str:
        lat = per[name].get("latency_ms") or {}
        return (f"| {name} | {fmt(lat.get('p50'))} / {fmt(lat.get('p99'))} / "
                f"{fmt(lat.get('p99.9'))} / {fmt(lat.get('max'))} | {per[name]['answered']} | "
                f"{per[name]['failed'] + per[name]['non2xx']} |")

    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return [
        "",
        f"Interleaved ({run['seconds']:g} s, one pacer run): windows of {fmt(ph['window_s'], 1)} s "
        f"take the phases steady, churn (100 changes a second on the watched slices), unwatched "
        f"churn in turn, {len(cycles)} cycles; each window's first {fmt(ph['guard_s'], 1)} s is "
        "left out of its phase. The phases share the run's minutes, so the VM's drift falls on "
        "them alike.",
        "",
        "| phase | p50 / p99 / p99.9 / max, ms | answered | failed |",
        "|---|---|---|---|",
        row("steady"), row("churn"), row("unwatched"),
        "",
        "| measure (interleaved) | pooled | median of the cycles | goal |",
        "|---|---|---|---|",
        f"| p99 churn / steady | {fmt(ratio(p99['churn'], p99['steady']))} | "
        f"{fmt(med(by_cycle['churn']))} | <= {GOAL_P99_RATIO:.2f} |",
        f"| p99 unwatched churn / steady (the API server's share, on the load core) | "
        f"{fmt(ratio(p99['unwatched'], p99['steady']))} | {fmt(med(by_cycle['unwatched']))} | - |",
        f"| p99 churn / unwatched churn (veloxy's own share) | "
        f"{fmt(ratio(p99['churn'], p99['unwatched']))} | {fmt(med(vs_unwatched))} | - |",
        "",
        "Window p99, ms (steady, churn, unwatched per cycle): "
        + "; ".join(", ".join(fmt(x) for x in c) for c in cycles) + ".",
    ]


def alternated_round(a, hosts: Path, churn: Churn, other: Churn) -> dict:
    """One round of the same load steady, under churn of the watched slices, and under churn
    of the unwatched ones, back to back: a few minutes of the VM's drift (the steady p99 of
    whole runs ranged 0.46 to 1.05 ms) then falls on all three alike."""
    out: dict = {}
    for kind, ch in (("steady", None), ("churn", churn), ("unwatched", other)):
        if ch is not None:
            ch.seconds = a.round_seconds - 1
        p = loaded(a, hosts, a.round_seconds, ch)
        out[kind] = latency(p)
        out[f"failed_{kind}"] = failed(p)
    return out


def loaded(a, hosts: Path, seconds: float, churn: Churn | None, probe: bool = False) -> dict:
    """The pacer's load for `seconds`; with `churn`, that churn runs from the end of the
    pacer's one-second warmup (so it starts with the measured window). The pacer's result."""
    res: dict = {}
    t = threading.Thread(target=lambda: res.update(
        p=pacer(a.pacer, hosts, a.rate, seconds, a.connections)))
    t.start()
    if churn is not None:
        time.sleep(1)
        churn.run(probe=probe)
    t.join()
    return res["p"]


def rounds_lines(rounds: list[dict]) -> list[str]:
    """The report's lines for the alternated rounds (none without them)."""
    if not rounds:
        return []
    p99 = {k: [r[k]["p99"] for r in rounds] for k in ("steady", "churn", "unwatched")}
    vs_steady = [c / s for c, s in zip(p99["churn"], p99["steady"], strict=True) if c and s]
    vs_unwatched = [c / u for c, u in zip(p99["churn"], p99["unwatched"], strict=True) if c and u]
    failed_n = sum(r[f"failed_{k}"] for r in rounds for k in ("steady", "churn", "unwatched"))
    ms = lambda xs: ", ".join(fmt(x) for x in xs)  # noqa: E731
    return [
        "",
        f"Alternated rounds ({len(rounds)}: steady, churn, unwatched churn, back to back), p99 "
        f"per round, ms: steady {ms(p99['steady'])}; churn {ms(p99['churn'])}; unwatched "
        f"{ms(p99['unwatched'])}.",
        "",
        "| measure (alternated rounds) | median | per round | goal |",
        "|---|---|---|---|",
        f"| p99 churn / steady | {fmt(statistics.median(vs_steady) if vs_steady else None)} | "
        f"{ms(vs_steady)} | <= {GOAL_P99_RATIO:.2f} |",
        f"| p99 churn / unwatched churn (veloxy's own share) | "
        f"{fmt(statistics.median(vs_unwatched) if vs_unwatched else None)} | {ms(vs_unwatched)} | "
        f"<= {GOAL_P99_RATIO:.2f} |",
        f"| failed requests in the rounds | {failed_n} | - | 0 |",
    ]


def latency(p: dict) -> dict:
    lat = p.get("latency_ms") or {}
    return {"p50": lat.get("p50"), "p99": lat.get("p99"), "max": lat.get("max"),
            "requests": p.get("requests"), "ok": p.get("ok"), "non2xx": p.get("non2xx"),
            "errors": p.get("errors"), "rps": p.get("rps"), "cpu_busy": p.get("cpu_busy")}


def failed(p: dict) -> int:
    errs = p.get("errors")
    n = sum(errs.values()) if isinstance(errs, dict) else int(errs or 0)
    return n + int(p.get("non2xx") or 0)


def fmt(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def report(res: dict) -> str:
    a = res["args"]
    s, st, ch = res["start"], res["steady"], res["churn"]
    prop = [x for x in res["propagation_s"] if x is not None]
    ratio = (ch["p99"] / st["p99"]) if st.get("p99") and ch.get("p99") else None
    co = res.get("control") or {}
    co_ratio = (co["p99"] / st["p99"]) if st.get("p99") and co.get("p99") else None
    un = res.get("unwatched") or {}
    un_ratio = (un["p99"] / st["p99"]) if st.get("p99") and un.get("p99") else None
    ch_un = (ch["p99"] / un["p99"]) if ch.get("p99") and un.get("p99") else None
    rb = res["rebuilds_during_churn_ms"]
    ip = res["in_place_ms"]
    # With alternated rounds, the changes and in-place updates count theirs too.
    n_rounds = len(res.get("rounds") or [])
    churn_s = a["churn_seconds"] + n_rounds * (a.get("round_seconds", 20) - 1)
    across = f" (the churn phase and {n_rounds} rounds' churn)" if n_rounds else ""
    if a.get("interleaved_seconds"):
        churn_s += a["interleaved_seconds"] / len(PHASES)
        across = (f" (the churn phase, {n_rounds} rounds' churn and the interleaved churn "
                  "windows)")

    def med(xs: list) -> float | None:
        return statistics.median(xs) if xs else None

    def mx(xs: list) -> float | None:
        return max(xs) if xs else None

    lines = [
        "# veloxy as a Kubernetes Ingress controller under load",
        "",
        f"{a['services']} Ingresses, {a['services']} Services with {a['endpoints']} endpoints each "
        f"(EndpointSlices), on a real kube-apiserver + etcd in a network namespace; veloxy "
        f"`workers = 1` on core {PROXY_CPU}, everything else on core {OTHER_CPU}. Load: bench/pacer "
        f"at {a['rate']} req/s over all {a['services']} hosts in turn, {a['connections']} "
        f"keep-alive connections, latency from when each request was due. The pacer and the "
        f"nginx backends run at SCHED_FIFO, the API server, etcd and the churn at nice 19.",
        "",
        "| measure | value | goal |",
        "|---|---|---|",
        f"| objects created (API) | {fmt(res['create_s'], 1)} s | - |",
        f"| veloxy start to every sampled host served | {fmt(s['serving_s'])} s | - |",
        f"| first config build (veloxy's `took_ms`) | {fmt(s['first_build_ms'], 1)} ms | "
        f"< {GOAL_START_S * 1000:.0f} ms |",
        f"| resident memory once serving (VmRSS / peak VmHWM) | {fmt(s['rss_mb'], 1)} / "
        f"{fmt(s['hwm_mb'], 1)} MiB | < {GOAL_RSS_MB:.0f} MiB |",
        f"| steady: p50 / p99 / max | {fmt(st['p50'])} / {fmt(st['p99'])} / {fmt(st['max'])} ms | - |",
        f"| churn: p50 / p99 / max | {fmt(ch['p50'])} / {fmt(ch['p99'])} / {fmt(ch['max'])} ms | - |",
        f"| p99 churn / steady | {fmt(ratio)} | <= {GOAL_P99_RATIO:.2f} |",
        f"| control (other core busy at nice 19, no change): p50 / p99 / max; p99 / steady | "
        f"{fmt(co.get('p50'))} / {fmt(co.get('p99'))} / {fmt(co.get('max'))} ms; "
        f"{fmt(co_ratio)} | - |",
        f"| unwatched control (the same API churn on EndpointSlices veloxy does not watch): "
        f"p50 / p99 / max; p99 / steady | {fmt(un.get('p50'))} / {fmt(un.get('p99'))} / "
        f"{fmt(un.get('max'))} ms; {fmt(un_ratio)} | - |",
        f"| p99 churn / unwatched control (veloxy's own share of the churn) | {fmt(ch_un)} | "
        f"<= {GOAL_P99_RATIO:.2f} |",
        f"| failed requests steady / churn | {res['failed_steady']} / {res['failed_churn']} of "
        f"{st['requests']} / {ch['requests']} | 0 |",
        f"| EndpointSlice changes made / refused{across} | {res['changes_made']} / "
        f"{len(res['refused'])} ({res['changes_made'] / churn_s:.0f} a second) | "
        f"{a['churn_rate']} a second |",
        f"| veloxy rebuilds during the churn; took_ms median / max | {len(rb)}; "
        f"{fmt(statistics.median(rb) if rb else None, 1)} / {fmt(max(rb) if rb else None, 1)} | - |",
        f"| in-place server changes{across} (without a translation); took_ms (translation if any + swap) "
        f"median / max; apply_ms (the swap) median / max | {len(ip)} "
        f"({res.get('in_place_untranslated', '?')}); "
        f"{fmt(med([t for t, _ in ip]), 1)} / {fmt(mx([t for t, _ in ip]), 1)}; "
        f"{fmt(med([a for _, a in ip]), 2)} / {fmt(mx([a for _, a in ip]), 2)} | swap < 10 ms |",
        f"| the swap's CPU time (the provider thread's own, without the time the worker "
        f"preempted it): median / max | {fmt(med(res.get('in_place_cpu_ms') or []), 2)} / "
        f"{fmt(mx(res.get('in_place_cpu_ms') or []), 2)} ms | - |",
        f"| endpoint change to traffic moved (probe flips): median / max | "
        f"{fmt(statistics.median(prop) if prop else None)} / {fmt(max(prop) if prop else None)} s "
        f"({len(prop)} of {len(res['propagation_s'])} seen) | < {GOAL_PROPAGATION_S:.0f} s |",
        f"| churn schedule lateness p99 | {fmt(res['churn_lateness_p99_ms'], 1)} ms | - |",
        "",
        f"veloxy: `{res['veloxy']}`; pacer's CPU busy: steady {fmt(st.get('cpu_busy'))}, "
        f"churn {fmt(ch.get('cpu_busy'))}.",
        *rounds_lines(res.get("rounds") or []),
        *interleaved_lines(res),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    # This script's own threads (the churn's API clients, the probes) run on the other core
    # too: unpinned, the scheduler put them on the proxy's core, where they competed with
    # veloxy's worker during the churn (a third of the p99 rise, seen with perf sched).
    os.sched_setaffinity(0, {int(OTHER_CPU)})
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--endpoints", type=int, default=5)
    p.add_argument("--rate", type=int, default=3000, help="requests/s of the load")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--churn-rate", type=float, default=100, help="EndpointSlice changes/s")
    p.add_argument("--churn-seconds", type=float, default=60)
    p.add_argument("--rounds", type=int, default=0,
                   help="then this many alternated rounds of steady, churn and unwatched churn "
                        "(the median of their ratios is robust to the VM's drift)")
    p.add_argument("--round-seconds", type=float, default=20)
    p.add_argument("--interleaved-seconds", type=float, default=270,
                   help="then one load run of this many seconds whose windows take steady, "
                        "churn and unwatched churn in turn (see interleaved())")
    p.add_argument("--window-seconds", type=float, default=5)
    p.add_argument("--guard-seconds", type=float, default=0.5,
                   help="the start of each interleaved window left out of its phase")
    p.add_argument("--veloxy", default=os.environ.get("VELOXY_BIN", str(REPO / "target/release/veloxy")))
    p.add_argument("--pacer", default=str(HERE / ".cache" / "bin" / "pacer"))
    a = p.parse_args()
    if a.services > 1000 or not 1 <= a.endpoints <= 5:
        p.error("--services at most 1000 (ports 20000-20999), --endpoints 1 to 5")
    if os.geteuid() != 0:
        print("kube-load: needs root (unshare -n)", file=sys.stderr)
        return 2
    for what, path in (("kube-apiserver", CACHE / "bin" / "kube-apiserver"),
                       ("etcd", CACHE / "bin" / "etcd"), ("veloxy", Path(a.veloxy)),
                       ("pacer", Path(a.pacer))):
        if not path.exists():
            print(f"kube-load: no {what} at {path} (kube: bash .ci/kube.sh; pacer: bench/run "
                  f"--sweep builds it)", file=sys.stderr)
            return 2
    if not shutil.which("nginx"):
        print("kube-load: nginx not found", file=sys.stderr)
        return 2
    enter_netns()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    procs: list[subprocess.Popen] = []
    kube = work / "kube"
    try:
        say("starting etcd and kube-apiserver")
        # The API server and etcd at the lowest priority on the load core: in a cluster they
        # run elsewhere; here they must not starve the load generator and the backends.
        run(["taskset", "-c", OTHER_CPU, "nice", "-n", "19", "bash", str(REPO / "dev/kube/start.sh"),
             str(kube)],
            env=dict(os.environ, VELOXY_KUBE_ADDRESS=API_ADDR))
        env = dict(line.rstrip("\n").split("=", 1) for line in open(kube / "env") if "=" in line)
        procs.append(nginx_backends(work, a.services))
        say(f"creating {a.services} Services, EndpointSlices and Ingresses")
        create_s = create_objects(env, a.services, a.endpoints)
        create_other_slices(env, a.services, a.endpoints)
        say(f"created in {create_s:.1f} s; starting veloxy")
        vproc, serving_s, log = start_veloxy(a.veloxy, work, env, a.services)
        procs.append(vproc)
        builds = applied(log)
        mem = status_of(vproc.pid)
        say(f"serving after {serving_s:.2f} s (builds {builds}); RSS {mem}")
        hosts = work / "hosts.txt"
        order = list(range(a.services))
        random.Random(3).shuffle(order)
        hosts.write_text("".join(f"s{i}.{DOMAIN}\n" for i in order))
        seconds = a.churn_seconds
        say(f"steady load: {a.rate} req/s for {seconds:g} s")
        steady = pacer(a.pacer, hosts, a.rate, seconds, a.connections)
        before = len(applied(log))
        churn = Churn(env, a.services, a.endpoints, a.churn_rate, seconds)
        say(f"churn: {a.churn_rate:g} EndpointSlice changes a second for {seconds:g} s under the same load")
        churned = loaded(a, hosts, seconds, churn, probe=True)
        rebuilds = applied(log)[before:]
        # Control: the same load while the other core is kept busy at nice 19 with no API
        # change (a busy loop standing in for the API server's and etcd's churn work): how
        # much of the churn's p99 is the other core being busy, on this VM, not veloxy.
        say(f"control: the same load for {seconds:g} s, the other core busy at nice 19, no change")
        burner = subprocess.Popen(["taskset", "-c", OTHER_CPU, "nice", "-n", "19",
                                   sys.executable, "-c", "while True: pass"])
        try:
            control = pacer(a.pacer, hosts, a.rate, seconds, a.connections)
        finally:
            burner.kill()
            burner.wait()
        # Unwatched control: the churn's API work (the API server, etcd, the clients, all on
        # the other core with the load generator and the backends) on slices veloxy does not
        # watch. Churn against this is what veloxy's handling of the changes costs; churn
        # against steady also counts the load core's API work, which a cluster does elsewhere.
        say("unwatched control: the same load and churn on slices veloxy does not watch")
        other = Churn(env, a.services, a.endpoints, a.churn_rate, seconds, OTHER_NS)
        unwatched = loaded(a, hosts, seconds, other)
        rounds = []
        for r in range(a.rounds):
            say(f"round {r + 1} of {a.rounds}: steady, churn, unwatched churn, "
                f"{a.round_seconds:g} s each")
            rounds.append(alternated_round(a, hosts, churn, other))
        inter = None
        if a.interleaved_seconds > 0:
            say(f"interleaved: {a.interleaved_seconds:g} s of {a.window_seconds:g} s windows "
                "taking steady, churn and unwatched churn in turn")
            inter = interleaved(a, hosts, churn, other)
        placed = in_place(log)
        untranslated = len(UNTRANSLATED.findall(log.read_text(errors="replace")))
        late = sorted(churn.lateness)
        res = {
            "args": {"services": a.services, "endpoints": a.endpoints, "rate": a.rate,
                     "connections": a.connections, "churn_rate": a.churn_rate,
                     "churn_seconds": seconds, "rounds": a.rounds,
                     "round_seconds": a.round_seconds,
                     "interleaved_seconds": inter and inter["seconds"],
                     "window_seconds": a.window_seconds, "guard_seconds": a.guard_seconds},
            "veloxy": a.veloxy,
            "create_s": create_s,
            "start": {"serving_s": serving_s, "first_build_ms": builds[0] if builds else None,
                      "builds_ms": builds, "rss_mb": mem.get("VmRSS"), "hwm_mb": mem.get("VmHWM"),
                      "after_churn": status_of(vproc.pid)},
            "steady": latency(steady),
            "churn": latency(churned),
            "control": latency(control),
            "unwatched": latency(unwatched),
            "unwatched_changes_made": other.made,
            "failed_unwatched": failed(unwatched),
            "failed_steady": failed(steady),
            "failed_churn": failed(churned),
            "changes_made": churn.made,
            "refused": churn.refused[:20],
            "churn_lateness_p99_ms": (late[int(0.99 * (len(late) - 1))] * 1e3) if late else 0.0,
            "propagation_s": churn.propagation,
            "rebuilds_during_churn_ms": rebuilds,
            "in_place_ms": placed,
            "in_place_cpu_ms": in_place_cpu(log),
            "in_place_untranslated": untranslated,
            "rounds": rounds,
            "interleaved": inter and {k: inter.get(k) for k in
                                      ("seconds", "phases", "requests", "errors", "cpu_busy")},
        }
        (out / "results.json").write_text(json.dumps(res, indent=2))
        text = report(res)
        (out / "report.md").write_text(text)
        print(text)
        return 0
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if kube.exists():
            subprocess.run(["bash", str(REPO / "dev/kube/stop.sh"), str(kube)],
                           capture_output=True, timeout=60)


if __name__ == "__main__":
    sys.exit(main())
