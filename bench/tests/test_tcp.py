"""Unit tests of `bench/run --tcp` (harness/tcp.py): the L4 configs of each proxy and of the
upstream, nginx stream-module detection, round order, medians and the summary (no network,
no peers)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

from harness import modes, peers, tcp  # noqa: E402

UP = {"plain": "127.0.0.1:9101", "tls": "127.0.0.1:9102"}
CERTS = {"proxy": {"cert": "/tls/p.pem", "key": "/tls/p.key", "bundle": "/tls/pb.pem"},
         "upstream": {"cert": "/tls/u.pem", "key": "/tls/u.key", "bundle": "/tls/ub.pem"}}
NGINX_V = ("nginx version: nginx/1.22.1\nconfigure arguments: --prefix=/usr/share/nginx "
           "--modules-path=/usr/lib/nginx/modules --with-http_ssl_module --with-stream=dynamic "
           "--with-stream_ssl_module --with-stream_ssl_preread_module --with-stream_realip_module")


def _ctx():
    return SimpleNamespace(workers=1, nofile=20000,
                           tools={k: f"/bin/{k}" for k in ("veloxy", "haproxy", "nginx")})


def test_configs_render(tmp_path):
    for name in tcp.TCP_PEERS:
        wd = tmp_path / name
        wd.mkdir()
        cmd, conf = tcp.render(_ctx(), name, wd, 8001, 8002, UP, CERTS,
                               "load_module /m/ngx_stream_module.so;" if name == "nginx" else "")
        text = conf.read_text()
        assert "{{" not in text, name
        assert cmd[0] == f"/bin/{name}"
        assert "127.0.0.1:8001" in text and "127.0.0.1:8002" in text, name
        assert UP["plain"] in text and UP["tls"] in text, name
        assert tcp.SNI in text, name


def test_veloxy_config_is_the_contract(tmp_path):
    _, conf = tcp.render(_ctx(), "veloxy", tmp_path, 8001, 8002, UP, CERTS)
    text = conf.read_text()
    for needle in ('[listeners.l4]\naddr = "127.0.0.1:8001"\nprotocol = "tcp"',
                   '[upstreams.files]\nservers = ["127.0.0.1:9101"]',
                   '[[streams]]\nlistener = "l4"\nupstream = "files"',
                   '[listeners.web.tls]\ncert = "/tls/p.pem"\nkey = "/tls/p.key"',
                   '[[streams]]\nlistener = "web"\nsni = ["bench.test"]\nupstream = "tlsfiles"',
                   "workers = 1"):
        assert needle in text, needle
    doc = tomllib.loads(text)
    assert doc["listeners"]["l4"]["protocol"] == "tcp"
    assert [s["upstream"] for s in doc["streams"]] == ["files", "tlsfiles"]


def test_haproxy_and_nginx_sni_settings(tmp_path):
    (tmp_path / "h").mkdir()
    (tmp_path / "n").mkdir()
    _, h = tcp.render(_ctx(), "haproxy", tmp_path / "h", 8001, 8002, UP, CERTS)
    ht = h.read_text()
    for needle in ("mode tcp", "tcp-request inspect-delay", "req.ssl_hello_type 1",
                   "use_backend tlsfiles if { req.ssl_sni -i bench.test }", "nbthread 1"):
        assert needle in ht, needle
    assert "mode http" not in ht
    _, n = tcp.render(_ctx(), "nginx", tmp_path / "n", 8001, 8002, UP, CERTS,
                      "load_module /m/ngx_stream_module.so;")
    nt = n.read_text()
    assert nt.lstrip().startswith("load_module /m/ngx_stream_module.so;") or \
        "\nload_module /m/ngx_stream_module.so;\n" in nt
    for needle in ("stream {", "ssl_preread on;", "map $ssl_preread_server_name $sni_upstream",
                   "bench.test tlsfiles;", "proxy_pass files;", "worker_processes 1;"):
        assert needle in nt, needle
    assert "http {" not in nt


def test_upstream_config_renders(tmp_path):
    conf = peers.render_file("nginx-files.conf.tmpl", tmp_path / "nginx.conf", {
        "WORKERS": 1, "WORKDIR": tmp_path, "NOFILE": 20000, "MAXCONN": 9000, "PORT": 9101,
        "TLS_PORT": 9102, "ROOT": tmp_path / "files", "SNI": tcp.SNI, "CERT": "/u.pem",
        "KEY": "/u.key"})
    text = conf.read_text()
    assert "{{" not in text
    assert "listen 127.0.0.1:9102 ssl" in text and "server_name bench.test;" in text


def test_stream_module_detection():
    line, _ = tcp.stream_module(NGINX_V, exists=lambda p: True)
    assert line == "load_module /usr/lib/nginx/modules/ngx_stream_module.so;"
    line, why = tcp.stream_module(NGINX_V, exists=lambda p: False)
    assert line is None and "libnginx-mod-stream" in why
    static = NGINX_V.replace("--with-stream=dynamic", "--with-stream")
    assert tcp.stream_module(static, exists=lambda p: False)[0] == ""
    none = NGINX_V.replace("--with-stream=dynamic ", "")
    assert tcp.stream_module(none)[0] is None
    no_preread = NGINX_V.replace(" --with-stream_ssl_preread_module", "")
    assert "preread" in tcp.stream_module(no_preread, exists=lambda p: True)[1]


def test_make_files(tmp_path):
    sums = tcp.make_files(tmp_path)
    assert (tmp_path / "1m.bin").stat().st_size == tcp.MIB
    assert (tmp_path / "100.bin").stat().st_size == 100
    assert tcp.make_files(tmp_path / "again") == sums  # seeded: the same bytes every run


def test_rotation():
    labels = ["veloxy", "haproxy", "nginx"]
    firsts = [modes.rotation(labels, i)[0] for i in range(3)]
    assert sorted(firsts) == sorted(labels)
    assert all(sorted(modes.rotation(labels, i)) == sorted(labels) for i in range(5))


def _r(rps, cpu, err=None, rnd=1):
    r = {"rps": rps, "cpu_us_per_req": cpu, "transfer_bps": rps * tcp.MIB, "errors": 0,
         "round": rnd}
    if err:
        r["error"] = err
    return r


def test_medians_ratio_and_summary():
    results = {c: {} for c in tcp.CASES}
    results["plain-1m"] = {"veloxy": [_r(1000, 100), _r(1100, 90, rnd=2), _r(0, 0, "boom", 3)],
                           "haproxy": [_r(900, 120), _r(950, 130, rnd=2)]}
    meds = tcp.medians(results)
    assert meds["plain-1m"]["veloxy"]["cpu_us"] == 95 and meds["plain-1m"]["veloxy"]["ok"] == 2
    assert tcp.cpu_ratio(meds["plain-1m"], "haproxy") == 125 / 95
    assert tcp.cpu_ratio(meds["plain-1m"], "nginx") is None
    ctx = SimpleNamespace(results={"tcp": results}, proxy_cpus=[0], load_cpus=[1],
                          peer_status={"veloxy": {"status": "ok", "reason": ""},
                                       "nginx": {"status": "skipped", "reason": "no stream"}})
    args = SimpleNamespace(rounds=1, connections=64, duration=2)
    text = tcp.summarize(ctx, args)
    assert "smoke check" in text and "nginx: skipped: no stream" in text
    assert "haproxy CPU/transfer / veloxy CPU/transfer = 1.32 (goal >= 1.0: met)" in text
    assert "failed: veloxy round 3: boom" in text
