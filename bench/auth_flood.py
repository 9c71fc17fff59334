#!/usr/bin/env python3
"""A wrong-password flood against basic_auth, and what it does to another route (issue 31, 3).

veloxy (one worker, pinned to one core with taskset when there are two) serves two routes: an
`/admin/` route behind basic_auth whose users file has one bcrypt user at cost 12 (what
htpasswd -B -C 12 makes, about a quarter of a second a check), and an open route answered by
veloxy itself. First the open route's latency is measured alone (sequential GETs on one
keep-alive connection); then again while a flood sends wrong passwords to `/admin/` from many
source addresses (127.0.0.2 and up: each address stays under the per-address limit of 20
checks a minute, as a distributed attacker's would). The flood's rate is fixed (default 10 a
second). Prints p50/p99 of the open route without and with the flood, their ratio (the goal:
p99 within 2x), and how the flood's own requests were answered (401, 429, 503).

    bench/auth_flood.py [--rate 10] [--seconds 10] [--cost 12] [--out result.json]

Needs target/release/veloxy (cargo build --release) and htpasswd (apache2-utils).
Loopback only; every loop is bounded in count and time.
"""

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VELOXY = os.path.join(ROOT, "target", "release", "veloxy")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit=10.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def read_response(sock):
    """Reads one response with a Content-Length body; returns its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return int(head.split(b" ")[1])


def measure(port, seconds, stop_at):
    """Sequential GETs of the open route for `seconds`; latencies in ms."""
    lat = []
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    end = min(time.time() + seconds, stop_at)
    while time.time() < end and len(lat) < 200_000:
        t0 = time.perf_counter()
        sock.sendall(b"GET /open HTTP/1.1\r\nHost: a\r\n\r\n")
        read_response(sock)
        lat.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.002)
    sock.close()
    return lat


def flood(port, rate, seconds, outcomes, stop):
    """Wrong passwords at `rate` a second from rotating source addresses."""
    auth = base64.b64encode(b"alice:wrong").decode()
    req = (
        "GET /admin/ HTTP/1.1\r\nHost: a\r\n"
        f"Authorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    ).encode()
    start = time.time()
    n = 0
    threads = []

    def one(src):
        try:
            s = socket.socket()
            s.settimeout(30)
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(req)
            status = read_response(s)
            s.close()
        except OSError:
            status = 0
        outcomes.append(status)

    while not stop.is_set() and time.time() - start < seconds and n < rate * seconds:
        due = start + n / rate
        time.sleep(max(0.0, due - time.time()))
        src = f"127.0.{2 + n // 250}.{2 + n % 250}"
        t = threading.Thread(target=one, args=(src,), daemon=True)
        t.start()
        threads.append(t)
        n += 1
    for t in threads:
        t.join(timeout=35)


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--cost", default="12")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not os.path.exists(VELOXY):
        sys.exit("build first: cargo build --release")
    if not shutil.which("htpasswd"):
        sys.exit("needs htpasswd (apt-get install apache2-utils)")
    with tempfile.TemporaryDirectory() as d:
        users = os.path.join(d, "htpasswd")
        subprocess.run(["htpasswd", "-b", "-c", "-B", "-C", args.cost, users, "alice", "right"],
                       check=True, capture_output=True)
        port = free_port()
        conf = os.path.join(d, "veloxy.toml")
        with open(conf, "w") as f:
            f.write(f'[server]\nworkers = 1\n[listeners.web]\naddr = "127.0.0.1:{port}"\n'
                    f'[[routes]]\npath = "/admin/"\nrespond = {{ body = "admin" }}\n'
                    f'basic_auth = {{ realm = "r", users_file = "{users}" }}\n'
                    f'[[routes]]\nrespond = {{ body = "open" }}\n')
        cmd = [VELOXY, "run", "--config", conf]
        if (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
            cmd = ["taskset", "-c", "1"] + cmd
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            wait_port(port)
            hard_stop = time.time() + 10 * args.seconds + 60
            base = measure(port, args.seconds, hard_stop)
            outcomes, stop = [], threading.Event()
            t = threading.Thread(target=flood, args=(port, args.rate, args.seconds, outcomes, stop))
            t.start()
            time.sleep(0.5)
            under = measure(port, args.seconds - 1.0, hard_stop)
            stop.set()
            t.join(timeout=60)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    result = {
        "rate": args.rate,
        "cost": int(args.cost),
        "alone": {"n": len(base), "p50_ms": pct(base, 0.5), "p99_ms": pct(base, 0.99)},
        "flood": {"n": len(under), "p50_ms": pct(under, 0.5), "p99_ms": pct(under, 0.99)},
        "flood_answers": {str(s): outcomes.count(s) for s in sorted(set(outcomes))},
    }
    result["p99_ratio"] = result["flood"]["p99_ms"] / result["alone"]["p99_ms"]
    a, fl = result["alone"], result["flood"]
    print(f"open route alone:      p50 {a['p50_ms']:.3f} ms  p99 {a['p99_ms']:.3f} ms  "
          f"({a['n']} requests)")
    print(f"under the flood:       p50 {fl['p50_ms']:.3f} ms  p99 {fl['p99_ms']:.3f} ms  "
          f"({fl['n']} requests)")
    print(f"p99 ratio {result['p99_ratio']:.2f} (goal: within 2x); flood answers {result['flood_answers']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
