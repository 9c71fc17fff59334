#!/usr/bin/env bash
# Runs the official Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance, the Go
# test `TestConformance`) against veloxy as the Gateway controller, on a real etcd +
# kube-apiserver + kube-controller-manager, with kubelet-standin running the suite's echo-basic
# backends as processes, all inside a network namespace of its own (`unshare -n`): nothing
# leaves it.
#
#   dev/gateway-conformance.sh [--out FILE] [--run-test NAME] [--veloxy BIN] [--keep DIR]
#                              [--features LIST] [-- extra flags for the suite]
#
#   --out FILE       the results table (markdown; default target/gateway-conformance.md); the
#                    suite's own output goes to FILE's stem + .log
#   --run-test NAME  one test (the suite's -run-test), e.g. HTTPRouteSimpleSameNamespace
#   --veloxy BIN     default target/debug/veloxy (build it first: cargo build -p veloxy)
#   --keep DIR       work in DIR and keep it (logs of every process); default a temporary one
#   --features LIST  the suite's -supported-features (default: $FEATURES below)
#
# Binaries: $VELOXY_CACHE/bin (default ~/.cache/veloxy/bin), built once by `bash .ci/kube.sh`
# (etcd, kube-apiserver, the CRDs) and `bash .ci/conformance.sh` (kube-controller-manager,
# echo-basic, gateway-conformance.test, kubelet-standin).
#
# Addresses (TEST-NET, on the namespace's lo): 192.0.2.1 the API server (and the Node),
# 192.0.2.10 veloxy (listeners on 80 and 443), 192.0.2.11-192.0.2.74 veloxy's
# gateway_addresses (each Gateway gets one and is served on copies of those listeners bound
# to it), 198.51.100.0/24 the Pods.
#
# Exit status: 0 when the suite ran (whatever it found), 1 when it could not run.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${VELOXY_CACHE:-$HOME/.cache/veloxy}"
bin="$cache/bin"
out="$here/target/gateway-conformance.md"
veloxy="$here/target/debug/veloxy"
run_test=""
keep=""
# Core features of the GATEWAY-HTTP profile, and the extended ones veloxy's provider builds.
FEATURES="${VELOXY_CONFORMANCE_FEATURES:-Gateway,HTTPRoute,ReferenceGrant}"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
  --out) out="$2"; shift 2 ;;
  --run-test) run_test="$2"; shift 2 ;;
  --veloxy) veloxy="$2"; shift 2 ;;
  --keep) keep="$2"; shift 2 ;;
  --features) FEATURES="$2"; shift 2 ;;
  --) shift; extra=("$@"); break ;;
  *) echo "usage: $0 [--out FILE] [--run-test NAME] [--veloxy BIN] [--keep DIR] [--features LIST] [-- suite flags]" >&2; exit 2 ;;
  esac
done

die() {
  echo "gateway-conformance.sh: $*" >&2
  exit 1
}

# Tests skipped on purpose, each with its reason (the suite's -skip-tests). Tests of features
# not in $FEATURES are skipped by the suite itself and listed as such in the table.
SKIPS=(
)

# --- outside: check, then re-enter in a network namespace of our own ---------------------------
if [ -z "${VELOXY_CONFORMANCE_IN_NETNS:-}" ]; then
  for b in etcd kube-apiserver kube-controller-manager echo-basic gateway-conformance.test kubelet-standin; do
    [ -x "$bin/$b" ] || die "no $bin/$b: run 'bash .ci/kube.sh' and 'bash .ci/conformance.sh' first"
  done
  [ -x "$veloxy" ] || die "no veloxy at $veloxy: cargo build -p veloxy"
  command -v unshare >/dev/null || die "unshare not found"
  for t in curl openssl python3 ip; do command -v $t >/dev/null || die "$t not found"; done
  unshare -n true 2>/dev/null || die "unshare -n is not permitted here (needs root)"
  mkdir -p "$(dirname "$out")"
  out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
  if [ -n "$keep" ]; then
    mkdir -p "$keep"
    work="$(cd "$keep" && pwd)"
  else
    work="$(mktemp -d /tmp/gateway-conformance.XXXXXX)"
  fi
  export VELOXY_CONFORMANCE_IN_NETNS=1
  rc=0
  unshare -n "$0" --out "$out" --run-test "$run_test" --veloxy "$veloxy" --keep "$work" \
    --features "$FEATURES" -- "${extra[@]}" || rc=$?
  [ -n "$keep" ] || rm -rf "$work"
  exit "$rc"
fi

# --- inside the namespace -------------------------------------------------------------------
work="$keep"
t0=$SECONDS
API=192.0.2.1
GWADDR=192.0.2.10
ip link set lo up
# The Gateways' addresses (gateway_addresses in veloxy.toml).
GWPOOL=()
for i in $(seq 11 74); do GWPOOL+=("192.0.2.$i"); done
for a in $API $GWADDR "${GWPOOL[@]}"; do ip addr add "$a/32" dev lo; done

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bash "$here/dev/kube/stop.sh" "$work/kube" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== etcd and kube-apiserver on $API" >&2
VELOXY_KUBE_ADDRESS=$API \
  bash "$here/dev/kube/start.sh" "$work/kube" >/dev/null
export KUBECONFIG="$work/kube/kubeconfig"
bash "$here/dev/kube/gateway-crds.sh" "$work/kube" standard >/dev/null

echo "== kube-controller-manager (deployment, replicaset, endpointslice, namespace, garbage collector)" >&2
"$bin/kube-controller-manager" --kubeconfig="$KUBECONFIG" --secure-port=0 --leader-elect=false \
  --controllers=deployment,replicaset,endpointslice,namespace,garbagecollector,serviceaccount \
  --concurrent-deployment-syncs=10 --concurrent-replicaset-syncs=10 --concurrent-service-endpoint-syncs=10 \
  >"$work/kube-controller-manager.log" 2>&1 &
pids+=($!)

echo "== kubelet-standin (Node 'standin', Pods on 198.51.100.0/24)" >&2
mkdir -p "$work/kubelet/pods"
"$bin/kubelet-standin" --kubeconfig="$KUBECONFIG" --node=standin --node-ip=$API \
  --echo-bin="$bin/echo-basic" --pod-cidr=198.51.100.0/24 --dir="$work/kubelet" \
  >"$work/kubelet-standin.log" 2>&1 &
pids+=($!)

echo "== GatewayClass veloxy, and veloxy on $GWADDR:80/443" >&2
# shellcheck disable=SC1091
. "$work/kube/env"
curl -fsS --cacert "$CA_FILE" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
  -X POST "$APISERVER_URL/apis/gateway.networking.k8s.io/v1/gatewayclasses" \
  -d '{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "veloxy"},
       "spec": {"controllerName": "veloxy.dev/gateway-controller"}}' >/dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -keyout "$work/default.key" -out "$work/default.crt" -subj "/CN=default.invalid" 2>/dev/null
cat >"$work/veloxy.toml" <<EOF
[listeners.web]
addr = "$GWADDR:80"
# h2c with prior knowledge beside HTTP/1.1: the suite's GRPCRoute tests speak it.
http2 = true

[listeners.websecure]
addr = "$GWADDR:443"
[listeners.websecure.tls]
cert = "$work/default.crt"
key = "$work/default.key"

[providers.kubernetes]
kubeconfig = "$KUBECONFIG"
# No gateway_class: every GatewayClass naming veloxy's controller is served (the suite makes
# its own, e.g. for GatewayClassObservedGenerationBump).
http_listener = "web"
https_listener = "websecure"
status_address = "$GWADDR"
# Each Gateway its own address (HTTPRouteMultipleGateways).
gateway_addresses = [$(printf '"%s", ' "${GWPOOL[@]}")]
EOF
"$veloxy" run --config "$work/veloxy.toml" >"$work/veloxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q "Gateway API v1 served" "$work/veloxy.log" 2>/dev/null && break
  kill -0 "${pids[-1]}" 2>/dev/null || { tail -20 "$work/veloxy.log" >&2; die "veloxy exited"; }
  sleep 0.1
done
echo "== ready in $((SECONDS - t0)) s; running the suite" >&2

skip_names=()
for s in "${SKIPS[@]}"; do skip_names+=("${s%%:*}"); done
suite_log="${out%.*}.log"
args=(-test.run '^TestConformance$' -test.v -test.timeout 60m
  -gateway-class=veloxy -supported-features="$FEATURES"
  -cleanup-base-resources=false -allow-crds-mismatch
  -organization=veloxy -project=veloxy -url=https://veloxy.dev -version=dev -contact=none
  -report-output="$work/report.yaml")
[ ${#skip_names[@]} -eq 0 ] || args+=(-skip-tests="$(IFS=,; echo "${skip_names[*]}")")
[ -z "$run_test" ] || args+=(-run-test="$run_test")
t_suite=$SECONDS
# The suite's package directory is not needed: its manifests are embedded in the binary.
(cd "$work" && "$bin/gateway-conformance.test" "${args[@]}" "${extra[@]}") >"$suite_log" 2>&1 || true
suite_s=$((SECONDS - t_suite))
cp "$work/report.yaml" "${out%.*}.report.yaml" 2>/dev/null || true

python3 - "$suite_log" "$out" "$suite_s" "$FEATURES" "${SKIPS[@]}" <<'EOF'
import re, sys
log, out, secs, features, skips = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
reasons = dict(s.split(":", 1) for s in skips)
results, why = {}, {}
cur = None
for line in open(log, errors="replace"):
    m = re.match(r"\s*--- (PASS|FAIL|SKIP): TestConformance/([^/\s]+) \(([\d.]+)s\)", line)
    if m:
        results[m.group(2)] = (m.group(1), m.group(3))
        cur = m.group(2)
        continue
    m = re.match(r"\s+\S+\.go:\d+: (.*)", line)
    if cur and m and results.get(cur, ("",))[0] == "SKIP" and cur not in why:
        why[cur] = m.group(1).strip()
rows, counts = [], {"PASS": 0, "FAIL": 0, "SKIP": 0}
for name, (res, t) in sorted(results.items()):
    counts[res] += 1
    note = reasons.get(name, why.get(name, "")) if res == "SKIP" else ""
    rows.append(f"| {name} | {res.lower()} | {t} | {note} |")
whole = re.search(r"^--- (PASS|FAIL): TestConformance \(([\d.]+)s\)", open(log, errors="replace").read(), re.M)
with open(out, "w") as f:
    f.write("# Gateway API conformance v1.6.3 against veloxy\n\n")
    f.write(f"Supported features given: `{features}`. Suite time {secs} s.\n\n")
    f.write(f"**{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped**"
            f" (TestConformance: {whole.group(1) if whole else 'did not finish'})\n\n")
    f.write("| test | result | seconds | skip reason |\n|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
EOF
echo "== table: $out; suite output: $suite_log; suite ran $suite_s s, total $((SECONDS - t0)) s" >&2
