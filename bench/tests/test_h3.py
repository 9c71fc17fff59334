"""Unit tests of `bench/run --h3` (harness/h3.py): the configs of veloxy and Caddy, the oha
command lines, the UDP socket lookup, the answer checks, round order, medians, ratios and the
summary (no network, no peers)."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import h3, modes  # noqa: E402
from harness.__main__ import parse_args  # noqa: E402
from harness.loadgen import LoadError  # noqa: E402

CERT = {"cert": "/tls/cert.pem", "key": "/tls/key.pem", "bundle": "/tls/bundle.pem"}
UP = "127.0.0.1:9101"


def _ctx():
    return SimpleNamespace(workers=1, keepalive=128,
                           tools={"veloxy": "/bin/veloxy", "caddy": "/bin/caddy"})


def test_body_is_100_plain_bytes():
    assert len(h3.BODY) == 100 and h3.BODY.isascii()
    assert not set(h3.BODY) & set('"\\{}\n')  # the same literal in TOML and a Caddyfile


def test_configs_render(tmp_path):
    for name in h3.H3_PEERS:
        wd = tmp_path / name
        wd.mkdir()
        cmd, env, conf = h3.render(_ctx(), name, wd, 8443, UP, CERT)
        text = conf.read_text()
        assert "{{" not in text, name
        assert cmd[0] == f"/bin/{name}" and str(conf) in cmd
        assert "127.0.0.1:8443" in text and UP in text and h3.BODY in text, name
        assert CERT["cert"] in text and CERT["key"] in text, name
    _, env, _ = h3.render(_ctx(), "caddy", tmp_path / "caddy", 8443, UP, CERT)
    assert env["GOMAXPROCS"] == "1"


def test_veloxy_config_is_the_contract(tmp_path):
    _, env, conf = h3.render(_ctx(), "veloxy", tmp_path, 8443, UP, CERT)
    assert env == {}
    doc = tomllib.loads(conf.read_text())
    assert doc["server"]["workers"] == 1
    web = doc["listeners"]["web"]
    assert web["addr"] == "127.0.0.1:8443" and web["http3"] is True
    assert web["tls"] == {"cert": CERT["cert"], "key": CERT["key"]}
    fixed, proxied = doc["routes"]
    assert fixed["path_exact"] == h3.FIXED_PATH
    assert fixed["respond"]["status"] == 200 and fixed["respond"]["body"] == h3.BODY
    assert proxied == {"upstream": "app"}
    assert doc["upstreams"]["app"] == {"servers": [UP], "keepalive": 128}


def test_caddy_config_serves_h3(tmp_path):
    _, _, conf = h3.render(_ctx(), "caddy", tmp_path, 8443, UP, CERT)
    text = conf.read_text()
    for needle in ("admin off", "auto_https off", "protocols h1 h2 h3", "idle 1s",
                   "https://127.0.0.1:8443 {", "bind 127.0.0.1", f"tls {CERT['cert']} {CERT['key']}",
                   f'respond {h3.FIXED_PATH} "{h3.BODY}" 200', f"reverse_proxy {UP} {{",
                   "keepalive_idle_conns_per_host 128"):
        assert needle in text, needle
    assert text.count("{") == text.count("}")


def test_oha_command_lines():
    c3 = h3.oha_cmd("/o", "https://127.0.0.1:1/fixed", "h3", connections=64, streams=2,
                    duration=2.5)
    assert c3[:3] == ["/o", "-z", "3s"]
    for flag in (["-c", "64"], ["-p", "2"], ["--http-version", "3"], ["--output-format", "json"]):
        i = c3.index(flag[0])
        assert c3[i:i + 2] == flag
    assert "--insecure" in c3 and "--no-tui" in c3 and "--http2" not in c3
    assert c3[-1] == "https://127.0.0.1:1/fixed"
    c2 = h3.oha_cmd("/o", "https://127.0.0.1:1/", "h2", connections=2, streams=1, duration=0.2)
    assert "--http2" in c2 and "--http-version" not in c2 and c2[1:3] == ["-z", "1s"]


def _fake_oha(tmp_path, body: str, sleep_s: float = 0) -> str:
    """A stand-in for oha: prints `body` after `sleep_s` seconds."""
    script = tmp_path / "oha"
    script.write_text(f"""#!/usr/bin/env python3
import sys, time
time.sleep({sleep_s})
sys.stdout.write({body!r})
""")
    script.chmod(0o755)
    return str(script)


OHA_JSON = json.dumps({"summary": {"total": 2.4, "slowest": 0.01, "totalData": 1000},
                       "latencyPercentiles": {"p50": 0.001, "p99": 0.002},
                       "statusCodeDistribution": {"200": 10},
                       "errorDistribution": {"aborted due to deadline": 2}})


def test_oha_run_window_and_rate(tmp_path):
    """The window callback fires at oha's deadline, before oha has shut down (a server that
    keeps its QUIC connections open a while); requests/s are over the -z time."""
    oha = _fake_oha(tmp_path, OHA_JSON, sleep_s=2.4)
    marks = []
    t0 = time.monotonic()
    res = h3.oha_run(oha, "https://127.0.0.1:1/fixed", "h3", cpus=[], connections=1, streams=1,
                     duration=1, on_deadline=lambda: marks.append(time.monotonic() - t0))
    assert marks and 0.9 < marks[0] < 2
    assert res["protocol"] == "h3" and res["oha_shutdown_s"] > 1
    assert res["duration_s"] == 1.0 and res["oha_total_s"] == 2.4 and res["rps"] == 10
    assert res["errors"] == 0 and res["deadline_aborted"] == 2
    with pytest.raises(LoadError, match="still running"):
        h3.oha_run(_fake_oha(tmp_path, OHA_JSON, sleep_s=30), "https://127.0.0.1:1/", "h3",
                   cpus=[], connections=1, streams=1, duration=1, grace=0.5)


def test_oha_run_quick_exit(tmp_path):
    oha = _fake_oha(tmp_path, OHA_JSON.replace("2.4", "0.5"))
    marks = []
    res = h3.oha_run(oha, "https://127.0.0.1:1/", "h2", cpus=[], connections=1, streams=1,
                     duration=5, on_deadline=lambda: marks.append(1))
    assert marks == [1] and res["duration_s"] == 0.5 and res["oha_shutdown_s"] == 0
    bad = _fake_oha(tmp_path, "not json")
    with pytest.raises(LoadError):
        h3.oha_run(bad, "https://127.0.0.1:1/", "h2", cpus=[], connections=1, streams=1,
                   duration=1)


def test_udp_inodes(tmp_path):
    udp = tmp_path / "udp"
    udp.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode ref pointer drops\n"
        "  1: 0100007F:20FB 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        "
        "0 4242 2 0000000000000000 0\n"
        "  2: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        "
        "0 77 2 0000000000000000 0\n")
    assert h3.udp_inodes(8443, (str(udp), str(tmp_path / "missing"))) == {"4242"}
    assert h3.udp_inodes(9999, (str(udp),)) == set()


def test_check_answers():
    ok = {"status_codes": {"200": 20}, "socket_errors": 0, "bytes": 20 * len(h3.BODY)}
    assert h3.check_answers(ok, fixed=True) is None
    assert "not 20 x 100" in h3.check_answers({**ok, "bytes": 19 * len(h3.BODY)}, fixed=True)
    assert h3.check_answers({**ok, "bytes": 1234}, fixed=False) is None
    assert "no body" in h3.check_answers({**ok, "bytes": 0}, fixed=False)
    bad = h3.check_answers({"status_codes": {}, "socket_errors": 20, "bytes": 0,
                            "errors_detail": {"connection refused": 20,
                                              "aborted due to deadline": 1}}, fixed=False)
    assert "0 answered" in bad and "connection refused x20" in bad and "deadline" not in bad
    assert "404" in h3.check_answers({"status_codes": {"200": 10, "404": 10}, "bytes": 1}, False)
    assert h3.check_answers({"status_codes": {"200": 3}, "bytes": 300}, False)  # too few


def test_cli():
    a = parse_args(["--h3", "--rounds", "1", "--duration", "3", "--warmup", "1",
                    "--connections", "16", "--streams", "4"])
    assert a.h3 and a.rounds == 1 and a.duration == 3 and a.connections == 16 and a.streams == 4
    assert parse_args(["--h3"]).streams == 1


def test_rotation():
    labels = list(h3.ORDER)
    firsts = [modes.rotation(labels, i)[0] for i in range(len(labels))]
    assert sorted(firsts) == sorted(labels)


def _r(rps, cpu, err=None, rnd=1, p99=2.0):
    r = {"rps": rps, "cpu_us_per_req": cpu, "req_per_core": 1e6 / cpu, "errors": 0,
         "round": rnd, "latency_ms": {"p50": 1.0, "p99": p99}, "proxy_cpu_pct": 90,
         "bottleneck": "cpu0 (proxy) 99%"}
    if err:
        r["error"] = err
    return r


def test_medians_ratios_and_summary():
    results = {c: {} for c in h3.CASES}
    results["fixed"] = {
        "veloxy-h3": [_r(20000, 40), _r(21000, 44, rnd=2), _r(0, 1, "boom", 3)],
        "veloxy-h2": [_r(40000, 25), _r(41000, 24, rnd=2)],
        "caddy-h3": [_r(6000, 160), _r(6100, 170, rnd=2)],
        "caddy-h2": [_r(15000, 60), _r(15500, 62, rnd=2)],
    }
    meds = h3.medians(results)
    vx = meds["fixed"]["veloxy-h3"]
    assert vx["cpu_us"] == 42 and vx["ok"] == 2 and vx["rounds"] == 3
    assert vx["busiest"] == "cpu0 (proxy) 99%"
    assert h3.h3_h2_ratio(meds["fixed"]) == 42 / 24.5
    assert h3.h3_h2_ratio(meds["fixed"], "caddy") == 165 / 61
    per_core = h3.vs_caddy(meds["fixed"])
    assert abs(per_core - ((1e6 / 40 + 1e6 / 44) / 2) / ((1e6 / 160 + 1e6 / 170) / 2)) < 1e-9
    assert h3.vs_caddy(meds["fixed"], "rps") == 20500 / 6050
    assert h3.vs_caddy(meds["proxy"]) is None
    ctx = SimpleNamespace(results={"h3": results, "h3_env": {"streams": 1}}, proxy_cpus=[0],
                          load_cpus=[1],
                          peer_status={"veloxy": {"status": "ok", "reason": ""},
                                       "caddy": {"status": "ok", "reason": ""}})
    args = SimpleNamespace(rounds=1, connections=64, duration=3)
    text = h3.summarize(ctx, args)
    assert "smoke check" in text
    assert "veloxy HTTP/3 CPU/req / veloxy HTTP/2 CPU/req = 1.71 (goal <= 2.0: met)" in text
    assert "requests per core = 3.93x (goal >= 3.0x: met); requests/s 3.39x" in text
    assert "failed: veloxy-h3 round 3: boom" in text
