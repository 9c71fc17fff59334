"""Child process management: process groups, pinning, readiness, cleanup.

Every child is started in its own session (so its own process group) and
registered; `REGISTRY.kill_all()` terminates every group that is still alive.
It runs on normal exit, on errors and on SIGINT/SIGTERM (see __main__).
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class StartError(RuntimeError):
    """A child process could not be started or did not become ready."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def pinned(cmd: list[str], cpus: list[int] | None) -> list[str]:
    """Prefix a command with taskset so it (and its children) run on `cpus`."""
    if not cpus:
        return cmd
    return ["taskset", "-c", cpu_list(cpus), *cmd]


class Registry:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def spawn(self, cmd: list[str], *, cpus: list[int] | None = None,
              env: dict[str, str] | None = None, log: Path | None = None,
              stdout=None, cwd: str | None = None) -> subprocess.Popen:
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        out = stdout
        err = subprocess.DEVNULL
        logf = None
        if log is not None:
            logf = open(log, "ab")
            err = logf
            if out is None:
                out = logf
        if out is None:
            out = subprocess.DEVNULL
        try:
            p = subprocess.Popen(pinned(cmd, cpus), stdout=out, stderr=err, env=full_env,
                                 cwd=cwd, start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as e:
            raise StartError(f"cannot execute {cmd[0]}: {e}") from e
        finally:
            if logf is not None:
                logf.close()
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen, grace: float = 3.0) -> None:
        """SIGTERM the whole process group, then SIGKILL after `grace` seconds."""
        pgid = p.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            if _wait_gone(p, pgid, wait):
                break
        if p in self.procs:
            self.procs.remove(p)

    def kill_all(self) -> None:
        for p in list(self.procs):
            self.stop(p, grace=1.5)


REGISTRY = Registry()


def group_alive(pgid: int) -> bool:
    return bool(session_pids(pgid))


def _wait_gone(p: subprocess.Popen, pgid: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        if p.poll() is not None and not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.03)


def _stat_fields(pid: str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm may contain spaces/parens: split after the last ')'
    rest = data[data.rfind(")") + 2:].split()
    return rest  # rest[0] is field 3 (state)


def session_pids(sid: int) -> list[int]:
    """All live (non-zombie) processes whose session id is `sid`."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        f = _stat_fields(name)
        if f is None or f[0] == "Z":
            continue
        # fields: state(3) ppid(4) pgrp(5) session(6)
        if int(f[3]) == sid:
            out.append(int(name))
    return out


def tree_pids(root: int) -> list[int]:
    """The session of `root` plus any descendants that left it."""
    parents: dict[int, list[int]] = {}
    sess = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        f = _stat_fields(name)
        if f is None or f[0] == "Z":
            continue
        pid = int(name)
        parents.setdefault(int(f[1]), []).append(pid)
        if int(f[3]) == root:
            sess.append(pid)
    seen = set(sess)
    stack = list(sess) + [root]
    while stack:
        for c in parents.get(stack.pop(), []):
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return sorted(seen)


def wait_port(port: int, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StartError(f"exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise StartError(f"not listening on 127.0.0.1:{port} after {timeout:.0f}s")


def url_context(url: str) -> ssl.SSLContext | None:
    """For https:// URLs of the proxies under test (a self-signed benchmark certificate):
    a TLS context that does not verify; None for http://."""
    if not url.startswith("https://"):
        return None
    c = ssl.create_default_context()
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    return c


def wait_http_ok(url: str, proc: subprocess.Popen | None, timeout: float,
                 need: int = 3) -> None:
    """Wait until `need` consecutive GETs of `url` (http:// or https://) return 2xx."""
    deadline = time.monotonic() + timeout
    ok = 0
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StartError(f"exited with code {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=2, context=url_context(url)) as r:
                r.read()
                if 200 <= r.status < 300:
                    ok += 1
                    if ok >= need:
                        return
                    continue
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except OSError as e:
            last = str(e)
        ok = 0
        time.sleep(0.1)
    raise StartError(f"{url} not answering 2xx after {timeout:.0f}s (last: {last})")


def tail(path: Path, lines: int = 8) -> str:
    try:
        data = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(data[-lines:])


def run_bounded(cmd: list[str], timeout: float, *, cpus: list[int] | None = None,
                env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run a bounded command (load generator) in its own group; kill it on timeout."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    p = subprocess.Popen(pinned(cmd, cpus), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=full_env, start_new_session=True, stdin=subprocess.DEVNULL)
    REGISTRY.procs.append(p)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        REGISTRY.stop(p, grace=1.0)
        out, err = p.communicate()
        return -9, out.decode(errors="replace"), err.decode(errors="replace") + \
            f"\n[harness] killed after {timeout:.0f}s timeout"
    except BaseException:
        REGISTRY.stop(p, grace=0.5)
        raise
    finally:
        if p in REGISTRY.procs:
            REGISTRY.procs.remove(p)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")
