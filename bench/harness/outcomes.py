"""What clients got, from an oha result: 2xx, refusals (503/429), other statuses,
timeouts and connection errors. Pure functions (unit-tested), used by the failover and
overload scenarios."""

from __future__ import annotations

from .measure import fmt_ms

# Statuses a proxy answers when it sheds load on purpose (veloxy, HAProxy and nginx
# limit_conn answer 503, Traefik's inFlightReq 429).
REFUSAL_CODES = ("503", "429")
KINDS = ("ok", "refused", "other_5xx", "other_status", "timeouts", "conn_refused",
         "conn_closed", "other_errors", "unsent")
LABELS = {
    "ok": "2xx", "refused": "503/429", "other_5xx": "other 5xx", "other_status": "3xx/4xx",
    "timeouts": "client timeouts", "conn_refused": "connections refused",
    "conn_closed": "connections closed/reset", "other_errors": "other errors",
    "unsent": "not sent (every client connection busy)",
}


def error_kind(msg: str) -> str | None:
    """Bucket one of oha's error strings; None for requests cut by the run's deadline."""
    m = msg.lower()
    if "deadline" in m:
        return None
    if "timeout" in m or "timed out" in m:
        return "timeouts"
    if "refused" in m:
        return "conn_refused"
    if any(x in m for x in ("reset", "closed", "broken pipe", "incomplete", "eof", "aborted")):
        return "conn_closed"
    return "other_errors"


def classify(codes: dict[str, int], errors: dict[str, int], planned: int | None = None,
             slack: int = 0) -> dict:
    """Counts per kind (see KINDS), total requests (deadline aborts excluded) and
    availability = share of 2xx among them.

    `planned` = offered rate x duration. oha at a fixed rate only sends a request when a
    connection is free; requests still waiting for one at the end of the run are in no
    count, so a proxy that stalls every connection would look fine. Those are counted
    as "unsent" (planned - slack - deadline aborts - requests done), and they count as
    failures. `slack`: the requests scheduled in the last few ms, which the end of the run
    drops whatever the proxy does (oha's own scheduling lag)."""
    out = dict.fromkeys(KINDS, 0)
    deadline = 0
    for code, n in codes.items():
        code = str(code)
        if code.startswith("2"):
            out["ok"] += n
        elif code in REFUSAL_CODES:
            out["refused"] += n
        elif code.startswith("5"):
            out["other_5xx"] += n
        else:
            out["other_status"] += n
    for msg, n in errors.items():
        kind = error_kind(msg)
        if kind:
            out[kind] += n
        else:
            deadline += n
    if planned:
        out["unsent"] = max(0, planned - slack - deadline - sum(out.values()))
    total = sum(out.values())
    out["total"] = total
    out["availability"] = out["ok"] / total if total else None
    return out


END_SLACK_S = 0.005  # see classify(): requests scheduled this close to the end are not "unsent"


def of_result(r: dict, duration_s: float | None = None) -> dict:
    """classify() of an oha result; with the planned duration, unsent requests count too."""
    planned = slack = 0
    if duration_s and r.get("offered_rps"):
        planned = int(r["offered_rps"] * duration_s)
        slack = int(r["offered_rps"] * END_SLACK_S) + 2
    return classify(r.get("status_codes") or {}, r.get("errors_detail") or {}, planned, slack)


def fmt_pct(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    if x >= 1.0:
        return "100%"
    s = f"{100 * x:.{digits}f}%"
    if s == f"{100:.{digits}f}%":  # never round a failure up to 100%
        s = f"{100 - 10 ** -digits:.{digits}f}%"
    return s


def not_ok(o: dict) -> list[tuple[str, int]]:
    """The non-2xx kinds present, largest first."""
    rows = [(k, o[k]) for k in KINDS if k != "ok" and o.get(k)]
    return sorted(rows, key=lambda kv: -kv[1])


def codes_text(codes: dict[str, int], only_non2xx: bool = True) -> str:
    items = sorted((str(k), v) for k, v in codes.items()
                   if not (only_non2xx and str(k).startswith("2")))
    return ", ".join(f"{n:,} x {k}" for k, n in items)


def describe(r: dict) -> str:
    """One sentence on what clients saw (r["outcomes"] if the scenario computed it)."""
    o = r.get("outcomes") or of_result(r)
    if not o["total"]:
        return "no request completed."
    lat = r.get("latency_ms") or {}
    head = (f"{fmt_pct(o['availability'])} of {o['total']:,} requests got a 2xx "
            f"(p99 {fmt_ms(lat.get('p99'))})")
    bad = not_ok(o)
    if not bad:
        return head + "; nothing else."
    parts = []
    for k, n in bad:
        if k in ("refused", "other_5xx", "other_status"):
            continue
        parts.append(f"{n:,} {LABELS[k]}")
    codes = codes_text(r.get("status_codes") or {})
    if codes:
        parts.insert(0, codes)
    errs = [f"{m} ({n:,})" for m, n in (r.get("errors_detail") or {}).items()
            if error_kind(m) in ("other_errors",)]
    tail = f"; oha errors: {', '.join(errs)}" if errs else ""
    return head + "; the rest: " + ", ".join(parts) + tail + "."


def ratio_text(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"
