"""Terminal progress output."""

from __future__ import annotations

import sys
import time

T0 = time.monotonic()


def fmt_s(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 60:02d}:{s % 60:02d}"


def say(msg: str) -> None:
    print(f"[{fmt_s(time.monotonic() - T0)}] {msg}", file=sys.stderr, flush=True)


def warn(msg: str) -> None:
    say(f"WARNING: {msg}")


class Progress:
    """Tracks estimated work left (seconds) and prints one line per step."""

    def __init__(self, total_estimate: float):
        self.left = total_estimate
        self.t_start = time.monotonic()
        self.done_est = 0.0

    def add(self, seconds: float) -> None:
        self.left += seconds

    def step(self, what: str, estimate: float) -> None:
        elapsed = time.monotonic() - self.t_start
        # Scale the remaining estimate by how accurate the estimates were so far.
        ratio = elapsed / self.done_est if self.done_est > 5 else 1.0
        ratio = min(max(ratio, 0.8), 2.0)
        say(f"[~{fmt_s(self.left * ratio)} left] {what}")
        self._cur = estimate

    def finish_step(self) -> None:
        est = getattr(self, "_cur", 0.0)
        self.left = max(0.0, self.left - est)
        self.done_est += est
        self._cur = 0.0
