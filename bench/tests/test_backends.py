"""Unit tests of `bench/run --backends` (harness/backends.py): the veloxy config of each
policy, the options and the summary (no proxy is started)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import backends  # noqa: E402
from harness.__main__ import parse_args  # noqa: E402

UPS = [f"127.0.0.1:{9100 + i}" for i in range(6)]


def conf(tmp_path: Path, policy: str) -> dict:
    p = backends.veloxy_conf(tmp_path / f"{policy}.toml", port=8080, servers=UPS,
                             policy=policy, keepalive=2)
    return tomllib.loads(p.read_text())


def test_every_policy_has_a_valid_config(tmp_path):
    for policy in backends.POLICIES:
        c = conf(tmp_path, policy)
        g = c["upstreams"]["app"]
        assert c["server"]["workers"] == 1 and c["routes"] == [{"upstream": "app"}]
        assert len(g["servers"]) == len(UPS) and g["keepalive"] == 2
        assert g["policy"] in ("round_robin", "least_conn", "p2c_ewma", "consistent_hash",
                               "random"), policy
    weighted = conf(tmp_path, "random_weighted")["upstreams"]["app"]
    assert weighted["policy"] == "random"
    assert [s["weight"] for s in weighted["servers"]] == [1, 2, 3, 1, 2, 3]
    assert conf(tmp_path, "consistent_hash")["upstreams"]["app"]["hash_key"] == "path"
    sticky = conf(tmp_path, "sticky")["upstreams"]["app"]
    assert sticky["policy"] == "round_robin" and sticky["sticky"] == {"cookie": "veloxy_srv"}


def test_options():
    a = parse_args(["--backends", "--small"])
    assert a.backends and a.rounds == 1 and a.duration == 2
    assert parse_args(["--backends"]).duration == 10


def test_summary_ratio(tmp_path):
    r = lambda cpu: {"cpu_us_per_req": cpu, "cpu_user_us_per_req": cpu / 2}  # noqa: E731
    ctx = SimpleNamespace(proxy_cpus=[0], peer_status={}, results={"backends": {
        "small": 4, "large": backends.LARGE,
        "rounds": {"random": {"4": [r(10.0)], "10000": [r(10.5)]},
                   "p2c_ewma": {"4": [r(10.0)], "10000": [r(12.0)]}}}})
    text = backends.summarize(ctx, SimpleNamespace(connections=64, rounds=1, duration=2))
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.split()}
    assert "1.050" in lines["random"] and lines["random"].endswith("met")
    assert "1.200" in lines["p2c_ewma"] and lines["p2c_ewma"].endswith("NOT met")
