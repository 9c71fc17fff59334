#!/usr/bin/env python3
"""`bench/run --cache-tests`: the HTTP caching test suite (http-tests/cache-tests, the suite
behind cache-tests.fyi) against veloxy, nginx `proxy_cache` and Varnish, in the same run.

The suite has a test server (the origin, Node) and a client that sends each test's requests
through the cache under test and checks the answers. Each proxy runs on its own loopback port
in front of the one test server, with the configuration cache-tests.fyi uses for it where it
publishes one (nginx: `proxy_cache` with `proxy_cache_revalidate on` and HTTP/1.1 upstream;
Varnish: its built-in VCL with the test server as backend) and veloxy with a memory store on
its one route. Results are counted as cache-tests.fyi counts them, in the suite's three kinds:
`required` and `optimal` tests passed (browser-only tests are not run for proxies) and
`check` tests answered "yes".

The suite comes from npm (`http-cache-tests`, installed once under the cache directory) unless
`--suite DIR` names a checkout of the suite's repository (whose layout, with `test-engine/`,
is newer than the npm release's and has more tests: the CDN-Cache-Control and interim
response tests among them). The test server binds every address by default; it is started
with a preloaded module that makes it listen on 127.0.0.1 only.

    bench/run --cache-tests [--proxies veloxy,nginx,varnish] [--suite DIR]
              [--floor-required N --floor-optimal N] [--out DIR]

Exits 1 when veloxy passes fewer tests than a floor (CI uses the npm suite with floors),
2 when something could not start. Writes report.md and one JSON file of results per proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NPM_VERSION = "0.4.5"
PROXIES = ["veloxy", "nginx", "varnish"]
KINDS = ["required", "optimal", "check"]

LOOPBACK = """\
import http from 'node:http'
const listen = http.Server.prototype.listen
http.Server.prototype.listen = function (port, ...rest) {
  if (typeof port === 'number' || typeof port === 'string') {
    return listen.call(this, port, '127.0.0.1', ...rest)
  }
  return listen.call(this, port, ...rest)
}
"""

SCORE = """\
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'
const [suiteDir, resultsFile] = process.argv.slice(2)
const tests = (await import(pathToFileURL(path.join(suiteDir, 'tests/index.mjs')))).default
const extra = path.join(suiteDir, 'tests/surrogate-control.mjs')
if (fs.existsSync(extra) && !fs.existsSync(path.join(suiteDir, 'test-engine'))) {
  tests.push((await import(pathToFileURL(extra))).default)
}
const results = JSON.parse(fs.readFileSync(resultsFile, 'utf8'))
const out = { required: [0, 0], optimal: [0, 0], check: [0, 0], failed: [] }
for (const suite of tests) {
  for (const t of suite.tests) {
    if (t.browser_only) continue
    const kind = t.kind || 'required'
    out[kind][1]++
    if (results[t.id] === true) out[kind][0]++
    else if (kind !== 'check') out.failed.push(`${kind} ${t.id}: ${JSON.stringify(results[t.id])}`)
  }
}
console.log(JSON.stringify(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


def cache_dir() -> Path:
    base = os.environ.get("VELOXY_CACHE") or str(Path.home() / ".cache/veloxy")
    return Path(base) / "cache-tests"


def npm_suite() -> Path:
    """The npm release of the suite, installed once under the cache directory."""
    root = cache_dir() / NPM_VERSION
    suite = root / "node_modules/http-cache-tests"
    if not (suite / "tests/index.mjs").exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix",
                        str(root), f"http-cache-tests@{NPM_VERSION}"], check=True)
    return suite


def layout(suite: Path) -> tuple[Path, Path]:
    """(server script, client script) of a suite checkout or npm release."""
    if (suite / "test-engine").is_dir():
        return suite / "test-engine/server/server.mjs", suite / "test-engine/cli.mjs"
    return suite / "server/server.mjs", suite / "cli.mjs"


def start_origin(suite: Path, work: Path) -> tuple[subprocess.Popen, int]:
    server, _ = layout(suite)
    preload = work / "loopback.mjs"
    preload.write_text(LOOPBACK)
    port = free_port()
    env = dict(os.environ, npm_config_port=str(port), npm_package_config_port=str(port),
               npm_config_protocol="http", npm_package_config_protocol="http",
               npm_config_pidfile=str(work / "origin.pid"),
               npm_package_config_pidfile=str(work / "origin.pid"))
    log = open(work / "origin.log", "w")
    proc = subprocess.Popen(["node", "--import", preload.as_uri(), str(server)], cwd=suite,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc, "the cache-tests server")
    return proc, port


def veloxy_config(port: int, origin: int) -> str:
    return f"""[server]
workers = 1
[listeners.web]
addr = "127.0.0.1:{port}"
[caches.main]
memory = "64MiB"
max_object = "8MiB"
[[routes]]
upstream = "origin"
cache = {{ store = "main" }}
[upstreams.origin]
servers = ["127.0.0.1:{origin}"]
"""


def nginx_config(port: int, origin: int, work: Path) -> str:
    return f"""daemon off;
worker_processes 1;
error_log {work}/nginx-error.log;
pid {work}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-body;
    proxy_temp_path {work}/nginx-tmp;
    proxy_cache_path {work}/nginx-cache levels=1:2 keys_zone=my-cache:8m max_size=1000m inactive=600m;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{origin};
            proxy_cache my-cache;
            proxy_cache_revalidate on;
            proxy_http_version 1.1;
        }}
    }}
}}
"""


def start_proxy(name: str, origin: int, work: Path, veloxy: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    log = open(work / f"{name}.log", "w")
    if name == "veloxy":
        conf = work / "veloxy.toml"
        conf.write_text(veloxy_config(port, origin))
        cmd = [veloxy, "run", "--config", str(conf)]
    elif name == "nginx":
        conf = work / "nginx.conf"
        conf.write_text(nginx_config(port, origin, work))
        cmd = [shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(conf), "-p", str(work)]
    else:
        vcl = work / "default.vcl"
        vcl.write_text(f'vcl 4.1;\nbackend default {{ .host = "127.0.0.1"; .port = "{origin}"; }}\n')
        cmd = [shutil.which("varnishd") or "/usr/sbin/varnishd", "-F", "-j", "none",
               "-a", f"127.0.0.1:{port}", "-T", "none", "-f", str(vcl), "-n", str(work / "varnish"),
               "-s", "malloc,64m"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc, name)
    return proc, port


def run_suite(suite: Path, port: int, work: Path, name: str) -> dict:
    _, cli = layout(suite)
    env = dict(os.environ, npm_config_base=f"http://127.0.0.1:{port}",
               npm_package_config_base=f"http://127.0.0.1:{port}",
               npm_config_id="", npm_package_config_id="")
    out = subprocess.run(["node", "--no-warnings", str(cli)], cwd=suite, env=env,
                         capture_output=True, text=True, timeout=900)
    try:
        results = json.loads(out.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"{name}: the suite's client printed no results: "
                           f"{(out.stdout + out.stderr)[-2000:]}") from e
    path = work / f"{name}-results.json"
    path.write_text(json.dumps(results, indent=1))
    score = work / "score.mjs"
    score.write_text(SCORE)
    s = subprocess.run(["node", str(score), str(suite), str(path)], capture_output=True,
                       text=True, check=True, timeout=60)
    return json.loads(s.stdout)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def report(scores: dict, suite_name: str) -> str:
    lines = [f"# cache-tests: {suite_name}", "",
             "| proxy | required | optimal | check (yes) |", "|---|---|---|---|"]
    for name, s in scores.items():
        cells = [f"{s[k][0]} / {s[k][1]}" for k in KINDS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, s in scores.items():
        lines += ["", f"## {name}: not passed", ""] + [f"- {f}" for f in s["failed"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/run --cache-tests", description=__doc__.split("\n")[0])
    p.add_argument("--proxies", default=",".join(PROXIES))
    p.add_argument("--suite", help="a checkout of http-tests/cache-tests (default: the npm release)")
    default_bin = os.environ.get("VELOXY_BIN", str(HERE.parent / "target/release/veloxy"))
    p.add_argument("--veloxy", default=default_bin)
    p.add_argument("--floor-required", type=int, default=0)
    p.add_argument("--floor-optimal", type=int, default=0)
    p.add_argument("--out", help="results directory (default: a temporary one)")
    args = p.parse_args()
    proxies = [x.strip() for x in args.proxies.split(",") if x.strip()]
    if unknown := [x for x in proxies if x not in PROXIES]:
        p.error(f"unknown proxies {unknown}; known: {PROXIES}")
    if not shutil.which("node"):
        print("cache-tests: node is not installed", file=sys.stderr)
        return 2
    suite = Path(args.suite).resolve() if args.suite else npm_suite()
    suite_name = str(suite) if args.suite else f"http-cache-tests {NPM_VERSION} (npm)"
    out = Path(args.out or tempfile.mkdtemp(prefix="cache-tests-"))
    out.mkdir(parents=True, exist_ok=True)
    origin, origin_port = start_origin(suite, out)
    scores = {}
    try:
        for name in proxies:
            if name != "veloxy" and not shutil.which("varnishd" if name == "varnish" else "nginx"):
                print(f"cache-tests: {name} is not installed: skipped", file=sys.stderr)
                continue
            work = out / name
            work.mkdir(exist_ok=True)
            proc, port = start_proxy(name, origin_port, work, args.veloxy)
            try:
                scores[name] = run_suite(suite, port, out, name)
            finally:
                stop(proc)
            s = scores[name]
            counts = ", ".join(f"{k} {s[k][0]}/{s[k][1]}" for k in KINDS)
            print(f"cache-tests: {name}: {counts}", flush=True)
    except RuntimeError as e:
        print(f"cache-tests: {e}", file=sys.stderr)
        return 2
    finally:
        stop(origin)
    (out / "report.md").write_text(report(scores, suite_name))
    (out / "scores.json").write_text(json.dumps(scores, indent=1))
    print(f"cache-tests: report in {out / 'report.md'}")
    v = scores.get("veloxy")
    if v and (v["required"][0] < args.floor_required or v["optimal"][0] < args.floor_optimal):
        print(f"cache-tests: veloxy is below the floor (required {v['required'][0]} < "
              f"{args.floor_required} or optimal {v['optimal'][0]} < {args.floor_optimal})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
