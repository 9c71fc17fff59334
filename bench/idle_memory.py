#!/usr/bin/env python3
"""Memory per idle keep-alive client connection: veloxy, nginx and HAProxy, one worker each.

Each proxy fronts one veloxy-upstream. N clients (default 9900: HAProxy wants two
descriptors per connection, under this machine's 20000) each send one GET, read the answer
and then sit idle on their keep-alive connection; the proxy's resident memory (VmRSS
of its worker process) is read before the clients connect and 4 s after the last answer
(veloxy frees an idle connection's read buffer after 1 s). Prints one line per proxy and the
figures as JSON. Loopback only; every wait is bounded.

    bench/idle_memory.py [--connections N] [--pooled N] [--tls N] [--out results.json]

With --tls N, also N idle keep-alive HTTPS clients (HTTP/1.1 over TLS 1.3, an ECDSA P-256
certificate made with the openssl command), each after one request.

With --pooled N, also the memory per idle pooled upstream connection: N clients each send a
request the upstream answers after 300 ms, then close, leaving N connections in the proxy's
keep-alive pool (sized N); the RSS growth over them, 3 s later, divided by the connections
the upstream still has open.

Needs target/release/veloxy and target/release/veloxy-upstream (cargo build --release), and
nginx / haproxy on PATH (a proxy that is missing is reported as skipped).
"""

import argparse
import json
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "target", "release")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def wait_port(port, limit=10.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def worker_pid(proc, name):
    """The worker process: the child of the master for nginx, the process itself otherwise."""
    if name != "nginx":
        return proc.pid
    deadline = time.time() + 5
    while time.time() < deadline:
        out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        pids = out.stdout.split()
        if pids:
            return int(pids[0])
        time.sleep(0.05)
    raise RuntimeError("no nginx worker")


def make_cert(tmp):
    """A self-signed ECDSA P-256 certificate for localhost: (cert, key, cert+key bundle)."""
    cert, key, bundle = (os.path.join(tmp, f) for f in ("cert.pem", "key.pem", "bundle.pem"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=localhost"],
                   check=True, capture_output=True, timeout=30)
    with open(bundle, "w") as b:
        b.write(open(cert).read() + open(key).read())
    return cert, key, bundle


def start(name, port, upstream, tmp, pool=128, tls=None):
    if name == "veloxy":
        conf = os.path.join(tmp, "veloxy.toml")
        tls_conf = f'[listeners.web.tls]\ncert = "{tls[0]}"\nkey = "{tls[1]}"\n' if tls else ""
        with open(conf, "w") as f:
            f.write(
                f'[server]\nworkers = 1\nkeepalive_timeout = "10m"\n'
                f'[listeners.web]\naddr = "127.0.0.1:{port}"\n{tls_conf}'
                f'[[routes]]\nupstream = "app"\n'
                f'[upstreams.app]\nservers = ["127.0.0.1:{upstream}"]\nkeepalive = {pool}\n'
            )
        cmd = [os.path.join(RELEASE, "veloxy"), "run", "--config", conf]
    elif name == "nginx":
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(
                f"worker_processes 1; daemon off; pid {tmp}/nginx.pid;\n"
                f"error_log {tmp}/nginx-error.log; worker_rlimit_nofile 20000;\n"
                "events { worker_connections 20000; }\n"
                "http { access_log off; keepalive_timeout 600s; keepalive_requests 100000;\n"
                f"  upstream app {{ server 127.0.0.1:{upstream}; keepalive {pool}; }}\n"
                f"  server {{ listen 127.0.0.1:{port}{' ssl' if tls else ''};\n"
                + (f"    ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};\n" if tls else "")
                +
                "    location / { proxy_pass http://app; proxy_http_version 1.1;\n"
                '      proxy_set_header Connection ""; } } }\n'
            )
        cmd = ["nginx", "-c", conf, "-p", tmp]
    else:
        conf = os.path.join(tmp, "haproxy.cfg")
        with open(conf, "w") as f:
            f.write(
                "global\n  nbthread 1\n  maxconn 9950\n"
                "defaults\n  mode http\n  timeout connect 5s\n  timeout client 10m\n"
                "  timeout server 30s\n  timeout http-keep-alive 10m\n  option http-keep-alive\n"
                f"frontend web\n  bind 127.0.0.1:{port}{f' ssl crt {tls[2]}' if tls else ''}\n"
                "  default_backend app\n"
                f"backend app\n  http-reuse always\n"
                f"  server s1 127.0.0.1:{upstream} pool-max-conn {pool} pool-purge-delay 10m\n"
            )
        cmd = ["haproxy", "-f", conf]
    log = open(os.path.join(tmp, f"{name}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port)
    except RuntimeError:
        proc.kill()
        with open(os.path.join(tmp, f"{name}.log")) as f:
            raise RuntimeError(f"{name} did not start: {f.read()[-2000:]}") from None
    return proc


def client_context():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def connect(port, tls, timeout=5):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return tls.wrap_socket(s, server_hostname="localhost") if tls else s


def warm_up(port, tls=None):
    """One request first, so lazily built state (pools, caches) is not counted per client."""
    probe = connect(port, tls)
    probe.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    while probe.recv(65536):
        pass
    probe.close()
    time.sleep(0.5)


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def measure(name, n, upstream, tmp, tls=None):
    port = free_port()
    proc = start(name, port, upstream, tmp, tls=tls)
    ctx = client_context() if tls else None
    try:
        pid = worker_pid(proc, name)
        warm_up(port, ctx)
        before = rss_kib(pid)
        socks = []
        for _ in range(n):
            s = connect(port, ctx)
            s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            socks.append(s)
        for s in socks:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError(f"{name} closed a connection")
                data += chunk
        time.sleep(4)
        after = rss_kib(pid)
        for s in socks:
            s.close()
        return {"rss_before_kib": before, "rss_idle_kib": after,
                "bytes_per_connection": round((after - before) * 1024 / n)}
    finally:
        stop(proc)


def established_to(port):
    """Established TCP connections to 127.0.0.1:port (from /proc/net/tcp)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[3] == "01" and parts[2].endswith(f":{port:04X}"):
                n += 1
    return n


def measure_pooled(name, n, upstream, up_port, tmp):
    """Memory per idle pooled upstream connection: n clients each send a request the
    upstream answers after 300 ms (so n upstream connections open at once), then close; the
    proxy keeps the n upstream connections in its keep-alive pool (sized n)."""
    port = free_port()
    proc = start(name, port, upstream, tmp, pool=n)
    try:
        pid = worker_pid(proc, name)
        warm_up(port)
        before = rss_kib(pid)
        socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /delay/300 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            socks.append(s)
        for s in socks:
            while s.recv(65536):
                pass
            s.close()
        time.sleep(3)  # closed clients' memory returned (veloxy trims after a burst)
        after = rss_kib(pid)
        pooled = established_to(up_port) // 2  # both ends of each connection are listed
        return {"rss_before_kib": before, "rss_pooled_kib": after, "pooled": pooled,
                "bytes_per_pooled": round((after - before) * 1024 / max(1, pooled))}
    finally:
        stop(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=9900)
    ap.add_argument("--pooled", type=int, default=0,
                    help="also measure N idle pooled upstream connections per proxy")
    ap.add_argument("--tls", type=int, default=0,
                    help="also measure N idle keep-alive HTTPS clients per proxy")
    ap.add_argument("--out")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n = min(args.connections, hard - 100)
    up_port = free_port()
    upstream = subprocess.Popen(
        [os.path.join(RELEASE, "veloxy-upstream"), "--listen", f"127.0.0.1:{up_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = {"connections": n}
    try:
        wait_port(up_port)
        with tempfile.TemporaryDirectory() as tmp:
            cert = make_cert(tmp) if args.tls else None
            for name in ["veloxy", "nginx", "haproxy"]:
                if name != "veloxy" and shutil.which(name) is None:
                    print(f"{name:8} SKIPPED: not installed")
                    continue
                r = measure(name, n, up_port, tmp)
                results[name] = r
                print(f"{name:8} {r['bytes_per_connection']:6} bytes per idle connection "
                      f"(RSS {r['rss_before_kib']} KiB -> {r['rss_idle_kib']} KiB "
                      f"with {n} idle clients)")
                if args.tls:
                    t = measure(name, args.tls, up_port, tmp, tls=cert)
                    results[f"{name}-tls"] = t
                    print(f"{name:8} {t['bytes_per_connection']:6} bytes per idle TLS connection "
                          f"(RSS {t['rss_before_kib']} KiB -> {t['rss_idle_kib']} KiB "
                          f"with {args.tls} idle HTTPS clients)")
                if args.pooled:
                    p = measure_pooled(name, args.pooled, up_port, up_port, tmp)
                    results[f"{name}-pooled"] = p
                    print(f"{name:8} {p['bytes_per_pooled']:6} bytes per pooled upstream "
                          f"connection ({p['pooled']} pooled; RSS {p['rss_before_kib']} KiB -> "
                          f"{p['rss_pooled_kib']} KiB)")
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
