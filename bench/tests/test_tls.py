"""Unit tests of the tls scenario pieces: h2load parsing, percentiles, the TLS config
snippets of each peer, proxy selection (no network, no peers)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import loadgen, peers, runner  # noqa: E402
from scenarios import tls  # noqa: E402

TOOLS = ("nginx", "haproxy", "envoy", "caddy", "traefik", "pingora", "veloxy", "upstream")
FILES = {"cert": "/tls/cert.pem", "key": "/tls/key.pem", "bundle": "/tls/bundle.pem"}

H2LOAD_OUT = """starting benchmark...
spawning thread #0: 16 total client(s). Timing-based test with 0s of warm-up time (...)
Warm-up started for thread #0.
Warm-up phase is over for thread #0.
Main benchmark duration is started for thread #0.
TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2
Main benchmark duration is over for thread #0. Stopping all clients.
Stopped all clients for thread #0

finished in 3.00s, 20000.00 req/s, 1.50MB/s
requests: 60012 total, 60012 started, 60000 done, 59990 succeeded, 10 failed, 4 errored, 1 timeout
status codes: 59990 2xx, 0 3xx, 0 4xx, 6 5xx
traffic: 4.50MB (4500000) total, 2.00MB (2000000) headers (space savings 51.02%), 1.00MB (1000000) data
                     min         max         mean         sd        +/- sd
time for request:      100us     12.50ms       1.20ms       456us    78.90%
time for connect:     1.23ms      2.34ms      1.50ms       200us    60.00%
time to 1st byte:     3.45ms      5.67ms      4.00ms       500us    70.00%
req/s           :    1200.12     1300.34     1250.00       20.00    65.00%
"""


def _ctx(**kw):
    return SimpleNamespace(workers=1, keepalive=128, nofile=20000, veloxy_cli=False,
                           tools={k: f"/bin/{k}" for k in TOOLS}, **kw)


def test_parse_h2load():
    r = loadgen.parse_h2load(H2LOAD_OUT)
    assert r["rps"] == 20000 and r["requests"] == 60000
    assert r["duration_s"] == pytest.approx(3.0)
    assert r["non2xx"] == 6 and r["socket_errors"] == 5 and r["errors"] == 11
    assert r["bytes"] == 4500000 and r["transfer_bps"] == pytest.approx(1500000)
    assert r["tls"] == {"protocol": "TLSv1.3", "cipher": "TLS_AES_128_GCM_SHA256",
                        "key_exchange": "X25519 253 bits", "alpn": "h2"}
    assert r["latency_ms"]["mean"] == pytest.approx(1.2)
    assert r["latency_ms"]["max"] == pytest.approx(12.5)
    assert r["h2load_times_ms"]["request"]["min"] == pytest.approx(0.1)
    assert r["h2load_times_ms"]["connect"]["sd"] == pytest.approx(0.2)


def test_parse_h2load_without_summary():
    with pytest.raises(loadgen.LoadError):
        loadgen.parse_h2load("starting benchmark...\nconnect: Connection refused\n")


def test_percentiles_nearest_rank():
    xs = [float(i) for i in range(1, 101)]  # 1..100
    p = loadgen.percentiles(xs)
    assert p["p50"] == 50 and p["p90"] == 90 and p["p99"] == 99 and p["p99.9"] == 100
    assert loadgen.percentiles([])["p99"] is None
    assert loadgen.percentiles([7.0])["p99.9"] == 7.0


def test_parse_h2load_log():
    lines = [f"1795388965720631\t200\t{us}" for us in range(1000, 101000, 1000)]  # 1..100 ms
    lines += ["1795388965720632\t-1\t0", "garbage", "1795388965720633\t503\t5000"]
    r = loadgen.parse_h2load_log("\n".join(lines) + "\n")
    assert r["logged"] == 101
    assert r["log_statuses"] == {"200": 100, "-1": 1, "503": 1}
    lat = r["latency_ms"]
    assert lat["p50"] == pytest.approx(50.0) and lat["p99"] == pytest.approx(99.0)
    assert lat["max"] == pytest.approx(100.0)


def test_tls_snippets_render(tmp_path):
    for name in peers.ALL_PROXIES:
        extra = tls.tls_settings(name, FILES)
        if name not in tls.TLS_PEERS:
            assert extra is None
            continue
        wd = tmp_path / name
        wd.mkdir()
        peers.BUILDERS[name](_ctx(), wd, 8443, ["127.0.0.1:9001", "127.0.0.1:9002"], extra)
        text = "".join(f.read_text() for f in wd.iterdir())
        assert "{{" not in text
        assert "/tls/" in text, name
        assert not any(line and not line.strip() for line in text.splitlines()), name


def test_tls_settings_per_peer(tmp_path):
    ctx = _ctx()
    peers.BUILDERS["nginx"](ctx, tmp_path, 8443, ["127.0.0.1:1"], tls.tls_settings("nginx", FILES))
    conf = (tmp_path / "nginx.conf").read_text()
    assert "listen 127.0.0.1:8443 ssl http2 backlog=4096;" in conf
    for needle in ("ssl_certificate /tls/cert.pem;", "ssl_certificate_key /tls/key.pem;",
                   "ssl_protocols TLSv1.2 TLSv1.3;", "ssl_session_cache shared:SSL:10m;",
                   "keepalive 128;", "access_log off;"):
        assert needle in conf
    new = tls.tls_settings("nginx", FILES, nginx_http2_on=True)
    assert new["LISTEN_OPTS"] == " ssl" and "http2 on;" in new["SERVER_EXTRA"]
    assert tls._nginx_new_http2(SimpleNamespace(versions={"nginx": "nginx version: nginx/1.25.3"}))
    assert not tls._nginx_new_http2(SimpleNamespace(versions={"nginx": "nginx version: nginx/1.22.1"}))

    peers.BUILDERS["haproxy"](ctx, tmp_path, 8443, ["127.0.0.1:1"], tls.tls_settings("haproxy", FILES))
    conf = (tmp_path / "haproxy.cfg").read_text()
    assert "bind 127.0.0.1:8443 ssl crt /tls/bundle.pem alpn h2,http/1.1" in conf

    peers.BUILDERS["caddy"](ctx, tmp_path, 8443, ["127.0.0.1:1"], tls.tls_settings("caddy", FILES))
    conf = (tmp_path / "Caddyfile").read_text()
    assert "https://127.0.0.1:8443 {" in conf and "\ttls /tls/cert.pem /tls/key.pem\n" in conf
    assert "\tservers {\n\t\tprotocols h1 h2\n\t}\n" in conf and "auto_https off" in conf

    peers.BUILDERS["veloxy"](ctx, tmp_path, 8443, ["127.0.0.1:1"], tls.tls_settings("veloxy", FILES))
    conf = (tmp_path / "veloxy.toml").read_text()
    assert '[listeners.web.tls]\n  cert = "/tls/cert.pem"\n  key = "/tls/key.pem"' in conf
    # The default configs stay plain HTTP.
    peers.BUILDERS["caddy"](ctx, tmp_path, 8443, ["127.0.0.1:1"])
    assert "http://127.0.0.1:8443 {" in (tmp_path / "Caddyfile").read_text()


def test_tls_targets_only_supported_peers():
    every = list(peers.ALL_PROXIES)
    ctx = SimpleNamespace(explicit_proxies=True)
    assert runner.scenario_targets(ctx, tls.PROFILES["full"], every) == tls.TLS_PEERS
    ctx.explicit_proxies = False
    assert runner.scenario_targets(ctx, tls.PROFILES["quick"], every) == ["veloxy", "nginx"]
    assert runner.scenario_targets(ctx, tls.PROFILES["full"], ["envoy", "pingora"]) == []


def test_tls_steps():
    cfg = tls.PROFILES["full"]
    kinds = [s["kind"] for s in tls.steps(SimpleNamespace(tools={"wrk": "w", "h2load": "h"}), cfg)]
    assert kinds == ["h1", "h2", "handshake"]
    # No h2load (smoke does not install it): the HTTP/2 step is left out.
    kinds = [s["kind"] for s in tls.steps(SimpleNamespace(tools={"wrk": "w"}), cfg)]
    assert kinds == ["h1", "handshake"]
    assert [s["kind"] for s in tls.steps(SimpleNamespace(tools={}), tls.PROFILES["smoke"])] == ["h1"]


def test_goal_lines():
    def r(kind, rps, p99):
        return {"kind": kind, "rps": rps, "latency_ms": {"p99": p99}}
    res = {"veloxy": [r("h1", 120, 1.0), r("h2", 110, 2.0)],
           "nginx": [r("h1", 100, 2.0), r("h2", 100, 1.0)]}
    lines = tls.goal_lines(res)
    assert "1.20x" in lines[0] and lines[0].endswith("**met**")
    assert "1.10x" in lines[1] and "NOT lower" in lines[1] and lines[1].endswith("**NOT met**")
    text = tls.report(SimpleNamespace(explicit_proxies=False), tls.PROFILES["full"],
                      {n: [{**x, "non2xx": 0, "socket_errors": 0} for x in rs]
                       for n, rs in res.items()})
    assert "| veloxy | 120 |" in text and "1.20x" in text


@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl not installed")
def test_make_cert(tmp_path):
    files = tls.make_cert(tmp_path / "tls")
    cert = Path(files["cert"]).read_text()
    assert cert.startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" in Path(files["key"]).read_text()
    bundle = Path(files["bundle"]).read_text()
    assert "CERTIFICATE" in bundle and "PRIVATE KEY" in bundle
