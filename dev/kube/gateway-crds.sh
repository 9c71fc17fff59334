#!/usr/bin/env bash
# Install the Gateway API CRDs into the API server that dev/kube/start.sh DIR started, and wait
# until each is Established (served).
#
#   dev/kube/gateway-crds.sh DIR [standard|experimental]     (default: standard)
#   dev/kube/gateway-crds.sh --fetch                          (only fill the cache: .ci/kube.sh)
#
# The CRDs come from the Go module sigs.k8s.io/gateway-api at $VELOXY_GATEWAY_API_VERSION
# (default v1.6.3, the newest that Go 1.26 accepts), fetched once through the Go module proxy and
# kept, as YAML and converted to JSON, in $VELOXY_CACHE/gateway-api-crds/VERSION/CHANNEL/.
# v1.6.3 standard: GatewayClass, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant, BackendTLSPolicy,
# ListenerSet, TLSRoute, TCPRoute, UDPRoute (all served as v1); experimental adds the alpha
# versions (TLSRoute v1alpha2/v1alpha3, TCPRoute and UDPRoute v1alpha2) and XBackend,
# XBackendTrafficPolicy, XMesh. Only CustomResourceDefinitions are applied: the channel's
# ValidatingAdmissionPolicy "safe-upgrades" (which refuses a later switch of channel) is not.
# Idempotent: an existing CRD is replaced. The conformance suite is a separate module,
# sigs.k8s.io/gateway-api/conformance at the same version.
set -euo pipefail

die() {
  echo "gateway-crds.sh: $*" >&2
  exit 1
}
[ $# -ge 1 ] || die "usage: $0 DIR [standard|experimental] | --fetch"
DIR="$1"
FETCH_ONLY=0
[ "$DIR" = "--fetch" ] && FETCH_ONLY=1
CHANNEL="${2:-standard}"
case "$CHANNEL" in standard | experimental) ;; *) die "channel must be standard or experimental" ;; esac
[ "$FETCH_ONLY" = 1 ] || [ -f "$DIR/env" ] || die "$DIR/env not found: run dev/kube/start.sh $DIR first"
VERSION="${VELOXY_GATEWAY_API_VERSION:-v1.6.3}"
cache="${VELOXY_CACHE:-$HOME/.cache/veloxy}"
dest="$cache/gateway-api-crds/$VERSION"

# --- fetch once -------------------------------------------------------------------------------
if [ ! -f "$dest/.complete" ]; then
  command -v go >/dev/null || die "go not found (needed once to fetch sigs.k8s.io/gateway-api@$VERSION)"
  echo "gateway-crds.sh: fetching sigs.k8s.io/gateway-api@$VERSION into $dest" >&2
  src="$(GOPATH="$cache/go" GOFLAGS=-modcacherw GOTOOLCHAIN=local \
    go mod download -json "sigs.k8s.io/gateway-api@$VERSION" |
    python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error", "no Dir")))')" ||
    die "go mod download sigs.k8s.io/gateway-api@$VERSION failed"
  if ! python3 -c 'import yaml' 2>/dev/null; then
    python3 -m pip install -q pyyaml || die "PyYAML missing and pip install pyyaml failed"
  fi
  rm -rf "$dest"
  for ch in standard experimental; do
    mkdir -p "$dest/$ch"
    [ -d "$src/config/crd/$ch" ] || continue
    cp "$src/config/crd/$ch"/*.yaml "$dest/$ch/"
    chmod 644 "$dest/$ch"/*.yaml
    # One JSON file per CustomResourceDefinition (other kinds are skipped).
    python3 - "$dest/$ch" <<'EOF'
import glob, json, os, sys, yaml
out = sys.argv[1]
for f in sorted(glob.glob(os.path.join(out, "*.yaml"))):
    for doc in yaml.safe_load_all(open(f)):
        if doc and doc.get("kind") == "CustomResourceDefinition":
            with open(os.path.join(out, doc["metadata"]["name"] + ".json"), "w") as o:
                json.dump(doc, o)
EOF
  done
  ls "$dest/standard"/*.json >/dev/null 2>&1 || die "no CRD found in $src/config/crd/standard"
  touch "$dest/.complete"
fi

[ "$FETCH_ONLY" = 1 ] && exit 0

# --- apply and wait ---------------------------------------------------------------------------
python3 - "$DIR/env" "$dest/$CHANNEL" <<'EOF'
import glob, json, os, ssl, sys, time, urllib.error, urllib.request

env = dict(l.rstrip("\n").split("=", 1) for l in open(sys.argv[1]) if "=" in l)
url, token = env["APISERVER_URL"], env["TOKEN"]
ctx = ssl.create_default_context(cafile=env["CA_FILE"])
base = url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

def call(method, path, body=None):
    req = urllib.request.Request(path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Bearer " + token)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:  # e.g. a plain-text 404 for an unknown group
            return e.code, {"message": body.decode(errors="replace")}

t0 = time.monotonic()
names = []
for f in sorted(glob.glob(os.path.join(sys.argv[2], "*.json"))):
    crd = json.load(open(f))
    name = crd["metadata"]["name"]
    code, body = call("POST", base, crd)
    if code == 409:  # already there: replace it
        code, cur = call("GET", base + "/" + name)
        crd["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        code, body = call("PUT", base + "/" + name, crd)
    if code not in (200, 201):
        sys.exit(f"gateway-crds.sh: {name}: HTTP {code}: {body.get('message')}")
    names.append((name, crd["spec"]["names"]["kind"], [v["name"] for v in crd["spec"]["versions"] if v["served"]]))

deadline = time.monotonic() + 60
pending = {n for n, _, _ in names}
while pending:
    for n in sorted(pending):
        code, cur = call("GET", base + "/" + n)
        conds = {c["type"]: c["status"] for c in cur.get("status", {}).get("conditions", [])}
        if conds.get("Established") == "True":
            pending.discard(n)
    if pending and time.monotonic() > deadline:
        sys.exit(f"gateway-crds.sh: not Established after 60 s: {sorted(pending)}")
    if pending:
        time.sleep(0.1)
for n, kind, versions in names:
    print(f"gateway-crds.sh: Established {kind} ({n}, served {', '.join(versions)})", file=sys.stderr)
print(f"gateway-crds.sh: {len(names)} CRDs established in {time.monotonic() - t0:.2f}s", file=sys.stderr)
EOF
