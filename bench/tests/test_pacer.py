"""pacer (bench/pacer), the sweep ramp's fixed-rate generator, against a real HTTP/1.1
keep-alive server on 127.0.0.1: it keeps its rate, and a server stall shows in its corrected
latency (counted from when each request was due) but not in the uncorrected one."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import install, loadgen  # noqa: E402

SLOW_S = 0.04
BODY = b'{"ok":true}'
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


class Server:
    """One thread per connection; `stall(s)` makes every connection wait `s` seconds before
    its next answer (a server-wide pause, as a stop-the-world GC)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.paused_until = 0.0
        self.slow = lambda: False  # answers wait SLOW_S while this says so
        self.answered = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self, seconds: float) -> None:
        self.paused_until = time.monotonic() + seconds

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        with c:
            while True:
                try:
                    data = c.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    _, buf = buf.split(b"\r\n\r\n", 1)
                    wait = self.paused_until - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    if self.slow():
                        time.sleep(SLOW_S)
                    c.sendall(RESPONSE)
                    with self.lock:
                        self.answered += 1

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def pacer_bin(tmp_path_factory) -> str:
    cache = Path(tmp_path_factory.mktemp("pacer-cache"))
    tool = install.Installer(BENCH / ".cache" if (BENCH / ".cache").exists() else cache).pacer()
    if not tool.ok:
        pytest.skip(f"pacer could not be built: {tool.reason}")
    return tool.path


def test_keeps_its_rate_and_counts_a_stall_from_when_requests_were_due(pacer_bin):
    srv = Server()
    try:
        # A 300 ms server-wide stall 1 s into a 2 s run at 400 req/s over 4 connections: the
        # ~120 requests due during it wait in pacer (every connection is busy), so their
        # corrected latencies spread over 0-300 ms (~15% of the run), while only the 4 in
        # flight see it in their uncorrected latency.
        threading.Timer(1.2, srv.stall, args=(0.3,)).start()
        r = loadgen.pacer(f"http://127.0.0.1:{srv.port}/", rate=400, connections=4, duration=2,
                          cpus=[], binary=pacer_bin, warmup=0.2, timeout_s=2)
    finally:
        srv.close()
    assert r["errors"] == 0, r
    assert 0.95 * 400 <= r["rps"] <= 1.05 * 400, r
    assert r["latency_ms"]["p99"] >= 150, r["latency_ms"]
    assert r["uncorrected_latency_ms"]["p99"] < 100, r["uncorrected_latency_ms"]
    assert r["latency_ms"]["max"] >= 250, r["latency_ms"]


def test_a_refused_port_is_an_error(pacer_bin):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(loadgen.LoadError):
        loadgen.pacer(f"http://127.0.0.1:{port}/", rate=10, connections=1, duration=0.2,
                      cpus=[], binary=pacer_bin, warmup=0, timeout_s=1)


def test_phases_keep_apart_what_happened_in_their_windows(pacer_bin):
    """`-P 2 -W 0.4 -G 0.1`: windows of 0.4 s take phases 0 and 1 in turn. The server slows
    every answer by 40 ms in phase 1's windows (past their guard) (on the schedule pacer announces on stderr):
    phase 1's latencies show it, phase 0's do not, and each window's p99 is listed."""
    import json
    import re
    import subprocess

    srv = Server()
    cmd = [pacer_bin, f"http://127.0.0.1:{srv.port}/", "-c", "16", "-r", "200", "-d", "3.2",
           "-w", "0.2", "-t", "2", "-P", "2", "-W", "0.4", "-G", "0.1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = re.match(r"measure_from_monotonic ([0-9.]+)", proc.stderr.readline())
        assert m, "pacer did not announce its schedule"
        t0 = float(m.group(1))

        def slow_now() -> bool:
            # Slow in phase 1's windows past the guard only: an answer to a phase-0 request
            # due at the end of its window is never slowed by the next window.
            since = time.monotonic() - t0
            into = since % 0.4
            return since >= 0 and int(since / 0.4) % 2 == 1 and into >= 0.1

        srv.slow = slow_now
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        srv.close()
    assert proc.returncode == 0, err
    ph = json.loads(out.strip().splitlines()[-1])["phases"]
    fast, slow = ph["per_phase"]
    assert fast["answered"] > 150 and slow["answered"] > 150, ph
    assert fast["failed"] == 0 and slow["failed"] == 0, ph
    assert fast["latency_ms"]["p99"] < 30, fast
    assert slow["latency_ms"]["p50"] >= 35, slow
    assert len(ph["window_p99_ms"]) == 8, ph
    assert all(w >= 35 for w in ph["window_p99_ms"][1::2]), ph


def test_phases_want_a_window(pacer_bin):
    import subprocess

    r = subprocess.run([pacer_bin, "http://127.0.0.1:9/", "-r", "10", "-P", "2"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "-P and -W go together" in r.stderr, r.stderr
