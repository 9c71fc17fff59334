"""Unit tests of `bench/run --vs-nginx --ratelimit` (harness/ratelimit.py): the three veloxy
configs, the key count, the RESP client (against a fake server on loopback), INFO and /metrics
parsing, medians, ratios, the outage verdict and the summary (no peers, no load)."""

from __future__ import annotations

import socket
import sys
import threading
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import peers, ratelimit  # noqa: E402
from harness.__main__ import parse_args  # noqa: E402


def _config(tmp_path, label: str) -> dict:
    ctx = SimpleNamespace(workers=1, keepalive=128, nofile=20000, veloxy_cli=False,
                          tools={"veloxy": "/bin/veloxy"})
    wd = tmp_path / label
    wd.mkdir()
    cmd, _ = peers._veloxy(ctx, wd, 8080, ["127.0.0.1:9001"],
                           ratelimit.extras(label, admin_port=9901, redis_port=6390))
    assert cmd == ["/bin/veloxy", "run", "--config", str(wd / "veloxy.toml")]
    text = (wd / "veloxy.toml").read_text()
    assert "{{" not in text
    return tomllib.loads(text)


def test_configs_differ_only_by_the_limit(tmp_path):
    plain, local, glob = (_config(tmp_path, lb) for lb in ratelimit.LABELS)
    for doc in (plain, local, glob):
        assert doc["server"]["workers"] == 1
        assert doc["server"]["admin"] == "127.0.0.1:9901"
        assert doc["routes"][0]["upstream"] == "app"
    assert "rate_limit" not in plain["routes"][0] and "redis" not in plain["server"]
    assert local["routes"][0]["rate_limit"] == {"rate": "2000/s", "burst": 2000, "key": "header:x-key"}
    assert "redis" not in local["server"]
    assert glob["routes"][0]["rate_limit"] == {**local["routes"][0]["rate_limit"], "scope": "global"}
    assert glob["server"]["redis"] == {"url": "redis://127.0.0.1:6390/0", "timeout": "50ms"}
    # everything else is the same config
    for doc in (local, glob):
        doc["routes"][0].pop("rate_limit")
        doc["server"].pop("redis", None)
        assert doc == plain
    with pytest.raises(KeyError):
        ratelimit.extras("nginx", admin_port=1, redis_port=2)


def test_keys_for_and_outage_seconds():
    assert ratelimit.keys_for(50_400) == 50
    assert ratelimit.keys_for(48_000) == 48
    assert ratelimit.keys_for(300) == 1
    assert ratelimit.keys_for(None) == ratelimit.DEFAULT_KEYS
    assert ratelimit.keys_for(0) == ratelimit.DEFAULT_KEYS
    assert ratelimit.outage_seconds(10) == 5
    assert ratelimit.outage_seconds(1) == 2
    assert ratelimit.outage_seconds(3.2) == 4


def test_resp_encode_and_parse():
    assert ratelimit.resp_encode("INFO", "stats") == b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n"
    assert ratelimit.resp_encode("SET", "") == b"*2\r\n$3\r\nSET\r\n$0\r\n\r\n"
    assert ratelimit.resp_parse(b"+PONG\r\n") == ("PONG", 7)
    assert ratelimit.resp_parse(b":42\r\n") == (42, 5)
    assert ratelimit.resp_parse(b"$-1\r\n") == (None, 5)
    assert ratelimit.resp_parse(b"$5\r\nhello\r\n") == ("hello", 11)
    assert ratelimit.resp_parse(b"$5\r\nhel") is None
    assert ratelimit.resp_parse(b"+PON") is None
    assert ratelimit.resp_parse(b"*2\r\n:1\r\n$1\r\nx\r\n") == ([1, "x"], 15)
    assert ratelimit.resp_parse(b"*2\r\n:1\r\n") is None
    err, n = ratelimit.resp_parse(b"-ERR unknown\r\n")
    assert isinstance(err, ratelimit.RespError) and str(err) == "ERR unknown" and n == 14
    with pytest.raises(ValueError):
        ratelimit.resp_parse(b"?what\r\n")


def _fake_redis(replies: list[bytes]) -> tuple[int, threading.Thread]:
    """A one-shot server on loopback: per connection, reads a command and sends the next reply
    in two pieces (the client must reassemble)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]

    def serve():
        with srv:
            for reply in replies:
                c, _ = srv.accept()
                with c:
                    c.recv(65536)
                    c.sendall(reply[:3])
                    c.sendall(reply[3:])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return port, t


def test_redis_call_against_a_fake_server():
    info = b"# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:1234\r\n"
    port, t = _fake_redis([b"+PONG\r\n", b"$%d\r\n%s\r\n" % (len(info), info), b"-ERR nope\r\n"])
    assert ratelimit.redis_call(port, "PING") == "PONG"
    got = ratelimit.parse_info(str(ratelimit.redis_call(port, "INFO", "stats")))
    assert got["total_commands_processed"] == "1234" and "# Stats" not in got
    with pytest.raises(ratelimit.RespError):
        ratelimit.redis_call(port, "NOPE")
    t.join(timeout=5)


def test_script_calls():
    info = ratelimit.parse_info("# Commandstats\r\n"
                                "cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.5,rejected_calls=0\r\n"
                                "cmdstat_eval:calls=2,usec=30,usec_per_call=15.0\r\n"
                                "cmdstat_info:calls=9,usec=400,usec_per_call=44.4\r\n")
    assert ratelimit.script_calls(info) == 122
    assert ratelimit.script_calls({}) == 0


def test_parse_metrics_and_counters_delta():
    text = """# HELP veloxy_rate_limited_total 429s from rate limits.
# TYPE veloxy_rate_limited_total counter
veloxy_rate_limited_total 7
veloxy_requests_total{listener="web",route="0",status="2xx"} 100
veloxy_requests_total{listener="web",route="0",status="4xx"} 7
veloxy_ratelimit_store_fallbacks_total 0
garbage line here x
"""
    m = ratelimit.parse_metrics(text)
    assert m["veloxy_rate_limited_total"] == 7
    assert m["veloxy_requests_total"] == 107
    after = dict(m, veloxy_rate_limited_total=9, veloxy_ratelimit_store_fallbacks_total=40)
    d = ratelimit.counters_delta(m, after)
    assert d == {"rate_limited": 2, "fallbacks": 40, "redis_errors": None}
    assert ratelimit.counters_delta(None, after) == dict.fromkeys(ratelimit.COUNTERS)


def _round(rps, cpu, p99=1.0, rnd=1, **kw):
    return {"rps": rps, "cpu_us_per_req": cpu, "requests": int(rps * 10), "errors": 0,
            "non2xx": 0, "socket_errors": 0, "latency_ms": {"p50": 0.5, "p99": p99, "max": 3.0},
            "proxy_cpu_pct": 99.0, "bottleneck": "core 0 (proxy) 99%", "per_key_rps": rps / 48,
            "round": rnd, "rate_limited": 0, "fallbacks": 0, "redis_errors": 0, **kw}


def _results():
    return {ratelimit.MODE: {
        ratelimit.PLAIN: [_round(50_000, 20.0), _round(51_000, 19.6, rnd=2)],
        ratelimit.LOCAL: [_round(49_000, 20.4), _round(49_500, 20.2, rnd=2)],
        ratelimit.GLOBAL: [_round(48_000, 21.0, redis_leases_per_1k=10.0, redis_cpu_us_per_req=0.3),
                           {"error": "wrk exited 1", "round": 2}],
    }}


def test_medians_and_ratios():
    meds = ratelimit.medians(_results())[ratelimit.MODE]
    assert meds[ratelimit.PLAIN]["cpu_us"] == pytest.approx(19.8)
    assert meds[ratelimit.GLOBAL]["ok"] == 1 and meds[ratelimit.GLOBAL]["rounds"] == 2
    assert meds[ratelimit.GLOBAL]["redis_per_1k"] == 10.0
    assert meds[ratelimit.GLOBAL]["rate_limited"] == 0
    assert meds[ratelimit.LOCAL]["redis_per_1k"] is None
    rs = {(n, d): (r, g) for n, d, r, g in ratelimit.ratios(meds)}
    r, goal = rs[(ratelimit.GLOBAL, ratelimit.LOCAL)]
    assert r == pytest.approx(21.0 / 20.3) and goal == ratelimit.GOAL_GLOBAL_LOCAL
    assert rs[(ratelimit.LOCAL, ratelimit.PLAIN)][1] is None
    assert ratelimit.ratios({ratelimit.PLAIN: {"cpu_us": 20.0}}) == []


def _outage(max_ms=2.0, fallbacks=500, **down):
    return {"connections": 8, "seconds": 5, "timeout_ms": 50, "keys": 48,
            "up": _round(30_000, 20.0),
            "down": {**_round(30_000, 20.0, fallbacks=fallbacks, redis_errors=3),
                     "latency_ms": {"p50": 0.2, "p99": 0.9, "max": max_ms},
                     "redis_killed_at_s": 2.5, **down}}


def test_outage_verdict():
    assert ratelimit.outage_verdict(_outage()) == "met"
    assert ratelimit.outage_verdict(_outage(max_ms=50.0)) == "met"
    assert ratelimit.outage_verdict(_outage(max_ms=51.0)) == "NOT met"
    assert ratelimit.outage_verdict(_outage(socket_errors=2)) == "NOT met"
    assert ratelimit.outage_verdict(_outage(fallbacks=0)).startswith("NOT exercised")
    assert ratelimit.outage_verdict(_outage(fallbacks=None)) == "met"  # no admin: not checked
    assert ratelimit.outage_verdict(_outage(error="wrk exited 1")).startswith("NOT measured")


def test_under_limit_429s():
    assert ratelimit.under_limit_429s({"rate_limited": 30, "per_key_rps": 1000}) == 30
    assert ratelimit.under_limit_429s({"rate_limited": 30, "per_key_rps": 2500}) == 0
    assert ratelimit.under_limit_429s({"rate_limited": None, "non2xx": 4, "per_key_rps": 900}) == 4
    assert ratelimit.under_limit_429s({"rate_limited": 0, "per_key_rps": 900}) == 0
    assert ratelimit.under_limit_429s({"error": "x"}) == 0


def test_summary(tmp_path):
    out = _outage()
    out["verdict"] = ratelimit.outage_verdict(out)
    ctx = SimpleNamespace(
        results={ratelimit.MODE: _results(), ratelimit.OUTAGE: out,
                 ratelimit.ENV: {"keys": 48, "keys_from": "calibration"}},
        peer_status={lb: {"status": "ok", "reason": ""} for lb in ratelimit.LABELS},
        proxy_cpus=[0], load_cpus=[1])
    ctx.results[ratelimit.MODE] = _results()
    args = SimpleNamespace(rounds=2, duration=10, connections=64)
    text = ratelimit.summarize(ctx, args)
    assert "veloxy-rl-global CPU/req / veloxy-rl-local CPU/req = 1.034 (goal: at most 1.05: met)" in text
    assert "veloxy-rl-local CPU/req / veloxy CPU/req = 1.025" in text
    assert "Redis outage: max latency 2.00 ms (timeout 50 ms): met" in text
    assert "failed: veloxy-rl-global round 2: wrk exited 1" in text
    assert "WARNING" not in text and "NOTE" not in text
    out["down"]["rate_limited"] = 1999
    assert "NOTE: 1999 x 429 in the Redis-killed run" in ratelimit.summarize(ctx, args)
    ctx.results[ratelimit.MODE][ratelimit.MODE][ratelimit.LOCAL][0].update(non2xx=5000, rate_limited=5000)
    assert "WARNING: more than 0.1% non-2xx" in ratelimit.summarize(ctx, args)


def test_parse_args_ratelimit():
    a = parse_args(["--ratelimit"])
    assert a.vs_nginx and a.ratelimit and a.name.startswith("ratelimit-global-")
    assert parse_args(["--vs-nginx", "--ratelimit", "--name", "x"]).name == "x"
    assert not parse_args(["--vs-nginx"]).ratelimit
    for bad in (["--ratelimit", "--auth"], ["--ratelimit", "--tcp"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
