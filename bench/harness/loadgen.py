"""Load generators: wrk (closed loop, ceiling) and oha (fixed rate, latency-corrected)."""

from __future__ import annotations

import json
import math
import os
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
        method: str = "GET", body_file: Path | None = None, timeout_s: int = 4) -> dict:
    threads = max(1, min(threads, connections))
    duration = max(1, math.ceil(duration))  # wrk takes whole seconds only
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration}s",
           "--timeout", f"{timeout_s}s", "-s", str(WRK_LUA), url]
    env = {"WRK_METHOD": method, "WRK_BODY_FILE": str(body_file) if body_file else ""}
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
