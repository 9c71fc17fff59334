#!/usr/bin/env python3
"""A/B of the io_uring experiment: the same minimal proxy loop on epoll (tokio) and io_uring
(tokio-uring), and veloxy for reference, one thread each on core 0, wrk and one upstream on
core 1, alternating 5 s wrk rounds; CPU per request from /proc, syscalls per request from
`strace -c -f` (a separate 3 s run). Loopback only; every wait is bounded.

    bench/uring-experiment/ab.py [--connections 64] [--rounds 4] [--out DIR]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROTO = os.path.join(HERE, "target", "release", "uring-experiment")
RELEASE = os.path.join(ROOT, "target", "release")


def cpu(pid):
    parts = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port, conns, secs):
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{secs}s",
                          "--latency", f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=secs + 30).stdout
    n = int(re.search(r"(\d+) requests in", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return n, float(p99.group(1)) * scale


def strace(pid, port, conns):
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    cmd = ["strace", "-c", "-f", "-o", "/tmp/uring-ab-strace.txt"]
    for t in tids:
        cmd += ["-p", str(t)]
    st = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    n, _ = wrk(port, conns, 3)
    st.send_signal(2)
    st.wait(timeout=15)
    text = open("/tmp/uring-ab-strace.txt").read()
    total = [line for line in text.splitlines() if line.strip().endswith("total")]
    calls = [int(x) for x in total[0].split() if x.isdigit()] if total else []
    return (calls[-2] if len(calls) >= 2 else calls[0]) / n if calls else None, text[-1500:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args()
    up = subprocess.Popen(["taskset", "-c", "1", os.path.join(RELEASE, "veloxy-upstream"),
                           "--listen", "127.0.0.1:21301"], stdout=subprocess.DEVNULL)
    conf = "/tmp/uring-ab-veloxy.toml"
    open(conf, "w").write('[server]\nworkers = 1\n[listeners.web]\naddr = "127.0.0.1:21312"\n'
                          '[[routes]]\nupstream = "app"\n[upstreams.app]\n'
                          'servers = ["127.0.0.1:21301"]\nkeepalive = 1024\n')
    procs = {
        "epoll": (subprocess.Popen(["taskset", "-c", "0", PROTO, "epoll", "127.0.0.1:21310",
                                    "127.0.0.1:21301"]), 21310),
        "io_uring": (subprocess.Popen(["taskset", "-c", "0", PROTO, "uring", "127.0.0.1:21311",
                                       "127.0.0.1:21301"]), 21311),
        "veloxy": (subprocess.Popen(["taskset", "-c", "0", os.path.join(RELEASE, "veloxy"),
                                     "run", "--config", conf],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), 21312),
    }
    time.sleep(1.5)
    res = {k: [] for k in procs}
    try:
        names = list(procs)
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                p, port = procs[name]
                wrk(port, args.connections, 1)
                c0 = cpu(p.pid)
                n, p99 = wrk(port, args.connections, 5)
                c1 = cpu(p.pid)
                res[name].append({"rps": n / 5, "cpu_us": (c1 - c0) * 1e6 / n, "p99_ms": p99})
                print(f"round {r + 1} {name:8} {n / 5:8.0f} req/s {(c1 - c0) * 1e6 / n:6.2f} us/req "
                      f"p99 {p99:.2f} ms", flush=True)
        lines = [f"{args.connections} connections, {args.rounds} rounds of 5 s (median)",
                 "layer       req/s   CPU/req    p99   syscalls/req"]
        summary = {}
        for name, (p, port) in procs.items():
            sc, text = strace(p.pid, port, args.connections)
            m = {k: statistics.median(x[k] for x in res[name]) for k in ("rps", "cpu_us", "p99_ms")}
            m["syscalls_per_req"] = sc
            m["strace"] = text
            summary[name] = m
            lines.append(f"{name:9} {m['rps']:8.0f} {m['cpu_us']:7.2f}us {m['p99_ms']:6.2f}ms "
                         f"{sc:8.2f}")
        text = "\n".join(lines)
        print(text)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            json.dump({"rounds": res, "summary": summary}, open(os.path.join(args.out, "results.json"), "w"),
                      indent=1)
            open(os.path.join(args.out, "report.md"), "w").write(
                "# io_uring experiment (issue 18)\n\nThe same minimal HTTP/1.1 keep-alive proxy "
                "loop (`bench/uring-experiment/src/main.rs`) on tokio (epoll) and tokio-uring "
                "(io_uring), and veloxy for reference; one thread each on core 0, wrk and one "
                "upstream on core 1.\n\n```\n" + text + "\n```\n")
    finally:
        for p, _ in procs.values():
            p.terminate()
        up.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
