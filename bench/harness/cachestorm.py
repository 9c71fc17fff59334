"""The miss storm of `bench/run --cache`: a counting upstream and a client that sends N requests
for one cold key at the same instant. Both run as their own (pinned) processes:

    python -m harness.cachestorm serve --listen 127.0.0.1:PORT [--delay-ms 200] [--body 1000]
    python -m harness.cachestorm storm --port PORT --path /storm/KEY [-n 500] [--timeout 15]

`serve` answers every GET after --delay-ms with a --body-byte body and `Cache-Control:
max-age=60` (HTTP/1.1, keep-alive), counting requests per target; `GET /_count` answers those
counts at once as JSON ({"target": n, ...}; never counted, `Cache-Control: no-store`). It prints
`listening ADDR` once bound, like veloxy-upstream.

`storm` opens N connections to 127.0.0.1:PORT first, then writes the same GET (Connection:
close) on every one of them in one go, then reads every answer to its end: N requests in
flight together, well within the upstream's delay. It prints one JSON line: the statuses, the
cache status headers (X-Cache / X-Cache-Status), errors and the latencies (from the write to
the end of the answer). Standard library only (asyncio).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import sys
import time
from urllib.parse import parse_qs, urlsplit

COUNT_PATH = "/_count"
MAX_HEAD = 64 * 1024


# --- pure helpers ---------------------------------------------------------------------------

def parse_request_head(head: bytes) -> tuple[str, str, int, bool]:
    """An HTTP/1.x request head (up to and including the blank line): (method, target,
    Content-Length, keep-alive after the answer). Raises ValueError on a malformed line."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"bad request line {lines[0][:80]!r}")
    method, target, version = parts
    fields = parse_fields(lines[1:])
    conn = fields.get("connection", "").lower()
    keep = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
    length = int(fields.get("content-length", "0") or 0)
    return method, target, length, keep


def parse_fields(lines: list[str]) -> dict[str, str]:
    """Header lines ("Name: value") -> {lowercase name: value} (the last one of a name wins)."""
    out = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out[name.strip().lower()] = value.strip()
    return out


def response(status: int, body: bytes, fields: dict[str, str], keep: bool) -> bytes:
    reason = {200: "OK", 400: "Bad Request"}.get(status, "Status")
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in fields.items()]
    if not keep:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def count_for(counts: dict[str, int], path: str) -> int:
    """Requests the upstream saw for `path`: its own count plus any variant of it (the same
    path with a query string added by a proxy)."""
    return sum(n for t, n in counts.items() if t == path or t.startswith(path + "?"))


def parse_response_head(head: bytes) -> tuple[int, dict[str, str]]:
    """(status, {lowercase field: value}) of an HTTP/1.x response head; status 0 if unreadable."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    try:
        status = int(parts[1]) if lines[0].startswith("HTTP/1.") and len(parts) > 1 else 0
    except ValueError:
        status = 0
    return status, parse_fields(lines[1:])


def cache_label(fields: dict[str, str]) -> str | None:
    """HIT or MISS (or another word: EXPIRED, STALE, UPDATING, ...) from a response's cache status
    field: X-Cache (veloxy, Varnish as set by the harness's VCL) or X-Cache-Status (nginx's
    $upstream_cache_status); None without one."""
    for name in ("x-cache", "x-cache-status"):
        v = fields.get(name)
        if v:
            word = v.split()[0].strip(",;").upper()
            return word or None
    return None


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (as wrk reports them)."""
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def summarize_storm(answers: list[dict], n: int, elapsed_s: float) -> dict:
    """One storm's answers ({"status", "cache", "ms", "bytes"} or {"error"}) -> statuses, cache
    labels, errors, latency percentiles (ms)."""
    statuses: collections.Counter = collections.Counter()
    labels: collections.Counter = collections.Counter()
    errors: collections.Counter = collections.Counter()
    lat = []
    body = collections.Counter()
    for a in answers:
        if a.get("error"):
            errors[a["error"]] += 1
            continue
        statuses[str(a["status"])] += 1
        labels[a.get("cache") or "none"] += 1
        body[a.get("bytes", 0)] += 1
        lat.append(a["ms"])
    return {"n": n, "answered": sum(statuses.values()), "statuses": dict(statuses),
            "cache": dict(labels), "errors": dict(errors), "body_bytes": dict(body),
            "ok": statuses.get("200", 0),
            "latency_ms": {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat) if lat else None,
                           "min": min(lat) if lat else None},
            "elapsed_s": round(elapsed_s, 3)}


# --- serve ----------------------------------------------------------------------------------

class Counter:
    def __init__(self, delay_s: float, body: bytes) -> None:
        self.delay_s = delay_s
        self.body = body
        self.counts: collections.Counter = collections.Counter()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                try:
                    method, target, length, keep = parse_request_head(head)
                except ValueError:
                    writer.write(response(400, b"bad request\n", {}, False))
                    await writer.drain()
                    return
                if length:
                    await reader.readexactly(length)
                if urlsplit(target).path == COUNT_PATH:
                    q = parse_qs(urlsplit(target).query).get("path")
                    data = ({q[0]: count_for(self.counts, q[0])} if q else dict(self.counts))
                    out = response(200, json.dumps(data).encode(),
                                   {"Content-Type": "application/json",
                                    "Cache-Control": "no-store"}, keep)
                else:
                    self.counts[target] += 1
                    await asyncio.sleep(self.delay_s)
                    out = response(200, b"" if method == "HEAD" else self.body,
                                   {"Content-Type": "application/octet-stream",
                                    "Cache-Control": "max-age=60"}, keep)
                writer.write(out)
                await writer.drain()
                if not keep:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()


async def serve(listen: str, delay_ms: float, body_bytes: int) -> None:
    host, _, port = listen.rpartition(":")
    c = Counter(delay_ms / 1000.0, (b"0123456789abcdef" * (body_bytes // 16 + 1))[:body_bytes])
    server = await asyncio.start_server(c.handle, host or "127.0.0.1", int(port), backlog=4096,
                                        limit=MAX_HEAD)
    addr = server.sockets[0].getsockname()
    print(f"listening {addr[0]}:{addr[1]}", flush=True)
    async with server:
        await server.serve_forever()


# --- storm ----------------------------------------------------------------------------------

async def _one(reader: asyncio.StreamReader, t_sent: float, timeout: float) -> dict:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status, fields = parse_response_head(head)
        n = int(fields.get("content-length", "-1"))
        body = await asyncio.wait_for(reader.readexactly(n) if n >= 0 else reader.read(), timeout)
    except TimeoutError:
        return {"error": "timeout"}
    except asyncio.IncompleteReadError:
        return {"error": "closed before the end of the answer"}
    except (ConnectionError, OSError, ValueError) as e:
        return {"error": type(e).__name__}
    return {"status": status, "cache": cache_label(fields), "bytes": len(body),
            "ms": (time.monotonic() - t_sent) * 1000.0}


async def storm(port: int, path: str, n: int, timeout: float) -> dict:
    t0 = time.monotonic()

    async def connect():
        try:
            return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port,
                                                                  limit=MAX_HEAD), timeout)
        except OSError as e:  # TimeoutError included
            return e

    conns = await asyncio.gather(*(connect() for _ in range(n)))
    connect_s = time.monotonic() - t0
    req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: veloxy-bench-storm\r\n"
           "Connection: close\r\n\r\n").encode()
    live = [c for c in conns if not isinstance(c, BaseException)]
    answers: list[dict] = [{"error": f"connect: {type(c).__name__}"} for c in conns
                           if isinstance(c, BaseException)]
    t_sent = time.monotonic()
    for _, w in live:  # every request written before any answer is read
        w.write(req)
    send_s = time.monotonic() - t_sent
    answers += await asyncio.gather(*(_one(r, t_sent, timeout) for r, _ in live))
    for _, w in live:
        w.close()
    out = summarize_storm(answers, n, time.monotonic() - t_sent)
    out.update({"connect_s": round(connect_s, 3), "send_s": round(send_s, 4), "path": path})
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.cachestorm")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--listen", default="127.0.0.1:0")
    s.add_argument("--delay-ms", type=float, default=200)
    s.add_argument("--body", type=int, default=1000)
    c = sub.add_parser("storm")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--path", required=True)
    c.add_argument("-n", type=int, default=500)
    c.add_argument("--timeout", type=float, default=15)
    a = p.parse_args(argv)
    if a.cmd == "serve":
        try:
            asyncio.run(serve(a.listen, a.delay_ms, a.body))
        except KeyboardInterrupt:
            pass
        return 0
    print(json.dumps(asyncio.run(storm(a.port, a.path, a.n, a.timeout))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
