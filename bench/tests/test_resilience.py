"""Unit tests of the failover/overload pieces: config snippets, oha parsing, outcome
classification and the overload summary (no network, no peers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import loadgen, outcomes, peers, runner  # noqa: E402
from scenarios import failover, overload  # noqa: E402

TOOLS = ("nginx", "haproxy", "envoy", "caddy", "traefik", "pingora", "veloxy", "upstream")


def _ctx():
    return SimpleNamespace(workers=1, keepalive=128, nofile=20000, veloxy_cli=False,
                           tools={k: f"/bin/{k}" for k in TOOLS})


def test_render_snippet_slots():
    tmpl = "a\n  {{X}}\nb {{Y}}\n"
    assert peers.render(tmpl, {"X": "", "Y": 1}) == "a\nb 1\n"
    assert peers.render(tmpl, {"X": "\np = 1\n\nq = 2", "Y": 1}) == "a\n  p = 1\n\n  q = 2\nb 1\n"
    # A placeholder alone at column 0 is a plain value (the generated server lists).
    assert peers.render("{{S}}\n", {"S": "    server x;"}) == "    server x;\n"


def test_default_configs_have_no_snippet_residue(tmp_path):
    for name, build in peers.BUILDERS.items():
        wd = tmp_path / name
        wd.mkdir()
        build(_ctx(), wd, 8080, ["127.0.0.1:9001"])
        for f in wd.iterdir():
            text = f.read_text()
            assert "{{" not in text
            assert not any(line and not line.strip() for line in text.splitlines()), (name, f.name)


def test_unknown_extra_is_an_error(tmp_path):
    with pytest.raises(KeyError):
        peers.BUILDERS["nginx"](_ctx(), tmp_path, 8080, ["127.0.0.1:1"], {"NOPE": "x"})
    with pytest.raises(KeyError):
        peers.BUILDERS["pingora"](_ctx(), tmp_path, 8080, ["127.0.0.1:1"], {"X": "y"})


@pytest.mark.parametrize("sc", [failover, overload])
def test_scenario_peer_configs_render(tmp_path, sc):
    for name in peers.ALL_PROXIES:
        extra = sc.peer_config(None, None, name)
        if extra is None:
            continue
        wd = tmp_path / name
        wd.mkdir()
        peers.BUILDERS[name](_ctx(), wd, 8080, ["127.0.0.1:9001", "127.0.0.1:9002"], extra)
        text = "".join(f.read_text() for f in wd.iterdir())
        assert "{{" not in text
        for v in extra.values():
            assert str(v).strip().splitlines()[0] in text, (sc.NAME, name)


def test_scenario_specific_settings(tmp_path):
    peers.BUILDERS["veloxy"](_ctx(), tmp_path, 8080, ["127.0.0.1:9001"],
                             failover.peer_config(None, None, "veloxy"))
    conf = (tmp_path / "veloxy.toml").read_text()
    assert '[upstreams.app.health]' in conf and 'path = "/health"' in conf
    peers.BUILDERS["veloxy"](_ctx(), tmp_path, 8080, ["127.0.0.1:9001"],
                             overload.peer_config(None, None, "veloxy"))
    conf = (tmp_path / "veloxy.toml").read_text()
    assert f"max_concurrency = {overload.SLOTS}" in conf and "[upstreams.app.health]" not in conf
    peers.BUILDERS["haproxy"](_ctx(), tmp_path, 8080, ["127.0.0.1:9001"],
                              overload.peer_config(None, None, "haproxy"))
    conf = (tmp_path / "haproxy.cfg").read_text()
    assert f"maxconn {overload.SLOTS // 4}" in conf and "timeout queue 50ms" in conf


def test_parse_oha_breakdown():
    doc = {
        "summary": {"total": 2.0, "slowest": 0.5, "totalData": 0, "sizePerSec": 0},
        "latencyPercentiles": {"p50": 0.001, "p99": 0.03},
        "latencyPercentilesSuccessful": {"p50": 0.02, "p99": 0.025},
        "statusCodeDistribution": {"200": 90, "503": 10},
        "errorDistribution": {"aborted due to deadline": 4},
    }
    r = loadgen.parse_oha(json.dumps(doc), offered_rps=100)
    assert r["ok_latency_ms"]["p99"] == pytest.approx(25.0)
    assert r["latency_ms"]["max"] == pytest.approx(500.0)
    assert r["status_codes"] == {"200": 90, "503": 10} and r["deadline_aborted"] == 4
    doc.pop("latencyPercentilesSuccessful")
    assert loadgen.parse_oha(json.dumps(doc))["ok_latency_ms"] is None


def test_classify():
    o = outcomes.classify(
        {"200": 970, "503": 10, "429": 5, "502": 3, "404": 1},
        {"aborted due to deadline": 7, "timeout": 4, "Connection refused (os error 111)": 2,
         "connection closed before message completed": 3, "Connection reset by peer": 1,
         "something odd": 1})
    assert o["ok"] == 970 and o["refused"] == 15 and o["other_5xx"] == 3
    assert o["other_status"] == 1 and o["timeouts"] == 4 and o["conn_refused"] == 2
    assert o["conn_closed"] == 4 and o["other_errors"] == 1
    assert o["total"] == 1000 and o["availability"] == pytest.approx(0.97)
    assert outcomes.classify({}, {"aborted due to deadline": 3})["availability"] is None


def test_unsent_requests_count_as_failures():
    # 3 s at 1000 req/s planned; 1200 answered, 300 cut by the deadline: 1500 never sent.
    r = {"offered_rps": 1000, "status_codes": {"200": 1200},
         "errors_detail": {"aborted due to deadline": 300}}
    o = outcomes.of_result(r, 3)
    slack = int(1000 * outcomes.END_SLACK_S) + 2  # the last 5 ms are the run's end, not the proxy
    assert o["unsent"] == 1500 - slack and o["total"] == 2700 - slack
    assert o["availability"] == pytest.approx(1200 / (2700 - slack))
    assert f"{1500 - slack:,} not sent" in outcomes.describe({**r, "outcomes": o, "latency_ms": {}})
    # A few requests short at the very end is the run's end, not the proxy.
    edge = {"offered_rps": 1000, "status_codes": {"200": 2994}, "errors_detail": {}}
    assert outcomes.of_result(edge, 3)["unsent"] == 0
    # Without the duration (or when everything was sent) nothing is added.
    assert outcomes.of_result(r)["unsent"] == 0
    full = {"offered_rps": 100, "status_codes": {"200": 305}, "errors_detail": {}}
    assert outcomes.of_result(full, 3)["unsent"] == 0


def test_fmt_pct_never_rounds_up_to_100():
    assert outcomes.fmt_pct(1.0) == "100%"
    assert outcomes.fmt_pct(0.99999) == "99.99%"
    assert outcomes.fmt_pct(0.9999, 1) == "99.9%"
    assert outcomes.fmt_pct(0.5) == "50.00%"
    assert outcomes.fmt_pct(None) == "-"


def test_describe():
    r = {"status_codes": {"200": 99, "502": 1}, "errors_detail": {"timeout": 2},
         "latency_ms": {"p99": 3.0}}
    s = outcomes.describe(r)
    assert "97.06% of 102 requests" in s and "1 x 502" in s and "2 client timeouts" in s
    ok = outcomes.describe({"status_codes": {"200": 5}, "errors_detail": {}, "latency_ms": {}})
    assert ok.startswith("100% of 5 requests") and "nothing else" in ok


def _step(factor, codes, all_p99, ok_p99=None):
    r = {"factor": factor, "status_codes": codes, "errors_detail": {},
         "latency_ms": {"p99": all_p99}, "ok_latency_ms": {"p99": ok_p99} if ok_p99 else None}
    r["outcomes"] = outcomes.of_result(r)
    return r


def test_overload_summary():
    rs = [_step(0, {"200": 100}, 21.0),                       # no breakdown: all were 2xx
          _step(2, {"200": 50, "503": 50}, 15.0, ok_p99=25.0),
          _step(4, {"503": 100}, 1.0),                          # nothing admitted
          {"factor": 8, "error": "boom"}]
    s = overload.summarize(rs)
    assert s["baseline_p99"] == 21.0
    assert s["ratios"][2] == pytest.approx(25.0 / 21.0)
    assert s["ratios"][4] is None and 8 not in s["ratios"]


def test_overload_steps_offer_multiples_of_capacity():
    cfg = overload.PROFILES["quick"]
    st = overload.steps(None, cfg)
    assert st[0]["factor"] == 0 and st[0]["rate"] == cfg["baseline_rate"]
    assert [s["rate"] for s in st[1:]] == [overload.CAPACITY * f for f in cfg["factors"]]
    assert overload.CAPACITY == overload.SLOTS * 1000 / overload.DELAY_MS


def test_scenario_targets():
    ctx = SimpleNamespace(explicit_proxies=False)
    every = ["veloxy", "nginx", "haproxy", "envoy", "caddy"]
    assert runner.scenario_targets(ctx, {"proxies": ["veloxy", "caddy"]}, every) == ["veloxy", "caddy"]
    assert runner.scenario_targets(ctx, {}, every) == every
    ctx.explicit_proxies = True
    assert runner.scenario_targets(ctx, {"proxies": ["veloxy"]}, every) == every
