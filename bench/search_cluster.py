#!/usr/bin/env python3
"""The search gateway against a real 3-node OpenSearch cluster: bulk indexing docs/s and
`_search` requests/s and p99 through veloxy (`route_to_shards` and `forward`), nginx
(round robin over the 3 nodes), and directly to one node.

The cluster (one JVM, 1 GiB heap per node, crates/veloxy-testkit/opensearch) runs on the load
core with wrk; each proxy has one worker on the proxy core. The index has 6 primaries and no
replicas. Each bulk is 1000 documents of about 1 KB with fixed IDs (wrk cycles through 20
different bulks, so the runs index the same 20000 IDs over and over: each bulk is real
indexing work, a new version of each document). The text is stored but not indexed (mapping
`dynamic: false`): the cost per document is then mostly moving it, which routing saves.
Contenders alternate round by round after a warm-up run each; the median of the rounds is
reported. Loopback only; every wait is bounded.

    bench/search_cluster.py [--rounds 3] [--duration 8] [--out DIR]

Needs target/release/veloxy, java and mvn (the runner comes from Maven Central), nginx, wrk.
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.join(ROOT, "crates", "veloxy-testkit", "opensearch")
CACHE = os.path.join(ROOT, "bench", ".cache", "opensearch")
VELOXY = os.path.join(ROOT, "target", "release", "veloxy")
PROXY_CPU, LOAD_CPU = "0", "1"
BULKS = 20
DOCS = 1000

# The end of both wrk scripts: one WRKJSON line the script parses.
LUA_DONE = r"""
function done(summary, latency, requests)
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"errors":%d,"p50":%d,"p99":%d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.status + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""

WRK_LUA = r"""
local bodies = {}
local n = 0
function init(args)
  for i = 1, tonumber(os.getenv("BULKS")) do
    local f = assert(io.open(os.getenv("BULK_DIR") .. "/bulk-" .. i .. ".ndjson", "rb"))
    bodies[i] = f:read("*a")
    f:close()
  end
end
function request()
  n = n % #bodies + 1
  return wrk.format("POST", os.getenv("WRK_PATH"),
    {["Content-Type"] = "application/x-ndjson"}, bodies[n])
end
"""

SEARCH_LUA = r"""
local bodies = {}
local n = 0
function init(args)
  for i = 1, 50 do
    bodies[i] = string.format('{"size":10,"query":{"term":{"n":%d}}}', i)
  end
end
function request()
  n = n % #bodies + 1
  return wrk.format("POST", "/bench/_search", {["Content-Type"] = "application/json"}, bodies[n])
end
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_base(n):
    for base in range(21000, 32000, 37):
        ok = True
        for i in range(1, n + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + i))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


def http(method, url, body=None, ctype="application/json", timeout=60):
    req = urllib.request.Request(url, data=body.encode() if isinstance(body, str) else body,
                                 method=method, headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def classpath():
    os.makedirs(CACHE, exist_ok=True)
    cp_file = os.path.join(CACHE, "cp.txt")
    if not os.path.exists(cp_file):
        subprocess.run(["mvn", "-q", "-B", "-f", os.path.join(PROJECT, "pom.xml"),
                        "dependency:build-classpath", f"-Dmdep.outputFile={cp_file}"],
                       check=True, timeout=600)
    jars = open(cp_file).read().strip()
    classes = os.path.join(CACHE, "classes")
    subprocess.run(["javac", "-d", classes, "-cp", jars,
                    os.path.join(PROJECT, "src/main/java/veloxy/Cluster.java")],
                   check=True, timeout=300)
    return f"{classes}:{jars}"


def start_cluster(tmp, nodes=3):
    base = free_base(nodes)
    cmd = ["taskset", "-c", LOAD_CPU, "java", f"-Xmx{nodes}g", f"-Xms{nodes}g", "-XX:+UseSerialGC",
           "-cp", classpath(), "veloxy.Cluster", os.path.join(tmp, "cluster"), str(nodes),
           str(base), f"bench-{os.getpid()}"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(os.path.join(tmp, "cluster.log"), "w"), text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("the cluster exited: see cluster.log")
        if line.startswith("READY"):
            return p, [base + i for i in range(1, nodes + 1)]
    raise RuntimeError("the cluster did not start in 300 s")


def write_bulks(tmp):
    d = os.path.join(tmp, "bulks")
    os.makedirs(d, exist_ok=True)
    words = " ".join(f"word{i}" for i in range(120))
    for b in range(1, BULKS + 1):
        with open(os.path.join(d, f"bulk-{b}.ndjson"), "w") as f:
            for i in range(DOCS):
                doc_id = f"doc-{(b - 1) * DOCS + i}"
                f.write(json.dumps({"index": {"_index": "bench", "_id": doc_id}}) + "\n")
                f.write(json.dumps({"n": i, "text": words[: 900 + (i % 100)]}) + "\n")
    return d


def start_veloxy(tmp, port, nodes, bulk, cache=False):
    conf = os.path.join(tmp, f"veloxy-{bulk}{'-cached' if cache else ''}.toml")
    seeds = ", ".join(f'"127.0.0.1:{n}"' for n in nodes)
    qc = ', query_cache = "q", ttl = "10m"' if cache else ""
    with open(conf, "w") as f:
        f.write(f'[server]\nworkers = 1\n[listeners.web]\naddr = "127.0.0.1:{port}"\n'
                + ('[caches.q]\nmemory = "64MiB"\n' if cache else "")
                + f'[[routes]]\nupstream = "es"\nsearch = {{ bulk = "{bulk}"{qc} }}\n'
                f'[upstreams.es]\nservers = [{seeds}]\nkeepalive = 64\nread_timeout = "60s"\n'
                f'search = {{ kind = "opensearch", discover = "5s" }}\n')
    return subprocess.Popen(["taskset", "-c", PROXY_CPU, VELOXY, "run", "--config", conf],
                            stdout=subprocess.DEVNULL, stderr=open(conf + ".log", "w"))


def start_veloxy_hop(tmp, port, node, admin):
    """veloxy as a plain proxy to the one node `direct` uses: the hop alone (its metrics on
    `admin`)."""
    conf = os.path.join(tmp, "veloxy-hop.toml")
    with open(conf, "w") as f:
        f.write(f'[server]\nworkers = 1\nadmin = "127.0.0.1:{admin}"\n'
                f'[listeners.web]\naddr = "127.0.0.1:{port}"\n'
                '[[routes]]\nupstream = "es"\n'
                f'[upstreams.es]\nservers = ["127.0.0.1:{node}"]\nkeepalive = 64\n'
                'read_timeout = "60s"\n')
    return subprocess.Popen(["taskset", "-c", PROXY_CPU, VELOXY, "run", "--config", conf],
                            stdout=subprocess.DEVNULL, stderr=open(conf + ".log", "w"))


def start_nginx(tmp, port, nodes, name="nginx"):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    servers = "".join(f"server 127.0.0.1:{n};" for n in nodes)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/error.log;\n"
                f"events {{ worker_connections 4096; }}\n"
                f"http {{ access_log off; client_max_body_size 100m; client_body_buffer_size 2m;\n"
                f"upstream es {{ {servers} keepalive 64; }}\n"
                f"server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://es;\n"
                "proxy_http_version 1.1; proxy_set_header Connection \"\";\n"
                "proxy_read_timeout 60s; } } }\n")
    return subprocess.Popen(["taskset", "-c", PROXY_CPU, "nginx", "-p", d + "/", "-c", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_port(port, limit=15):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port, script, path, duration, connections, env):
    cmd = ["taskset", "-c", LOAD_CPU, "wrk", "-t", "1", "-c", str(connections),
           "-d", f"{duration}s", "--timeout", "30s", "-s", script, f"http://127.0.0.1:{port}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60,
                         env={**os.environ, **env, "WRK_PATH": path}).stdout
    m = re.search(r"WRKJSON (\{.*\})", out)
    if not m:
        raise RuntimeError(f"wrk: {out[-400:]}")
    return json.loads(m.group(1))


FIXED_RATE = 2000


def wait_quiet(pid, limit=60.0):
    """Waits (at most `limit` seconds) until the process uses under 5% of a core over a
    second: the cluster merges segments for a while after a bulk run, on the load core.
    Returns the seconds waited."""
    start = time.time()
    while time.time() - start < limit:
        c0 = cpu_seconds(pid)
        time.sleep(1)
        if cpu_seconds(pid) - c0 < 0.05:
            break
    return time.time() - start


def cached_fixed_rate(port, cluster_pid):
    """The cached search's latency at a fixed rate well below the ceiling (wrk measures it at
    saturation, where queueing on the shared load core decides the tail). Hits never reach
    the cluster: it is let settle first, and its CPU during the run is reported, since it
    shares the load core with oha."""
    if not oha_path():
        return None
    waited = wait_quiet(cluster_pid)
    query = '{"size":10,"query":{"term":{"n":1}}}'
    # A warm-up at the same rate, unmeasured: the first miss (the cluster's cold search, which
    # identical requests wait for) would otherwise be in the tail.
    oha_latency(port, FIXED_RATE, 2, query, connections=16)
    c0 = cpu_seconds(cluster_pid)
    fixed = oha_latency(port, FIXED_RATE, 6, query, connections=16)
    cluster_cpu = (cpu_seconds(cluster_pid) - c0) / 6
    fixed.update(settled_s=waited, cluster_cpu=cluster_cpu)
    return fixed


OVERHEAD_RATE = 40
OVERHEAD_METHOD = (
    "What the hop costs a search is measured where it can be seen: at a fixed rate far below "
    "the cluster's ceiling (about 200 searches/s on its one core), so each search meets an idle "
    "cluster and the difference between contenders is the proxy, not a queue on the shared "
    "load core. Direct (one node), veloxy and nginx as plain proxies to that node (the hop "
    "alone), veloxy `forward` (searches spread over the discovered nodes) and nginx (round "
    "robin over the 3 nodes) alternate round by round, each after the cluster has settled "
    "(under 5% of a core for a second), for 15 s (600 searches) a round; the median of the "
    "rounds per percentile.")
OVERHEAD_QUERY = '{"size":10,"query":{"term":{"n":7}}}'


def oha_path():
    """The suite's oha (bench/.cache/bin) or one on PATH; None without."""
    oha = os.path.join(ROOT, "bench", ".cache", "bin", "oha")
    return oha if os.path.exists(oha) else shutil.which("oha")


def oha_latency(port, rate, seconds, body, path="/bench/_search", connections=8):
    """oha POSTing `body` at a fixed `rate` for `seconds` over `connections` (latency-corrected):
    p50/p99/p99.9 in ms, or None without oha."""
    oha = oha_path()
    if not oha:
        return None
    cmd = ["taskset", "-c", LOAD_CPU, oha, "-z", f"{seconds}s", "-q", str(rate),
           "-c", str(connections), "--latency-correction", "--no-tui", "--output-format", "json",
           "-m", "POST",
           "-T", "application/json", "-d", body, f"http://127.0.0.1:{port}{path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    pct = json.loads(out)["latencyPercentiles"]
    return {k: pct[k] * 1000 for k in ("p50", "p99", "p99.9")}


def own_time(admin):
    """veloxy's own time so far from its metrics: (requests, seconds from request head to
    response end minus seconds from sending upstream to the response head)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10).read().decode()
    val = lambda name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # noqa: E731
    return (val("veloxy_request_duration_seconds_count"),
            val("veloxy_request_duration_seconds_sum")
            - val("veloxy_upstream_duration_seconds_sum"))


def forward_overhead(ports, cluster_pid, rounds, seconds=15, admin=None):
    """[`OVERHEAD_METHOD`]: p50/p99/p99.9 per contender, or None without oha; with `admin`
    (veloxy-hop's), also veloxy's own time per search from its metrics."""
    names = [n for n in ("direct", "veloxy-hop", "nginx-hop", "veloxy-forward", "nginx")
             if n in ports]
    got = {n: [] for n in names}
    for n in names:  # warm-up: JIT and connections
        if oha_latency(ports[n], OVERHEAD_RATE, 2, OVERHEAD_QUERY) is None:
            return None
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            wait_quiet(cluster_pid, limit=20)
            before = own_time(admin) if admin and n == "veloxy-hop" else None
            got[n].append(oha_latency(ports[n], OVERHEAD_RATE, seconds, OVERHEAD_QUERY))
            if before:
                after = own_time(admin)
                got[n][-1]["own_us"] = (after[1] - before[1]) / (after[0] - before[0]) * 1e6
    out = {n: {k: statistics.median(x[k] for x in got[n]) for k in ("p50", "p99", "p99.9")}
           for n in names}
    if admin and "veloxy-hop" in out:
        out["veloxy-hop"]["own_us"] = statistics.median(x["own_us"] for x in got["veloxy-hop"])
    return out


def overhead_lines(over):
    if not over:
        return ["search overhead at a fixed rate: SKIPPED (no oha)"]
    lines = [f"search latency at a fixed {OVERHEAD_RATE} req/s (oha, latency-corrected, median "
             "of the rounds):  p50      p99      p99.9"]
    for n, v in over.items():
        lines.append(f"  {n:15} {v['p50']:8.3f}ms {v['p99']:8.3f}ms {v['p99.9']:8.3f}ms")
    d = over["direct"]

    def vs_direct(name):
        v = over[name]
        return ((v["p50"] - d["p50"]) / d["p50"] * 100, (v["p99"] - d["p99"]) / d["p99"] * 100)

    for name, what in (("veloxy-hop", "the hop to the same node"),
                       ("nginx-hop", "nginx's hop to the same node"),
                       ("veloxy-forward", "veloxy forward over the discovered nodes"),
                       ("nginx", "nginx round robin over the 3 nodes")):
        if name in over:
            p50, p99 = vs_direct(name)
            lines.append(f"{what}, vs direct: p50 {p50:+.1f}%, p99 {p99:+.1f}%")
    own = over.get("veloxy-hop", {}).get("own_us")
    if own is not None:
        share = own / 1000 / d["p50"] * 100
        lines.append(f"veloxy's own time per search (its metrics: request duration minus "
                     f"upstream time to the response head): {own:.0f} us = {share:.1f}% of the "
                     f"cluster's direct p50")
        end = max(vs_direct("veloxy-forward"))
        lines.append("goal, forwarding overhead under 5% of the cluster's own latency: "
                     f"{'met' if share < 5 else 'NOT met'} for veloxy's own time; end to end "
                     f"{'met' if end < 5 else 'NOT met'} (the extra hop's kernel path and this "
                     "VM's wake-ups of idle cores: nginx's hop costs as much or more)")
    return lines


def fixed_line(fixed):
    if not fixed:
        return "cached search at a fixed rate: SKIPPED (no oha)"
    return (f"cached search at a fixed {FIXED_RATE} req/s (oha, latency-corrected): "
            f"p50 {fixed['p50']:.3f} ms, p99 {fixed['p99']:.3f} ms, p99.9 {fixed['p99.9']:.3f} ms "
            f"(cluster settled for {fixed['settled_s']:.0f} s first; its CPU during the run: "
            f"{fixed['cluster_cpu'] * 100:.1f}% of the load core)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cached-only", action="store_true",
                    help="only the cached search at a fixed rate (no bulk rounds)")
    ap.add_argument("--overhead-only", action="store_true",
                    help="only the forwarding overhead at a fixed rate (no bulk rounds)")
    args = ap.parse_args()
    for tool in ("java", "mvn", "javac", "nginx", "wrk", "taskset"):
        if not shutil.which(tool):
            print(f"SKIPPED: {tool} is not installed", file=sys.stderr)
            return 0
    tmp = tempfile.mkdtemp(prefix="veloxy-search-")
    cluster, nodes = start_cluster(tmp)
    procs = []
    try:
        first = f"http://127.0.0.1:{nodes[0]}"
        # The text is stored, not indexed (`dynamic: false`, a log pipeline's usual shape):
        # the cost per document is then mostly moving it, which is what routing saves.
        http("PUT", f"{first}/bench?wait_for_active_shards=all", json.dumps(
            {"settings": {"number_of_shards": 6, "number_of_replicas": 0,
                          "refresh_interval": "5s"},
             "mappings": {"dynamic": False, "properties": {"n": {"type": "integer"}}}}))
        bulk_dir = write_bulks(tmp)
        # Seed the documents so that searches find something.
        for b in range(1, BULKS + 1):
            http("POST", f"{first}/_bulk", open(f"{bulk_dir}/bulk-{b}.ndjson").read(),
                 "application/x-ndjson", timeout=120)
        http("POST", f"{first}/bench/_refresh")
        shards = http("GET", f"{first}/_cat/shards/bench?format=json")
        placement = sorted((s["shard"], s["node"]) for s in shards)
        if args.cached_only:
            port = free_port()
            procs.append(start_veloxy(tmp, port, nodes, "forward", cache=True))
            wait_port(port)
            time.sleep(1)  # the first discovery round
            print(fixed_line(cached_fixed_rate(port, cluster.pid)))
            return 0
        ports = {}
        ports["direct"] = nodes[0]
        ports["veloxy-route"] = free_port()
        procs.append(start_veloxy(tmp, ports["veloxy-route"], nodes, "route_to_shards"))
        ports["veloxy-forward"] = free_port()
        procs.append(start_veloxy(tmp, ports["veloxy-forward"], nodes, "forward"))
        # Searches only: answered from the query cache after the first of each of the 50.
        ports["veloxy-cached"] = free_port()
        procs.append(start_veloxy(tmp, ports["veloxy-cached"], nodes, "forward", cache=True))
        ports["nginx"] = free_port()
        procs.append(start_nginx(tmp, ports["nginx"], nodes))
        ports["veloxy-hop"], hop_admin = free_port(), free_port()
        procs.append(start_veloxy_hop(tmp, ports["veloxy-hop"], nodes[0], hop_admin))
        ports["nginx-hop"] = free_port()
        procs.append(start_nginx(tmp, ports["nginx-hop"], nodes[:1], name="nginx-hop"))
        for p in ports.values():
            wait_port(p)
        time.sleep(1)  # the first discovery round (nodes and the cluster map)
        if args.overhead_only:
            over = forward_overhead(ports, cluster.pid, args.rounds, admin=hop_admin)
            text = "\n".join(overhead_lines(over))
            print("\n" + text)
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, "report.md"), "w") as f:
                    f.write("# Search forwarding overhead against a real 3-node OpenSearch "
                            f"cluster\n\nCommand: `bench/search_cluster.py --overhead-only "
                            f"--rounds {args.rounds}`. Proxies: 1 worker on core {PROXY_CPU}; "
                            f"the cluster (one JVM, 3 nodes) and oha on core {LOAD_CPU}. "
                            f"{OVERHEAD_METHOD}\n\n```\n{text}\n```\n")
            return 0
        script = os.path.join(tmp, "bulk.lua")
        open(script, "w").write(WRK_LUA + LUA_DONE)
        sscript = os.path.join(tmp, "search.lua")
        open(sscript, "w").write(SEARCH_LUA + LUA_DONE)
        env = {"BULK_DIR": bulk_dir, "BULKS": str(BULKS)}
        names = [n for n in ports if not n.endswith("-hop")]  # the hops: overhead only
        results = {n: {"bulk": [], "search": []} for n in names}
        jvm_cpu = lambda: cpu_seconds(cluster.pid)  # noqa: E731
        bulkers = [n for n in names if n != "veloxy-cached"]
        for name in names:  # warm-up, unmeasured: the JVM's JIT, the proxies' pools
            if name in bulkers:
                wrk(ports[name], script, "/_bulk", 3, 4, env)
            wrk(ports[name], sscript, "/bench/_search", 2, 16, {})
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name in bulkers:
                    c0 = jvm_cpu()
                    b = wrk(ports[name], script, "/_bulk", args.duration, 4, env)
                    c1 = jvm_cpu()
                    b["docs_per_s"] = b["requests"] * DOCS / (b["duration_us"] / 1e6)
                    b["cluster_cpu_us_per_doc"] = (c1 - c0) * 1e6 / max(1, b["requests"] * DOCS)
                    results[name]["bulk"].append(b)
                else:
                    b = {"docs_per_s": 0, "p99": 0, "cluster_cpu_us_per_doc": 0, "errors": 0}
                s = wrk(ports[name], sscript, "/bench/_search", args.duration, 16, {})
                s["rps"] = s["requests"] / (s["duration_us"] / 1e6)
                results[name]["search"].append(s)
                print(f"round {r + 1} {name:15} bulk {b['docs_per_s']:9.0f} docs/s "
                      f"(p99 {b['p99'] / 1000:.0f} ms, cluster {b['cluster_cpu_us_per_doc']:.1f} us/doc, "
                      f"errors {b['errors']})  search {s['rps']:7.0f} req/s p99 {s['p99'] / 1000:.1f} ms",
                      flush=True)
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        lines = ["contender        bulk docs/s  bulk p99  cluster CPU/doc  search req/s  search p99  errors"]
        summary = {}
        for n in names:
            bd = med([x["docs_per_s"] for x in results[n]["bulk"]])
            bp = med([x["p99"] / 1000 for x in results[n]["bulk"]])
            cc = med([x["cluster_cpu_us_per_doc"] for x in results[n]["bulk"]])
            sr = med([x["rps"] for x in results[n]["search"]])
            sp = med([x["p99"] / 1000 for x in results[n]["search"]])
            err = sum(x["errors"] for x in results[n]["bulk"] + results[n]["search"])
            summary[n] = {"docs_per_s": bd, "bulk_p99_ms": bp, "cluster_cpu_us_per_doc": cc,
                          "search_rps": sr, "search_p99_ms": sp, "errors": err}
            if bd is None:
                lines.append(f"{n:15} {'-':>12} {'-':>9} {'-':>16} {sr:13.0f} {sp:9.2f}ms {err:7}")
            else:
                lines.append(f"{n:15} {bd:12.0f} {bp:7.0f}ms {cc:14.1f}us {sr:13.0f} {sp:9.1f}ms {err:7}")
        fixed = cached_fixed_rate(ports["veloxy-cached"], cluster.pid)
        if fixed:
            lines.append(fixed_line(fixed))
        ratio = summary["veloxy-route"]["docs_per_s"] / summary["nginx"]["docs_per_s"]
        lines.append(f"route_to_shards docs/s / nginx's = {ratio:.2f} (goal: at least 1.5)")
        fwd = summary["veloxy-forward"]["search_p99_ms"] / summary["direct"]["search_p99_ms"]
        lines.append(f"search p99 at saturation, veloxy forward / direct = {fwd:.3f} (the "
                     "cluster's queue on the shared core; the overhead is measured below)")
        lines.extend(overhead_lines(forward_overhead(ports, cluster.pid, args.rounds,
                                                     admin=hop_admin)))
        lines.append(f"cached search p99 = {summary['veloxy-cached']['search_p99_ms']:.2f} ms "
                     "(goal: under 1 ms)")
        text = "\n".join(lines)
        print("\n" + text)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump({"rounds": results, "summary": summary, "placement": placement}, f, indent=1)
            with open(os.path.join(args.out, "report.md"), "w") as f:
                f.write("# Search gateway against a real 3-node OpenSearch cluster\n\n"
                        f"Command: `bench/search_cluster.py --rounds {args.rounds} --duration "
                        f"{args.duration}`. Proxies: 1 worker on core {PROXY_CPU}; the cluster "
                        f"(one JVM, 3 nodes) and wrk on core {LOAD_CPU}. Index: 6 primaries, no "
                        f"replicas, placed {placement}; the text is stored, not indexed (mapping "
                        f"`dynamic: false`, one integer field). Bulks of {DOCS} docs of ~1 KB, 4 "
                        "connections; searches: term queries, 16 connections. A warm-up run "
                        f"each, then the median of the rounds.\n\n```\n{text}\n```\n")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        try:
            cluster.stdin.write("quit\n")
            cluster.stdin.flush()
            cluster.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            cluster.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
