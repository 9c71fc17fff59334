"""CPU and memory accounting from /proc.

- process CPU: utime+stime (fields 14+15 of /proc/PID/stat, in clock ticks)
  summed over every PID of a process tree;
- per-core busy %: deltas of /proc/stat `cpuN` lines (busy = total - idle - iowait);
- RSS: /proc/PID/statm resident pages * page size, summed over the tree.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read().decode(errors="replace")
        except OSError:
            continue
        rest = data[data.rfind(")") + 2:].split()
        # rest[0] is field 3; utime is field 14, stime field 15
        total += int(rest[11]) + int(rest[12])
    return total


def proc_rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def core_times() -> dict[int, tuple[int, int]]:
    """core -> (busy ticks, total ticks)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            parts = line.split()
            core = int(parts[0][3:])
            vals = [int(v) for v in parts[1:]]
            total = sum(vals[:8])  # user nice system idle iowait irq softirq steal
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
            out[core] = (total - idle, total)
    return out


def core_busy(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]) -> dict[int, float]:
    busy = {}
    for core, (b1, t1) in b.items():
        b0, t0 = a.get(core, (0, 0))
        dt = t1 - t0
        busy[core] = 100.0 * (b1 - b0) / dt if dt > 0 else 0.0
    return busy


class Sampler:
    """Samples a run in a background thread.

    `groups` maps a label ("proxy", "upstreams") to a callable returning the
    PIDs to account for (re-evaluated each sample so forked workers count).
    The totals (ticks over the whole window) are exact; the per-interval
    samples give max RSS and a time series.
    """

    def __init__(self, groups: dict[str, Callable[[], list[int]]], interval: float = 0.25):
        self.groups = groups
        self.interval = interval
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pids: dict[str, list[int]] = {}

    def _pid_sets(self) -> dict[str, list[int]]:
        for k, fn in self.groups.items():
            try:
                self._pids[k] = fn()
            except OSError:
                self._pids.setdefault(k, [])
        return self._pids

    def start(self) -> Sampler:
        pids = self._pid_sets()
        self.t0 = time.monotonic()
        self.cores0 = core_times()
        self.ticks0 = {k: proc_ticks(v) for k, v in pids.items()}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        prev_t, prev_cores = self.t0, self.cores0
        prev_ticks = dict(self.ticks0)
        while not self._stop.wait(self.interval):
            pids = self._pid_sets()
            t, cores = time.monotonic(), core_times()
            ticks = {k: proc_ticks(v) for k, v in pids.items()}
            dt = t - prev_t
            s = {"t": round(t - self.t0, 3), "cores": core_busy(prev_cores, cores)}
            for k, v in pids.items():
                s[f"{k}_cpu"] = 100.0 * (ticks[k] - prev_ticks.get(k, 0)) / CLK_TCK / dt if dt else 0
                s[f"{k}_rss"] = proc_rss(v)
            self.samples.append(s)
            prev_t, prev_cores, prev_ticks = t, cores, ticks

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        pids = self._pid_sets()
        elapsed = time.monotonic() - self.t0
        cores = core_busy(self.cores0, core_times())
        out: dict = {"elapsed_s": elapsed, "core_busy": {str(c): round(v, 1) for c, v in cores.items()}}
        for k, v in pids.items():
            ticks = proc_ticks(v) - self.ticks0.get(k, 0)
            out[f"{k}_cpu_s"] = ticks / CLK_TCK
            out[f"{k}_cpu_pct"] = 100.0 * ticks / CLK_TCK / elapsed if elapsed else 0.0
            rss = [s.get(f"{k}_rss", 0) for s in self.samples] or [proc_rss(v)]
            out[f"{k}_rss_max_mb"] = round(max(rss) / 1e6, 1)
        return out


def bottleneck(core_busy_pct: dict[str, float], roles: dict[int, str]) -> str:
    """Describe the busiest core, e.g. 'core 1 (load+upstreams) 99%'."""
    if not core_busy_pct:
        return "?"
    core, pct = max(core_busy_pct.items(), key=lambda kv: kv[1])
    role = roles.get(int(core), "other")
    return f"core {core} ({role}) {pct:.0f}%"
