"""`bench/run --vs-nginx --fastcgi`: FastCGI to PHP-FPM, veloxy (`protocol = "fastcgi"`) against
nginx (`fastcgi_pass`), both to one php-fpm (a static pool of CHILDREN children, opcache on,
on a unix socket, pinned to the load core(s) with wrk), GET of a small PHP script that answers
a ~100-byte JSON. Each proxy keeps its FastCGI connections (veloxy's pool, nginx's
`fastcgi_keep_conn on` with an upstream `keepalive`), KEEP idle at most. Reported by harness/vs_nginx.py:
requests/s, p99, the proxy's CPU per request (its process tree; php-fpm's CPU is not counted)
and the ratios against nginx."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from . import modes, peers
from .procs import StartError

PHP_FPM = "php-fpm"
CHILDREN = 8
# Idle FastCGI connections each proxy keeps. A php-fpm child serves one connection until it
# closes, so a kept connection holds a child: with both proxies running side by side (the
# alternating rounds), each may hold at most KEEP children idle, and let them go after
# IDLE_S seconds, leaving the other at least CHILDREN - KEEP. veloxy closes connections beyond
# KEEP when they come back (`pool_purge_delay = "0s"`, as nginx's `keepalive` does): with its
# default purge delay, surplus connections stay open while the worker is idle, and each keeps
# a php-fpm child from the other proxy.
KEEP = 2
IDLE_S = 2
# The script: the route's path is the script's path under the root.
PATH = "/php/bench.php"
SCRIPT = ("<?php header('Content-Type: application/json');\n"
          "echo json_encode(['ok' => true, 'uri' => $_SERVER['REQUEST_URI'], "
          "'method' => $_SERVER['REQUEST_METHOD'], 'n' => 42]);\n")


def binary() -> str | None:
    """Debian's php-fpm (`/usr/sbin/php-fpmX.Y`), if installed."""
    found = sorted(Path("/usr/sbin").glob("php-fpm*"))
    return str(found[-1]) if found else None


def opcache() -> str | None:
    found = sorted(Path("/usr/lib/php").glob("*/opcache.so"))
    return str(found[-1]) if found else None


def start(ctx) -> tuple[peers.Running, Path, Path]:
    """php-fpm serving a root with the bench script: (its run, the socket, the root)."""
    fpm = binary()
    if not fpm:
        raise StartError("--fastcgi needs php-fpm (apt-get install php-fpm)")
    wd = modes.workdir(ctx, PHP_FPM)
    root = wd / "www"
    (root / "php").mkdir(parents=True)
    (root / "php" / "bench.php").write_text(SCRIPT)
    sock = wd / "php-fpm.sock"
    conf = wd / "php-fpm.conf"
    conf.write_text(
        f"[global]\nerror_log = {wd}/php-fpm.log\ndaemonize = no\n"
        f"[bench]\nlisten = {sock}\nlisten.backlog = 4096\npm = static\n"
        f"pm.max_children = {CHILDREN}\npm.max_requests = 0\n"
        "catch_workers_output = no\nclear_env = yes\n")
    cmd = [fpm, "--nodaemonize", "--allow-to-run-as-root", "-n", "-y", str(conf)]
    oc = opcache()
    if oc:
        cmd += ["-d", f"zend_extension={oc}", "-d", "opcache.enable=1",
                "-d", "opcache.validate_timestamps=0"]

    def ready(run: peers.Running) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if run.proc.poll() is not None:
                raise StartError(f"php-fpm exited ({run.proc.returncode})")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(sock))
                    return
            except OSError:
                time.sleep(0.05)
        raise StartError(f"php-fpm does not listen on {sock}")

    run = modes.spawn(ctx, PHP_FPM, cmd, wd, 0, ctx.load_cpus, ready,
                      errlog=wd / "php-fpm.log")
    return run, sock, root


def entries(sock: Path, root: Path) -> list[tuple[str, str, dict | None, str]]:
    """(label, peer, config extras, request path): veloxy and nginx to the same php-fpm."""
    veloxy = (f'\n[[routes]]\npath = "/php/"\nupstream = "php"\n'
              f'fastcgi = {{ root = "{root}" }}\n'
              f'[upstreams.php]\nprotocol = "fastcgi"\nservers = ["unix:{sock}"]\n'
              f'keepalive = {KEEP}\nidle_timeout = "{IDLE_S}s"\npool_purge_delay = "0s"\n')
    nginx_http = (f"\n    upstream php {{\n        server unix:{sock};\n"
                  f"        keepalive {KEEP};\n        keepalive_timeout {IDLE_S}s;\n    }}\n")
    nginx_server = (f"\n        location /php/ {{\n            root {root};\n"
                    "            include /etc/nginx/fastcgi_params;\n"
                    "            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n"
                    "            fastcgi_keep_conn on;\n"
                    "            fastcgi_pass php;\n        }\n")
    return [("nginx-fastcgi", "nginx", {"HTTP_EXTRA": nginx_http, "SERVER_EXTRA": nginx_server},
             PATH),
            ("veloxy-fastcgi", "veloxy", {"ROUTE_EXTRA": veloxy}, PATH)]
