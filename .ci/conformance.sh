#!/usr/bin/env bash
# What the Gateway API conformance suite (dev/gateway-conformance.sh) needs besides etcd and
# kube-apiserver (.ci/kube.sh), built from the Go module proxy only and cached under
# ~/.cache/veloxy/bin, so a machine builds them once:
#   kube-controller-manager  k8s.io/kubernetes $KUBE_VERSION (the release .ci/kube.sh builds
#                            kube-apiserver from; same wrapper module with staging replaces):
#                            runs the deployment, replicaset and endpointslice controllers
#   echo-basic               the suite's echo backend, sigs.k8s.io/gateway-api/conformance/echo-basic,
#                            patched to listen on $VELOXY_POD_IP (see build_suite)
#   gateway-conformance.test `go test -c sigs.k8s.io/gateway-api/conformance` at $GATEWAY_API_VERSION
#   kubelet-standin          dev/kube/kubelet-standin (this repository): starts echo-basic for
#                            each Pod and reports it Running/Ready with a TEST-NET podIP
# Idempotent: a binary whose stamp file names the same version (and wrapper revision) is kept;
# kubelet-standin's stamp is the hash of its source. Builds run under `nice -n 19`, with the Go
# build cache in $VELOXY_CACHE/go-build (dropped at the end). Logs: $VELOXY_CACHE/logs/*-build.log.
# Exits non-zero only when a binary is missing afterwards. Usage: bash .ci/conformance.sh [--force]
set -euo pipefail

KUBE_VERSION="${VELOXY_KUBE_VERSION:-v1.34.4}"
GATEWAY_API_VERSION="${VELOXY_GATEWAY_API_VERSION:-v1.6.3}"
WRAPPER_REV=1 # bump when the wrapper modules or build flags change

here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${VELOXY_CACHE:-$HOME/.cache/veloxy}"
bin="$cache/bin"
logs="$cache/logs"
mkdir -p "$bin" "$logs" "$cache/src"

force=0
[ "${1:-}" = "--force" ] && force=1

say() { echo "== conformance.sh: $*"; }
fail() {
  echo "conformance.sh: FAILED: $*" >&2
  exit 1
}

command -v go >/dev/null || fail "go not found"
export GOPATH="$cache/go"
export GOCACHE="$cache/go-build"
export GOFLAGS="-modcacherw -buildvcs=false"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

up_to_date() {
  [ "$force" = 0 ] && [ -x "$bin/$1" ] && [ -f "$bin/$1.stamp" ] && [ "$(cat "$bin/$1.stamp")" = "$2" ]
}

run_logged() {
  local log="$1"
  shift
  echo "\$ $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "conformance.sh: command failed: $* (last lines of $log):" >&2
    tail -n 25 "$log" >&2
    return 1
  fi
}

# --- kube-controller-manager -----------------------------------------------------------------
build_kube_controller_manager() {
  local stamp="kube-controller-manager $KUBE_VERSION rev $WRAPPER_REV"
  if up_to_date kube-controller-manager "$stamp"; then
    say "kube-controller-manager $KUBE_VERSION: cached"
    return 0
  fi
  local src="$cache/src/kube-controller-manager-$KUBE_VERSION" log="$logs/kube-controller-manager-build.log" t0=$SECONDS
  local staging="v0.${KUBE_VERSION#v1.}"
  say "building kube-controller-manager $KUBE_VERSION (once per machine, about 10-15 min on 2 cores; log: $log)"
  : >"$log"
  local modfile
  go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >>"$log" 2>&1 || true
  modfile="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' "$log" | tail -n 1)"
  [ -n "$modfile" ] && [ -f "$modfile" ] || {
    tail -n 20 "$log" >&2
    return 1
  }
  rm -rf "$src"
  mkdir -p "$src"
  {
    echo "module veloxy.local/kube-controller-manager"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*$|\t\1 => \1 '"$staging"'|p' "$modfile"
    echo ")"
  } >"$src/go.mod"
  cat >"$src/main.go" <<'EOF'
// kube-controller-manager, as k8s.io/kubernetes/cmd/kube-controller-manager/controller-manager.go builds it.
package main

import (
	"os"
	_ "time/tzdata" // for CronJob Time Zone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugin
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
EOF
  local minor="${KUBE_VERSION#v1.}"
  minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (
    cd "$src"
    run_logged "$log" go mod tidy &&
      run_logged "$log" nice -n 19 go build -trimpath -ldflags "$ld" -o "$bin/kube-controller-manager.tmp" .
  ) || return 1
  mv -f "$bin/kube-controller-manager.tmp" "$bin/kube-controller-manager"
  echo "$stamp" >"$bin/kube-controller-manager.stamp"
  say "kube-controller-manager built in $((SECONDS - t0)) s ($(du -h "$bin/kube-controller-manager" | cut -f1))"
}

# --- the suite: echo-basic and the test binary -----------------------------------------------
# One wrapper module requires sigs.k8s.io/gateway-api/conformance (a module of its own, whose
# `replace sigs.k8s.io/gateway-api => ../` only applies inside its repository) and
# sigs.k8s.io/gateway-api at the same version.
suite_module() {
  local src="$cache/src/gateway-conformance-$GATEWAY_API_VERSION" log="$1"
  if [ ! -f "$src/go.sum" ] || [ "$force" = 1 ]; then
    rm -rf "$src"
    mkdir -p "$src"
    cat >"$src/go.mod" <<EOF
module veloxy.local/gateway-conformance

go 1.26.0

require (
	sigs.k8s.io/gateway-api $GATEWAY_API_VERSION
	sigs.k8s.io/gateway-api/conformance $GATEWAY_API_VERSION
)
EOF
    cat >"$src/tools.go" <<'EOF'
//go:build tools

// Keeps the suite's packages (and their tests' imports) in this module's graph.
package tools

import (
	_ "sigs.k8s.io/gateway-api/conformance"
)
EOF
    (
      cd "$src"
      run_logged "$log" go get -t "sigs.k8s.io/gateway-api/conformance@$GATEWAY_API_VERSION" \
        "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION"
    ) || return 1
  fi
  echo "$src"
}

build_suite() {
  local stamp="gateway-api $GATEWAY_API_VERSION rev $WRAPPER_REV" echo_stamp="echo-basic $GATEWAY_API_VERSION listening on VELOXY_POD_IP rev $WRAPPER_REV"
  if up_to_date gateway-conformance.test "$stamp" && up_to_date echo-basic "$echo_stamp"; then
    say "gateway-api $GATEWAY_API_VERSION conformance suite and echo-basic: cached"
    return 0
  fi
  local log="$logs/gateway-conformance-build.log" t0=$SECONDS src
  : >"$log"
  say "building the gateway-api $GATEWAY_API_VERSION conformance suite and echo-basic (log: $log)"
  src="$(suite_module "$log")" || return 1
  # echo-basic listens on every address (":3000"); here all Pods share one network namespace,
  # so a copy of it is built that listens on $VELOXY_POD_IP (set by kubelet-standin) instead:
  # the only change, made with sed on the module's source and checked below (import lines are
  # moved to the copy; the generated protobuf descriptors keep their original paths).
  local orig="$GOPATH/pkg/mod/sigs.k8s.io/gateway-api/conformance@$GATEWAY_API_VERSION/echo-basic"
  rm -rf "$src/echo-basic"
  cp -r "$orig" "$src/echo-basic"
  chmod -R u+w "$src/echo-basic"
  find "$src/echo-basic" -name '*_test.go' -delete
  find "$src/echo-basic" -name '*.go' -exec sed -i \
    -e '/^[[:space:]]*[[:alnum:]_]* *"sigs.k8s.io\/gateway-api\/conformance\/echo-basic\//s|sigs.k8s.io/gateway-api/conformance/echo-basic/|veloxy.local/gateway-conformance/echo-basic/|' \
    -e 's|fmt.Sprintf(":%s", |fmt.Sprintf(os.Getenv("VELOXY_POD_IP")+":%s", |' \
    -e 's|fmt.Sprintf("0.0.0.0:%d", |fmt.Sprintf(os.Getenv("VELOXY_POD_IP")+":%d", |' {} +
  local n
  n="$(grep -r --include='*.go' -c 'VELOXY_POD_IP' "$src/echo-basic" | awk -F: '{s += $2} END {print s}')"
  [ "$n" = 7 ] || {
    echo "conformance.sh: expected 7 listen addresses patched in echo-basic, found $n" >&2
    return 1
  }
  (
    cd "$src"
    run_logged "$log" go mod tidy &&
      run_logged "$log" nice -n 19 go build -trimpath -ldflags "-s -w" -o "$bin/echo-basic.tmp" ./echo-basic
  ) || return 1
  mv -f "$bin/echo-basic.tmp" "$bin/echo-basic"
  echo "$echo_stamp" >"$bin/echo-basic.stamp"
  if ! up_to_date gateway-conformance.test "$stamp"; then
    (
      cd "$src"
      run_logged "$log" nice -n 19 go test -c -trimpath -ldflags "-s -w" -o "$bin/gateway-conformance.test.tmp" \
        sigs.k8s.io/gateway-api/conformance
    ) || return 1
    mv -f "$bin/gateway-conformance.test.tmp" "$bin/gateway-conformance.test"
    echo "$stamp" >"$bin/gateway-conformance.test.stamp"
  fi
  say "suite built in $((SECONDS - t0)) s"
}

# --- the stand-in kubelet ----------------------------------------------------------------------
build_kubelet_standin() {
  local dir="$here/dev/kube/kubelet-standin"
  [ -d "$dir" ] || return 0
  local stamp
  stamp="kubelet-standin $(cat "$dir"/go.mod "$dir"/*.go | sha256sum | cut -c1-16)"
  if up_to_date kubelet-standin "$stamp"; then
    say "kubelet-standin: cached"
    return 0
  fi
  local log="$logs/kubelet-standin-build.log"
  : >"$log"
  (
    cd "$dir"
    run_logged "$log" nice -n 19 go build -trimpath -o "$bin/kubelet-standin.tmp" .
  ) || return 1
  mv -f "$bin/kubelet-standin.tmp" "$bin/kubelet-standin"
  echo "$stamp" >"$bin/kubelet-standin.stamp"
  say "kubelet-standin built"
}

t_all=$SECONDS
ok=1
build_suite || ok=0
build_kubelet_standin || ok=0
build_kube_controller_manager || ok=0
go clean -cache 2>/dev/null || true
[ "$ok" = 1 ] || fail "see the messages above"
say "ready in $((SECONDS - t_all)) s"
