"""Unit tests of the benchmark harness (no network, no peers): python -m pytest bench/tests"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import loadgen, peers, runner, sysstat, vs_nginx  # noqa: E402


def test_parse_wrk():
    line = ('WRKJSON {"duration_us":2000000,"requests":1000,"bytes":200000,'
            '"errors":{"connect":1,"read":2,"write":0,"status":3,"timeout":4},'
            '"latency_us":{"mean":100.0,"stdev":5.0,"max":900,"p50":90,"p75":95,'
            '"p90":120,"p99":400,"p99.9":800}}')
    r = loadgen.parse_wrk("Running 2s test\n" + line + "\n")
    assert r["rps"] == 500
    assert r["transfer_bps"] == 100000
    assert r["non2xx"] == 3 and r["socket_errors"] == 7 and r["errors"] == 10
    assert r["latency_ms"]["p99"] == 0.4


def test_parse_wrk_missing_summary():
    with pytest.raises(loadgen.LoadError):
        loadgen.parse_wrk("garbage")


def test_parse_oha():
    doc = {
        "summary": {"successRate": 1.0, "total": 2.0, "totalData": 1000, "sizePerSec": 500},
        "latencyPercentiles": {"p50": 0.001, "p99": 0.01, "p99.9": 0.02},
        "statusCodeDistribution": {"200": 190, "502": 5},
        "errorDistribution": {"aborted due to deadline": 3, "timeout": 2},
    }
    r = loadgen.parse_oha(json.dumps(doc), offered_rps=100)
    assert r["requests"] == 197  # 195 responses + 2 timeouts; deadline aborts ignored
    assert r["non2xx"] == 5 and r["timeouts"] == 2 and r["errors"] == 7
    assert r["latency_ms"]["p99"] == pytest.approx(10.0)
    assert r["ok_rps"] == 95


def test_make_body(tmp_path):
    for size in (1024, 100 * 1024):
        p = loadgen.make_body(tmp_path, size)
        assert p.stat().st_size == size


def test_strace_total():
    text = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 60.00    0.600000           3    200000           writev
 40.00    0.400000           2    200000     10000 read
------ ----------- ----------- --------- --------- ----------------
100.00    1.000000           2    400000     10000 total
"""
    assert vs_nginx.parse_strace_total(text) == (400000, 10000)


def test_templates_render_completely(tmp_path):
    ctx = SimpleNamespace(workers=2, keepalive=64, nofile=20000, veloxy_cli=False,
                          tools={k: f"/bin/{k}" for k in
                                 ("nginx", "haproxy", "envoy", "caddy", "traefik", "pingora",
                                  "veloxy", "upstream")})
    ups = ["127.0.0.1:9001", "127.0.0.1:9002"]
    for name, build in peers.BUILDERS.items():
        wd = tmp_path / name
        wd.mkdir()
        cmd, env = build(ctx, wd, 8080, ups)
        assert cmd and cmd[0].startswith("/bin/")
        for f in wd.iterdir():
            text = f.read_text()
            assert "{{" not in text, (name, f.name)
            if name != "veloxy" or f.suffix == ".toml":
                assert "9002" in text or f.name == "traefik.yml"
        if name in ("caddy", "traefik"):
            assert env["GOMAXPROCS"] == "2"


def test_nginx_config_is_fair(tmp_path):
    ctx = SimpleNamespace(workers=3, keepalive=99, nofile=20000, tools={"nginx": "nginx"})
    peers.BUILDERS["nginx"](ctx, tmp_path, 8080, ["127.0.0.1:1"])
    conf = (tmp_path / "nginx.conf").read_text()
    for needle in ("worker_processes 3;", "keepalive 99;", "proxy_http_version 1.1;",
                   'proxy_set_header Connection "";', "access_log off;",
                   "$proxy_add_x_forwarded_for"):
        assert needle in conf


def test_render_rejects_unknown_placeholder():
    with pytest.raises(KeyError):
        peers.render("x {{NOPE}}", {})


def test_smoke_results_stay_out_of_the_tree():
    # CI runs --smoke on every clone: its output must land in the gitignored target/.
    smoke = runner.default_results_dir("smoke")
    assert smoke.parts[-2:] == ("target", "bench-smoke")
    assert runner.default_results_dir("quick") == runner.BENCH / "results"


def test_parse_cores():
    proxy, load = runner.parse_cores(None)
    assert proxy and load
    avail = sorted(__import__("os").sched_getaffinity(0))
    if len(avail) >= 2:
        assert runner.parse_cores(f"{avail[0]}:{avail[1]}") == ([avail[0]], [avail[1]])
    with pytest.raises(runner.SetupError):
        runner.parse_cores("999:998")


def test_core_busy_and_bottleneck():
    a = {0: (100, 1000), 1: (100, 1000)}
    b = {0: (190, 1100), 1: (120, 1100)}
    busy = sysstat.core_busy(a, b)
    assert busy[0] == pytest.approx(90.0) and busy[1] == pytest.approx(20.0)
    s = sysstat.bottleneck({str(k): v for k, v in busy.items()}, {0: "proxy", 1: "load"})
    assert s.startswith("core 0 (proxy)")


def test_proc_ticks_self():
    import os
    assert sysstat.proc_ticks([os.getpid()]) >= 0
    assert sysstat.proc_rss([os.getpid()]) > 0


def test_scenarios_discovered():
    import scenarios

    names = [s.NAME for s in scenarios.discover()]
    assert names[:3] == ["ceiling", "ramp", "search"]
    for s in scenarios.discover():
        for prof, cfg in s.PROFILES.items():
            steps = s.steps(SimpleNamespace(), cfg)
            assert steps and all("label" in x and x["seconds"] > 0 for x in steps), (s.NAME, prof)


def test_auth_scenario_renders_one_users_file_for_both_proxies(tmp_path):
    import shutil

    if not shutil.which("htpasswd"):
        pytest.skip("htpasswd (apache2-utils) not installed")
    ctx = SimpleNamespace(tmp=tmp_path)
    entries = vs_nginx._entries(SimpleNamespace(auth=True, rules=False), ctx)
    labels = [e[0] for e in entries]
    assert labels == ["veloxy", "veloxy-auth", "nginx", "nginx-auth"]
    users = (tmp_path / "htpasswd").read_text()
    assert users.startswith("bench:$2y$")
    extras = {e[0]: e[2] for e in entries}
    assert str(tmp_path / "htpasswd") in extras["veloxy-auth"]["ROUTE_EXTRA"]
    assert "auth_basic_user_file" in extras["nginx-auth"]["SERVER_EXTRA"]
    assert all(e[3] == vs_nginx.AUTH_PATH for e in entries)
