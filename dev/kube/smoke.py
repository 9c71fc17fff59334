#!/usr/bin/env python3
"""Check the API server that dev/kube/start.sh DIR started (standard library only).

    python3 dev/kube/smoke.py DIR

In a fresh namespace: creates a Service, an EndpointSlice (discovery.k8s.io/v1, TEST-NET
address), an IngressClass and an Ingress (networking.k8s.io/v1); checks that a loopback
EndpointSlice address is refused, that USER_TOKEN is denied by RBAC, and that a WATCH on
Ingresses (from the list's resourceVersion) delivers MODIFIED within 5 s of a patch. With the
Gateway API CRDs installed (dev/kube/gateway-crds.sh DIR), also a GatewayClass, a Gateway and
an HTTPRoute. Exits non-zero on the first failure.
"""

from __future__ import annotations

import json
import secrets
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request


GW = "gateway.networking.k8s.io/v1"


def main() -> int:
    d = sys.argv[1]
    env = dict(line.rstrip("\n").split("=", 1) for line in open(f"{d}/env") if "=" in line)
    url, token = env["APISERVER_URL"], env["TOKEN"]
    ctx = ssl.create_default_context(cafile=env["CA_FILE"])

    def call(method: str, path: str, body=None, tok: str = token,
             ctype: str = "application/json") -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + tok)
        req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                return e.code, json.loads(body)
            except ValueError:  # e.g. a plain-text 404 for an unknown group
                return e.code, {"message": body.decode(errors="replace")}

    def ok(what: str, cond: bool, detail="") -> None:
        print(f"smoke: {'ok  ' if cond else 'FAIL'} {what}{' -- ' + str(detail) if detail else ''}")
        if not cond:
            sys.exit(1)

    ns = "smoke-" + secrets.token_hex(3)
    net = "/apis/networking.k8s.io/v1"
    code, _ = call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    ok(f"Namespace {ns}", code == 201, code)
    code, svc = call("POST", f"/api/v1/namespaces/{ns}/services", {
        "metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    ok("Service (cluster IP allocated)", code == 201, svc.get("spec", {}).get("clusterIP"))
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [{"addresses": ["192.0.2.10"], "conditions": {"ready": True}}]}
    code, _ = call("POST", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", eps)
    ok("EndpointSlice 192.0.2.10", code == 201, code)
    eps["metadata"]["name"] = "web-lo"
    eps["endpoints"][0]["addresses"] = ["127.0.0.1"]
    code, _ = call("POST", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", eps)
    ok("EndpointSlice 127.0.0.1 refused (422)", code == 422, code)
    code, _ = call("POST", f"{net}/ingressclasses", {
        "metadata": {"name": ns}, "spec": {"controller": "veloxy.dev/ingress-controller"}})
    ok("IngressClass", code == 201, code)
    code, ing = call("POST", f"{net}/namespaces/{ns}/ingresses", {
        "metadata": {"name": "web"},
        "spec": {"ingressClassName": ns, "rules": [{"host": "shop.example", "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}})
    ok("Ingress", code == 201, code)
    code, _ = call("GET", f"{net}/ingresses", tok=env["USER_TOKEN"])
    ok("RBAC denies USER_TOKEN (403)", code == 403, code)

    # WATCH from the list's resourceVersion, then modify the Ingress.
    code, lst = call("GET", f"{net}/namespaces/{ns}/ingresses")
    rv = lst["metadata"]["resourceVersion"]
    events: list[dict] = []
    got = threading.Event()

    def watch() -> None:
        req = urllib.request.Request(
            f"{url}{net}/namespaces/{ns}/ingresses?watch=1&resourceVersion={rv}&timeoutSeconds=10")
        req.add_header("Authorization", "Bearer " + token)
        with urllib.request.urlopen(req, context=ctx, timeout=15) as r:
            for line in r:
                events.append(json.loads(line))
                if events[-1]["type"] == "MODIFIED":
                    got.set()
                    return

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    time.sleep(0.2)  # let the watch request reach the server (it starts from rv anyway)
    t0 = time.monotonic()
    code, _ = call("PATCH", f"{net}/namespaces/{ns}/ingresses/web",
                   {"spec": {"rules": [{"host": "shop2.example", "http": {"paths": [
                       {"path": "/api", "pathType": "Exact",
                        "backend": {"service": {"name": "web", "port": {"name": "http"}}}}]}}]}},
                   ctype="application/merge-patch+json")
    ok("Ingress patched", code == 200, code)
    ok("WATCH delivered MODIFIED", got.wait(5),
       f"{time.monotonic() - t0:.3f}s, {[e['type'] for e in events]}")
    host = events[-1]["object"]["spec"]["rules"][0]["host"]
    ok("event carries the new object", host == "shop2.example", host)

    gw = "/apis/" + GW
    has_gateway_api = call("GET", f"{gw}/gatewayclasses")[0] == 200
    if has_gateway_api:
        code, _ = call("POST", f"{gw}/gatewayclasses", {
            "apiVersion": GW, "kind": "GatewayClass", "metadata": {"name": ns}, "spec": {"controllerName": "veloxy.dev/gateway-controller"}})
        ok("GatewayClass", code == 201, code)
        code, _ = call("POST", f"{gw}/namespaces/{ns}/gateways", {
            "apiVersion": GW, "kind": "Gateway", "metadata": {"name": "gw"}, "spec": {"gatewayClassName": ns, "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"}]}})
        ok("Gateway", code == 201, code)
        code, _ = call("POST", f"{gw}/namespaces/{ns}/httproutes", {
            "apiVersion": GW, "kind": "HTTPRoute", "metadata": {"name": "r"}, "spec": {"parentRefs": [{"name": "gw"}], "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                 "backendRefs": [{"name": "web", "port": 80}]}]}})
        ok("HTTPRoute", code == 201, code)
    else:
        print("smoke: Gateway API CRDs not installed (dev/kube/gateway-crds.sh): skipped")
    # Cluster-scoped objects are removed; the namespace would stay Terminating (no controller).
    call("DELETE", f"{net}/ingressclasses/{ns}")
    if has_gateway_api:
        call("DELETE", f"{gw}/gatewayclasses/{ns}")
    print("smoke: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
