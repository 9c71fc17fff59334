"""The proxies under test, their configs (templates in bench/peers/) and start-up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import procs
from .procs import StartError

BENCH = Path(__file__).resolve().parent.parent
PEERS_DIR = BENCH / "peers"

# Order in which proxies appear in runs, tables and charts.
ALL_PROXIES = ["veloxy", "nginx", "haproxy", "envoy", "caddy", "pingora", "traefik"]
DIRECT = "direct"  # one upstream answering straight, pinned where the proxy would run


PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
ALONE = re.compile(r"^([ \t]*)\{\{([A-Z_]+)\}\}[ \t]*$")


def render(template: str, values: dict[str, object]) -> str:
    """Fill `{{NAME}}` placeholders; every placeholder must be known.

    A placeholder alone on an indented line is a snippet slot: an empty value removes
    the line (so optional snippets leave the default config byte-identical) and a
    multi-line value gets every line indented like the placeholder."""
    def value(key: str) -> str:
        if key not in values:
            raise KeyError(f"template placeholder {{{{{key}}}}} has no value")
        return str(values[key])

    out = []
    for line in template.splitlines(keepends=True):
        m = ALONE.match(line.rstrip("\n"))
        if m and m.group(1):
            text = value(m.group(2)).strip("\n")
            if text:
                out.append("".join(m.group(1) + x if x.strip() else x
                                   for x in text.splitlines(keepends=True)) + "\n")
            continue
        out.append(PLACEHOLDER.sub(lambda m: value(m.group(1)), line))
    return "".join(out)


def placeholders(name: str) -> set[str]:
    return set(PLACEHOLDER.findall((PEERS_DIR / name).read_text()))


def render_file(name: str, dest: Path, values: dict[str, object],
                extra: dict[str, object] | None = None) -> Path:
    """Render bench/peers/NAME into dest. `extra` (from a scenario) overrides values;
    each of its keys must be a placeholder of this template (a typo is an error)."""
    extra = extra or {}
    unknown = set(extra) - placeholders(name)
    if unknown:
        raise KeyError(f"{name} has no placeholder(s) {sorted(unknown)}")
    text = render((PEERS_DIR / name).read_text(), {**values, **extra})
    dest.write_text(text)
    return dest


@dataclass
class Running:
    name: str
    port: int
    proc: subprocess.Popen
    workdir: Path
    log: Path
    note: str = ""
    started_s: float = 0.0
    xff: bool | None = None
    scheme: str = "http"  # "https" when a scenario's settings serve TLS (tls scenario)

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def pids(self) -> list[int]:
        return procs.tree_pids(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Upstreams:
    addrs: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def pids(self) -> list[int]:
        out: list[int] = []
        for p in self.procs:
            out += procs.tree_pids(p.pid)
        return out


def start_upstream(binary: str, name: str, cpus: list[int], workdir: Path,
                   listen: str = "127.0.0.1:0", timeout: float = 10) -> tuple[subprocess.Popen, str]:
    out = workdir / f"upstream-{name}.out"
    log = workdir / f"upstream-{name}.log"
    with open(out, "wb") as f:
        p = procs.REGISTRY.spawn([binary, "--listen", listen, "--name", name], cpus=cpus,
                                 stdout=f, log=log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in out.read_text(errors="replace").splitlines():
            if line.startswith("listening "):
                return p, line.split()[1]
        if p.poll() is not None:
            raise StartError(f"upstream {name} exited {p.returncode}: {procs.tail(log)}")
        time.sleep(0.05)
    procs.REGISTRY.stop(p)
    raise StartError(f"upstream {name} printed no 'listening ADDR' line in {timeout:.0f}s")


def start_upstreams(binary: str, n: int, cpus: list[int], workdir: Path) -> Upstreams:
    ups = Upstreams()
    for i in range(n):
        p, addr = start_upstream(binary, f"u{i + 1}", cpus, workdir)
        procs.wait_http_ok(f"http://{addr}/", p, timeout=10, need=1)
        ups.procs.append(p)
        ups.addrs.append(addr)
    return ups


# --- per-proxy command builders -------------------------------------------------
# Each returns (argv, env) after writing its config into `wd`.
# Keep-alive: ctx.keepalive idle upstream connections per backend (and per worker
# where the pool is per worker), as veloxy's `keepalive` means. Proxies whose knob
# is a total over all backends (nginx `keepalive`, Pingora's pool, Caddy's
# keepalive_idle_conns) get keepalive x number of backends.

def _maxconn(ctx) -> int:
    """Connection limit that fits the fd limit (each proxied connection uses two fds), unless
    the mode set its own (`--sweep`: up to the fd limit, so 10000 clients fit)."""
    if getattr(ctx, "maxconn", None):  # test contexts are plain namespaces
        return ctx.maxconn
    return max(1024, min(50000, (ctx.nofile - 200) // 2))


def _nginx(ctx, wd: Path, port: int, ups: list[str], extra=None, template=None):
    servers = "\n".join(f"        server {a};" for a in ups)
    conf = render_file(template or "nginx.conf.tmpl", wd / "nginx.conf", {
        "WORKERS": ctx.workers, "WORKDIR": wd, "PORT": port, "SERVERS": servers,
        "KEEPALIVE": ctx.keepalive * len(ups), "NOFILE": ctx.nofile, "MAXCONN": _maxconn(ctx),
        "HTTP_EXTRA": "", "LOCATION_EXTRA": "", "SERVER_EXTRA": "", "LISTEN_OPTS": ""}, extra)
    return [ctx.tools["nginx"], "-p", f"{wd}/", "-e", str(wd / "error.log"), "-c", str(conf)], {}


def _haproxy(ctx, wd: Path, port: int, ups: list[str], extra=None):
    servers = "\n".join(f"    server u{i + 1} {a}" for i, a in enumerate(ups))
    conf = render_file("haproxy.cfg.tmpl", wd / "haproxy.cfg", {
        "WORKERS": ctx.workers, "WORKDIR": wd, "PORT": port, "SERVERS": servers,
        # HAProxy reserves two descriptors per connection and refuses to start when the fd
        # limit cannot hold 2 x maxconn: it keeps the default share whatever the mode asks.
        "KEEPALIVE": ctx.keepalive, "MAXCONN": max(1024, (ctx.nofile - 200) // 2),
        "BACKEND_EXTRA": "", "BIND_OPTS": ""},
        extra)
    return [ctx.tools["haproxy"], "-db", "-f", str(conf)], {}


def _envoy(ctx, wd: Path, port: int, ups: list[str], extra=None):
    eps = []
    for a in ups:
        host, p = a.rsplit(":", 1)
        eps.append(f"        - endpoint: {{address: {{socket_address: {{address: {host}, "
                   f"port_value: {p}}}}}}}")
    conf = render_file("envoy.yaml.tmpl", wd / "envoy.yaml", {
        "PORT": port, "ENDPOINTS": "\n".join(eps),
        "CB_CONNECTIONS": 100000, "CB_PENDING": 100000, "CB_REQUESTS": 100000}, extra)
    return [ctx.tools["envoy"], "-c", str(conf), "--concurrency", str(ctx.workers),
            "--log-level", "error", "--disable-hot-restart"], {}


def _go_env(ctx, wd: Path) -> dict[str, str]:
    return {"GOMAXPROCS": str(ctx.workers), "HOME": str(wd), "XDG_DATA_HOME": str(wd / "data"),
            "XDG_CONFIG_HOME": str(wd / "config")}


def _caddy(ctx, wd: Path, port: int, ups: list[str], extra=None, template=None):
    conf = render_file(template or "Caddyfile.tmpl", wd / "Caddyfile", {
        "PORT": port, "UPSTREAMS": " ".join(ups), "KEEPALIVE": ctx.keepalive,
        "KEEPALIVE_TOTAL": ctx.keepalive * len(ups), "PROXY_EXTRA": "", "SCHEME": "http",
        "GLOBAL_EXTRA": "", "SITE_EXTRA": ""}, extra)
    return [ctx.tools["caddy"], "run", "--config", str(conf), "--adapter", "caddyfile"], \
        _go_env(ctx, wd)


def _traefik(ctx, wd: Path, port: int, ups: list[str], extra=None):
    servers = "\n".join(f'          - url: "http://{a}"' for a in ups)
    render_file("traefik-dynamic.yml.tmpl", wd / "dynamic.yml", {
        "SERVERS": servers, "HTTP_EXTRA": "", "ROUTER_EXTRA": ""}, extra)
    conf = render_file("traefik.yml.tmpl", wd / "traefik.yml", {
        "PORT": port, "WORKDIR": wd, "KEEPALIVE": ctx.keepalive})
    return [ctx.tools["traefik"], f"--configFile={conf}"], _go_env(ctx, wd)


def _pingora(ctx, wd: Path, port: int, ups: list[str], extra=None):
    if extra:
        raise KeyError(f"the Pingora peer has no config template (extra settings {sorted(extra)})")
    cmd = [ctx.tools["pingora"], "--listen", f"127.0.0.1:{port}", "--threads", str(ctx.workers),
           "--keepalive", str(ctx.keepalive * len(ups)), "--pid-file", str(wd / "pingora.pid")]
    for a in ups:
        cmd += ["--to", a]
    return cmd, {}


def _veloxy(ctx, wd: Path, port: int, ups: list[str], extra=None, template=None):
    if getattr(ctx, "veloxy_cli", False) and not extra and not template:
        cmd = [ctx.tools["veloxy"], "proxy", "--listen", f"127.0.0.1:{port}",
               "--workers", str(ctx.workers), "--keepalive", str(ctx.keepalive)]
        for a in ups:
            cmd += ["--to", a]
        return cmd, {}
    conf = render_file(template or "veloxy.toml.tmpl", wd / "veloxy.toml", {
        "WORKERS": ctx.workers, "PORT": port, "KEEPALIVE": ctx.keepalive,
        "SERVERS": ", ".join(f'"{a}"' for a in ups), "ROUTE_EXTRA": "", "UPSTREAM_EXTRA": "",
        "SERVER_EXTRA": "", "LISTENER_EXTRA": ""},
        extra)
    return [ctx.tools["veloxy"], "run", "--config", str(conf)], {}


def _direct(ctx, wd: Path, port: int, ups: list[str], extra=None):
    return [ctx.tools["upstream"], "--listen", f"127.0.0.1:{port}", "--name", "direct"], {}


BUILDERS = {
    "veloxy": _veloxy, "nginx": _nginx, "haproxy": _haproxy, "envoy": _envoy,
    "caddy": _caddy, "pingora": _pingora, "traefik": _traefik, DIRECT: _direct,
}
STARTUP_TIMEOUT = {"envoy": 30, "traefik": 30, "caddy": 20}
# Peers whose builder takes another template (a scenario's TEMPLATES, e.g. static files).
TEMPLATED = ("veloxy", "nginx", "caddy")


def start(ctx, name: str, extra: dict[str, object] | None = None,
          scheme: str = "http", template: str | None = None) -> Running:
    """Start one proxy (or the direct upstream) pinned to the proxy cores, wait until
    GET / through it returns 2xx. `extra` fills a scenario's optional config snippets
    (placeholders of the proxy's template, see bench/peers/); `scheme` = "https" when
    those settings make it serve TLS (the readiness probes then speak TLS); `template`
    replaces the peer's config template (a file in bench/peers/, rendered with the same
    values plus `extra`), e.g. a web-server config for the static scenario."""
    if template and name not in TEMPLATED:
        raise StartError(f"{name} takes no other config template (asked for {template})")
    ctx.seq += 1
    wd = ctx.tmp / f"{name}-{ctx.seq}"
    wd.mkdir(parents=True)
    port = procs.free_port()
    try:
        kw = {"template": template} if template else {}
        cmd, env = BUILDERS[name](ctx, wd, port, ctx.upstreams.addrs, extra, **kw)
    except KeyError as e:
        raise StartError(f"bad scenario settings for {name}: {e}") from e
    (wd / "command.txt").write_text(" ".join(cmd) + "\n")
    log = wd / "output.log"
    t0 = time.monotonic()
    p = procs.REGISTRY.spawn(cmd, cpus=ctx.proxy_cpus, env=env, log=log, cwd=str(wd))
    run = Running(name, port, p, wd, log, scheme=scheme)
    try:
        timeout = STARTUP_TIMEOUT.get(name, 15)
        procs.wait_port(port, p, timeout)
        procs.wait_http_ok(run.base_url + "/", p, timeout)
    except StartError as e:
        procs.REGISTRY.stop(p)
        if name == "veloxy" and not extra and not template and scheme == "http" \
                and not getattr(ctx, "veloxy_cli", False):
            # Fall back to the flag form if this veloxy build has no config mode.
            ctx.veloxy_cli = True
            try:
                r = start(ctx, name)
                r.note = f"config mode failed ({e}); used `veloxy proxy` flags"
                return r
            except StartError:
                ctx.veloxy_cli = False
        raise StartError(f"{e}\n--- {log} ---\n{procs.tail(log)}") from e
    run.started_s = time.monotonic() - t0
    run.xff = None if template else check_xff(run.base_url)
    return run


def check_xff(base_url: str) -> bool | None:
    """Does the proxy add X-Forwarded-For? Uses the test upstream's /echo route, which
    answers with the raw request head it received. None if /echo is not available."""
    try:
        with urllib.request.urlopen(base_url + "/echo", timeout=3,
                                    context=procs.url_context(base_url)) as r:
            head = r.read(65536).decode(errors="replace").lower()
    except (OSError, ValueError):
        return None
    if not head.startswith("get /echo"):
        return None
    return "\nx-forwarded-for:" in head


def kill_upstream(ups: Upstreams, i: int) -> None:
    """SIGKILL upstream i (a crash: no graceful close) and reap it."""
    p = ups.procs[i]
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=5)


def restart_upstream(binary: str, ups: Upstreams, i: int, cpus: list[int], workdir: Path) -> None:
    """Start upstream i again on the same address (it binds with SO_REUSEADDR)."""
    old = ups.procs[i]
    p, addr = start_upstream(binary, f"u{i + 1}", cpus, workdir, listen=ups.addrs[i])
    if addr != ups.addrs[i]:
        procs.REGISTRY.stop(p)
        raise StartError(f"upstream u{i + 1} came back on {addr}, not {ups.addrs[i]}")
    ups.procs[i] = p
    if old in procs.REGISTRY.procs:
        procs.REGISTRY.procs.remove(old)


def stop(run: Running | None) -> None:
    if run is not None:
        procs.REGISTRY.stop(run.proc)
