"""Unit tests of `bench/run --cache` (harness/cache.py, harness/cachestorm.py): the configs of
veloxy, nginx and Varnish, the cache checks, the counting upstream and the storm client (on
loopback, a few milliseconds), medians, ratios, goals and the summary (no peers)."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import cache, cachestorm, modes  # noqa: E402
from harness.__main__ import parse_args  # noqa: E402
from harness.runner import SetupError  # noqa: E402

UP, STORM = "127.0.0.1:9101", "127.0.0.1:9102"


def _ctx(tmp_path):
    return SimpleNamespace(workers=1, keepalive=128, nofile=20000, tmp=tmp_path,
                           tools={k: f"/bin/{k}" for k in ("veloxy", "nginx", "varnish")})


def _render(tmp_path, name, connections=64):
    wd = tmp_path / f"{name}-cache-1"
    wd.mkdir()
    shm = tmp_path / "shm"
    return cache.render(_ctx(tmp_path), name, wd, 8080, UP, STORM, shm, connections)


def test_veloxy_config_is_the_contract(tmp_path):
    cmd, env, conf = _render(tmp_path, "veloxy")
    assert cmd == ["/bin/veloxy", "run", "--config", str(conf)] and env == {}
    doc = tomllib.loads(conf.read_text())
    assert doc["server"]["workers"] == 1
    assert doc["listeners"]["web"]["addr"] == "127.0.0.1:8080"
    assert doc["caches"] == {"bench": {"memory": "256MiB", "max_object": "8MiB"}}
    storm, app = doc["routes"]
    rule = {"store": "bench", "default_ttl": "10m"}
    assert storm == {"path": "/storm/", "upstream": "storm", "cache": rule}
    assert app == {"upstream": "app", "cache": rule}
    assert doc["upstreams"] == {"app": {"servers": [UP], "keepalive": 128},
                                "storm": {"servers": [STORM], "keepalive": 128}}


def test_nginx_config_caches_on_tmpfs(tmp_path):
    cmd, env, conf = _render(tmp_path, "nginx")
    text = conf.read_text()
    assert cmd[0] == "/bin/nginx" and str(conf) in cmd and "{{" not in text
    assert text.count("{") == text.count("}")
    shm = tmp_path / "shm" / "nginx-cache-1"
    for needle in (f"proxy_cache_path {shm} levels=1:2 keys_zone=bench:64m max_size=256m",
                   "use_temp_path=off;", "proxy_cache bench;", "proxy_cache_valid 200 10m;",
                   "proxy_cache_lock on;", "add_header X-Cache-Status $upstream_cache_status;",
                   "location /storm/ {", "proxy_pass http://storm;", f"server {STORM};",
                   f"server {UP};", "worker_processes 1;", "sendfile on;",
                   "keepalive 128;", "access_log off;"):
        assert needle in text, needle
    assert "tcp_nopush on" not in text
    # the cache settings are on the server, so both locations (/ and /storm/) inherit them
    server = text[text.index("    server {"):]
    assert server.index("proxy_cache bench;") < server.index("location /storm/")


def test_varnish_config_and_command(tmp_path):
    cmd, env, conf = _render(tmp_path, "varnish", connections=100)
    text = conf.read_text()
    assert conf.name == "varnish.vcl" and "{{" not in text and env == {}
    code = [x for x in text.splitlines() if x.strip() and not x.startswith("#")]
    assert code[0] == "vcl 4.1;"
    for needle in ('.host = "127.0.0.1";', '.port = "9101";', '.port = "9102";',
                   'req.url ~ "^/storm/"', "set req.backend_hint = storm;",
                   'set resp.http.X-Cache = "HIT";', "obj.hits > 0"):
        assert needle in text, needle
    assert text.count("{") == text.count("}")
    assert cmd[:2] == ["/bin/varnish", "-F"]
    pairs = {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("-")
             and cmd[i] != "-p"}
    assert pairs["-a"] == "127.0.0.1:8080" and pairs["-j"] == "none" and pairs["-T"] == "none"
    assert pairs["-s"] == "malloc,256m" and pairs["-t"] == "600" and pairs["-f"] == str(conf)
    assert pairs["-n"] == str(tmp_path / "shm" / "varnish-cache-1")
    params = [cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i] == "-p"]
    assert params == ["thread_pools=1", "thread_pool_min=116", "thread_pool_max=116",
                      "thread_queue_limit=1000"]
    assert cache.varnish_threads(1) == 17 and cache.varnish_threads(0) >= 5


def test_warm_paths_and_nonce():
    assert cache.warm_paths("hit-1k") == ["/size/1000"]
    assert cache.warm_paths("hit-100k") == ["/size/100000"]
    mix = cache.warm_paths("mix-90")
    assert len(mix) == 16 and mix[0] == "/size/1000?k=0" and mix[-1] == "/size/1000?k=15"
    assert len({cache.nonce() for _ in range(100)}) == 100
    env = cache.mix_env()
    assert env["WRK_CACHE_MISS_EVERY"] == "10" and env["WRK_CACHE_KEYS"] == "16"
    assert env["WRK_CACHE_PATH"] == "/size/1000" and env["WRK_CACHE_NONCE"]


def test_mix_script_reads_the_harness_settings():
    text = cache.MIX_LUA.read_text()
    for needle in ("WRK_CACHE_NONCE", "WRK_CACHE_MISS_EVERY", "WRK_CACHE_KEYS",
                   "WRK_CACHE_PATH", 'dofile(here .. "report.lua")', "function request()",
                   "?miss=", '"?k="', 'thread:set("tid"'):
        assert needle in text, needle


def _fields(seq, cache_status=None, name="X-Cache"):
    f = {"x-upstream": "u1", "x-conn-id": "1", "x-conn-seq": str(seq)}
    if cache_status:
        f[name.lower()] = cache_status
    return f


def _getter(answers):
    it = iter(answers)
    return lambda path: next(it)


def test_check_cached():
    body = b"x" * 1000
    ok = [(200, _fields(3, "MISS"), body), (200, _fields(3, "HIT"), body),
          (200, _fields(3, "HIT"), body)]
    assert cache.check_cached(_getter(ok), "/size/1000", 1000) == (None, "HIT")
    again = [(200, _fields(3, "MISS"), body), (200, _fields(4, "MISS"), body),
             (200, _fields(5, "MISS"), body)]
    bad, label = cache.check_cached(_getter(again), "/size/1000", 1000)
    assert bad.startswith("not cached: 3 GETs of /size/1000 reached the upstream 3 times")
    assert "x-conn-seq 3, 4, 5" in bad and label == "MISS"
    bad, _ = cache.check_cached(_getter([(502, {}, b"")]), "/p", 1000)
    assert bad == "GET /p answered 502"
    bad, _ = cache.check_cached(_getter([(200, _fields(1), b"x" * 10)]), "/p", 1000)
    assert bad == "GET /p: 10 body bytes, not 1000"
    bad, _ = cache.check_cached(_getter([(200, {}, body)]), "/p", 1000, times=1)
    assert "no x-upstream/x-conn-id/x-conn-seq" in bad
    # one GET (a cold key): no comparison, the label of that answer (nginx's field)
    assert cache.check_cached(_getter([(200, _fields(9, "MISS", "X-Cache-Status"), body)]),
                              "/p", 1000, times=1) == (None, "MISS")

    def refused(path):
        raise ConnectionRefusedError("refused")

    assert "failed: refused" in cache.check_cached(refused, "/p", 1)[0]


def test_stamp():
    assert cache.stamp(_fields(7)) == ("u1", "1", "7")
    assert cache.stamp({"x-upstream": "u1"}) is None


def test_request_and_response_heads():
    p = cachestorm.parse_request_head
    assert p(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n") == ("GET", "/a?b=1", 0, True)
    assert p(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")[3] is False
    assert p(b"GET / HTTP/1.0\r\n\r\n")[3] is False
    assert p(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")[3] is True
    assert p(b"POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n")[2] == 12
    with pytest.raises(ValueError):
        p(b"garbage\r\n\r\n")
    status, fields = cachestorm.parse_response_head(
        b"HTTP/1.1 200 OK\r\nX-Cache: HIT\r\nContent-Length: 5\r\n\r\n")
    assert status == 200 and fields == {"x-cache": "HIT", "content-length": "5"}
    assert cachestorm.parse_response_head(b"nonsense\r\n\r\n")[0] == 0
    r = cachestorm.response(200, b"abc", {"Cache-Control": "max-age=60"}, keep=False)
    assert r == (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nCache-Control: max-age=60\r\n"
                 b"Connection: close\r\n\r\nabc")


def test_cache_label():
    lb = cachestorm.cache_label
    assert lb({"x-cache": "HIT"}) == "HIT" and lb({"x-cache": "hit from veloxy"}) == "HIT"
    assert lb({"x-cache-status": "EXPIRED"}) == "EXPIRED"
    assert lb({"x-cache": "MISS, HIT"}) == "MISS"
    assert lb({}) is None and lb({"x-cache": ""}) is None


def test_count_for_and_storm_summary():
    counts = {"/storm/a": 1, "/storm/a?x=1": 2, "/storm/ab": 5}
    assert cachestorm.count_for(counts, "/storm/a") == 3
    assert cachestorm.count_for(counts, "/storm/zz") == 0
    answers = ([{"status": 200, "cache": "HIT", "ms": float(i), "bytes": 1000} for i in range(1, 99)]
               + [{"status": 200, "cache": None, "ms": 500.0, "bytes": 1000},
                  {"error": "timeout"}])
    s = cachestorm.summarize_storm(answers, 100, 0.5)
    assert s["answered"] == 99 and s["ok"] == 99 and s["errors"] == {"timeout": 1}
    assert s["cache"] == {"HIT": 98, "none": 1} and s["body_bytes"] == {1000: 99}
    assert s["latency_ms"]["p50"] == 50.0 and s["latency_ms"]["max"] == 500.0
    assert cachestorm.pct([], 50) is None and cachestorm.pct([3.0], 99) == 3.0


def test_counting_upstream_and_storm_on_loopback():
    """The real server and client, in one event loop: with no cache in between every one of
    the storm's requests reaches the upstream, and /_count says so."""
    async def go():
        c = cachestorm.Counter(0.05, b"y" * 100)
        server = await asyncio.start_server(c.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            res = await cachestorm.storm(port, "/storm/k", 20, 5)
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /_count?path=/storm/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw = await r.read()
            w.close()
        return res, raw, c.counts

    res, raw, counts = asyncio.run(go())
    assert res["ok"] == 20 and res["errors"] == {} and res["body_bytes"] == {100: 20}
    assert res["latency_ms"]["min"] >= 45 and res["cache"] == {"none": 20}
    assert counts == {"/storm/k": 20}
    assert raw.startswith(b"HTTP/1.1 200 OK") and raw.endswith(b'{"/storm/k": 20}')
    assert b"Cache-Control: no-store" in raw


def _r(rps, cpu, p99, err=None, rnd=1):
    r = {"rps": rps, "cpu_us_per_req": cpu, "req_per_core": 1e6 / cpu, "errors": 0,
         "round": rnd, "latency_ms": {"p50": p99 / 3, "p99": p99}, "proxy_cpu_pct": 95,
         "bottleneck": "core 0 (proxy) 99%"}
    if err:
        r["error"] = err
    return r


def _results():
    return {
        "hit-1k": {"veloxy": [_r(70000, 13, 1.0), _r(72000, 12, 1.2, rnd=2)],
                   "nginx": [_r(40000, 25, 2.0), _r(42000, 24, 2.2, rnd=2)],
                   "varnish": [_r(50000, 20, 0.9), _r(0, 1, 1, "boom", 2)]},
        "hit-100k": {"veloxy": [_r(20000, 40, 3.0)], "nginx": [_r(18000, 50, 4.0)],
                     "varnish": [_r(15000, 60, 5.0)]},
        "mix-90": {"veloxy": [_r(50000, 18, 2.0)], "nginx": [_r(30000, 30, 3.0)],
                   "varnish": [_r(30000, 30, 3.0)]},
    }


def test_versus_and_goals():
    meds = cache.medians(_results())
    v = cache.versus(meds["hit-1k"], "nginx")
    assert v["rps"] == 71000 / 41000 and v["cpu"] == 12.5 / 24.5 and v["p99_lower"]
    assert v["goal"] == 1.3 and v["met"]
    w = cache.versus(meds["hit-1k"], "varnish")  # faster, but a higher p99: not met
    assert w["rps"] == 71000 / 50000 and w["p99_lower"] is False and not w["met"]
    x = cache.versus(meds["hit-100k"], "nginx")  # lower p99, too slow: not met
    assert abs(x["rps"] - 20000 / 18000) < 1e-12 and x["p99_lower"] and not x["met"]
    assert cache.versus({"nginx": meds["hit-1k"]["nginx"]}, "nginx") is None
    assert cache.storm_goal({"veloxy": {"upstream_requests": 1}}) == "met"
    assert cache.storm_goal({"veloxy": {"upstream_requests": 3}}) == "NOT met"
    assert cache.storm_goal({"nginx": {"upstream_requests": 1}}) is None


def _summary_ctx(results, storms, veloxy="ok"):
    st = {"veloxy": {"status": veloxy, "reason": "" if veloxy == "ok" else "unknown field `caches`"},
          "nginx": {"status": "ok", "reason": ""}, "varnish": {"status": "ok", "reason": ""}}
    return SimpleNamespace(results={"cache": results, "cache_storm": storms,
                                    "cache_env": {"varnish_threads": 80}},
                           proxy_cpus=[0], load_cpus=[1], peer_status=st)


def test_summary():
    storm = {"n": 500, "ok": 500, "cache": {"HIT": 499, "MISS": 1}, "errors": {},
             "latency_ms": {"p50": 210.0, "max": 230.0}}
    storms = {"veloxy": {**storm, "upstream_requests": 1},
              "nginx": {**storm, "upstream_requests": 1},
              "varnish": {**storm, "upstream_requests": 2}}
    args = SimpleNamespace(rounds=3, connections=64, duration=10)
    text = cache.summarize(_summary_ctx(_results(), storms), args)
    assert ("upstream requests for 500 concurrent cold misses: veloxy 1, nginx 1 "
            "(proxy_cache_lock on), varnish 2") in text
    assert "goal, veloxy sends exactly 1 request upstream: met" in text
    assert "veloxy / nginx: requests/s 1.73x, p99 1.10ms vs 2.10ms, CPU/req 0.51x" in text
    assert "goal >= 1.3x with a lower p99: met" in text
    assert "goal >= 1.2x with a lower p99: NOT met" in text
    assert "failed: varnish round 2: boom" in text
    assert "smoke check" not in text and "Varnish: 80 threads" in text
    mix = text[text.index("90% hits"):]
    assert "veloxy / nginx: requests/s 1.67x" in mix and "goal >=" not in mix.split("\n\n")[0]
    last = text.splitlines()[-1]
    assert last.startswith("goals (hit req/s >= 1.3x nginx and >= 1.2x varnish")
    assert "storm 1 upstream met" in last and "hit-1k vs nginx 1.73x met" in last
    assert "hit-1k vs varnish 1.42x NOT met" in last


def test_summary_without_veloxy():
    res = {c: {k: v for k, v in per.items() if k != "veloxy"} for c, per in _results().items()}
    args = SimpleNamespace(rounds=1, connections=64, duration=1)
    text = cache.summarize(_summary_ctx(res, {}, veloxy="start failed"), args)
    assert "smoke check" in text and "veloxy: start failed: unknown field `caches`" in text
    assert text.splitlines()[-1].endswith("NOT measured (veloxy start failed)")
    assert "veloxy /" not in text


def test_choose_without_veloxy():
    assert modes.choose(["nginx", "varnish"], cache.CACHE_PEERS, "--cache",
                        need_veloxy=False) == ["nginx", "varnish"]
    with pytest.raises(SetupError):
        modes.choose(["nginx"], cache.CACHE_PEERS, "--cache")
    with pytest.raises(SetupError):
        modes.choose(["haproxy"], cache.CACHE_PEERS, "--cache", need_veloxy=False)


def test_cli():
    a = parse_args(["--cache", "--rounds", "1", "--duration", "2", "--warmup", "0",
                    "--proxies", "nginx,varnish"])
    assert a.cache and a.rounds == 1 and a.duration == 2 and a.warmup == 0
    assert cache.CACHE_ONLY == ["varnish"] and set(cache.CACHE_ONLY) <= set(cache.CACHE_PEERS)
    with pytest.raises(SystemExit):
        parse_args(["--cache", "--h3"])
