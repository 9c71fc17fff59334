"""Load generators: wrk (closed loop, ceiling), oha (fixed rate, latency-corrected), pacer
(bench/pacer: fixed rate, latency-corrected, cheap enough for the ramp's upper steps) and
h2load (HTTP/2, several streams per connection)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from . import procs

BENCH = Path(__file__).resolve().parent.parent
WRK_LUA = BENCH / "lua" / "report.lua"


class LoadError(RuntimeError):
    pass


def parse_wrk(stdout: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("WRKJSON "):
            d = json.loads(line[len("WRKJSON "):])
            break
    else:
        raise LoadError("wrk printed no WRKJSON summary:\n" + stdout[-800:])
    dur = d["duration_us"] / 1e6 or 1e-9
    e = d["errors"]
    socket_errors = e["connect"] + e["read"] + e["write"] + e["timeout"]
    lat = d["latency_us"]
    return {
        "tool": "wrk",
        "duration_s": dur,
        "requests": d["requests"],
        "rps": d["requests"] / dur,
        "bytes": d["bytes"],
        "transfer_bps": d["bytes"] / dur,
        "non2xx": e["status"],
        "socket_errors": socket_errors,
        "errors_detail": e,
        "errors": e["status"] + socket_errors,
        "latency_ms": {k: (v / 1000.0 if d["requests"] else None) for k, v in lat.items()},
    }


def wrk(url: str, *, connections: int, duration: float, threads: int, cpus: list[int],
        method: str = "GET", body_file: Path | None = None, timeout_s: int = 4,
        headers: list[str] | None = None, script: Path | None = None,
        env: dict[str, str] | None = None) -> dict:
    """`script`: another wrk Lua script (it must print the WRKJSON line, e.g. by loading
    lua/report.lua with dofile); default lua/report.lua. `env`: more environment for it."""
    threads = max(1, min(threads, connections))
    duration = max(1, math.ceil(duration))  # wrk takes whole seconds only
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration}s",
           "--timeout", f"{timeout_s}s", "-s", str(script or WRK_LUA)]
    for h in headers or []:
        cmd += ["-H", h]
    cmd.append(url)
    env = {"WRK_METHOD": method, "WRK_BODY_FILE": str(body_file) if body_file else "",
           **(env or {})}
    rc, out, err = procs.run_bounded(cmd, timeout=duration + 30, cpus=cpus, env=env)
    if rc != 0:
        raise LoadError(f"wrk exited {rc}: {(err or out)[-600:]}")
    return parse_wrk(out)


def parse_oha(text: str, offered_rps: float | None = None) -> dict:
    d = json.loads(text)
    s = d["summary"]
    lat = d.get("latencyPercentiles") or {}
    codes = {str(k): int(v) for k, v in (d.get("statusCodeDistribution") or {}).items()}
    errs = {str(k): int(v) for k, v in (d.get("errorDistribution") or {}).items()}
    responses = sum(codes.values())
    non2xx = sum(v for k, v in codes.items() if not k.startswith("2"))
    # Requests still in flight when the run's deadline hits are not failures.
    deadline = sum(v for k, v in errs.items() if "deadline" in k)
    failed = sum(errs.values()) - deadline
    timeouts = sum(v for k, v in errs.items() if "timeout" in k.lower())
    total = responses + failed
    dur = float(s.get("total") or 0) or 1e-9
    ok = responses - non2xx
    # With --stats-success-breakdown: percentiles of the 2xx responses alone (oha's
    # "successful"), i.e. the admitted requests when a proxy refuses some with 503/429.
    ok_lat = d.get("latencyPercentilesSuccessful")
    return {
        "tool": "oha",
        "offered_rps": offered_rps,
        "duration_s": dur,
        "requests": total,
        "rps": responses / dur,
        "ok_rps": ok / dur,
        "bytes": int(s.get("totalData") or 0),
        "transfer_bps": float(s.get("sizePerSec") or 0),
        "non2xx": non2xx,
        "socket_errors": failed,
        "timeouts": timeouts,
        "errors": non2xx + failed,
        "error_rate": (non2xx + failed) / total if total else 1.0,
        "errors_detail": errs,
        "status_codes": codes,
        "deadline_aborted": deadline,
        "latency_ms": {**_ms(lat), "max": float(s["slowest"]) * 1000.0 if s.get("slowest") else None},
        "ok_latency_ms": _ms(ok_lat) if ok_lat is not None else None,
    }


def _ms(pcts: dict) -> dict:
    return {k: (v * 1000.0 if v is not None else None) for k, v in pcts.items()}


def oha(url: str, *, rate: float, connections: int, duration: float, cpus: list[int],
        method: str = "GET", body_file: Path | None = None, timeout_s: float = 2,
        binary: str = "oha", breakdown: bool = False) -> dict:
    cmd = [binary, "-z", f"{duration:g}s", "-c", str(connections), "-q", f"{rate:.0f}",
           "--latency-correction", "--no-tui", "--output-format", "json",
           "-t", f"{timeout_s:g}s", "-m", method]
    if breakdown:
        cmd.append("--stats-success-breakdown")
    if body_file is not None:
        cmd += ["-D", str(body_file), "-H", "Content-Type: application/json"]
    cmd.append(url)
    threads = max(1, len(cpus))
    env = {"TOKIO_WORKER_THREADS": str(threads)}
    rc, out, err = procs.run_bounded(cmd, timeout=duration + 30, cpus=cpus, env=env)
    if rc != 0:
        raise LoadError(f"oha exited {rc}: {(err or out)[-600:]}")
    try:
        return parse_oha(out, offered_rps=rate)
    except (ValueError, KeyError) as e:
        raise LoadError(f"cannot parse oha output ({e}): {out[-400:]}") from e


def parse_pacer(text: str) -> dict:
    """pacer's one JSON line (bench/pacer): the same keys as parse_oha's where they exist."""
    d = json.loads(text)
    e = d["errors"]
    failed = e["connect"] + e["read"] + e["timeout"]
    total = d["requests"]
    return {
        "tool": "pacer",
        "offered_rps": d["offered_rps"],
        "duration_s": d["duration_s"],
        "requests": total,
        "rps": d["rps"],
        "ok_rps": d["ok"] / d["duration_s"],
        "non2xx": d["non2xx"],
        "socket_errors": failed,
        "timeouts": e["timeout"],
        "errors": d["non2xx"] + failed,
        "error_rate": (d["non2xx"] + failed) / total if total else 1.0,
        "errors_detail": e,
        "unsent_at_end": d["unsent_at_end"],
        "generator_cpu_busy": d["cpu_busy"],
        "latency_ms": d["latency_ms"] or {},
        "uncorrected_latency_ms": d["uncorrected_latency_ms"] or {},
        "send_lag_ms": d["send_lag_ms"] or {},
    }


def pacer(url: str, *, rate: float, connections: int, duration: float, cpus: list[int],
          binary: str, warmup: float = 1, timeout_s: float = 2) -> dict:
    """pacer (bench/pacer): GET `url` at a fixed `rate` over `connections` keep-alive
    connections, latency counted from when each request was due (see its crate doc)."""
    cmd = [binary, url, "-c", str(connections), "-r", f"{rate:.0f}", "-d", f"{duration:g}",
           "-w", f"{warmup:g}", "-t", f"{timeout_s:g}"]
    rc, out, err = procs.run_bounded(cmd, timeout=warmup + duration + 30, cpus=cpus)
    if rc != 0:
        raise LoadError(f"pacer exited {rc}: {(err or out)[-600:]}")
    try:
        return parse_pacer(out)
    except (ValueError, KeyError) as e:
        raise LoadError(f"cannot parse pacer output ({e}): {out[-400:]}") from e


_H2_SIZE = re.compile(r"^([0-9.]+)(us|ms|s)$")


def _h2_duration_ms(text: str) -> float | None:
    m = _H2_SIZE.match(text.strip())
    if not m:
        return None
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def percentiles(values: list[float], qs=(50, 75, 90, 99, 99.9)) -> dict:
    """Nearest-rank percentiles (as wrk and oha report them) of `values`, keyed "p50"..."""
    if not values:
        return {f"p{q:g}": None for q in qs}
    xs = sorted(values)
    n = len(xs)
    return {f"p{q:g}": xs[min(n - 1, max(0, math.ceil(q / 100 * n) - 1))] for q in qs}


def parse_h2load_log(text: str) -> dict:
    """h2load --log-file: one line per request, tab-separated: start time (us since the
    epoch), HTTP status (-1 when the stream failed), request duration (us). Latency
    percentiles in ms over the completed requests, and the status counts."""
    lat: list[float] = []
    statuses: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        try:
            status, us = int(parts[1]), int(parts[2])
        except ValueError:
            continue
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status > 0:
            lat.append(us / 1000.0)
    out = percentiles(lat)
    out["max"] = max(lat) if lat else None
    out["mean"] = sum(lat) / len(lat) if lat else None
    return {"latency_ms": out, "logged": len(lat), "log_statuses": statuses}


def parse_h2load(stdout: str) -> dict:
    """h2load's summary: requests/s, request counts and failures, status classes, bytes,
    the TLS protocol/cipher/ALPN it negotiated and its request-time min/max/mean/sd."""
    m = re.search(r"^finished in ([0-9.]+)(us|ms|s), ([0-9.]+) req/s", stdout, re.M)
    req = re.search(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", stdout, re.M)
    codes = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", stdout, re.M)
    if not (m and req and codes):
        raise LoadError("h2load printed no summary:\n" + stdout[-800:])
    total, started, done, ok, failed, errored, timeout = (int(x) for x in req.groups())
    c2, c3, c4, c5 = (int(x) for x in codes.groups())
    traffic = re.search(r"^traffic: \S+ \((\d+)\) total", stdout, re.M)
    nbytes = int(traffic.group(1)) if traffic else 0
    # "traffic: T (N) total, H (N) headers (space savings X%), D (N) data": header bytes
    # (HPACK-encoded) and DATA payload bytes (response bodies as sent: compressed if the
    # server compressed them; h2load decodes nothing).
    hb = re.search(r"^traffic: .*?, \S+ \((\d+)\) headers", stdout, re.M)
    db = re.search(r"^traffic: .*?, \S+ \((\d+)\) data", stdout, re.M)

    def field(name: str) -> str | None:
        f = re.search(rf"^{re.escape(name)}: (.+)$", stdout, re.M)
        return f.group(1).strip() if f else None

    times = {}
    for key, label in (("request", "time for request"), ("connect", "time for connect"),
                       ("ttfb", "time to 1st byte")):
        t = re.search(rf"^{label}:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", stdout, re.M)
        if t:
            times[key] = dict(zip(("min", "max", "mean", "sd"),
                                  (_h2_duration_ms(x) for x in t.groups()), strict=True))
    rps = float(m.group(3))
    dur = done / rps if rps else 0.0
    req_t = times.get("request", {})
    non2xx = c3 + c4 + c5
    return {
        "tool": "h2load",
        "duration_s": dur,
        "requests": done,
        "rps": rps,
        "bytes": nbytes,
        "header_bytes": int(hb.group(1)) if hb else None,
        "data_bytes": int(db.group(1)) if db else None,
        "transfer_bps": nbytes / dur if dur else 0.0,
        "non2xx": non2xx,
        # h2load's "failed" = non-2xx/3xx statuses + "errored" (streams that got no response);
        # "timeout" counts connections closed by -N. Socket-level errors: errored + timeout.
        "socket_errors": errored + timeout,
        "errors": non2xx + errored + timeout,
        "errors_detail": {"started": started, "failed": failed, "errored": errored,
                          "timeout": timeout, "total": total},
        "status_classes": {"2xx": c2, "3xx": c3, "4xx": c4, "5xx": c5},
        "tls": {"protocol": field("TLS Protocol"), "cipher": field("Cipher"),
                "key_exchange": field("Server Temp Key"), "alpn": field("Application protocol")},
        "h2load_times_ms": times,
        "latency_ms": {"mean": req_t.get("mean"), "max": req_t.get("max")},
    }


def h2load(url: str | list[str], *, clients: int, streams: int, duration: float, threads: int,
           cpus: list[int], log_file: Path | None = None, h1: bool = False,
           timeout_s: float = 4, headers: list[str] | None = None) -> dict:
    """h2load for `duration` seconds: `clients` connections, `streams` concurrent requests
    on each (-m). With `log_file`, the latency percentiles come from its per-request log
    (h2load itself prints only min/max/mean/sd). Several URLs (same scheme, host and port):
    each connection requests them in turn, round robin. `headers`: extra request headers
    ("name: value", h2load -H)."""
    threads = max(1, min(threads, clients))
    cmd = ["h2load", "-c", str(clients), "-m", str(streams), "-t", str(threads),
           "-D", f"{max(1, math.ceil(duration))}", "-N", f"{timeout_s:g}s"]
    if h1:
        cmd.append("--h1")
    if log_file is not None:
        cmd += ["--log-file", str(log_file)]
    for h in headers or []:
        cmd += ["-H", h]
    cmd += [url] if isinstance(url, str) else list(url)
    rc, out, err = procs.run_bounded(cmd, timeout=duration + 30, cpus=cpus)
    if rc != 0:
        raise LoadError(f"h2load exited {rc}: {(err or out)[-600:]}")
    res = parse_h2load(out)
    if log_file is not None and log_file.exists():
        try:
            lg = parse_h2load_log(log_file.read_text(errors="replace"))
        finally:
            log_file.unlink()
        res["latency_ms"].update(lg["latency_ms"])
        res["log_statuses"] = lg["log_statuses"]
    if not res["requests"]:
        raise LoadError("h2load completed no request: " + (err or out)[-600:])
    return res


def make_body(cache: Path, size: int) -> Path:
    """A JSON-ish bulk body of exactly `size` bytes (NDJSON lines), cached."""
    path = cache / "bodies" / f"bulk-{size}.ndjson"
    if path.exists() and path.stat().st_size == size:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    line = b'{"index":{"_index":"bench"}}\n{"title":"veloxy bench document","n":12345}\n'
    data = (line * (size // len(line) + 1))[:size]
    if size:
        data = data[:-1] + b"\n"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path
