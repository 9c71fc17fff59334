"""Unit tests of `bench/run --scale` (harness/scale.py): the route tables, the three proxies'
configs generated from them (veloxy TOML, nginx server blocks, the HAProxy map), the wrk
target list, the options, and the summary figures (no proxy is started)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import scale  # noqa: E402
from harness.__main__ import parse_args  # noqa: E402

UPS = ["127.0.0.1:9101", "127.0.0.1:9102", "127.0.0.1:9103", "127.0.0.1:9104"]
KW = dict(port=8080, servers=UPS, keepalive=128, nofile=20000, maxconn=9000)


def test_tables_follow_the_issue():
    assert scale.table(10) == (10, ["/"])
    assert scale.table(1_000) == (1_000, ["/"])
    assert scale.table(10_000) == (10_000, ["/"])
    hosts, paths = scale.table(100_000)
    assert hosts == 10_000 and paths == [f"/p{i}/" for i in range(10)]
    with pytest.raises(ValueError):
        scale.table(15_000)
    rts = scale.routes(100_000)
    assert len(rts) == len(set(rts)) == 100_000
    assert rts[0] == ("h0.example.test", "/p0/") and rts[-1] == ("h9999.example.test", "/p9/")
    assert len({h for h, _ in rts}) == 10_000


def test_targets_list_one_route_a_line(tmp_path):
    rts = scale.routes(1_000)
    lines = scale.write_targets(tmp_path / "t.txt", rts).read_text().splitlines()
    assert len(lines) == 1_000 and lines[7] == "h7.example.test /"
    assert (BENCH / "lua" / "scale-routes.lua").exists()


@pytest.mark.parametrize("size", [10, 100_000])
def test_veloxy_config_one_route_per_host_and_path(tmp_path, size):
    rts = scale.routes(size)
    conf = scale.write_config("veloxy", tmp_path, rts, **KW)
    doc = tomllib.loads(conf.read_text())
    assert doc["server"] == {"workers": 1}
    assert doc["listeners"] == {"web": {"addr": "127.0.0.1:8080"}}
    got = [(r["host"], r.get("path", "/")) for r in doc["routes"]]
    assert got == rts
    assert all(r["upstream"] == "app" for r in doc["routes"])
    assert doc["upstreams"] == {"app": {"servers": UPS, "keepalive": 128}}


def test_veloxy_reload_config_has_admin_and_probe(tmp_path):
    conf = scale.write_config("veloxy", tmp_path, scale.routes(10), admin_port=9900, probe=True,
                              **KW)
    doc = tomllib.loads(conf.read_text())
    assert doc["server"]["admin"] == "127.0.0.1:9900"
    assert doc["routes"][-1] == {"host": scale.PROBE_HOST, "upstream": "app"}
    assert len(doc["routes"]) == 11


@pytest.mark.parametrize("size", [10, 10_000, 100_000])
def test_nginx_config_one_server_per_host(tmp_path, size):
    rts = scale.routes(size)
    conf = scale.write_config("nginx", tmp_path, rts, **KW)
    text = conf.read_text()
    hosts, paths = scale.table(size)
    assert text.count("{") == text.count("}")
    assert text.count("server_name ") == hosts
    assert text.count("proxy_pass http://backend;") == size
    assert text.count("listen 127.0.0.1:8080") == hosts + 1
    assert "listen 127.0.0.1:8080 default_server backlog=4096;\n        return 404;" in text
    assert "worker_processes 1;" in text and "access_log off;" in text
    assert f"keepalive {128 * len(UPS)};" in text
    assert text.count("    server 127.0.0.1:91") == len(UPS)
    hash_max = int(text.split("server_names_hash_max_size ")[1].split(";")[0])
    assert hash_max >= 2 * hosts
    for p in paths:
        assert f"location {p} {{ proxy_pass http://backend; }}" in text
    assert "server_name h0.example.test;" in text
    assert f"server_name h{hosts - 1}.example.test;" in text


def test_haproxy_config_maps_host_and_path(tmp_path):
    rts = scale.routes(100_000)
    conf = scale.write_config("haproxy", tmp_path, rts, probe=True, **KW)
    text = conf.read_text()
    mp = (tmp_path / "routes.map").read_text().splitlines()
    assert len(mp) == 100_001
    assert mp[0] == "h0.example.test/p0/ app" and mp[-2] == "h9999.example.test/p9/ app"
    assert mp[-1] == f"{scale.PROBE_HOST}:8080/ app"
    assert (f"use_backend %[req.hdr(host),lower,concat(,txn.path),map_beg({tmp_path}/routes.map)]"
            in text)
    assert "nbthread 1" in text and "default_backend nomatch" in text
    assert "http-request return status 404" in text
    assert text.count("    server u") == len(UPS)
    assert "default-server pool-max-conn 128" in text and "option forwardfor" in text


def test_commands(tmp_path):
    ctx = SimpleNamespace(tools={k: f"/bin/{k}" for k in ("veloxy", "nginx", "haproxy")})
    conf = tmp_path / "x.conf"
    assert scale.check_cmd(ctx, "veloxy", conf, tmp_path) == ["/bin/veloxy", "check", "--config",
                                                             str(conf)]
    assert scale.check_cmd(ctx, "nginx", conf, tmp_path)[:3] == ["/bin/nginx", "-t", "-q"]
    assert scale.check_cmd(ctx, "haproxy", conf, tmp_path) == ["/bin/haproxy", "-c", "-q", "-f",
                                                              str(conf)]
    assert "-W" in scale.run_cmd(ctx, "haproxy", conf, tmp_path, master_worker=True)
    assert "-W" not in scale.run_cmd(ctx, "haproxy", conf, tmp_path)


def test_options():
    a = parse_args(["--scale"])
    assert a.scale and a.duration == 5 and a.rounds == 3
    assert scale.settings(a) == (scale.SIZES, scale.RELOAD_HOSTS)
    a = parse_args(["--scale", "--small"])
    assert a.rounds == 1 and a.duration == 2
    assert scale.settings(a) == (scale.SMALL_SIZES, scale.SMALL_RELOAD_HOSTS)
    a = parse_args(["--scale", "--scale-sizes", "10,20_000"])
    assert scale.settings(a)[0] == [10, 20_000]
    assert parse_args(["--vs-nginx"]).duration == 10
    with pytest.raises(SystemExit):
        parse_args(["--vs-nginx", "--small"])


def test_reload_summary():
    d = {"rounds": [
        {"kind": "steady", "latency_ms": {"p99": 1.0, "max": 3.0}, "errors": 0, "requests": 10,
         "reloads": []},
        {"kind": "reload", "latency_ms": {"p99": 2.0, "max": 9.0}, "errors": 2, "requests": 10,
         "reloads": [{"s": 0.1, "ok": True, "old_gone_s": 0.3}, {"s": 0.3, "ok": True},
                     {"s": None, "ok": False, "error": "x"}]}]}
    s = scale.reload_summary(d)
    assert s["reload_s"] == pytest.approx(0.2) and s["reload_max_s"] == 0.3
    assert s["reloads_ok"] == 2 and s["reloads"] == 3
    assert s["steady_p99"] == 1.0 and s["reload_p99"] == 2.0 and s["reload_errors"] == 2
    assert s["old_gone_s"] == 0.3


def test_memory_of_this_process():
    import os

    m = scale.memory([os.getpid()])
    assert m["processes"] == 1 and m["hwm_sum_mb"] >= m["rss_sum_mb"] > 0
    assert scale.utime_ticks([os.getpid()]) >= 0


def test_sizes_alternate_their_order_between_rounds():
    assert scale.size_order([10, 100_000], 0) == [10, 100_000]
    assert scale.size_order([10, 100_000], 1) == [100_000, 10]


def test_paired_ratios_pair_runs_of_the_same_round_and_skip_failures():
    def run(rnd, cpu, error=None):
        r = {"round": rnd, "cpu_us_per_req": cpu, "cpu_user_us_per_req": cpu / 4}
        return {**r, "error": error} if error else r

    sc = {"routes": {
        "10": {"veloxy": [run(1, 20.0), run(2, 10.0), run(3, 20.0)]},
        "100000": {"veloxy": [run(1, 21.0), run(2, 99.0, "x"), run(3, 30.0)]}}}
    assert scale.paired_ratios(sc, "veloxy", "10", "100000", "cpu_us_per_req") == [1.05, 1.5]
    meds = {"10": {"veloxy": {"cpu_us": 20.0, "user_us": 5.0}},
            "100000": {"veloxy": {"cpu_us": 30.0, "user_us": 6.0}}}
    (line,) = scale.flatness_lines(sc, meds, ["veloxy"], "10", "100000")
    # The goal is judged on the median of the pairs (1.275), not the ratio of medians (1.5).
    assert "paired median 1.275" in line and "NOT met" in line, line
    assert "ratio of medians 1.500" in line and "per round 1.050, 1.500" in line, line
