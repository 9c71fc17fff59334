"""Unit tests of the static scenario: the site generator (determinism, sizes, realistic
compressibility), h2load's header/data byte counts, curl header parsing, the served-bytes
check, the mix statistics, the web-server templates and the goal lines (no network)."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import loadgen, peers, runner, site  # noqa: E402
from scenarios import static  # noqa: E402

TOOLS = ("nginx", "caddy", "veloxy", "upstream")
TLS_FILES = {"cert": "/tls/cert.pem", "key": "/tls/key.pem", "bundle": "/tls/bundle.pem"}


@pytest.fixture(scope="module")
def files():
    return site.site_files(static.SEED)


def test_site_is_deterministic(files):
    assert site.site_files(static.SEED) == files
    other = site.site_files(static.SEED + 1)
    assert set(other) == set(files) and all(other[p] != files[p] for p in files)


def test_site_sizes(files):
    kinds = {p: k for p, k, _ in site.FILES}
    assert list(files) == [p for p, _, _ in site.FILES]
    html = [p for p in files if kinds[p] == "html"]
    bundles = [p for p in files if kinds[p] in site.BUNDLE_KINDS]
    images = [p for p in files if kinds[p] in site.IMAGE_KINDS]
    assert html == ["index.html"] and 25_000 <= len(files["index.html"]) <= 35_000
    assert 4 <= len(bundles) <= 6
    assert {kinds[p] for p in bundles} == {"js", "css"}
    for p in bundles:
        assert 10_000 <= len(files[p]) <= 300_000, p
    assert len(images) >= 2
    for p in images:
        assert 5_000 <= len(files[p]) <= 100_000, p


def test_site_compresses_like_real_bundles(files):
    for path, kind, _ in site.FILES:
        data = files[path]
        r = len(data) / len(zlib.compress(data, 6))
        if kind in site.IMAGE_KINDS:
            assert r < 1.01, path  # random bytes: incompressible
        else:
            assert 2.3 <= r <= 5.5, (path, r)  # not trivially compressible, not random
    big = b"".join(files[p] for p, k, _ in site.FILES if k in site.BUNDLE_KINDS)
    assert 3.0 <= len(big) / len(zlib.compress(big, 6)) <= 5.0


def test_site_file_formats(files, tmp_path):
    jpg = files["img/hero.jpg"]
    assert jpg.startswith(b"\xff\xd8\xff\xe0") and jpg.endswith(b"\xff\xd9")
    png = files["img/logo.png"]
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")
    assert files["img/icons.svg"].startswith(b"<svg ")
    html = files["index.html"].decode()
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    for p in files:
        if p != "index.html":
            assert f'"/{p}"' in html or f'"/{p}#' in html, p  # the page links every asset
    for p in ("assets/vendor.js", "assets/main.css"):
        files[p].decode("ascii")
    written = site.make_site(tmp_path / "s", static.SEED)
    assert written == files
    assert (tmp_path / "s" / "assets" / "app.js").read_bytes() == files["assets/app.js"]
    assert site.url_path("index.html") == "/" and site.url_path("img/a.png") == "/img/a.png"


H2LOAD_TRAFFIC = """finished in 3.00s, 1000.00 req/s, 27.80MB/s
requests: 3000 total, 3000 started, 3000 done, 3000 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 3000 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 79.57MB (83432460) total, 106.93KB (109496) headers (space savings 93.78%), 79.41MB (83266728) data
"""


def test_parse_h2load_traffic_split():
    r = loadgen.parse_h2load(H2LOAD_TRAFFIC)
    assert r["bytes"] == 83432460 and r["header_bytes"] == 109496 and r["data_bytes"] == 83266728
    # Older output without the split: None, not a wrong number.
    r = loadgen.parse_h2load(H2LOAD_TRAFFIC.replace(
        ", 106.93KB (109496) headers (space savings 93.78%), 79.41MB (83266728) data", ""))
    assert r["header_bytes"] is None and r["data_bytes"] is None


def test_parse_curl_headers():
    text = ("HTTP/2 301\r\nlocation: /x/\r\n\r\n"
            "HTTP/2 200\r\ncontent-type: text/css\r\nContent-Encoding: br\r\nvary: accept-encoding\r\n\r\n")
    h = static.parse_curl_headers(text)
    assert h == {"content-type": "text/css", "content-encoding": "br", "vary": "accept-encoding"}
    assert static.parse_curl_headers("") == {}


def test_check_one():
    body = b"x" * 100
    ok = static.check_one(body, "gzip, deflate, br", "200", "2", {"content-encoding": "br"}, body)
    assert ok is None
    assert static.check_one(body, "gzip", "200", "2", {}, body) is None  # identity
    assert "status 404" in static.check_one(body, "gzip", "404", "2", {}, body)
    assert "HTTP version" in static.check_one(body, "gzip", "200", "1.1", {}, body)
    assert "not offered" in static.check_one(body, "gzip", "200", "2",
                                             {"content-encoding": "br"}, body)
    assert "differs" in static.check_one(body, "gzip", "200", "2", {}, body[:-1] + b"y")


def test_mix_stats_and_text_ratio():
    files = {"index.html": b"a" * 3000, "img/x.png": b"b" * 1000}
    m = static.mix_stats(files, {"requests": 100, "data_bytes": 50_000})
    assert m["mean_size"] == 2000 and m["data_per_req"] == 500
    assert m["compression_ratio"] == pytest.approx(4.0)
    assert static.mix_stats(files, {"requests": 0, "data_bytes": None})["compression_ratio"] is None
    served = {"index.html": {"wire": 1000, "encoding": "gzip"},
              "img/x.png": {"wire": 1000, "encoding": "identity"}}
    assert static.text_ratio(files, served) == pytest.approx(3.0)
    assert static.encodings_summary(served) in ("gzip x1, identity x1", "identity x1, gzip x1")


def _ctx():
    return SimpleNamespace(workers=2, keepalive=128, nofile=20000, veloxy_cli=False,
                           tools={k: f"/bin/{k}" for k in TOOLS}, tls_files=TLS_FILES,
                           static_site={"root": "/srv/site"},
                           versions={"nginx": "nginx version: nginx/1.22.1"})


def test_static_templates_render(tmp_path):
    ctx = _ctx()
    for name in static.STATIC_PEERS:
        wd = tmp_path / name
        wd.mkdir()
        peers.BUILDERS[name](ctx, wd, 8443, ["127.0.0.1:9001"], static.peer_config(ctx, None, name),
                             template=static.TEMPLATES[name])
        text = "".join(f.read_text() for f in wd.iterdir())
        assert "{{" not in text and "/srv/site" in text and "/tls/cert.pem" in text, name
        assert "proxy_pass" not in text and "reverse_proxy" not in text and "upstream" not in text
    nginx = (tmp_path / "nginx" / "nginx.conf").read_text()
    for needle in ("listen 127.0.0.1:8443 ssl http2 backlog=4096;", "gzip on;",
                   f"gzip_comp_level {static.NGINX_GZIP_LEVEL};", "root /srv/site;",
                   "application/javascript js;", "access_log off;", "worker_processes 2;"):
        assert needle in nginx
    caddy = (tmp_path / "caddy" / "Caddyfile").read_text()
    assert "https://127.0.0.1:8443 {" in caddy and "\tencode gzip\n" in caddy
    assert "\tfile_server\n" in caddy and "protocols h1 h2" in caddy
    veloxy = (tmp_path / "veloxy" / "veloxy.toml").read_text()
    assert 'root = "/srv/site"' in veloxy and "[listeners.web.tls]" in veloxy
    # A scenario setting that is not a placeholder of the template is an error.
    with pytest.raises(KeyError):
        peers.BUILDERS["nginx"](ctx, tmp_path, 1, [], {"NOPE": 1}, template=static.TEMPLATES["nginx"])


def test_static_targets_and_steps():
    every = list(peers.ALL_PROXIES)
    ctx = SimpleNamespace(explicit_proxies=True)
    assert runner.scenario_targets(ctx, static.PROFILES["full"], every) == static.STATIC_PEERS
    ctx.explicit_proxies = False
    assert runner.scenario_targets(ctx, static.PROFILES["quick"], every) == ["veloxy", "nginx"]
    assert "smoke" not in static.PROFILES
    st = static.steps(SimpleNamespace(tools={"h2load": "h"}), static.PROFILES["full"])
    assert [s["kind"] for s in st] == ["br", "gzip"]
    assert static.steps(SimpleNamespace(tools={}), static.PROFILES["full"]) == []


def test_goal_lines_and_report():
    def r(kind, rps, cr):
        return {"kind": kind, "rps": rps, "compression_ratio": cr, "non2xx": 0,
                "socket_errors": 0, "latency_ms": {"p99": 5.0}}
    res = {"veloxy": [r("br", 1000, 2.3), r("gzip", 900, 2.0)],
           "nginx": [r("br", 500, 2.0), r("gzip", 1000, 2.0)],
           "caddy": [r("br", 400, 2.1), r("gzip", 400, 2.1)]}
    lines = static.goal_lines(res)
    assert "2.00x" in lines[0] and "2.50x" in lines[0] and lines[0].endswith("**met**")
    assert "0.90x" in lines[1] and lines[1].endswith("**NOT met**")
    res["veloxy"][0]["compression_ratio"] = 1.9
    assert "**worse**" in static.goal_lines(res)[0]
    ctx = SimpleNamespace(explicit_proxies=False, load_cpus=[1])
    text = static.report(ctx, static.PROFILES["full"], res)
    assert "| veloxy | 1,000 |" in text and "Fairness" in text
